//! Normalisation layers, computed as transformers computes them.
//!
//! RMSNorm (Llama, Mistral, Qwen) and Gemma's `1 + w` RMSNorm are here;
//! LayerNorm belongs here too when a family needs it.

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
        // gyre's own pass (CUDA bf16: transformers' two roundings in one
        // launch; CPU f32: one pass of Rust).
        if let Some((_, h)) = crate::fused::add_rms_norm(x, None, &self.w, self.eps)? {
            return Ok(h);
        }
        if x.device().is_cuda() && fused_on_cuda() {
            // One kernel instead of eight (at batch 1 a decode step is
            // dozens of tiny kernels per layer). It rounds once, where
            // transformers rounds the normalised value to bf16 before the
            // weight's product: at most one bf16 step apart.
            let dim = *x.size().last().unwrap_or(&1);
            return Ok(x.f_rms_norm([dim], Some(&self.w), self.eps)?);
        }
        let kind = x.kind();
        let h = x.f_to_kind(Kind::Float)?;
        let var = h
            .f_pow_tensor_scalar(2)?
            .f_mean_dim(-1, true, Kind::Float)?;
        let h = h.f_mul(&var.f_add_scalar(self.eps)?.f_rsqrt()?)?;
        Ok(self.w.f_mul(&h.f_to_kind(kind)?)?)
    }
}

impl RmsNorm {
    /// The weight and epsilon (the row path, `layers::rows`).
    pub fn parts(&self) -> (&Tensor, f64) {
        (&self.w, self.eps)
    }
}

impl RmsNorm {
    /// The residual `x + delta` and its norm: one kernel on CUDA in bf16,
    /// one pass of Rust on the CPU in float32, else two libtorch steps.
    pub fn add_forward(&self, x: &Tensor, delta: &Tensor) -> Result<(Tensor, Tensor), EngineError> {
        if let Some(both) = crate::fused::add_rms_norm(x, Some(delta), &self.w, self.eps)? {
            return Ok(both);
        }
        let x = x.f_add(delta)?;
        let h = self.forward(&x)?;
        Ok((x, h))
    }
}

/// libtorch's fused RMSNorm on CUDA, unless `GYRE_FUSED_NORM=0` (to
/// compare with transformers' unfused arithmetic).
fn fused_on_cuda() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("GYRE_FUSED_NORM").map_or(true, |v| v != "0"))
}

/// Gemma's RMSNorm: normalised in float32 and multiplied there by `1 + w`
/// (the checkpoint stores the offset from one), then back to the input
/// kind, as transformers' `Gemma2RMSNorm` / `Gemma3RMSNorm`.
pub(crate) struct GemmaRmsNorm {
    /// `1 + w` in float32, computed once.
    scale: Tensor,
    eps: f64,
}

impl GemmaRmsNorm {
    pub fn new(w: Tensor, eps: f64) -> Result<Self, EngineError> {
        Ok(Self {
            scale: w.f_to_kind(Kind::Float)?.f_add_scalar(1.0)?,
            eps,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor, EngineError> {
        // On the CPU in float32 there is no rounding to the input kind, so
        // this is the plain RMSNorm with weight `1 + w`: gyre's one pass of
        // Rust (its sum of squares in float64) instead of eight libtorch
        // ops. (On CUDA the fused kernel rounds as Llama's norm, not as
        // Gemma's, so it is not used there.)
        if x.device() == tch::Device::Cpu
            && let Some((_, h)) = crate::fused::add_rms_norm(x, None, &self.scale, self.eps)?
        {
            return Ok(h);
        }
        let kind = x.kind();
        let h = x.f_to_kind(Kind::Float)?;
        let var = h
            .f_pow_tensor_scalar(2)?
            .f_mean_dim(-1, true, Kind::Float)?;
        let h = h.f_mul(&var.f_add_scalar(self.eps)?.f_rsqrt()?)?;
        Ok(h.f_mul(&self.scale)?.f_to_kind(kind)?)
    }

    /// The residual `x + delta` and its norm: one pass of Rust on the CPU
    /// in float32, else two libtorch steps.
    pub fn add_forward(&self, x: &Tensor, delta: &Tensor) -> Result<(Tensor, Tensor), EngineError> {
        if x.device() == tch::Device::Cpu
            && let Some(both) = crate::fused::add_rms_norm(x, Some(delta), &self.scale, self.eps)?
        {
            return Ok(both);
        }
        let x = x.f_add(delta)?;
        let h = self.forward(&x)?;
        Ok((x, h))
    }

    /// `1 + w` in float32 and epsilon (for fused passes over several norms).
    pub fn parts(&self) -> (&Tensor, f64) {
        (&self.scale, self.eps)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    /// Gemma's norm with weight w is the plain RMSNorm with weight 1 + w
    /// (in float32), and a zero weight leaves the normalised input as is.
    #[test]
    fn gemma_norm_scales_by_one_plus_w() {
        tch::manual_seed(5);
        let x = Tensor::randn([3, 8], (Kind::Float, Device::Cpu));
        let w = Tensor::randn([8], (Kind::Float, Device::Cpu));
        let gemma = GemmaRmsNorm::new(w.shallow_clone(), 1e-6).expect("norm");
        let plain = RmsNorm::new(&w + 1.0, 1e-6);
        let diff = (gemma.forward(&x).expect("gemma") - plain.forward(&x).expect("plain"))
            .abs()
            .max()
            .double_value(&[]);
        assert!(diff < 1e-6, "differs by {diff}");
        let zero =
            GemmaRmsNorm::new(Tensor::zeros([8], (Kind::Float, Device::Cpu)), 1e-6).expect("norm");
        let unit = RmsNorm::new(Tensor::ones([8], (Kind::Float, Device::Cpu)), 1e-6);
        // The plain norm sums its squares in float64 on the CPU (gyre's
        // fused op), Gemma's in float32 (libtorch): a float32 step apart.
        let diff = (zero.forward(&x).expect("zero") - unit.forward(&x).expect("unit"))
            .abs()
            .max()
            .double_value(&[]);
        assert!(diff < 1e-6, "zero weight differs by {diff}");
        let rms = zero
            .forward(&x)
            .expect("zero")
            .pow_tensor_scalar(2)
            .mean_dim(-1, false, Kind::Float);
        let off = (rms - 1.0).abs().max().double_value(&[]);
        assert!(off < 1e-4, "not unit RMS: {off}");
    }
}
