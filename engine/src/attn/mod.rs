//! Decode attention on the CPU, written out in Rust.
//!
//! A decoding sequence has one query token that attends to every key and
//! value it has cached. Done with libtorch ops, that is an `index_select` of
//! its slots for keys and values and one `scaled_dot_product_attention` per
//! sequence per layer: a dozen small op dispatches that cost far more than
//! the arithmetic (64-wide dot products). This kernel reads the paged pool in
//! place instead: for each sequence and KV head it scores the cached keys for
//! all query heads of the group, takes the softmax in float32, and sums the
//! values. Each sequence's result depends only on its own query and cache,
//! never on what it is batched with.

use std::ops::Range;

use tch::{Device, Kind, Tensor};

use crate::EngineError;
use crate::pages::Pages;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

/// Keys ahead of the one being read whose rows the SIMD kernels
/// prefetch: a sequence's rows of one head lie a pool row apart (every KV
/// head's), a stride the hardware prefetcher followed too slowly.
#[cfg(target_arch = "x86_64")]
const AHEAD: usize = 24;

/// Whether [`prefetch_row`] fetches into L1 instead of L2.
static PREFETCH_L1: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Sets, for the whole process, whether decode attention prefetches the
/// keys and values ahead into L1 (`prefetcht0`, as before) instead of L2
/// (the default): for comparisons (`steptime`'s `ATTN_PF_AB`). The
/// results are the same either way.
pub fn set_attn_prefetch_l1(on: bool) {
    PREFETCH_L1.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// Prefetches the `len` elements of `data` from `at` (a hint: nothing is
/// read when they lie outside it) into L2 (`prefetcht1`). Into L1, each
/// line held one of the core's few L1 miss buffers until it came, which
/// bounded the misses in flight: with SmolLM2's heads on a 2-core Zen 4
/// (`attntime`, the two alternated in one process), 16 sequences of 96
/// and 288 positions read their keys and values 1.5x as fast into L2,
/// one of 1,024 positions 2x, with the AVX-512 and the AVX2 kernel
/// alike, from 16 to 40 keys ahead; into L1, 8 to 32 keys ahead measured
/// the same.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_row<T>(data: &[T], at: usize, len: usize) {
    use std::arch::x86_64::{_MM_HINT_T0, _MM_HINT_T1, _mm_prefetch};
    if at + len <= data.len() {
        let l1 = PREFETCH_L1.load(std::sync::atomic::Ordering::Relaxed);
        let p = data[at..].as_ptr().cast::<i8>();
        for line in (0..len * size_of::<T>()).step_by(64) {
            #[allow(unsafe_code)]
            // SAFETY: a prefetch of memory inside `data` (checked above).
            unsafe {
                if l1 {
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(line))
                } else {
                    _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(line))
                }
            };
        }
    }
}

/// One decoding sequence: its query row in the packed batch and the pool
/// slots of all its positions (the new token's slot last).
pub(crate) struct DecodeSeq<'a> {
    pub row: usize,
    pub slots: &'a [i64],
}

/// Shapes of the attention, and how its logits are formed: `q . k * scale`,
/// then, with a soft cap c, `c * tanh(x / c)` (Gemma 2).
#[derive(Clone, Copy)]
pub(crate) struct Heads {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub scale: f32,
    pub softcap: Option<f32>,
}

/// An element of the CPU KV pool: float32, or float16 (`--kv-cache-dtype
/// f16`: half the bytes a decode step reads, as llama.cpp's default cache).
/// The kernels widen each key and value to float32 and compute in float32.
pub(crate) trait KvElem: Copy + Send + Sync + 'static {
    /// The pool tensors' kind.
    const KIND: Kind;
    /// `src` itself when it already is float32.
    fn as_f32(src: &[Self]) -> Option<&[f32]>;
    /// `src` widened to float32 into `dst` (of the same length).
    fn widen(src: &[Self], dst: &mut [f32]);
    /// Sixteen elements at `p` widened to float32.
    ///
    /// # Safety
    /// `p` addresses 16 readable elements; the CPU has AVX-512F.
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512;
    /// Eight elements at `p` widened to float32.
    ///
    /// # Safety
    /// `p` addresses 8 readable elements; the CPU has AVX and F16C.
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256;
}

