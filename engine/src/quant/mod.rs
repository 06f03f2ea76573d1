//! Linear layers over weights kept in ggml's 32-value blocks (Q8_0, Q4_0,
//! Q4_1; Q5_0 as Q8_0; Q4_K and Q6_K split into 32-value blocks) on the
//! CPU, dequantized in registers.
//!
//! A decode step reads every weight once, so it is bound by memory: reading
//! 8.5 (Q8_0), 4.5 (Q4_0), 5 (Q4_1) or 6 (Q4_K as held) bits per weight
//! instead of f32's 32 is the win. At load, a GGUF tensor's rows
//! ([`QuantRows`], ggml's layout: each output's blocks in a row) are
//! repacked into a [`QuantMatrix`]: groups of 16 output columns, and per
//! group and 32-value block the 16 columns' quants interleaved four k at a
//! time (one 512-bit vector holds 4 k of 16 columns), then the 16 columns'
//! f16 scales (and Q4_1's f16 mins). The bits per weight stay the format's
//! own.
//!
//! Q4_K (4.5 bits in the file: 256-value super-blocks with an f16 scale and
//! min scale and 6-bit scales and mins per 32 values) is held as Q4_1-like
//! 32-value blocks whose scale `d * sc` and min `-(dmin * m)` are f32, as
//! ggml's dequantization computes them: exact, and the kernels stay the
//! Q4_1 ones but for loading f32 instead of f16 scales, for 1.5 bits a
//! weight more than the file (the f16 products do not fit an f16). Q6_K
//! (6.56 bits: 6-bit quants, an int8 scale per 16 values, an f16 `d` per
//! 256) is held as byte quants `q + 32` with the f32 scales `d * sc` of each
//! block's two halves (10 bits a weight); the kernels sum each half apart
//! (its own integer chain, less its own part of the activations' offset
//! correction, `corr_lo`) and scale it by its own scale.
//!
//! Two kernels, three kinds of activations (see [`Activations`] and
//! `activations.rs`):
//! - integer: each row of activations is quantized per 32-block to int8
//!   with an f32 scale `dx = max|x| / 127` and the block's sum of quants
//!   (`Int8`, as llama.cpp does), and by default also the rounding residual,
//!   to int8 at `dx / 128` (`Int8Residual`). A block's dot product is
//!   integer (`vpdpbusd` on AVX-512 VNNI), exact: `isum = q.w`, or with the
//!   residual `128 q.w + q2.w` in one chain (shifted by 7 between the two),
//!   the activations in units of `dx / 128`. Per block,
//!   `acc += (d * scale) * (isum - corr)`, `scale` being `dx` (or
//!   `dx / 128`), plus `m * sum x` for Q4_1. The weights' quants are stored
//!   unsigned (Q8_0's offset by 128, Q4's are 0..15); `corr` takes the
//!   offset off: the offset times the same combination of the activation
//!   quants' sums.
//! - `F32`: the block's quants are widened to f32 and multiplied with f32
//!   activations (`blk = sum q x`, in k order), then `acc += d * blk`
//!   (+ `m * sum x` for Q4_1). No activation rounding; more instructions.
//!
//! Each output is summed in an order fixed by k alone, so a row's result
//! does not depend on the batch, and the portable kernels do the same
//! operations in the same order, so SIMD and portable agree to the bit.

mod activations;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod panel;
mod product;
mod rows;
#[cfg(test)]
mod tests;

use activations::{F32Rows, QuantizedRows, Rows};
pub(crate) use rows::QuantRows;
use tch::Tensor;

use crate::EngineError;
use crate::gguf::GgmlType;
use crate::pages::Pages;

/// Values per block.
pub(crate) const QK: usize = 32;
/// Output columns per group (one 512-bit vector of f32).
const NG: usize = 16;
/// Rows per register tile.
const MR: usize = 8;

