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

/// Not turned off by `GYRE_FUSED_KERNELS=0` or [`set_enabled`].
fn enabled() -> bool {
    static ENV_OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    ENABLED.load(Ordering::Relaxed)
        && !*ENV_OFF.get_or_init(|| std::env::var("GYRE_FUSED_KERNELS").is_ok_and(|v| v == "0"))
}

/// Whether [`cpu`]'s ops can take `t`: enabled, a contiguous float32 CPU
/// tensor.
fn cpu_usable(t: &Tensor) -> bool {
    enabled() && t.device() == tch::Device::Cpu && t.kind() == Kind::Float && t.is_contiguous()
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
        Some(Path::Cpu) => cpu::rope_kv(
            qkv, cos, signed_sin, slots, k_cache, v_cache, heads, kv_heads, head_dim,
        )
        .map(Some),
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

/// Most rows of `x` the matrix-vector kernel takes (`GYRE_GEMV_MAX_ROWS`,
/// 0 to 8; default 1); larger batches go to cuBLAS. On an H100 with the
/// Llama-3-8B shape the kernel beat cuBLAS at one row (6.28 vs 6.55 ms a
/// decode step) and lost at two (7.04 vs 6.57), four (8.86 vs 6.63) and
/// eight (14.4 vs 6.86): each lane re-reads every row of x from L1 per
/// weight load.
fn gemv_max_rows() -> i64 {
    static MAX: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| {
        std::env::var("GYRE_GEMV_MAX_ROWS")
            .ok()
            .and_then(|v| v.parse::<i64>().ok())
            .map_or(1, |v| v.clamp(0, 8))
    })
}

/// `x` [m, k] times `w` [n, k] transposed (+ `bias` [n]) with gyre's
/// matrix-vector kernel, for decode steps of a few rows on CUDA in bf16:
/// [m, n], or None when the kernel does not take these tensors (the caller
/// runs cuBLAS). `GYRE_GEMV=0` turns it off.
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
    ffi::gemv(x, w, bias, &y)?;
    Ok(Some(y))
}

/// How a decode attention call splits each sequence's keys: (keys per
/// split, splits), aiming at two blocks per multiprocessor. A block scores
/// 32 keys a round (4 warps of 8).
fn attn_plan(seqs: i64, kv_heads: i64, max_k: i64, sms: i64) -> (i64, i64) {
    const ROUND: i64 = 32;
    let max_k = max_k.max(1);
    let per = ROUND * 2 * sms.max(1);
    let rounds = ((seqs * kv_heads * max_k + per - 1) / per).max(1);
    let chunk = rounds * ROUND;
    (chunk, (max_k + chunk - 1) / chunk)
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
    let (chunk, splits) = attn_plan(seqs, ks[1], max_k, ffi::sms());
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
    ffi::decode_attention(
        q, k_cache, v_cache, gather, cu_k, used, &out, &part, &ml, chunk, splits, scale,
    )?;
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
    ffi::add_rms_norm(x, delta, w, delta.map(|_| &x_out), &h, eps)?;
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
    ffi::rope_kv(
        qkv, cos, signed_sin, slots, &q, k_cache, v_cache, heads, kv_heads, head_dim,
    )?;
    Ok(q)
}

/// `silu(gate) * up` of `gu` [n, 2 inter] (gate columns first), rounded
/// as transformers rounds it: [n, inter].
fn cuda_silu_mul(gu: &Tensor, inter: i64) -> Result<Tensor, EngineError> {
    let n = gu.size()[0];
    let out = Tensor::f_empty([n, inter], (gu.kind(), gu.device()))?;
    ffi::silu_mul(gu, &out)?;
    Ok(out)
}

