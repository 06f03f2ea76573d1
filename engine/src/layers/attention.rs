//! The one paged-attention entry point every family calls, once per layer:
//! it stores the step's new keys and values in the pool and attends each
//! sequence's queries over its own cached positions.
//!
//! Paths, chosen per step: flash attention over all packed sequences on
//! CUDA; `attn`'s kernel for CPU decodes (reading the pool in place); SDPA
//! per sequence over its gathered slots for everything else. A sequence's
//! result never depends on what it is batched with.
//!
//! Parameters: a sliding window (query at position p sees keys in
//! `p - window < k <= p`, as transformers' sliding-window mask). Windowed
//! layers on CUDA take the SDPA path (the flash binding has no window
//! argument yet). Logit soft-capping and a non-default scale are not
//! parameters yet; a family that needs them must add them here, not
//! ignore them.

use tch::{Kind, Tensor};

use super::Backend;
use super::batch::StepBatch;
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
    let (b, be, li) = (s.batch, s.be, s.layer);
    let pool = &mut *s.pool;
    let (n, width) = (b.n, p.heads * p.head_dim);
    pool.write(li, &b.new_slots, k, v)?;
    if let (Some((varlen, gather)), None) = (&b.flash, p.window)
        && be.flash_attention()
    {
        let (kc, vc) = pool.layer(li);
        let (keys, vals) = (kc.f_index_select(0, gather)?, vc.f_index_select(0, gather)?);
        match varlen.attend(q, &keys, &vals) {
            Ok(out) => return Ok(out.f_view([n, width])?),
            Err(e) => {
                // E.g. a GPU flash attention does not support: SDPA per
                // sequence from now on.
                tracing::warn!(error = %e, "flash attention unavailable; using SDPA per sequence");
                be.set_flash_attention(false);
            }
        }
    }
    // The first position a sequence's first new query sees.
    let first_visible =
        |start: i64| -> usize { p.window.map_or(0, |w| (start - w + 1).max(0) as usize) };
    let decodes: Vec<attn::DecodeSeq<'_>> = if b.cpu_decode {
        b.seqs
            .iter()
            .filter(|s| s.len == 1)
            .map(|s| attn::DecodeSeq {
                row: s.row,
                slots: &s.slots[first_visible(s.start)..],
            })
            .collect()
    } else {
        Vec::new()
    };
    let decoded = if decodes.is_empty() {
        None
    } else {
        let qc = q.f_contiguous()?;
        let (kc, vc) = pool.layer(li);
        let heads = attn::Heads {
            heads: p.heads as usize,
            kv_heads: p.kv_heads as usize,
            head_dim: p.head_dim as usize,
        };
        let threads = tch::get_num_threads().max(1) as usize;
        let out = attn::decode(
            attn::f32_view(&qc)?,
            attn::f32_view(kc)?,
            attn::f32_view(vc)?,
            &decodes,
            heads,
            threads,
        );
        let d = Tensor::from_slice(&out).f_view([decodes.len() as i64, p.heads, p.head_dim])?;
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
                outs.push(sdpa(pool, li, &qs, &s.slots[lo..], lo as i64, s.start, p)?);
            }
        }
    }
    Ok(Tensor::f_cat(&outs, 0)?.f_view([n, width])?)
}

/// SDPA of one sequence's queries `q` [len, heads, head_dim] (at positions
/// `start..start + len`) over the keys and values at `slots`, which hold
/// positions `lo..start + len`. Returns [len, heads, head_dim].
fn sdpa(
    pool: &KvPool,
    li: usize,
    q: &Tensor,
    slots: &[i64],
    lo: i64,
    start: i64,
    p: &AttnParams,
) -> Result<Tensor, EngineError> {
    let len = q.size()[0];
    let end = start + len;
    let dev = q.device();
    let slots = Tensor::from_slice(slots).f_to_device(dev)?;
    let (kc, vc) = pool.layer(li);
    let q = q.f_transpose(0, 1)?.f_unsqueeze(0)?;
    let keys = kc
        .f_index_select(0, &slots)?
        .f_transpose(0, 1)?
        .f_unsqueeze(0)?;
    let vals = vc
        .f_index_select(0, &slots)?
        .f_transpose(0, 1)?
        .f_unsqueeze(0)?;
    let within = p.window.is_none_or(|w| len <= w);
    let out = if len == 1 || (start == 0 && within) {
        // One query sees every gathered key; a fresh prompt inside the
        // window is plainly causal.
        Tensor::f_scaled_dot_product_attention::<Tensor>(
            &q,
            &keys,
            &vals,
            None,
            0.0,
            len > 1,
            None,
            true,
        )?
    } else {
        // Query at position i sees keys j with i - window < j <= i.
        let qi = Tensor::f_arange_start(start, end, (Kind::Int64, dev))?.f_unsqueeze(1)?;
        let kj = Tensor::f_arange_start(lo, end, (Kind::Int64, dev))?.f_unsqueeze(0)?;
        let mut mask = kj.f_le_tensor(&qi)?;
        if let Some(w) = p.window {
            mask = mask.f_logical_and(&kj.f_gt_tensor(&qi.f_sub_scalar(w)?)?)?;
        }
        Tensor::f_scaled_dot_product_attention(
            &q,
            &keys,
            &vals,
            Some(&mask),
            0.0,
            false,
            None,
            true,
        )?
    };
    Ok(out.f_squeeze_dim(0)?.f_transpose(0, 1)?)
}
