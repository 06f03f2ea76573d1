//! The AVX2 kernels, for CPUs without AVX-512 VNNI: the same tile (R rows
//! x 16 columns over one group, every block in k order) as two halves of
//! 8 columns, one 256-bit vector each, with the same integer results and
//! the same float operations as the portable kernels, so all three agree
//! to the bit.
//!
//! AVX2 has no `vpdpbusd`; a block's integer dot products come from
//! `vpmaddubsw` (unsigned x signed bytes, adjacent pairs summed into int16)
//! and `vpmaddwd` by ones (pairs of int16 into int32), as llama.cpp does.
//! The int16 pair sum saturates past 32767, so:
//! - Q4_0/Q4_1/Q4_K quants (0..15) go in unsigned as stored: a pair is at most
//!   2 * 15 * 128, and the eight of a block are summed in int16 before the
//!   widening.
//! - Q8_0's (stored offset by 128) are taken back to signed and multiplied
//!   as `|w| x sign(x, w)` (at most 2 * 128 * 127 per pair), each widened
//!   alone; the offset is then not taken off (its correction is not
//!   applied), since the product is already the signed one. The activation
//!   quants are within [-127, 127] (see `activations.rs`), so the sign flip
//!   never overflows.
//! - Q6_K's (0..63) go in unsigned as stored (a pair at most 2 * 63 * 128),
//!   each widened alone, each 16 values' products summed apart (one scale
//!   each).
//!
//! Byte quants (Q8_0, Q6_K) take another way (which int8 activations
//! without the residual take too, as int16 `q`: one `vpmaddwd` chain
//! instead of `vpmaddubsw`, its sign flips and a `vpmaddwd` by ones; the
//! same integers): the activations come as int16 `128 q + q2`
//! ([`QuantizedRows::wide`]) and
//! the quants, unsigned as stored, are widened to int16 (for two rows at
//! a time, [`wide_rows`]), so each block's `128 q.w + q2.w` is one chain
//! of `vpmaddwd` (pairs of int16 products summed into int32) instead of
//! two chains of `vpmaddubsw` and `vpmaddwd`. Each product is at most
//! 255 * 16,449 in magnitude and a block's 32 sum to under 2^28, so the
//! integers are exact and equal the two chains'. (For Q4 at one to three
//! rows, whose quants are summed in int16 before any widening, the int16
//! way measured slower; from four rows every format takes it, with the
//! quants widened once for all rows, in `panel.rs`.)

#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::{F32Rows, Format, MR, NG, QuantMatrix, QuantizedRows, Rows};

/// Whether this CPU runs these kernels.
pub(super) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
}

/// One tile of `n_rows` rows from `r0`, columns of group `g`. The caller
/// checked the CPU ([`available`]).
pub(super) fn tile(
    w: &QuantMatrix,
    rows: &Rows,
    r0: usize,
    n_rows: usize,
    g: usize,
    tile: &mut [[f32; NG]; MR],
) {
    if let Rows::Int8(x) = rows
        && !x.wide.is_empty()
        && w.fmt.byte_quants()
    {
        // Two rows at a time, an odd last one alone.
        let mut j = 0;
        while j + 2 <= n_rows {
            // SAFETY: the CPU has AVX2, FMA and F16C (checked by the caller).
            unsafe { wide_rows::<2>(w, x, r0 + j, g, &mut tile[j..]) };
            j += 2;
        }
        if j < n_rows {
            // SAFETY: as above.
            unsafe { wide_rows::<1>(w, x, r0 + j, g, &mut tile[j..]) };
        }
        return;
    }
    if let Rows::Int8(x) = rows
        && n_rows == 1
        && !w.fmt.byte_quants()
    {
        // SAFETY: as above.
        unsafe { nibbles_one(w, x, r0, g, &mut tile[0]) };
        return;
    }
    for h in 0..2 {
        // SAFETY: the CPU has AVX2, FMA and F16C (checked by the caller).
        unsafe {
            match rows {
                Rows::Int8(x) => int8(w, x, r0, n_rows, g, h, tile),
                Rows::F32(x) => float(w, x, r0, n_rows, g, h, tile),
            }
        }
    }
}

