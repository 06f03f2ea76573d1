//! SwiGLU's stacked gate/up weight packed in pairs of panels, so the task
//! that computes a column range's gate and up tiles writes `silu(gate) *
//! up` itself (see `Packed::gated`).

use tch::Tensor;

use super::{
    NR, PANELS1, Packed, SG, SendPtr, Stream, TILES, Workers, input_rows, kernel_one_row,
    one_row_panels, pack, weight_rows,
};
use crate::EngineError;
#[cfg(target_arch = "x86_64")]
use crate::simd::{Simd, simd};

impl Packed {
    /// Packs a stacked gate/up weight [2 * inter, k] (gate rows first) for
    /// [`Packed::forward_silu`]: panel 2j holds gate columns j*NR.., panel
    /// 2j + 1 the same up columns, so one task computes both tiles of a
    /// column range and writes `silu(gate) * up`, in parallel, without the
    /// [m, 2 * inter] product going through memory.
    pub(crate) fn gated(w: &Tensor) -> Result<Self, EngineError> {
        let (src, n, k) = weight_rows(w)?;
        if n % 2 != 0 {
            return Err(EngineError::Step(format!(
                "a stacked gate/up weight needs an even row count, got {n}"
            )));
        }
        let inter = n / 2;
        let data = pack(
            crate::attn::f32_view(&src)?,
            k,
            2 * inter.div_ceil(NR),
            |p| {
                let c0 = (p / 2) * NR;
                ((p % 2) * inter + c0, NR.min(inter - c0))
            },
        );
        Ok(Self {
            n,
            k,
            data: std::sync::Arc::new(data),
            gated: Some(inter),
        })
    }

    /// `silu(x G^T) * (x U^T)` for a weight packed by [`Packed::gated`]
    /// and a float32 CPU `x` [m, k] -> [m, inter], split over `workers`.
    /// Each element is what `forward` then the SiLU-and-multiply pass give
    /// it, to the bit.
    pub(crate) fn forward_silu(
        &self,
        x: &Tensor,
        workers: &Workers,
    ) -> Result<Tensor, EngineError> {
        self.forward_pairs(x, workers, true)
    }

    /// A gated weight's product by column pairs: with `silu`, `silu(gate) *
    /// up` [m, inter]; without, gate and up as `forward` gives them [m, 2 *
    /// inter].
    pub(super) fn forward_pairs(
        &self,
        x: &Tensor,
        workers: &Workers,
        silu: bool,
    ) -> Result<Tensor, EngineError> {
        let Some(inter) = self.gated else {
            return Err(EngineError::Step(
                "forward_silu needs a gate/up weight packed for it".into(),
            ));
        };
        let (x, m) = input_rows(x, self.k)?;
        let xs = crate::attn::f32_view(&x)?;
        let width = if silu { inter } else { 2 * inter };
        crate::attn::f32_tensor_written(&[m as i64, width as i64], |out| {
            self.pairs_raw(xs, m, inter, workers, silu, out);
        })
    }

    /// [`Packed::forward_silu`] of `xs` ([m, k], row-major) into `out`
    /// ([m, inter]), buffers the caller keeps from step to step (the row
    /// path, `layers::rows`): the same tasks, so the same bits.
    pub(crate) fn forward_silu_to(
        &self,
        xs: &[f32],
        m: usize,
        workers: &Workers,
        out: &mut [f32],
    ) -> Result<(), EngineError> {
        let Some(inter) = self.gated else {
            return Err(EngineError::Step(
                "forward_silu needs a gate/up weight packed for it".into(),
            ));
        };
        if xs.len() != m * self.k || out.len() != m * inter {
            return Err(EngineError::Step(format!(
                "gate/up: {} inputs and {} outputs for {m} rows of a weight [{}, {}]",
                xs.len(),
                out.len(),
                2 * inter,
                self.k
            )));
        }
        if m > 0 {
            self.pairs_raw(xs, m, inter, workers, true, out.as_mut_ptr());
        }
        Ok(())
    }

