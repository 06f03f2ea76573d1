//! Normalisation layers, computed as transformers computes them.
//!
//! RMSNorm (Llama, Mistral, Qwen) is here; Gemma's `1 + w` RMSNorm and
//! LayerNorm belong here too when a family needs them.

use tch::{Kind, Tensor};

use crate::EngineError;

/// RMSNorm over the last dimension: in float32, then back to the input
/// kind, times the weight.
pub(crate) struct RmsNorm {
    w: Tensor,
    eps: f64,
}

impl RmsNorm {
    pub fn new(w: Tensor, eps: f64) -> Self {
        Self { w, eps }
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor, EngineError> {
        let kind = x.kind();
        let h = x.f_to_kind(Kind::Float)?;
        let var = h
            .f_pow_tensor_scalar(2)?
            .f_mean_dim(-1, true, Kind::Float)?;
        let h = h.f_mul(&var.f_add_scalar(self.eps)?.f_rsqrt()?)?;
        Ok(self.w.f_mul(&h.f_to_kind(kind)?)?)
    }
}
