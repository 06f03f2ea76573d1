//! The decode attention of one sequence with AVX2 and FMA, for head dims
//! that are a multiple of 8 (one 8-float vector or more per head): the
//! same three passes as the portable body and the AVX-512 kernel (scores,
//! softmax, weighted sum of values).
//!
//! Scores go eight keys at a time: one accumulator a key, each key's
//! vectors read once per query head, and the eight sums reduced together
//! by three rounds of horizontal adds (one score at a time, each a chain
//! of dependent multiply-adds and its own reduction, left the core waiting
//! on them). Values go for up to three query heads of the KV group at
//! once, over 32 floats of the head a pass: each value vector read once
//! for all of them and 12 independent accumulators (one head at a time
//! had 8, each one multiply-add a key: bound by the FMA latency, half the
//! FMA units idle). On a Zen 3, SmolLM2's heads at 64 and 160 positions,
//! the keys and values in L3 (`LAYERS=1 cargo run --release -p gyre-engine
//! --example attntime`): see the README's figures.

#![allow(unsafe_code)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::{AHEAD, DecodeSeq, Heads, KvElem, prefetch_row, softmax_rows};

/// Runs the sequence's attention for the query heads of KV heads `gs`
/// (`out`: theirs alone) when its head dim is a multiple of 8, and says
/// whether it did. The caller checked the CPU for AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
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
        let full = t / 8 * 8;
        for j0 in (0..full).step_by(8) {
            for &ahead in s.slots.iter().skip(j0 + AHEAD).take(8) {
                prefetch_row(k, row_of(ahead, g), hd);
            }
            let mut rows = [0usize; 8];
            for (r, &slot) in rows.iter_mut().zip(&s.slots[j0..j0 + 8]) {
                *r = row_of(slot, g);
            }
            assert!(rows.iter().all(|&r| r + hd <= k.len()));
            for (i, qh) in qg.chunks_exact(hd).enumerate() {
                // SAFETY: each of the 8 rows holds hd elements of `k`
                // (checked above); `qh` is hd floats.
                unsafe { scores8(qh, k, &rows, h.scale, &mut scores[i * t + j0..][..8]) };
            }
        }
        for (j, &slot) in s.slots.iter().enumerate().skip(full) {
            let key = &k[row_of(slot, g)..][..hd];
            for (i, qh) in qg.chunks_exact(hd).enumerate() {
                scores[i * t + j] = dot(qh, key) * h.scale;
            }
        }
        softmax_rows(
            &mut scores,
            t,
            h.softcap,
            &mut stats[(g - gs.start) * group * 2..][..group * 2],
        );
        let og = &mut out[(g - gs.start) * group * hd..][..group * hd];
        if group > 1 && hd.is_multiple_of(32) {
            // Heads in runs of up to three (four as two and two), 32
            // floats of each a pass; the first pass prefetches the rows.
            let mut i0 = 0;
            while i0 < group {
                let hs = match group - i0 {
                    4 => 2,
                    r => r.min(3),
                };
                for c in (0..hd).step_by(32) {
                    let first = i0 == 0 && c == 0;
                    let at = |slot: i64| row_of(slot, g) + c;
                    let p = &scores[i0 * t..(i0 + hs) * t];
                    let o = &mut og[i0 * hd..(i0 + hs) * hd];
                    match hs {
                        1 => weighted_heads::<1, T>(p, t, v, s.slots, at, first, o, hd, c),
                        2 => weighted_heads::<2, T>(p, t, v, s.slots, at, first, o, hd, c),
                        _ => weighted_heads::<3, T>(p, t, v, s.slots, at, first, o, hd, c),
                    }
                }
                i0 += hs;
            }
            continue;
        }
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

/// The scores (`q . key * scale`) of the 8 keys at `rows` of `k`: one
/// accumulator a key, and the 8 sums reduced together.
///
/// # Safety
/// Each row holds `q.len()` (a multiple of 8) elements of `k`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores8<T: KvElem>(q: &[f32], k: &[T], rows: &[usize; 8], scale: f32, out: &mut [f32]) {
    let n = q.len() / 8;
    let mut a = [_mm256_setzero_ps(); 8];
    // SAFETY: the caller's promise for the rows; vector c of q is within it.
    unsafe {
        let kp = k.as_ptr();
        for c in 0..n {
            let qv = _mm256_loadu_ps(q.as_ptr().add(8 * c));
            for (acc, &r) in a.iter_mut().zip(rows) {
                *acc = _mm256_fmadd_ps(qv, T::load8(kp.add(r + 8 * c)), *acc);
            }
        }
    }
    // [a0 a1 | a2 a3] pair sums, then [a0 a1 a2 a3] quad sums in each
    // 128-bit half (low: lanes 0-3, high: 4-7), then the halves added.
    let t0 = _mm256_hadd_ps(a[0], a[1]);
    let t1 = _mm256_hadd_ps(a[2], a[3]);
    let t2 = _mm256_hadd_ps(a[4], a[5]);
    let t3 = _mm256_hadd_ps(a[6], a[7]);
    let u0 = _mm256_hadd_ps(t0, t1);
    let u1 = _mm256_hadd_ps(t2, t3);
    let lo = _mm256_permute2f128_ps::<0x20>(u0, u1);
    let hi = _mm256_permute2f128_ps::<0x31>(u0, u1);
    let sums = _mm256_mul_ps(_mm256_add_ps(lo, hi), _mm256_set1_ps(scale));
    assert!(out.len() >= 8);
    // SAFETY: `out` holds 8 floats (checked above).
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), sums) };
}

/// For each of `H` heads (`p`: their `t` probabilities each, `out`: their
/// `hd` floats each), floats `c .. c + 32` of the sum over the keys of the
/// head's probability times the values at `at(slots[j])`; `prefetch`:
/// fetch the rows ahead (the first pass over them).
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn weighted_heads<const H: usize, T: KvElem>(
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
    assert!(p.len() >= H * t && out.len() >= H * hd && c + 32 <= hd && slots.len() >= t);
    let mut a = [[_mm256_setzero_ps(); 4]; H];
    for (j, &slot) in slots.iter().enumerate().take(t) {
        if prefetch && let Some(&ahead) = slots.get(j + AHEAD) {
            prefetch_row(v, at(ahead), hd - c);
        }
        let row = &v[at(slot)..][..32];
        // SAFETY: `row` holds 32 elements; the CPU has AVX2, FMA and F16C
        // (this function's features).
        let vs: [__m256; 4] = std::array::from_fn(|q| unsafe { T::load8(row.as_ptr().add(8 * q)) });
        for (hh, acc) in a.iter_mut().enumerate() {
            // SAFETY: hh * t + j < H * t <= p.len() (checked above).
            let pj = _mm256_set1_ps(unsafe { *p.get_unchecked(hh * t + j) });
            for (acc, &vv) in acc.iter_mut().zip(&vs) {
                *acc = _mm256_fmadd_ps(pj, vv, *acc);
            }
        }
    }
    for (hh, acc) in a.iter().enumerate() {
        for (q, &vv) in acc.iter().enumerate() {
            // SAFETY: hh * hd + c + 8 q + 8 <= H * hd <= out.len() (checked
            // above, c + 32 <= hd).
            unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(hh * hd + c + 8 * q), vv) };
        }
    }
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
