//! BERT (`BertModel`) as a sentence encoder, computed as transformers'
//! modeling_bert computes it: word + absolute position + token-type
//! embeddings and a LayerNorm, then post-norm encoder layers (self-attention
//! over the whole input with padding masked out, output projection, residual
//! and LayerNorm; intermediate projection, exact erf GELU, output projection,
//! residual and LayerNorm). The pooler head is not used (sentence-embedding
//! models pool the token states themselves).
//!
//! A step's inputs are packed without padding for every projection and norm
//! (`[tokens, hidden]`); only attention sees them padded to the step's
//! longest input, with a key mask.

use tch::{Device, Kind, Tensor};

use super::config::{EncoderConfig, Pooling};
use crate::EngineError;
use crate::layers::Backend;
use crate::layers::linear::Linear;
use crate::layers::weights::Weights;

/// LayerNorm over the last dimension.
struct LayerNorm {
    w: Tensor,
    b: Tensor,
    eps: f64,
}

impl LayerNorm {
    fn load(w: &mut Weights, prefix: &str, eps: f64) -> Result<Self, EngineError> {
        Ok(Self {
            w: w.take(&format!("{prefix}.weight"))?,
            b: w.take(&format!("{prefix}.bias"))?,
            eps,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor, EngineError> {
        let n = x.size().last().copied().unwrap_or(0);
        Ok(x.f_layer_norm([n], Some(&self.w), Some(&self.b), self.eps, false)?)
    }
}

struct Layer {
    /// query, key and value as one projection.
    qkv: Linear,
    attn_out: Linear,
    attn_norm: LayerNorm,
    up: Linear,
    down: Linear,
    out_norm: LayerNorm,
}

pub(crate) struct Bert {
    word: Tensor,
    position: Tensor,
    /// Token type 0's embedding: every input is a single segment.
    token_type: Tensor,
    embed_norm: LayerNorm,
    layers: Vec<Layer>,
    heads: i64,
    head_dim: i64,
    hidden: i64,
    be: Backend,
}

/// Where a step's inputs lie in the packed and the padded layout.
struct Layout {
    batch: i64,
    max_len: i64,
    /// Row of each packed token in the padded `[batch * max_len]` layout.
    padded_rows: Tensor,
    /// `[batch, 1, 1, max_len]`: true where a key is a real token.
    key_mask: Tensor,
    /// Whether the inputs all have the same length (no padding needed).
    uniform: bool,
}

fn linear(w: &mut Weights, prefix: &str, be: &Backend) -> Result<Linear, EngineError> {
    Linear::new(
        w.take(&format!("{prefix}.weight"))?,
        Some(w.take(&format!("{prefix}.bias"))?),
        be,
    )
}

impl Bert {
    pub fn load(cfg: &EncoderConfig, w: &mut Weights, be: Backend) -> Result<Self, EngineError> {
        let eps = cfg.layer_norm_eps;
        let type_rows = w.take("embeddings.token_type_embeddings.weight")?;
        let token_type = type_rows.f_get(0)?;
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for i in 0..cfg.num_layers {
            let p = format!("encoder.layer.{i}");
            let a = format!("{p}.attention.self");
            let qkv_w = w.take_cat(&[
                &format!("{a}.query.weight"),
                &format!("{a}.key.weight"),
                &format!("{a}.value.weight"),
            ])?;
            let qkv_b = w.take_cat(&[
                &format!("{a}.query.bias"),
                &format!("{a}.key.bias"),
                &format!("{a}.value.bias"),
            ])?;
            layers.push(Layer {
                qkv: Linear::new(qkv_w, Some(qkv_b), &be)?,
                attn_out: linear(w, &format!("{p}.attention.output.dense"), &be)?,
                attn_norm: LayerNorm::load(w, &format!("{p}.attention.output.LayerNorm"), eps)?,
                up: linear(w, &format!("{p}.intermediate.dense"), &be)?,
                down: linear(w, &format!("{p}.output.dense"), &be)?,
                out_norm: LayerNorm::load(w, &format!("{p}.output.LayerNorm"), eps)?,
            });
        }
        // The pooler head and the position-id buffer are not part of a
        // sentence encoder's computation.
        for unused in [
            "pooler.dense.weight",
            "pooler.dense.bias",
            "embeddings.position_ids",
        ] {
            if w.contains(unused) {
                w.discard(unused);
            }
        }
        if cfg.hidden_size % cfg.num_heads != 0 {
            return Err(EngineError::Unsupported(format!(
                "hidden_size {} not divisible by {} heads",
                cfg.hidden_size, cfg.num_heads
            )));
        }
        Ok(Self {
            word: w.take("embeddings.word_embeddings.weight")?,
            position: w.take("embeddings.position_embeddings.weight")?,
            token_type,
            embed_norm: LayerNorm::load(w, "embeddings.LayerNorm", eps)?,
            layers,
            heads: cfg.num_heads,
            head_dim: cfg.hidden_size / cfg.num_heads,
            hidden: cfg.hidden_size,
            be,
        })
    }

    fn device(&self) -> Device {
        self.be.device
    }

    fn layout(&self, lens: &[i64]) -> Result<Layout, EngineError> {
        let batch = lens.len() as i64;
        let max_len = lens.iter().copied().max().unwrap_or(0);
        let mut rows = Vec::with_capacity(lens.iter().sum::<i64>() as usize);
        let mut mask = Vec::with_capacity((batch * max_len) as usize);
        for (b, &len) in lens.iter().enumerate() {
            rows.extend((0..len).map(|i| b as i64 * max_len + i));
            mask.extend((0..max_len).map(|i| i < len));
        }
        let dev = self.device();
        Ok(Layout {
            batch,
            max_len,
            padded_rows: Tensor::from_slice(&rows).f_to_device(dev)?,
            key_mask: Tensor::from_slice(&mask)
                .f_view([batch, 1, 1, max_len])?
                .f_to_device(dev)?,
            uniform: lens.iter().all(|&l| l == max_len),
        })
    }

    /// Self-attention of packed `qkv` `[tokens, 3 * hidden]` -> `[tokens, hidden]`.
    fn attention(&self, qkv: &Tensor, lay: &Layout) -> Result<Tensor, EngineError> {
        let (b, l, h) = (lay.batch, lay.max_len, self.hidden);
        let padded = if lay.uniform {
            qkv.shallow_clone()
        } else {
            Tensor::f_zeros([b * l, 3 * h], (qkv.kind(), qkv.device()))?.f_index_copy(
                0,
                &lay.padded_rows,
                qkv,
            )?
        };
        let qkv = padded
            .f_view([b, l, 3, self.heads, self.head_dim])?
            .f_permute([2, 0, 3, 1, 4])?;
        let (q, k, v) = (qkv.f_get(0)?, qkv.f_get(1)?, qkv.f_get(2)?);
        let mask = (!lay.uniform).then_some(&lay.key_mask);
        let out =
            Tensor::f_scaled_dot_product_attention(&q, &k, &v, mask, 0.0, false, None, false)?
                .f_permute([0, 2, 1, 3])?
                .f_reshape([b * l, h])?;
        Ok(if lay.uniform {
            out
        } else {
            out.f_index_select(0, &lay.padded_rows)?
        })
    }

    /// Token states of the inputs, packed: `[sum of lengths, hidden]`.
    fn encode(&self, inputs: &[&[u32]], lay: &Layout) -> Result<Tensor, EngineError> {
        let dev = self.device();
        let ids: Vec<i64> = inputs
            .iter()
            .flat_map(|s| s.iter().map(|&t| t as i64))
            .collect();
        let pos: Vec<i64> = inputs.iter().flat_map(|s| 0..s.len() as i64).collect();
        let ids = Tensor::from_slice(&ids).f_to_device(dev)?;
        let pos = Tensor::from_slice(&pos).f_to_device(dev)?;
        let x = self
            .word
            .f_index_select(0, &ids)?
            .f_add(&self.position.f_index_select(0, &pos)?)?
            .f_add(&self.token_type)?;
        let mut x = self.embed_norm.forward(&x)?;
        for layer in &self.layers {
            let qkv = layer.qkv.forward(&x, &self.be)?;
            let a = layer
                .attn_out
                .forward(&self.attention(&qkv, lay)?, &self.be)?;
            x = layer.attn_norm.forward(&a.f_add(&x)?)?;
            let hmid = layer.up.forward(&x, &self.be)?.f_gelu("none")?;
            let o = layer.down.forward(&hmid, &self.be)?;
            x = layer.out_norm.forward(&o.f_add(&x)?)?;
        }
        Ok(x)
    }

    /// One pooled vector per input (`[inputs, hidden]`, float32 on the CPU).
    pub fn embed(&self, inputs: &[&[u32]], pooling: Pooling) -> Result<Tensor, EngineError> {
        let lens: Vec<i64> = inputs.iter().map(|s| s.len() as i64).collect();
        let lay = self.layout(&lens)?;
        let x = self.encode(inputs, &lay)?;
        let dev = self.device();
        let mut starts = Vec::with_capacity(lens.len());
        let mut acc = 0i64;
        for &l in &lens {
            starts.push(acc);
            acc += l;
        }
        let pooled = match pooling {
            Pooling::Cls => x.f_index_select(0, &Tensor::from_slice(&starts).f_to_device(dev)?)?,
            Pooling::LastToken => {
                let last: Vec<i64> = starts.iter().zip(&lens).map(|(s, l)| s + l - 1).collect();
                x.f_index_select(0, &Tensor::from_slice(&last).f_to_device(dev)?)?
            }
            Pooling::Mean => {
                let seg: Vec<i64> = lens
                    .iter()
                    .enumerate()
                    .flat_map(|(i, &l)| std::iter::repeat_n(i as i64, l as usize))
                    .collect();
                let seg = Tensor::from_slice(&seg).f_to_device(dev)?;
                let sums = Tensor::f_zeros([lay.batch, self.hidden], (x.kind(), dev))?
                    .f_index_add(0, &seg, &x)?;
                let counts = Tensor::from_slice(&lens)
                    .f_to_device(dev)?
                    .f_to_kind(x.kind())?
                    .f_unsqueeze(1)?;
                sums.f_div(&counts)?
            }
        };
        Ok(pooled.f_to_kind(Kind::Float)?.f_to_device(Device::Cpu)?)
    }
}
