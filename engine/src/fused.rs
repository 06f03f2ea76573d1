//! Fused CUDA kernels for bf16 decode steps (`csrc/fused.cpp`, compiled at
//! run time with NVRTC): residual add + RMSNorm, rotary embedding of the
//! query and key heads + the paged KV write, SiLU(gate) x up, a
//! matrix-vector product for one-row projections ([`gemv`]), and decode
//! attention that reads the paged pool in place, split over the keys
//! ([`decode_attention`]).
//!
//! A decode step at batch 1 reads every weight once; besides the weights'
//! matrix-vector products, each layer ran about twenty small libtorch
//! kernels of 1-3 us each (inside a CUDA graph too). These replace about a
//! dozen of them per layer, and the two gathers and flash attention call
//! with one split-key kernel and its merge; the matrix-vector kernel streams
//! the weights faster than cuBLAS does at one row (Llama-3-8B shape on an
//! H100: 138.4 tok/s with none of them, 155.3 with all; the README's GPU
//! section). Each rounds to bf16 exactly where transformers'
//! eager code rounds (the norm's float32 sum of squares is added in
//! another order, which can move a rounding by one bf16 step).
//!
//! They are used on CUDA with bf16 tensors once [`prepare`] has compiled
//! and loaded them (the backend does, at model load); a failed compile
//! turns them off (with a warning). On the CPU in float32, [`cpu`] does the
//! first three things in plain Rust over the tensors' memory: a batch-1
//! decode of a small model is mostly such tiny ops, and each libtorch call
//! costs several microseconds of dispatch and allocation whatever its size.
//! `GYRE_FUSED_KERNELS=0` turns all of them off (for comparisons); the
//! callers then run their libtorch ops (cuBLAS, the gather and flash
//! attention). `GYRE_GEMV=0` and `GYRE_DECODE_ATTN=0` turn off one kernel.
//!
//! On Hopper and later they are launched with programmatic dependent launch
//! (`cuLaunchKernelEx`): each may start while the kernel before it in the
//! stream finishes, doing only what needs none of that kernel's writes (a
//! projection's first weight loads) before waiting for it, so a decode
//! step's hundreds of small kernels do not each pay a launch and a drain.
//! `GYRE_PDL=0` launches them plainly (for comparisons).
//! `GYRE_ATTN_MIN_CHUNK` sets the fewest keys a decode attention split
//! takes (default 32; for comparisons).
//! `GYRE_GEMV_UNROLL=8` or `16` gives the one-row matrix-vector kernel at
//! one warp a row (`GYRE_GEMV_SPLIT=1`) that many weight loads in flight
//! per lane instead of 4 (for comparisons: on an H200 both made the 8B
//! shape's decode step slower).
//! One-row products split each weight row over four warps, whose float32
//! sums are then added (on an H200 the 8B shape's batch-1 decode graph took
//! 4.585 ms against 4.750 with one warp a row); `GYRE_GEMV_SPLIT=1`, `2` or
//! `8` sets the warps a row, for rows of at least `GYRE_GEMV_SPLIT_MIN_K`
//! columns (default 0), and `GYRE_GEMV_MAX_K` sends longer rows to cuBLAS
//! (both for comparisons). `GYRE_GEMV_SILU=1` runs a one-row MLP's gate/up
//! product and SiLU product in one kernel ([`gemv_silu`]: one launch and
//! one intermediate fewer a layer; off by default: on an H200, with one
//! warp a row, it measured no faster; its rows now split as gemv's do, not
//! yet measured).
//!
//! `GYRE_TWICE=norm,rope,attn,silu,gemv` (any of them, or `all`) launches
//! the named stages' CUDA kernels twice, for timing on a GPU: each writes
//! only outputs it does not read, so the second launch rewrites the same
//! values and the tokens do not change, while a decode graph's replay time
//! grows by the stage's own cost in place (its launch, its overlap with
//! its neighbours, and for `gemv` weights partly in L2 the second time).
//! `tests/gpu/device.sh stages` takes the differences; unlike Nsight
//! Compute it needs no hardware counters.

use std::sync::atomic::{AtomicBool, Ordering};

use tch::{Kind, Tensor};

