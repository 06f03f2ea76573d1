//! The AVX2 product from a few rows up (`panel_min` in `mod.rs`), for
//! every format, with the residual (int16 activations `128 q + q2`) or
//! int8 alone (the quants as int16): the same integers and float operations as
//! the other AVX2 kernels (`avx2.rs`; so the same bits), with each block's
//! quants widened once for all the rows instead of once per row or row
//! pair.
//!
//! Per block, up to six groups' quants (96 columns; bytes, or Q4's
//! nibbles) are widened into a panel of int16 with the offset taken off
//! (signed, so no correction: `sum (q - off) x` is exactly the
//! `q.x - corr` the other kernels compute), laid out per k-pair as 8
//! columns x 2 k a vector. One `vpmaddwd` of a panel vector with a row's
//! 2 activations broadcast then gives each column's pair sum in its own
//! lane, and no horizontal add is left for the block's end. A row keeps 12
//! sums in registers (one per 8 columns) and takes one broadcast per
//! k-pair for all 96 columns: per 192 multiply-adds, 12 `vpmaddwd` (each
//! reading its panel vector from L1) and 12 `vpaddd`, against
//! `wide_rows`' 22 instructions per 128 (it widens the quants again for
//! every second row and broadcasts per 16 columns; Q4 with the residual
//! takes two chains of `vpmaddubsw` there). That loop is in assembly (see
//! [`sums!`]), and so is each block's scaling of its integer sums into
//! the rows' float accumulators (96 a row, on the stack), in k order;
//! then Q4_1's and Q4_K's mins times the block's sum, as everywhere.

#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::{NG, QuantMatrix, QuantizedRows, avx2};

/// Groups in a panel at most (two vectors of 8 columns each).
pub(super) const GROUPS: usize = 6;
/// Columns of a panel at most.
const COLS: usize = GROUPS * NG;
/// Rows whose float accumulators are held while their blocks are summed.
const ROWS: usize = 32;
/// k-pairs per block.
const PAIRS: usize = super::QK / 2;

/// Columns of groups `g0 .. g1` of every one of the `m` rows into `out`
/// (`m` rows of `n` floats): panels of up to [`GROUPS`] groups. The caller
/// checked the CPU (AVX2, FMA, F16C) and that `x` holds wide activations.
pub(super) fn columns(
    w: &QuantMatrix,
    x: &QuantizedRows,
    m: usize,
    (g0, g1): (usize, usize),
    rows: (usize, usize),
    out: *mut f32,
) {
    let mut g = g0;
    while g < g1 {
        let ng = GROUPS.min(g1 - g);
        // SAFETY: the caller's promises, passed on.
        unsafe {
            match ng {
                1 => panel::<2>(w, x, m, g, rows, out),
                2 => panel::<4>(w, x, m, g, rows, out),
                3 => panel::<6>(w, x, m, g, rows, out),
                4 => panel::<8>(w, x, m, g, rows, out),
                5 => panel::<10>(w, x, m, g, rows, out),
                _ => panel::<12>(w, x, m, g, rows, out),
            }
        }
        g += ng;
    }
}

