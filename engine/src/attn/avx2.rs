//! The decode attention of one sequence with AVX2 and FMA, for head dims
//! that are a multiple of 8 (one 8-float vector or more per head): the
//! same three passes as the portable body and the AVX-512 kernel (scores,
//! softmax, weighted sum of values). Each score is one product of vectors
//! over two accumulators, reduced once; the values are summed into at
//! most eight register accumulators a pass (past 64 floats a head, the
//! keys are read again for each further 64). The portable body, which
//! the compiler vectorised, ran each score as one chain of dependent
//! multiply-adds and its sums through memory: 13% of a one-stream decode
//! step of SmolLM2 at 288 positions on a Zen 3.

#![allow(unsafe_code)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::{AHEAD, DecodeSeq, Heads, KvElem, prefetch_row, softmax_rows};

/// Runs the sequence's attention for the query heads of KV heads `gs`
/// (`out`: theirs alone) when its head dim is a multiple of 8, and says
/// whether it did. The caller checked the CPU for AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn one_seq<T: KvElem>(
    q: &[f32],
    k: &[T],
    v: &[T],
    s: &DecodeSeq<'_>,
    h: Heads,
    gs: Range<usize>,
    out: &mut [f32],
) -> bool {
    let hd = h.head_dim;
    if hd == 0 || !hd.is_multiple_of(8) {
        return false;
    }
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
            let key = &k[row_of(slot, g)..][..hd];
            for (i, qh) in qg.chunks_exact(hd).enumerate() {
                scores[i * t + j] = dot(qh, key) * h.scale;
            }
        }
        softmax_rows(&mut scores, t, h.softcap);
        let og = &mut out[(g - gs.start) * group * hd..][..group * hd];
        for (i, oh) in og.chunks_exact_mut(hd).enumerate() {
            let p = &scores[i * t..][..t];
            // The head in pieces of 64, 32, 16 and 8 floats.
            let mut c = 0;
            while c < hd {
                let at = |slot: i64| row_of(slot, g) + c;
                let o = &mut oh[c..];
                c += match hd - c {
                    64.. => weighted::<8, T>(p, v, s.slots, at, o),
                    32.. => weighted::<4, T>(p, v, s.slots, at, o),
                    16.. => weighted::<2, T>(p, v, s.slots, at, o),
                    _ => weighted::<1, T>(p, v, s.slots, at, o),
                };
            }
        }
    }
    true
}

/// `q . key` (both of a length that is a multiple of 8) over two
/// accumulators, reduced once.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn dot<T: KvElem>(q: &[f32], key: &[T]) -> f32 {
    let n = q.len() / 8;
    assert!(key.len() >= 8 * n && q.len() >= 8 * n);
    let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    // SAFETY: vector c reads 8 elements at 8 c < 8 n of each (checked
    // above); the CPU has AVX2, FMA and F16C (this function's features).
    unsafe {
        let ld = |c: usize| {
            (
                _mm256_loadu_ps(q.as_ptr().add(8 * c)),
                T::load8(key.as_ptr().add(8 * c)),
            )
        };
        let mut c = 0;
        while c + 1 < n {
            let (q0, k0) = ld(c);
            let (q1, k1) = ld(c + 1);
            a0 = _mm256_fmadd_ps(q0, k0, a0);
            a1 = _mm256_fmadd_ps(q1, k1, a1);
            c += 2;
        }
        if c < n {
            let (q0, k0) = ld(c);
            a0 = _mm256_fmadd_ps(q0, k0, a0);
        }
        let a = _mm256_add_ps(a0, a1);
        let s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }
}

/// `out`'s first W vectors = the sum over the keys of `p[j]` times the W
/// vectors of values at `at(slots[j])`; returns the floats written.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn weighted<const W: usize, T: KvElem>(
    p: &[f32],
    v: &[T],
    slots: &[i64],
    at: impl Fn(i64) -> usize,
    out: &mut [f32],
) -> usize {
    let mut a = [_mm256_setzero_ps(); W];
    for (j, &slot) in slots.iter().enumerate() {
        if let Some(&ahead) = slots.get(j + AHEAD) {
            prefetch_row(v, at(ahead), 8 * W);
        }
        let row = &v[at(slot)..][..8 * W];
        let pj = _mm256_set1_ps(p[j]);
        for (c, acc) in a.iter_mut().enumerate() {
            // SAFETY: `row` holds 8 W elements; the CPU has AVX2, FMA and
            // F16C (this function's features).
            *acc = _mm256_fmadd_ps(pj, unsafe { T::load8(row.as_ptr().add(8 * c)) }, *acc);
        }
    }
    assert!(out.len() >= 8 * W);
    for (c, acc) in a.into_iter().enumerate() {
        // SAFETY: `out` holds 8 W floats (checked above).
        unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(8 * c), acc) };
    }
    8 * W
}
