//! Linear layers on the CPU with pre-packed weights (AVX-512, or AVX2 with
//! FMA where the CPU lacks AVX-512).
//!
//! libtorch's CPU `linear` goes to MKL, which repacks the whole weight
//! matrix on every call. A decode step multiplies a few rows of activations
//! by every weight of the model, so the repacking costs more than the
//! arithmetic, and on AMD CPUs MKL takes a generic code path on top. Here the
//! weights are packed once, at load, into panels of 32 output columns laid
//! out k-major, and a register-tiled kernel (8 rows x 32 columns of
//! accumulators) takes each block of 128 k of a panel (16 KiB) through up
//! to 32 rows while the next block is prefetched, so a panel streams from
//! memory once per 32 rows and the arithmetic overlaps the stream (a
//! 16-stream decode step is bound by both: f32 weights give 8 FLOP a byte).
//!
//! Each output element is summed in a fixed order that depends only on k: a
//! fused multiply-add chain over each block of `KC` consecutive k, and the
//! blocks' sums added in order. So a row's result is the same whatever else
//! is in the batch (MKL's is not). Blocking also bounds the rounding error: a
//! single chain over all of k drifts with its length (on SmolLM2's 30 layers
//! it put logits 1.6e-4 from a float64 run, against transformers' own
//! 9.3e-5); blocks of 128 bring that to 5.8e-5.
//!
//! Without AVX-512 (AMD before Zen 4, most Intel desktop parts), the AVX2
//! kernels keep the same packing and the same order of operations per
//! element, so their results equal the AVX-512 kernels' to the bit; with
//! half as many registers, half as wide, a register tile covers up to 6
//! rows by 16 columns (half a panel; 12 accumulators) and a one-row product
//! takes its panels two at a time.

use std::sync::Arc;

use tch::{Device, Kind, Tensor};

use crate::EngineError;
use crate::pages::Pages;
use crate::simd::{Simd, simd};

pub(crate) use crate::workers::{Stream, Workers};

mod gated;
pub(crate) use gated::silu_into;

/// Output columns per panel (two 16-float vectors).
const NR: usize = 32;
/// Rows per register tile (AVX-512; the AVX2 kernel cuts a whole `SG`
/// group into its own tiles).
const MR: usize = 8;
/// Rows that share one pass over a panel: their block of x (16 KiB) and
/// the panel's block (16 KiB) stay in L1 together.
const SG: usize = 32;
/// The most panels a one-row product works on at once (the AVX-512
/// kernel's four: 8 accumulators).
const PANELS1: usize = 4;
/// Panels a unit of a one-row product takes, the kernel's panels at once
/// (see [`kernel_one_row`]): 2, through the AVX2 kernel (its pair of
/// panels is 8 chains) on AVX-512 CPUs as well. A unit is what a thread
/// takes from another's region once its own is done, so the smaller it
/// is, the less of a product the last thread runs alone, and each thread
/// streams two panels at a time instead of four. Units of 2 against 4
/// (`steptime`'s `UNIT_AB=4,2`, SmolLM2 F32 at one stream): 1.06x on a
/// 2-core Zen 1 (AVX2), 1.04-1.16x on a 2-core Zen 4 (AVX-512 against
/// AVX2 kernels); the 64 M bench model measured level there.
fn one_row_panels() -> usize {
    match ONE_ROW_PANELS.load(std::sync::atomic::Ordering::Relaxed) {
        0 => 2,
        n => n,
    }
}

/// [`one_row_panels`] when set (not 0).
static ONE_ROW_PANELS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Sets, for the whole process, the panels a one-row product's unit takes
/// (2 or 4; 0: the kernel's default): for comparisons (`steptime`'s
/// `UNIT_AB`).
pub fn set_one_row_panels(panels: usize) {
    assert!(
        panels <= PANELS1 && panels.is_multiple_of(2),
        "panels: 0, 2 or 4"
    );
    ONE_ROW_PANELS.store(panels, std::sync::atomic::Ordering::Relaxed);
}

/// Whether the AVX2 tile's k loop runs in chunks of up to 32 (the
/// default) rather than leaving its assembly for each prefetch (see
/// `avx2::chunk`).
static TILE_CHUNKS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