/// Half `h`'s 8 vectors of one group-block's quants as stored (Q8_0:
/// unsigned, offset by 128; Q6_K: 0..63; Q4: 0..15): vector q holds k = 4q .. 4q+4 of
/// columns 8h .. 8h+8 (column c in 32-bit lane c).
#[target_feature(enable = "avx2")]
unsafe fn quants(fmt: Format, gb: *const u8, h: usize) -> [__m256i; 8] {
    let mut wq = [_mm256_setzero_si256(); 8];
    // SAFETY: a group-block starts with 512 (Q8_0, Q6_K) or 256 (Q4) bytes
    // of quants, 64 per vector of 16 columns, half h at 32 h.
    unsafe {
        if fmt.byte_quants() {
            for (q, v) in wq.iter_mut().enumerate() {
                *v = _mm256_loadu_si256(gb.add(q * 64 + h * 32).cast());
            }
        } else {
            let low = _mm256_set1_epi8(0x0f);
            for p in 0..4 {
                let v = _mm256_loadu_si256(gb.add(p * 64 + h * 32).cast());
                wq[p] = _mm256_and_si256(v, low);
                wq[p + 4] = _mm256_and_si256(_mm256_srli_epi32::<4>(v), low);
            }
        }
    }
    wq
}

/// Half `h`'s 8 scales and (Q4_1, Q4_K) mins, or (Q6_K) 8 scales of the
/// first and of the second 16 values, of a group-block.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn scales(fmt: Format, gb: *const u8, h: usize) -> (__m256, __m256) {
    let qb = fmt.quant_bytes();
    // SAFETY: the 16 scales (and 16 mins) follow the quants: f16, or
    // Q4_K's f32.
    unsafe {
        if fmt.f32_scales() {
            let d = _mm256_loadu_ps(gb.add(qb + 32 * h).cast());
            return (d, _mm256_loadu_ps(gb.add(qb + 4 * NG + 32 * h).cast()));
        }
        let d = _mm256_cvtph_ps(_mm_loadu_si128(gb.add(qb + 16 * h).cast()));
        let m = if fmt.has_mins() {
            _mm256_cvtph_ps(_mm_loadu_si128(gb.add(qb + 2 * NG + 16 * h).cast()))
        } else {
            _mm256_setzero_ps()
        };
        (d, m)
    }
}

/// The 8 columns' exact integer dot products of one block with the 32
/// int8 activations at `xq`; for Q8_0 `wq` holds the quants made signed
/// and `mag` their magnitudes (see the module comment), unused for Q4 and
/// Q6_K. Q6_K's is that of the quant vectors `vs` alone (4 k each; a
/// half's), the activations from `xq + 4 * vs.start`.
#[target_feature(enable = "avx2")]
unsafe fn block_dot(
    fmt: Format,
    wq: &[__m256i; 8],
    mag: &[__m256i; 8],
    xq: *const i8,
    vs: std::ops::Range<usize>,
) -> __m256i {
    let xp = xq.cast::<i32>();
    let ones = _mm256_set1_epi16(1);
    // SAFETY: xq holds 32 int8, read 4 at a time.
    let x4 = |q: usize| _mm256_set1_epi32(unsafe { xp.add(q).read_unaligned() });
    if fmt == Format::Q8_0 {
        let mut acc = _mm256_setzero_si256();
        for q in 0..8 {
            let p = _mm256_maddubs_epi16(mag[q], _mm256_sign_epi8(x4(q), wq[q]));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, ones));
        }
        acc
    } else if fmt == Format::Q6K {
        let mut acc = _mm256_setzero_si256();
        for q in vs {
            let p = _mm256_maddubs_epi16(wq[q], x4(q));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, ones));
        }
        acc
    } else {
        let mut s16 = _mm256_setzero_si256();
        for (q, &wv) in wq.iter().enumerate() {
            s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(wv, x4(q)));
        }
        _mm256_madd_epi16(s16, ones)
    }
}

/// What [`int8`] and [`wide_rows`] read without bounds checks: `values`
/// activations (quants, or wide ones) for the first `rows` rows, and each
/// of their blocks' scale, corrections and sums.
pub(super) fn check(fmt: Format, x: &QuantizedRows, values: usize, rows: usize, blocks: usize) {
    let n_blocks = rows * blocks;
    assert!(rows * blocks * super::QK <= values);
    assert!(n_blocks <= x.scale.len() && n_blocks <= x.corr.len() && n_blocks <= x.sx.len());
    assert!(!fmt.halves() || n_blocks <= x.corr_lo.len());
}

