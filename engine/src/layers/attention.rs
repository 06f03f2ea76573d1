//! The one paged-attention entry point every family calls, once per layer:
//! it stores the step's new keys and values in the pool and attends each
//! sequence's queries over its own cached positions.
//!
//! Paths, chosen per step: on CUDA, a step whose sequences all decode one
//! token takes gyre's split-key decode kernel (`crate::fused`, reading the
//! pool in place), any other step flash attention over all packed
//! sequences (their keys gathered first); `attn`'s kernel for CPU decodes
//! (reading the pool in place); SDPA per sequence over its gathered slots
//! for everything else. A sequence's
//! result never depends on what it is batched with.
//!
//! Parameters: a sliding window (query at position p sees keys in
//! `p - window < k <= p`, as transformers' sliding-window mask), and how
//! the attention logits are formed ([`AttnLogits`]: a scale other than
//! `1/sqrt(head_dim)`, Gemma's `query_pre_attn_scalar`; logit soft-capping
//! `c * tanh(x / c)`, Gemma 2). Windowed layers and layers with a
//! non-default scale or a soft cap take the SDPA path on CUDA (the flash
//! binding has neither argument). The CPU decode kernel implements both;
//! SDPA takes the scale, and soft-capped prefills run the same arithmetic
//! as transformers' eager attention (SDPA has no soft cap).

use tch::{Kind, Tensor};

use super::Backend;
use super::batch::StepBatch;
use super::rope::RopeAt;
use crate::EngineError;
use crate::attn;
use crate::kv::KvPool;

/// The shape and masking of one layer's attention.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AttnParams {
    pub heads: i64,
    pub kv_heads: i64,
    pub head_dim: i64,
    /// Sliding window in tokens (each query sees at most this many keys,
    /// itself included); None: full causal attention.
    pub window: Option<i64>,
}

/// How one layer's attention logits are formed from `q . k`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct AttnLogits {
    /// The factor on `q . k`; None: `1 / sqrt(head_dim)`.
    pub scale: Option<f64>,
    /// Soft cap c: logits become `c * tanh(x / c)` before the mask.
    pub softcap: Option<f64>,
}

impl AttnLogits {
    fn is_default(&self) -> bool {
        self.scale.is_none() && self.softcap.is_none()
    }

    /// The CPU decode kernel's shapes and logits for `p`: the scale given,
    /// else `head_dim^-0.5`.
    pub(crate) fn decode_heads(&self, p: &AttnParams) -> attn::Heads {
        attn::Heads {
            heads: p.heads as usize,
            kv_heads: p.kv_heads as usize,
            head_dim: p.head_dim as usize,
            scale: self
                .scale
                .map_or(1.0 / (p.head_dim as f32).sqrt(), |s| s as f32),
            softcap: self.softcap.map(|c| c as f32),
        }
    }
}

/// The first position a query at `start` sees: 0, or the start of its
/// window.
fn first_visible(p: &AttnParams, start: i64) -> usize {
    p.window.map_or(0, |w| (start - w + 1).max(0) as usize)
}

/// The step's decodes (one new token) for the CPU decode kernel, each
/// with the pool slots its window sees.
pub(crate) fn decode_seqs<'a>(b: &'a StepBatch, p: &AttnParams) -> Vec<attn::DecodeSeq<'a>> {
    b.seqs
        .iter()
        .filter(|s| s.len == 1)
        .map(|s| attn::DecodeSeq {
            row: s.row,
            slots: &s.slots[first_visible(p, s.start)..],
        })
        .collect()
}

/// What one layer's forward needs besides its input: the step, the
/// backend, the pool and the layer's index.
pub(crate) struct LayerStep<'a> {
    pub batch: &'a StepBatch,
    pub be: &'a Backend,
    pub pool: &'a mut KvPool,
    pub layer: usize,
}

/// Stores `k`, `v` [n, kv_heads, head_dim] of the step's new tokens in
/// this layer of the pool, then returns the attention of `q` [n, heads,
/// head_dim] as [n, heads * head_dim].
pub(crate) fn paged_attention(
    s: &mut LayerStep<'_>,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    p: &AttnParams,
) -> Result<Tensor, EngineError> {
    paged_attention_with(s, q, k, v, p, &AttnLogits::default())
}

/// [`paged_attention`] with logits formed as `lg` says (scale, soft cap).
pub(crate) fn paged_attention_with(
    s: &mut LayerStep<'_>,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    p: &AttnParams,
    lg: &AttnLogits,
) -> Result<Tensor, EngineError> {
    s.pool.write(s.layer, &s.batch.new_slots, k, v)?;
    attend_stored(s, q, p, lg)
}

