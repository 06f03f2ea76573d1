//! A step's activations as the kernels read them: quantized per 32-block
//! to int8 (with the block's scale, the sum of its quants and, optionally,
//! the int8 rounding residual at 1/128 of the step), or f32 with each
//! block's sum. Quantizing is scalar and done once per step, before the
//! kernels split the columns over the threads.

use super::QK;

/// A step's activations as a kernel reads them.
pub(super) enum Rows<'a> {
    Int8(QuantizedRows),
    F32(F32Rows<'a>),
}

/// Activations quantized per 32-block: int8 quants `q`, the block's scale
/// `dx` and the sum of its quants; with `residual`, also the rounding
/// residual `x - dx q` quantized to int8 at `dx / 128` (and its sum). `sx`
/// is the block's sum as the quants give them (for Q4_1's mins). What the
/// kernels read per block besides the quants is folded ahead: `scale`, the
/// value of one unit of the block's combined integer dot product (`dx`, or
/// `dx / 128` with the residual, whose dot product is `128 q.w + q2.w`),
/// and `corr`, the weights' offset times the matching combination of the
/// quants' sums (`off * sum`, or `off * (128 sum + sum2)`). For weights
/// with a scale per 16 values (Q6_K), `corr_lo` is the same over each
/// block's first 16 values (the second 16's is `corr - corr_lo`); empty
/// otherwise.
pub(super) struct QuantizedRows {
    blocks: usize,
    pub(super) q: Vec<i8>,
    pub(super) sx: Vec<f32>,
    pub(super) residual: Option<(Vec<i8>, Vec<i32>)>,
    pub(super) scale: Vec<f32>,
    pub(super) corr: Vec<i32>,
    pub(super) corr_lo: Vec<i32>,
    /// `128 q + q2` per value, as int16 (within +-16,449), for the AVX2
    /// kernel's int16 products (see [`QuantizedRows::widen`]); empty
    /// until then.
    pub(super) wide: Vec<i16>,
}

/// One block of [`QuantizedRows`].
pub(super) struct QuantBlock<'a> {
    pub(super) q: &'a [i8],
    /// The residual's quants.
    pub(super) q2: Option<&'a [i8]>,
    pub(super) scale: f32,
    pub(super) corr: i32,
    /// `corr` over the first 16 values (0 unless the rows were made with
    /// `halves`).
    pub(super) corr_lo: i32,
    pub(super) sx: f32,
}

/// The residual's step relative to the block's (a power of two, so that
/// `scale / 128` is exact).
pub(super) const RESIDUAL_STEP: f32 = 1.0 / 128.0;

/// `v.round() as i8` (halves away from zero, saturating) for |v| < 2^23,
/// without the libm call `f32::round` becomes on baseline x86-64:
/// truncate, then step away from zero when the dropped fraction (exact,
/// since |v| < 2^23) is at least one half. Branch-free, so the block loops
/// vectorise.
#[inline(always)]
fn round_i8(v: f32) -> i8 {
    let t = v as i32;
    let frac = v - t as f32;
    // `as i8` of a float saturates; so does this.
    (t + i32::from(frac >= 0.5) - i32::from(frac <= -0.5)).clamp(-128, 127) as i8
}

