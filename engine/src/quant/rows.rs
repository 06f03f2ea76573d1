//! A quantized weight as a GGUF file stores it: `n` rows (outputs) of `k`
//! values, each row `k / 32` ggml blocks. The loader reorders and stacks
//! rows in this form (undoing llama.cpp's q/k permutation, stacking q, k
//! and v) before the linear layer repacks it for the kernels.

use tch::Tensor;

use super::{Format, QK};
use crate::EngineError;
use crate::gguf::GgmlType;

#[derive(Clone)]
pub(crate) struct QuantRows {
    fmt: Format,
    n: usize,
    k: usize,
    data: Vec<u8>,
}

impl QuantRows {
    /// `data` holds `n` rows of `k` values of `fmt`'s blocks as this type
    /// holds them ([`Format::block_bytes`]).
    pub(crate) fn new(fmt: Format, n: usize, k: usize, data: Vec<u8>) -> Result<Self, String> {
        let bytes = fmt.block_bytes();
        if !k.is_multiple_of(QK) || data.len() != n * (k / QK) * bytes {
            return Err(format!(
                "{} bytes are not {n} rows of {k} {fmt:?} values",
                data.len()
            ));
        }
        Ok(Self { fmt, n, k, data })
    }

    /// `data` holds `n` rows of `k` values as a GGUF file stores `kind`, a
    /// type that [`Format::of`] keeps quantized: Q8_0, Q4_0 and Q4_1 kept as
    /// they are, Q5_0's blocks widened to Q8_0's (see [`q5_0_as_q8_0`]) and
    /// Q4_K's and Q6_K's 256-value super-blocks split into 32-value blocks
    /// (see [`split_q4_k`], [`split_q6_k`]), all exact.
    pub(crate) fn from_ggml(
        kind: GgmlType,
        n: usize,
        k: usize,
        data: &[u8],
    ) -> Result<Self, String> {
        let fmt = Format::of(kind).ok_or_else(|| format!("{kind:?} is not kept quantized"))?;
        let (per, bytes) = kind.block();
        if !k.is_multiple_of(per) || data.len() != n * (k / per) * bytes {
            return Err(format!(
                "{} bytes are not {n} rows of {k} {kind:?} values",
                data.len()
            ));
        }
        let convert = |f: fn(&[u8], &mut Vec<u8>)| {
            let mut out = Vec::with_capacity(n * (k / QK) * fmt.block_bytes());
            for block in data.chunks_exact(bytes) {
                f(block, &mut out);
            }
            out
        };
        let data = match kind {
            GgmlType::Q5_0 => convert(q5_0_as_q8_0),
            GgmlType::Q4K => convert(split_q4_k),
            GgmlType::Q6K => convert(split_q6_k),
            _ => data.to_vec(),
        };
        Self::new(fmt, n, k, data)
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
        self.k / QK * self.fmt.block_bytes()
    }

    /// Block `b` of row `r`, as ggml stores it.
    pub(crate) fn block(&self, r: usize, b: usize) -> &[u8] {
        let bytes = self.fmt.block_bytes();
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
        let values = match self.fmt {
            Format::Q4K | Format::Q6K => self
                .data
                .chunks_exact(self.fmt.block_bytes())
                .flat_map(|b| (0..QK).map(move |i| self.fmt.split_value(b, i)))
                .collect(),
            _ => crate::gguf::dequantize(self.fmt.ggml(), &self.data, self.n * self.k)
                .map_err(EngineError::Step)?,
        };
        Ok(Tensor::f_from_slice(&values)?.f_reshape([self.n as i64, self.k as i64])?)
    }
}

/// One Q5_0 block (f16 `d`, 32 high bits, 16 bytes of low nibbles) appended
/// to `out` as a Q8_0 block: the same `d` and the 32 values `q - 16` as
/// int8. ggml dequantizes both as `(q as f32) * d`, so the values are the
/// same to the bit (at 8.5 bits a value instead of 5.5).
fn q5_0_as_q8_0(b: &[u8], out: &mut Vec<u8>) {
    use crate::gguf::dequant::q5_high;
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..22];
    out.extend_from_slice(&b[..2]);
    let value = |j: usize| -> u8 {
        let (h0, h1) = q5_high(qh, j % 16);
        let q = if j < 16 {
            (qs[j] & 0x0f) | h0
        } else {
            (qs[j - 16] >> 4) | h1
        };
        (i32::from(q) - 16) as i8 as u8
    };
    out.extend((0..QK).map(value));
}

