//! Gemma 2 (`Gemma2ForCausalLM`), as transformers' `modeling_gemma2.py`:
//! embeddings scaled by `sqrt(hidden_size)` in the model's dtype, Gemma's
//! `1 + w` RMSNorm, four norms per layer (before and after attention,
//! before and after the MLP), attention logits scaled by
//! `query_pre_attn_scalar^-0.5` and soft-capped (`attn_logit_softcapping`),
//! GeGLU, sliding-window layers alternating with global ones (`layer_types`,
//! else every second layer global), one rope, final logit soft-capping
//! (`final_logit_softcapping`), tied embeddings. A soft cap absent from
//! config.json takes transformers' default (50 and 30); `null` turns it off.

use serde_json::Value;
use tch::Tensor;

use super::gemma3::{embed_scale, gelu_tanh, sliding_layers, soft_cap};
use super::{Model, field, flag, refuse, require_full_rotary};
use crate::EngineError;
use crate::config::ModelConfig;
use crate::kv::KvPool;
use crate::layers::Backend;
use crate::layers::attention::{AttnLogits, AttnParams, LayerStep, paged_attention_with};
use crate::layers::batch::StepBatch;
use crate::layers::embedding::Embedding;
use crate::layers::linear::{Linear, lm_head};
use crate::layers::mlp::GatedMlp;
use crate::layers::norm::GemmaRmsNorm;
use crate::layers::rope::{Rope, RopeAt};
use crate::layers::weights::Weights;

/// What this family reads beyond the shared config.
struct Gemma2Config {
    query_pre_attn_scalar: f64,
    /// Per layer: whether it attends over the sliding window only.
    sliding: Vec<bool>,
    sliding_window: i64,
    attn_softcap: Option<f64>,
    final_softcap: Option<f64>,
}

/// A soft cap: transformers' `default` when config.json lacks the key,
/// none when it is `null`.
fn cap(cfg: &ModelConfig, key: &str, default: f64) -> Option<f64> {
    match cfg.raw.get(key) {
        None => Some(default),
        Some(v) => v.as_f64(),
    }
}

impl Gemma2Config {
    fn read(cfg: &ModelConfig) -> Result<Self, EngineError> {
        require_full_rotary(cfg)?;
        for f in ["attention_bias", "use_bidirectional_attention"] {
            if flag(cfg, f) {
                return Err(refuse(cfg, f));
            }
        }
        let num = |k: &str, default: f64| field(cfg, k).and_then(Value::as_f64).unwrap_or(default);
        Ok(Self {
            query_pre_attn_scalar: num("query_pre_attn_scalar", 256.0),
            sliding: sliding_layers(cfg, 2)?,
            sliding_window: field(cfg, "sliding_window")
                .and_then(Value::as_i64)
                .unwrap_or(4096),
            attn_softcap: cap(cfg, "attn_logit_softcapping", 50.0),
            final_softcap: cap(cfg, "final_logit_softcapping", 30.0),
        })
    }
}

/// Self-attention: q, k and v stacked into one GEMM, rope, paged attention
/// with the `query_pre_attn_scalar` scale, the soft cap and the layer's
/// window, the output projection.
struct Attention {
    qkv: Linear,
    o: Linear,
    p: AttnParams,
    logits: AttnLogits,
}

impl Attention {
    fn load(
        w: &mut Weights,
        a: &str,
        cfg: &ModelConfig,
        window: Option<i64>,
        logits: AttnLogits,
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
                window,
            },
            logits,
        })
    }

    fn forward(
        &self,
        x: &Tensor,
        rope: &RopeAt,
        s: &mut LayerStep<'_>,
    ) -> Result<Tensor, EngineError> {
        let (nh, nkv, hd) = (self.p.heads, self.p.kv_heads, self.p.head_dim);
        let n = s.batch.n;
        let qkv = self.qkv.forward(x, s.be)?;
        let q = qkv.f_narrow(1, 0, nh * hd)?.f_view([n, nh, hd])?;
        let k = qkv.f_narrow(1, nh * hd, nkv * hd)?.f_view([n, nkv, hd])?;
        let v = qkv
            .f_narrow(1, (nh + nkv) * hd, nkv * hd)?
            .f_view([n, nkv, hd])?;
        let (q, k) = (rope.apply(&q)?, rope.apply(&k)?);
        let out = paged_attention_with(s, &q, &k, &v, &self.p, &self.logits)?;
        self.o.forward(&out, s.be)
    }
}