/// One panel: `V / 2` groups from `g`, rows `r0 .. r1` of `m`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn panel<const V: usize>(
    w: &QuantMatrix,
    x: &QuantizedRows,
    m: usize,
    g: usize,
    (r0, r1): (usize, usize),
    out: *mut f32,
) {
    let fmt = w.fmt;
    let blocks = w.blocks();
    avx2::check(fmt, x, x.wide.len(), m, blocks);
    assert!(r0 <= r1 && r1 <= m && g + V / 2 <= w.n.div_ceil(NG));
    let stride = fmt.stride();
    let off = _mm256_set1_epi16(fmt.offset() as i16);
    let (bytes, nibble) = (fmt.byte_quants(), _mm256_set1_epi8(0x0f));
    // Within each 128-bit lane (4 columns x 4 k as stored), the bytes of
    // k 0, 1 (`lo`) or k 2, 3 (`hi`) of each column, each widened to int16
    // (an index with the top bit set gives 0).
    let z = -128i8;
    let lo = _mm256_setr_epi8(
        0, z, 1, z, 4, z, 5, z, 8, z, 9, z, 12, z, 13, z, 0, z, 1, z, 4, z, 5, z, 8, z, 9, z, 12,
        z, 13, z,
    );
    let hi = _mm256_setr_epi8(
        2, z, 3, z, 6, z, 7, z, 10, z, 11, z, 14, z, 15, z, 2, z, 3, z, 6, z, 7, z, 10, z, 11, z,
        14, z, 15, z,
    );
    let mut wide = [[_mm256_setzero_si256(); V]; PAIRS];
    let mut d = [[_mm256_setzero_ps(); V]; 2];
    let mut acc = [[0f32; COLS]; ROWS];
    let n = w.n;
    let mut r = r0;
    while r < r1 {
        let nr = ROWS.min(r1 - r);
        for a in &mut acc[..nr] {
            a[..8 * V].fill(0.0);
        }
        for b in 0..blocks {
            for v in 0..V {
                let (gi, h) = (v / 2, v % 2);
                let gb = w.group_block(g + gi, b).as_ptr();
                // SAFETY: `gb` is a whole group-block: 512 bytes of quants
                // (64 per k-quad, half h's 32 at 32 h), then the scales.
                unsafe {
                    if h == 0 && r == r0 {
                        // The block after next of this group.
                        super::prefetch_next_group(gb, 2 * stride, stride);
                    }
                    for q in 0..PAIRS / 2 {
                        let s = if bytes {
                            _mm256_loadu_si256(gb.add(q * 64 + h * 32).cast())
                        } else {
                            // Vector q % 4 holds k-quad q in its low nibbles
                            // (q < 4) or its high ones.
                            let s = _mm256_loadu_si256(gb.add((q % 4) * 64 + h * 32).cast());
                            let s = if q < 4 { s } else { _mm256_srli_epi16::<4>(s) };
                            _mm256_and_si256(s, nibble)
                        };
                        wide[2 * q][v] = _mm256_sub_epi16(_mm256_shuffle_epi8(s, lo), off);
                        wide[2 * q + 1][v] = _mm256_sub_epi16(_mm256_shuffle_epi8(s, hi), off);
                    }
                    let (s0, s1) = avx2::scales(fmt, gb, h);
                    d[0][v] = s0;
                    d[1][v] = s1;
                }
            }
            for (j, acc) in acc[..nr].iter_mut().enumerate() {
                let i = (r + j) * blocks + b;
                // SAFETY: row r + j < m, so block i is within the checked
                // arrays, its 32 wide activations at 32 i.
                unsafe {
                    let xw = x.wide.as_ptr().add(i * 32);
                    let xs = _mm256_set1_ps(*x.scale.get_unchecked(i));
                    let sx = _mm256_set1_ps(*x.sx.get_unchecked(i));
                    row::<V>(&wide, &d, (fmt.halves(), fmt.has_mins()), xw, (xs, sx), acc);
                }
            }
        }
        let cols = (8 * V).min(n - g * NG);
        for (j, a) in acc[..nr].iter().enumerate() {
            // SAFETY: `out` holds m rows of n floats; row r + j < m and the
            // columns g * 16 .. + cols lie within n, no other task's.
            unsafe {
                std::ptr::copy_nonoverlapping(a.as_ptr(), out.add((r + j) * n + g * NG), cols);
            }
        }
        r += nr;
    }
}

/// One row's block: the `V` vectors' integer sums over the panel's
/// k-pairs (Q6_K, `halves`: each 8 apart), times the scales `d[0]` (Q6_K's
/// second 8: `d[1]`) and the activations' scale `xs`, added into `acc` (8
/// columns a vector); with `mins` (Q4_1, Q4_K), then the mins `d[1]` times
/// the block's sum `sx`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn row<const V: usize>(
    wide: &[[__m256i; V]; PAIRS],
    d: &[[__m256; V]; 2],
    (halves, mins): (bool, bool),
    xw: *const i16,
    (xs, sx): (__m256, __m256),
    acc: &mut [f32; COLS],
) {
    const { assert!(V >= 2 && V <= 12 && V.is_multiple_of(2)) };
    let (parts, per) = if halves { (2, PAIRS / 2) } else { (1, PAIRS) };
    for (part, d) in d.iter().enumerate().take(parts) {
        let p0 = part * per;
        // SAFETY: pairs p0 .. p0 + per of the panel and of the row-block's
        // 32 int16 activations (2 a pair); `d` holds V vectors and `acc`
        // 8 V floats.
        unsafe {
            let (w, x) = (wide[p0].as_ptr(), xw.cast::<i32>().add(p0));
            let (d, a) = (d.as_ptr(), acc.as_mut_ptr());
            match V {
                2 => sums2(w, x, per, d, xs, a),
                4 => sums4(w, x, per, d, xs, a),
                6 => sums6(w, x, per, d, xs, a),
                8 => sums8(w, x, per, d, xs, a),
                10 => sums10(w, x, per, d, xs, a),
                _ => sums12(w, x, per, d, xs, a),
            }
        }
    }
    if mins {
        for (&m, a) in d[1].iter().zip(acc.chunks_exact_mut(8)) {
            // SAFETY: `a` is 8 floats.
            unsafe {
                let sum = _mm256_fmadd_ps(m, sx, _mm256_loadu_ps(a.as_ptr()));
                _mm256_storeu_ps(a.as_mut_ptr(), sum);
            }
        }
    }
}

