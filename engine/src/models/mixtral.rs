//! Mixtral (`MixtralForCausalLM`), as transformers' `modeling_mixtral.py`:
//! Mistral's attention (grouped-query, rope, optional `sliding_window`)
//! with a sparse mixture-of-experts MLP in every layer: `num_local_experts`
//! SwiGLU experts, `num_experts_per_tok` of them per token from the
//! router's softmax, their weights renormalised (`layers/moe.rs`).
//! Checkpoints name the block `block_sparse_moe` with experts `w1` (gate),
//! `w3` (up) and `w2` (down), as on the hub, or `mlp` with transformers 5's
//! names.

use tch::Tensor;

use super::stack::{Decoder, Layer};
use super::{Model, field, refuse, require_full_rotary, require_layer_types};
use crate::EngineError;
use crate::config::ModelConfig;
use crate::layers::Backend;
use crate::layers::attention::{AttnParams, LayerStep, paged_attention};
use crate::layers::embedding::Embedding;
use crate::layers::linear::{Linear, lm_head};
use crate::layers::mlp::Act;
use crate::layers::moe::SparseMoe;
use crate::layers::norm::RmsNorm;
use crate::layers::rope::{Rope, RopeAt};
use crate::layers::weights::Weights;

/// What this family reads beyond the shared config.
struct MixtralConfig {
    sliding_window: Option<i64>,
    num_experts: i64,
    top_k: i64,
    act: Act,
}

/// A positive integer field of config.json, or `default` when absent.
fn count(cfg: &ModelConfig, key: &str, default: i64) -> Result<i64, EngineError> {
    match field(cfg, key) {
        None => Ok(default),
        Some(v) => v
            .as_i64()
            .filter(|&n| n > 0)
            .ok_or_else(|| refuse(cfg, &format!("{key} {v}"))),
    }
}

impl MixtralConfig {
    fn read(cfg: &ModelConfig) -> Result<Self, EngineError> {
        require_full_rotary(cfg)?;
        require_layer_types(cfg, &["full_attention"])?;
        let sliding_window = match field(cfg, "sliding_window") {
            None => None,
            Some(v) => Some(
                v.as_i64()
                    .filter(|&w| w > 0)
                    .ok_or_else(|| refuse(cfg, &format!("sliding_window {v}")))?,
            ),
        };
        Ok(Self {
            sliding_window,
            num_experts: count(cfg, "num_local_experts", 8)?,
            top_k: count(cfg, "num_experts_per_tok", 2)?,
            act: Act::parse(&cfg.hidden_act)?,
        })
    }
}

/// Self-attention: q, k and v projections stacked into one GEMM, rope on q
/// and k, paged attention, the output projection.
struct Attention {
    qkv: Linear,
    o: Linear,
    p: AttnParams,
}

impl Attention {
    fn load(
        w: &mut Weights,
        a: &str,
        cfg: &ModelConfig,
        lc: &MixtralConfig,
        be: &Backend,
    ) -> Result<Self, EngineError> {
        let [q, k, v] = ["q_proj", "k_proj", "v_proj"].map(|p| format!("{a}{p}.weight"));
        Ok(Self {
            qkv: Linear::new(w.take_cat(&[&q, &k, &v])?, None, be)?,
            o: Linear::new(w.take(&format!("{a}o_proj.weight"))?, None, be)?,
            p: AttnParams {
                heads: cfg.num_heads,
                kv_heads: cfg.num_kv_heads,
                head_dim: cfg.head_dim,
                window: lc.sliding_window,
            },
        })
    }

    fn forward(
        &self,
        x: &Tensor,
        rope: &RopeAt,
        s: &mut LayerStep<'_>,
    ) -> Result<Tensor, EngineError> {
        let AttnParams {
            heads: nh,
            kv_heads: nkv,
            head_dim: hd,
            ..
        } = self.p;
        let qkv = self.qkv.forward(x, s.be)?;
        let (q, k, v) = rope.apply_qkv(&qkv, nh, nkv, hd)?;
        let out = paged_attention(s, &q, &k, &v, &self.p)?;
        self.o.forward(&out, s.be)
    }
}

struct DecoderLayer {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    moe: SparseMoe,
}

impl Layer for DecoderLayer {
    fn host_sync(&self) -> bool {
        true
    }

    fn forward(
        &self,
        x: &Tensor,
        rope: &RopeAt,
        s: &mut LayerStep<'_>,
    ) -> Result<Tensor, EngineError> {
        let h = self.input_layernorm.forward(x)?;
        let x = x.f_add(&self.self_attn.forward(&h, rope, s)?)?;
        let h = self.post_attention_layernorm.forward(&x)?;
        Ok(x.f_add(&self.moe.forward(&h, s.be)?)?)
    }
}

pub(super) fn load(
    cfg: ModelConfig,
    w: &mut Weights,
    be: Backend,
) -> Result<Box<dyn Model>, EngineError> {
    let lc = MixtralConfig::read(&cfg)?;
    let eps = cfg.rms_norm_eps;
    let mut layers = Vec::with_capacity(cfg.num_layers as usize);
    for i in 0..cfg.num_layers {
        let p = format!("model.layers.{i}.");
        let hub = format!("{p}block_sparse_moe.");
        let (moe, names) = if w.contains(&format!("{hub}gate.weight")) {
            (hub, ["w1", "w3", "w2"])
        } else {
            (format!("{p}mlp."), ["gate_proj", "up_proj", "down_proj"])
        };
        layers.push(DecoderLayer {
            input_layernorm: RmsNorm::new(w.take(&format!("{p}input_layernorm.weight"))?, eps),
            self_attn: Attention::load(w, &format!("{p}self_attn."), &cfg, &lc, &be)?,
            post_attention_layernorm: RmsNorm::new(
                w.take(&format!("{p}post_attention_layernorm.weight"))?,
                eps,
            ),
            moe: SparseMoe::load(
                w,
                &moe,
                "gate",
                names,
                lc.num_experts,
                lc.top_k,
                true,
                lc.act,
                &be,
            )?,
        });
    }
    let embed_tokens = Embedding::load(w, &be)?;
    let norm = RmsNorm::new(w.take("model.norm.weight")?, eps);
    let lm_head = lm_head(w, cfg.tie_word_embeddings, &embed_tokens, &be)?;
    let rope = Rope::new(
        cfg.rope_theta,
        &cfg.rope_scaling,
        cfg.head_dim,
        cfg.max_position_embeddings,
        be.device,
    )?;
    Ok(Box::new(Decoder {
        cfg,
        be,
        embed_tokens,
        layers,
        norm,
        lm_head,
        rope,
        rows: Default::default(),
    }))
}
