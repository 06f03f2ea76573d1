//! Gemma 3, text only (`Gemma3ForCausalLM`; a GGUF's `gemma3`), as
//! transformers' `modeling_gemma3.py`: embeddings scaled by
//! `sqrt(hidden_size)` in the model's dtype, Gemma's `1 + w` RMSNorm, four
//! norms per layer (before and after attention, before and after the MLP),
//! an RMSNorm over each query and key head, attention logits scaled by
//! `query_pre_attn_scalar^-0.5`, GeGLU, sliding-window layers interleaved
//! with global ones (`layer_types`, or every `sliding_window_pattern`-th
//! layer global), each kind with its own rope base (`rope_local_base_freq`
//! for the sliding ones, `rope_theta` and any rope scaling for the global
//! ones), optional final logit soft-capping, tied embeddings.

use serde_json::Value;
use tch::{Kind, Tensor};

use super::{Model, field, flag, refuse, require_full_rotary};
use crate::EngineError;
use crate::config::{ModelConfig, RopeScaling};
use crate::kv::KvPool;
use crate::layers::Backend;
use crate::layers::attention::{
    AttnLogits, AttnParams, LayerStep, paged_attention_qkv_with, paged_attention_with,
};
use crate::layers::batch::StepBatch;
use crate::layers::embedding::Embedding;
use crate::layers::linear::{Linear, lm_head};
use crate::layers::mlp::{Act, GatedMlp};
use crate::layers::norm::GemmaRmsNorm;
use crate::layers::rope::{Rope, RopeAt};
use crate::layers::rows::{self, GemmaRowParts, RowScratch, RowStep};
use crate::layers::weights::Weights;

/// What this family reads beyond the shared config.
struct Gemma3Config {
    query_pre_attn_scalar: f64,
    /// Per layer: whether it attends over the sliding window only.
    sliding: Vec<bool>,
    sliding_window: i64,
    /// Rope base and scaling of the global and of the sliding layers.
    global_rope: (f64, RopeScaling),
    local_rope: (f64, RopeScaling),
    final_softcap: Option<f64>,
}

/// `hidden_activation` (`hidden_act` in older configs) must be Gemma's GELU.
pub(super) fn gelu_tanh(cfg: &ModelConfig) -> Result<Act, EngineError> {
    let name = field(cfg, "hidden_activation")
        .or_else(|| field(cfg, "hidden_act"))
        .and_then(Value::as_str)
        .unwrap_or("gelu_pytorch_tanh");
    match name {
        "gelu_pytorch_tanh" => Ok(Act::GeluTanh),
        other => Err(refuse(cfg, &format!("hidden_activation {other:?}"))),
    }
}

/// Whether each layer is a sliding-window layer: `layer_types`, else every
/// layer but each `pattern`-th (transformers' default).
pub(super) fn sliding_layers(cfg: &ModelConfig, pattern: i64) -> Result<Vec<bool>, EngineError> {
    let Some(types) = field(cfg, "layer_types").and_then(Value::as_array) else {
        return Ok((0..cfg.num_layers)
            .map(|i| (i + 1) % pattern != 0)
            .collect());
    };
    if types.len() as i64 != cfg.num_layers {
        return Err(refuse(
            cfg,
            &format!("{} layer_types for {} layers", types.len(), cfg.num_layers),
        ));
    }
    types
        .iter()
        .map(|t| match t.as_str() {
            Some("sliding_attention") => Ok(true),
            Some("full_attention") => Ok(false),
            _ => Err(refuse(cfg, &format!("layer type {t}"))),
        })
        .collect()
}