use crate::EngineError;

/// Kernels loaded for this process's CUDA device.
static READY: AtomicBool = AtomicBool::new(false);
/// Not turned off (`GYRE_FUSED_KERNELS=0`, or [`set_enabled`]).
static ENABLED: AtomicBool = AtomicBool::new(true);

/// Compiles and loads the kernels for the current CUDA device (once per
/// process); on failure logs why and leaves the unfused path in use.
pub(crate) fn prepare() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| match ffi::init() {
        Ok(()) => READY.store(true, Ordering::Relaxed),
        Err(e) => {
            tracing::warn!(error = %e, "fused CUDA kernels unavailable; using libtorch's ops")
        }
    });
}

/// Turns the fused kernels on or off for later steps (comparisons).
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Not turned off by `GYRE_FUSED_KERNELS=0` or [`set_enabled`] (also
/// asked by the packed gate/up product's fused SiLU, `crate::gemm`).
pub(crate) fn enabled() -> bool {
    static ENV_OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    ENABLED.load(Ordering::Relaxed)
        && !*ENV_OFF.get_or_init(|| std::env::var("GYRE_FUSED_KERNELS").is_ok_and(|v| v == "0"))
}

/// Whether [`cpu`]'s ops can take `t`: enabled, a contiguous float32 CPU
/// tensor.
fn cpu_usable(t: &Tensor) -> bool {
    enabled() && t.device() == tch::Device::Cpu && t.kind() == Kind::Float && t.is_contiguous()
}

/// Whether the CPU's pass can store into the pool layer `t`: a contiguous
/// float32 or float16 CPU tensor.
fn cpu_pool_usable(t: &Tensor) -> bool {
    enabled()
        && t.device() == tch::Device::Cpu
        && matches!(t.kind(), Kind::Float | Kind::Half)
        && t.is_contiguous()
}

/// Whether the kernels can take `t`: loaded, enabled, a contiguous bf16
/// CUDA tensor.
fn usable(t: &Tensor) -> bool {
    READY.load(Ordering::Relaxed)
        && enabled()
        && t.device().is_cuda()
        && t.kind() == Kind::BFloat16
        && t.is_contiguous()
}

/// Which implementation takes every one of `ts`: the CUDA kernels or the
/// CPU's Rust; None: neither (the caller runs libtorch's ops).
#[derive(Clone, Copy)]
enum Path {
    Cuda,
    Cpu,
}

fn path(ts: &[Option<&Tensor>]) -> Option<Path> {
    let all = |ok: fn(&Tensor) -> bool| ts.iter().flatten().all(|t| ok(t));
    if all(usable) {
        Some(Path::Cuda)
    } else if all(cpu_usable) {
        Some(Path::Cpu)
    } else {
        None
    }
}

/// `x + delta` and RMSNorm of it with weight `w`, as transformers'
/// LlamaRMSNorm; without `delta`, RMSNorm of `x` (the first result is then
/// `x` itself). `x`, `delta` [rows, hidden]. None when neither the CUDA
/// kernel nor the CPU's pass takes these tensors.
pub(crate) fn add_rms_norm(
    x: &Tensor,
    delta: Option<&Tensor>,
    w: &Tensor,
    eps: f64,
) -> Result<Option<(Tensor, Tensor)>, EngineError> {
    match path(&[Some(x), delta, Some(w)]) {
        Some(Path::Cuda) => cuda_add_rms_norm(x, delta, w, eps).map(Some),
        Some(Path::Cpu) => cpu::add_rms_norm(x, delta, w, eps).map(Some),
        None => Ok(None),
    }
}

/// Gemma's per-head query and key norms of `qkv` (see [`cpu::head_norms`]),
/// on the CPU in float32 only; None when the CPU's pass does not take these
/// tensors (the caller runs its norms' libtorch ops).
#[allow(clippy::too_many_arguments)]
pub(crate) fn head_norms(
    qkv: &Tensor,
    q_w: &Tensor,
    k_w: &Tensor,
    heads: i64,
    kv_heads: i64,
    head_dim: i64,
    eps: f64,
) -> Result<Option<Tensor>, EngineError> {
    if [qkv, q_w, k_w].iter().all(|t| cpu_usable(t)) {
        cpu::head_norms(qkv, q_w, k_w, heads, kv_heads, head_dim, eps).map(Some)
    } else {
        Ok(None)
    }
}

/// Rotates the query and key heads of `qkv` and stores keys and values in
/// the pool layer (see [`cuda_rope_kv`]); returns the queries, or None when
/// neither implementation takes these tensors.
#[allow(clippy::too_many_arguments)]
pub(crate) fn rope_kv(
    qkv: &Tensor,
    cos: &Tensor,
    signed_sin: &Tensor,
    slots: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    heads: i64,
    kv_heads: i64,
    head_dim: i64,
) -> Result<Option<Tensor>, EngineError> {
    let ts = [qkv, cos, signed_sin, k_cache, v_cache].map(Some);
    match path(&ts) {
        Some(Path::Cuda) if slots.is_contiguous() => cuda_rope_kv(
            qkv, cos, signed_sin, slots, k_cache, v_cache, heads, kv_heads, head_dim,
        )
        .map(Some),
        Some(Path::Cuda) => Ok(None),
        // The CPU's pool may also be float16 (`--kv-cache-dtype f16`).
        _ if matches!(path(&ts[..3]), Some(Path::Cpu))
            && [k_cache, v_cache].iter().all(|t| cpu_pool_usable(t))
            && k_cache.kind() == v_cache.kind() =>
        {
            cpu::rope_kv(
                qkv, cos, signed_sin, slots, k_cache, v_cache, heads, kv_heads, head_dim,
            )
            .map(Some)
        }
        _ => Ok(None),
    }
}

/// `silu(gate) * up` of `gu` [n, 2 inter] (gate columns first): [n,
/// inter], or None when neither implementation takes `gu`.
pub(crate) fn silu_mul(gu: &Tensor, inter: i64) -> Result<Option<Tensor>, EngineError> {
    match path(&[Some(gu)]) {
        Some(Path::Cuda) => cuda_silu_mul(gu, inter).map(Some),
        Some(Path::Cpu) => cpu::silu_mul(gu, inter).map(Some),
        None => Ok(None),
    }
}

/// Reads a switch from the environment once: false only when set to "0".
fn env_on(name: &'static str, cell: &'static std::sync::OnceLock<bool>) -> bool {
    *cell.get_or_init(|| std::env::var(name).map_or(true, |v| v != "0"))
}

/// Reads an integer knob from the environment once: `fit` of the value,
/// or `default` when it is unset or not an integer.
fn env_i64(
    name: &'static str,
    cell: &'static std::sync::OnceLock<i64>,
    default: i64,
    fit: fn(i64) -> i64,
) -> i64 {
    *cell.get_or_init(|| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse::<i64>().ok())
            .map_or(default, fit)
    })
}

