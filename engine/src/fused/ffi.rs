//! The C++ side of the fused kernels (`csrc/fused.cpp`): compiling,
//! loading and launching them on the current CUDA stream.

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
    fn gyre_fused_gemv_silu(
        x: *const C_tensor,
        w: *const C_tensor,
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

pub(super) fn gemv_silu(x: &Tensor, w: &Tensor, y: &Tensor) -> Result<(), EngineError> {
    // SAFETY: as above; the C side checks shapes and alignment.
    call("gemv_silu", |e, n| unsafe {
        gyre_fused_gemv_silu(ptr(x), ptr(w), ptr(y), e, n)
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
