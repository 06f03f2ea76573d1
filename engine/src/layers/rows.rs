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

use tch::Tensor;

use super::Backend;
use super::attention::{AttnLogits, AttnParams, LayerStep, decode_seqs};
use super::batch::StepBatch;
use super::linear::Linear;
use super::mlp::GatedMlp;
use super::norm::{GemmaRmsNorm, RmsNorm};
use crate::EngineError;
use crate::attn;
use crate::kv::KvPool;

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
    /// A gate/up product's gate and up halves.
    gu: Vec<f32>,
    /// Gemma: the head-normed q/k/v, and a norm's output to add.
    normed: Vec<f32>,
    delta: Vec<f32>,
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

impl<'a> RowStep<'a> {
    /// From a step's rotary tables (float32, [n, 1, head_dim]).
    pub fn new(
        cos: &'a Tensor,
        sin: &'a Tensor,
        new_slots: &'a [i64],
    ) -> Result<Self, EngineError> {
        Ok(Self {
            cos: attn::f32_view(cos)?,
            sin: attn::f32_view(sin)?,
            new_slots,
        })
    }
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

/// Whether a step can take the row path on `be`: it is on, the backend is
/// a float32 CPU, and every sequence decodes one token.
pub(crate) fn step_fits(batch: &StepBatch, be: &Backend) -> bool {
    batch.n > 0
        && enabled()
        && be.device == tch::Device::Cpu
        && be.kind == tch::Kind::Float
        && batch.cpu_decode
        && batch.flash.is_none()
        && !batch.graphed
        && batch.seqs.iter().all(|s| s.len == 1)
}

/// Where each decode's key and value go in the pool: its last slot.
pub(crate) fn new_slots(batch: &StepBatch) -> Vec<i64> {
    batch
        .seqs
        .iter()
        .map(|s| s.slots.last().copied().unwrap_or(-1))
        .collect()
}

/// A step of decodes from its embedded rows `x` ([n, hidden]) through
/// `layers` layers (`layer(i, step, scratch)` runs layer i over
/// `scratch.x`) and the final RMSNorm `(w, eps)`, into a new tensor.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run(
    scratch: &std::sync::Mutex<RowScratch>,
    x: &Tensor,
    batch: &StepBatch,
    pool: &mut KvPool,
    be: &Backend,
    layers: usize,
    (w, eps): (&Tensor, f64),
    mut layer: impl FnMut(usize, &mut LayerStep<'_>, &mut RowScratch) -> Result<(), EngineError>,
) -> Result<Tensor, EngineError> {
    let mut sc = scratch.lock().unwrap_or_else(|e| e.into_inner());
    sc.x.clear();
    sc.x.extend_from_slice(attn::f32_view(x)?);
    for i in 0..layers {
        let _span = tracing::trace_span!("layer", layer = i).entered();
        let mut s = LayerStep {
            batch,
            be,
            pool: &mut *pool,
            layer: i,
        };
        layer(i, &mut s, &mut sc)?;
    }
    final_norm(&sc.x, batch.n as usize, attn::f32_view(w)?, eps)
}

/// The final norm of the residual `x` ([n, hidden]) into a new tensor,
/// and the step counted.
fn final_norm(x: &[f32], n: usize, w: &[f32], eps: f64) -> Result<Tensor, EngineError> {
    let hidden = x.len() / n.max(1);
    let mut done = Ok(());
    let h = attn::f32_tensor_written(&[n as i64, hidden as i64], |out| {
        // SAFETY: the fresh tensor holds n * hidden floats, referenced
        // nowhere else until returned; the norm writes every one (or fails
        // its checks first, and the tensor is dropped).
        #[allow(unsafe_code)]
        let out = unsafe { std::slice::from_raw_parts_mut(out, n * hidden) };
        done = crate::fused::cpu::add_rms_norm_to(x, None, w, eps, out, None);
    })?;
    done?;
    STEPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Ok(h)
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
    let (heads, hd) = (p.heads as usize, p.head_dim as usize);
    let (w_in, eps_in) = parts.input_norm.parts();
    let h = sized(&mut sc.h, n * hidden);
    crate::fused::cpu::add_rms_norm_to(&sc.x, None, attn::f32_view(w_in)?, eps_in, h, None)?;
    let qkv = sized(&mut sc.qkv, n * parts.qkv.out_features());
    parts.qkv.forward_to(&sc.h, n, qkv, be)?;
    let lg = AttnLogits::default();
    let (q, att) = (&mut sc.q, sized(&mut sc.att, n * heads * hd));
    attend(s, p, &lg, step, &sc.qkv, q, att)?;
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

/// Rotates the query and key heads of `qkv` ([n, (heads + 2 kv_heads) x
/// head_dim]) with `step`'s tables, writes keys and values into the pool
/// layer, and each row's attention over its sequence's keys and values
/// there (those in `p`'s window), with `lg`'s logits, into `att`: the
/// tensor path's passes and decode kernel, `q` the rotated queries.
fn attend(
    s: &LayerStep<'_>,
    p: &AttnParams,
    lg: &AttnLogits,
    step: &RowStep<'_>,
    qkv: &[f32],
    q: &mut Vec<f32>,
    att: &mut [f32],
) -> Result<(), EngineError> {
    let (kc, vc) = s.pool.layer(s.layer);
    let q = sized(q, step.new_slots.len() * (p.heads * p.head_dim) as usize);
    crate::fused::cpu::rope_kv_to(
        qkv,
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
    let decodes = decode_seqs(s.batch, p);
    let workers = Some(&s.be.pool);
    attn::decode_pool_into(q, kc, vc, &decodes, lg.decode_heads(p), workers, att)
}

/// A Gemma 3 layer's parts as the row path runs them.
pub(crate) struct GemmaRowParts<'a> {
    pub input_norm: &'a GemmaRmsNorm,
    pub qkv: &'a Linear,
    pub q_norm: &'a GemmaRmsNorm,
    pub k_norm: &'a GemmaRmsNorm,
    pub o: &'a Linear,
    pub p: &'a AttnParams,
    /// The attention logits' scale (`query_pre_attn_scalar^-0.5`).
    pub logits: &'a AttnLogits,
    pub post_attn_norm: &'a GemmaRmsNorm,
    pub pre_ff_norm: &'a GemmaRmsNorm,
    pub mlp: &'a GatedMlp,
    pub post_ff_norm: &'a GemmaRmsNorm,
}

impl GemmaRowParts<'_> {
    /// Whether every product has a row-path kernel.
    pub fn usable(&self) -> bool {
        let (gate_up, down) = self.mlp.parts();
        self.qkv.rows_ok() && self.o.rows_ok() && gate_up.rows_ok() && down.rows_ok()
    }
}

/// The norm of each row of `xs` (+ `ds`, the sum into `sum`) with a
/// Gemma norm's `1 + w`.
fn gemma_norm(
    norm: &GemmaRmsNorm,
    xs: &[f32],
    ds: Option<&[f32]>,
    h: &mut [f32],
    sum: Option<&mut [f32]>,
) -> Result<(), EngineError> {
    let (w, eps) = norm.parts();
    crate::fused::cpu::add_rms_norm_to(xs, ds, attn::f32_view(w)?, eps, h, sum)
}

/// One Gemma 3 decoder layer over `sc.x` (every row a decode), in place:
/// the same ops as `models/gemma3.rs`'s, GeGLU's activation through the
/// same libtorch ops over the gate/up buffer.
pub(crate) fn gemma_layer(
    parts: &GemmaRowParts<'_>,
    step: &RowStep<'_>,
    s: &mut LayerStep<'_>,
    sc: &mut RowScratch,
) -> Result<(), EngineError> {
    let be: &Backend = s.be;
    let p = parts.p;
    let n = step.new_slots.len();
    let hidden = sc.x.len() / n.max(1);
    let (heads, hd) = (p.heads as usize, p.head_dim as usize);
    gemma_norm(
        parts.input_norm,
        &sc.x,
        None,
        sized(&mut sc.h, n * hidden),
        None,
    )?;
    let width = parts.qkv.out_features();
    parts
        .qkv
        .forward_to(&sc.h, n, sized(&mut sc.qkv, n * width), be)?;
    let ((qw, eps), (kw, _)) = (parts.q_norm.parts(), parts.k_norm.parts());
    crate::fused::cpu::head_norms_to(
        &sc.qkv,
        attn::f32_view(qw)?,
        attn::f32_view(kw)?,
        p.heads,
        p.kv_heads,
        p.head_dim,
        eps,
        sized(&mut sc.normed, n * width),
    )?;
    let (q, att) = (&mut sc.q, sized(&mut sc.att, n * heads * hd));
    attend(s, p, parts.logits, step, &sc.normed, q, att)?;
    parts
        .o
        .forward_to(&sc.att, n, sized(&mut sc.o, n * hidden), be)?;
    let delta = sized(&mut sc.delta, n * hidden);
    gemma_norm(parts.post_attn_norm, &sc.o, None, delta, None)?;
    let sum = sized(&mut sc.sum, n * hidden);
    gemma_norm(
        parts.pre_ff_norm,
        &sc.x,
        Some(&sc.delta),
        &mut sc.h,
        Some(sum),
    )?;
    std::mem::swap(&mut sc.x, &mut sc.sum);
    let (gate_up, down) = parts.mlp.parts();
    let two_inter = gate_up.out_features();
    let gu = sized(&mut sc.gu, n * two_inter);
    gate_up.forward_to(&sc.h, n, gu, be)?;
    let act = {
        #[allow(unsafe_code)]
        // SAFETY: `sc.gu` holds n * two_inter initialised floats, row-major,
        // and is neither moved nor written while `gu_t` lives (to the end
        // of this block); `act_mul` returns new tensors of its own.
        let gu_t = unsafe {
            tch::Tensor::from_blob(
                sc.gu.as_ptr().cast::<u8>(),
                &[n as i64, two_inter as i64],
                &[two_inter as i64, 1],
                tch::Kind::Float,
                tch::Device::Cpu,
            )
        };
        parts.mlp.act_mul(&gu_t)?
    };
    down.forward_to(attn::f32_view(&act)?, n, &mut sc.o, be)?;
    gemma_norm(parts.post_ff_norm, &sc.o, None, &mut sc.delta, None)?;
    // As libtorch's `x + delta`: one float32 addition per element.
    for (x, &d) in sc.x.iter_mut().zip(&sc.delta) {
        *x += d;
    }
    Ok(())
}