/// Runs each kernel on seeded random bf16 tensors on CUDA beside the
/// libtorch ops it replaces (transformers' arithmetic) and returns, per
/// output, the largest difference: `(name, max |a - b| / max |b|)`. The
/// residual sum, SiLU x up and the rotary outputs should be identical (0);
/// the norm may differ by a bf16 step where its float32 sum of squares is
/// added in another order. For `cuda_check` on a GPU machine.
pub fn check_against_libtorch() -> Result<Vec<(String, f64)>, EngineError> {
    use tch::Device;
    let dev = Device::Cuda(0);
    let opts = (Kind::BFloat16, dev);
    prepare();
    if !READY.load(Ordering::Relaxed) {
        return Err(EngineError::Step("fused kernels not loaded".into()));
    }
    let rel = |a: &Tensor, b: &Tensor| -> f64 {
        let (a, b) = (a.to_kind(Kind::Float), b.to_kind(Kind::Float));
        (&a - &b).abs().max().double_value(&[]) / b.abs().max().double_value(&[]).max(1e-12)
    };
    tch::manual_seed(7);
    let mut out = Vec::new();
    // SiLU(gate) x up.
    let inter = 1000;
    let gu = (Tensor::f_randn([7, 2 * inter], opts)? * 3.0).f_contiguous()?;
    let reference = gu
        .f_narrow(1, 0, inter)?
        .f_silu()?
        .f_mul(&gu.f_narrow(1, inter, inter)?)?;
    out.push((
        "silu_mul".into(),
        rel(&cuda_silu_mul(&gu, inter)?, &reference),
    ));
    // Residual add + RMSNorm, against LlamaRMSNorm's ops.
    let hidden = 2048;
    let x = Tensor::f_randn([5, hidden], opts)? * 4.0;
    let d = Tensor::f_randn([5, hidden], opts)?;
    let w = Tensor::f_randn([hidden], opts)?;
    let eps = 1e-5;
    let sum = x.f_add(&d)?;
    let f = sum.f_to_kind(Kind::Float)?;
    let var = f
        .f_pow_tensor_scalar(2)?
        .f_mean_dim(-1, true, Kind::Float)?;
    let normed = f
        .f_mul(&var.f_add_scalar(eps)?.f_rsqrt()?)?
        .f_to_kind(Kind::BFloat16)?;
    let reference = w.f_mul(&normed)?;
    let (got_x, got_h) = cuda_add_rms_norm(&x, Some(&d), &w, eps)?;
    out.push(("residual add".into(), rel(&got_x, &sum)));
    out.push(("rms_norm (after add)".into(), rel(&got_h, &reference)));
    let (_, alone) = cuda_add_rms_norm(&sum, None, &w, eps)?;
    out.push(("rms_norm (alone)".into(), rel(&alone, &reference)));
    // Rotary embedding + KV write, against the rope ops and index_copy_.
    let (heads, kv_heads, hd, n) = (8, 2, 64, 6);
    let rope =
        crate::layers::rope::Rope::new(10000.0, &crate::config::RopeScaling::None, hd, 4096, dev)?;
    let pos = Tensor::from_slice(&[0i64, 1, 17, 250, 1000, 4095]).f_to_device(dev)?;
    let at = rope.at(&pos)?;
    let qkv = Tensor::f_randn([n, (heads + 2 * kv_heads) * hd], opts)? * 2.0;
    let slots = Tensor::from_slice(&[3i64, 9, 0, 31, 12, 20]).f_to_device(dev)?;
    let (q, k, v) = at.apply_qkv(&qkv, heads, kv_heads, hd)?;
    let (rk, rv) = (
        Tensor::f_zeros([32, kv_heads, hd], opts)?,
        Tensor::f_zeros([32, kv_heads, hd], opts)?,
    );
    let _ = rk.shallow_clone().f_index_copy_(0, &slots, &k)?;
    let _ = rv.shallow_clone().f_index_copy_(0, &slots, &v)?;
    let (gk, gv) = (
        Tensor::f_zeros([32, kv_heads, hd], opts)?,
        Tensor::f_zeros([32, kv_heads, hd], opts)?,
    );
    let (cos, ssin) = at.tables(Kind::BFloat16)?;
    let gq = cuda_rope_kv(&qkv, &cos, &ssin, &slots, &gk, &gv, heads, kv_heads, hd)?;
    out.push(("rope queries".into(), rel(&gq, &q)));
    out.push(("rope keys in the pool".into(), rel(&gk, &rk)));
    out.push(("values in the pool".into(), rel(&gv, &rv)));
    // The matrix-vector kernel against cuBLAS (F.linear): float32 sums in
    // another order, so a result may round one bf16 step apart.
    for (m, n, k, with_bias) in [
        (1, 1000, 4096, false),
        (3, 777, 2048, true),
        (8, 512, 14336, false),
    ] {
        let x = Tensor::f_randn([m, k], opts)?;
        let w = Tensor::f_randn([n, k], opts)? * 0.05;
        let b = Tensor::f_randn([n], opts)?;
        let bias = with_bias.then_some(&b);
        let reference = x.f_linear(&w, bias)?;
        let got = Tensor::f_empty([m, n], opts)?;
        ffi::gemv(&x, &w, bias, &got)?;
        out.push((format!("gemv {m}x{k} . {n}x{k}"), rel(&got, &reference)));
    }
    // Decode attention over the pool in place against flash attention over
    // the gathered keys: float32 sums in another order.
    for (heads, kv_heads, hd) in [(32i64, 8i64, 128i64), (9, 3, 64)] {
        let slots = 4096;
        let kc = Tensor::f_randn([slots, kv_heads, hd], opts)?;
        let vc = Tensor::f_randn([slots, kv_heads, hd], opts)?;
        let lens = [1i64, 77, 700, 2500];
        let q = Tensor::f_randn([lens.len() as i64, heads, hd], opts)? * 2.0;
        let perm = Tensor::f_randperm(slots, (Kind::Int64, dev))?;
        let mut gathers = Vec::new();
        let mut at = 0;
        for &l in &lens {
            gathers.push(perm.f_narrow(0, at, l)?);
            at = (at + 131) % (slots - 2600);
        }
        let gather = Tensor::f_cat(&gathers, 0)?;
        let spans: Vec<(i64, i64)> = lens.iter().map(|&l| (1, l)).collect();
        let varlen = crate::flash::Varlen::new(&spans, dev)?;
        let reference = varlen.attend(
            &q,
            &kc.f_index_select(0, &gather)?,
            &vc.f_index_select(0, &gather)?,
        )?;
        let max_k = *lens.iter().max().unwrap_or(&1);
        let got = decode_attention(&q, &kc, &vc, &gather, varlen.cu_k(), None, max_k)?
            .ok_or_else(|| EngineError::Step("decode attention declined".into()))?;
        out.push((
            format!("decode attention {heads}/{kv_heads} heads x {hd}"),
            rel(&got, &reference),
        ));
        // Fixed stride, as a decode graph packs keys: each sequence uses
        // the first `used` of its `stride` rows.
        let stride = 4096i64;
        let mut packed = Vec::new();
        for g in &gathers {
            let pad = Tensor::f_zeros([stride - g.size()[0]], (Kind::Int64, dev))?;
            packed.push(Tensor::f_cat(&[g.shallow_clone(), pad], 0)?);
        }
        let packed = Tensor::f_cat(&packed, 0)?;
        let used: Vec<i32> = lens.iter().map(|&l| l as i32).collect();
        let used = Tensor::from_slice(&used).f_to_device(dev)?;
        let fixed = crate::flash::Varlen::fixed_stride(lens.len() as i64, stride, used)?;
        let got = decode_attention(
            &q,
            &kc,
            &vc,
            &packed,
            fixed.cu_k(),
            fixed.seqused_k(),
            stride,
        )?
        .ok_or_else(|| EngineError::Step("decode attention declined".into()))?;
        out.push((
            format!("decode attention {heads}/{kv_heads} heads x {hd}, fixed stride"),
            rel(&got, &reference),
        ));
    }
    Ok(out)
}

