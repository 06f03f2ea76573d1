//! The decode attention of one sequence with AVX-512, for head dims of 16,
//! 32, 64, 128 and 256 (one to sixteen 16-float vectors per head): the
//! same three passes as the portable body (scores, softmax, weighted sum
//! of values), shaped as the AVX2 kernel's.
//!
//! Scores go sixteen keys at a time: one accumulator a key, each key's
//! vectors read once per query head, and the sixteen sums reduced together
//! into one vector by a tree of in-lane unpacks and lane shuffles (45
//! operations where reducing each key's sum alone took 16 chains of
//! eight). Values go for up to four query heads of the KV group at once,
//! over 64 floats of the head a pass: each value vector read once for all
//! of them, into up to 16 independent accumulators.

#![allow(unsafe_code)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::{AHEAD, DecodeSeq, Heads, KvElem, prefetch_row, softmax_rows};

/// Runs the sequence's attention for the query heads of KV heads `gs`
/// (`out`: theirs alone) when its head dim is one of the sizes above, and
/// says whether it did. The caller checked the CPU for AVX-512F.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
pub(super) fn one_seq<T: KvElem>(
    q: &[f32],
    k: &[T],
    v: &[T],
    s: &DecodeSeq<'_>,
    h: Heads,
    gs: Range<usize>,
    out: &mut [f32],
    stats: &mut [f32],
) -> bool {
    match h.head_dim {
        16 => body::<1, T>(q, k, v, s, h, gs, out, stats),
        32 => body::<2, T>(q, k, v, s, h, gs, out, stats),
        64 => body::<4, T>(q, k, v, s, h, gs, out, stats),
        128 => body::<8, T>(q, k, v, s, h, gs, out, stats),
        256 => body::<16, T>(q, k, v, s, h, gs, out, stats),
        _ => return false,
    }
    true
}

/// One head's `V` vectors at the start of `row`, widened to float32.
#[inline(always)]
fn load<const V: usize, T: KvElem>(row: &[T]) -> [__m512; V] {
    assert!(row.len() >= 16 * V);
    // SAFETY: `row` holds 16 * V elements (checked above); AVX-512F is
    // enabled in every caller.
    std::array::from_fn(|c| unsafe { T::load16(row.as_ptr().add(16 * c)) })
}

#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
fn body<const V: usize, T: KvElem>(
    q: &[f32],
    k: &[T],
    v: &[T],
    s: &DecodeSeq<'_>,
    h: Heads,
    gs: Range<usize>,
    out: &mut [f32],
    stats: &mut [f32],
) {
    let hd = 16 * V;
    let group = h.heads / h.kv_heads;
    let t = s.slots.len();
    let mut scores = vec![0f32; group * t];
    let qrow = &q[s.row * h.heads * hd..][..h.heads * hd];
    let row_of = |slot: i64, g: usize| (slot as usize * h.kv_heads + g) * hd;
    for g in gs.clone() {
        let qg = &qrow[g * group * hd..][..group * hd];
        let full = t / 16 * 16;
        for j0 in (0..full).step_by(16) {
            for &ahead in s.slots.iter().skip(j0 + AHEAD).take(16) {
                prefetch_row(k, row_of(ahead, g), hd);
            }
            let mut rows = [0usize; 16];
            for (r, &slot) in rows.iter_mut().zip(&s.slots[j0..j0 + 16]) {
                *r = row_of(slot, g);
            }
            assert!(rows.iter().all(|&r| r + hd <= k.len()));
            for (i, qh) in qg.chunks_exact(hd).enumerate() {
                // SAFETY: each of the 16 rows holds hd elements of `k`
                // (checked above); `qh` is hd floats.
                unsafe { scores16::<V, T>(qh, k, &rows, h.scale, &mut scores[i * t + j0..][..16]) };
            }
        }
        for (j, &slot) in s.slots.iter().enumerate().skip(full) {
            let key = load::<V, T>(&k[row_of(slot, g)..][..hd]);
            for (i, qh) in qg.chunks_exact(hd).enumerate() {
                let qv = load::<V, f32>(qh);
                let mut a = _mm512_mul_ps(qv[0], key[0]);
                for c in 1..V {
                    a = _mm512_fmadd_ps(qv[c], key[c], a);
                }
                scores[i * t + j] = _mm512_reduce_add_ps(a) * h.scale;
            }
        }
        softmax_rows(
            &mut scores,
            t,
            h.softcap,
            &mut stats[(g - gs.start) * group * 2..][..group * 2],
        );
        let og = &mut out[(g - gs.start) * group * hd..][..group * hd];
        // Heads in runs of up to four (five as three and two), up to 64
        // floats of each a pass; the first pass prefetches the rows.
        let runs = group.div_ceil(4);
        let mut i0 = 0;
        for r in 0..runs {
            let hs = (group - i0).div_ceil(runs - r);
            for c in (0..hd).step_by(64) {
                let first = i0 == 0 && c == 0;
                let at = |slot: i64| row_of(slot, g) + c;
                let p = &scores[i0 * t..(i0 + hs) * t];
                let o = &mut og[i0 * hd..(i0 + hs) * hd];
                let w = V.min(4);
                match (hs, w) {
                    (1, 4) => weighted_heads::<1, 4, T>(p, t, v, s.slots, at, first, o, hd, c),
                    (2, 4) => weighted_heads::<2, 4, T>(p, t, v, s.slots, at, first, o, hd, c),
                    (3, 4) => weighted_heads::<3, 4, T>(p, t, v, s.slots, at, first, o, hd, c),
                    (_, 4) => weighted_heads::<4, 4, T>(p, t, v, s.slots, at, first, o, hd, c),
                    (1, 2) => weighted_heads::<1, 2, T>(p, t, v, s.slots, at, first, o, hd, c),
                    (2, 2) => weighted_heads::<2, 2, T>(p, t, v, s.slots, at, first, o, hd, c),
                    (3, 2) => weighted_heads::<3, 2, T>(p, t, v, s.slots, at, first, o, hd, c),
                    (_, 2) => weighted_heads::<4, 2, T>(p, t, v, s.slots, at, first, o, hd, c),
                    (1, _) => weighted_heads::<1, 1, T>(p, t, v, s.slots, at, first, o, hd, c),
                    (2, _) => weighted_heads::<2, 1, T>(p, t, v, s.slots, at, first, o, hd, c),
                    (3, _) => weighted_heads::<3, 1, T>(p, t, v, s.slots, at, first, o, hd, c),
                    (_, _) => weighted_heads::<4, 1, T>(p, t, v, s.slots, at, first, o, hd, c),
                }
            }
            i0 += hs;
        }
    }
}