    /// The pairs' product into the m * width floats at `out` (width
    /// `inter` with `silu`, else `2 * inter`), each written once.
    fn pairs_raw(
        &self,
        xs: &[f32],
        m: usize,
        inter: usize,
        workers: &Workers,
        silu: bool,
        out: *mut f32,
    ) {
        let pairs = inter.div_ceil(NR);
        let out_ptr = SendPtr(out);
        let out_ptr = &out_ptr;
        // Read once: the ranges and the tasks cut by the same unit.
        let unit = one_row_panels();
        // Pairs j0..j1 of every row (no other task writes their
        // columns).
        let pairs_into = |j0: usize, j1: usize| {
            let mut j = j0;
            while m == 1 && j + unit / 2 <= j1 {
                let k = self.k;
                let w = &self.data[2 * j * k * NR..(2 * j + unit) * k * NR];
                let mut tile = [0f32; PANELS1 * NR];
                kernel_one_row(xs, k, w, unit, &mut tile);
                for q in 0..unit / 2 {
                    let (g, u) = tile[2 * q * NR..].split_at(NR);
                    self.write_pair(out_ptr.0, inter, silu, 0, j + q, g, &u[..NR]);
                }
                j += unit / 2;
            }
            if j < j1 {
                TILES.with_borrow_mut(|[gate, up]| {
                    for j in j..j1 {
                        let mut r0 = 0;
                        while r0 < m {
                            let rows = SG.min(m - r0);
                            self.panel_rows(xs, r0, rows, 2 * j, gate);
                            self.panel_rows(xs, r0, rows, 2 * j + 1, up);
                            for i in 0..rows {
                                let (g, u) = (&gate[i * NR..][..NR], &up[i * NR..][..NR]);
                                self.write_pair(out_ptr.0, inter, silu, r0 + i, j, g, u);
                            }
                            r0 += rows;
                        }
                    }
                });
            }
        };
        // One row: whole groups of panels for the one-row kernel.
        let weights = Stream::of(&self.data, 2 * self.k * NR);
        workers.run_ranges(m, pairs, unit / 2, weights, pairs_into);
    }

    /// Row `r`, columns `j*NR ..` of a gated output from the tiles' columns
    /// that exist: with `silu`, `silu(g) * u` into [.., inter]; without, `g`
    /// and `u` into their columns of [.., 2 * inter].
    #[allow(clippy::too_many_arguments)]
    fn write_pair(
        &self,
        out: *mut f32,
        inter: usize,
        silu: bool,
        r: usize,
        j: usize,
        g: &[f32],
        u: &[f32],
    ) {
        let cols = NR.min(inter - j * NR);
        let width = if silu { inter } else { 2 * inter };
        #[allow(unsafe_code)]
        // SAFETY: `out` points at m * width floats with r < m; this task
        // alone writes columns j*NR .. j*NR + cols (<= inter) of row r, and
        // without `silu` the same columns + inter (tasks own disjoint
        // column pairs).
        let at = |c0: usize| unsafe {
            std::slice::from_raw_parts_mut(out.add(r * width + c0 + j * NR), cols)
        };
        if silu {
            silu_into(&g[..cols], &u[..cols], at(0));
        } else {
            at(0).copy_from_slice(&g[..cols]);
            at(inter).copy_from_slice(&u[..cols]);
        }
    }
}

/// [`crate::fused::silu_mul_slice`] compiled for the widest vectors the
/// CPU has (the same operations, so the same results).
pub(crate) fn silu_into(g: &[f32], u: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    match simd() {
        #[allow(unsafe_code)]
        // SAFETY: the CPU has AVX-512F (checked).
        Simd::Avx512 => return unsafe { silu_avx512(g, u, out) },
        #[allow(unsafe_code)]
        // SAFETY: the CPU has AVX2 and FMA (checked).
        Simd::Avx2 => return unsafe { silu_avx2(g, u, out) },
        Simd::None => {}
    }
    crate::fused::silu_mul_slice(g, u, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn silu_avx512(g: &[f32], u: &[f32], out: &mut [f32]) {
    crate::fused::silu_mul_slice(g, u, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn silu_avx2(g: &[f32], u: &[f32], out: &mut [f32]) {
    crate::fused::silu_mul_slice(g, u, out);
}
