//! Phi-3 / Phi-3.5 / Phi-4-mini (`Phi3ForCausalLM`), as transformers'
//! `modeling_phi3.py`: Llama's decoder with one fused `qkv_proj` and one
//! fused `gate_up_proj` (gate rows first), no biases, rotary embeddings on
//! the first `partial_rotary_factor` of each head, optionally `longrope`
//! scaling (short and long factors, chosen per sequence and step: see
//! `layers/rope.rs`), and an optional `sliding_window`.

use tch::Tensor;

use super::stack::{Decoder, Layer};
use super::{Model, field, require_layer_types};
use crate::EngineError;
use crate::config::ModelConfig;
use crate::layers::Backend;
use crate::layers::attention::{AttnParams, LayerStep, paged_attention};
use crate::layers::embedding::Embedding;
use crate::layers::linear::{Linear, lm_head};
use crate::layers::mlp::{Act, GatedMlp};
use crate::layers::norm::RmsNorm;
use crate::layers::rope::{Rope, RopeAt};
use crate::layers::weights::Weights;

/// What this family reads beyond the shared config.
struct Phi3Config {
    sliding_window: Option<i64>,
    /// Rotated dimensions of each head: `head_dim * partial_rotary_factor`.
    rot_dim: i64,
    act: Act,
}

impl Phi3Config {
    fn read(cfg: &ModelConfig) -> Result<Self, EngineError> {
        require_layer_types(cfg, &["full_attention"])?;
        let sliding_window = match field(cfg, "sliding_window") {
            None => None,
            Some(v) => match v.as_i64() {
                Some(w) if w > 0 => Some(w),
                _ => return Err(super::refuse(cfg, &format!("sliding_window {v}"))),
            },
        };
        Ok(Self {
            sliding_window,
            // transformers: int(head_dim * partial_rotary_factor)
            rot_dim: (cfg.head_dim as f64 * cfg.partial_rotary_factor) as i64,
            act: Act::parse(&cfg.hidden_act)?,
        })
    }
}

/// Self-attention: the fused q/k/v projection, rope on (the rotary part
/// of) q and k, paged attention, the output projection.
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
        lc: &Phi3Config,
        be: &Backend,
    ) -> Result<Self, EngineError> {
        Ok(Self {
            qkv: Linear::new(w.take(&format!("{a}qkv_proj.weight"))?, None, be)?,
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
        let n = s.batch.n;
        let qkv = self.qkv.forward(x, s.be)?;
        let q = qkv.f_narrow(1, 0, nh * hd)?.f_view([n, nh, hd])?;
        let k = qkv.f_narrow(1, nh * hd, nkv * hd)?.f_view([n, nkv, hd])?;
        let v = qkv
            .f_narrow(1, (nh + nkv) * hd, nkv * hd)?
            .f_view([n, nkv, hd])?;
        let (q, k) = (rope.apply(&q)?, rope.apply(&k)?);
        let out = paged_attention(s, &q, &k, &v, &self.p)?;
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
        let x = x.f_add(&self.self_attn.forward(&h, rope, s)?)?;
        let h = self.post_attention_layernorm.forward(&x)?;
        Ok(x.f_add(&self.mlp.forward(&h, s.be)?)?)
    }
}

pub(super) fn load(
    cfg: ModelConfig,
    w: &mut Weights,
    be: Backend,
) -> Result<Box<dyn Model>, EngineError> {
    let lc = Phi3Config::read(&cfg)?;
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
            mlp: GatedMlp::fused(
                w.take(&format!("{p}mlp.gate_up_proj.weight"))?,
                w.take(&format!("{p}mlp.down_proj.weight"))?,
                lc.act,
                &be,
            )?,
        });
    }
    let embed_tokens = Embedding::load(w, &be)?;
    let norm = RmsNorm::new(w.take("model.norm.weight")?, eps);
    let lm_head = lm_head(w, cfg.tie_word_embeddings, &embed_tokens, &be)?;
    let rope = Rope::with_longrope(
        cfg.rope_theta,
        &cfg.rope_scaling,
        lc.rot_dim,
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