/// The kernel stages of a decode step that `GYRE_TWICE` can name.
#[derive(Clone, Copy)]
enum Stage {
    /// [`add_rms_norm`].
    Norm = 1,
    /// [`rope_kv`].
    Rope = 2,
    /// [`decode_attention`] (its split and merge kernels).
    Attn = 4,
    /// [`silu_mul`].
    Silu = 8,
    /// [`gemv`] and [`gemv_silu`].
    Gemv = 16,
}

/// The stages named in a `GYRE_TWICE` value (comma-separated; `all`),
/// as a mask of [`Stage`]s, and the names it did not know.
fn twice_mask(v: &str) -> (u32, Vec<String>) {
    let mut unknown = Vec::new();
    let mask = v
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| match s {
            "norm" => Stage::Norm as u32,
            "rope" => Stage::Rope as u32,
            "attn" => Stage::Attn as u32,
            "silu" => Stage::Silu as u32,
            "gemv" => Stage::Gemv as u32,
            "all" => 31,
            other => {
                unknown.push(other.to_string());
                0
            }
        })
        .fold(0, |a, b| a | b);
    (mask, unknown)
}

/// How many times `stage`'s CUDA kernels are launched: twice when
/// `GYRE_TWICE` names it (timing on a GPU), else once.
fn launches(stage: Stage) -> usize {
    static MASK: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    let mask = *MASK.get_or_init(|| {
        let Ok(v) = std::env::var("GYRE_TWICE") else {
            return 0;
        };
        let (mask, unknown) = twice_mask(&v);
        if !unknown.is_empty() {
            tracing::warn!(
                ?unknown,
                "GYRE_TWICE: unknown stages ignored (norm, rope, attn, silu, gemv, all)"
            );
        }
        mask
    });
    if mask & stage as u32 != 0 { 2 } else { 1 }
}