impl QuantizedRows {
    /// `dx = max|x| / 127`, `q = round(x / dx)` (0 for an all-zero block);
    /// with `residual`, `q2 = round((x - dx q) / (dx / 128))`, within
    /// [-65, 65]. With `halves`, also each block's `corr_lo`.
    pub(super) fn new(
        x: &[f32],
        m: usize,
        k: usize,
        residual: bool,
        off: i32,
        halves: bool,
        workers: Option<&crate::workers::Workers>,
    ) -> Self {
        let blocks = k / QK;
        let mut q = vec![0i8; m * k];
        let mut d = vec![0f32; m * blocks];
        let mut sum = vec![0i32; m * blocks];
        let mut sx = vec![0f32; m * blocks];
        let mut res = residual.then(|| (vec![0i8; m * k], vec![0i32; m * blocks]));
        // Rows split over the workers when there are several: each part
        // quantizes its own rows into its own ranges, as alone.
        let parts = workers.map_or(1, |w| w.threads()).min(m).max(1);
        let rows_per = m.div_ceil(parts);
        let (mut rq, mut rd, mut rs, mut rx) = (&mut q[..], &mut d[..], &mut sum[..], &mut sx[..]);
        let (mut r2, mut rs2) = match &mut res {
            Some((a, b)) => (&mut a[..], &mut b[..]),
            None => (&mut [][..], &mut [][..]),
        };
        let mut jobs = Vec::with_capacity(parts);
        let mut r0 = 0;
        while r0 < m {
            let n = rows_per.min(m - r0);
            let (q1, q2) = std::mem::take(&mut rq).split_at_mut(n * k);
            let (d1, d2) = std::mem::take(&mut rd).split_at_mut(n * blocks);
            let (s1, s2) = std::mem::take(&mut rs).split_at_mut(n * blocks);
            let (x1, x2) = std::mem::take(&mut rx).split_at_mut(n * blocks);
            let (res_part, rest) = if residual {
                let (a1, a2) = std::mem::take(&mut r2).split_at_mut(n * k);
                let (b1, b2) = std::mem::take(&mut rs2).split_at_mut(n * blocks);
                (Some((a1, b1)), Some((a2, b2)))
            } else {
                (None, None)
            };
            if let Some((a2, b2)) = rest {
                (r2, rs2) = (a2, b2);
            }
            jobs.push(std::sync::Mutex::new(Some((
                &x[r0 * k..(r0 + n) * k],
                q1,
                d1,
                s1,
                x1,
                res_part,
            ))));
            (rq, rd, rs, rx) = (q2, d2, s2, x2);
            r0 += n;
        }
        let run = |j: usize| {
            let job = jobs[j].lock().map(|mut g| g.take()).ok().flatten();
            if let Some((xs, q, d, sum, sx, res)) = job {
                quantize(xs, q, d, sum, sx, res);
            }
        };
        match workers {
            Some(w) if jobs.len() > 1 => w.run(jobs.len(), run),
            _ => (0..jobs.len()).for_each(run),
        }
        drop(jobs);
        let (scale, corr) = match &res {
            Some((_, sum2)) => (
                d.iter().map(|&dx| dx * RESIDUAL_STEP).collect(),
                sum.iter()
                    .zip(sum2)
                    .map(|(&s, &s2)| off * (128 * s + s2))
                    .collect(),
            ),
            None => (d.clone(), sum.iter().map(|&s| off * s).collect()),
        };
        let corr_lo = if halves {
            let lo = |v: &[i8], i: usize| -> i32 {
                v[i * QK..][..QK / 2].iter().map(|&a| i32::from(a)).sum()
            };
            (0..m * blocks)
                .map(|i| match &res {
                    Some((q2, _)) => off * (128 * lo(&q, i) + lo(q2, i)),
                    None => off * lo(&q, i),
                })
                .collect()
        } else {
            Vec::new()
        };
        Self {
            blocks,
            q,
            sx,
            residual: res,
            scale,
            corr,
            corr_lo,
            wide: Vec::new(),
        }
    }

    /// Fills [`QuantizedRows::wide`] when there is a residual: each block's
    /// `128 q.w + q2.w` is then one chain of int16 products (AVX2's
    /// `vpmaddwd`), the same exact integer as two int8 chains.
    pub(super) fn widen(&mut self) {
        if let Some((q2, _)) = &self.residual {
            self.wide = self
                .q
                .iter()
                .zip(q2)
                .map(|(&a, &b)| 128 * i16::from(a) + i16::from(b))
                .collect();
        }
    }

    /// Without the residual, the quants themselves as int16, for the
    /// int16 kernels (`wide_rows`, the panel product): their `q_w . x`
    /// less the offset's correction is then the int8 kernels' integer,
    /// and `scale` is the block's `dx`, so the same bits.
    pub(super) fn widen_plain(&mut self) {
        if self.residual.is_none() {
            self.wide = self.q.iter().map(|&a| i16::from(a)).collect();
        }
    }