/// A rope setting of transformers 5's per-layer-type `rope_parameters`.
fn rope_of(
    cfg: &ModelConfig,
    v: &Value,
    default_theta: f64,
) -> Result<(f64, RopeScaling), EngineError> {
    let theta = v
        .get("rope_theta")
        .and_then(Value::as_f64)
        .unwrap_or(default_theta);
    match v
        .get("rope_type")
        .and_then(Value::as_str)
        .unwrap_or("default")
    {
        "default" => Ok((theta, RopeScaling::None)),
        "linear" => match v.get("factor").and_then(Value::as_f64) {
            Some(factor) => Ok((theta, RopeScaling::Linear { factor })),
            None => Err(refuse(cfg, "linear rope scaling without a factor")),
        },
        other => Err(refuse(cfg, &format!("rope type {other:?}"))),
    }
}

impl Gemma3Config {
    fn read(cfg: &ModelConfig) -> Result<Self, EngineError> {
        require_full_rotary(cfg)?;
        for f in ["attention_bias", "use_bidirectional_attention"] {
            if flag(cfg, f) {
                return Err(refuse(cfg, f));
            }
        }
        // transformers' Gemma 3 does not apply it; refused rather than
        // guessed.
        if field(cfg, "attn_logit_softcapping").is_some() {
            return Err(refuse(cfg, "attn_logit_softcapping"));
        }
        let num = |k: &str, default: f64| field(cfg, k).and_then(Value::as_f64).unwrap_or(default);
        let nested = field(cfg, "rope_parameters").filter(|r| r.get("full_attention").is_some());
        let (global_rope, local_rope) = match nested {
            Some(r) => (
                rope_of(cfg, &r["full_attention"], 1_000_000.0)?,
                match r.get("sliding_attention") {
                    Some(l) => rope_of(cfg, l, 10_000.0)?,
                    None => (10_000.0, RopeScaling::None),
                },
            ),
            None => (
                (num("rope_theta", 1_000_000.0), cfg.rope_scaling.clone()),
                (num("rope_local_base_freq", 10_000.0), RopeScaling::None),
            ),
        };
        let pattern = field(cfg, "sliding_window_pattern")
            .and_then(Value::as_i64)
            .unwrap_or(6)
            .max(1);
        Ok(Self {
            query_pre_attn_scalar: num("query_pre_attn_scalar", 256.0),
            sliding: sliding_layers(cfg, pattern)?,
            sliding_window: field(cfg, "sliding_window")
                .and_then(Value::as_i64)
                .unwrap_or(4096),
            global_rope,
            local_rope,
            final_softcap: field(cfg, "final_logit_softcapping").and_then(Value::as_f64),
        })
    }
}