/// Most rows of `x` the matrix-vector kernel takes (`GYRE_GEMV_MAX_ROWS`,
/// 0 to 8; default 1); larger batches go to cuBLAS. On an H100 with the
/// Llama-3-8B shape the kernel beat cuBLAS at one row (6.28 vs 6.55 ms a
/// decode step) and lost at two (7.04 vs 6.57), four (8.86 vs 6.63) and
/// eight (14.4 vs 6.86): each lane re-reads every row of x from L1 per
/// weight load.
fn gemv_max_rows() -> i64 {
    static MAX: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    env_i64("GYRE_GEMV_MAX_ROWS", &MAX, 1, |v| v.clamp(0, 8))
}

/// Most columns of a product the matrix-vector kernel takes
/// (`GYRE_GEMV_MAX_K`, default no limit); longer rows go to cuBLAS (for
/// comparisons: on an H200 the kernel lost to cuBLAS on the 8B shape's
/// down projection, 14,336 columns, and beat it on the others).
fn gemv_max_k() -> i64 {
    static MAX: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    env_i64("GYRE_GEMV_MAX_K", &MAX, i64::MAX, |v| v.max(0))
}

/// `x` [m, k] times `w` [n, k] transposed (+ `bias` [n]) with gyre's
/// matrix-vector kernel, for decode steps of a few rows on CUDA in bf16:
/// [m, n], or None when the kernel does not take these tensors (the caller
/// runs cuBLAS). `GYRE_GEMV=0` turns it off. `w` must be a weight that
/// no kernel still in flight writes: launched with programmatic dependent
/// launch, the kernel loads its first weight rows before it waits for the
/// kernel before it.
pub(crate) fn gemv(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
) -> Result<Option<Tensor>, EngineError> {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let (xs, ws) = (x.size(), w.size());
    if xs.len() != 2
        || ws.len() != 2
        || xs[0] > gemv_max_rows()
        || xs[0] == 0
        || xs[1] > gemv_max_k()
        || xs[1] != ws[1]
        || xs[1] % 8 != 0
        || !env_on("GYRE_GEMV", &ON)
        || !usable(x)
        || !usable(w)
        || bias.is_some_and(|b| !usable(b))
        || !(x.data_ptr() as usize).is_multiple_of(16)
        || !(w.data_ptr() as usize).is_multiple_of(16)
    {
        return Ok(None);
    }
    let y = Tensor::f_empty([xs[0], ws[0]], (x.kind(), x.device()))?;
    for _ in 0..launches(Stage::Gemv) {
        ffi::gemv(x, w, bias, &y)?;
    }
    Ok(Some(y))
}

/// Whether one-row gate/up products take [`gemv_silu`]
/// (`GYRE_GEMV_SILU=1`; off by default: on an H200, both at one warp a
/// row, the 8B shape's decode graph took 4.760 ms with it and 4.750
/// without).
fn gemv_silu_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("GYRE_GEMV_SILU").is_ok_and(|v| v == "1"))
}

