//! Linear layers: `y = x W^T (+ b)`, with the weight packed for `gemm`'s
//! kernel when the backend uses it, kept in its quantized blocks for
//! `quant`'s kernels when it came so and the backend allows, else a
//! libtorch tensor.

use std::sync::Arc;

use tch::{Device, Tensor};

use super::Backend;
use super::embedding::Embedding;
use crate::EngineError;
use crate::gemm;
use crate::quant::{QuantMatrix, QuantRows};

/// A linear weight as the checkpoint gives it: a tensor, or a GGUF's
/// quantized rows.
pub(crate) enum LinearWeight {
    Dense(Tensor),
    Quant(QuantRows),
}

impl From<Tensor> for LinearWeight {
    fn from(t: Tensor) -> Self {
        Self::Dense(t)
    }
}

/// A weight [out, in] in the layout its kernel wants. `Transposed` keeps
/// [in, out] contiguous: MKL's GEMM is 1.5-2x faster on that layout for the
/// wide vocabulary projection. `Quant` may be shared with a tied embedding.
enum Weight {
    Packed(gemm::Packed),
    Quant(Arc<QuantMatrix>),
    Torch(Tensor),
    Transposed(Tensor),
}

pub(crate) struct Linear {
    w: Weight,
    bias: Option<Tensor>,
}

impl Linear {
    /// A projection inside a layer.
    pub fn new(
        w: impl Into<LinearWeight>,
        bias: Option<Tensor>,
        be: &Backend,
    ) -> Result<Self, EngineError> {
        let w = match w.into() {
            LinearWeight::Quant(rows) if be.quant.is_some() => {
                Weight::Quant(Arc::new(QuantMatrix::new(&rows)))
            }
            LinearWeight::Quant(rows) => Self::dense(be.place(rows.dequantize()?)?, be)?,
            LinearWeight::Dense(w) => Self::dense(w, be)?,
        };
        Ok(Self { w, bias })
    }

    /// A stacked gate/up weight [2 * inter, in] (gate rows first): packed
    /// for [`Linear::forward_silu`] where the backend packs dense weights,
    /// else as [`Linear::new`].
    pub fn gate_up(w: impl Into<LinearWeight>, be: &Backend) -> Result<Self, EngineError> {
        match w.into() {
            LinearWeight::Dense(w) if be.packed => Ok(Self {
                w: Weight::Packed(gemm::Packed::gated(&w)?),
                bias: None,
            }),
            w => Self::new(w, None, be),
        }
    }

    /// `silu(x G^T) * (x U^T)` [N, inter] in one pass when the weight was
    /// packed for it by [`Linear::gate_up`] (or is a quantized stacked
    /// gate/up weight) and gyre's fused CPU ops are on;
    /// None otherwise (the caller runs `forward`, which gives [N, 2 * inter]
    /// from any weight, and then the activation).
    pub fn forward_silu(&self, x: &Tensor, be: &Backend) -> Result<Option<Tensor>, EngineError> {
        match &self.w {
            Weight::Packed(p) if p.is_gated() && self.bias.is_none() && crate::fused::enabled() => {
                Ok(Some(p.forward_silu(x, &be.pool)?))
            }
            // A stacked quantized gate/up weight: the SiLU in the
            // product's tasks (`QuantMatrix::forward_silu`).
            Weight::Quant(q) if self.bias.is_none() && crate::fused::enabled() => {
                q.forward_silu(x, be.quant.unwrap_or_default(), &be.pool)
            }
            _ => Ok(None),
        }
    }

    /// `silu(x G^T) * (x U^T)` [1, inter] of a one-row `x` through a
    /// stacked gate/up weight on CUDA, in one kernel
    /// ([`crate::fused::gemv_silu`]); None where it does not apply.
    pub fn gemv_silu(&self, x: &Tensor) -> Result<Option<Tensor>, EngineError> {
        match &self.w {
            Weight::Torch(w) if self.bias.is_none() => crate::fused::gemv_silu(x, w),
            _ => Ok(None),
        }
    }

    fn dense(w: Tensor, be: &Backend) -> Result<Weight, EngineError> {
        Ok(if be.packed {
            Weight::Packed(gemm::Packed::new(&w)?)
        } else {
            Weight::Torch(w)
        })
    }

    /// The vocabulary projection (no bias): on the CPU without the packed
    /// kernel, kept transposed for MKL.
    pub fn lm_head(w: impl Into<LinearWeight>, be: &Backend) -> Result<Self, EngineError> {
        let w = match w.into() {
            LinearWeight::Quant(rows) if be.quant.is_none() => {
                LinearWeight::Dense(be.place(rows.dequantize()?)?)
            }
            w => w,
        };
        if let LinearWeight::Dense(w) = &w
            && !be.packed
            && be.device == Device::Cpu
        {
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
            Weight::Quant(q) => q.forward(x, be.quant.unwrap_or_default(), &be.pool)?,
            Weight::Torch(w) => {
                // A decode step's few rows on CUDA: gyre's matrix-vector
                // kernel (crate::fused), else cuBLAS.
                if let Some(y) = crate::fused::gemv(x, w, self.bias.as_ref())? {
                    return Ok(y);
                }
                return Ok(x.f_linear(w, self.bias.as_ref())?);
            }
            Weight::Transposed(wt) => x.f_matmul(wt)?,
        };
        Ok(match &self.bias {
            Some(b) => y.f_add(b)?,
            None => y,
        })
    }
}

