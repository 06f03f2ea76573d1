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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use tch::{Device, Kind, Tensor};

    use super::*;

    /// 4 experts (hidden 8, intermediate 6) with per-expert hub names.
    fn moe(norm_topk: bool) -> (SparseMoe, HashMap<String, Tensor>) {
        tch::manual_seed(11);
        let mut map = HashMap::new();
        let r = |s: &[i64]| Tensor::randn(s, (Kind::Float, Device::Cpu));
        map.insert("m.gate.weight".to_string(), r(&[4, 8]));
        for e in 0..4 {
            map.insert(format!("m.experts.{e}.w1.weight"), r(&[6, 8]));
            map.insert(format!("m.experts.{e}.w3.weight"), r(&[6, 8]));
            map.insert(format!("m.experts.{e}.w2.weight"), r(&[8, 6]));
        }
        let copy: HashMap<String, Tensor> =
            map.iter().map(|(k, v)| (k.clone(), v.copy())).collect();
        let be = Backend::new(Device::Cpu, Kind::Float).expect("backend");
        let mut w = Weights::new(map, Device::Cpu, Kind::Float);
        let m = SparseMoe::load(
            &mut w,
            "m.",
            "gate",
            ["w1", "w3", "w2"],
            4,
            2,
            norm_topk,
            Act::Silu,
            &be,
        )
        .expect("moe");
        (m, copy)
    }

    /// Every expert on every token, weighted by the top-2 routing weights
    /// (zero for the others): what the sparse block must equal.
    fn dense(x: &Tensor, w: &HashMap<String, Tensor>, norm_topk: bool) -> Tensor {
        let probs = x.matmul(&w["m.gate.weight"].tr()).softmax(-1, Kind::Float);
        let (mut top, idx) = probs.topk(2, -1, true, true);
        if norm_topk {
            top = &top / top.sum_dim_intlist(-1, true, Kind::Float);
        }
        let full = probs.zeros_like().scatter(1, &idx, &top);
        let mut out = x.zeros_like();
        for e in 0..4 {
            let g = x
                .matmul(&w[&format!("m.experts.{e}.w1.weight")].tr())
                .silu();
            let u = x.matmul(&w[&format!("m.experts.{e}.w3.weight")].tr());
            let y = (g * u).matmul(&w[&format!("m.experts.{e}.w2.weight")].tr());
            out += y * full.narrow(1, e, 1);
        }
        out
    }

    #[test]
    fn sparse_experts_equal_the_dense_weighted_sum() {
        let be = Backend::new(Device::Cpu, Kind::Float).expect("backend");
        for norm_topk in [true, false] {
            let (m, w) = moe(norm_topk);
            let x = Tensor::randn([9, 8], (Kind::Float, Device::Cpu));
            let got = m.forward(&x, &be).expect("forward");
            let want = dense(&x, &w, norm_topk);
            let diff = (got - &want).abs().max().double_value(&[]);
            assert!(diff < 1e-4, "norm_topk {norm_topk}: {diff}");
            // A token's output does not depend on the others in the batch.
            let alone = m.forward(&x.narrow(0, 4, 1), &be).expect("forward");
            let diff = (alone - want.narrow(0, 4, 1)).abs().max().double_value(&[]);
            assert!(diff < 1e-4, "alone: {diff}");
        }
    }
}