    #[inline(always)]
    pub(super) fn block(&self, r: usize, b: usize) -> QuantBlock<'_> {
        let i = r * self.blocks + b;
        QuantBlock {
            q: &self.q[i * QK..][..QK],
            q2: self.residual.as_ref().map(|(q2, _)| &q2[i * QK..][..QK]),
            scale: self.scale[i],
            corr: self.corr[i],
            corr_lo: self.corr_lo.get(i).copied().unwrap_or(0),
            sx: self.sx[i],
        }
    }
}

/// The quantizer proper over some rows: `x`'s 32-blocks into `q` (and the
/// residual's quants), the blocks' scales `d`, sums of quants `sum` and
/// sums as the quants give them `sx` (see [`QuantizedRows::new`]). With
/// AVX-512 (F and BW) a block at a time in vectors, the same operations
/// per value, so the result is the scalar one's to the bit.
fn quantize(
    x: &[f32],
    q: &mut [i8],
    d: &mut [f32],
    sum: &mut [i32],
    sx: &mut [f32],
    res: Option<(&mut [i8], &mut [i32])>,
) {
    #[cfg(target_arch = "x86_64")]
    if *HAS_AVX512BW {
        #[allow(unsafe_code)]
        // SAFETY: the CPU has AVX-512F and BW (checked at run time).
        unsafe {
            quantize_avx512(x, q, d, sum, sx, res)
        };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if *HAS_AVX2 {
        #[allow(unsafe_code)]
        // SAFETY: the CPU has AVX2 (checked at run time).
        unsafe {
            quantize_avx2(x, q, d, sum, sx, res)
        };
        return;
    }
    quantize_scalar(x, q, d, sum, sx, res);
}

#[cfg(target_arch = "x86_64")]
static HAS_AVX512BW: std::sync::LazyLock<bool> = std::sync::LazyLock::new(|| {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
});

#[cfg(target_arch = "x86_64")]
static HAS_AVX2: std::sync::LazyLock<bool> =
    std::sync::LazyLock::new(|| std::arch::is_x86_feature_detected!("avx2"));

/// [`quantize_avx512`] in AVX2, a block as four vectors of 8: the same
/// operations per value, so the scalar result to the bit (on a Zen 3 the
/// scalar quantizer took 7% of a 16-stream decode step of SmolLM2 Q8_0).
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[target_feature(enable = "avx2")]
fn quantize_avx2(
    x: &[f32],
    q: &mut [i8],
    d: &mut [f32],
    sum: &mut [i32],
    sx: &mut [f32],
    mut res: Option<(&mut [i8], &mut [i32])>,
) {
    use std::arch::x86_64::*;
    /// 8 values' int8 quants as i32 lanes ([`round_i8`]: truncate, step
    /// by the fraction, saturate, NaN to 0).
    #[target_feature(enable = "avx2")]
    fn round8(v: __m256) -> __m256i {
        let t = _mm256_cvttps_epi32(v);
        let frac = _mm256_sub_ps(v, _mm256_cvtepi32_ps(t));
        // All-ones lanes (-1) where the step applies.
        let up = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GE_OQ>(frac, _mm256_set1_ps(0.5)));
        let down = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LE_OQ>(frac, _mm256_set1_ps(-0.5)));
        let t = _mm256_add_epi32(_mm256_sub_epi32(t, up), down);
        let t = _mm256_max_epi32(
            _mm256_min_epi32(t, _mm256_set1_epi32(127)),
            _mm256_set1_epi32(-128),
        );
        // `as i32` of NaN is 0 (cvtt gives i32::MIN).
        _mm256_and_si256(t, _mm256_castps_si256(_mm256_cmp_ps::<_CMP_ORD_Q>(v, v)))
    }
    /// Four vectors of quants (in [-128, 127]) as 32 bytes in order.
    #[target_feature(enable = "avx2")]
    fn bytes(t: [__m256i; 4]) -> __m256i {
        let b = _mm256_packs_epi16(
            _mm256_packs_epi32(t[0], t[1]),
            _mm256_packs_epi32(t[2], t[3]),
        );
        _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
    }
    #[target_feature(enable = "avx2")]
    fn hsum(t: [__m256i; 4]) -> i32 {
        let a = _mm256_add_epi32(_mm256_add_epi32(t[0], t[1]), _mm256_add_epi32(t[2], t[3]));
        let s = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256::<1>(a));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
        _mm_cvtsi128_si32(s)
    }
    let blocks = blocks_checked(x, q, d, sum, sx, &res);
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    for i in 0..blocks {
        // SAFETY: block i's 32 values lie in `x`, `q` and the residual's
        // quants (asserted above); the stores write 32 bytes each.
        unsafe {
            let xp = x.as_ptr().add(i * QK);
            let xv: [__m256; 4] = std::array::from_fn(|j| _mm256_loadu_ps(xp.add(8 * j)));
            // The scalar fold starts at 0 and skips NaN (f32::max); so
            // does max_ps with the running value second.
            let zero = _mm256_setzero_ps();
            let m = xv.map(|v| _mm256_max_ps(_mm256_and_ps(v, abs_mask), zero));
            let m = _mm256_max_ps(_mm256_max_ps(m[0], m[1]), _mm256_max_ps(m[2], m[3]));
            let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
            let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
            let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
            let dx = amax / 127.0;
            let inv = if dx > 0.0 { 1.0 / dx } else { 0.0 };
            let vinv = _mm256_set1_ps(inv);
            let t = xv.map(|v| round8(_mm256_mul_ps(v, vinv)));
            _mm256_storeu_si256(q.as_mut_ptr().add(i * QK).cast(), bytes(t));
            let s = hsum(t);
            d[i] = dx;
            sum[i] = s;
            sx[i] = dx * s as f32;
            if let Some((q2, sum2)) = &mut res {
                let inv2 = _mm256_set1_ps(inv / RESIDUAL_STEP);
                let vdx = _mm256_set1_ps(dx);
                let u: [__m256i; 4] = std::array::from_fn(|j| {
                    let back = _mm256_mul_ps(vdx, _mm256_cvtepi32_ps(t[j]));
                    round8(_mm256_mul_ps(_mm256_sub_ps(xv[j], back), inv2))
                });
                _mm256_storeu_si256(q2.as_mut_ptr().add(i * QK).cast(), bytes(u));
                let s2 = hsum(u);
                sum2[i] = s2;
                sx[i] += dx * RESIDUAL_STEP * s2 as f32;
            }
        }
    }
}

