//! The AVX2 kernels: the AVX-512 ones' arithmetic in 8-float vectors, over
//! half a panel (16 columns) per register tile, since AVX2 has 16
//! registers where AVX-512 has 32.

use std::arch::x86_64::*;

use super::{KC, NR, PANELS1};

/// The most rows in one register tile: 6 rows x 16 columns is 12
/// accumulators, half again the 8 chains that two FMA units at four
/// cycles' latency need, so a late load does not stall them (4 rows, 8
/// chains exactly, left the tile at 75-85% of the FMA peak on a Zen 3).
const RT: usize = 6;

/// [`super::kernel`]'s block for `rows` rows (up to a whole `SG` group):
/// register tiles of as even a size as possible, at most `RT` rows
/// (16 rows: 6, 5 and 5), each through the panel's two halves. The
/// panel's next block (the `2 (k1 - k0)` cache lines from KC values of k
/// on) is prefetched spread evenly over all those passes: all of it
/// (`prefetch` 0b11), its first half (0b01) or its second (0b10). Issued
/// all in one pass (128 lines in about 500 cycles), as the AVX-512 kernel
/// does, they outran the misses a Zen 3 core keeps in flight.
///
/// # Safety
/// The CPU has AVX2 and FMA; `x` holds rows * k floats, `w` k * NR and
/// `tile` rows * NR; k0 < k1 <= k.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn rows(
    x: &[f32],
    k: usize,
    rows: usize,
    k0: usize,
    k1: usize,
    w: &[f32],
    tile: &mut [f32],
    prefetch: u8,
) {
    let total = 2 * (k1 - k0);
    let (first, count) = match prefetch & 3 {
        0b11 => (0, total),
        0b01 => (0, total / 2),
        0b10 => (total / 2, total - total / 2),
        _ => (0, 0),
    };
    // A hint only: the address may lie past the weights, so it is
    // formed without `add`'s in-bounds promise.
    let ahead = w.as_ptr().wrapping_add((k0 + KC) * NR).cast::<i8>();
    let tiles = rows.div_ceil(RT);
    let passes = tiles * 2;
    let mut pass = 0;
    let mut r = 0;
    for t in 0..tiles {
        // The first `rows % tiles` tiles take one row more.
        let rr = rows / tiles + usize::from(t < rows % tiles);
        for h in 0..2 {
            let (lo, hi) = (
                first + count * pass / passes,
                first + count * (pass + 1) / passes,
            );
            pass += 1;
            let f = match rr {
                6 => half::<6>,
                5 => half::<5>,
                4 => half::<4>,
                3 => half::<3>,
                2 => half::<2>,
                _ => half::<1>,
            };
            // SAFETY: rows r .. r + rr of x and of the tile exist, and
            // half h's 16 columns lie inside each k's NR floats.
            unsafe {
                f(
                    x.as_ptr().add(r * k),
                    k,
                    k0,
                    k1,
                    w.as_ptr().add(h * 16),
                    tile.as_mut_ptr().add(r * NR + h * 16),
                    (ahead.wrapping_add(lo * 64), hi - lo),
                );
            }
        }
        r += rr;
    }
}

/// Values of k a call of the assembly loop takes, for a block of `n`
/// values of k and `lines` lines to prefetch over it: as many as keeps
/// each chunk's burst of prefetches to at most 11 lines, from 4 to 32.
/// Leaving the loop for each prefetch (every 2 or 3 values of k at 16
/// rows, every one at 4 to 6) cost a Zen 1 3-9% of a 16-stream run;
/// bursts of 16 lines or more slowed 4- and 6-row products there by
/// 15-30% (more misses at once, presumably, than a core keeps in
/// flight).
fn chunk(n: usize, lines: usize) -> usize {
    const BURST: usize = 11;
    n.div_ceil(lines.div_ceil(BURST).max(1)).clamp(4, 32)
}