/// Adds row-block `i`'s products to the accumulator `a`: the block's
/// integer sums from `chain` over the quant vectors (Q6_K's two halves
/// apart), less the offset's correction where `corrected`, times the
/// weight's scale `d` (Q6_K's second half: `m`) and the activations'
/// scale; for Q4_1 and Q4_K plus the mins `m` times the block's sum.
///
/// # Safety
/// The CPU has AVX2 and FMA; `i` is within the rows' blocks.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn add_block(
    fmt: Format,
    corrected: bool,
    (d, m): (__m256, __m256),
    x: &QuantizedRows,
    i: usize,
    chain: impl Fn(std::ops::Range<usize>) -> __m256i,
    a: &mut __m256,
) {
    // SAFETY: i < the blocks' count (the caller's promise).
    unsafe {
        if fmt.halves() {
            let corr_lo = *x.corr_lo.get_unchecked(i);
            let corr_hi = *x.corr.get_unchecked(i) - corr_lo;
            let lo = _mm256_sub_epi32(chain(0..4), _mm256_set1_epi32(corr_lo));
            let hi = _mm256_sub_epi32(chain(4..8), _mm256_set1_epi32(corr_hi));
            let xs = _mm256_set1_ps(*x.scale.get_unchecked(i));
            *a = _mm256_fmadd_ps(_mm256_mul_ps(d, xs), _mm256_cvtepi32_ps(lo), *a);
            *a = _mm256_fmadd_ps(_mm256_mul_ps(m, xs), _mm256_cvtepi32_ps(hi), *a);
            return;
        }
        let mut isum = chain(0..8);
        if corrected {
            isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(*x.corr.get_unchecked(i)));
        }
        let scale = _mm256_mul_ps(d, _mm256_set1_ps(*x.scale.get_unchecked(i)));
        *a = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(isum), *a);
        if fmt.has_mins() {
            *a = _mm256_fmadd_ps(m, _mm256_set1_ps(*x.sx.get_unchecked(i)), *a);
        }
    }
}