/// `silu(x G^T) * (x U^T)` for one row `x` [1, k] and a stacked gate/up
/// weight `w` [2 inter, k] (gate rows first), in one kernel: [1, inter],
/// bit for bit [`gemv`] then [`silu_mul`]: its rows split over 2 or 4
/// warps as gemv's are (the default 4), or one warp a row at
/// `GYRE_GEMV_SPLIT=1` (at the default unroll) and at 8 (then within a
/// bf16 step of them: gemv sums each row in another order). None when the
/// kernel does not take these tensors or is off (`GYRE_GEMV_SILU`, and
/// `GYRE_GEMV=0` turns it off too); `w` as in [`gemv`] must be a weight
/// no kernel in flight writes.
pub(crate) fn gemv_silu(x: &Tensor, w: &Tensor) -> Result<Option<Tensor>, EngineError> {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let (xs, ws) = (x.size(), w.size());
    if xs.len() != 2
        || ws.len() != 2
        || xs[0] != 1
        || gemv_max_rows() < 1
        || xs[1] != ws[1]
        || xs[1] % 8 != 0
        || ws[0] % 2 != 0
        || !gemv_silu_on()
        || !env_on("GYRE_GEMV", &ON)
        || !usable(x)
        || !usable(w)
        || !(x.data_ptr() as usize).is_multiple_of(16)
        || !(w.data_ptr() as usize).is_multiple_of(16)
    {
        return Ok(None);
    }
    let y = Tensor::f_empty([1, ws[0] / 2], (x.kind(), x.device()))?;
    for _ in 0..launches(Stage::Gemv) {
        ffi::gemv_silu(x, w, &y)?;
    }
    Ok(Some(y))
}

/// How a decode attention call splits each sequence's keys: (keys per
/// split, splits), aiming at two blocks per multiprocessor, with at least
/// `min_chunk` keys a split (rounded up to a whole round). A block scores
/// 32 keys a round (4 warps of 8).
fn attn_plan(seqs: i64, kv_heads: i64, max_k: i64, sms: i64, min_chunk: i64) -> (i64, i64) {
    const ROUND: i64 = 32;
    let max_k = max_k.max(1);
    let per = ROUND * 2 * sms.max(1);
    let rounds = ((seqs * kv_heads * max_k + per - 1) / per)
        .max((min_chunk + ROUND - 1) / ROUND)
        .max(1);
    let chunk = rounds * ROUND;
    (chunk, (max_k + chunk - 1) / chunk)
}

/// The fewest keys a decode attention split takes (`GYRE_ATTN_MIN_CHUNK`,
/// default 32, one round): larger values mean fewer splits, down to one,
/// which needs no merge kernel (for comparisons, on a GPU: at batch 1 and
/// short contexts the split plan runs one round a block, then the merge).
fn attn_min_chunk() -> i64 {
    static MIN: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    env_i64("GYRE_ATTN_MIN_CHUNK", &MIN, 32, |v| v.clamp(1, 1 << 20))
}

/// Decode attention over the paged pool in place (no gather copy), split
/// over the keys: `q` [seqs, heads, head_dim], one query per sequence, its
/// keys the pool rows `gather[cu_k[i]..]`, `used[i]` of them (or up to
/// `cu_k[i + 1]`). [seqs, heads, head_dim], or None when the kernel does not
/// take these (head_dim other than 64 and 128, a group over 8 heads, not
/// bf16 CUDA). `GYRE_DECODE_ATTN=0` turns it off.
#[allow(clippy::too_many_arguments)]
pub(crate) fn decode_attention(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    gather: &Tensor,
    cu_k: &Tensor,
    used: Option<&Tensor>,
    max_k: i64,
) -> Result<Option<Tensor>, EngineError> {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let (qs, ks) = (q.size(), k_cache.size());
    if qs.len() != 3
        || ks.len() != 3
        || !matches!(qs[2], 64 | 128)
        || ks[2] != qs[2]
        || ks[1] <= 0
        || qs[1] % ks[1] != 0
        || qs[1] / ks[1] > 8
        || !env_on("GYRE_DECODE_ATTN", &ON)
        || !usable(q)
        || !usable(k_cache)
        || !usable(v_cache)
    {
        return Ok(None);
    }
    let (seqs, heads, d) = (qs[0], qs[1], qs[2]);
    let (chunk, splits) = attn_plan(seqs, ks[1], max_k, ffi::sms(), attn_min_chunk());
    let f32 = (Kind::Float, q.device());
    let (part, ml) = if splits > 1 {
        (
            Tensor::f_empty([seqs * heads * splits * d], f32)?,
            Tensor::f_empty([seqs * heads * splits * 2], f32)?,
        )
    } else {
        (Tensor::f_empty([1], f32)?, Tensor::f_empty([1], f32)?)
    };
    let out = q.f_empty_like()?;
    let scale = 1.0 / (d as f64).sqrt();
    for _ in 0..launches(Stage::Attn) {
        ffi::decode_attention(
            q, k_cache, v_cache, gather, cu_k, used, &out, &part, &ml, chunk, splits, scale,
        )?;
    }
    Ok(Some(out))
}

