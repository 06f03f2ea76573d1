//! The quantized products' orchestration: a step's activations quantized
//! as the kernel reads them (`prepare`), the product cut into tasks of
//! groups and rows over the workers (`split`), each task's
//! columns through the panel product or group by group (`columns`,
//! `group`, `tile`), and the SwiGLU product whose tasks also apply the
//! SiLU (`forward_silu`). The kernels themselves are in `avx2.rs`,
//! `avx512.rs`, `panel.rs` and `mod.rs` (portable).

use tch::Tensor;

use super::{Activations, F32Rows, Kernel, MR, NG, QuantMatrix, QuantizedRows, Rows, panel_min};
#[cfg(target_arch = "x86_64")]
use super::{PANEL_PART, avx2, avx512, panel};
use crate::EngineError;

impl QuantMatrix {
    /// `x W^T` for a float32 CPU `x` [m, k] -> [m, n], split over `pool`.
    pub(crate) fn forward(
        &self,
        x: &Tensor,
        acts: Activations,
        workers: &crate::gemm::Workers,
    ) -> Result<Tensor, EngineError> {
        let (x, m) = crate::gemm::input_rows(x, self.k)?;
        let xs = crate::attn::f32_view(&x)?;
        crate::attn::f32_tensor_written(&[m as i64, self.n as i64], |out| {
            self.matmul_to(xs, m, acts, Kernel::best(), workers, out)
        })
    }

    /// Output columns (`n` of the weight [n, k]).
    pub(crate) fn out_features(&self) -> usize {
        self.n
    }

    /// [`Self::forward`] of `xs` ([m, k], row-major) into `out` ([m, n]),
    /// buffers the caller keeps from step to step (the row path,
    /// `layers::rows`): the same tasks, so the same bits.
    pub(crate) fn forward_to(
        &self,
        xs: &[f32],
        m: usize,
        acts: Activations,
        workers: &crate::gemm::Workers,
        out: &mut [f32],
    ) -> Result<(), EngineError> {
        self.check_rows(xs, m, out, self.n)?;
        if m > 0 {
            self.matmul_to(xs, m, acts, Kernel::best(), workers, out.as_mut_ptr());
        }
        Ok(())
    }

    /// [`Self::forward_silu`] of `xs` into `out` ([m, inter]) through `gu`
    /// (m * n floats of scratch): false (and nothing written) where inter
    /// is not a whole number of groups.
    pub(crate) fn forward_silu_to(
        &self,
        xs: &[f32],
        m: usize,
        acts: Activations,
        workers: &crate::gemm::Workers,
        gu: &mut [f32],
        out: &mut [f32],
    ) -> Result<bool, EngineError> {
        let inter = self.n / 2;
        if !self.silu_fits() {
            return Ok(false);
        }
        self.check_rows(xs, m, out, inter)?;
        if gu.len() != m * self.n {
            return Err(EngineError::Step(
                "gate/up: scratch of the wrong size".into(),
            ));
        }
        if m > 0 {
            let (gp, op) = (gu.as_mut_ptr(), out.as_mut_ptr());
            self.matmul_silu_to(xs, m, acts, Kernel::best(), workers, gp, op);
        }
        Ok(true)
    }

    /// Whether [`Self::forward_silu`] applies: the stacked weight's
    /// halves are whole numbers of groups.
    pub(crate) fn silu_fits(&self) -> bool {
        let inter = self.n / 2;
        self.n.is_multiple_of(2) && inter.is_multiple_of(NG) && inter > 0
    }

    fn check_rows(
        &self,
        xs: &[f32],
        m: usize,
        out: &[f32],
        width: usize,
    ) -> Result<(), EngineError> {
        if xs.len() != m * self.k || out.len() != m * width {
            return Err(EngineError::Step(format!(
                "quantized linear: {} inputs and {} outputs for {m} rows of a weight [{}, {}]",
                xs.len(),
                out.len(),
                self.n,
                self.k
            )));
        }
        Ok(())
    }