/// Device time of the matrix-vector kernel against cuBLAS (`F.linear`)
/// on the Llama-3-8B shape's projections at batch 1: `(name, weight MB,
/// cuBLAS us, gyre us)`, each the mean of back-to-back calls cycling
/// through copies of the weight larger than the L2 cache together. For
/// `cuda_check` on a GPU machine (eager calls: the smallest products are
/// partly bound by the host's launches).
pub fn time_gemv() -> Result<Vec<(String, f64, f64, f64)>, EngineError> {
    use tch::Device;
    let dev = Device::Cuda(0);
    let opts = (Kind::BFloat16, dev);
    prepare();
    let mut out = Vec::new();
    for (name, n, k) in [
        ("q/k/v", 6144i64, 4096i64),
        ("o", 4096, 4096),
        ("gate/up", 28672, 4096),
        ("down", 4096, 14336),
        ("vocabulary", 128256, 4096),
    ] {
        let mb = (n * k * 2) as f64 / 1e6;
        let copies = ((200.0 / mb).ceil() as usize).max(2);
        let ws: Vec<Tensor> = (0..copies)
            .map(|_| Tensor::f_randn([n, k], opts))
            .collect::<Result<_, _>>()?;
        let x = Tensor::f_randn([1, k], opts)?;
        let iters = 60;
        let time = |f: &dyn Fn(&Tensor) -> Result<Tensor, EngineError>| {
            let run = || -> Result<f64, EngineError> {
                tch::Cuda::synchronize(0);
                let t = std::time::Instant::now();
                for i in 0..iters {
                    drop(f(&ws[i % copies])?);
                }
                tch::Cuda::synchronize(0);
                Ok(t.elapsed().as_secs_f64() * 1e6 / iters as f64)
            };
            run()?;
            run()
        };
        let cublas = time(&|w| Ok(x.f_linear::<Tensor>(w, None)?))?;
        let gyre = time(&|w| {
            let y = Tensor::f_empty([1, n], opts)?;
            ffi::gemv(&x, w, None, &y)?;
            Ok(y)
        })?;
        out.push((name.to_string(), mb, cublas, gyre));
    }
    Ok(out)
}

