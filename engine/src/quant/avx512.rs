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
/// group's quants are loaded once and, for each row, one chain of integer
/// dot products (`q.w`, then with `RES` times 128 plus `q2.w`), less the
/// row-block's `corr`, is scaled into that row's accumulator, which stays
/// in a register across the blocks. With `HALVES` (Q6_K) each 16 values
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
    for b in 0..blocks {
        let gb = w.group_block(g, b).as_ptr();
        // SAFETY: `gb` is a whole group-block; every row-block index below
        // is `(r0 + r) * blocks + b` < n_blocks for r < R, within the
        // arrays (asserted above), and a row-block's quants are the 32 at
        // `i * 32`.
        unsafe {
            let wq = quants(fmt, gb);
            let (d, m) = scales(fmt, gb);
            for (r, a) in acc.iter_mut().enumerate() {
                let i = (r0 + r) * blocks + b;
                let (xq, xq2) = (x.q.as_ptr().add(i * 32), q2.wrapping_add(i * 32));
                if HALVES {
                    let (wlo, whi) = wq.split_at(4);
                    let (wlo, whi): (&[__m512i; 4], &[__m512i; 4]) = (
                        wlo.try_into().unwrap_unchecked(),
                        whi.try_into().unwrap_unchecked(),
                    );
                    let corr_lo = *x.corr_lo.get_unchecked(i);
                    let corr_hi = *x.corr.get_unchecked(i) - corr_lo;
                    let lo = chain::<4, RES>(wlo, xq, xq2);
                    let hi = chain::<4, RES>(whi, xq.add(16), xq2.wrapping_add(16));
                    let lo = _mm512_sub_epi32(lo, _mm512_set1_epi32(corr_lo));
                    let hi = _mm512_sub_epi32(hi, _mm512_set1_epi32(corr_hi));
                    let xs = _mm512_set1_ps(*x.scale.get_unchecked(i));
                    *a = _mm512_fmadd_ps(_mm512_mul_ps(d, xs), _mm512_cvtepi32_ps(lo), *a);
                    *a = _mm512_fmadd_ps(_mm512_mul_ps(m, xs), _mm512_cvtepi32_ps(hi), *a);
                    continue;
                }
                let isum = chain::<8, RES>(&wq, xq, xq2);
                let isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(*x.corr.get_unchecked(i)));
                let scale = _mm512_mul_ps(d, _mm512_set1_ps(*x.scale.get_unchecked(i)));
                *a = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(isum), *a);
                if MINS {
                    *a = _mm512_fmadd_ps(m, _mm512_set1_ps(*x.sx.get_unchecked(i)), *a);
                }
            }
        }
    }
    for (t, a) in tile.iter_mut().zip(acc) {
        // SAFETY: a tile row holds 16 floats.
        unsafe { _mm512_storeu_ps(t.as_mut_ptr(), a) };
    }
}

/// One row-block's chain over the quant vectors `wq` (4 k a vector: a
/// block's 8, or a half's 4): `q.w` with the activations' quants at `xq`,
/// or with `RES` `128 q.w + q2.w` with the residual's at `xq2`. Both must
/// address `4 * N` readable bytes (`xq2` only with `RES`).
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn chain<const N: usize, const RES: bool>(
    wq: &[__m512i; N],
    xq: *const i8,
    xq2: *const i8,
) -> __m512i {
    // SAFETY: as the caller's.
    unsafe {
        let isum = dot_chain(_mm512_setzero_si512(), wq, xq);
        if RES {
            dot_chain(_mm512_slli_epi32::<7>(isum), wq, xq2)
        } else {
            isum
        }
    }
}

/// `acc` plus the 16 columns' integer dot products of a block's unsigned
/// quants `wq` (4 k a vector) with the int8 activations at `xq` (read 4 at
/// a time and broadcast): exact, one chain (the rows of a tile are
/// independent chains). `xq` must address `4 * N` readable bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn dot_chain<const N: usize>(mut acc: __m512i, wq: &[__m512i; N], xq: *const i8) -> __m512i {
    let xp = xq.cast::<i32>();
    for (q, &wv) in wq.iter().enumerate() {
        // SAFETY: xq holds 4 * wq.len() int8, read 4 at a time.
        let x4 = unsafe { xp.add(q).read_unaligned() };
        acc = _mm512_dpbusd_epi32(acc, wv, _mm512_set1_epi32(x4));
    }
    acc
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
