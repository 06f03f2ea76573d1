//! Greedy decoding's pick: the index of the largest logit, once per
//! sequence per step over the whole vocabulary (262,144 logits on Gemma 3),
//! on the step's critical path. Running maxima in interleaved lanes with
//! their first indices, so the pass vectorises (AVX-512 where the CPU has
//! it, else 16 lanes the compiler vectorises, for AVX2 where the CPU has
//! it); the lanes, then the tail, are reduced alike on every path.

/// Index of the largest value; the first one on ties (as torch.argmax).
/// NaNs never win (but a NaN first value, which nothing compares above,
/// stays the answer, as in a plain scan).
pub fn argmax(logits: &[f32]) -> u32 {
    // Indices fit u32: vocabularies are far below 2^32 (the result is one).
    debug_assert!(logits.len() <= u32::MAX as usize);
    match logits.first() {
        None => return 0,
        Some(x) if x.is_nan() => return 0,
        Some(_) => {}
    }
    match crate::simd::simd() {
        #[cfg(target_arch = "x86_64")]
        #[allow(unsafe_code)]
        // SAFETY: the CPU has AVX-512F (checked at run time).
        crate::simd::Simd::Avx512 => unsafe { lanes_avx512(logits) },
        #[cfg(target_arch = "x86_64")]
        #[allow(unsafe_code)]
        // SAFETY: the CPU has AVX2 (checked at run time).
        crate::simd::Simd::Avx2 => unsafe { lanes_avx2(logits) },
        _ => lanes::<16>(logits),
    }
}

/// [`lanes`] compiled for AVX2 (two 8-lane vectors of maxima).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn lanes_avx2(logits: &[f32]) -> u32 {
    lanes::<16>(logits)
}

/// The best of lanes' (maximum, first index) pairs and then of the values
/// from `start` on (the tail no lane took): the largest value, the lowest
/// index among equals; 0 when nothing is above -inf (all -inf or NaN), as
/// a scan that starts from the first value.
fn reduce(lanes: impl Iterator<Item = (f32, u32)>, logits: &[f32], start: usize) -> u32 {
    let (mut best, mut best_at) = (f32::NEG_INFINITY, u32::MAX);
    for (m, i) in lanes {
        if m > best || (m == best && i < best_at) {
            (best, best_at) = (m, i);
        }
    }
    for (j, &x) in logits[start..].iter().enumerate() {
        if x > best {
            (best, best_at) = (x, (start + j) as u32);
        }
    }
    if best_at == u32::MAX { 0 } else { best_at }
}

/// `L` running maxima over the whole chunks of `L` values.
#[inline(always)]
fn lanes<const L: usize>(logits: &[f32]) -> u32 {
    let mut max = [f32::NEG_INFINITY; L];
    let mut at = [u32::MAX; L];
    let mut idx: [u32; L] = std::array::from_fn(|j| j as u32);
    let chunks = logits.chunks_exact(L);
    let start = logits.len() - chunks.remainder().len();
    for chunk in chunks {
        let chunk: &[f32; L] = chunk.try_into().unwrap_or(&[f32::NAN; L]);
        for j in 0..L {
            // Strictly above: each lane keeps its first maximum.
            let better = chunk[j] > max[j];
            max[j] = if better { chunk[j] } else { max[j] };
            at[j] = if better { idx[j] } else { at[j] };
            idx[j] += L as u32;
        }
    }
    reduce(max.into_iter().zip(at), logits, start)
}

/// [`lanes`] in AVX-512: four vectors of running maxima (64 lanes, four
/// independent compare-and-blend chains) with their first indices.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn lanes_avx512(logits: &[f32]) -> u32 {
    use std::arch::x86_64::*;
    const V: usize = 4;
    let full = logits.len() / (16 * V) * (16 * V);
    let mut max = [_mm512_set1_ps(f32::NEG_INFINITY); V];
    let mut at = [_mm512_set1_epi32(-1); V];
    let mut idx: [__m512i; V] = std::array::from_fn(|v| {
        let b = (16 * v) as i32;
        _mm512_add_epi32(
            _mm512_set1_epi32(b),
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        )
    });
    let step = _mm512_set1_epi32((16 * V) as i32);
    let p = logits.as_ptr();
    let mut c = 0;
    while c < full {
        for v in 0..V {
            // SAFETY: c + 16 v + 16 <= full <= logits.len().
            #[allow(unsafe_code)]
            let x = unsafe { _mm512_loadu_ps(p.add(c + 16 * v)) };
            // Strictly above (ordered: a NaN is never above): each lane
            // keeps its first maximum.
            let m = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, max[v]);
            max[v] = _mm512_mask_mov_ps(max[v], m, x);
            at[v] = _mm512_mask_mov_epi32(at[v], m, idx[v]);
            idx[v] = _mm512_add_epi32(idx[v], step);
        }
        c += 16 * V;
    }
    let (mut m, mut i) = ([0f32; 16 * V], [0u32; 16 * V]);
    for v in 0..V {
        // SAFETY: 16 floats and 16 u32 stored at 16 v < 16 V.
        #[allow(unsafe_code)]
        unsafe {
            _mm512_storeu_ps(m.as_mut_ptr().add(16 * v), max[v]);
            _mm512_storeu_si512(i.as_mut_ptr().add(16 * v).cast(), at[v]);
        }
    }
    reduce(m.into_iter().zip(i), logits, full)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first maximum as a plain scan finds it.
    fn scan(logits: &[f32]) -> u32 {
        let mut best = 0;
        for (i, &l) in logits.iter().enumerate() {
            if l > logits[best] {
                best = i;
            }
        }
        best as u32
    }

    /// The vectorised argmax agrees with a plain scan: ties across and
    /// within lanes, the tail, NaNs and infinities anywhere, every length
    /// around the lane counts.
    #[test]
    fn argmax_agrees_with_a_scan() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for len in (0..70).chain([127, 128, 130, 191, 1000, 4099]) {
            for _ in 0..40 {
                let v: Vec<f32> = (0..len)
                    .map(|_| match next() % 16 {
                        0 => f32::NAN,
                        1 => f32::NEG_INFINITY,
                        2 if len > 40 => f32::INFINITY,
                        // Few distinct values: many ties.
                        r => (r % 5) as f32 - 2.0,
                    })
                    .collect();
                assert_eq!(argmax(&v), scan(&v), "{v:?}");
                if v.first().is_some_and(|x| !x.is_nan()) {
                    assert_eq!(lanes::<16>(&v), scan(&v), "{v:?}");
                }
            }
        }
        let all_neg_inf = [f32::NEG_INFINITY; 40];
        assert_eq!(argmax(&all_neg_inf), 0);
        let mut nan_first = [1.0f32; 33];
        nan_first[0] = f32::NAN;
        assert_eq!(argmax(&nan_first), 0);
    }
}
