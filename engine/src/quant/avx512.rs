//! The AVX-512 kernels: a tile of R rows x 16 columns over one group, every
//! block in k order. The int8 kernel's block dot products are `vpdpbusd`
//! (unsigned weight quants x signed activation quants, exact in int32); the
//! f32 kernel widens each k's 16 quants to f32 and multiplies them with the
//! broadcast activation. Operation for operation as the portable kernels.

#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::{F32Rows, Format, MR, NG, QuantMatrix, QuantizedRows, Rows};

/// One tile of `n_rows` rows from `r0`, columns of group `g`. The caller
/// checked the CPU (`super::available`).
pub(super) fn tile(
    w: &QuantMatrix,
    rows: &Rows,
    r0: usize,
    n_rows: usize,
    g: usize,
    tile: &mut [[f32; NG]; MR],
) {
    macro_rules! by_rows {
        ($f:ident, $x:expr) => {
            // SAFETY: the CPU has AVX-512F and VNNI (checked by the
            // caller); rows r0 .. r0 + n_rows exist in `$x` and group g in `w`.
            unsafe {
                match n_rows {
                    8 => $f::<8>(w, $x, r0, g, tile),
                    7 => $f::<7>(w, $x, r0, g, tile),
                    6 => $f::<6>(w, $x, r0, g, tile),
                    5 => $f::<5>(w, $x, r0, g, tile),
                    4 => $f::<4>(w, $x, r0, g, tile),
                    3 => $f::<3>(w, $x, r0, g, tile),
                    2 => $f::<2>(w, $x, r0, g, tile),
                    _ => $f::<1>(w, $x, r0, g, tile),
                }
            }
        };
    }
    match rows {
        Rows::Int8(x) => by_rows!(int8, x),
        Rows::F32(x) => by_rows!(float, x),
    }
}

/// The 8 vectors of one group-block's quants, unsigned: vector q holds
/// k = 4q .. 4q+4 of the 16 columns (column c in 32-bit lane c).
#[target_feature(enable = "avx512f")]
unsafe fn quants(fmt: Format, gb: *const u8) -> [__m512i; 8] {
    let mut wq = [_mm512_setzero_si512(); 8];
    // SAFETY: a group-block starts with 512 (Q8_0, Q6_K) or 256 (Q4) bytes
    // of quants.
    unsafe {
        if fmt.byte_quants() {
            for (q, v) in wq.iter_mut().enumerate() {
                *v = _mm512_loadu_si512(gb.add(q * 64).cast());
            }
        } else {
            let low = _mm512_set1_epi8(0x0f);
            for p in 0..4 {
                let v = _mm512_loadu_si512(gb.add(p * 64).cast());
                wq[p] = _mm512_and_si512(v, low);
                wq[p + 4] = _mm512_and_si512(_mm512_srli_epi32::<4>(v), low);
            }
        }
    }
    wq
}

/// The 16 columns' scales and (Q4_1, Q4_K) mins, or (Q6_K) the scales of
/// the first and the second 16 values, of a group-block.
#[target_feature(enable = "avx512f")]
unsafe fn scales(fmt: Format, gb: *const u8) -> (__m512, __m512) {
    let qb = fmt.quant_bytes();
    // SAFETY: the scales (and mins) follow the quants: 16 f16 each, or
    // Q4_K's 16 f32 each.
    unsafe {
        if fmt.f32_scales() {
            let d = _mm512_loadu_ps(gb.add(qb).cast());
            return (d, _mm512_loadu_ps(gb.add(qb + 4 * NG).cast()));
        }
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(gb.add(qb).cast()));
        let m = if fmt.has_mins() {
            _mm512_cvtph_ps(_mm256_loadu_si256(gb.add(qb + 2 * NG).cast()))
        } else {
            _mm512_setzero_ps()
        };
        (d, m)
    }
}

/// The int8 kernel's tile, picked by whether the activations carry the
/// rounding residual, whether the format has mins (Q4_1, Q4_K) and whether
/// it has a scale per 16 values (Q6_K), so that the row loop of the kernel
/// is free of branches.
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn int8<const R: usize>(
    w: &QuantMatrix,
    x: &QuantizedRows,
    r0: usize,
    g: usize,
    tile: &mut [[f32; NG]; MR],
) {
    let res = x.residual.is_some();
    // SAFETY: as the caller's.
    unsafe {
        match (res, w.fmt.has_mins(), w.fmt.halves()) {
            (true, true, _) => int8_rows::<R, true, true, false>(w, x, r0, g, tile),
            (true, false, false) => int8_rows::<R, true, false, false>(w, x, r0, g, tile),
            (true, false, true) => int8_rows::<R, true, false, true>(w, x, r0, g, tile),
            (false, true, _) => int8_rows::<R, false, true, false>(w, x, r0, g, tile),
            (false, false, false) => int8_rows::<R, false, false, false>(w, x, r0, g, tile),
            (false, false, true) => int8_rows::<R, false, false, true>(w, x, r0, g, tile),
        }
    }
}