/// The block formats kept quantized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    Q8_0,
    Q4_0,
    Q4_1,
    /// Q4_K, split at load into 32-value blocks of Q4_1's layout whose
    /// scale and min are f32: a Q4_K sub-block's `d * sc` and `-(dmin * m)`,
    /// exactly as ggml's dequantization computes them (see `rows.rs`).
    Q4K,
    /// Q6_K, split at load into 32-value blocks of unsigned byte quants
    /// (`q + 32`, 0..63, offset 32) with two f32 scales, `d * sc` of the
    /// block's two 16-value sub-blocks (see `rows.rs`).
    Q6K,
}

impl Format {
    /// The format a GGUF type is held in, if it is kept quantized (Q5_0's
    /// values are Q8_0 ones, see `rows.rs`).
    pub(crate) fn of(kind: GgmlType) -> Option<Self> {
        match kind {
            GgmlType::Q8_0 | GgmlType::Q5_0 => Some(Self::Q8_0),
            GgmlType::Q4_0 => Some(Self::Q4_0),
            GgmlType::Q4_1 => Some(Self::Q4_1),
            GgmlType::Q4K => Some(Self::Q4K),
            GgmlType::Q6K => Some(Self::Q6K),
            _ => None,
        }
    }

    /// The GGUF type whose blocks this format's are (Q8_0 also holds
    /// Q5_0's values).
    pub(crate) fn ggml(self) -> GgmlType {
        match self {
            Self::Q8_0 => GgmlType::Q8_0,
            Self::Q4_0 => GgmlType::Q4_0,
            Self::Q4_1 => GgmlType::Q4_1,
            Self::Q4K => GgmlType::Q4K,
            Self::Q6K => GgmlType::Q6K,
        }
    }

    /// Bytes of one 32-value block as [`QuantRows`] holds it: ggml's own
    /// block, but for Q4_K's 32-value pieces (f32 scale, f32 min, 16 bytes
    /// of quants in Q4_1's order) and Q6_K's (two f32 scales, 32 bytes of
    /// quants).
    pub(crate) fn block_bytes(self) -> usize {
        match self {
            Self::Q4K => 4 + 4 + QK / 2,
            Self::Q6K => 4 + 4 + QK,
            _ => self.ggml().block().1,
        }
    }

    /// Whether a block has two scales, one per 16 values (and no min).
    fn halves(self) -> bool {
        self == Self::Q6K
    }

    /// Whether the quants are a byte each (else a nibble).
    fn byte_quants(self) -> bool {
        matches!(self, Self::Q8_0 | Self::Q6K)
    }

    /// Whether a value is `d * q + m` (a min per block) rather than
    /// `d * (q - offset)`.
    fn has_mins(self) -> bool {
        matches!(self, Self::Q4_1 | Self::Q4K)
    }

    /// Whether the blocks' scales and mins are f32 (else f16).
    fn f32_scales(self) -> bool {
        matches!(self, Self::Q4K | Self::Q6K)
    }

    /// Bytes of one group's quants for one block (16 columns x 32 values).
    fn quant_bytes(self) -> usize {
        if self.byte_quants() {
            NG * QK
        } else {
            NG * QK / 2
        }
    }

    /// Bytes of a scale (or min): f16, or f32 for Q4_K and Q6_K.
    fn scale_width(self) -> usize {
        if self.f32_scales() { 4 } else { 2 }
    }

    /// Bytes of one group-block: quants, then 16 scales, and 16 mins (or,
    /// for Q6_K, the second 16 values' 16 scales).
    fn stride(self) -> usize {
        let second = self.has_mins() || self.halves();
        self.quant_bytes() + self.scale_width() * NG * if second { 2 } else { 1 }
    }

    /// What is added to a stored quant to make it unsigned: a value is
    /// `d * (q - offset)` (plus `m` for Q4_1 and Q4_K).
    fn offset(self) -> i32 {
        match self {
            Self::Q8_0 => 128,
            Self::Q4_0 => 8,
            Self::Q4_1 | Self::Q4K => 0,
            Self::Q6K => 32,
        }
    }
}

/// Rows of a part of the panel product (see `panel.rs`).
#[cfg(target_arch = "x86_64")]
const PANEL_PART: usize = 64;