    /// `out` [m, n] = `x` [m, k] W^T, with `kernel`'s tiles.
    #[cfg(test)]
    pub(super) fn matmul(
        &self,
        x: &[f32],
        m: usize,
        acts: Activations,
        kernel: Kernel,
        workers: &crate::gemm::Workers,
        out: &mut [f32],
    ) {
        assert_eq!(out.len(), m * self.n);
        self.matmul_to(x, m, acts, kernel, workers, out.as_mut_ptr());
    }

    /// `silu(x G^T) * (x U^T)` [m, inter] for a stacked gate/up weight
    /// (`n` = 2 inter, gate rows first), with gate column j's group and up
    /// column j's computed by the same task, which then writes their SiLU
    /// product: the activation runs in parallel, on columns still in cache,
    /// instead of as a pass of its own on the calling thread. The same
    /// products and the same `silu(g) * u` as [`Self::forward`] then
    /// [`crate::fused::silu_mul`], so the same bits. None where inter is
    /// not a whole number of groups.
    pub(crate) fn forward_silu(
        &self,
        x: &Tensor,
        acts: Activations,
        workers: &crate::gemm::Workers,
    ) -> Result<Option<Tensor>, EngineError> {
        let inter = self.n / 2;
        if !self.silu_fits() {
            return Ok(None);
        }
        let (x, m) = crate::gemm::input_rows(x, self.k)?;
        let xs = crate::attn::f32_view(&x)?;
        // Every element of `gu` is written (by its group's task) before
        // that task reads it.
        let gu = Tensor::f_empty(
            [m as i64, self.n as i64],
            (tch::Kind::Float, tch::Device::Cpu),
        )?;
        let gu_ptr = gu.data_ptr().cast::<f32>();
        let out = crate::attn::f32_tensor_written(&[m as i64, inter as i64], |out| {
            self.matmul_silu_to(xs, m, acts, Kernel::best(), workers, gu_ptr, out)
        })?;
        Ok(Some(out))
    }

    /// [`Self::matmul`] into the m * n floats at `out`, every one of which it
    /// writes once (the groups split between the chunks cover all columns,
    /// each for every row).
    pub(super) fn matmul_to(
        &self,
        x: &[f32],
        m: usize,
        acts: Activations,
        kernel: Kernel,
        workers: &crate::gemm::Workers,
        out: *mut f32,
    ) {
        let out_ptr = SendPtr(out);
        let out_ptr = &out_ptr;
        let groups = self.n.div_ceil(NG);
        let weights = self.stream();
        self.split(
            x,
            m,
            acts,
            kernel,
            workers,
            groups,
            weights,
            |rows, gs, rs| {
                self.columns(rows, m, kernel, gs, rs, out_ptr.0);
            },
        );
    }

    /// Where each column group's blocks lie, for the workers' prefetch.
    fn stream(&self) -> crate::workers::Stream {
        crate::workers::Stream::of(&self.data, self.blocks() * self.fmt.stride())
    }

