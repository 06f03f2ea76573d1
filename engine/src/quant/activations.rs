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
/// is the block's sum as the quants give it (for Q4_1's mins).
pub(super) struct QuantizedRows {
    blocks: usize,
    q: Vec<i8>,
    d: Vec<f32>,
    sum: Vec<i32>,
    sx: Vec<f32>,
    residual: Option<(Vec<i8>, Vec<i32>)>,
}

/// One block of [`QuantizedRows`].
pub(super) struct QuantBlock<'a> {
    pub(super) q: &'a [i8],
    pub(super) dx: f32,
    pub(super) sum: i32,
    pub(super) sx: f32,
    /// The residual's quants and their sum.
    pub(super) residual: Option<(&'a [i8], i32)>,
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
    /// [-65, 65].
    pub(super) fn new(x: &[f32], m: usize, k: usize, residual: bool) -> Self {
        let blocks = k / QK;
        let mut q = vec![0i8; m * k];
        let mut d = vec![0f32; m * blocks];
        let mut sum = vec![0i32; m * blocks];
        let mut sx = vec![0f32; m * blocks];
        let mut res = residual.then(|| (vec![0i8; m * k], vec![0i32; m * blocks]));
        for (i, (xb, qb)) in x[..m * k]
            .chunks_exact(QK)
            .zip(q.chunks_exact_mut(QK))
            .enumerate()
        {
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
        Self {
            blocks,
            q,
            d,
            sum,
            sx,
            residual: res,
        }
    }

    #[inline]
    pub(super) fn block(&self, r: usize, b: usize) -> QuantBlock<'_> {
        let i = r * self.blocks + b;
        QuantBlock {
            q: &self.q[i * QK..][..QK],
            dx: self.d[i],
            sum: self.sum[i],
            sx: self.sx[i],
            residual: self
                .residual
                .as_ref()
                .map(|(q2, s2)| (&q2[i * QK..][..QK], s2[i])),
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