/// The fewest rows the panel product takes (AVX2, every
/// format; see `panel.rs`): 4, where it measured as fast as the other
/// AVX2 kernels or faster on a Zen 3 (at 1 and 2 rows, widening a panel
/// for so few rows costs more than it saves). `GYRE_PANEL_MIN` sets it,
/// for measuring one against the other (a large value turns it off).
/// Read once.
fn panel_min() -> usize {
    static MIN: std::sync::LazyLock<usize> = std::sync::LazyLock::new(|| {
        std::env::var("GYRE_PANEL_MIN")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(4)
    });
    *MIN
}

/// Which kernel multiplies activations with the quantized weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Activations {
    /// Activations quantized per 32-block to int8 (as llama.cpp does for
    /// these formats); integer dot products. Each activation moves by up to
    /// 1/254 of its block's largest.
    Int8,
    /// Int8, plus the rounding residual quantized to int8 at 1/128 of the
    /// step: two integer dot products per block, each activation within
    /// 1/32512 of its block's largest (about 15 bits).
    #[default]
    Int8Residual,
    /// Activations kept f32; quants widened to f32 in registers.
    F32,
}

/// Which kernels multiply: AVX-512 with VNNI, AVX2 (with FMA and F16C),
/// or the portable ones (correct but slow). All three give the same
/// results to the bit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    Avx512Vnni,
    Avx2,
    Portable,
}

impl Kernel {
    /// The fastest this CPU runs, unless `GYRE_QUANT_KERNEL` (`avx2` or
    /// `portable`) asks for a slower one, for measuring and testing those
    /// on a faster CPU. Read once.
    pub fn best() -> Self {
        static BEST: std::sync::LazyLock<Kernel> = std::sync::LazyLock::new(|| {
            let best = Kernel::detected();
            match std::env::var("GYRE_QUANT_KERNEL").as_deref() {
                Ok("portable") => Kernel::Portable,
                Ok("avx2") if Kernel::Avx2.runs_here() => Kernel::Avx2,
                _ => best,
            }
        });
        *BEST
    }

    fn detected() -> Self {
        [Self::Avx512Vnni, Self::Avx2]
            .into_iter()
            .find(|k| k.runs_here())
            .unwrap_or(Self::Portable)
    }

    /// Whether this CPU has what the kernel needs.
    pub fn runs_here(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            match self {
                Self::Avx512Vnni => {
                    std::arch::is_x86_feature_detected!("avx512f")
                        && std::arch::is_x86_feature_detected!("avx512vnni")
                }
                Self::Avx2 => avx2::available(),
                Self::Portable => true,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == Self::Portable
        }
    }
}

/// Whether this CPU runs SIMD kernels (AVX-512 VNNI or AVX2); elsewhere
/// only the portable kernels would, so the loader keeps quantized weights
/// only where this holds.
pub(crate) fn available() -> bool {
    Kernel::detected() != Kernel::Portable
}

fn f16(b: &[u8], i: usize) -> f32 {
    crate::gguf::dequant::f16_to_f32(u16::from_le_bytes([b[2 * i], b[2 * i + 1]]))
}

/// A weight [n, k] (as in `y = x W^T`) repacked for the kernels (see the
/// module comment).
pub(crate) struct QuantMatrix {
    fmt: Format,
    n: usize,
    k: usize,
    /// Shared with the workers' prefetch of it.
    data: std::sync::Arc<Pages<u8>>,
}