/// The first `n_rows` accumulators into half `h` of the tile's rows.
#[target_feature(enable = "avx2")]
fn store(tile: &mut [[f32; NG]; MR], acc: &[__m256; MR], n_rows: usize, h: usize) {
    for (t, a) in tile.iter_mut().zip(acc).take(n_rows) {
        // SAFETY: a tile row holds 16 floats; half h (< 2) is 8 of them at
        // 8 h.
        unsafe { _mm256_storeu_ps(t.as_mut_ptr().add(8 * h), *a) };
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn int8(
    w: &QuantMatrix,
    x: &QuantizedRows,
    r0: usize,
    n_rows: usize,
    g: usize,
    h: usize,
    tile: &mut [[f32; NG]; MR],
) {
    let fmt = w.fmt;
    let blocks = w.blocks();
    check(fmt, x, x.q.len(), r0 + n_rows, blocks);
    assert!(n_rows <= MR);
    let q2 = x.residual.as_ref().map(|(q2, _)| {
        assert!(q2.len() == x.q.len());
        q2.as_ptr()
    });
    // Q8_0's integer products are the signed ones: no offset to take off.
    let corrected = fmt != Format::Q8_0;
    let flip = _mm256_set1_epi8(-128);
    let mut acc = [_mm256_setzero_ps(); MR];
    // The next group's blocks lie `blocks * stride` bytes on.
    let stride = fmt.stride();
    let next = blocks * stride;
    for b in 0..blocks {
        let gb = w.group_block(g, b).as_ptr();
        if r0 == 0 && h == 0 {
            // The first pass over this group prefetches the next one's block.
            super::prefetch_next_group(gb, next, stride);
        }
        // SAFETY: `gb` is a whole group-block; each row-block index is
        // `(r0 + r) * blocks + b` < n_blocks, within the arrays (asserted
        // above), its quants the 32 at `i * 32`.
        unsafe {
            let mut wq = quants(fmt, gb, h);
            let mut mag = [_mm256_setzero_si256(); 8];
            if fmt == Format::Q8_0 {
                for (v, m) in wq.iter_mut().zip(mag.iter_mut()) {
                    *v = _mm256_xor_si256(*v, flip);
                    *m = _mm256_abs_epi8(*v);
                }
            }
            let (d, m) = scales(fmt, gb, h);
            for (r, a) in acc.iter_mut().enumerate().take(n_rows) {
                let i = (r0 + r) * blocks + b;
                // The chain over the quant vectors `vs`: `q.w`, or
                // `128 q.w + q2.w`.
                let chain = |vs: std::ops::Range<usize>| {
                    let isum = block_dot(fmt, &wq, &mag, x.q.as_ptr().add(i * 32), vs.clone());
                    match q2 {
                        Some(q2) => {
                            let isum2 = block_dot(fmt, &wq, &mag, q2.add(i * 32), vs);
                            _mm256_add_epi32(_mm256_slli_epi32::<7>(isum), isum2)
                        }
                        None => isum,
                    }
                };
                add_block(fmt, corrected, (d, m), x, i, chain, a);
            }
        }
    }
    store(tile, &acc, n_rows, h);
}

/// [`int8`] for byte quants (Q8_0, Q6_K), through int16
/// products (see the module comment), `R` rows (one or two) at a time,
/// both halves of the group in one pass: per block and k-quad, the 16
/// columns' quants as stored (unsigned) widened to 4 vectors of int16
/// (columns 0, 1, 4, 5 of a half, then 2, 3, 6, 7) and, with each row's
/// 4 int16 activations broadcast, `vpmaddwd` gives each column's two pair
/// sums in adjacent lanes, which one horizontal add per block brings to
/// column order; the offset's correction is then taken off as for Q4.
///
/// Two rows' sums (8 vectors), the widened quants (4) and the broadcast
/// activations (2) fit AVX2's 16 registers. Widening a whole block of a
/// half first and sharing it between up to 8 rows, as this kernel's
/// predecessor did, spilled those 16 vectors to the stack and read them
/// back for every row: on a Zen 3, two rows at a time measured 1.2x its
/// speed for Gemma 3's 262,144 x 640 vocabulary projection at 16 rows,
/// and one row alone 1.2-1.3x for weights in the caches.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn wide_rows<const R: usize>(
    w: &QuantMatrix,
    x: &QuantizedRows,
    r: usize,
    g: usize,
    out: &mut [[f32; NG]],
) {
    let fmt = w.fmt;
    let blocks = w.blocks();
    check(fmt, x, x.wide.len(), r + R, blocks);
    assert!(fmt.byte_quants() && out.len() >= R);
    // Q6_K's two 16-value halves are summed apart (one scale each); the
    // other formats' second range is empty.
    let parts = if fmt.halves() {
        [0..4, 4..8]
    } else {
        [0..8, 8..8]
    };
    let zero = _mm256_setzero_si256();
    let stride = fmt.stride();
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    for b in 0..blocks {
        let gb = w.group_block(g, b).as_ptr();
        if r == 0 {
            super::prefetch_next_group(gb, blocks * stride, stride);
        }
        // SAFETY: `gb` is a whole group-block (512 bytes of quants, then
        // the scales); the row-block indices `(r + j) * blocks + b` are
        // within the checked arrays, their 32 wide activations at `i * 32`.
        unsafe {
            let i: [usize; R] = std::array::from_fn(|j| (r + j) * blocks + b);
            let sc = [scales(fmt, gb, 0), scales(fmt, gb, 1)];
            for (p, vs) in parts.iter().enumerate().filter(|(_, vs)| !vs.is_empty()) {
                let mut sums = [[zero; 4]; R];
                for q in vs.clone() {
                    let mut wv = [zero; 4];
                    for h in 0..2 {
                        let v = _mm256_loadu_si256(gb.add(q * 64 + h * 32).cast());
                        wv[2 * h] = _mm256_unpacklo_epi8(v, zero);
                        wv[2 * h + 1] = _mm256_unpackhi_epi8(v, zero);
                    }
                    for (s, &i) in sums.iter_mut().zip(&i) {
                        let xp = x.wide.as_ptr().add(i * 32 + 4 * q);
                        let xv = _mm256_set1_epi64x(xp.cast::<i64>().read_unaligned());
                        for (s, &wv) in s.iter_mut().zip(&wv) {
                            *s = _mm256_add_epi32(*s, _mm256_madd_epi16(wv, xv));
                        }
                    }
                }
                for ((sums, acc), &i) in sums.iter().zip(acc.iter_mut()).zip(&i) {
                    let corr = match (fmt.halves(), p) {
                        (false, _) => *x.corr.get_unchecked(i),
                        (true, 0) => *x.corr_lo.get_unchecked(i),
                        (true, _) => *x.corr.get_unchecked(i) - *x.corr_lo.get_unchecked(i),
                    };
                    let xs = _mm256_set1_ps(*x.scale.get_unchecked(i));
                    for (h, a) in acc.iter_mut().enumerate() {
                        // Pair sums [c0 c0 c1 c1 | c4 c4 c5 c5] and [c2 c2
                        // c3 c3 | c6 c6 c7 c7] added into column order, less
                        // the offset's correction (the quants are unsigned
                        // here), times the half's scale: Q6_K's second 16
                        // values take the second.
                        let isum = _mm256_hadd_epi32(sums[2 * h], sums[2 * h + 1]);
                        let isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(corr));
                        let d = if p == 0 { sc[h].0 } else { sc[h].1 };
                        *a = _mm256_fmadd_ps(_mm256_mul_ps(d, xs), _mm256_cvtepi32_ps(isum), *a);
                    }
                }
            }
        }
    }
    for (o, acc) in out.iter_mut().zip(&acc) {
        for (h, a) in acc.iter().enumerate() {
            // SAFETY: a row of `out` holds 16 floats, half h's 8 at 8 h.
            unsafe { _mm256_storeu_ps(o.as_mut_ptr().add(8 * h), *a) };
        }
    }
}