/// Rows `r0 .. r0 + R` of the int8 kernel over group `g`: per block, the
/// group's quants are loaded once and, for each row, the integer dot
/// products (`q.w`, then with `RES` times 128 plus `q2.w`; the rows'
/// chains interleaved, see [`chains`]), less the row-block's `corr`, are
/// scaled into that row's accumulator, which stays in a register across
/// the blocks. With `HALVES` (Q6_K) each 16 values
/// are a chain of their own, less their part of `corr`, scaled by their
/// own scale.
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn int8_rows<const R: usize, const RES: bool, const MINS: bool, const HALVES: bool>(
    w: &QuantMatrix,
    x: &QuantizedRows,
    r0: usize,
    g: usize,
    tile: &mut [[f32; NG]; MR],
) {
    let fmt = w.fmt;
    let blocks = w.blocks();
    let k = blocks * super::QK;
    let n_blocks = (r0 + R) * blocks;
    assert!(R <= MR && (r0 + R) * k <= x.q.len());
    assert!(n_blocks <= x.scale.len() && n_blocks <= x.corr.len() && n_blocks <= x.sx.len());
    assert!(!HALVES || n_blocks <= x.corr_lo.len());
    let q2 = match &x.residual {
        Some((q2, _)) => {
            assert!(q2.len() == x.q.len());
            q2.as_ptr()
        }
        None => {
            assert!(!RES);
            std::ptr::null()
        }
    };
    let mut acc = [_mm512_setzero_ps(); R];
    // The next group's blocks lie `blocks * stride` bytes on.
    let stride = fmt.stride();
    let next = blocks * stride;
    // A product of one row leaves the stream to the hardware: on a 2-core
    // Zen 4, SmolLM2 decoded 1.17-1.27x (Q8_0) and 1.03-1.08x (Q4_1)
    // faster at one stream without these prefetches. Products of several
    // rows keep them: without any, 16 streams ran 0.90x.
    let prefetch = r0 == 0 && (R > 1 || super::one_row_prefetch());
    for b in 0..blocks {
        let gb = w.group_block(g, b).as_ptr();
        if prefetch {
            // The first pass over this group prefetches the next one's block.
            super::prefetch_next_group(gb, next, stride);
        }
        // SAFETY: `gb` is a whole group-block; every row-block index below
        // is `(r0 + r) * blocks + b` < n_blocks for r < R, within the
        // arrays (asserted above), and a row-block's quants are the 32 at
        // `i * 32`.
        unsafe {
            let wq = quants(fmt, gb);
            let (d, m) = scales(fmt, gb);
            let idx: [usize; R] = std::array::from_fn(|r| (r0 + r) * blocks + b);
            let xq: [*const i8; R] = std::array::from_fn(|r| x.q.as_ptr().add(idx[r] * 32));
            let xq2: [*const i8; R] = std::array::from_fn(|r| q2.wrapping_add(idx[r] * 32));
            let xs: [__m512; R] =
                std::array::from_fn(|r| _mm512_set1_ps(*x.scale.get_unchecked(idx[r])));
            if HALVES {
                let lo = chains::<R, 0, 4, RES>(&wq, &xq, &xq2);
                let hi = chains::<R, 4, 8, RES>(&wq, &xq, &xq2);
                for r in 0..R {
                    let corr_lo = *x.corr_lo.get_unchecked(idx[r]);
                    let corr_hi = *x.corr.get_unchecked(idx[r]) - corr_lo;
                    let lo = _mm512_sub_epi32(lo[r], _mm512_set1_epi32(corr_lo));
                    let hi = _mm512_sub_epi32(hi[r], _mm512_set1_epi32(corr_hi));
                    acc[r] =
                        _mm512_fmadd_ps(_mm512_mul_ps(d, xs[r]), _mm512_cvtepi32_ps(lo), acc[r]);
                    acc[r] =
                        _mm512_fmadd_ps(_mm512_mul_ps(m, xs[r]), _mm512_cvtepi32_ps(hi), acc[r]);
                }
                continue;
            }
            let isum = chains::<R, 0, 8, RES>(&wq, &xq, &xq2);
            for r in 0..R {
                let i = idx[r];
                let isum = _mm512_sub_epi32(isum[r], _mm512_set1_epi32(*x.corr.get_unchecked(i)));
                acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, xs[r]), _mm512_cvtepi32_ps(isum), acc[r]);
                if MINS {
                    acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(*x.sx.get_unchecked(i)), acc[r]);
                }
            }
        }
    }
    for (t, a) in tile.iter_mut().zip(acc) {
        // SAFETY: a tile row holds 16 floats.
        unsafe { _mm512_storeu_ps(t.as_mut_ptr(), a) };
    }
}