/// The same ops on the CPU in float32, over the tensors' memory (the
/// dispatchers above check [`cpu_usable`]). Each computes what the libtorch ops it
/// replaces compute: the rotary outputs and the copies into the pool bit
/// for bit; the norm's sum of squares in float64 (libtorch sums in float32,
/// in another order); SiLU with the platform's `exp`.
mod cpu {
    use tch::Tensor;

    use crate::EngineError;
    use crate::attn::f32_view;

    fn rows_of(x: &Tensor) -> (usize, usize) {
        let width = x.size().last().copied().unwrap_or(0).max(0) as usize;
        (x.numel().checked_div(width).unwrap_or(0), width)
    }

    /// [`super::cuda_add_rms_norm`]'s arithmetic on the CPU in float32.
    pub(crate) fn add_rms_norm(
        x: &Tensor,
        delta: Option<&Tensor>,
        w: &Tensor,
        eps: f64,
    ) -> Result<(Tensor, Tensor), EngineError> {
        let (rows, hidden) = rows_of(x);
        let (xs, ws) = (f32_view(x)?, f32_view(w)?);
        let ds = delta.map(f32_view).transpose()?;
        if ws.len() != hidden || ds.is_some_and(|d| d.len() != xs.len()) {
            return Err(EngineError::Step("rms_norm: shapes do not agree".into()));
        }
        let mut sum = ds.map(|_| vec![0f32; xs.len()]);
        let mut h = vec![0f32; xs.len()];
        for r in 0..rows {
            let span = r * hidden..(r + 1) * hidden;
            let row: &[f32] = match (&mut sum, ds) {
                (Some(out), Some(d)) => {
                    let o = &mut out[span.clone()];
                    for ((o, a), b) in o.iter_mut().zip(&xs[span.clone()]).zip(&d[span.clone()]) {
                        *o = a + b;
                    }
                    o
                }
                _ => &xs[span.clone()],
            };
            let ss: f64 = row.iter().map(|&v| f64::from(v * v)).sum();
            let var = (ss / hidden as f64) as f32;
            let inv = 1.0 / (var + eps as f32).sqrt();
            for ((o, &v), &wi) in h[span].iter_mut().zip(row).zip(ws) {
                *o = wi * (v * inv);
            }
        }
        let shape = x.size();
        let h = Tensor::from_slice(&h).f_view(shape.as_slice())?;
        let x_out = match sum {
            Some(s) => Tensor::from_slice(&s).f_view(shape.as_slice())?,
            None => x.shallow_clone(),
        };
        Ok((x_out, h))
    }

