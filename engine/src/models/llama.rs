//! Llama (`LlamaForCausalLM`: Llama 2/3/3.1/3.2, SmolLM) and Mistral
//! (`MistralForCausalLM`), as transformers' `modeling_llama.py` and
//! `modeling_mistral.py`: RMSNorm, grouped-query attention with rotary
//! embeddings (optionally Llama 3.1 scaling), a SwiGLU MLP. Llama may have
//! biases on all attention projections (`attention_bias`); Mistral may
//! attend over a sliding window (`sliding_window`).

use tch::Tensor;

use super::stack::{Decoder, Layer};
use super::{Model, field, flag, refuse, require_full_rotary, require_layer_types};
use crate::EngineError;
use crate::config::ModelConfig;
use crate::layers::Backend;
use crate::layers::attention::{AttnParams, LayerStep, paged_attention_qkv};
use crate::layers::embedding::Embedding;
use crate::layers::linear::{Linear, lm_head};
use crate::layers::mlp::{Act, GatedMlp};
use crate::layers::norm::RmsNorm;
use crate::layers::rope::{Rope, RopeAt};
use crate::layers::rows::RowParts;
use crate::layers::weights::Weights;

/// What this family reads beyond the shared config.
struct LlamaConfig {
    attention_bias: bool,
    /// Mistral's `sliding_window` (Llama has none).
    sliding_window: Option<i64>,
    act: Act,
}

impl LlamaConfig {
    fn read(cfg: &ModelConfig) -> Result<Self, EngineError> {
        require_full_rotary(cfg)?;
        require_layer_types(cfg, &["full_attention"])?;
        if flag(cfg, "mlp_bias") {
            return Err(refuse(cfg, "mlp_bias"));
        }
        let sliding_window = match field(cfg, "sliding_window") {
            Some(v) if cfg.architecture == "MistralForCausalLM" => match v.as_i64() {
                Some(w) if w > 0 => Some(w),
                _ => return Err(refuse(cfg, &format!("sliding_window {v}"))),
            },
            _ => None,
        };
        Ok(Self {
            attention_bias: flag(cfg, "attention_bias"),
            sliding_window,
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
        lc: &LlamaConfig,
        be: &Backend,
    ) -> Result<Self, EngineError> {
        let names = |part: &str| ["q_proj", "k_proj", "v_proj"].map(|p| format!("{a}{p}.{part}"));
        let [q, k, v] = names("weight");
        let qkv = w.take_cat_linear(&[&q, &k, &v])?;
        let bias = if lc.attention_bias {
            let [q, k, v] = names("bias");
            Some(w.take_cat(&[&q, &k, &v])?)
        } else {
            None
        };
        Ok(Self {
            qkv: Linear::new(qkv, bias, be)?,
            o: Linear::new(
                w.take_linear(&format!("{a}o_proj.weight"))?,
                w.maybe(&format!("{a}o_proj.bias"), lc.attention_bias)?,
                be,
            )?,
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
        let qkv = self.qkv.forward(x, s.be)?;
        let out = paged_attention_qkv(s, &qkv, rope, &self.p)?;
        self.o.forward(&out, s.be)
    }
}

struct DecoderLayer {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    mlp: GatedMlp,
}

impl Layer for DecoderLayer {
    fn forward(
        &self,
        x: &Tensor,
        rope: &RopeAt,
        s: &mut LayerStep<'_>,
    ) -> Result<Tensor, EngineError> {
        let h = self.input_layernorm.forward(x)?;
        let a = self.self_attn.forward(&h, rope, s)?;
        let (x, h) = self.post_attention_layernorm.add_forward(x, &a)?;
        Ok(x.f_add(&self.mlp.forward(&h, s.be)?)?)
    }

    fn row_parts(&self) -> Option<RowParts<'_>> {
        let (gate_up, down) = self.mlp.silu_parts()?;
        Some(RowParts {
            input_norm: &self.input_layernorm,
            qkv: &self.self_attn.qkv,
            o: &self.self_attn.o,
            p: &self.self_attn.p,
            post_norm: &self.post_attention_layernorm,
            gate_up,
            down,
        })
    }
}

pub(super) fn load(
    cfg: ModelConfig,
    w: &mut Weights,
    be: Backend,
) -> Result<Box<dyn Model>, EngineError> {
    let lc = LlamaConfig::read(&cfg)?;
    let eps = cfg.rms_norm_eps;
    let mut layers = Vec::with_capacity(cfg.num_layers as usize);
    for i in 0..cfg.num_layers {
        let p = format!("model.layers.{i}.");
        layers.push(DecoderLayer {
            input_layernorm: RmsNorm::new(w.take(&format!("{p}input_layernorm.weight"))?, eps),
            self_attn: Attention::load(w, &format!("{p}self_attn."), &cfg, &lc, &be)?,
            post_attention_layernorm: RmsNorm::new(
                w.take(&format!("{p}post_attention_layernorm.weight"))?,
                eps,
            ),
            mlp: GatedMlp::load(w, &format!("{p}mlp."), cfg.intermediate_size, lc.act, &be)?,
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
