//! Flash attention over packed variable-length sequences on CUDA, through
//! `csrc/flash.cpp` (libtorch's `_flash_attention_forward`, which tch does
//! not bind).
//!
//! One call per layer covers every sequence of a step, prefill chunks and
//! decodes alike: the step's keys and values are gathered from the paged
//! pool into one packed tensor (torch 2.11's flash attention takes no block
//! table), and cumulative sequence lengths delimit the sequences.

use std::ffi::{CStr, c_char, c_int};

use tch::{Device, Kind, Tensor};
use torch_sys::C_tensor;

use crate::EngineError;

#[allow(unsafe_code)]
unsafe extern "C" {
    fn gyre_flash_varlen(
        q: *const C_tensor,
        k: *const C_tensor,
        v: *const C_tensor,
        cu_q: *const C_tensor,
        cu_k: *const C_tensor,
        seqused_k: *const C_tensor,
        max_q: i64,
        max_k: i64,
        scale: f64,
        causal: c_int,
        out: *mut *mut C_tensor,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
}

/// The packing of one step: where each sequence's queries and keys are.
pub(crate) struct Varlen {
    cu_q: Tensor,
    cu_k: Tensor,
    /// Keys each sequence uses of its span (int32; decode graphs).
    seqused_k: Option<Tensor>,
    max_q: i64,
    max_k: i64,
}

impl Varlen {
    /// `(queries, keys)` per sequence: its new tokens and all its positions.
    pub(crate) fn new(lens: &[(i64, i64)], device: Device) -> Result<Self, EngineError> {
        let (mut cu_q, mut cu_k) = (vec![0i32], vec![0i32]);
        let (mut max_q, mut max_k) = (0, 0);
        for &(q, k) in lens {
            if q > k {
                return Err(EngineError::Step(format!(
                    "{q} queries but only {k} keys in a sequence"
                )));
            }
            cu_q.push(cu_q[cu_q.len() - 1] + q as i32);
            cu_k.push(cu_k[cu_k.len() - 1] + k as i32);
            max_q = max_q.max(q);
            max_k = max_k.max(k);
        }
        Ok(Self {
            cu_q: Tensor::from_slice(&cu_q).f_to_device(device)?,
            cu_k: Tensor::from_slice(&cu_k).f_to_device(device)?,
            seqused_k: None,
            max_q,
            max_k,
        })
    }

    /// One query per sequence over keys packed at a fixed `stride`:
    /// sequence i's keys are rows `i * stride..` of the packed keys, of
    /// which it uses the first `seqused_k[i]` (int32 [sequences], on the
    /// device, filled in before each replay of a decode graph).
    pub(crate) fn fixed_stride(
        seqs: i64,
        stride: i64,
        seqused_k: Tensor,
    ) -> Result<Self, EngineError> {
        let device = seqused_k.device();
        let cu_q: Vec<i32> = (0..=seqs as i32).collect();
        let cu_k: Vec<i32> = (0..=seqs).map(|i| (i * stride) as i32).collect();
        Ok(Self {
            cu_q: Tensor::from_slice(&cu_q).f_to_device(device)?,
            cu_k: Tensor::from_slice(&cu_k).f_to_device(device)?,
            seqused_k: Some(seqused_k),
            max_q: 1,
            max_k: stride,
        })
    }

    /// Cumulative key counts (int32 [sequences + 1], on the device).
    pub(crate) fn cu_k(&self) -> &Tensor {
        &self.cu_k
    }

    /// Keys each sequence uses of its span, when packed at a fixed stride.
    pub(crate) fn seqused_k(&self) -> Option<&Tensor> {
        self.seqused_k.as_ref()
    }

    /// The most queries of any sequence (1: every sequence decodes).
    pub(crate) fn max_q(&self) -> i64 {
        self.max_q
    }

    /// The most keys of any sequence (a fixed-stride packing's stride).
    pub(crate) fn max_k(&self) -> i64 {
        self.max_k
    }

    /// Causal attention of packed `q` [total_q, heads, head_dim] over packed
    /// `k`, `v` [total_k, kv_heads, head_dim]; each sequence's queries are
    /// its last tokens. Returns [total_q, heads, head_dim].
    pub(crate) fn attend(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor, EngineError> {
        for t in [q, k, v] {
            if !matches!(t.kind(), Kind::BFloat16 | Kind::Half) || !t.device().is_cuda() {
                return Err(EngineError::Step(format!(
                    "flash attention needs bf16/fp16 CUDA tensors, got {:?} on {:?}",
                    t.kind(),
                    t.device()
                )));
            }
        }
        let scale = 1.0 / (q.size()[2] as f64).sqrt();
        let (q, k, v) = (q.f_contiguous()?, k.f_contiguous()?, v.f_contiguous()?);
        let mut out: *mut C_tensor = std::ptr::null_mut();
        let mut err = [0 as c_char; 512];
        #[allow(unsafe_code)]
        // SAFETY: every pointer is to a live tensor owned by this frame
        // (tch's `Tensor` is a pointer to a C++ `at::Tensor`, which is what
        // the C++ side dereferences); `out` receives a heap `at::Tensor`
        // that `from_ptr` takes ownership of; `err` is a writable buffer of
        // the length passed, NUL-terminated by the callee on failure.
        let rc = unsafe {
            gyre_flash_varlen(
                q.as_ptr(),
                k.as_ptr(),
                v.as_ptr(),
                self.cu_q.as_ptr(),
                self.cu_k.as_ptr(),
                self.seqused_k
                    .as_ref()
                    .map_or(std::ptr::null(), |t| t.as_ptr()),
                self.max_q,
                self.max_k,
                scale,
                1,
                &mut out,
                err.as_mut_ptr(),
                err.len(),
            )
        };
        if rc != 0 || out.is_null() {
            #[allow(unsafe_code)]
            // SAFETY: the callee NUL-terminated the buffer (it is zeroed).
            let msg = unsafe { CStr::from_ptr(err.as_ptr()) };
            return Err(EngineError::Step(format!(
                "flash attention: {}",
                msg.to_string_lossy().lines().next().unwrap_or("failed")
            )));
        }
        #[allow(unsafe_code)]
        // SAFETY: `out` is a fresh `at::Tensor*` allocated by the callee.
        Ok(unsafe { Tensor::from_ptr(out) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a machine without CUDA the entry point links, refuses CPU
    /// tensors with an error, and a libtorch failure comes back as an error
    /// rather than an exception.
    #[test]
    fn refuses_cpu_tensors_cleanly() {
        let vl = Varlen::new(&[(1, 3), (2, 2)], Device::Cpu).expect("varlen");
        assert_eq!((vl.max_q, vl.max_k), (2, 3));
        let q = Tensor::zeros([3, 2, 8], (Kind::BFloat16, Device::Cpu));
        let kv = Tensor::zeros([5, 1, 8], (Kind::BFloat16, Device::Cpu));
        let e = vl.attend(&q, &kv, &kv).expect_err("CPU tensors");
        assert!(e.to_string().contains("CUDA"), "{e}");
        assert!(Varlen::new(&[(3, 2)], Device::Cpu).is_err());
    }

    /// The C++ side turns a libtorch exception into an error: flash
    /// attention has no CPU kernel, so calling it on CPU tensors throws.
    #[test]
    #[allow(unsafe_code)]
    fn cpp_exceptions_become_errors() {
        let q = Tensor::zeros([1, 1, 8], (Kind::BFloat16, Device::Cpu));
        let cu = Tensor::from_slice(&[0i32, 1]);
        let mut out: *mut C_tensor = std::ptr::null_mut();
        let mut err = [0 as c_char; 256];
        // SAFETY: live tensors, a writable buffer of the given length.
        let rc = unsafe {
            gyre_flash_varlen(
                q.as_ptr(),
                q.as_ptr(),
                q.as_ptr(),
                cu.as_ptr(),
                cu.as_ptr(),
                std::ptr::null(),
                1,
                1,
                1.0,
                1,
                &mut out,
                err.as_mut_ptr(),
                err.len(),
            )
        };
        assert_eq!(rc, 1);
        assert!(out.is_null());
        // SAFETY: NUL-terminated by the callee.
        let msg = unsafe { CStr::from_ptr(err.as_ptr()) }.to_string_lossy();
        assert!(!msg.is_empty());
    }
}