    /// [`super::cuda_rope_kv`] on the CPU: queries returned, keys and values
    /// copied into the pool layer `k_cache`, `v_cache` at `slots`.
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
    ) -> Result<Tensor, EngineError> {
        let (n, width) = rows_of(qkv);
        let (h, kvh, d) = (heads as usize, kv_heads as usize, head_dim as usize);
        let (a, c, s) = (f32_view(qkv)?, f32_view(cos)?, f32_view(signed_sin)?);
        let slots: Vec<i64> = Vec::<i64>::try_from(slots)?;
        let pool_rows = k_cache.size().first().copied().unwrap_or(0);
        if width != (h + 2 * kvh) * d
            || c.len() != n * d
            || s.len() != c.len()
            || slots.len() != n
            || d % 2 != 0
            || k_cache.size() != [pool_rows, kv_heads, head_dim]
            || v_cache.size() != k_cache.size()
            || slots.iter().any(|&sl| sl < 0 || sl >= pool_rows)
        {
            return Err(EngineError::Step("rope_kv: shapes do not agree".into()));
        }
        let (kp, vp) = (pool_ptr(k_cache)?, pool_ptr(v_cache)?);
        let half = d / 2;
        let mut q = vec![0f32; n * h * d];
        let mut rotated = vec![0f32; d];
        for t in 0..n {
            let row = &a[t * width..(t + 1) * width];
            let (ct, st) = (&c[t * d..(t + 1) * d], &s[t * d..(t + 1) * d]);
            let base = slots[t] as usize * kvh * d;
            for head in 0..h + 2 * kvh {
                let x = &row[head * d..(head + 1) * d];
                let out: &[f32] = if head < h + kvh {
                    for i in 0..d {
                        let partner = if i < half { x[i + half] } else { x[i - half] };
                        rotated[i] = x[i] * ct[i] + partner * st[i];
                    }
                    &rotated
                } else {
                    x
                };
                if head < h {
                    q[(t * h + head) * d..(t * h + head + 1) * d].copy_from_slice(out);
                    continue;
                }
                let (dst, kv) = if head < h + kvh {
                    (kp, head - h)
                } else {
                    (vp, head - h - kvh)
                };
                #[allow(unsafe_code)]
                // SAFETY: `dst` is the data of a contiguous float32 CPU
                // tensor [pool_rows, kv_heads, head_dim] (checked), slot <
                // pool_rows and kv < kv_heads, so the d floats written lie
                // inside it; the pool is reached through `&mut KvPool` by
                // the caller, so nothing reads it meanwhile.
                unsafe {
                    std::ptr::copy_nonoverlapping(out.as_ptr(), dst.add(base + kv * d), d);
                }
            }
        }
        Ok(Tensor::from_slice(&q).f_view([n as i64, heads, head_dim])?)
    }

    fn pool_ptr(t: &Tensor) -> Result<*mut f32, EngineError> {
        f32_view(t)?;
        Ok(t.data_ptr().cast::<f32>())
    }

    /// [`super::cuda_silu_mul`] on the CPU.
    pub(crate) fn silu_mul(gu: &Tensor, inter: i64) -> Result<Tensor, EngineError> {
        let (n, width) = rows_of(gu);
        let i = inter as usize;
        if width != 2 * i {
            return Err(EngineError::Step("silu_mul: shapes do not agree".into()));
        }
        let a = f32_view(gu)?;
        let mut out = vec![0f32; n * i];
        for (r, o) in out.chunks_mut(i.max(1)).enumerate().take(n) {
            let (g, u) = a[r * width..(r + 1) * width].split_at(i);
            for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
                *o = g / (1.0 + (-g).exp()) * u;
            }
        }
        Ok(Tensor::from_slice(&out).f_view([n as i64, inter])?)
    }

    #[cfg(test)]
    mod tests {
        use tch::{Device, Kind, Tensor};

        fn rel(a: &Tensor, b: &Tensor) -> f64 {
            (a - b).abs().max().double_value(&[]) / b.abs().max().double_value(&[]).max(1e-12)
        }

        /// Each op against the libtorch ops it replaces: rotary outputs
        /// and pool copies identical, the norm and SiLU within a few
        /// float32 steps.
        #[test]
        fn cpu_ops_match_libtorch() {
            tch::manual_seed(3);
            let opts = (Kind::Float, Device::Cpu);
            let (n, hidden, eps) = (5, 96, 1e-5);
            let x = Tensor::randn([n, hidden], opts) * 3.0;
            let d = Tensor::randn([n, hidden], opts);
            let w = Tensor::randn([hidden], opts);
            let sum = &x + &d;
            let var = sum.pow_tensor_scalar(2).mean_dim(-1, true, Kind::Float);
            let reference = &w * (&sum * (var + eps).rsqrt());
            let (got_x, got_h) = super::add_rms_norm(&x, Some(&d), &w, eps).expect("norm");
            assert_eq!(got_x, sum);
            assert!(
                rel(&got_h, &reference) < 1e-6,
                "{}",
                rel(&got_h, &reference)
            );
            let (same, alone) = super::add_rms_norm(&sum, None, &w, eps).expect("norm");
            assert_eq!(same, sum);
            assert!(rel(&alone, &reference) < 1e-6);

            let inter = 40;
            let gu = Tensor::randn([3, 2 * inter], opts) * 4.0;
            let reference = gu.narrow(1, 0, inter).silu() * gu.narrow(1, inter, inter);
            let got = super::silu_mul(&gu, inter).expect("silu");
            assert!(rel(&got, &reference) < 1e-6, "{}", rel(&got, &reference));

            let (heads, kvh, hd) = (4i64, 2i64, 8i64);
            let rope = crate::layers::rope::Rope::new(
                10000.0,
                &crate::config::RopeScaling::None,
                hd,
                64,
                Device::Cpu,
            )
            .expect("rope");
            let pos = Tensor::from_slice(&[0i64, 5, 63]);
            let at = rope.at(&pos).expect("at");
            let qkv = Tensor::randn([3, (heads + 2 * kvh) * hd], opts);
            let slots = Tensor::from_slice(&[7i64, 0, 12]);
            let (q, k, v) = at.apply_qkv(&qkv, heads, kvh, hd).expect("rope");
            let rk = Tensor::zeros([16, kvh, hd], opts);
            let rv = Tensor::zeros([16, kvh, hd], opts);
            let _ = rk.shallow_clone().index_copy_(0, &slots, &k);
            let _ = rv.shallow_clone().index_copy_(0, &slots, &v);
            let (gk, gv) = (
                Tensor::zeros([16, kvh, hd], opts),
                Tensor::zeros([16, kvh, hd], opts),
            );
            let (cos, ssin) = at.tables(Kind::Float).expect("tables");
            let got = super::rope_kv(&qkv, &cos, &ssin, &slots, &gk, &gv, heads, kvh, hd)
                .expect("rope_kv");
            assert_eq!(got, q.contiguous());
            assert_eq!(gk, rk);
            assert_eq!(gv, rv);
            // A slot outside the pool is an error, not a write.
            let bad = Tensor::from_slice(&[7i64, 0, 16]);
            assert!(super::rope_kv(&qkv, &cos, &ssin, &bad, &gk, &gv, heads, kvh, hd).is_err());
        }
    }
}

