//! Qwen3-MoE (`Qwen3MoeForCausalLM`), as transformers'
//! `modeling_qwen3_moe.py`: Qwen3's attention (an RMSNorm over each query
//! and key head before rope) with a sparse mixture-of-experts MLP
//! (`layers/moe.rs`: `num_experts` SwiGLU experts, `num_experts_per_tok`
//! per token, renormalised when `norm_topk_prob`) in the layers
//! `decoder_sparse_step` selects, minus `mlp_only_layers`, which keep a
//! dense MLP of `intermediate_size`. The optional sliding window
//! (`use_sliding_window`) is refused at load.

use serde_json::Value;
use tch::Tensor;

use super::stack::{Decoder, Layer};
use super::{Model, field, flag, refuse, require_full_rotary, require_layer_types};
use crate::EngineError;
use crate::config::ModelConfig;
use crate::layers::Backend;
use crate::layers::attention::{AttnParams, LayerStep, paged_attention};
use crate::layers::embedding::Embedding;
use crate::layers::linear::{Linear, lm_head};
use crate::layers::mlp::{Act, GatedMlp};
use crate::layers::moe::SparseMoe;
use crate::layers::norm::RmsNorm;
use crate::layers::rope::{Rope, RopeAt};
use crate::layers::weights::Weights;

/// What this family reads beyond the shared config.
struct Qwen3MoeConfig {
    attention_bias: bool,
    num_experts: i64,
    top_k: i64,
    norm_topk_prob: bool,
    decoder_sparse_step: i64,
    mlp_only_layers: Vec<i64>,
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

impl Qwen3MoeConfig {
    fn read(cfg: &ModelConfig) -> Result<Self, EngineError> {
        require_full_rotary(cfg)?;
        require_layer_types(cfg, &["full_attention"])?;
        if flag(cfg, "use_sliding_window") {
            return Err(refuse(cfg, "use_sliding_window"));
        }
        let mlp_only_layers = match field(cfg, "mlp_only_layers") {
            None => Vec::new(),
            Some(v) => v
                .as_array()
                .and_then(|a| a.iter().map(Value::as_i64).collect::<Option<Vec<_>>>())
                .ok_or_else(|| refuse(cfg, &format!("mlp_only_layers {v}")))?,
        };
        Ok(Self {
            attention_bias: flag(cfg, "attention_bias"),
            num_experts: count(cfg, "num_experts", 128)?,
            top_k: count(cfg, "num_experts_per_tok", 8)?,
            norm_topk_prob: flag(cfg, "norm_topk_prob"),
            decoder_sparse_step: count(cfg, "decoder_sparse_step", 1)?,
            mlp_only_layers,
            act: Act::parse(&cfg.hidden_act)?,
        })
    }

    /// Whether layer `i` has the sparse MLP (as transformers decides).
    fn sparse(&self, i: i64) -> bool {
        !self.mlp_only_layers.contains(&i) && (i + 1) % self.decoder_sparse_step == 0
    }
}

/// Self-attention: q, k and v projections stacked into one GEMM, the
/// per-head q and k norms, rope on q and k, paged attention, the output
/// projection.
struct Attention {
    qkv: Linear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    o: Linear,
    p: AttnParams,
}

impl Attention {
    fn load(
        w: &mut Weights,
        a: &str,
        cfg: &ModelConfig,
        lc: &Qwen3MoeConfig,
        be: &Backend,
    ) -> Result<Self, EngineError> {
        let names = |part: &str| ["q_proj", "k_proj", "v_proj"].map(|p| format!("{a}{p}.{part}"));
        let [q, k, v] = names("weight");
        let qkv = w.take_cat(&[&q, &k, &v])?;
        let bias = if lc.attention_bias {
            let [q, k, v] = names("bias");
            Some(w.take_cat(&[&q, &k, &v])?)
        } else {
            None
        };
        let eps = cfg.rms_norm_eps;
        Ok(Self {
            qkv: Linear::new(qkv, bias, be)?,
            q_norm: RmsNorm::new(w.take(&format!("{a}q_norm.weight"))?, eps),
            k_norm: RmsNorm::new(w.take(&format!("{a}k_norm.weight"))?, eps),
            o: Linear::new(
                w.take(&format!("{a}o_proj.weight"))?,
                w.maybe(&format!("{a}o_proj.bias"), lc.attention_bias)?,
                be,
            )?,
            p: AttnParams {
                heads: cfg.num_heads,
                kv_heads: cfg.num_kv_heads,
                head_dim: cfg.head_dim,
                window: None,
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
        let n = s.batch.n;
        let qkv = self.qkv.forward(x, s.be)?;
        let q = qkv.f_narrow(1, 0, nh * hd)?.f_view([n, nh, hd])?;
        let k = qkv.f_narrow(1, nh * hd, nkv * hd)?.f_view([n, nkv, hd])?;
        let v = qkv
            .f_narrow(1, (nh + nkv) * hd, nkv * hd)?
            .f_view([n, nkv, hd])?;
        let (q, k) = (self.q_norm.forward(&q)?, self.k_norm.forward(&k)?);
        let (q, k) = (rope.apply(&q)?, rope.apply(&k)?);
        let out = paged_attention(s, &q, &k, &v, &self.p)?;
        self.o.forward(&out, s.be)
    }
}

/// A layer's MLP: sparse experts, or dense in `mlp_only_layers` and the
/// layers `decoder_sparse_step` skips.
enum Mlp {
    Sparse(SparseMoe),
    Dense(GatedMlp),
}

struct DecoderLayer {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    mlp: Mlp,
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
        let m = match &self.mlp {
            Mlp::Sparse(moe) => moe.forward(&h, s.be)?,
            Mlp::Dense(mlp) => mlp.forward(&h, s.be)?,
        };
        Ok(x.f_add(&m)?)
    }
}

pub(super) fn load(
    cfg: ModelConfig,
    w: &mut Weights,
    be: Backend,
) -> Result<Box<dyn Model>, EngineError> {
    let lc = Qwen3MoeConfig::read(&cfg)?;
    let eps = cfg.rms_norm_eps;
    let mut layers = Vec::with_capacity(cfg.num_layers as usize);
    for i in 0..cfg.num_layers {
        let p = format!("model.layers.{i}.");
        let mlp = if lc.sparse(i) {
            Mlp::Sparse(SparseMoe::load(
                w,
                &format!("{p}mlp."),
                "gate",
                ["gate_proj", "up_proj", "down_proj"],
                lc.num_experts,
                lc.top_k,
                lc.norm_topk_prob,
                lc.act,
                &be,
            )?)
        } else {
            Mlp::Dense(GatedMlp::load(
                w,
                &format!("{p}mlp."),
                cfg.intermediate_size,
                lc.act,
                &be,
            )?)
        };
        layers.push(DecoderLayer {
            input_layernorm: RmsNorm::new(w.take(&format!("{p}input_layernorm.weight"))?, eps),
            self_attn: Attention::load(w, &format!("{p}self_attn."), &cfg, &lc, &be)?,
            post_attention_layernorm: RmsNorm::new(
                w.take(&format!("{p}post_attention_layernorm.weight"))?,
                eps,
            ),
            mlp,
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
