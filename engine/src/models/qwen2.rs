//! Qwen2 and Qwen2.5 (`Qwen2ForCausalLM`), as transformers'
//! `modeling_qwen2.py`: Llama's decoder with biases on the q, k and v
//! projections (none on the output projection). Qwen2's optional sliding
//! window on upper layers (`use_sliding_window`) is refused at load.

use tch::Tensor;

use super::stack::{Decoder, Layer};
use super::{Model, flag, refuse, require_full_rotary, require_layer_types};
use crate::EngineError;
use crate::config::ModelConfig;
use crate::layers::Backend;
use crate::layers::attention::{AttnParams, LayerStep, paged_attention};
use crate::layers::embedding::Embedding;
use crate::layers::linear::{Linear, lm_head};
use crate::layers::mlp::{Act, GatedMlp};
use crate::layers::norm::RmsNorm;
use crate::layers::rope::{Rope, RopeAt};
use crate::layers::rows::RowParts;
use crate::layers::weights::Weights;

/// What this family reads beyond the shared config.
struct Qwen2Config {
    act: Act,
}

impl Qwen2Config {
    fn read(cfg: &ModelConfig) -> Result<Self, EngineError> {
        require_full_rotary(cfg)?;
        require_layer_types(cfg, &["full_attention"])?;
        if flag(cfg, "use_sliding_window") {
            return Err(refuse(cfg, "use_sliding_window"));
        }
        Ok(Self {
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
        be: &Backend,
    ) -> Result<Self, EngineError> {
        let names = |part: &str| ["q_proj", "k_proj", "v_proj"].map(|p| format!("{a}{p}.{part}"));
        let [q, k, v] = names("weight");
        let qkv = w.take_cat(&[&q, &k, &v])?;
        let [qb, kb, vb] = names("bias");
        let bias = w.take_cat(&[&qb, &kb, &vb])?;
        Ok(Self {
            qkv: Linear::new(qkv, Some(bias), be)?,
            o: Linear::new(w.take(&format!("{a}o_proj.weight"))?, None, be)?,
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

    /// The Llama shape with q/k/v biases: the residual add then the norm
    /// is the fused add-and-norm's arithmetic (one float32 addition per
    /// element, then the same norm), and rotating q and k with libtorch
    /// gives the fused rotary pass's bits.
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
    let qc = Qwen2Config::read(&cfg)?;
    let eps = cfg.rms_norm_eps;
    let mut layers = Vec::with_capacity(cfg.num_layers as usize);
    for i in 0..cfg.num_layers {
        let p = format!("model.layers.{i}.");
        layers.push(DecoderLayer {
            input_layernorm: RmsNorm::new(w.take(&format!("{p}input_layernorm.weight"))?, eps),
            self_attn: Attention::load(w, &format!("{p}self_attn."), &cfg, &be)?,
            post_attention_layernorm: RmsNorm::new(
                w.take(&format!("{p}post_attention_layernorm.weight"))?,
                eps,
            ),
            mlp: GatedMlp::load(w, &format!("{p}mlp."), cfg.intermediate_size, qc.act, &be)?,
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
