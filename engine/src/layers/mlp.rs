//! The gated MLP of the Llama lineage: `down(act(gate(x)) * up(x))`, with
//! gate and up stacked into one weight so they run as one wider GEMM. With
//! SiLU it is SwiGLU; with the tanh-approximated GELU, Gemma's GeGLU.

use tch::Tensor;

use super::Backend;
use super::linear::Linear;
use super::weights::Weights;
use crate::EngineError;

/// Activations a gated MLP may use (`hidden_act`).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Act {
    Silu,
    /// GELU with the tanh approximation (`gelu_pytorch_tanh`, Gemma's GeGLU).
    /// Only families that implement it choose it; `parse` does not.
    GeluTanh,
}

impl Act {
    /// The activation named by a config's `hidden_act`; others fail at load.
    pub fn parse(name: &str) -> Result<Self, EngineError> {
        match name {
            "silu" | "swish" => Ok(Self::Silu),
            other => Err(EngineError::Unsupported(format!(
                "hidden_act {other:?} (supported: silu)"
            ))),
        }
    }

    fn forward(self, x: &Tensor) -> Result<Tensor, EngineError> {
        match self {
            Self::Silu => Ok(x.f_silu()?),
            Self::GeluTanh => Ok(x.f_gelu("tanh")?),
        }
    }
}

pub(crate) struct GatedMlp {
    gate_up: Linear,
    down: Linear,
    inter: i64,
    act: Act,
}

impl GatedMlp {
    /// Loads `{prefix}gate_proj`, `up_proj` and `down_proj` (no biases).
    pub fn load(
        w: &mut Weights,
        prefix: &str,
        inter: i64,
        act: Act,
        be: &Backend,
    ) -> Result<Self, EngineError> {
        let gate_up = w.take_cat_linear(&[
            &format!("{prefix}gate_proj.weight"),
            &format!("{prefix}up_proj.weight"),
        ])?;
        Ok(Self {
            gate_up: Self::gate_up(gate_up, act, be)?,
            down: Linear::new(
                w.take_linear(&format!("{prefix}down_proj.weight"))?,
                None,
                be,
            )?,
            inter,
            act,
        })
    }

    /// From a stacked `gate_up` weight [2 * inter, hidden] (gate rows
    /// first, as Phi-3's `gate_up_proj` and MoE experts store it) and a
    /// `down` weight [hidden, inter].
    pub fn fused(
        gate_up: Tensor,
        down: Tensor,
        act: Act,
        be: &Backend,
    ) -> Result<Self, EngineError> {
        let inter = gate_up.size()[0] / 2;
        Ok(Self {
            gate_up: Self::gate_up(gate_up, act, be)?,
            down: Linear::new(down, None, be)?,
            inter,
            act,
        })
    }

    /// With SiLU, the stacked weight packed for the fused activation
    /// where the backend packs (see [`Linear::gate_up`]).
    fn gate_up(
        w: impl Into<super::linear::LinearWeight>,
        act: Act,
        be: &Backend,
    ) -> Result<Linear, EngineError> {
        match act {
            Act::Silu => Linear::gate_up(w, be),
            Act::GeluTanh => Linear::new(w, None, be),
        }
    }

    /// The stacked gate/up and the down projection, for the row path
    /// (`layers::rows`): a SwiGLU MLP alone (GeGLU has no row path).
    pub fn silu_parts(&self) -> Option<(&Linear, &Linear)> {
        matches!(self.act, Act::Silu).then_some((&self.gate_up, &self.down))
    }

    pub fn forward(&self, x: &Tensor, be: &Backend) -> Result<Tensor, EngineError> {
        // (Only a SiLU MLP: a quantized gate/up weight is stacked the same
        // way under GeGLU.)
        if matches!(self.act, Act::Silu)
            && let Some(a) = self.gate_up.forward_silu(x, be)?
        {
            return self.down.forward(&a, be);
        }
        if matches!(self.act, Act::Silu)
            && let Some(a) = self.gate_up.gemv_silu(x)?
        {
            return self.down.forward(&a, be);
        }
        let gu = self.gate_up.forward(x, be)?;
        if matches!(self.act, Act::Silu)
            && let Some(a) = crate::fused::silu_mul(&gu, self.inter)?
        {
            return self.down.forward(&a, be);
        }
        self.down.forward(&self.act_mul(&gu)?, be)
    }

    /// `act(gate) * up` of a stacked product `gu` [N, 2 * inter], as
    /// libtorch ops (the tensor path and, for GeGLU, the row path).
    pub fn act_mul(&self, gu: &Tensor) -> Result<Tensor, EngineError> {
        let g = self.act.forward(&gu.f_narrow(1, 0, self.inter)?)?;
        let u = gu.f_narrow(1, self.inter, self.inter)?;
        Ok(g.f_mul(&u)?)
    }

    /// The stacked gate/up and the down projection of any activation
    /// (GeGLU's row path runs the activation through [`Self::act_mul`]).
    pub fn parts(&self) -> (&Linear, &Linear) {
        (&self.gate_up, &self.down)
    }
}
