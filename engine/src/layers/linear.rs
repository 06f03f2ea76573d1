//! Linear layers: `y = x W^T (+ b)`, with the weight packed for `gemm`'s
//! kernel when the backend uses it, else a libtorch tensor.

use tch::{Device, Tensor};

use super::Backend;
use crate::EngineError;
use crate::gemm;

/// A weight [out, in] in the layout its kernel wants. `Transposed` keeps
/// [in, out] contiguous: MKL's GEMM is 1.5-2x faster on that layout for the
/// wide vocabulary projection.
enum Weight {
    Packed(gemm::Packed),
    Torch(Tensor),
    Transposed(Tensor),
}

pub(crate) struct Linear {
    w: Weight,
    bias: Option<Tensor>,
}

impl Linear {
    /// A projection inside a layer.
    pub fn new(w: Tensor, bias: Option<Tensor>, be: &Backend) -> Result<Self, EngineError> {
        let w = if be.packed {
            Weight::Packed(gemm::Packed::new(&w)?)
        } else {
            Weight::Torch(w)
        };
        Ok(Self { w, bias })
    }

    /// The vocabulary projection (no bias): on the CPU without the packed
    /// kernel, kept transposed for MKL.
    pub fn lm_head(w: Tensor, be: &Backend) -> Result<Self, EngineError> {
        if !be.packed && be.device == Device::Cpu {
            return Ok(Self {
                w: Weight::Transposed(w.f_transpose(0, 1)?.f_contiguous()?),
                bias: None,
            });
        }
        Self::new(w, None, be)
    }

    /// `x` [N, in] -> [N, out].
    pub fn forward(&self, x: &Tensor, be: &Backend) -> Result<Tensor, EngineError> {
        let y = match &self.w {
            Weight::Packed(p) => p.forward(x, &be.pool)?,
            Weight::Torch(w) => return Ok(x.f_linear(w, self.bias.as_ref())?),
            Weight::Transposed(wt) => x.f_matmul(wt)?,
        };
        Ok(match &self.bias {
            Some(b) => y.f_add(b)?,
            None => y,
        })
    }
}

/// The vocabulary projection: `lm_head.weight`, or the embedding when the
/// checkpoint ties them and has no separate head.
pub(crate) fn lm_head(
    w: &mut super::weights::Weights,
    tied: bool,
    embed: &Tensor,
    be: &Backend,
) -> Result<Linear, EngineError> {
    let head = if tied && !w.contains("lm_head.weight") {
        embed.shallow_clone()
    } else {
        w.take("lm_head.weight")?
    };
    Linear::lm_head(head, be)
}