impl Format {
    /// Value `i` of a block of the split formats, as [`split_q4_k`] and
    /// [`split_q6_k`] wrote it, the way ggml dequantizes the super-block:
    /// Q4_K `scale * q + min`, Q6_K `scale * (q - 32)` with its half's
    /// scale.
    fn split_value(self, b: &[u8], i: usize) -> f32 {
        let f = |at: usize| f32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let qs = &b[8..];
        if self == Format::Q6K {
            let s = if i < QK / 2 { f(0) } else { f(4) };
            return s * (i32::from(qs[i]) - 32) as f32;
        }
        let q = if i < QK / 2 {
            qs[i] & 0x0f
        } else {
            qs[i - QK / 2] >> 4
        };
        f32::from(q) * f(0) + f(4)
    }
}

/// One Q6_K super-block (128 bytes of low 4 bits, 64 of high 2 bits, 16
/// int8 sub-block scales, f16 `d`; value v's quant `q - 32` has scale
/// `sc[v / 16]`) appended to `out` as 8 blocks of 32 values, each the f32
/// scales `d * sc` of its two 16-value halves and its 32 quants `q`
/// (0..63, a byte each, in value order). ggml dequantizes a value as
/// `(d * sc) * (q - 32)`, which the kernels compute from the same f32
/// scale and integer.
fn split_q6_k(sb: &[u8], out: &mut Vec<u8>) {
    use crate::gguf::dequant::f16_to_f32;
    let (ql, qh, sc) = (&sb[..128], &sb[128..192], &sb[192..208]);
    let d = f16_to_f32(u16::from_le_bytes([sb[208], sb[209]]));
    // Value v = 128 h + 32 j + l (h half, j quarter, l < 32): low bits
    // from ql[64 h + l + 32 (j % 2)] (high nibble when j >= 2), high bits
    // from qh[32 h + l] at 2 j.
    let quant = |v: usize| -> u8 {
        let (h, j, l) = (v / 128, (v % 128) / 32, v % 32);
        let low = ql[64 * h + l + 32 * (j % 2)];
        let low = if j >= 2 { low >> 4 } else { low & 0x0f };
        low | (((qh[32 * h + l] >> (2 * j)) & 3) << 4)
    };
    for b in 0..8 {
        for s in [2 * b, 2 * b + 1] {
            out.extend((d * f32::from(sc[s] as i8)).to_le_bytes());
        }
        out.extend((32 * b..32 * b + 32).map(quant));
    }
}

/// One Q4_K super-block (f16 `d` and `dmin`, 12 bytes of 6-bit sub-block
/// scales and mins, 128 bytes of quants: 64 values per 32 bytes, low
/// nibbles first) appended to `out` as 8 blocks of 32 values, each its f32
/// scale `d * sc`, its f32 min `-(dmin * m)` and its 16 bytes of quants in
/// Q4_1's order (value i in the low nibble of byte i, value 16 + i in the
/// high one). ggml dequantizes a value as `d * sc * q - dmin * m` with the
/// two products rounded to f32 first, which is `scale * q + min` to the bit.
fn split_q4_k(sb: &[u8], out: &mut Vec<u8>) {
    use crate::gguf::dequant::{f16_to_f32, scale_min_k4};
    let d = f16_to_f32(u16::from_le_bytes([sb[0], sb[1]]));
    let dmin = f16_to_f32(u16::from_le_bytes([sb[2], sb[3]]));
    let (scales, qs) = (&sb[4..16], &sb[16..16 + 128]);
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, scales);
        out.extend((d * f32::from(sc)).to_le_bytes());
        out.extend((-(dmin * f32::from(m))).to_le_bytes());
        let bytes = &qs[32 * (j / 2)..][..32];
        let v = |i: usize| {
            if j % 2 == 0 {
                bytes[i] & 0x0f
            } else {
                bytes[i] >> 4
            }
        };
        out.extend((0..16).map(|i| v(i) | (v(i + 16) << 4)));
    }
}