/// Rotary embedding of `qkv`'s query and key heads, the keys and values
/// stored in the pool, then [`paged_attention`]: the first two in one fused
/// kernel on CUDA in bf16 when the step takes flash attention, or in one
/// pass of Rust on the CPU in float32 (`crate::fused::cpu`), else `rope`'s
/// ops and the pool's copies. `qkv` [n, (heads
/// + 2 kv_heads) * head_dim].
pub(crate) fn paged_attention_qkv(
    s: &mut LayerStep<'_>,
    qkv: &Tensor,
    rope: &RopeAt,
    p: &AttnParams,
) -> Result<Tensor, EngineError> {
    paged_attention_qkv_with(s, qkv, rope, p, &AttnLogits::default())
}

/// [`paged_attention_qkv`] with logits formed as `lg` says (scale, soft
/// cap).
pub(crate) fn paged_attention_qkv_with(
    s: &mut LayerStep<'_>,
    qkv: &Tensor,
    rope: &RopeAt,
    p: &AttnParams,
    lg: &AttnLogits,
) -> Result<Tensor, EngineError> {
    // On CUDA only steps that take flash attention (a decode graph's kind).
    let flash_step = s.batch.flash.is_some() && p.window.is_none() && s.be.flash_attention();
    if rope.rotates_all(p.head_dim) && (flash_step || !qkv.device().is_cuda()) {
        let (cos, signed_sin) = rope.tables(qkv.kind())?;
        let (kc, vc) = s.pool.layer(s.layer);
        if let Some(q) = crate::fused::rope_kv(
            qkv,
            &cos,
            &signed_sin,
            &s.batch.new_slots,
            kc,
            vc,
            p.heads,
            p.kv_heads,
            p.head_dim,
        )? {
            return attend_stored(s, &q, p, lg);
        }
    }
    let (q, k, v) = rope.apply_qkv(qkv, p.heads, p.kv_heads, p.head_dim)?;
    paged_attention_with(s, &q, &k, &v, p, lg)
}

/// The attention of `q` over the pool, the step's own keys and values
/// already stored there.
fn attend_stored(
    s: &mut LayerStep<'_>,
    q: &Tensor,
    p: &AttnParams,
    lg: &AttnLogits,
) -> Result<Tensor, EngineError> {
    let (b, be, li) = (s.batch, s.be, s.layer);
    let pool = &mut *s.pool;
    let (n, width) = (b.n, p.heads * p.head_dim);
    if let (Some((varlen, gather)), None, true) = (&b.flash, p.window, lg.is_default())
        && be.flash_attention()
    {
        let (kc, vc) = pool.layer(li);
        // Every sequence decodes one token: gyre's kernel reads the pool
        // in place, split over the keys (crate::fused), when it takes them.
        if varlen.max_q() == 1
            && let Some(out) = crate::fused::decode_attention(
                &q.f_contiguous()?,
                kc,
                vc,
                gather,
                varlen.cu_k(),
                varlen.seqused_k(),
                varlen.max_k(),
            )?
        {
            return Ok(out.f_view([n, width])?);
        }
        let (keys, vals) = (kc.f_index_select(0, gather)?, vc.f_index_select(0, gather)?);
        match varlen.attend(q, &keys, &vals) {
            Ok(out) => return Ok(out.f_view([n, width])?),
            // Failing inside a capture says nothing about flash attention.
            Err(e) if b.graphed => return Err(e),
            Err(e) => {
                // E.g. a GPU flash attention does not support: SDPA per
                // sequence from now on.
                tracing::warn!(error = %e, "flash attention unavailable; using SDPA per sequence");
                be.set_flash_attention(false);
            }
        }
    }
    if b.graphed {
        return Err(EngineError::Step(
            "a decode graph needs flash attention on every layer (no window, default logits)"
                .into(),
        ));
    }
    // The first position a sequence's first new query sees.
    let first_visible = |start: i64| first_visible(p, start);
    let decodes = if b.cpu_decode {
        decode_seqs(b, p)
    } else {
        Vec::new()
    };
    let decoded = if decodes.is_empty() {
        None
    } else {
        let qc = q.f_contiguous()?;
        let (kc, vc) = pool.layer(li);
        let d = attn::decode_pool(
            attn::f32_view(&qc)?,
            kc,
            vc,
            &decodes,
            lg.decode_heads(p),
            Some(&be.pool),
        )?;
        // Only decodes (the common step): the kernel's output is it.
        if decodes.len() == b.seqs.len() {
            return Ok(d.f_view([n, width])?);
        }
        Some(d)
    };
    let mut outs = Vec::with_capacity(b.seqs.len());
    let mut di = 0i64;
    for s in &b.seqs {
        let len = s.len as i64;
        match &decoded {
            Some(d) if s.len == 1 => {
                outs.push(d.f_narrow(0, di, 1)?);
                di += 1;
            }
            _ => {
                let qs = q.f_narrow(0, s.row as i64, len)?;
                let lo = first_visible(s.start);
                outs.push(sdpa(
                    pool,
                    li,
                    &qs,
                    &s.slots[lo..],
                    lo as i64,
                    s.start,
                    p,
                    lg,
                )?);
            }
        }
    }
    Ok(Tensor::f_cat(&outs, 0)?.f_view([n, width])?)
}