/// R rows x 16 columns over k0..k1: `wp` points at the half panel's
/// first column (k-major, NR floats per k), `tp` at the tile's (NR
/// floats per row). `prefetch`: consecutive cache lines from an address,
/// and how many, issued evenly over the iterations.
///
/// # Safety
/// As for [`rows`], for R rows from `xp` and `tp`.
#[target_feature(enable = "avx2,fma")]
unsafe fn half<const R: usize>(
    xp: *const f32,
    k: usize,
    k0: usize,
    k1: usize,
    wp: *const f32,
    tp: *mut f32,
    prefetch: (*const i8, usize),
) {
    let mut a0 = [_mm256_setzero_ps(); R];
    let mut a1 = [_mm256_setzero_ps(); R];
    let (pf, lines) = prefetch;
    if R >= 4 {
        // The same FMAs in the same order per accumulator, the k loop in
        // assembly ([`fma4`] .. [`fma6`]) between the prefetches: the
        // compiled loop kept the prefetch's counters and branches and each
        // row's address arithmetic beside its FMAs. The block's k in
        // chunks ([`chunk`]), each chunk's share of the lines issued
        // before it.
        let mut a = [_mm256_setzero_ps(); 2 * RT];
        let (mut kk, mut issued) = (k0, 0);
        let chunked = super::tile_chunks();
        let step = if chunked {
            chunk(k1 - k0, lines)
        } else {
            (k1 - k0).checked_div(lines).map_or(k1 - k0, |e| e.max(1))
        };
        while kk < k1 {
            // The lines owed by the end of this chunk (one a chunk
            // without chunks: the earlier way).
            let due = if chunked {
                (lines * (kk + step - k0)).div_ceil(k1 - k0)
            } else {
                issued + 1
            };
            while issued < lines.min(due) {
                _mm_prefetch::<_MM_HINT_T2>(pf.wrapping_add(issued * 64));
                issued += 1;
            }
            let n = step.min(k1 - kk);
            // SAFETY: kk + n <= k1 <= k: rows 0..R of x from `xp` hold k
            // floats each, the half panel NR floats per k.
            unsafe {
                let (x, w) = (xp.add(kk), wp.add(kk * NR));
                match R {
                    6 => fma6(x, 4 * k, w, n, (&mut a[..12]).try_into().unwrap_unchecked()),
                    5 => fma5(x, 4 * k, w, n, (&mut a[..10]).try_into().unwrap_unchecked()),
                    _ => fma4(x, 4 * k, w, n, (&mut a[..8]).try_into().unwrap_unchecked()),
                }
            }
            kk += n;
        }
        a0.copy_from_slice(&a[..R]);
        a1.copy_from_slice(&a[R..2 * R]);
    } else {
        // Fewer rows: the loop in Rust.
        let every = (k1 - k0)
            .checked_div(lines)
            .map_or(usize::MAX, |e| e.max(1));
        let (mut issued, mut wait) = (0, 0);
        for kk in k0..k1 {
            if issued < lines {
                if wait == 0 {
                    _mm_prefetch::<_MM_HINT_T2>(pf.wrapping_add(issued * 64));
                    issued += 1;
                    wait = every;
                }
                wait -= 1;
            }
            // SAFETY (for the whole loop): kk < k1 <= k.
            unsafe {
                let w0 = _mm256_loadu_ps(wp.add(kk * NR));
                let w1 = _mm256_loadu_ps(wp.add(kk * NR + 8));
                for r in 0..R {
                    let xv = _mm256_broadcast_ss(&*xp.add(r * k + kk));
                    a0[r] = _mm256_fmadd_ps(xv, w0, a0[r]);
                    a1[r] = _mm256_fmadd_ps(xv, w1, a1[r]);
                }
            }
        }
    }
    for r in 0..R {
        // SAFETY: r < R, and row r of the tile holds this half's 16
        // floats from `tp`.
        unsafe {
            let (t0, t1) = (tp.add(r * NR), tp.add(r * NR + 8));
            if k0 == 0 {
                _mm256_storeu_ps(t0, a0[r]);
                _mm256_storeu_ps(t1, a1[r]);
            } else {
                _mm256_storeu_ps(t0, _mm256_add_ps(_mm256_loadu_ps(t0), a0[r]));
                _mm256_storeu_ps(t1, _mm256_add_ps(_mm256_loadu_ps(t1), a1[r]));
            }
        }
    }
}