impl KvElem for f32 {
    const KIND: Kind = Kind::Float;
    fn as_f32(src: &[f32]) -> Option<&[f32]> {
        Some(src)
    }
    fn widen(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    #[allow(unsafe_code)]
    unsafe fn load16(p: *const f32) -> std::arch::x86_64::__m512 {
        // SAFETY: the caller's contract.
        unsafe { std::arch::x86_64::_mm512_loadu_ps(p) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    #[allow(unsafe_code)]
    unsafe fn load8(p: *const f32) -> std::arch::x86_64::__m256 {
        // SAFETY: the caller's contract.
        unsafe { std::arch::x86_64::_mm256_loadu_ps(p) }
    }
}

impl KvElem for half::f16 {
    const KIND: Kind = Kind::Half;
    fn as_f32(_: &[half::f16]) -> Option<&[f32]> {
        None
    }
    fn widen(src: &[half::f16], dst: &mut [f32]) {
        use half::slice::HalfFloatSliceExt;
        src.convert_to_f32_slice(dst);
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    #[allow(unsafe_code)]
    unsafe fn load16(p: *const half::f16) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        // SAFETY: the caller's contract (16 halves are 32 bytes).
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    #[allow(unsafe_code)]
    unsafe fn load8(p: *const half::f16) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: the caller's contract (8 halves are 16 bytes).
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    }
}

/// Borrows a contiguous CPU tensor of `T`'s kind (a KV pool layer, any
/// float32 tensor) as a slice.
#[allow(unsafe_code)]
pub(crate) fn kv_view<T: KvElem>(t: &Tensor) -> Result<&[T], EngineError> {
    if t.kind() != T::KIND || t.device() != Device::Cpu || !t.is_contiguous() {
        return Err(EngineError::Step(format!(
            "expected a contiguous {:?} CPU tensor, got {:?} on {:?}",
            T::KIND,
            t.kind(),
            t.device()
        )));
    }
    let n = t.numel();
    if n == 0 {
        return Ok(&[]);
    }
    // SAFETY: the tensor is a contiguous CPU tensor of `n` elements of
    // `T`'s kind, so its data pointer addresses `n` initialised, aligned
    // `T` values. The slice borrows `t`, and the storage is only written
    // through `&mut KvPool` / fresh tensors, never while this borrow lives.
    Ok(unsafe { std::slice::from_raw_parts(t.data_ptr() as *const T, n) })
}

/// Borrows a contiguous float32 CPU tensor as a slice.
pub(crate) fn f32_view(t: &Tensor) -> Result<&[f32], EngineError> {
    kv_view::<f32>(t)
}

/// A new float32 CPU tensor of `shape`, zeroed, with `fill` run on its
/// memory: the kernels write their outputs in place instead of into a
/// vector that is then copied into a tensor.
#[allow(unsafe_code)]
pub(crate) fn f32_tensor(
    shape: &[i64],
    fill: impl FnOnce(&mut [f32]),
) -> Result<Tensor, EngineError> {
    let t = Tensor::f_zeros(shape, (Kind::Float, Device::Cpu))?;
    let n = t.numel();
    if n == 0 {
        fill(&mut []);
        return Ok(t);
    }
    // SAFETY: `t` is a fresh contiguous float32 CPU tensor of `n`
    // (initialised) elements that nothing else references until it is
    // returned, after `fill`'s borrow ends.
    fill(unsafe { std::slice::from_raw_parts_mut(t.data_ptr().cast::<f32>(), n) });
    Ok(t)
}

/// A new float32 CPU tensor of `shape`, not zeroed, whose every element
/// `fill` must write through the pointer it gets (before anything reads
/// the tensor): for the linear layers' kernels, which write each output
/// exactly once, so that a step's largest buffers are not cleared first.
#[allow(unsafe_code)]
pub(crate) fn f32_tensor_written(
    shape: &[i64],
    fill: impl FnOnce(*mut f32),
) -> Result<Tensor, EngineError> {
    let t = Tensor::f_empty(shape, (Kind::Float, Device::Cpu))?;
    if t.numel() > 0 {
        fill(t.data_ptr().cast::<f32>());
    }
    Ok(t)
}

/// Attention output [seqs.len(), heads, head_dim] (row-major) of each
/// sequence's query (`q`: [rows, heads, head_dim]) over keys and values
/// (`k`, `v`: [slots, kv_heads, head_dim]) at its slots, split over
/// `workers` (the linear layers' threads) when there is enough of it.
#[cfg(test)]
pub(crate) fn decode<T: KvElem>(
    q: &[f32],
    k: &[T],
    v: &[T],
    seqs: &[DecodeSeq<'_>],
    h: Heads,
    workers: Option<&crate::workers::Workers>,
) -> Vec<f32> {
    let mut out = vec![0f32; seqs.len() * h.heads * h.head_dim];
    decode_into(q, k, v, seqs, h, workers, &mut out);
    out
}

/// [`decode`] over a pool layer's key and value tensors (float32 or
/// float16: see [`KvElem`]) into a new [seqs.len(), heads, head_dim]
/// float32 tensor.
pub(crate) fn decode_pool(
    q: &[f32],
    k: &Tensor,
    v: &Tensor,
    seqs: &[DecodeSeq<'_>],
    h: Heads,
    workers: Option<&crate::workers::Workers>,
) -> Result<Tensor, EngineError> {
    let shape = [seqs.len() as i64, h.heads as i64, h.head_dim as i64];
    let mut done = Ok(());
    let out = f32_tensor(&shape, |out| {
        done = decode_pool_into(q, k, v, seqs, h, workers, out);
    })?;
    done.map(|()| out)
}

/// [`decode_pool`] into `out` (seqs.len() * heads * head_dim floats; the
/// row path's buffer).
pub(crate) fn decode_pool_into(
    q: &[f32],
    k: &Tensor,
    v: &Tensor,
    seqs: &[DecodeSeq<'_>],
    h: Heads,
    workers: Option<&crate::workers::Workers>,
    out: &mut [f32],
) -> Result<(), EngineError> {
    if k.kind() == Kind::Half {
        let (ks, vs) = (kv_view::<half::f16>(k)?, kv_view::<half::f16>(v)?);
        decode_into(q, ks, vs, seqs, h, workers, out);
    } else {
        let (ks, vs) = (kv_view::<f32>(k)?, kv_view::<f32>(v)?);
        decode_into(q, ks, vs, seqs, h, workers, out);
    }
    Ok(())
}

/// Keys a sequence's attention takes at a time, at most: a longer
/// sequence's keys are cut into about equal chunks of at most this many,
/// each chunk attended with its own softmax and the chunks' results
/// merged by their maxima and sums ([`merge_chunks`], as flash decoding
/// does), so that one long sequence's chunks go to several threads. The
/// cut depends on the sequence's length alone, never on the batch or the
/// threads, so its result is the same whatever it is batched with.
const CHUNK: usize = 256;

/// The chunks of `t` keys: `n` of them, chunk c being keys
/// `c * t / n .. (c + 1) * t / n`.
fn chunks(t: usize) -> usize {
    t.div_ceil(CHUNK).max(1)
}

/// Chunk `c` of `n` of a sequence's keys (see [`chunks`]).
fn chunk<'a>(s: &DecodeSeq<'a>, c: usize, n: usize) -> DecodeSeq<'a> {
    let t = s.slots.len();
    DecodeSeq {
        row: s.row,
        slots: &s.slots[c * t / n..(c + 1) * t / n],
    }
}

/// [`decode`] into `out` (seqs.len() * heads * head_dim floats).
pub(crate) fn decode_into<T: KvElem>(
    q: &[f32],
    k: &[T],
    v: &[T],
    seqs: &[DecodeSeq<'_>],
    h: Heads,
    workers: Option<&crate::workers::Workers>,
    out: &mut [f32],
) {
    let per_seq = h.heads * h.head_dim;
    assert_eq!(
        out.len(),
        seqs.len() * per_seq,
        "decode attention: output size"
    );
    let keys: usize = seqs.iter().map(|s| s.slots.len()).sum();
    let threads = workers.map_or(1, |w| w.threads());
    let long = seqs.iter().any(|s| chunks(s.slots.len()) > 1);
    if let Some(w) = workers
        && threads > 1
        && seqs.len() < 2 * threads
        && (h.kv_heads > 1 || long)
        && keys * h.kv_heads * h.head_dim >= 1 << 13
    {
        // Too few sequences to share out (a batch-1 decode): each one's
        // KV heads in runs, and its keys in chunks, a part per run and
        // chunk, so that the threads read the keys together (one thread
        // alone is bound by the latency of its misses, well short of the
        // memory bandwidth). A chunked sequence's parts go to a buffer of
        // its chunks' results, merged once all are done.
        let runs = (2 * threads).div_ceil(seqs.len()).min(h.kv_heads);
        let step = h.kv_heads.div_ceil(runs);
        let n: Vec<usize> = seqs.iter().map(|s| chunks(s.slots.len())).collect();
        // Sequence i's chunks' results from base[i] (per_seq floats a
        // chunk) and their statistics from base[i] / head_dim * 2.
        let mut base = vec![0usize; seqs.len()];
        let mut total = 0;
        for (b, &n) in base.iter_mut().zip(&n) {
            *b = total;
            if n > 1 {
                total += n * per_seq;
            }
        }
        let mut parts = vec![0f32; total];
        let mut stats = vec![0f32; total / h.head_dim * 2];
        let units: Vec<(usize, usize, usize)> = (0..seqs.len())
            .flat_map(|i| {
                let n = n[i];
                (0..h.kv_heads)
                    .step_by(step)
                    .flat_map(move |g| (0..n).map(move |c| (i, g, c)))
            })
            .collect();
        let group = h.heads / h.kv_heads;
        let group_len = group * h.head_dim;
        let out_ptr = OutPtr(out.as_mut_ptr());
        let parts_ptr = OutPtr(parts.as_mut_ptr());
        let stats_ptr = OutPtr(stats.as_mut_ptr());
        let (out_ptr, parts_ptr, stats_ptr) = (&out_ptr, &parts_ptr, &stats_ptr);
        w.run(units.len(), |u| {
            let (i, g0, c) = units[u];
            let g1 = (g0 + step).min(h.kv_heads);
            let rows = (g1 - g0) * group;
            let mut own = Vec::new();
            #[allow(unsafe_code)]
            // SAFETY: `out` holds seqs.len() * per_seq floats, `parts`
            // n[i] * per_seq from base[i] for each chunked sequence i and
            // `stats` a 2 / head_dim share of that, all outliving `run`;
            // the query heads of KV heads g0..g1 of sequence i (of its
            // chunk c) are written by this unit alone.
            let (o, st) = unsafe {
                if n[i] == 1 {
                    own.resize(2 * rows, 0.0);
                    (
                        std::slice::from_raw_parts_mut(
                            out_ptr.0.add(i * per_seq + g0 * group_len),
                            rows * h.head_dim,
                        ),
                        &mut own[..],
                    )
                } else {
                    let at = base[i] + c * per_seq + g0 * group_len;
                    (
                        std::slice::from_raw_parts_mut(parts_ptr.0.add(at), rows * h.head_dim),
                        std::slice::from_raw_parts_mut(
                            stats_ptr.0.add(at / h.head_dim * 2),
                            2 * rows,
                        ),
                    )
                }
            };
            one_seq(q, k, v, &chunk(&seqs[i], c, n[i]), h, g0..g1, o, st);
        });
        for (i, &n) in n.iter().enumerate() {
            if n > 1 {
                let len = n * per_seq;
                merge_chunks(
                    &parts[base[i]..][..len],
                    &stats[base[i] / h.head_dim * 2..][..len / h.head_dim * 2],
                    h.head_dim,
                    &mut out[i * per_seq..][..per_seq],
                );
            }
        }
        return;
    }
    // Split the sequences across threads by the number of keys they read,
    // but only when there is enough work to pay for the hand-off.
    let parts_wanted = if keys * h.kv_heads * h.head_dim < (1 << 16) {
        1
    } else {
        (2 * threads).clamp(1, seqs.len().max(1))
    };
    let workers = match workers {
        Some(w) if parts_wanted > 1 => w,
        _ => {
            for (s, o) in seqs.iter().zip(out.chunks_exact_mut(per_seq)) {
                whole_seq(q, k, v, s, h, o);
            }
            return;
        }
    };
    // Contiguous runs of sequences with about equal numbers of keys: part
    // i is sequences bounds[i]..bounds[i + 1].
    let target = keys.div_ceil(parts_wanted);
    let mut bounds = vec![0usize];
    let mut acc = 0;
    for (i, s) in seqs.iter().enumerate() {
        acc += s.slots.len();
        if acc >= target && i + 1 < seqs.len() {
            bounds.push(i + 1);
            acc = 0;
        }
    }
    bounds.push(seqs.len());
    let out_ptr = OutPtr(out.as_mut_ptr());
    let out_ptr = &out_ptr;
    workers.run(bounds.len() - 1, |part| {
        let (lo, hi) = (bounds[part], bounds[part + 1]);
        for (i, s) in seqs.iter().enumerate().take(hi).skip(lo) {
            #[allow(unsafe_code)]
            // SAFETY: `out` holds seqs.len() * per_seq floats and outlives
            // `run`; each sequence's range is written by the one part that
            // holds it.
            let o = unsafe { std::slice::from_raw_parts_mut(out_ptr.0.add(i * per_seq), per_seq) };
            whole_seq(q, k, v, s, h, o);
        }
    });
}

/// One sequence's attention, all its heads (`out`: heads * head_dim
/// floats), on the calling thread: its chunks of keys (see [`CHUNK`]) one
/// after another, then merged.
fn whole_seq<T: KvElem>(q: &[f32], k: &[T], v: &[T], s: &DecodeSeq<'_>, h: Heads, out: &mut [f32]) {
    let n = chunks(s.slots.len());
    let per_seq = h.heads * h.head_dim;
    let mut stats = vec![0f32; n * 2 * h.heads];
    if n == 1 {
        one_seq(q, k, v, s, h, 0..h.kv_heads, out, &mut stats);
        return;
    }
    let mut parts = vec![0f32; n * per_seq];
    for (c, (o, st)) in parts
        .chunks_exact_mut(per_seq)
        .zip(stats.chunks_exact_mut(2 * h.heads))
        .enumerate()
    {
        one_seq(q, k, v, &chunk(s, c, n), h, 0..h.kv_heads, o, st);
    }
    merge_chunks(&parts, &stats, h.head_dim, out);
}

/// A sequence's attention from its chunks' ([`CHUNK`]): `parts` holds each
/// chunk's result for every head (`out.len()` floats a chunk, each head's
/// softmax over that chunk's keys alone), `stats` each chunk's maximum and
/// sum for every head (see [`softmax_rows`]). Each head's result is the
/// chunks' results weighted by their share of the whole softmax's sum,
/// `e^(max_c - max) sum_c`, added in chunk order.
fn merge_chunks(parts: &[f32], stats: &[f32], head_dim: usize, out: &mut [f32]) {
    let len = out.len();
    let rows = len / head_dim;
    let n = parts.len() / len;
    for (r, o) in out.chunks_exact_mut(head_dim).enumerate() {
        let st = |c: usize| (stats[c * 2 * rows + 2 * r], stats[c * 2 * rows + 2 * r + 1]);
        let max = (0..n).map(|c| st(c).0).fold(f32::NEG_INFINITY, f32::max);
        let weights: Vec<f32> = (0..n)
            .map(|c| {
                let (m, sum) = st(c);
                exp(m - max) * sum
            })
            .collect();
        let inv = 1.0 / weights.iter().sum::<f32>();
        o.fill(0.0);
        for (c, w) in weights.iter().enumerate() {
            let w = w * inv;
            for (o, p) in o
                .iter_mut()
                .zip(&parts[c * len + r * head_dim..][..head_dim])
            {
                *o += w * p;
            }
        }
    }
}

/// The output buffer, shared by the parts that write disjoint ranges of it.
struct OutPtr(*mut f32);
// SAFETY: only used to write disjoint ranges of a buffer that outlives the
// parts sharing it.
#[allow(unsafe_code)]
unsafe impl Sync for OutPtr {}

/// One sequence's attention for the query heads of KV heads `gs` (`out`:
/// theirs alone), compiled for AVX2 + FMA when the CPU has them (the choice
/// is per machine, and each head is computed alike whatever the range, so
/// results never depend on the batch).
#[allow(clippy::too_many_arguments)]
fn one_seq<T: KvElem>(
    q: &[f32],
    k: &[T],
    v: &[T],
    s: &DecodeSeq<'_>,
    h: Heads,
    gs: Range<usize>,
    out: &mut [f32],
    stats: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if *HAS_AVX512 && !ATTN_AVX2.load(std::sync::atomic::Ordering::Relaxed) {
        #[allow(unsafe_code)]
        // SAFETY: the CPU supports AVX-512F (checked at run time).
        if unsafe { avx512::one_seq(q, k, v, s, h, gs.clone(), out, stats) } {
            return;
        }
    }
    one_seq_portable(q, k, v, s, h, gs, out, stats);
}

/// [`one_seq`] without the AVX-512 kernel: any head dim.
#[allow(clippy::too_many_arguments)]
fn one_seq_portable<T: KvElem>(
    q: &[f32],
    k: &[T],
    v: &[T],
    s: &DecodeSeq<'_>,
    h: Heads,
    gs: Range<usize>,
    out: &mut [f32],
    stats: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if *HAS_AVX2_FMA {
        #[allow(unsafe_code)]
        // SAFETY: the CPU supports AVX2, FMA and F16C (checked at run
        // time).
        unsafe {
            if avx2::one_seq(q, k, v, s, h, gs.clone(), out, stats) {
                return;
            }
            one_seq_avx2(q, k, v, s, h, gs, out, stats)
        };
        return;
    }
    one_seq_body(q, k, v, s, h, gs, out, stats);
}

/// Whether decode attention runs its AVX2 kernel on an AVX-512 CPU.
static ATTN_AVX2: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Sets, for the whole process, whether decode attention runs its AVX2
/// kernel on a CPU with AVX-512 (every AVX-512 CPU has AVX2, FMA and
/// F16C): for comparisons (`attntime`'s `ATTN_AB`). The results agree to float32 rounding, not to the bit
/// (the sums are added in another order).
pub fn set_attn_avx2(on: bool) {
    ATTN_AVX2.store(on, std::sync::atomic::Ordering::Relaxed);
}

#[cfg(target_arch = "x86_64")]
static HAS_AVX512: std::sync::LazyLock<bool> =
    std::sync::LazyLock::new(|| std::arch::is_x86_feature_detected!("avx512f"));

#[cfg(target_arch = "x86_64")]
static HAS_AVX2_FMA: std::sync::LazyLock<bool> = std::sync::LazyLock::new(|| {
    std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
});

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
fn one_seq_avx2<T: KvElem>(
    q: &[f32],
    k: &[T],
    v: &[T],
    s: &DecodeSeq<'_>,
    h: Heads,
    gs: Range<usize>,
    out: &mut [f32],
    stats: &mut [f32],
) {
    one_seq_body(q, k, v, s, h, gs, out, stats);
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn one_seq_body<T: KvElem>(
    q: &[f32],
    k: &[T],
    v: &[T],
    s: &DecodeSeq<'_>,
    h: Heads,
    gs: Range<usize>,
    out: &mut [f32],
    stats: &mut [f32],
) {
    let hd = h.head_dim;
    let group = h.heads / h.kv_heads;
    let scale = h.scale;
    let t = s.slots.len();
    let mut scores = vec![0f32; group * t];
    let mut wide = vec![0f32; hd];
    let qrow = &q[s.row * h.heads * hd..][..h.heads * hd];
    for g in gs.clone() {
        let qg = &qrow[g * group * hd..][..group * hd];
        for (j, &slot) in s.slots.iter().enumerate() {
            let key = as_f32(&k[(slot as usize * h.kv_heads + g) * hd..][..hd], &mut wide);
            for (i, qh) in qg.chunks_exact(hd).enumerate() {
                scores[i * t + j] = dot(qh, key) * scale;
            }
        }
        softmax_rows(
            &mut scores,
            t,
            h.softcap,
            &mut stats[(g - gs.start) * group * 2..][..group * 2],
        );
        let og = &mut out[(g - gs.start) * group * hd..][..group * hd];
        og.fill(0.0);
        for (j, &slot) in s.slots.iter().enumerate() {
            let val = as_f32(&v[(slot as usize * h.kv_heads + g) * hd..][..hd], &mut wide);
            for (i, oh) in og.chunks_exact_mut(hd).enumerate() {
                axpy(oh, scores[i * t + j], val);
            }
        }
    }
}

/// `row` as float32: itself, or widened into `wide` (of its length).
#[inline(always)]
fn as_f32<'a, T: KvElem>(row: &'a [T], wide: &'a mut [f32]) -> &'a [f32] {
    match T::as_f32(row) {
        Some(row) => row,
        None => {
            T::widen(row, wide);
            wide
        }
    }
}

/// Each row (`t` scores) of `scores` soft-capped (when `softcap`) and
/// turned into its softmax, in place; `stats` gets each row's largest
/// (capped) score and its sum of exponentials after that is subtracted
/// (two floats a row), for merging chunks of a sequence's keys
/// ([`merge_chunks`]). The maximum and the sum are taken over 16 lanes
/// (vectorised; one chain of scalar adds was a third of the softmax's
/// time), the lanes then combined in a fixed order. Inlined, so it is
/// compiled with the caller's target features.
#[inline(always)]
fn softmax_rows(scores: &mut [f32], t: usize, softcap: Option<f32>, stats: &mut [f32]) {
    if let Some(cap) = softcap {
        for x in scores.iter_mut() {
            *x = (*x / cap).tanh() * cap;
        }
    }
    for (row, st) in scores.chunks_exact_mut(t).zip(stats.chunks_exact_mut(2)) {
        let mut m = [f32::NEG_INFINITY; 16];
        let lanes = row.chunks_exact(16);
        for x in lanes.remainder() {
            m[0] = if *x > m[0] { *x } else { m[0] };
        }
        for c in lanes {
            for (m, &x) in m.iter_mut().zip(c) {
                *m = if x > *m { x } else { *m };
            }
        }
        let max = m.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        for x in row.iter_mut() {
            *x = exp(*x - max);
        }
        let mut a = [0f32; 16];
        let lanes = row.chunks_exact(16);
        for x in lanes.remainder() {
            a[0] += *x;
        }
        for c in lanes {
            for (a, &x) in a.iter_mut().zip(c) {
                *a += x;
            }
        }
        let sum = a.iter().sum::<f32>();
        let inv = 1.0 / sum;
        for x in row.iter_mut() {
            *x *= inv;
        }
        st[0] = max;
        st[1] = sum;
    }
}

/// 2^n for a whole n in -126..=127, through the exponent bits: adding
/// 1.5 x 2^23 + 127 to n leaves n + 127 in the float's low bits. (`n as
/// i32`, a saturating conversion, compiled to eight scalar conversions,
/// each with its range checks, per vector.)
#[inline(always)]
pub(crate) fn pow2(n: f32) -> f32 {
    f32::from_bits((n + (12_582_912.0 + 127.0)).to_bits() << 23)
}

/// e^x for x <= 0 (softmax after subtracting the max), to about one ulp:
/// x = n ln2 + r with |r| <= ln2 / 2, e^r by its degree-7 Taylor polynomial,
/// scaled by [`pow2`]`(n)`. Branch-free, so it vectorises.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    let x = x.max(-87.0);
    let n = (x * std::f32::consts::LOG2_E).round();
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let p = 1.0 / 5040.0;
    let p = p * r + 1.0 / 720.0;
    let p = p * r + 1.0 / 120.0;
    let p = p * r + 1.0 / 24.0;
    let p = p * r + 1.0 / 6.0;
    let p = p * r + 0.5;
    let p = p * r + 1.0;
    let p = p * r + 1.0;
    p * pow2(n)
}

/// Dot product with eight independent accumulators (vectorises).
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// `y += a * x`.
#[inline(always)]
fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

#[cfg(test)]
mod tests;

mod timing;
pub use timing::time_decode;