impl QuantMatrix {
    pub(crate) fn new(rows: &QuantRows) -> Self {
        let (fmt, n, k) = (rows.format(), rows.n(), rows.k());
        let blocks = k / QK;
        let groups = n.div_ceil(NG);
        let stride = fmt.stride();
        let qb = fmt.quant_bytes();
        let mut data = Pages::zeroed(groups * blocks * stride);
        for col in 0..n {
            let (g, c) = (col / NG, col % NG);
            for b in 0..blocks {
                let src = rows.block(col, b);
                let dst = &mut data[(g * blocks + b) * stride..][..stride];
                // A block: its scale (and min or second scale), then its
                // quants (see `rows.rs`).
                let qs = &src[src.len() - fmt.quant_bytes() / NG..];
                if fmt.byte_quants() {
                    // Q8_0's signed quants made unsigned (offset 128);
                    // Q6_K's are already.
                    let flip = if fmt == Format::Q8_0 { 0x80 } else { 0 };
                    for (kk, &q) in qs.iter().enumerate() {
                        dst[(kk / 4) * 64 + c * 4 + kk % 4] = q ^ flip;
                    }
                } else {
                    for p in 0..4 {
                        dst[p * 64 + c * 4..][..4].copy_from_slice(&qs[4 * p..4 * p + 4]);
                    }
                }
                // The scale at w c, the min or second scale at w (NG + c).
                let w = fmt.scale_width();
                dst[qb + w * c..][..w].copy_from_slice(&src[..w]);
                if fmt.has_mins() || fmt.halves() {
                    dst[qb + w * NG + w * c..][..w].copy_from_slice(&src[w..2 * w]);
                }
            }
        }
        Self {
            fmt,
            n,
            k,
            data: std::sync::Arc::new(data),
        }
    }

    #[cfg(test)]
    fn n(&self) -> usize {
        self.n
    }

