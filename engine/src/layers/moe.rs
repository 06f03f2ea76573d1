//! A sparse mixture-of-experts MLP (Mixtral, Qwen3-MoE), as transformers'
//! `*SparseMoeBlock`: a router picks the top-k experts of each token from
//! the softmax of its logits (in float32), their weights optionally
//! renormalised to sum to one; each expert (a gated MLP) runs only on the
//! rows of the tokens routed to it, and its output, times the token's
//! routing weight, is added into those rows, experts in ascending order as
//! transformers adds them.

use tch::{Kind, Tensor};

use super::Backend;
use super::linear::Linear;
use super::mlp::{Act, GatedMlp};
use super::weights::Weights;
use crate::EngineError;

pub(crate) struct SparseMoe {
    router: Linear,
    experts: Vec<GatedMlp>,
    top_k: i64,
    /// Renormalise the top-k weights to sum to one (Mixtral always;
    /// Qwen3-MoE's `norm_topk_prob`).
    norm_topk: bool,
}

impl SparseMoe {
    /// Loads the router `{prefix}{router}.weight` [experts, hidden] and the
    /// experts, either one gated MLP each (`{prefix}experts.{e}.{gate}`,
    /// `{up}`, `{down}`: the hub checkpoints' layout, with the family's
    /// projection names) or stacked into `{prefix}experts.gate_up_proj`
    /// [experts, 2 * inter, hidden] and `experts.down_proj` [experts,
    /// hidden, inter] (transformers 5's in-memory layout).
    #[allow(clippy::too_many_arguments)]
    pub fn load(
        w: &mut Weights,
        prefix: &str,
        router: &str,
        [gate, up, down]: [&str; 3],
        num_experts: i64,
        top_k: i64,
        norm_topk: bool,
        act: Act,
        be: &Backend,
    ) -> Result<Self, EngineError> {
        if num_experts <= 0 || top_k <= 0 || top_k > num_experts {
            return Err(EngineError::Unsupported(format!(
                "mixture of experts with {top_k} of {num_experts} experts per token"
            )));
        }
        let router = Linear::new(w.take(&format!("{prefix}{router}.weight"))?, None, be)?;
        let stacked = format!("{prefix}experts.gate_up_proj");
        let mut experts = Vec::with_capacity(num_experts as usize);
        if w.contains(&stacked) {
            let gate_up = w.take(&stacked)?;
            let downs = w.take(&format!("{prefix}experts.down_proj"))?;
            for e in 0..num_experts {
                experts.push(GatedMlp::fused(
                    gate_up.f_get(e)?.f_contiguous()?,
                    downs.f_get(e)?.f_contiguous()?,
                    act,
                    be,
                )?);
            }
        } else {
            for e in 0..num_experts {
                let x = format!("{prefix}experts.{e}.");
                let gate_up =
                    w.take_cat(&[&format!("{x}{gate}.weight"), &format!("{x}{up}.weight")])?;
                let d = w.take(&format!("{x}{down}.weight"))?;
                experts.push(GatedMlp::fused(gate_up, d, act, be)?);
            }
        }
        Ok(Self {
            router,
            experts,
            top_k,
            norm_topk,
        })
    }

    /// `x` [N, hidden] -> [N, hidden].
    pub fn forward(&self, x: &Tensor, be: &Backend) -> Result<Tensor, EngineError> {
        let logits = self.router.forward(x, be)?;
        let probs = logits.f_softmax(-1, Kind::Float)?;
        let (mut weights, chosen) = probs.f_topk(self.top_k, -1, true, true)?;
        if self.norm_topk {
            weights = weights.f_div(&weights.f_sum_dim_intlist(-1, true, Kind::Float)?)?;
        }
        let weights = weights.f_to_kind(x.kind())?;
        // Routing decisions on the CPU: which (token, slot) pairs each
        // expert serves.
        let chosen_cpu: Vec<i64> = Vec::<i64>::try_from(
            chosen
                .f_to_device(tch::Device::Cpu)?
                .f_reshape([-1])?
                .f_contiguous()?,
        )?;
        let k = self.top_k as usize;
        let mut rows: Vec<Vec<i64>> = vec![Vec::new(); self.experts.len()];
        for (i, &e) in chosen_cpu.iter().enumerate() {
            let e = usize::try_from(e)
                .ok()
                .filter(|&e| e < self.experts.len())
                .ok_or_else(|| EngineError::Step(format!("router chose expert {e}")))?;
            rows[e].push(i as i64);
        }
        let flat_w = weights.f_reshape([-1, 1])?;
        let mut out = x.f_zeros_like()?;
        for (expert, pairs) in self.experts.iter().zip(&rows) {
            if pairs.is_empty() {
                continue;
            }
            let pairs = Tensor::from_slice(pairs).f_to_device(x.device())?;
            let tokens = pairs.f_div_scalar_mode(k as i64, "floor")?;
            let y = expert.forward(&x.f_index_select(0, &tokens)?, be)?;
            let y = y.f_mul(&flat_w.f_index_select(0, &pairs)?)?;
            let _ = out.f_index_add_(0, &tokens, &y)?;
        }
        Ok(out)
    }
}