    /// Quantizes `x` as `kernel` reads it, cuts `groups` groups (whose
    /// blocks lie as `weights` says) and the
    /// `m` rows into tasks and runs `task(rows, (g0, g1), (r0, r1))` for
    /// each on `workers`. The panel product: panels of up to 6 groups, at
    /// least two a thread where there are enough groups, times rows in
    /// parts of 64 (prefill's many). The other kernels: group ranges as
    /// [`crate::gemm::Workers::run_ranges`] cuts them for one row (units of
    /// [`ONE_ROW_UNIT`] groups), otherwise a few contiguous chunks a
    /// thread, each taking all the rows.
    #[allow(clippy::too_many_arguments)]
    fn split(
        &self,
        x: &[f32],
        m: usize,
        acts: Activations,
        kernel: Kernel,
        workers: &crate::gemm::Workers,
        groups: usize,
        weights: crate::workers::Stream,
        task: impl Fn(&Rows, (usize, usize), (usize, usize)) + Sync,
    ) {
        let rows = self.prepare(x, m, acts, kernel, workers);
        let rows = &rows;
        #[cfg(target_arch = "x86_64")]
        if Self::panels(rows, m, kernel) {
            let per = groups
                .div_ceil(workers.threads() * 2)
                .clamp(1, panel::GROUPS);
            let parts = m.div_ceil(PANEL_PART);
            workers.run(groups.div_ceil(per) * parts, |c| {
                let (c, rp) = (c / parts, c % parts);
                let gs = (c * per, ((c + 1) * per).min(groups));
                let rs = (rp * PANEL_PART, ((rp + 1) * PANEL_PART).min(m));
                task(rows, gs, rs);
            });
            return;
        }
        let each = |g0, g1| task(rows, (g0, g1), (0, m));
        if m == 1 {
            workers.run_ranges(m, groups, ONE_ROW_UNIT, weights, each);
        } else {
            workers.run_chunked(groups, each);
        }
    }

    /// [`Self::forward_silu`] into `out` (m * n / 2 floats), through `gu`
    /// (m * n floats, gate and up as [`Self::matmul_to`] writes them): the
    /// chunks split the gate's groups, and each takes the up groups inter
    /// columns on with them.
    #[allow(clippy::too_many_arguments)]
    fn matmul_silu_to(
        &self,
        x: &[f32],
        m: usize,
        acts: Activations,
        kernel: Kernel,
        workers: &crate::gemm::Workers,
        gu: *mut f32,
        out: *mut f32,
    ) {
        let inter = self.n / 2;
        let half = inter / NG;
        let (gu_ptr, out_ptr) = (SendPtr(gu), SendPtr(out));
        let (gu_ptr, out_ptr) = (&gu_ptr, &out_ptr);
        self.split(
            x,
            m,
            acts,
            kernel,
            workers,
            half,
            self.stream().and_at(half),
            |rows, (g0, g1), (r0, r1)| {
                self.columns(rows, m, kernel, (g0, g1), (r0, r1), gu_ptr.0);
                self.columns(rows, m, kernel, (g0 + half, g1 + half), (r0, r1), gu_ptr.0);
                let (c0, c1) = (g0 * NG, g1 * NG);
                for r in r0..r1 {
                    #[allow(unsafe_code)]
                    // SAFETY: `gu` holds m rows of n = 2 inter floats and `out`
                    // m rows of inter; row r < m, and columns c0..c1 <= inter
                    // (and the same + inter) of it were just written by this
                    // task, which alone writes out's columns c0..c1 of it.
                    unsafe {
                        let g = std::slice::from_raw_parts(gu_ptr.0.add(r * self.n + c0), c1 - c0);
                        let u = std::slice::from_raw_parts(
                            gu_ptr.0.add(r * self.n + inter + c0),
                            c1 - c0,
                        );
                        let o =
                            std::slice::from_raw_parts_mut(out_ptr.0.add(r * inter + c0), c1 - c0);
                        crate::gemm::silu_into(g, u, o);
                    }
                }
            },
        );
    }