/// `x + delta` (rounded to bf16) and RMSNorm of it with weight `w`, as
/// transformers' LlamaRMSNorm; without `delta`, RMSNorm of `x` (the first
/// result is then `x` itself). `x`, `delta` [rows, hidden].
fn cuda_add_rms_norm(
    x: &Tensor,
    delta: Option<&Tensor>,
    w: &Tensor,
    eps: f64,
) -> Result<(Tensor, Tensor), EngineError> {
    let h = x.f_empty_like()?;
    let x_out = match delta {
        Some(_) => x.f_empty_like()?,
        None => x.shallow_clone(),
    };
    for _ in 0..launches(Stage::Norm) {
        ffi::add_rms_norm(x, delta, w, delta.map(|_| &x_out), &h, eps)?;
    }
    Ok((x_out, h))
}

/// Rotates the query and key heads of `qkv` [n, (heads + 2 kv_heads) *
/// head_dim] with the step's bf16 tables `cos`, `signed_sin` [n, 1,
/// head_dim], stores keys and values in `k_cache`, `v_cache` [slots,
/// kv_heads, head_dim] at `slots` [n], and returns the queries [n, heads,
/// head_dim].
#[allow(clippy::too_many_arguments)]
fn cuda_rope_kv(
    qkv: &Tensor,
    cos: &Tensor,
    signed_sin: &Tensor,
    slots: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    heads: i64,
    kv_heads: i64,
    head_dim: i64,
) -> Result<Tensor, EngineError> {
    let n = qkv.size()[0];
    let q = Tensor::f_empty([n, heads, head_dim], (qkv.kind(), qkv.device()))?;
    for _ in 0..launches(Stage::Rope) {
        ffi::rope_kv(
            qkv, cos, signed_sin, slots, &q, k_cache, v_cache, heads, kv_heads, head_dim,
        )?;
    }
    Ok(q)
}

/// `silu(gate) * up` of `gu` [n, 2 inter] (gate columns first), rounded
/// as transformers rounds it: [n, inter].
fn cuda_silu_mul(gu: &Tensor, inter: i64) -> Result<Tensor, EngineError> {
    let n = gu.size()[0];
    let out = Tensor::f_empty([n, inter], (gu.kind(), gu.device()))?;
    for _ in 0..launches(Stage::Silu) {
        ffi::silu_mul(gu, &out)?;
    }
    Ok(out)
}

/// The ops on the CPU in float32 (`fused/cpu.rs`).
pub(crate) mod cpu;
pub(crate) use cpu::silu_mul_slice;

/// Checks and timings against libtorch for `cuda_check` (`fused/check.rs`).
mod check;
pub use check::{check_against_libtorch, time_gemv};

/// Bindings to `csrc/fused.cpp` (`fused/ffi.rs`).
#[cfg(gyre_cuda_graphs)]
#[allow(unsafe_code)]
#[path = "fused/ffi.rs"]
mod ffi;

#[cfg(not(gyre_cuda_graphs))]
mod ffi {
    use tch::Tensor;

    use crate::EngineError;

    fn none() -> EngineError {
        EngineError::Step("built without the CUDA headers: no fused kernels".into())
    }

    pub(super) fn init() -> Result<(), EngineError> {
        Err(none())
    }

