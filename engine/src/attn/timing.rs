//! Timing of the decode attention alone, for `attntime` (not a test).

use super::{DecodeSeq, EngineError, Heads, Pages, decode_into};

/// Times the decode attention alone (no model): `seqs` sequences of
/// `context` cached positions each, in blocks of 16 slots dealt out
/// across the pool in an interleaved order (as a paged cache's blocks
/// lie after a while of serving), over `layers` separate pools (so that
/// the keys and values stream from memory, as a step's do), on `threads`
/// workers. Mean milliseconds per layer, after one warm-up pass. For
/// profiling the kernel (`engine/examples/attntime.rs`), not a test.
pub fn time_decode(
    (heads, kv_heads, head_dim): (usize, usize, usize),
    seqs: usize,
    context: usize,
    layers: usize,
    threads: usize,
    iters: usize,
    f16: bool,
) -> Result<f64, EngineError> {
    const BLOCK: usize = 16;
    if heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) || seqs == 0 || context == 0 {
        return Err(EngineError::Step("bad attention shape".into()));
    }
    let per_seq = context.div_ceil(BLOCK);
    let blocks = seqs * per_seq;
    // Block b of sequence s is pool block (b * seqs + s): the sequences'
    // blocks interleaved.
    let slots: Vec<Vec<i64>> = (0..seqs)
        .map(|s| {
            (0..context)
                .map(|p| (((p / BLOCK) * seqs + s) * BLOCK + p % BLOCK) as i64)
                .collect()
        })
        .collect();
    let row = kv_heads * head_dim;
    let n = blocks * BLOCK * row;
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        seed ^= seed >> 12;
        seed ^= seed << 25;
        seed ^= seed >> 27;
        ((seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    };
    // On huge pages, as the engine's pool (crate::pages).
    fn filled<T: crate::pages::Zeroable>(n: usize, mut f: impl FnMut() -> T) -> Pages<T> {
        let mut p = Pages::<T>::zeroed(n);
        for x in p.iter_mut() {
            *x = f();
        }
        p
    }
    let pools: Vec<(Pages<f32>, Pages<f32>)> = (0..layers.max(1))
        .map(|_| (filled(n, &mut next), filled(n, &mut next)))
        .collect();
    let halves: Vec<(Pages<half::f16>, Pages<half::f16>)> = if f16 {
        pools
            .iter()
            .map(|(k, v)| {
                let mut it = k.iter();
                let kh = filled(n, || half::f16::from_f32(*it.next().unwrap_or(&0.0)));
                let mut it = v.iter();
                let vh = filled(n, || half::f16::from_f32(*it.next().unwrap_or(&0.0)));
                (kh, vh)
            })
            .collect()
    } else {
        Vec::new()
    };
    let q: Vec<f32> = (0..seqs * heads * head_dim).map(|_| next()).collect();
    let ds: Vec<DecodeSeq<'_>> = slots
        .iter()
        .enumerate()
        .map(|(row, slots)| DecodeSeq { row, slots })
        .collect();
    let h = Heads {
        heads,
        kv_heads,
        head_dim,
        scale: 1.0 / (head_dim as f32).sqrt(),
        softcap: None,
    };
    let workers = crate::workers::Workers::new(threads)?;
    let mut out = vec![0f32; seqs * heads * head_dim];
    let pass = |out: &mut [f32]| {
        for l in 0..pools.len() {
            if f16 {
                let (k, v) = &halves[l];
                decode_into(&q, k, v, &ds, h, Some(&workers), out);
            } else {
                let (k, v) = &pools[l];
                decode_into(&q, k, v, &ds, h, Some(&workers), out);
            }
        }
    };
    pass(&mut out);
    let t = std::time::Instant::now();
    for _ in 0..iters.max(1) {
        pass(&mut out);
    }
    Ok(t.elapsed().as_secs_f64() * 1e3 / (iters.max(1) * pools.len()) as f64)
}
