//! The row path: a CPU float32 decode step of a Llama-shaped layer (RMSNorm,
//! fused q/k/v, rotary embeddings, paged attention, output projection,
//! RMSNorm, SwiGLU) run over buffers the model keeps from step to step,
//! with no libtorch op and no allocation between the embedding and the
//! final norm.
//!
//! The tensor path calls the same kernels, but each op returns a fresh
//! libtorch tensor and the residual adds go through libtorch: at one
//! stream, between the products that stream the weights, the calling
//! thread spent about a sixth of a bench-model step in allocation,
//! dispatch and its own small ops while the other thread waited (perf,
//! `steptime` on the 64 M bench model on a 2-core Zen 1). Here each op
//! writes into a buffer of [`RowScratch`], so the step's serial work is
//! the norms, rotary embeddings and the residual adds alone.
//!
//! Every value is what the tensor path computes, to the bit: the same
//! kernels with the same tasks, the residual adds as libtorch's (one
//! float32 addition per element). `GYRE_ROW_PATH=0` turns it off (to
//! compare); steps with a prompt or a chunk of one, and layers or
//! backends the path does not cover, take the tensor path.

use super::Backend;
use super::attention::{AttnParams, LayerStep};
use super::linear::Linear;
use super::norm::RmsNorm;
use crate::EngineError;
use crate::attn::{self, DecodeSeq, Heads};

/// Buffers of one step's rows, grown to the largest step seen and kept.
#[derive(Default)]
pub(crate) struct RowScratch {
    /// The residual stream [n, hidden].
    pub x: Vec<f32>,
    /// The next residual, written by the fused add-and-norm.
    sum: Vec<f32>,
    /// A norm's output [n, hidden].
    h: Vec<f32>,
    qkv: Vec<f32>,
    q: Vec<f32>,
    att: Vec<f32>,
    /// A projection back to hidden [n, hidden].
    o: Vec<f32>,
    /// SwiGLU's activation [n, inter].
    act: Vec<f32>,
    /// A quantized gate/up product's gate and up halves.
    gu: Vec<f32>,
}

/// A layer's parts as the row path runs them.
pub(crate) struct RowParts<'a> {
    pub input_norm: &'a RmsNorm,
    pub qkv: &'a Linear,
    pub o: &'a Linear,
    pub p: &'a AttnParams,
    pub post_norm: &'a RmsNorm,
    pub gate_up: &'a Linear,
    pub down: &'a Linear,
}

impl RowParts<'_> {
    /// Whether every product has a row-path kernel.
    pub fn usable(&self) -> bool {
        self.qkv.rows_ok() && self.o.rows_ok() && self.gate_up.silu_rows_ok() && self.down.rows_ok()
    }
}

/// What every layer of a step shares: the rotary tables of the step's
/// rows (cos and the signed sine, [n, head_dim] each) and where each row's
/// key and value go in the pool.
pub(crate) struct RowStep<'a> {
    pub cos: &'a [f32],
    pub sin: &'a [f32],
    pub new_slots: &'a [i64],
}

/// Whether the row path is on: not turned off by `GYRE_ROW_PATH=0` or
/// [`set_enabled`], nor the fused CPU ops it runs.
pub(crate) fn enabled() -> bool {
    static ENV: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let on = match SET.load(std::sync::atomic::Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => *ENV.get_or_init(|| std::env::var("GYRE_ROW_PATH").map_or(true, |v| v != "0")),
    };
    on && crate::fused::enabled()
}

/// Steps the row path has run in this process (tests check that it ran).
pub fn steps() -> u64 {
    STEPS.load(std::sync::atomic::Ordering::Relaxed)
}

pub(crate) static STEPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// 0: as `GYRE_ROW_PATH` says; 1: on; 2: off.
static SET: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Turns the row path on or off for the whole process (tests and
/// comparisons; the next step reads it).
pub fn set_enabled(on: bool) {
    SET.store(if on { 1 } else { 2 }, std::sync::atomic::Ordering::Relaxed);
}

/// Resizes `v` to `len` floats (values left over from an earlier step
/// are overwritten before they are read).
fn sized(v: &mut Vec<f32>, len: usize) -> &mut [f32] {
    v.resize(len, 0.0);
    v
}

/// One decoder layer over `sc.x` (every row a decode), in place.
pub(crate) fn layer(
    parts: &RowParts<'_>,
    step: &RowStep<'_>,
    s: &mut LayerStep<'_>,
    sc: &mut RowScratch,
) -> Result<(), EngineError> {
    let be: &Backend = s.be;
    let p = parts.p;
    let n = step.new_slots.len();
    let hidden = sc.x.len() / n.max(1);
    let (heads, kvh, hd) = (p.heads as usize, p.kv_heads as usize, p.head_dim as usize);
    let (w_in, eps_in) = parts.input_norm.parts();
    let h = sized(&mut sc.h, n * hidden);
    crate::fused::cpu::add_rms_norm_to(&sc.x, None, attn::f32_view(w_in)?, eps_in, h, None)?;
    let qkv = sized(&mut sc.qkv, n * parts.qkv.out_features());
    parts.qkv.forward_to(&sc.h, n, qkv, be)?;
    let (kc, vc) = s.pool.layer(s.layer);
    let q = sized(&mut sc.q, n * heads * hd);
    crate::fused::cpu::rope_kv_to(
        &sc.qkv,
        step.cos,
        step.sin,
        step.new_slots,
        kc,
        vc,
        p.heads,
        p.kv_heads,
        p.head_dim,
        q,
    )?;
    let first_visible = |start: i64| p.window.map_or(0, |w| (start - w + 1).max(0) as usize);
    let decodes: Vec<DecodeSeq<'_>> = s
        .batch
        .seqs
        .iter()
        .map(|q| DecodeSeq {
            row: q.row,
            slots: &q.slots[first_visible(q.start)..],
        })
        .collect();
    let heads_of = Heads {
        heads,
        kv_heads: kvh,
        head_dim: hd,
        scale: 1.0 / (hd as f32).sqrt(),
        softcap: None,
    };
    let att = sized(&mut sc.att, n * heads * hd);
    let workers = Some(&be.pool);
    if kc.kind() == tch::Kind::Half {
        let (ks, vs) = (
            attn::kv_view::<half::f16>(kc)?,
            attn::kv_view::<half::f16>(vc)?,
        );
        attn::decode_into(&sc.q, ks, vs, &decodes, heads_of, workers, att);
    } else {
        let (ks, vs) = (attn::kv_view::<f32>(kc)?, attn::kv_view::<f32>(vc)?);
        attn::decode_into(&sc.q, ks, vs, &decodes, heads_of, workers, att);
    }
    let o = sized(&mut sc.o, n * hidden);
    parts.o.forward_to(&sc.att, n, o, be)?;
    let (w_post, eps_post) = parts.post_norm.parts();
    let sum = sized(&mut sc.sum, n * hidden);
    crate::fused::cpu::add_rms_norm_to(
        &sc.x,
        Some(&sc.o),
        attn::f32_view(w_post)?,
        eps_post,
        &mut sc.h,
        Some(sum),
    )?;
    std::mem::swap(&mut sc.x, &mut sc.sum);
    let act = sized(&mut sc.act, n * parts.gate_up.out_features() / 2);
    parts
        .gate_up
        .forward_silu_to(&sc.h, n, act, &mut sc.gu, be)?;
    parts.down.forward_to(&sc.act, n, &mut sc.o, be)?;
    // As libtorch's `x + mlp`: one float32 addition per element.
    for (x, &d) in sc.x.iter_mut().zip(&sc.o) {
        *x += d;
    }
    Ok(())
}