#[cfg(gyre_cuda_graphs)]
#[allow(unsafe_code)]
mod ffi {
    use std::ffi::{CStr, c_char, c_int};

    use tch::Tensor;
    use torch_sys::C_tensor;

    use crate::EngineError;

    unsafe extern "C" {
        #[cfg(test)]
        fn gyre_fused_compile(arch: c_int, err: *mut c_char, len: usize) -> c_int;
        fn gyre_fused_init(err: *mut c_char, len: usize) -> c_int;
        fn gyre_fused_add_rms_norm(
            x: *const C_tensor,
            delta: *const C_tensor,
            w: *const C_tensor,
            x_out: *const C_tensor,
            h: *const C_tensor,
            eps: f64,
            err: *mut c_char,
            len: usize,
        ) -> c_int;
        fn gyre_fused_rope_kv(
            qkv: *const C_tensor,
            cos: *const C_tensor,
            ssin: *const C_tensor,
            slots: *const C_tensor,
            q_out: *const C_tensor,
            k_cache: *const C_tensor,
            v_cache: *const C_tensor,
            heads: i64,
            kv_heads: i64,
            head_dim: i64,
            err: *mut c_char,
            len: usize,
        ) -> c_int;
        fn gyre_fused_silu_mul(
            gu: *const C_tensor,
            out: *const C_tensor,
            err: *mut c_char,
            len: usize,
        ) -> c_int;
        fn gyre_fused_sms() -> c_int;
        fn gyre_fused_gemv(
            x: *const C_tensor,
            w: *const C_tensor,
            bias: *const C_tensor,
            y: *const C_tensor,
            err: *mut c_char,
            len: usize,
        ) -> c_int;
        fn gyre_fused_decode_attention(
            q: *const C_tensor,
            kc: *const C_tensor,
            vc: *const C_tensor,
            gather: *const C_tensor,
            cu_k: *const C_tensor,
            used: *const C_tensor,
            out: *const C_tensor,
            part: *const C_tensor,
            ml: *const C_tensor,
            chunk: i64,
            splits: i64,
            scale: f64,
            err: *mut c_char,
            len: usize,
        ) -> c_int;
    }