/// `fmaR`: `n` (> 0) values of k into R rows x 16 columns of sums, `a[r]`
/// the first 8 columns of row r and `a[R + r]` the second 8; rows `kb`
/// bytes apart from `xp` (rows 3 to 5 addressed from a second pointer,
/// `y`, 3 rows on), the 16 columns' weights at `wp`, NR floats per k.
/// Every row's broadcast goes through ymm14 (renamed in hardware).
macro_rules! fmas {
    ($name:ident, $r:literal, [$($a:ident @ $at:literal),+ $(,)?], [$($b:ident),+ $(,)?] $(,)?) => {
        /// # Safety
        /// AVX2 and FMA; `n` (> 0) values of k readable from `xp` for each
        /// row and from `wp`.
        #[inline]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn $name(xp: *const f32, kb: usize, wp: *const f32, n: usize, a: &mut [__m256; 2 * $r]) {
            const { assert!(NR * 4 == 128) };
            let [$(mut $a,)+ $(mut $b,)+] = *a;
            // SAFETY: the caller's promises; every read is within them.
            unsafe {
                std::arch::asm!(
                    "2:",
                    "vmovups ymm12, ymmword ptr [{w}]",
                    "vmovups ymm13, ymmword ptr [{w} + 32]",
                    $(
                        concat!("vbroadcastss ymm14, dword ptr ", $at),
                        concat!("vfmadd231ps {", stringify!($a), "}, ymm14, ymm12"),
                        concat!("vfmadd231ps {", stringify!($b), "}, ymm14, ymm13"),
                    )+
                    // NR floats a k.
                    "add {w}, 128",
                    "add {x}, 4",
                    "add {y}, 4",
                    "dec {n}",
                    "jnz 2b",
                    w = inout(reg) wp => _,
                    x = inout(reg) xp => _,
                    y = inout(reg) xp.wrapping_byte_add(3 * kb) => _,
                    n = inout(reg) n => _,
                    kb = in(reg) kb,
                    $($a = inout(ymm_reg) $a,)+
                    $($b = inout(ymm_reg) $b,)+
                    out("ymm12") _,
                    out("ymm13") _,
                    out("ymm14") _,
                    options(nostack, readonly),
                );
            }
            *a = [$($a,)+ $($b,)+];
        }
    };
}

fmas!(
    fma4,
    4,
    [
        a0 @ "[{x}]",
        a1 @ "[{x} + {kb}]",
        a2 @ "[{x} + 2*{kb}]",
        a3 @ "[{y}]",
    ],
    [b0, b1, b2, b3]
);
fmas!(
    fma5,
    5,
    [
        a0 @ "[{x}]",
        a1 @ "[{x} + {kb}]",
        a2 @ "[{x} + 2*{kb}]",
        a3 @ "[{y}]",
        a4 @ "[{y} + {kb}]",
    ],
    [b0, b1, b2, b3, b4]
);
fmas!(
    fma6,
    6,
    [
        a0 @ "[{x}]",
        a1 @ "[{x} + {kb}]",
        a2 @ "[{x} + 2*{kb}]",
        a3 @ "[{y}]",
        a4 @ "[{y} + {kb}]",
        a5 @ "[{y} + 2*{kb}]",
    ],
    [b0, b1, b2, b3, b4, b5]
);

/// One row over `panels` panels (even, at most `PANELS1`), block by block
/// of k; within a block the panels two at a time (8 accumulators), each
/// element's sum in the order of [`half`].
///
/// # Safety
/// The CPU has AVX2 and FMA; `x` holds k floats and `w` panels * k * NR.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn one_row(
    x: &[f32],
    k: usize,
    w: &[f32],
    panels: usize,
    tile: &mut [f32; PANELS1 * NR],
) {
    assert!(panels <= PANELS1 && panels.is_multiple_of(2));
    let wp = w.as_ptr();
    let xp = x.as_ptr();
    let tp = tile.as_mut_ptr();
    let mut k0 = 0;
    while k0 < k {
        let k1 = k.min(k0 + KC);
        for pair in 0..panels / 2 {
            let mut a = [_mm256_setzero_ps(); 8];
            for kk in k0..k1 {
                // SAFETY (for the whole loop): kk < k, so each panel's
                // reads stay within its k * NR floats, the row's within
                // k.
                unsafe {
                    let xv = _mm256_broadcast_ss(&*xp.add(kk));
                    for q in 0..2 {
                        let at = wp.add((2 * pair + q) * k * NR + kk * NR);
                        for v in 0..4 {
                            a[4 * q + v] =
                                _mm256_fmadd_ps(xv, _mm256_loadu_ps(at.add(8 * v)), a[4 * q + v]);
                        }
                    }
                }
            }
            for (i, acc) in a.iter().enumerate() {
                // SAFETY: the pair's two panels' 64 floats start at
                // 2 * pair * NR, inside the tile.
                unsafe {
                    let t = tp.add(2 * pair * NR + i * 8);
                    if k0 == 0 {
                        _mm256_storeu_ps(t, *acc);
                    } else {
                        _mm256_storeu_ps(t, _mm256_add_ps(_mm256_loadu_ps(t), *acc));
                    }
                }
            }
        }
        k0 = k1;
    }
}
