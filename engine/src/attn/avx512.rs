//! The decode attention of one sequence with AVX-512, for head dims of 16,
//! 32, 64, 128 and 256 (one to sixteen 16-float vectors per head; past
//! eight, the weighted sum of values runs over the head in halves, so its
//! accumulators stay in registers). The same three
//! passes as the portable body (scores, softmax, weighted sum of values),
//! with the head's vectors held in registers: each score is one
//! vector product reduced once, and the values are summed into register
//! accumulators (two keys in flight) instead of a row in memory.

#![allow(unsafe_code)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::{AHEAD, DecodeSeq, Heads, KvElem, prefetch_row, softmax_rows};

/// Runs the sequence's attention for the query heads of KV heads `gs`
/// (`out`: theirs alone) when its head dim is one of the sizes above, and
/// says whether it did. The caller checked the CPU for AVX-512F.
#[target_feature(enable = "avx512f")]
pub(super) fn one_seq<T: KvElem>(
    q: &[f32],
    k: &[T],
    v: &[T],
    s: &DecodeSeq<'_>,
    h: Heads,
    gs: Range<usize>,
    out: &mut [f32],
) -> bool {
    match h.head_dim {
        16 => body::<1, T>(q, k, v, s, h, gs, out),
        32 => body::<2, T>(q, k, v, s, h, gs, out),
        64 => body::<4, T>(q, k, v, s, h, gs, out),
        128 => body::<8, T>(q, k, v, s, h, gs, out),
        256 => body::<16, T>(q, k, v, s, h, gs, out),
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
fn body<const V: usize, T: KvElem>(
    q: &[f32],
    k: &[T],
    v: &[T],
    s: &DecodeSeq<'_>,
    h: Heads,
    gs: Range<usize>,
    out: &mut [f32],
) {
    let hd = 16 * V;
    let group = h.heads / h.kv_heads;
    let t = s.slots.len();
    let mut scores = vec![0f32; group * t];
    let qrow = &q[s.row * h.heads * hd..][..h.heads * hd];
    let row_of = |slot: i64, g: usize| (slot as usize * h.kv_heads + g) * hd;
    for g in gs.clone() {
        let qg = &qrow[g * group * hd..][..group * hd];
        for (j, &slot) in s.slots.iter().enumerate() {
            if let Some(&ahead) = s.slots.get(j + AHEAD) {
                prefetch_row(k, row_of(ahead, g), hd);
            }
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
        softmax_rows(&mut scores, t, h.softcap);
        let og = &mut out[(g - gs.start) * group * hd..][..group * hd];
        for (i, oh) in og.chunks_exact_mut(hd).enumerate() {
            let p = &scores[i * t..][..t];
            if V <= 8 {
                weighted::<V, T>(p, v, s.slots, |slot| row_of(slot, g), oh);
            } else {
                // Two passes over the keys, one per half of the head.
                let half = hd / 2;
                let (lo, hi) = oh.split_at_mut(half);
                weighted::<8, T>(p, v, s.slots, |slot| row_of(slot, g), lo);
                weighted::<8, T>(p, v, s.slots, |slot| row_of(slot, g) + half, hi);
            }
        }
    }
}

/// `out` (W vectors) = the sum over the keys of `p[j]` times the W vectors
/// of values at `at(slots[j])`, two keys in flight.
#[inline]
#[target_feature(enable = "avx512f")]
fn weighted<const W: usize, T: KvElem>(
    p: &[f32],
    v: &[T],
    slots: &[i64],
    at: impl Fn(i64) -> usize,
    out: &mut [f32],
) {
    let t = slots.len();
    let mut a0 = [_mm512_setzero_ps(); W];
    let mut a1 = [_mm512_setzero_ps(); W];
    let mut pairs = slots.chunks_exact(2);
    for (jj, pair) in pairs.by_ref().enumerate() {
        for &ahead in slots.iter().skip(2 * jj + AHEAD).take(2) {
            prefetch_row(v, at(ahead), 16 * W);
        }
        let v0 = load::<W, T>(&v[at(pair[0])..][..16 * W]);
        let v1 = load::<W, T>(&v[at(pair[1])..][..16 * W]);
        let (p0, p1) = (_mm512_set1_ps(p[2 * jj]), _mm512_set1_ps(p[2 * jj + 1]));
        for c in 0..W {
            a0[c] = _mm512_fmadd_ps(p0, v0[c], a0[c]);
            a1[c] = _mm512_fmadd_ps(p1, v1[c], a1[c]);
        }
    }
    if let [last] = pairs.remainder() {
        let vl = load::<W, T>(&v[at(*last)..][..16 * W]);
        let pl = _mm512_set1_ps(p[t - 1]);
        for c in 0..W {
            a0[c] = _mm512_fmadd_ps(pl, vl[c], a0[c]);
        }
    }
    assert!(out.len() >= 16 * W);
    for c in 0..W {
        // SAFETY: `out` holds 16 * W floats (checked above).
        unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(16 * c), _mm512_add_ps(a0[c], a1[c])) };
    }
}