/// Self-attention: q, k and v stacked into one GEMM, the per-head q and k
/// norms, rope (the layer's kind's), paged attention with the
/// `query_pre_attn_scalar` scale and the layer's window, the output
/// projection.
struct Attention {
    qkv: Linear,
    q_norm: GemmaRmsNorm,
    k_norm: GemmaRmsNorm,
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
        scale: f64,
        be: &Backend,
    ) -> Result<Self, EngineError> {
        let [q, k, v] = ["q_proj", "k_proj", "v_proj"].map(|p| format!("{a}{p}.weight"));
        let eps = cfg.rms_norm_eps;
        Ok(Self {
            qkv: Linear::new(w.take_cat_linear(&[&q, &k, &v])?, None, be)?,
            q_norm: GemmaRmsNorm::new(w.take(&format!("{a}q_norm.weight"))?, eps)?,
            k_norm: GemmaRmsNorm::new(w.take(&format!("{a}k_norm.weight"))?, eps)?,
            o: Linear::new(w.take_linear(&format!("{a}o_proj.weight"))?, None, be)?,
            p: AttnParams {
                heads: cfg.num_heads,
                kv_heads: cfg.num_kv_heads,
                head_dim: cfg.head_dim,
                window,
            },
            logits: AttnLogits {
                scale: Some(scale),
                softcap: None,
            },
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
        // On the CPU: the head norms in one pass, then rope and the KV
        // write in another (`paged_attention_qkv`).
        let ((qw, eps), (kw, _)) = (self.q_norm.parts(), self.k_norm.parts());
        if let Some(normed) = crate::fused::head_norms(&qkv, qw, kw, nh, nkv, hd, eps)? {
            let out = paged_attention_qkv_with(s, &normed, rope, &self.p, &self.logits)?;
            return self.o.forward(&out, s.be);
        }
        let q = qkv.f_narrow(1, 0, nh * hd)?.f_view([n, nh, hd])?;
        let k = qkv.f_narrow(1, nh * hd, nkv * hd)?.f_view([n, nkv, hd])?;
        let v = qkv
            .f_narrow(1, (nh + nkv) * hd, nkv * hd)?
            .f_view([n, nkv, hd])?;
        let (q, k) = (self.q_norm.forward(&q)?, self.k_norm.forward(&k)?);
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
    sliding: bool,
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
        let delta = self.post_attention_layernorm.forward(&h)?;
        let (x, h) = self.pre_feedforward_layernorm.add_forward(x, &delta)?;
        let h = self.mlp.forward(&h, s.be)?;
        Ok(x.f_add(&self.post_feedforward_layernorm.forward(&h)?)?)
    }

    fn row_parts(&self) -> GemmaRowParts<'_> {
        let a = &self.self_attn;
        GemmaRowParts {
            input_norm: &self.input_layernorm,
            qkv: &a.qkv,
            q_norm: &a.q_norm,
            k_norm: &a.k_norm,
            o: &a.o,
            p: &a.p,
            logits: &a.logits,
            post_attn_norm: &self.post_attention_layernorm,
            pre_ff_norm: &self.pre_feedforward_layernorm,
            mlp: &self.mlp,
            post_ff_norm: &self.post_feedforward_layernorm,
        }
    }
}

struct Gemma3 {
    cfg: ModelConfig,
    be: Backend,
    embed_tokens: Embedding,
    /// `sqrt(hidden_size)` as a scalar of the model's dtype.
    embed_scale: Tensor,
    layers: Vec<DecoderLayer>,
    norm: GemmaRmsNorm,
    lm_head: Linear,
    global_rope: Rope,
    local_rope: Rope,
    final_softcap: Option<f64>,
    /// The row path's buffers (`layers::rows`).
    rows: std::sync::Mutex<RowScratch>,
}

pub(super) fn load(
    cfg: ModelConfig,
    w: &mut Weights,
    be: Backend,
) -> Result<Box<dyn Model>, EngineError> {
    let gc = Gemma3Config::read(&cfg)?;
    let act = gelu_tanh(&cfg)?;
    let eps = cfg.rms_norm_eps;
    let scale = gc.query_pre_attn_scalar.powf(-0.5);
    let mut layers = Vec::with_capacity(cfg.num_layers as usize);
    for (i, &sliding) in gc.sliding.iter().enumerate() {
        let p = format!("model.layers.{i}.");
        let norm =
            |w: &mut Weights, n: &str| GemmaRmsNorm::new(w.take(&format!("{p}{n}.weight"))?, eps);
        let window = sliding.then_some(gc.sliding_window);
        layers.push(DecoderLayer {
            input_layernorm: norm(w, "input_layernorm")?,
            self_attn: Attention::load(w, &format!("{p}self_attn."), &cfg, window, scale, &be)?,
            post_attention_layernorm: norm(w, "post_attention_layernorm")?,
            pre_feedforward_layernorm: norm(w, "pre_feedforward_layernorm")?,
            mlp: GatedMlp::load(w, &format!("{p}mlp."), cfg.intermediate_size, act, &be)?,
            post_feedforward_layernorm: norm(w, "post_feedforward_layernorm")?,
            sliding,
        });
    }
    let embed_tokens = Embedding::load(w, &be)?;
    let embed_scale = embed_scale(cfg.hidden_size, &be)?;
    let norm = GemmaRmsNorm::new(w.take("model.norm.weight")?, eps)?;
    let lm_head = lm_head(w, cfg.tie_word_embeddings, &embed_tokens, &be)?;
    let rope = |(theta, scaling): &(f64, RopeScaling)| {
        Rope::new(
            *theta,
            scaling,
            cfg.head_dim,
            cfg.max_position_embeddings,
            be.device,
        )
    };
    let (global_rope, local_rope) = (rope(&gc.global_rope)?, rope(&gc.local_rope)?);
    Ok(Box::new(Gemma3 {
        embed_tokens,
        embed_scale,
        layers,
        norm,
        lm_head,
        global_rope,
        local_rope,
        final_softcap: gc.final_softcap,
        rows: Default::default(),
        cfg,
        be,
    }))
}