    /// Bytes held (the format's bits per weight, plus padding columns).
    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.data.len()
    }

    fn blocks(&self) -> usize {
        self.k / QK
    }

    /// Group `g`'s bytes for block `b`.
    fn group_block(&self, g: usize, b: usize) -> &[u8] {
        let s = self.fmt.stride();
        &self.data[(g * self.blocks() + b) * s..][..s]
    }

    /// The unsigned stored quant of column `c` of a group-block at `kk`.
    fn quant(&self, gb: &[u8], c: usize, kk: usize) -> u8 {
        let q = kk / 4;
        if self.fmt.byte_quants() {
            gb[q * 64 + c * 4 + kk % 4]
        } else {
            let byte = gb[(q % 4) * 64 + c * 4 + kk % 4];
            if q < 4 { byte & 0x0f } else { byte >> 4 }
        }
    }

    /// Scale and min (0 but for Q4_1 and Q4_K; for Q6_K, the second 16
    /// values' scale) of column `c` of a group-block.
    fn scale_min(&self, gb: &[u8], c: usize) -> (f32, f32) {
        let sc = &gb[self.fmt.quant_bytes()..];
        let at = |i: usize| {
            if self.fmt.f32_scales() {
                f32::from_le_bytes(sc[4 * i..4 * i + 4].try_into().expect("4 bytes"))
            } else {
                f16(sc, i)
            }
        };
        let m = if self.fmt.has_mins() || self.fmt.halves() {
            at(NG + c)
        } else {
            0.0
        };
        (at(c), m)
    }

    /// Row `r` of the weight (output column r) in f32, as ggml's reference
    /// dequantizes it (bit for bit): the embedding lookup of a tied
    /// quantized embedding.
    pub(crate) fn row(&self, r: usize, out: &mut [f32]) {
        let (g, c) = (r / NG, r % NG);
        let off = self.fmt.offset();
        for b in 0..self.blocks() {
            let gb = self.group_block(g, b);
            let (d, m) = self.scale_min(gb, c);
            for kk in 0..QK {
                let q = i32::from(self.quant(gb, c, kk)) - off;
                out[b * QK + kk] = match self.fmt {
                    Format::Q4_1 | Format::Q4K => q as f32 * d + m,
                    Format::Q6K if kk >= QK / 2 => q as f32 * m,
                    _ => q as f32 * d,
                };
            }
        }
    }

    /// The rows `ids` of the weight as an f32 tensor [ids.len(), k].
    pub(crate) fn rows(&self, ids: &[i64]) -> Result<Tensor, EngineError> {
        let mut out = vec![0f32; ids.len() * self.k];
        for (dst, &id) in out.chunks_exact_mut(self.k).zip(ids) {
            let r = usize::try_from(id)
                .ok()
                .filter(|&r| r < self.n)
                .ok_or_else(|| EngineError::Step(format!("token id {id} out of range")))?;
            self.row(r, dst);
        }
        Ok(Tensor::f_from_slice(&out)?.f_view([ids.len() as i64, self.k as i64])?)
    }

    /// The int8 kernel without SIMD, with the same operations per element:
    /// per block, the exact integer dot product `128 q.w + q2.w - corr`
    /// (`q.w - corr` without the residual), times `d * scale`, added with
    /// one fused multiply-add (and `m * sx` for Q4_1).
    fn portable_int8(
        &self,
        x: &QuantizedRows,
        r0: usize,
        n_rows: usize,
        g: usize,
        tile: &mut [[f32; NG]; MR],
    ) {
        for (i, t) in tile.iter_mut().enumerate().take(n_rows) {
            let r = r0 + i;
            *t = [0.0; NG];
            for b in 0..self.blocks() {
                let gb = self.group_block(g, b);
                let xb = x.block(r, b);
                let dot = |c: usize, xq: &[i8], ks: std::ops::Range<usize>| -> i32 {
                    ks.map(|kk| i32::from(self.quant(gb, c, kk)) * i32::from(xq[kk]))
                        .sum()
                };
                // The chain over k in `ks`: `q.w`, or `128 q.w + q2.w`.
                let chain = |c: usize, ks: std::ops::Range<usize>| -> i32 {
                    let isum = dot(c, xb.q, ks.clone());
                    match xb.q2 {
                        Some(q2) => 128 * isum + dot(c, q2, ks),
                        None => isum,
                    }
                };
                for (c, acc) in t.iter_mut().enumerate() {
                    let (d, m) = self.scale_min(gb, c);
                    if self.fmt.halves() {
                        let (lo, hi) = (chain(c, 0..QK / 2), chain(c, QK / 2..QK));
                        let corr_hi = xb.corr - xb.corr_lo;
                        *acc = (d * xb.scale).mul_add((lo - xb.corr_lo) as f32, *acc);
                        *acc = (m * xb.scale).mul_add((hi - corr_hi) as f32, *acc);
                        continue;
                    }
                    let isum = chain(c, 0..QK);
                    *acc = (d * xb.scale).mul_add((isum - xb.corr) as f32, *acc);
                    if self.fmt.has_mins() {
                        *acc = m.mul_add(xb.sx, *acc);
                    }
                }
            }
        }
    }

    /// The f32 kernel without SIMD, with the same operations per element.
    fn portable_f32(
        &self,
        x: &F32Rows,
        r0: usize,
        n_rows: usize,
        g: usize,
        tile: &mut [[f32; NG]; MR],
    ) {
        let off = self.fmt.offset();
        for (i, t) in tile.iter_mut().enumerate().take(n_rows) {
            let r = r0 + i;
            *t = [0.0; NG];
            for b in 0..self.blocks() {
                let gb = self.group_block(g, b);
                let (xb, xsum) = x.block(r, b);
                for (c, acc) in t.iter_mut().enumerate() {
                    // Q6_K sums each 16 values apart, for its two scales.
                    let mut blk = [0f32; 2];
                    for (kk, &xv) in xb.iter().enumerate() {
                        let q = i32::from(self.quant(gb, c, kk)) - off;
                        let half = usize::from(self.fmt.halves() && kk >= QK / 2);
                        blk[half] = (q as f32).mul_add(xv, blk[half]);
                    }
                    let (d, m) = self.scale_min(gb, c);
                    *acc = d.mul_add(blk[0], *acc);
                    if self.fmt.halves() {
                        *acc = m.mul_add(blk[1], *acc);
                    }
                    if self.fmt.has_mins() {
                        *acc = m.mul_add(xsum, *acc);
                    }
                }
            }
        }
    }
}

/// Whether the AVX-512 int8 kernel prefetches the next group in a product
/// of one row (off: see `avx512::int8_rows`).
static ONE_ROW_PREFETCH: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn one_row_prefetch() -> bool {
    ONE_ROW_PREFETCH.load(std::sync::atomic::Ordering::Relaxed)
}