struct DecoderLayer {
    input_layernorm: GemmaRmsNorm,
    self_attn: Attention,
    post_attention_layernorm: GemmaRmsNorm,
    pre_feedforward_layernorm: GemmaRmsNorm,
    mlp: GatedMlp,
    post_feedforward_layernorm: GemmaRmsNorm,
}

impl DecoderLayer {
    fn forward(
        &self,
        x: &Tensor,
        rope: &RopeAt,
        s: &mut LayerStep<'_>,
    ) -> Result<Tensor, EngineError> {
        let h = self.input_layernorm.forward(x)?;
        let h = self.self_attn.forward(&h, rope, s)?;
        let x = x.f_add(&self.post_attention_layernorm.forward(&h)?)?;
        let h = self.pre_feedforward_layernorm.forward(&x)?;
        let h = self.mlp.forward(&h, s.be)?;
        Ok(x.f_add(&self.post_feedforward_layernorm.forward(&h)?)?)
    }
}

struct Gemma2 {
    cfg: ModelConfig,
    be: Backend,
    embed_tokens: Embedding,
    /// `sqrt(hidden_size)` as a scalar of the model's dtype.
    embed_scale: Tensor,
    layers: Vec<DecoderLayer>,
    norm: GemmaRmsNorm,
    lm_head: Linear,
    rope: Rope,
    final_softcap: Option<f64>,
}

pub(super) fn load(
    cfg: ModelConfig,
    w: &mut Weights,
    be: Backend,
) -> Result<Box<dyn Model>, EngineError> {
    let gc = Gemma2Config::read(&cfg)?;
    let act = gelu_tanh(&cfg)?;
    let eps = cfg.rms_norm_eps;
    let logits = AttnLogits {
        scale: Some(gc.query_pre_attn_scalar.powf(-0.5)),
        softcap: gc.attn_softcap,
    };
    let mut layers = Vec::with_capacity(cfg.num_layers as usize);
    for (i, &sliding) in gc.sliding.iter().enumerate() {
        let p = format!("model.layers.{i}.");
        let norm =
            |w: &mut Weights, n: &str| GemmaRmsNorm::new(w.take(&format!("{p}{n}.weight"))?, eps);
        let window = sliding.then_some(gc.sliding_window);
        layers.push(DecoderLayer {
            input_layernorm: norm(w, "input_layernorm")?,
            self_attn: Attention::load(w, &format!("{p}self_attn."), &cfg, window, logits, &be)?,
            post_attention_layernorm: norm(w, "post_attention_layernorm")?,
            pre_feedforward_layernorm: norm(w, "pre_feedforward_layernorm")?,
            mlp: GatedMlp::load(w, &format!("{p}mlp."), cfg.intermediate_size, act, &be)?,
            post_feedforward_layernorm: norm(w, "post_feedforward_layernorm")?,
        });
    }
    let embed_tokens = Embedding::load(w, &be)?;
    let embed_scale = embed_scale(cfg.hidden_size, &be)?;
    let norm = GemmaRmsNorm::new(w.take("model.norm.weight")?, eps)?;
    let lm_head = lm_head(w, cfg.tie_word_embeddings, &embed_tokens, &be)?;
    let rope = Rope::new(
        cfg.rope_theta,
        &cfg.rope_scaling,
        cfg.head_dim,
        cfg.max_position_embeddings,
        be.device,
    )?;
    Ok(Box::new(Gemma2 {
        embed_tokens,
        embed_scale,
        layers,
        norm,
        lm_head,
        rope,
        final_softcap: gc.final_softcap,
        cfg,
        be,
    }))
}

impl Model for Gemma2 {
    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn backend(&self) -> &Backend {
        &self.be
    }

    fn forward_batch(&self, batch: &StepBatch, pool: &mut KvPool) -> Result<Tensor, EngineError> {
        let rope = self.rope.at(&batch.pos)?;
        let mut x = self
            .embed_tokens
            .forward(&batch.ids)?
            .f_mul(&self.embed_scale)?;
        for (layer, l) in self.layers.iter().enumerate() {
            let _span = tracing::trace_span!("layer", layer).entered();
            let mut s = LayerStep {
                batch,
                be: &self.be,
                pool: &mut *pool,
                layer,
            };
            x = l.forward(&x, &rope, &mut s)?;
        }
        self.norm.forward(&x)
    }

    fn logits(&self, hidden: &Tensor) -> Result<Tensor, EngineError> {
        soft_cap(self.lm_head.forward(hidden, &self.be)?, self.final_softcap)
    }
}