/// The one-row kernels' loop over group `g`'s blocks: `block` gets each
/// group-block, its row-block index and both halves' accumulators (the
/// first row's pass prefetches the next group's block); then the
/// accumulators go to `out`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn one_row(
    w: &QuantMatrix,
    r: usize,
    g: usize,
    out: &mut [f32; NG],
    mut block: impl FnMut(*const u8, usize, &mut [__m256; 2]),
) {
    let blocks = w.blocks();
    let stride = w.fmt.stride();
    let mut acc = [_mm256_setzero_ps(); 2];
    for b in 0..blocks {
        let gb = w.group_block(g, b).as_ptr();
        if r == 0 {
            super::prefetch_next_group(gb, blocks * stride, stride);
        }
        block(gb, r * blocks + b, &mut acc);
    }
    for (h, a) in acc.into_iter().enumerate() {
        // SAFETY: `out` holds 16 floats, half h's 8 at 8 h.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(8 * h), a) };
    }
}

/// [`int8`] for one row of Q4_0, Q4_1 or Q4_K (with or without the
/// residual), both halves of the group in one pass and every value in a
/// register, as [`wide_rows`]: the int16 sums are added in another order,
/// which changes nothing (they are exact), so the same bits.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles_one(w: &QuantMatrix, x: &QuantizedRows, r: usize, g: usize, out: &mut [f32; NG]) {
    let fmt = w.fmt;
    let blocks = w.blocks();
    check(fmt, x, x.q.len(), r + 1, blocks);
    assert!(!fmt.byte_quants() && !fmt.halves());
    let q2 = x.residual.as_ref().map(|(q2, _)| {
        assert!(q2.len() == x.q.len());
        q2.as_ptr()
    });
    let (zero, low, ones) = (
        _mm256_setzero_si256(),
        _mm256_set1_epi8(0x0f),
        _mm256_set1_epi16(1),
    );
    one_row(w, r, g, out, |gb, i, acc| {
        // SAFETY: `gb` is a whole group-block (256 bytes of quants, 64 per
        // vector of 16 columns, half h at 32 h, then the scales); the
        // row-block index i is within the checked arrays, its 32 quants
        // (and residuals) at `i * 32`, read 4 at a time.
        unsafe {
            let x4 = |p: *const i8, q: usize| {
                _mm256_set1_epi32(p.add(i * 32).cast::<i32>().add(q).read_unaligned())
            };
            // int16 sums of the quants' and of the residuals' products, per
            // half: a pair is at most 2 * 15 * 127 and each sum takes eight.
            let (mut s, mut t) = ([zero; 2], [zero; 2]);
            for p in 0..4 {
                // Vector p holds k = 4p .. 4p + 4 in its low nibbles and
                // k = 16 + 4p .. in its high ones.
                let (xl, xh) = (x4(x.q.as_ptr(), p), x4(x.q.as_ptr(), p + 4));
                let r2 = q2.map(|q2| (x4(q2, p), x4(q2, p + 4)));
                for h in 0..2 {
                    let v = _mm256_loadu_si256(gb.add(p * 64 + h * 32).cast());
                    let lo = _mm256_and_si256(v, low);
                    let hi = _mm256_and_si256(_mm256_srli_epi32::<4>(v), low);
                    s[h] = _mm256_add_epi16(s[h], _mm256_maddubs_epi16(lo, xl));
                    s[h] = _mm256_add_epi16(s[h], _mm256_maddubs_epi16(hi, xh));
                    if let Some((yl, yh)) = r2 {
                        t[h] = _mm256_add_epi16(t[h], _mm256_maddubs_epi16(lo, yl));
                        t[h] = _mm256_add_epi16(t[h], _mm256_maddubs_epi16(hi, yh));
                    }
                }
            }
            for (h, a) in acc.iter_mut().enumerate() {
                let isum = _mm256_madd_epi16(s[h], ones);
                let isum = match q2 {
                    Some(_) => _mm256_add_epi32(
                        _mm256_slli_epi32::<7>(isum),
                        _mm256_madd_epi16(t[h], ones),
                    ),
                    None => isum,
                };
                add_block(fmt, true, scales(fmt, gb, h), x, i, |_| isum, a);
            }
        }
    });
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn float(
    w: &QuantMatrix,
    x: &F32Rows,
    r0: usize,
    n_rows: usize,
    g: usize,
    h: usize,
    tile: &mut [[f32; NG]; MR],
) {
    let fmt = w.fmt;
    let off = _mm256_set1_epi32(fmt.offset());
    let byte = _mm256_set1_epi32(0xff);
    let mut acc = [_mm256_setzero_ps(); MR];
    for b in 0..w.blocks() {
        let gb = w.group_block(g, b).as_ptr();
        // SAFETY: `gb` is a whole group-block.
        let (wq, (d, m)) = unsafe { (quants(fmt, gb, h), scales(fmt, gb, h)) };
        for (r, a) in acc.iter_mut().enumerate().take(n_rows) {
            let (xb, xsum) = x.block(r0 + r, b);
            // Q6_K's first 16 values are summed apart from the second 16.
            let mut blk = _mm256_setzero_ps();
            let mut blk_lo = _mm256_setzero_ps();
            for (q, &v) in wq.iter().enumerate() {
                if q == 4 && fmt.halves() {
                    blk_lo = blk;
                    blk = _mm256_setzero_ps();
                }
                for j in 0..4 {
                    let l = match j {
                        0 => v,
                        1 => _mm256_srli_epi32::<8>(v),
                        2 => _mm256_srli_epi32::<16>(v),
                        _ => _mm256_srli_epi32::<24>(v),
                    };
                    let wf = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(l, byte), off));
                    blk = _mm256_fmadd_ps(wf, _mm256_set1_ps(xb[4 * q + j]), blk);
                }
            }
            if fmt.halves() {
                *a = _mm256_fmadd_ps(d, blk_lo, *a);
                *a = _mm256_fmadd_ps(m, blk, *a);
                continue;
            }
            *a = _mm256_fmadd_ps(d, blk, *a);
            if fmt.has_mins() {
                *a = _mm256_fmadd_ps(m, _mm256_set1_ps(xsum), *a);
            }
        }
    }
    for (t, a) in tile.iter_mut().zip(acc).take(n_rows) {
        // SAFETY: a tile row holds 16 floats; half h is 8 of them at 8 h.
        unsafe { _mm256_storeu_ps(t.as_mut_ptr().add(8 * h), a) };
    }
}