/// transformers' embedding scale: `sqrt(hidden)` as a float32 scalar, cast
/// to the model's dtype (so rounded to bf16 on the GPU, as there).
pub(super) fn embed_scale(hidden: i64, be: &Backend) -> Result<Tensor, EngineError> {
    Ok(Tensor::from((hidden as f64).sqrt() as f32)
        .f_to_kind(be.kind)?
        .f_to_device(be.device)?)
}

/// Final logit soft-capping `cap * tanh(logits / cap)`, in float32.
pub(super) fn soft_cap(logits: Tensor, cap: Option<f64>) -> Result<Tensor, EngineError> {
    let logits = logits.f_to_kind(Kind::Float)?;
    match cap {
        Some(c) => Ok(logits.f_div_scalar(c)?.f_tanh()?.f_mul_scalar(c)?),
        None => Ok(logits),
    }
}

impl Model for Gemma3 {
    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn backend(&self) -> &Backend {
        &self.be
    }

    fn forward_batch(&self, batch: &StepBatch, pool: &mut KvPool) -> Result<Tensor, EngineError> {
        let global = self.global_rope.at(&batch.pos)?;
        let local = self.local_rope.at(&batch.pos)?;
        if let Some(h) = self.forward_rows(batch, pool, &global, &local)? {
            return Ok(h);
        }
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
            x = l.forward(&x, if l.sliding { &local } else { &global }, &mut s)?;
        }
        self.norm.forward(&x)
    }

    fn logits(&self, hidden: &Tensor) -> Result<Tensor, EngineError> {
        soft_cap(self.lm_head.forward(hidden, &self.be)?, self.final_softcap)
    }
}

impl Gemma3 {
    /// A step of decodes through the row path (`layers::rows`): None where
    /// the step or the backend needs the tensor path.
    fn forward_rows(
        &self,
        batch: &StepBatch,
        pool: &mut KvPool,
        global: &RopeAt,
        local: &RopeAt,
    ) -> Result<Option<Tensor>, EngineError> {
        let hd = self.cfg.head_dim;
        if !rows::step_fits(batch, &self.be)
            || !global.rotates_all(hd)
            || !local.rotates_all(hd)
            || !self.layers.iter().all(|l| l.row_parts().usable())
        {
            return Ok(None);
        }
        let new_slots = rows::new_slots(batch);
        let tables = |r: &RopeAt| r.tables(Kind::Float);
        let ((gc, gs), (lc, ls)) = (tables(global)?, tables(local)?);
        let global_step = RowStep::new(&gc, &gs, &new_slots)?;
        let local_step = RowStep::new(&lc, &ls, &new_slots)?;
        let x = self
            .embed_tokens
            .forward(&batch.ids)?
            .f_mul(&self.embed_scale)?;
        let (be, layers) = (&self.be, self.layers.len());
        let h = rows::run(
            &self.rows,
            &x,
            batch,
            pool,
            be,
            layers,
            self.norm.parts(),
            |i, s, sc| {
                let l = &self.layers[i];
                let step = if l.sliding { &local_step } else { &global_step };
                rows::gemma_layer(&l.row_parts(), step, s, sc)
            },
        )?;
        Ok(Some(h))
    }
}