    pub(super) fn add_rms_norm(
        _: &Tensor,
        _: Option<&Tensor>,
        _: &Tensor,
        _: Option<&Tensor>,
        _: &Tensor,
        _: f64,
    ) -> Result<(), EngineError> {
        Err(none())
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn rope_kv(
        _: &Tensor,
        _: &Tensor,
        _: &Tensor,
        _: &Tensor,
        _: &Tensor,
        _: &Tensor,
        _: &Tensor,
        _: i64,
        _: i64,
        _: i64,
    ) -> Result<(), EngineError> {
        Err(none())
    }

    pub(super) fn silu_mul(_: &Tensor, _: &Tensor) -> Result<(), EngineError> {
        Err(none())
    }

    pub(super) fn sms() -> i64 {
        0
    }

    pub(super) fn gemv(
        _: &Tensor,
        _: &Tensor,
        _: Option<&Tensor>,
        _: &Tensor,
    ) -> Result<(), EngineError> {
        Err(none())
    }

    pub(super) fn gemv_silu(_: &Tensor, _: &Tensor, _: &Tensor) -> Result<(), EngineError> {
        Err(none())
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn decode_attention(
        _: &Tensor,
        _: &Tensor,
        _: &Tensor,
        _: &Tensor,
        _: &Tensor,
        _: Option<&Tensor>,
        _: &Tensor,
        _: &Tensor,
        _: &Tensor,
        _: i64,
        _: i64,
        _: f64,
    ) -> Result<(), EngineError> {
        Err(none())
    }
}

#[cfg(test)]
mod twice_tests {
    /// `GYRE_TWICE` names stages by name, in any order, `all` naming
    /// every one; an unknown name is reported and adds nothing.
    #[test]
    fn twice_names_stages() {
        use super::{Stage, twice_mask};
        assert_eq!(twice_mask(""), (0, vec![]));
        assert_eq!(twice_mask("norm").0, Stage::Norm as u32);
        assert_eq!(
            twice_mask(" attn, gemv ,").0,
            Stage::Attn as u32 | Stage::Gemv as u32
        );
        let every = [
            Stage::Norm,
            Stage::Rope,
            Stage::Attn,
            Stage::Silu,
            Stage::Gemv,
        ];
        assert_eq!(
            twice_mask("all").0,
            every.iter().fold(0, |a, s| a | *s as u32)
        );
        assert_eq!(
            twice_mask("silu,rotary"),
            (Stage::Silu as u32, vec!["rotary".to_string()])
        );
    }
}

#[cfg(all(test, gyre_cuda_graphs))]
mod tests {
    /// The kernels' source compiles with NVRTC for the GPUs gyre's CUDA
    /// path is measured on (Hopper) and an older one (Ampere), with no GPU
    /// present: a syntax or type error in the CUDA source fails here, on
    /// the CPU machines, not first on a GPU machine.
    #[test]
    fn kernels_compile_with_nvrtc() {
        for arch in [80, 90] {
            super::ffi::compile(arch).unwrap_or_else(|e| panic!("sm_{arch}: {e}"));
        }
    }

    /// The split planner gives every block at least one round of keys,
    /// covers every key, and splits more when the GPU would otherwise idle.
    #[test]
    fn attention_splits_cover_the_keys() {
        for (seqs, kvh, max_k) in [
            (1, 8, 256),
            (1, 8, 2048),
            (8, 8, 256),
            (256, 8, 4096),
            (3, 3, 1),
        ] {
            for min_chunk in [1, 32, 33, 100, 256, 5000] {
                let (chunk, splits) = super::attn_plan(seqs, kvh, max_k, 132, min_chunk);
                assert!(chunk >= 32 && chunk % 32 == 0, "{chunk}");
                assert!(chunk >= min_chunk, "{chunk} < {min_chunk}");
                assert!(chunk * splits >= max_k && chunk * (splits - 1) < max_k);
            }
        }
        assert_eq!(super::attn_plan(1, 8, 256, 132, 32), (32, 8));
        assert_eq!(super::attn_plan(1, 8, 2048, 132, 32), (64, 32));
        assert_eq!(super::attn_plan(256, 8, 4096, 132, 32).1, 1);
        assert_eq!(super::attn_plan(1, 8, 256, 132, 100), (128, 2));
        assert_eq!(super::attn_plan(1, 8, 256, 132, 256), (256, 1));
    }

    /// Without a CUDA device loading fails (and the callers keep
    /// libtorch's ops) rather than crashing.
    #[test]
    fn not_loaded_without_a_device() {
        if tch::Cuda::is_available() {
            return;
        }
        super::prepare();
        assert!(!super::READY.load(std::sync::atomic::Ordering::Relaxed));
    }
}