/// SDPA of one sequence's queries `q` [len, heads, head_dim] (at positions
/// `start..start + len`) over the keys and values at `slots`, which hold
/// positions `lo..start + len`. Returns [len, heads, head_dim].
#[allow(clippy::too_many_arguments)]
fn sdpa(
    pool: &KvPool,
    li: usize,
    q: &Tensor,
    slots: &[i64],
    lo: i64,
    start: i64,
    p: &AttnParams,
    lg: &AttnLogits,
) -> Result<Tensor, EngineError> {
    let len = q.size()[0];
    let end = start + len;
    let dev = q.device();
    let slots = Tensor::from_slice(slots).f_to_device(dev)?;
    let (kc, vc) = pool.layer(li);
    let q = q.f_transpose(0, 1)?.f_unsqueeze(0)?;
    // A pool of another dtype than the model's (a float16 cache) is
    // widened here, after the gather.
    let keys = kc
        .f_index_select(0, &slots)?
        .f_to_kind(q.kind())?
        .f_transpose(0, 1)?
        .f_unsqueeze(0)?;
    let vals = vc
        .f_index_select(0, &slots)?
        .f_to_kind(q.kind())?
        .f_transpose(0, 1)?
        .f_unsqueeze(0)?;
    let within = p.window.is_none_or(|w| len <= w);
    let out = if let Some(cap) = lg.softcap {
        let mask = visible(start, end, lo, p.window, dev)?;
        let scale = lg.scale.unwrap_or(1.0 / (p.head_dim as f64).sqrt());
        eager(&q, &keys, &vals, &mask, scale, cap, p.heads / p.kv_heads)?
    } else if len == 1 || (start == 0 && within) {
        // One query sees every gathered key; a fresh prompt inside the
        // window is plainly causal.
        Tensor::f_scaled_dot_product_attention::<Tensor>(
            &q,
            &keys,
            &vals,
            None,
            0.0,
            len > 1,
            lg.scale,
            true,
        )?
    } else {
        let mask = visible(start, end, lo, p.window, dev)?;
        Tensor::f_scaled_dot_product_attention(
            &q,
            &keys,
            &vals,
            Some(&mask),
            0.0,
            false,
            lg.scale,
            true,
        )?
    };
    Ok(out.f_squeeze_dim(0)?.f_transpose(0, 1)?)
}

/// Which keys (positions `lo..end`) each query (positions `start..end`)
/// sees: [queries, keys] booleans, query i seeing keys j with
/// `i - window < j <= i`.
fn visible(
    start: i64,
    end: i64,
    lo: i64,
    window: Option<i64>,
    dev: tch::Device,
) -> Result<Tensor, EngineError> {
    let qi = Tensor::f_arange_start(start, end, (Kind::Int64, dev))?.f_unsqueeze(1)?;
    let kj = Tensor::f_arange_start(lo, end, (Kind::Int64, dev))?.f_unsqueeze(0)?;
    let mut mask = kj.f_le_tensor(&qi)?;
    if let Some(w) = window {
        mask = mask.f_logical_and(&kj.f_gt_tensor(&qi.f_sub_scalar(w)?)?)?;
    }
    Ok(mask)
}

/// Attention with soft-capped logits, as transformers' eager attention:
/// `q k^T * scale`, `cap * tanh(x / cap)`, masked, softmax in float32, times
/// the values. `q` [1, heads, len, hd]; `keys`, `vals` [1, kv_heads, t, hd]
/// (each kv head serving `group` query heads); `mask` [len, t].
fn eager(
    q: &Tensor,
    keys: &Tensor,
    vals: &Tensor,
    mask: &Tensor,
    scale: f64,
    cap: f64,
    group: i64,
) -> Result<Tensor, EngineError> {
    let keys = keys.f_repeat_interleave_self_int(group, 1, None)?;
    let vals = vals.f_repeat_interleave_self_int(group, 1, None)?;
    let w = q
        .f_matmul(&keys.f_transpose(2, 3)?)?
        .f_mul_scalar(scale)?
        .f_div_scalar(cap)?
        .f_tanh()?
        .f_mul_scalar(cap)?;
    let w = w.f_masked_fill(&mask.f_logical_not()?, f64::NEG_INFINITY)?;
    let w = w.f_softmax(-1, Kind::Float)?.f_to_kind(q.kind())?;
    Ok(w.f_matmul(&vals)?)
}