/// The scores (`q . key * scale`) of the 16 keys at `rows` of `k`: one
/// accumulator a key, and the 16 sums reduced together.
///
/// # Safety
/// Each row holds `16 * V` elements of `k`; `q` holds `16 * V` floats.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn scores16<const V: usize, T: KvElem>(
    q: &[f32],
    k: &[T],
    rows: &[usize; 16],
    scale: f32,
    out: &mut [f32],
) {
    let mut a = [_mm512_setzero_ps(); 16];
    // SAFETY: the caller's promise for the rows and q.
    unsafe {
        let kp = k.as_ptr();
        for c in 0..V {
            let qv = _mm512_loadu_ps(q.as_ptr().add(16 * c));
            for (acc, &r) in a.iter_mut().zip(rows) {
                *acc = _mm512_fmadd_ps(qv, T::load16(kp.add(r + 16 * c)), *acc);
            }
        }
    }
    let sums = _mm512_mul_ps(reduce16(&a), _mm512_set1_ps(scale));
    assert!(out.len() >= 16);
    // SAFETY: `out` holds 16 floats (checked above).
    unsafe { _mm512_storeu_ps(out.as_mut_ptr(), sums) };
}

/// Lane j of the result: the sum of the 16 lanes of `a[j]`. In each
/// 128-bit lane, pairs of vectors are folded by unpacks (halving the
/// elements a vector contributes), then the four lanes by shuffles of
/// whole lanes.
#[inline]
#[target_feature(enable = "avx512f")]
fn reduce16(a: &[__m512; 16]) -> __m512 {
    // Per 128-bit lane, [x0 + x2, y0 + y2, x1 + x3, y1 + y3].
    let pair =
        |x: __m512, y: __m512| _mm512_add_ps(_mm512_unpacklo_ps(x, y), _mm512_unpackhi_ps(x, y));
    // Per 128-bit lane, that lane's sums of four vectors.
    let quad = |x: __m512, y: __m512| {
        let (x, y) = (_mm512_castps_pd(x), _mm512_castps_pd(y));
        _mm512_add_ps(
            _mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
            _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)),
        )
    };
    let b: [__m512; 8] = std::array::from_fn(|i| pair(a[2 * i], a[2 * i + 1]));
    let c: [__m512; 4] = std::array::from_fn(|i| quad(b[2 * i], b[2 * i + 1]));
    // Lanes 0 + 2 and 1 + 3 of two vectors: [x02, x13, y02, y13].
    let halves = |x: __m512, y: __m512| {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b01_00_01_00>(x, y),
            _mm512_shuffle_f32x4::<0b11_10_11_10>(x, y),
        )
    };
    let (d0, d1) = (halves(c[0], c[1]), halves(c[2], c[3]));
    _mm512_add_ps(
        _mm512_shuffle_f32x4::<0b10_00_10_00>(d0, d1),
        _mm512_shuffle_f32x4::<0b11_01_11_01>(d0, d1),
    )
}

/// For each of `H` heads (`p`: their `t` probabilities each, `out`: their
/// `hd` floats each), floats `c .. c + 16 W` of the sum over the keys of
/// the head's probability times the values at `at(slots[j])`; `prefetch`:
/// fetch the rows ahead (the first pass over them).
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx512f")]
fn weighted_heads<const H: usize, const W: usize, T: KvElem>(
    p: &[f32],
    t: usize,
    v: &[T],
    slots: &[i64],
    at: impl Fn(i64) -> usize,
    prefetch: bool,
    out: &mut [f32],
    hd: usize,
    c: usize,
) {
    assert!(p.len() >= H * t && out.len() >= H * hd && c + 16 * W <= hd && slots.len() >= t);
    let mut a = [[_mm512_setzero_ps(); W]; H];
    for (j, &slot) in slots.iter().enumerate().take(t) {
        if prefetch && let Some(&ahead) = slots.get(j + AHEAD) {
            prefetch_row(v, at(ahead), hd - c);
        }
        let vs = load::<W, T>(&v[at(slot)..][..16 * W]);
        for (hh, acc) in a.iter_mut().enumerate() {
            // SAFETY: hh * t + j < H * t <= p.len() (checked above).
            let pj = _mm512_set1_ps(unsafe { *p.get_unchecked(hh * t + j) });
            for (acc, &vv) in acc.iter_mut().zip(&vs) {
                *acc = _mm512_fmadd_ps(pj, vv, *acc);
            }
        }
    }
    for (hh, acc) in a.iter().enumerate() {
        for (q, &vv) in acc.iter().enumerate() {
            // SAFETY: hh * hd + c + 16 q + 16 <= H * hd <= out.len()
            // (checked above, c + 16 W <= hd).
            unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(hh * hd + c + 16 * q), vv) };
        }
    }
}