/// `x`'s blocks, once the outputs are checked to hold them all (the SIMD
/// quantizers store without bounds checks).
#[cfg(target_arch = "x86_64")]
fn blocks_checked(
    x: &[f32],
    q: &[i8],
    d: &[f32],
    sum: &[i32],
    sx: &[f32],
    res: &Option<(&mut [i8], &mut [i32])>,
) -> usize {
    let blocks = x.len() / QK;
    assert!(
        q.len() >= blocks * QK && d.len() >= blocks && sum.len() >= blocks && sx.len() >= blocks
    );
    if let Some((q2, s2)) = res {
        assert!(q2.len() >= blocks * QK && s2.len() >= blocks);
    }
    blocks
}

/// [`quantize`] in AVX-512: per block, `amax` by a max over the two
/// vectors (exact in any order), `x * inv` and the residual's
/// `(x - dx q) * inv2` as the scalar code forms them (no fused
/// multiply-add), and [`round_i8`]'s truncate-and-step with NaN to 0 and
/// the saturation at [-128, 127].
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[target_feature(enable = "avx512f,avx512bw")]
fn quantize_avx512(
    x: &[f32],
    q: &mut [i8],
    d: &mut [f32],
    sum: &mut [i32],
    sx: &mut [f32],
    mut res: Option<(&mut [i8], &mut [i32])>,
) {
    use std::arch::x86_64::*;
    /// 16 values' int8 quants as i32 lanes.
    #[target_feature(enable = "avx512f")]
    fn round16(v: __m512) -> __m512i {
        let t = _mm512_cvttps_epi32(v);
        let frac = _mm512_sub_ps(v, _mm512_cvtepi32_ps(t));
        let up = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(frac, _mm512_set1_ps(0.5));
        let down = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(frac, _mm512_set1_ps(-0.5));
        let one = _mm512_set1_epi32(1);
        let t = _mm512_mask_add_epi32(t, up, t, one);
        let t = _mm512_mask_sub_epi32(t, down, t, one);
        let t = _mm512_max_epi32(
            _mm512_min_epi32(t, _mm512_set1_epi32(127)),
            _mm512_set1_epi32(-128),
        );
        // `as i32` of NaN is 0 (cvtt gives i32::MIN).
        _mm512_maskz_mov_epi32(_mm512_cmp_ps_mask::<_CMP_ORD_Q>(v, v), t)
    }
    let blocks = blocks_checked(x, q, d, sum, sx, &res);
    let abs_mask = _mm512_set1_epi32(0x7fff_ffff);
    for i in 0..blocks {
        // SAFETY: block i's 32 values lie in `x`, `q` and the residual's
        // quants (asserted above); the stores write 16 bytes each.
        unsafe {
            let xp = x.as_ptr().add(i * QK);
            let (x0, x1) = (_mm512_loadu_ps(xp), _mm512_loadu_ps(xp.add(16)));
            let a0 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x0), abs_mask));
            let a1 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x1), abs_mask));
            // The scalar fold starts at 0 and skips NaN (f32::max); so
            // does max_ps with the running value second.
            let amax = _mm512_reduce_max_ps(_mm512_max_ps(
                _mm512_max_ps(a0, _mm512_setzero_ps()),
                _mm512_max_ps(a1, _mm512_setzero_ps()),
            ));
            let dx = amax / 127.0;
            let inv = if dx > 0.0 { 1.0 / dx } else { 0.0 };
            let vinv = _mm512_set1_ps(inv);
            let (t0, t1) = (
                round16(_mm512_mul_ps(x0, vinv)),
                round16(_mm512_mul_ps(x1, vinv)),
            );
            let qp = q.as_mut_ptr().add(i * QK);
            _mm_storeu_si128(qp.cast(), _mm512_cvtepi32_epi8(t0));
            _mm_storeu_si128(qp.add(16).cast(), _mm512_cvtepi32_epi8(t1));
            let s = _mm512_reduce_add_epi32(_mm512_add_epi32(t0, t1));
            d[i] = dx;
            sum[i] = s;
            sx[i] = dx * s as f32;
            if let Some((q2, sum2)) = &mut res {
                let inv2 = _mm512_set1_ps(inv / RESIDUAL_STEP);
                let vdx = _mm512_set1_ps(dx);
                let r = |xv: __m512, t: __m512i| {
                    round16(_mm512_mul_ps(
                        _mm512_sub_ps(xv, _mm512_mul_ps(vdx, _mm512_cvtepi32_ps(t))),
                        inv2,
                    ))
                };
                let (u0, u1) = (r(x0, t0), r(x1, t1));
                let rp = q2.as_mut_ptr().add(i * QK);
                _mm_storeu_si128(rp.cast(), _mm512_cvtepi32_epi8(u0));
                _mm_storeu_si128(rp.add(16).cast(), _mm512_cvtepi32_epi8(u1));
                let s2 = _mm512_reduce_add_epi32(_mm512_add_epi32(u0, u1));
                sum2[i] = s2;
                sx[i] += dx * RESIDUAL_STEP * s2 as f32;
            }
        }
    }
}

