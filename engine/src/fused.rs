//! Fused CUDA kernels for bf16 decode steps (`csrc/fused.cpp`, compiled at
//! run time with NVRTC): residual add + RMSNorm, rotary embedding of the
//! query and key heads + the paged KV write, and SiLU(gate) x up.
//!
//! A decode step at batch 1 reads every weight once; besides the weights'
//! matrix-vector products, each layer ran about twenty small libtorch
//! kernels of 1-3 us each (inside a CUDA graph too). These replace about a
//! dozen of them per layer (Llama-3-8B shape on an H100: 141.0 -> 146.9
//! tok/s; the README's GPU section). Each rounds to bf16 exactly where transformers'
//! eager code rounds (the norm's float32 sum of squares is added in
//! another order, which can move a rounding by one bf16 step).
//!
//! They are used on CUDA with bf16 tensors once [`prepare`] has compiled
//! and loaded them (the backend does, at model load); `GYRE_FUSED_KERNELS=0`
//! turns them off (for comparisons), as does a failed compile (with a
//! warning). Elsewhere the callers run their libtorch ops.

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
    ONCE.call_once(|| {
        if std::env::var("GYRE_FUSED_KERNELS").is_ok_and(|v| v == "0") {
            ENABLED.store(false, Ordering::Relaxed);
        }
        match ffi::init() {
            Ok(()) => READY.store(true, Ordering::Relaxed),
            Err(e) => {
                tracing::warn!(error = %e, "fused CUDA kernels unavailable; using libtorch's ops")
            }
        }
    });
}

/// Turns the fused kernels on or off for later steps (comparisons).
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Whether the kernels can take `t`: loaded, enabled, a contiguous bf16
/// CUDA tensor.
pub(crate) fn usable(t: &Tensor) -> bool {
    READY.load(Ordering::Relaxed)
        && ENABLED.load(Ordering::Relaxed)
        && t.device().is_cuda()
        && t.kind() == Kind::BFloat16
        && t.is_contiguous()
}

/// `x + delta` (rounded to bf16) and RMSNorm of it with weight `w`, as
/// transformers' LlamaRMSNorm; without `delta`, RMSNorm of `x` (the first
/// result is then `x` itself). `x`, `delta` [rows, hidden].
pub(crate) fn add_rms_norm(
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
    let n = qkv.size()[0];
    let q = Tensor::f_empty([n, heads, head_dim], (qkv.kind(), qkv.device()))?;
    ffi::rope_kv(
        qkv, cos, signed_sin, slots, &q, k_cache, v_cache, heads, kv_heads, head_dim,
    )?;
    Ok(q)
}

/// `silu(gate) * up` of `gu` [n, 2 inter] (gate columns first), rounded
/// as transformers rounds it: [n, inter].
pub(crate) fn silu_mul(gu: &Tensor, inter: i64) -> Result<Tensor, EngineError> {
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
    out.push(("silu_mul".into(), rel(&silu_mul(&gu, inter)?, &reference)));
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
    let (got_x, got_h) = add_rms_norm(&x, Some(&d), &w, eps)?;
    out.push(("residual add".into(), rel(&got_x, &sum)));
    out.push(("rms_norm (after add)".into(), rel(&got_h, &reference)));
    let (_, alone) = add_rms_norm(&sum, None, &w, eps)?;
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
    let gq = rope_kv(&qkv, &cos, &ssin, &slots, &gk, &gv, heads, kv_heads, hd)?;
    out.push(("rope queries".into(), rel(&gq, &q)));
    out.push(("rope keys in the pool".into(), rel(&gk, &rk)));
    out.push(("values in the pool".into(), rel(&gv, &rv)));
    Ok(out)
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
            || cos.numel() != signed_numel(qkv, head_dim)
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

    fn signed_numel(qkv: &Tensor, head_dim: i64) -> usize {
        (qkv.size()[0] * head_dim) as usize
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
