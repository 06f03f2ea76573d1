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
    // SAFETY: a group-block starts with 512 (Q8_0) or 256 (Q4) bytes of quants.
    unsafe {
        if fmt == Format::Q8_0 {
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

/// The 16 columns' scales and (Q4_1, Q4_K) mins of a group-block.
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
/// rounding residual and whether the format has mins (Q4_1, Q4_K), so that the
/// row loop of the kernel is free of branches.
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn int8<const R: usize>(
    w: &QuantMatrix,
    x: &QuantizedRows,
    r0: usize,
    g: usize,
    tile: &mut [[f32; NG]; MR],
) {
    let res = x.residual.is_some();
    let mins = w.fmt.has_mins();
    // SAFETY: as the caller's.
    unsafe {
        match (res, mins) {
            (true, true) => int8_rows::<R, true, true>(w, x, r0, g, tile),
            (true, false) => int8_rows::<R, true, false>(w, x, r0, g, tile),
            (false, true) => int8_rows::<R, false, true>(w, x, r0, g, tile),
            (false, false) => int8_rows::<R, false, false>(w, x, r0, g, tile),
        }
    }
}

/// Rows `r0 .. r0 + R` of the int8 kernel over group `g`: per block, the
/// group's quants are loaded once and, for each row, one chain of integer
/// dot products (`q.w`, then with `RES` times 128 plus `q2.w`), less the
/// row-block's `corr`, is scaled into that row's accumulator, which stays
/// in a register across the blocks.
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn int8_rows<const R: usize, const RES: bool, const MINS: bool>(
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
                let mut isum = dot_chain(_mm512_setzero_si512(), &wq, x.q.as_ptr().add(i * 32));
                if RES {
                    isum = dot_chain(_mm512_slli_epi32::<7>(isum), &wq, q2.add(i * 32));
                }
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

/// `acc` plus the 16 columns' integer dot products of one block's
/// unsigned quants with the int8 activations at `xq` (32 values, read 4 at
/// a time and broadcast): exact, one chain (the rows of a tile are
/// independent chains). `xq` must address 32 readable bytes.
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn dot_chain(mut acc: __m512i, wq: &[__m512i; 8], xq: *const i8) -> __m512i {
    let xp = xq.cast::<i32>();
    for (q, &wv) in wq.iter().enumerate() {
        // SAFETY: xq holds 32 int8, read 4 at a time (q < 8).
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
        let mut blk = [_mm512_setzero_ps(); R];
        for (q, &v) in wq.iter().enumerate() {
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
        for ((a, bk), (_, xsum)) in acc.iter_mut().zip(blk).zip(&xs) {
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