/// [`quantize`] a value at a time.
fn quantize_scalar(
    x: &[f32],
    q: &mut [i8],
    d: &mut [f32],
    sum: &mut [i32],
    sx: &mut [f32],
    mut res: Option<(&mut [i8], &mut [i32])>,
) {
    for (i, (xb, qb)) in x.chunks_exact(QK).zip(q.chunks_exact_mut(QK)).enumerate() {
        let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
        let dx = amax / 127.0;
        let inv = if dx > 0.0 { 1.0 / dx } else { 0.0 };
        let mut s = 0i32;
        for (qv, &xv) in qb.iter_mut().zip(xb) {
            *qv = round_i8(xv * inv);
            s += i32::from(*qv);
        }
        d[i] = dx;
        sum[i] = s;
        sx[i] = dx * s as f32;
        if let Some((q2, sum2)) = &mut res {
            let inv2 = inv / RESIDUAL_STEP;
            let mut s2 = 0i32;
            for ((r, &xv), &qv) in q2[i * QK..][..QK].iter_mut().zip(xb).zip(&*qb) {
                *r = round_i8((xv - dx * f32::from(qv)) * inv2);
                s2 += i32::from(*r);
            }
            sum2[i] = s2;
            sx[i] += dx * RESIDUAL_STEP * s2 as f32;
        }
    }
}