    fn call(what: &str, f: impl FnOnce(*mut c_char, usize) -> c_int) -> Result<(), EngineError> {
        let mut err = vec![0 as c_char; 2048];
        if f(err.as_mut_ptr(), err.len()) == 0 {
            return Ok(());
        }
        // SAFETY: the C side wrote a NUL-terminated message into `err`.
        let msg = unsafe { CStr::from_ptr(err.as_ptr()) }.to_string_lossy();
        Err(EngineError::Step(format!("fused {what}: {msg}")))
    }

    fn ptr(t: &Tensor) -> *const C_tensor {
        t.as_ptr()
    }

    /// Compiles the kernels for `sm_<arch>` without a GPU.
    #[cfg(test)]
    pub(super) fn compile(arch: i32) -> Result<(), EngineError> {
        // SAFETY: plain C call writing at most `n` bytes into `e`.
        call("compile", |e, n| unsafe { gyre_fused_compile(arch, e, n) })
    }

    pub(super) fn init() -> Result<(), EngineError> {
        // SAFETY: as above.
        call("init", |e, n| unsafe { gyre_fused_init(e, n) })
    }

    pub(super) fn add_rms_norm(
        x: &Tensor,
        delta: Option<&Tensor>,
        w: &Tensor,
        x_out: Option<&Tensor>,
        h: &Tensor,
        eps: f64,
    ) -> Result<(), EngineError> {
        let null = std::ptr::null::<C_tensor>();
        // SAFETY: the tensors outlive the call; the C side checks kinds,
        // devices and contiguity before reading their pointers.
        call("add_rms_norm", |e, n| unsafe {
            gyre_fused_add_rms_norm(
                ptr(x),
                delta.map_or(null, ptr),
                ptr(w),
                x_out.map_or(null, ptr),
                ptr(h),
                eps,
                e,
                n,
            )
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn rope_kv(
        qkv: &Tensor,
        cos: &Tensor,
        ssin: &Tensor,
        slots: &Tensor,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        heads: i64,
        kv_heads: i64,
        head_dim: i64,
    ) -> Result<(), EngineError> {
        let width = qkv.size().last().copied().unwrap_or(0);
        let rows = |t: &Tensor| t.size().first().copied().unwrap_or(0);
        if width != (heads + 2 * kv_heads) * head_dim
            || cos.numel() != (rows(qkv) * head_dim) as usize
            || ssin.numel() != cos.numel()
            || rows(slots) != rows(qkv)
            || k.size().get(1..) != Some(&[kv_heads, head_dim][..])
            || v.size() != k.size()
        {
            return Err(EngineError::Step(
                "fused rope_kv: shapes do not agree".into(),
            ));
        }
        // SAFETY: as above; shapes checked here.
        call("rope_kv", |e, n| unsafe {
            gyre_fused_rope_kv(
                ptr(qkv),
                ptr(cos),
                ptr(ssin),
                ptr(slots),
                ptr(q),
                ptr(k),
                ptr(v),
                heads,
                kv_heads,
                head_dim,
                e,
                n,
            )
        })
    }

    pub(super) fn silu_mul(gu: &Tensor, out: &Tensor) -> Result<(), EngineError> {
        if gu.size().first() != out.size().first()
            || gu.size().last().copied() != out.size().last().map(|i| 2 * i)
        {
            return Err(EngineError::Step(
                "fused silu_mul: shapes do not agree".into(),
            ));
        }
        // SAFETY: as above.
        call("silu_mul", |e, n| unsafe {
            gyre_fused_silu_mul(ptr(gu), ptr(out), e, n)
        })
    }

    /// The device's multiprocessor count (0 before the kernels load).
    pub(super) fn sms() -> i64 {
        // SAFETY: reads a plain integer.
        i64::from(unsafe { gyre_fused_sms() })
    }

    pub(super) fn gemv(
        x: &Tensor,
        w: &Tensor,
        bias: Option<&Tensor>,
        y: &Tensor,
    ) -> Result<(), EngineError> {
        let null = std::ptr::null::<C_tensor>();
        // SAFETY: as above; the C side checks shapes and alignment.
        call("gemv", |e, n| unsafe {
            gyre_fused_gemv(ptr(x), ptr(w), bias.map_or(null, ptr), ptr(y), e, n)
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn decode_attention(
        q: &Tensor,
        kc: &Tensor,
        vc: &Tensor,
        gather: &Tensor,
        cu_k: &Tensor,
        used: Option<&Tensor>,
        out: &Tensor,
        part: &Tensor,
        ml: &Tensor,
        chunk: i64,
        splits: i64,
        scale: f64,
    ) -> Result<(), EngineError> {
        let null = std::ptr::null::<C_tensor>();
        // SAFETY: as above; the C side checks kinds, shapes and sizes.
        call("decode_attention", |e, n| unsafe {
            gyre_fused_decode_attention(
                ptr(q),
                ptr(kc),
                ptr(vc),
                ptr(gather),
                ptr(cu_k),
                used.map_or(null, ptr),
                ptr(out),
                ptr(part),
                ptr(ml),
                chunk,
                splits,
                scale,
                e,
                n,
            )
        })
    }
}

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
            let (chunk, splits) = super::attn_plan(seqs, kvh, max_k, 132);
            assert!(chunk >= 32 && chunk % 32 == 0, "{chunk}");
            assert!(chunk * splits >= max_k && chunk * (splits - 1) < max_k);
        }
        assert_eq!(super::attn_plan(1, 8, 256, 132), (32, 8));
        assert_eq!(super::attn_plan(1, 8, 2048, 132), (64, 32));
        assert_eq!(super::attn_plan(256, 8, 4096, 132).1, 1);
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