/// `sumsV(w, x, pairs, d, xs, acc)` (`sums!`): the `V` int32 vectors
/// `s[v] = sum_p vpmaddwd(w[p][v], x[p] broadcast)` over `pairs` k-pairs,
/// `w` the panel's pairs (`V` vectors each, in order), `x` the row's
/// activation pairs; then `acc[v] = fma(d[v] * xs, float(s[v]), acc[v])`
/// (8 floats a vector). In assembly: the same loop in intrinsics reached
/// half the speed, its sums spilled and re-associated across the unrolled
/// pairs; this one keeps each vector's sum in its own register (ymm0..),
/// one broadcast (ymm15) and one product (ymm14) at a time, the quants
/// read from the panel by `vpmaddwd` itself. The sums go into `acc`
/// straight from their registers: stored and read back for intrinsics to
/// scale them, they were most of the fifth of a Zen 1's time in this
/// kernel spent outside the loop (Q8_0 products 8-10% faster without).
macro_rules! sums {
    ($name:ident, $stride:literal, $($acc:literal @ $off:literal),+) => {
        /// # Safety
        /// AVX2 and FMA; `w` holds `pairs` x V vectors, `x` `pairs` int32,
        /// `d` V vectors, `acc` 8 V floats; `pairs` > 0.
        #[inline]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn $name(
            w: *const __m256i,
            x: *const i32,
            pairs: usize,
            d: *const __m256,
            xs: __m256,
            acc: *mut f32,
        ) {
            // SAFETY: the caller's promises: every address read or written
            // is within `w`, `x`, `d` or `acc`.
            unsafe {
                std::arch::asm!(
                    $( concat!("vpxor ymm", $acc, ", ymm", $acc, ", ymm", $acc), )+
                    "2:",
                    "vpbroadcastd ymm15, dword ptr [{x}]",
                    $(
                        concat!("vpmaddwd ymm14, ymm15, ymmword ptr [{w} + ", $off, "]"),
                        concat!("vpaddd ymm", $acc, ", ymm", $acc, ", ymm14"),
                    )+
                    concat!("add {w}, ", $stride),
                    "add {x}, 4",
                    "dec {n}",
                    "jnz 2b",
                    // acc = fma(d * xs, float(s), acc), as the intrinsics
                    // gave it (d * xs rounded first).
                    $(
                        concat!("vmulps ymm14, {xs}, ymmword ptr [{d} + ", $off, "]"),
                        concat!("vcvtdq2ps ymm", $acc, ", ymm", $acc),
                        concat!("vfmadd213ps ymm", $acc, ", ymm14, ymmword ptr [{acc} + ", $off, "]"),
                        concat!("vmovups ymmword ptr [{acc} + ", $off, "], ymm", $acc),
                    )+
                    w = inout(reg) w => _,
                    x = inout(reg) x => _,
                    n = inout(reg) pairs => _,
                    d = in(reg) d,
                    acc = in(reg) acc,
                    xs = in(ymm_reg) xs,
                    out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _,
                    out("ymm4") _, out("ymm5") _, out("ymm6") _, out("ymm7") _,
                    out("ymm8") _, out("ymm9") _, out("ymm10") _, out("ymm11") _,
                    out("ymm14") _, out("ymm15") _,
                    options(nostack),
                );
            }
        }
    };
}

sums!(sums2, 64, 0 @ 0, 1 @ 32);
sums!(sums4, 128, 0 @ 0, 1 @ 32, 2 @ 64, 3 @ 96);
sums!(sums6, 192, 0 @ 0, 1 @ 32, 2 @ 64, 3 @ 96, 4 @ 128, 5 @ 160);
sums!(sums8, 256, 0 @ 0, 1 @ 32, 2 @ 64, 3 @ 96, 4 @ 128, 5 @ 160, 6 @ 192, 7 @ 224);
sums!(
    sums10, 320, 0 @ 0, 1 @ 32, 2 @ 64, 3 @ 96, 4 @ 128, 5 @ 160, 6 @ 192, 7 @ 224, 8 @ 256,
    9 @ 288
);
sums!(
    sums12, 384, 0 @ 0, 1 @ 32, 2 @ 64, 3 @ 96, 4 @ 128, 5 @ 160, 6 @ 192, 7 @ 224, 8 @ 256,
    9 @ 288, 10 @ 320, 11 @ 352
);
