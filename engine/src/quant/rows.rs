//! A quantized weight as a GGUF file stores it: `n` rows (outputs) of `k`
//! values, each row `k / 32` ggml blocks. The loader reorders and stacks
//! rows in this form (undoing llama.cpp's q/k permutation, stacking q, k
//! and v) before the linear layer repacks it for the kernels.

use tch::Tensor;

use super::{Format, QK};
use crate::EngineError;

#[derive(Clone)]
pub(crate) struct QuantRows {
    fmt: Format,
    n: usize,
    k: usize,
    data: Vec<u8>,
}

impl QuantRows {
    /// `data` holds `n` rows of `k` values of `fmt`'s blocks.
    pub(crate) fn new(fmt: Format, n: usize, k: usize, data: Vec<u8>) -> Result<Self, String> {
        let bytes = fmt.ggml().block().1;
        if !k.is_multiple_of(QK) || data.len() != n * (k / QK) * bytes {
            return Err(format!(
                "{} bytes are not {n} rows of {k} {fmt:?} values",
                data.len()
            ));
        }
        Ok(Self { fmt, n, k, data })
    }

    pub(crate) fn format(&self) -> Format {
        self.fmt
    }

    pub(crate) fn n(&self) -> usize {
        self.n
    }

    pub(crate) fn k(&self) -> usize {
        self.k
    }

    /// Bytes held.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.data.len()
    }

    fn row_bytes(&self) -> usize {
        self.k / QK * self.fmt.ggml().block().1
    }

    /// Block `b` of row `r`, as ggml stores it.
    pub(crate) fn block(&self, r: usize, b: usize) -> &[u8] {
        let bytes = self.fmt.ggml().block().1;
        &self.data[r * self.row_bytes() + b * bytes..][..bytes]
    }

    /// Row `perm[i]` becomes row `i`.
    pub(crate) fn permute_rows(&self, perm: &[usize]) -> Self {
        let rb = self.row_bytes();
        let mut data = Vec::with_capacity(self.data.len());
        for &p in perm {
            data.extend_from_slice(&self.data[p * rb..(p + 1) * rb]);
        }
        Self { data, ..*self }
    }

    /// The rows of `parts` stacked in order; None unless all share a format
    /// and a width.
    pub(crate) fn cat(parts: &[&Self]) -> Option<Self> {
        let first = parts.first()?;
        if parts.iter().any(|p| p.fmt != first.fmt || p.k != first.k) {
            return None;
        }
        let mut data = Vec::with_capacity(parts.iter().map(|p| p.data.len()).sum());
        for p in parts {
            data.extend_from_slice(&p.data);
        }
        Some(Self {
            fmt: first.fmt,
            n: parts.iter().map(|p| p.n).sum(),
            k: first.k,
            data,
        })
    }

    /// The weight dequantized to an f32 tensor [n, k] (ggml's reference
    /// dequantization, bit for bit).
    pub(crate) fn dequantize(&self) -> Result<Tensor, EngineError> {
        let values = crate::gguf::dequantize(self.fmt.ggml(), &self.data, self.n * self.k)
            .map_err(EngineError::Step)?;
        Ok(Tensor::f_from_slice(&values)?.f_reshape([self.n as i64, self.k as i64])?)
    }
}