/// The row path (`layers::rows`): products of a step's rows held in the
/// caller's buffers, through the same kernels as `forward` (so the same
/// bits), with no libtorch op.
impl Linear {
    /// Whether [`Linear::forward_to`] applies: a packed (not gate/up) or
    /// quantized weight, and a bias, if any, a float32 CPU vector.
    pub fn rows_ok(&self) -> bool {
        let bias_ok = self
            .bias
            .as_ref()
            .is_none_or(|b| crate::attn::f32_view(b).is_ok_and(|v| v.len() == self.out_features()));
        bias_ok
            && match &self.w {
                Weight::Packed(p) => !p.is_gated(),
                Weight::Quant(_) => true,
                _ => false,
            }
    }

    /// Whether [`Linear::forward_silu_to`] applies: a stacked gate/up
    /// weight packed for it or quantized whole groups a half, no bias.
    pub fn silu_rows_ok(&self) -> bool {
        self.bias.is_none()
            && match &self.w {
                Weight::Packed(p) => p.is_gated(),
                Weight::Quant(q) => q.silu_fits(),
                _ => false,
            }
    }

    /// Output columns (a gate/up weight's: gate and up).
    pub fn out_features(&self) -> usize {
        match &self.w {
            Weight::Packed(p) => p.out_features(),
            Weight::Quant(q) => q.out_features(),
            Weight::Torch(w) => w.size().first().copied().unwrap_or(0) as usize,
            Weight::Transposed(w) => w.size().last().copied().unwrap_or(0) as usize,
        }
    }

    /// `out` [m, out] = `xs` [m, in] W^T (+ b) where [`Linear::rows_ok`].
    pub fn forward_to(
        &self,
        xs: &[f32],
        m: usize,
        out: &mut [f32],
        be: &Backend,
    ) -> Result<(), EngineError> {
        match &self.w {
            Weight::Packed(p) if !p.is_gated() => p.forward_to(xs, m, &be.pool, out)?,
            Weight::Quant(q) => q.forward_to(xs, m, be.quant.unwrap_or_default(), &be.pool, out)?,
            _ => {
                return Err(EngineError::Step(
                    "linear: the row path needs a packed or quantized weight".into(),
                ));
            }
        }
        if let Some(b) = &self.bias {
            let bs = crate::attn::f32_view(b)?;
            // As libtorch's `y + b`: one rounding per element.
            for row in out.chunks_exact_mut(bs.len().max(1)) {
                for (o, &v) in row.iter_mut().zip(bs) {
                    *o += v;
                }
            }
        }
        Ok(())
    }

    /// `out` [m, inter] = `silu(xs G^T) * (xs U^T)` where
    /// [`Linear::silu_rows_ok`], with `gu` scratch for a quantized weight.
    pub fn forward_silu_to(
        &self,
        xs: &[f32],
        m: usize,
        out: &mut [f32],
        gu: &mut Vec<f32>,
        be: &Backend,
    ) -> Result<(), EngineError> {
        let done = match &self.w {
            Weight::Packed(p) if p.is_gated() => {
                p.forward_silu_to(xs, m, &be.pool, out)?;
                true
            }
            Weight::Quant(q) => {
                gu.resize(m * q.out_features(), 0.0);
                let acts = be.quant.unwrap_or_default();
                q.forward_silu_to(xs, m, acts, &be.pool, gu, out)?
            }
            _ => false,
        };
        if !done {
            return Err(EngineError::Step(
                "gate/up: the row path needs a weight packed or quantized for it".into(),
            ));
        }
        Ok(())
    }
}

/// The vocabulary projection: `lm_head.weight`, or the embedding when the
/// checkpoint ties them and has no separate head (a quantized embedding's
/// blocks are shared, not copied).
pub(crate) fn lm_head(
    w: &mut super::weights::Weights,
    tied: bool,
    embed: &Embedding,
    be: &Backend,
) -> Result<Linear, EngineError> {
    if tied && !w.contains("lm_head.weight") {
        return match embed {
            Embedding::Dense(t) => Linear::lm_head(t.shallow_clone(), be),
            Embedding::Quant(q) => Ok(Linear {
                w: Weight::Quant(q.clone()),
                bias: None,
            }),
        };
    }
    Linear::lm_head(w.take_linear("lm_head.weight")?, be)
}