/// Sets, for the whole process, whether the AVX-512 int8 kernel
/// prefetches the next group in a product of one row, as it did before
/// (the default: not): for comparisons (`steptime`'s `QPF_AB`). The sums
/// are the same either way.
pub fn set_one_row_prefetch(on: bool) {
    ONE_ROW_PREFETCH.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// Prefetches the `stride` bytes `next` bytes on from the group-block at
/// `gb`: the same block of the next group, so that the weight stream runs
/// while a kernel's later tiles reuse this group from L1 (the hardware
/// prefetcher alone did not keep up). A hint: past the last group the
/// address is formed without `add`'s in-bounds promise and never read.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_next_group(gb: *const u8, next: usize, stride: usize) {
    use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
    let ahead = gb.wrapping_add(next).cast::<i8>();
    let mut off = 0;
    while off < stride {
        #[allow(unsafe_code)]
        // SAFETY: SSE is in every x86-64 CPU; a prefetch reads nothing and
        // cannot fault, whatever the address.
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(off))
        };
        off += 64;
    }
}

/// Times `x W^T` with a random weight of `fmt` ([n, k]) against f32
/// activations [m, k] (`(n, k, m)`), for each kind of activations in
/// `acts`, on `threads` workers with `kernel`'s tiles:
/// `(activations, mean ms per call)`, after one warm-up call. For
/// profiling the kernels (`engine/examples/quantmm.rs`), not a test.
pub fn time_matmul(
    fmt: crate::gguf::GgmlType,
    (n, k, m): (usize, usize, usize),
    threads: usize,
    iters: usize,
    kernel: Kernel,
    acts: &[Activations],
) -> Result<Vec<(Activations, f64)>, EngineError> {
    if !kernel.runs_here() {
        return Err(EngineError::Unsupported(format!(
            "{kernel:?} does not run on this CPU"
        )));
    }
    let fmt = Format::of(fmt)
        .ok_or_else(|| EngineError::Unsupported(format!("{fmt:?} is not kept quantized")))?;
    let (per, bytes) = fmt.ggml().block();
    if !k.is_multiple_of(per) || n == 0 || m == 0 {
        return Err(EngineError::Step(format!("bad shape n {n} k {k} m {m}")));
    }
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed >> 12;
        seed ^= seed << 25;
        seed ^= seed >> 27;
        (seed.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8
    };
    // Each ggml block: its f16 scale (and min, or Q4_K's min scale), then
    // random bytes (quants, and Q4_K's packed sub-block scales).
    // (Q6_K's f16 scale comes last.)
    let header: &[u16] = match fmt {
        Format::Q8_0 | Format::Q4_0 | Format::Q6K => &[0x2400],
        Format::Q4_1 => &[0x2400, 0xa400],
        Format::Q4K => &[0x2000, 0x2000],
    };
    let mut data = Vec::with_capacity(n * k / per * bytes);
    for _ in 0..n * k / per {
        let random: Vec<u8> = (0..bytes - 2 * header.len()).map(|_| next()).collect();
        if fmt != Format::Q6K {
            data.extend(header.iter().flat_map(|h| h.to_le_bytes()));
        }
        data.extend(random);
        if fmt == Format::Q6K {
            data.extend(header.iter().flat_map(|h| h.to_le_bytes()));
        }
    }
    let w = QuantMatrix::new(
        &QuantRows::from_ggml(fmt.ggml(), n, k, &data).map_err(EngineError::Step)?,
    );
    let x: Vec<f32> = (0..m * k).map(|_| f32::from(next()) / 64.0 - 2.0).collect();
    let workers = crate::gemm::Workers::new(threads)?;
    let mut out = vec![0f32; m * n];
    let mut res = Vec::new();
    for &acts in acts {
        w.matmul_to(&x, m, acts, kernel, &workers, out.as_mut_ptr());
        let t = std::time::Instant::now();
        for _ in 0..iters {
            w.matmul_to(&x, m, acts, kernel, &workers, out.as_mut_ptr());
        }
        res.push((acts, t.elapsed().as_secs_f64() * 1e3 / iters as f64));
    }
    Ok(res)
}