/// Activations in f32, with each block's sum (for Q4_1's mins).
pub(super) struct F32Rows<'a> {
    k: usize,
    x: &'a [f32],
    sum: Vec<f32>,
}

impl<'a> F32Rows<'a> {
    pub(super) fn new(x: &'a [f32], m: usize, k: usize) -> Self {
        let sum = x[..m * k]
            .chunks_exact(QK)
            .map(|b| b.iter().fold(0f32, |a, &v| a + v))
            .collect();
        Self { k, x, sum }
    }

    #[inline]
    pub(super) fn block(&self, r: usize, b: usize) -> (&[f32], f32) {
        (
            &self.x[r * self.k + b * QK..][..QK],
            self.sum[r * (self.k / QK) + b],
        )
    }
}

#[cfg(test)]
mod tests {
    /// Rows quantized in parts over the workers equal the rows quantized
    /// on the calling thread alone.
    #[test]
    fn split_over_workers_changes_nothing() {
        let (m, k) = (5, 96);
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 37.0)
            .collect();
        let workers = crate::workers::Workers::new(2).expect("workers");
        for residual in [false, true] {
            let a = super::QuantizedRows::new(&x, m, k, residual, 128, true, None);
            let b = super::QuantizedRows::new(&x, m, k, residual, 128, true, Some(&workers));
            assert_eq!(a.q, b.q);
            assert_eq!(a.sx, b.sx);
            assert_eq!(a.residual, b.residual);
            assert_eq!(a.corr, b.corr);
            assert_eq!(a.corr_lo, b.corr_lo);
            assert_eq!(a.scale, b.scale);
            assert!(a.q.iter().any(|&v| v != 0));
        }
    }

    /// The vector quantizer gives the scalar one's quants, scales and sums
    /// to the bit: random blocks, all-zero and constant blocks, blocks
    /// with values at exact halves of the step, and a NaN.
    #[test]
    fn vector_and_scalar_quantizers_agree_exactly() {
        let k = 32 * 64;
        let mut seed = 0x1234_5678_9abc_def1u64;
        let mut x: Vec<f32> = (0..k)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0
            })
            .collect();
        x[32..64].fill(0.0);
        x[64..96].fill(-1.25);
        for (j, v) in x[96..128].iter_mut().enumerate() {
            *v = (j as f32 - 16.0) * 0.5;
        }
        x[130] = f32::NAN;
        for residual in [false, true] {
            let blocks = k / super::QK;
            let run = |vector: bool| {
                let mut q = vec![0i8; k];
                let (mut d, mut sum, mut sx) =
                    (vec![0f32; blocks], vec![0i32; blocks], vec![0f32; blocks]);
                let mut r = residual.then(|| (vec![0i8; k], vec![0i32; blocks]));
                let rr = r.as_mut().map(|(a, b)| (&mut a[..], &mut b[..]));
                if vector {
                    super::quantize(&x, &mut q, &mut d, &mut sum, &mut sx, rr);
                } else {
                    super::quantize_scalar(&x, &mut q, &mut d, &mut sum, &mut sx, rr);
                }
                (
                    q,
                    d.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    sum,
                    sx.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    r,
                )
            };
            assert!(run(false) == run(true), "residual {residual}");
        }
    }

    /// The branch-free rounding equals `f32::round` (halves away from zero)
    /// wherever the quantizer uses it, halves and their neighbours included.
    #[test]
    fn rounding_matches_round() {
        let mut v = -130.0f32;
        while v <= 130.0 {
            for x in [
                v,
                v + 0.5,
                f32::from_bits((v + 0.5).to_bits() + 1),
                f32::from_bits((v + 0.5).to_bits().wrapping_sub(1)),
            ] {
                if x.abs() <= 140.0 {
                    assert_eq!(super::round_i8(x), x.round() as i8, "{x}");
                }
            }
            v += 0.25;
        }
        for x in [
            0.49999997f32,
            -0.49999997,
            0.5,
            -0.5,
            126.5,
            -126.5,
            0.0,
            -0.0,
        ] {
            assert_eq!(super::round_i8(x), x.round() as i8, "{x}");
        }
    }
}
