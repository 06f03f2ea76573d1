//! The AVX-512 kernels of the packed f32 products (see the parent module).

use std::arch::x86_64::*;

use super::{KC, NR, PANELS1};

/// One row over `PANELS1` panels: 2 * PANELS1 accumulators, each
/// summing one block of `KC` values of k in order, the blocks' sums
/// added into the tile in order (as [`tile`] does per row).
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn one_row(x: &[f32], k: usize, w: &[f32], tile: &mut [f32; PANELS1 * NR]) {
    let wp = w.as_ptr();
    let xp = x.as_ptr();
    let tp = tile.as_mut_ptr();
    let mut k0 = 0;
    while k0 < k {
        let k1 = k.min(k0 + KC);
        let mut a = [_mm512_setzero_ps(); 2 * PANELS1];
        for kk in k0..k1 {
            // SAFETY (for the whole loop): kk < k, so each panel's reads
            // stay within its k * NR floats and the row read within k.
            unsafe {
                let xv = _mm512_set1_ps(*xp.add(kk));
                for q in 0..PANELS1 {
                    let at = wp.add(q * k * NR + kk * NR);
                    a[2 * q] = _mm512_fmadd_ps(xv, _mm512_loadu_ps(at), a[2 * q]);
                    a[2 * q + 1] = _mm512_fmadd_ps(xv, _mm512_loadu_ps(at.add(16)), a[2 * q + 1]);
                }
            }
        }
        for (i, acc) in a.iter().enumerate() {
            // SAFETY: i < 2 * PANELS1, so the 16 floats at i * 16 are
            // inside the tile.
            unsafe {
                let t = tp.add(i * 16);
                if k0 == 0 {
                    _mm512_storeu_ps(t, *acc);
                } else {
                    _mm512_storeu_ps(t, _mm512_add_ps(_mm512_loadu_ps(t), *acc));
                }
            }
        }
        k0 = k1;
    }
}

/// Register tile of R rows x 32 columns over one block k0..k1 of k:
/// 2R accumulators, each summing the block in order, then written to
/// the tile (k0 = 0) or added to it. `prefetch`: the panel's next
/// block (KC rows of NR floats further on, the next panel's first past
/// this one's end) is prefetched, per k the first (bit 0) and/or the
/// second (bit 1) of its two cache lines.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn block<const R: usize>(
    x: &[f32],
    k: usize,
    k0: usize,
    k1: usize,
    w: &[f32],
    tile: &mut [f32],
    prefetch: u8,
) {
    let wp = w.as_ptr();
    let xp = x.as_ptr();
    let tp = tile.as_mut_ptr();
    let mut a0 = [_mm512_setzero_ps(); R];
    let mut a1 = [_mm512_setzero_ps(); R];
    for kk in k0..k1 {
        if prefetch != 0 {
            // A hint only: the address may lie past the weights, so
            // it is formed without `add`'s in-bounds promise. Into L2,
            // not L1: on an Intel Xeon (Emerald Rapids) the 16-row
            // products of SmolLM2's shapes ran 5-8% faster so, both
            // hints alternated in one process (probably L1's few fill
            // buffers bounding the misses in flight); on AMD EPYC the
            // two measured the same.
            let ahead = wp.wrapping_add((kk + KC) * NR).cast::<i8>();
            if prefetch & 1 != 0 {
                _mm_prefetch::<_MM_HINT_T2>(ahead);
            }
            if prefetch & 2 != 0 {
                _mm_prefetch::<_MM_HINT_T2>(ahead.wrapping_add(64));
            }
        }
        // SAFETY (for the whole loop): kk < k1 <= k, so the panel reads
        // stay within k * NR floats and the row reads within R * k.
        unsafe {
            let w0 = _mm512_loadu_ps(wp.add(kk * NR));
            let w1 = _mm512_loadu_ps(wp.add(kk * NR + 16));
            for r in 0..R {
                let xv = _mm512_set1_ps(*xp.add(r * k + kk));
                a0[r] = _mm512_fmadd_ps(xv, w0, a0[r]);
                a1[r] = _mm512_fmadd_ps(xv, w1, a1[r]);
            }
        }
    }
    for r in 0..R {
        // SAFETY: r < R and the tile holds R * NR floats.
        unsafe {
            let (t0, t1) = (tp.add(r * NR), tp.add(r * NR + 16));
            if k0 == 0 {
                _mm512_storeu_ps(t0, a0[r]);
                _mm512_storeu_ps(t1, a1[r]);
            } else {
                _mm512_storeu_ps(t0, _mm512_add_ps(_mm512_loadu_ps(t0), a0[r]));
                _mm512_storeu_ps(t1, _mm512_add_ps(_mm512_loadu_ps(t1), a1[r]));
            }
        }
    }
}