fn tile_chunks() -> bool {
    TILE_CHUNKS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Sets, for the whole process, whether the AVX2 f32 tile takes k in
/// chunks (the default) or a prefetch at a time, as before: for
/// comparisons (`steptime`'s `TILE_AB`). The sums are the same either
/// way.
pub fn set_tile_chunks(on: bool) {
    TILE_CHUNKS.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// Whether the f32 products run their AVX2 kernels on an AVX-512 CPU.
static F32_AVX2: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The vector kernels the f32 products run: the CPU's widest, or AVX2 on
/// an AVX-512 CPU when [`set_f32_avx2`] asked for it.
fn tile_simd() -> Simd {
    match simd() {
        Simd::Avx512 if F32_AVX2.load(std::sync::atomic::Ordering::Relaxed) => Simd::Avx2,
        s => s,
    }
}

/// Sets, for the whole process, whether the f32 products run their AVX2
/// kernels on a CPU with AVX-512 (every AVX-512 CPU has AVX2 and FMA):
/// for comparisons (`steptime`'s `AVX2_AB`). Each element's sum is the
/// same either way.
pub fn set_f32_avx2(on: bool) {
    F32_AVX2.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// Values of k summed in one chain before the chain's sum is added to the
/// output (see the module comment).
const KC: usize = 128;

std::thread_local! {
    /// Each thread's tiles for products of several rows (two: a gated
    /// product's gate and up), kept from product to product: a product
    /// that zeroed new ones per panel (its unit of work) would memset
    /// 26 MB a 16-row SmolLM2 step. Each block's first pass writes the
    /// tile's rows before any is read.
    static TILES: std::cell::RefCell<[[f32; SG * NR]; 2]> =
        const { std::cell::RefCell::new([[0.0; SG * NR]; 2]) };
}

/// Whether this CPU can run one of the kernels (AVX-512F, or AVX2 and FMA).
pub(crate) fn available() -> bool {
    simd() != Simd::None
}

/// A weight [n, k] (as in `y = x W^T`) packed into panels of `NR` columns:
/// panel p holds, for each k, the `NR` values `W[p*NR .. p*NR+NR, k]`
/// (zero past n).
pub(crate) struct Packed {
    n: usize,
    k: usize,
    /// Shared with the workers' prefetch of it ([`Stream`]).
    data: Arc<Pages<f32>>,
    /// A stacked gate/up weight packed for [`Packed::forward_silu`]: the
    /// intermediate width, and panels alternating gate and up (see
    /// [`Packed::gated`]).
    gated: Option<usize>,
}

impl Packed {
    /// Packs a float32 weight [n, k].
    pub(crate) fn new(w: &Tensor) -> Result<Self, EngineError> {
        let (src, n, k) = weight_rows(w)?;
        let data = pack(crate::attn::f32_view(&src)?, k, n.div_ceil(NR), |p| {
            (p * NR, NR.min(n - p * NR))
        });
        Ok(Self {
            n,
            k,
            data: Arc::new(data),
            gated: None,
        })
    }

    /// Whether this was packed by [`Packed::gated`].
    pub(crate) fn is_gated(&self) -> bool {
        self.gated.is_some()
    }

    /// `x W^T` for a float32 CPU `x` [m, k] -> [m, n], split over `pool`.
    pub(crate) fn forward(&self, x: &Tensor, workers: &Workers) -> Result<Tensor, EngineError> {
        if self.gated.is_some() {
            return self.forward_pairs(x, workers, false);
        }
        let (x, m) = input_rows(x, self.k)?;
        let xs = crate::attn::f32_view(&x)?;
        // Every output element is written once: each chunk's panels cover
        // their columns (all n of them between the chunks) for every row.
        crate::attn::f32_tensor_written(&[m as i64, self.n as i64], |out| {
            self.forward_raw(xs, m, workers, out);
        })
    }

    /// Output columns (`n` of the weight [n, k]; a gated weight's are
    /// `2 * inter`).
    pub(crate) fn out_features(&self) -> usize {
        self.n
    }

    /// [`Packed::forward`] of `xs` ([m, k], row-major) into `out` ([m, n]),
    /// buffers the caller keeps from step to step (the row path,
    /// `layers::rows`): the same tasks, so the same bits.
    pub(crate) fn forward_to(
        &self,
        xs: &[f32],
        m: usize,
        workers: &Workers,
        out: &mut [f32],
    ) -> Result<(), EngineError> {
        if self.gated.is_some() || xs.len() != m * self.k || out.len() != m * self.n {
            return Err(EngineError::Step(format!(
                "linear: {} inputs and {} outputs for {m} rows of a weight [{}, {}]",
                xs.len(),
                out.len(),
                self.n,
                self.k
            )));
        }
        if m > 0 {
            self.forward_raw(xs, m, workers, out.as_mut_ptr());
        }
        Ok(())
    }

    /// The product into the m * n floats at `out`, each written once.
    fn forward_raw(&self, xs: &[f32], m: usize, workers: &Workers, out: *mut f32) {
        let panels = self.n.div_ceil(NR);
        let out_ptr = SendPtr(out);
        let out_ptr = &out_ptr;
        // Read once: the ranges and the tasks cut by the same unit.
        let unit = one_row_panels();
        // Panels p0..p1 of every row (no other task writes their
        // columns): with one row, whole groups of panels through the
        // one-row kernel; the rest a panel at a time.
        let panels_into = |p0: usize, p1: usize| {
            let mut p = p0;
            while m == 1 && p + unit <= p1 {
                self.panels_one_row(xs, p, unit, out_ptr.0);
                p += unit;
            }
            if p < p1 {
                TILES.with_borrow_mut(|[tile, _]| {
                    for p in p..p1 {
                        self.panel(xs, m, p, out_ptr.0, tile);
                    }
                });
            }
        };
        // One row (a batch-1 decode): a group of panels a unit.
        let weights = Stream::of(&self.data, self.k * NR);
        workers.run_ranges(m, panels, unit, weights, panels_into);
    }

    /// Columns `p*NR .. (p + panels)*NR` of a one-row output (the caller
    /// checked that those panels exist; `panels` is
    /// [`one_row_panels`]).
    fn panels_one_row(&self, x: &[f32], p: usize, panels: usize, out: *mut f32) {
        let k = self.k;
        let w = &self.data[p * k * NR..(p + panels) * k * NR];
        let mut tile = [0f32; PANELS1 * NR];
        kernel_one_row(x, k, w, panels, &mut tile);
        let cols = (panels * NR).min(self.n - p * NR);
        #[allow(unsafe_code)]
        // SAFETY: `out` points at n floats (one row); columns p*NR ..
        // p*NR + cols <= n, panels no other task writes.
        unsafe {
            std::ptr::copy_nonoverlapping(tile.as_ptr(), out.add(p * NR), cols);
        }
    }

    /// Columns `p*NR ..` of every row of the output, `SG` rows at a time
    /// (see [`Packed::panel_rows`]).
    fn panel(&self, x: &[f32], m: usize, p: usize, out: *mut f32, tile: &mut [f32; SG * NR]) {
        let cols = NR.min(self.n - p * NR);
        let mut r0 = 0;
        while r0 < m {
            let rows = SG.min(m - r0);
            self.panel_rows(x, r0, rows, p, tile);
            for i in 0..rows {
                let dst = (r0 + i) * self.n + p * NR;
                #[allow(unsafe_code)]
                // SAFETY: `out` points at m * n floats; row r0 + i < m and
                // columns p*NR .. p*NR + cols <= n, a range no other task
                // writes (tasks own disjoint panels).
                unsafe {
                    std::ptr::copy_nonoverlapping(tile[i * NR..].as_ptr(), out.add(dst), cols);
                }
            }
            r0 += rows;
        }
    }

    /// Panel `p` of rows `r0 .. r0 + rows` (at most `SG`) into `tile`:
    /// the panel's blocks of `KC` values of k in order, each block (16 KiB,
    /// in L1) through every group of `MR` rows before the next, so the
    /// panel streams from memory once, at the pace of all the rows'
    /// arithmetic, and the next block is prefetched meanwhile.
    fn panel_rows(&self, x: &[f32], r0: usize, rows: usize, p: usize, tile: &mut [f32; SG * NR]) {
        let k = self.k;
        let w = &self.data[p * k * NR..(p + 1) * k * NR];
        // The AVX2 kernel takes all the rows at once and cuts them into
        // its own register tiles (at most 6 rows; 8 would not fit).
        let mr = if tile_simd() == Simd::Avx2 { SG } else { MR };
        let mut k0 = 0;
        while k0 < k {
            let k1 = k.min(k0 + KC);
            let mut g = 0;
            while g < rows {
                let rr = mr.min(rows - g);
                let xr = &x[(r0 + g) * k..(r0 + g + rr) * k];
                let t = &mut tile[g * NR..(g + rr) * NR];
                // The first two groups share prefetching the panel's
                // next block, a cache line per k each: one group
                // issuing both lines (256 in a row) was 5-10% slower
                // at 16 rows, its FMAs stalled behind the misses. (The
                // AVX2 kernel's one group takes both, spread over all
                // its tiles' passes.)
                let lines = match (g / mr, rows > mr) {
                    (0, false) => 0b11,
                    (0, true) => 0b01,
                    (1, _) => 0b10,
                    _ => 0,
                };
                kernel(xr, k, rr, k0, k1, w, t, lines);
                g += rr;
            }
            k0 = k1;
        }
    }
}

/// A float32 weight [n, k] made contiguous on the CPU, with n and k.
fn weight_rows(w: &Tensor) -> Result<(Tensor, usize, usize), EngineError> {
    let w = w
        .f_to_device(Device::Cpu)?
        .f_to_kind(Kind::Float)?
        .f_contiguous()?;
    let size = w.size();
    let [n, k] = size[..] else {
        return Err(EngineError::Step(format!(
            "expected a 2-d weight, got {size:?}"
        )));
    };
    Ok((w, n as usize, k as usize))
}

/// `panels` panels of `NR` columns from the rows of `src` ([rows, k]):
/// panel p takes `count` rows from `first` (`rows_of(p)`), zero past them.
fn pack(
    src: &[f32],
    k: usize,
    panels: usize,
    rows_of: impl Fn(usize) -> (usize, usize),
) -> Pages<f32> {
    let mut data = Pages::zeroed(panels * k * NR);
    for p in 0..panels {
        let dst = &mut data[p * k * NR..(p + 1) * k * NR];
        let (first, count) = rows_of(p);
        for c in 0..count {
            let row = &src[(first + c) * k..][..k];
            for (kk, &v) in row.iter().enumerate() {
                dst[kk * NR + c] = v;
            }
        }
    }
    data
}

/// Times `x W^T` with a random f32 weight [n, k] (streamed from memory,
/// not the caches, unless `cached`) against activations [m, k] on
/// `threads` workers: mean milliseconds per call after one warm-up call.
/// For profiling the kernel (`engine/examples/f32mm.rs`), not a test.
pub fn time_matmul(
    n: usize,
    k: usize,
    m: usize,
    threads: usize,
    iters: usize,
    cached: bool,
) -> Result<f64, EngineError> {
    if !available() {
        return Err(EngineError::Unsupported(
            "the packed f32 kernel needs AVX-512F, or AVX2 and FMA".into(),
        ));
    }
    if n == 0 || k == 0 || m == 0 {
        return Err(EngineError::Step(format!("bad shape n {n} k {k} m {m}")));
    }
    // Enough copies of the weight that together they overflow the caches,
    // so each call streams its weight from memory as a model's step does.
    // (With `cached`, one copy: a weight that fits the caches stays there
    // and the arithmetic alone is timed.)
    let copies = if cached {
        1
    } else {
        (256usize << 20).div_ceil(n * k * 4).max(1)
    };
    let w = Tensor::randn([n as i64, k as i64], (Kind::Float, Device::Cpu));
    let x = Tensor::randn([m as i64, k as i64], (Kind::Float, Device::Cpu));
    let ps = (0..copies)
        .map(|_| Packed::new(&w))
        .collect::<Result<Vec<_>, _>>()?;
    let workers = Workers::new(threads)?;
    let _ = ps[0].forward(&x, &workers)?;
    let t = std::time::Instant::now();
    for i in 0..iters {
        let _ = ps[i % copies].forward(&x, &workers)?;
    }
    Ok(t.elapsed().as_secs_f64() * 1e3 / iters.max(1) as f64)
}

/// `x` [m, k] made contiguous, and its m; an error when its shape does not
/// fit a weight of `k` inputs.
pub(crate) fn input_rows(x: &Tensor, k: usize) -> Result<(Tensor, usize), EngineError> {
    let x = x.f_contiguous()?;
    let size = x.size();
    match size[..] {
        [m, kx] if kx as usize == k => Ok((x, m as usize)),
        _ => Err(EngineError::Step(format!(
            "linear: input {size:?} does not match a weight of {k} inputs"
        ))),
    }
}

struct SendPtr(*mut f32);
// SAFETY: the pointer is only used to write disjoint ranges of a buffer that
// outlives the scope of the tasks that share it.
#[allow(unsafe_code)]
unsafe impl Sync for SendPtr {}
#[allow(unsafe_code)]
unsafe impl Send for SendPtr {}

/// For `rows` rows of `x` ([rows, k]; at most MR, or SG for AVX2) and one
/// packed panel `w` ([k, NR]), the sums over k0..k1 (one block of at most
/// `KC`) of `x[i][k] * w[k][c]`, written to `tile[i][c]` when k0 is 0 and
/// added to it after.
/// `prefetch`: which of the two cache lines per k of the panel's next block
/// (or the next panel's first) to prefetch while at it (bit 0 the first,
/// bit 1 the second).
#[allow(clippy::too_many_arguments)]
fn kernel(
    x: &[f32],
    k: usize,
    rows: usize,
    k0: usize,
    k1: usize,
    w: &[f32],
    tile: &mut [f32],
    prefetch: u8,
) {
    debug_assert!(rows <= SG && x.len() >= rows * k && w.len() >= k * NR);
    debug_assert!(k0 < k1 && k1 <= k && k1 - k0 <= KC && tile.len() >= rows * NR);
    #[cfg(target_arch = "x86_64")]
    match tile_simd() {
        Simd::Avx512 => {
            debug_assert!(rows <= MR);
            #[allow(unsafe_code)]
            // SAFETY: the CPU has AVX-512F (checked); the slices hold rows * k
            // and k * NR floats and the tile rows * NR (asserted above).
            unsafe {
                let f = match rows {
                    8 => avx512::block::<8>,
                    7 => avx512::block::<7>,
                    6 => avx512::block::<6>,
                    5 => avx512::block::<5>,
                    4 => avx512::block::<4>,
                    3 => avx512::block::<3>,
                    2 => avx512::block::<2>,
                    _ => avx512::block::<1>,
                };
                f(x, k, k0, k1, w, tile, prefetch);
            }
            return;
        }
        Simd::Avx2 => {
            #[allow(unsafe_code)]
            // SAFETY: the CPU has AVX2 and FMA (checked); the slices hold
            // rows * k and k * NR floats and the tile rows * NR (asserted
            // above).
            unsafe {
                avx2::rows(x, k, rows, k0, k1, w, tile, prefetch);
            }
            return;
        }
        Simd::None => {}
    }
    let _ = prefetch;
    portable(x, k, rows, k0, k1, w, tile);
}

/// [`kernel`] for one row over `panels` consecutive panels (`w`, [panels,
/// k, NR]; 2 or `PANELS1`, see [`one_row_panels`]) at once: each output
/// element is summed in the same order as there (so to the bit the same),
/// but the panels' independent FMA chains overlap. One panel's two chains
/// (AVX-512) leave a batch-1 decode bound by FMA latency, well short of the
/// memory bandwidth it could stream weights at.
fn kernel_one_row(x: &[f32], k: usize, w: &[f32], panels: usize, tile: &mut [f32; PANELS1 * NR]) {
    assert!(panels <= PANELS1 && panels.is_multiple_of(2));
    assert!(x.len() >= k && w.len() >= panels * k * NR);
    #[cfg(target_arch = "x86_64")]
    match tile_simd() {
        Simd::Avx512 if panels == PANELS1 => {
            #[allow(unsafe_code)]
            // SAFETY: the CPU has AVX-512F (checked); `x` holds k floats and
            // `w` PANELS1 panels of k * NR (matched and asserted above).
            unsafe {
                avx512::one_row(x, k, w, tile);
            }
            return;
        }
        // An AVX-512 CPU has AVX2 and FMA too.
        Simd::Avx2 | Simd::Avx512 => {
            #[allow(unsafe_code)]
            // SAFETY: the CPU has AVX2 and FMA (checked); `x` holds k floats
            // and `w` `panels` (even, at most PANELS1) panels of k * NR
            // (asserted above).
            unsafe {
                avx2::one_row(x, k, w, panels, tile);
            }
            return;
        }
        Simd::None => {}
    }
    for (q, t) in tile.chunks_exact_mut(NR).take(panels).enumerate() {
        let panel = &w[q * k * NR..(q + 1) * k * NR];
        let mut k0 = 0;
        while k0 < k {
            let k1 = k.min(k0 + KC);
            portable(x, k, 1, k0, k1, panel, t);
            k0 = k1;
        }
    }
}

/// The kernel without SIMD, with the same order of operations per element.
fn portable(x: &[f32], k: usize, rows: usize, k0: usize, k1: usize, w: &[f32], tile: &mut [f32]) {
    for i in 0..rows {
        let xr = &x[i * k + k0..i * k + k1];
        let t = &mut tile[i * NR..(i + 1) * NR];
        let mut acc = [0f32; NR];
        for (j, &xv) in xr.iter().enumerate() {
            let wk = &w[(k0 + j) * NR..][..NR];
            for (a, &wv) in acc.iter_mut().zip(wk) {
                *a = xv.mul_add(wv, *a);
            }
        }
        for (tv, a) in t.iter_mut().zip(acc) {
            *tv = if k0 == 0 { a } else { *tv + a };
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod avx512;

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod avx2;

#[cfg(test)]
mod tests;