    /// The step's activations as `kernel` reads them.
    fn prepare<'a>(
        &self,
        x: &'a [f32],
        m: usize,
        acts: Activations,
        kernel: Kernel,
        workers: &crate::gemm::Workers,
    ) -> Rows<'a> {
        match acts {
            Activations::Int8 | Activations::Int8Residual => {
                let mut q = QuantizedRows::new(
                    x,
                    m,
                    self.k,
                    acts == Activations::Int8Residual,
                    self.fmt.offset(),
                    self.fmt.halves(),
                    Some(workers),
                );
                // The AVX2 kernels' int16 activations (`128 q + q2`, or
                // without the residual `q` itself): for byte quants, and
                // for the panel product (every format) from its fewest
                // rows.
                if kernel == Kernel::Avx2 && (self.fmt.byte_quants() || m >= panel_min()) {
                    q.widen();
                    q.widen_plain();
                }
                Rows::Int8(q)
            }
            Activations::F32 => Rows::F32(F32Rows::new(x, m, self.k)),
        }
    }

    /// Whether `columns` takes the AVX2 panel product for these rows.
    fn panels(rows: &Rows, m: usize, kernel: Kernel) -> bool {
        cfg!(target_arch = "x86_64")
            && kernel == Kernel::Avx2
            && m >= panel_min()
            && matches!(rows, Rows::Int8(q) if !q.wide.is_empty())
    }

    /// Groups `g0 .. g1` of rows `r0 .. r1` into `out` (m rows of n
    /// floats): the panel product where [`Self::panels`] says, else group
    /// by group (all m rows: those kernels take no row ranges).
    fn columns(
        &self,
        rows: &Rows,
        m: usize,
        kernel: Kernel,
        (g0, g1): (usize, usize),
        (r0, r1): (usize, usize),
        out: *mut f32,
    ) {
        #[cfg(target_arch = "x86_64")]
        if Self::panels(rows, m, kernel)
            && let Rows::Int8(q) = rows
        {
            panel::columns(self, q, m, (g0, g1), (r0, r1), out);
            return;
        }
        debug_assert!(r0 == 0 && r1 == m);
        // One tile for all the groups, not one zeroed per group (the
        // kernels write a tile's rows before they are read).
        let mut tile = [[0f32; NG]; MR];
        for g in g0..g1 {
            self.group(rows, m, g, kernel, out, &mut tile);
        }
    }
    /// Columns `g*NG ..` of every row of the output.
    fn group(
        &self,
        rows: &Rows,
        m: usize,
        g: usize,
        kernel: Kernel,
        out: *mut f32,
        tile: &mut [[f32; NG]; MR],
    ) {
        let cols = NG.min(self.n - g * NG);
        let mut r = 0;
        while r < m {
            let n_rows = MR.min(m - r);
            self.tile(rows, r, n_rows, g, kernel, tile);
            for (i, t) in tile.iter().enumerate().take(n_rows) {
                let dst = (r + i) * self.n + g * NG;
                #[allow(unsafe_code)]
                // SAFETY: `out` points at m * n floats; row r + i < m and
                // columns g*NG .. g*NG + cols <= n, a range no other task
                // writes (tasks own disjoint groups).
                unsafe {
                    std::ptr::copy_nonoverlapping(t.as_ptr(), out.add(dst), cols);
                }
            }
            r += n_rows;
        }
    }

    fn tile(
        &self,
        rows: &Rows,
        r0: usize,
        n_rows: usize,
        g: usize,
        kernel: Kernel,
        tile: &mut [[f32; NG]; MR],
    ) {
        #[cfg(target_arch = "x86_64")]
        match kernel {
            Kernel::Avx512Vnni => return avx512::tile(self, rows, r0, n_rows, g, tile),
            Kernel::Avx2 => return avx2::tile(self, rows, r0, n_rows, g, tile),
            Kernel::Portable => {}
        }
        let _ = kernel;
        match rows {
            Rows::Int8(q) => self.portable_int8(q, r0, n_rows, g, tile),
            Rows::F32(f) => self.portable_f32(f, r0, n_rows, g, tile),
        }
    }
}

/// Groups a unit of a one-row product takes (64 columns: SmolLM2's rows
/// of 576 Q8_0 values make it 38 KiB of weights).
const ONE_ROW_UNIT: usize = 4;

/// The output buffer, shared by the tasks that write disjoint ranges of it.
struct SendPtr(*mut f32);
// SAFETY: the pointer is only used to write disjoint ranges of a buffer that
// outlives the scope of the tasks that share it.
#[allow(unsafe_code)]
unsafe impl Sync for SendPtr {}
#[allow(unsafe_code)]
unsafe impl Send for SendPtr {}