/// The R rows' chains over the quant vectors `wq[Q0..Q1]` (4 k a vector:
/// a block's 8, or a half's 4): per row `q.w` with the activations' quants
/// at `xq[r]` (from k = 4 * Q0), or with `RES` `128 q.w + q2.w` with the
/// residual's at `xq2[r]`. The rows' chains advance together, k by k, so
/// that R independent dot products are in flight (one row's chain alone is
/// bound by `vpdpbusd`'s latency); the sums are exact, so the order is
/// free. Each `xq[r]` (and with `RES` `xq2[r]`) must address 32 readable
/// bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
// Index loops: the constant bounds unroll to registers (an iterator over
// `wq` here did not, and ran 3x slower).
#[allow(clippy::needless_range_loop)]
unsafe fn chains<const R: usize, const Q0: usize, const Q1: usize, const RES: bool>(
    wq: &[__m512i; 8],
    xq: &[*const i8; R],
    xq2: &[*const i8; R],
) -> [__m512i; R] {
    let mut isum = [_mm512_setzero_si512(); R];
    // SAFETY: as the caller's: each pointer addresses a row-block's 32
    // int8, read 4 at a time at k = 4q < 32.
    unsafe {
        for q in Q0..Q1 {
            for r in 0..R {
                let x4 = xq[r].cast::<i32>().add(q).read_unaligned();
                isum[r] = _mm512_dpbusd_epi32(isum[r], wq[q], _mm512_set1_epi32(x4));
            }
        }
        if RES {
            for v in isum.iter_mut() {
                *v = _mm512_slli_epi32::<7>(*v);
            }
            for q in Q0..Q1 {
                for r in 0..R {
                    let x4 = xq2[r].cast::<i32>().add(q).read_unaligned();
                    isum[r] = _mm512_dpbusd_epi32(isum[r], wq[q], _mm512_set1_epi32(x4));
                }
            }
        }
    }
    isum
}

#[target_feature(enable = "avx512f")]
unsafe fn float<const R: usize>(
    w: &QuantMatrix,
    x: &F32Rows,
    r0: usize,
    g: usize,
    tile: &mut [[f32; NG]; MR],
) {
    let fmt = w.fmt;
    let off = _mm512_set1_epi32(fmt.offset());
    let byte = _mm512_set1_epi32(0xff);
    let mut acc = [_mm512_setzero_ps(); R];
    for b in 0..w.blocks() {
        let gb = w.group_block(g, b).as_ptr();
        // SAFETY: `gb` is a whole group-block.
        let (wq, (d, m)) = unsafe { (quants(fmt, gb), scales(fmt, gb)) };
        let xs: [(&[f32], f32); R] = std::array::from_fn(|r| x.block(r0 + r, b));
        // Q6_K's first 16 values are summed apart from the second 16.
        let mut blk = [_mm512_setzero_ps(); R];
        let mut blk_lo = [_mm512_setzero_ps(); R];
        for (q, &v) in wq.iter().enumerate() {
            if q == 4 && fmt.halves() {
                blk_lo = blk;
                blk = [_mm512_setzero_ps(); R];
            }
            let lanes = [
                v,
                _mm512_srli_epi32::<8>(v),
                _mm512_srli_epi32::<16>(v),
                _mm512_srli_epi32::<24>(v),
            ];
            for (j, l) in lanes.into_iter().enumerate() {
                let vals = _mm512_sub_epi32(_mm512_and_si512(l, byte), off);
                let wf = _mm512_cvtepi32_ps(vals);
                for (bk, (xb, _)) in blk.iter_mut().zip(&xs) {
                    *bk = _mm512_fmadd_ps(wf, _mm512_set1_ps(xb[4 * q + j]), *bk);
                }
            }
        }
        for (((a, bk), lo), (_, xsum)) in acc.iter_mut().zip(blk).zip(blk_lo).zip(&xs) {
            if fmt.halves() {
                *a = _mm512_fmadd_ps(d, lo, *a);
                *a = _mm512_fmadd_ps(m, bk, *a);
                continue;
            }
            *a = _mm512_fmadd_ps(d, bk, *a);
            if fmt.has_mins() {
                *a = _mm512_fmadd_ps(m, _mm512_set1_ps(*xsum), *a);
            }
        }
    }
    for (t, a) in tile.iter_mut().zip(acc) {
        // SAFETY: a tile row holds 16 floats.
        unsafe { _mm512_storeu_ps(t.as_mut_ptr(), a) };
    }
}
