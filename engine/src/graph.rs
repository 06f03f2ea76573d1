//! CUDA graphs for decode steps (through `csrc/graph.cpp`).
//!
//! An eager decode step launches every layer's kernels one by one from the
//! host; at small batches the host's launch time, not the GPU, sets the
//! pace. A step whose sequences all decode one token is instead replayed
//! from a graph captured for its shape: `B` sequences (the batch rounded up
//! to a power of two; padding rows write to a scratch slot no sequence owns)
//! and keys packed at a fixed stride `L` (the longest context rounded up to
//! a power of two, at least 256). Flash attention reads each sequence's
//! first `seqused_k[i]` keys of its span, so one graph serves any lengths up
//! to `L`. Before each replay the step's token ids, positions, slots and
//! lengths are copied into the graph's input tensors; the logits of the
//! real rows stay on the device, where the step samples from them
//! (`crate::sampler_device`; the token ids coming back are the step's one
//! host sync).
//!
//! A graph is captured the first time its shape is needed: the step runs
//! once eagerly on a side stream (warming up libraries' per-stream state),
//! then is captured, then replayed. A model a graph cannot hold (a layer off
//! the flash path, a host sync inside the forward) fails its first capture;
//! graphs are then off for that model and every step runs eagerly.
//! `GYRE_CUDA_GRAPHS=0` turns them off.

use std::collections::HashMap;

use tch::Tensor;

use crate::EngineError;
use crate::flash::Varlen;
use crate::kv::KvPool;
use crate::layers::batch::{SeqInput, StepBatch};
use crate::models::Model;

/// Shortest key stride of a graph (tokens).
const MIN_STRIDE: i64 = 256;
/// Most packed key rows (batch x stride) a graph may gather per layer;
/// larger steps run eagerly.
const MAX_ROWS: i64 = 1 << 18;

#[cfg(gyre_cuda_graphs)]
mod ffi {
    use std::ffi::{c_char, c_int, c_void};
    #[allow(unsafe_code)]
    unsafe extern "C" {
        pub fn gyre_graphs_new(out: *mut *mut c_void, err: *mut c_char, len: usize) -> c_int;
        pub fn gyre_graphs_free(s: *mut c_void);
        pub fn gyre_graphs_enter(s: *mut c_void, err: *mut c_char, len: usize) -> c_int;
        pub fn gyre_graphs_leave(s: *mut c_void, err: *mut c_char, len: usize) -> c_int;
        pub fn gyre_graph_begin(
            s: *mut c_void,
            out: *mut *mut c_void,
            err: *mut c_char,
            len: usize,
        ) -> c_int;
        pub fn gyre_graph_end(g: *mut c_void, err: *mut c_char, len: usize) -> c_int;
        pub fn gyre_graph_replay(g: *mut c_void, err: *mut c_char, len: usize) -> c_int;
        pub fn gyre_graph_free(g: *mut c_void);
    }
}

/// Calls a C entry point that reports failure as (non-zero, message).
#[cfg(gyre_cuda_graphs)]
fn call(
    what: &str,
    f: impl FnOnce(*mut std::ffi::c_char, usize) -> i32,
) -> Result<(), EngineError> {
    let mut err = [0 as std::ffi::c_char; 512];
    if f(err.as_mut_ptr(), err.len()) == 0 {
        return Ok(());
    }
    #[allow(unsafe_code)]
    // SAFETY: the callee NUL-terminated the (zeroed) buffer.
    let msg = unsafe { std::ffi::CStr::from_ptr(err.as_ptr()) };
    Err(EngineError::Step(format!(
        "CUDA graph {what}: {}",
        msg.to_string_lossy().lines().next().unwrap_or("failed")
    )))
}

/// The side stream and memory pool all of one model's graphs share.
struct Set(*mut std::ffi::c_void);

/// One captured graph.
struct Graph(*mut std::ffi::c_void);

#[cfg(gyre_cuda_graphs)]
#[allow(unsafe_code)]
mod raii {
    use super::*;
    // SAFETY (both): the pointers are owned here and only ever used from
    // the engine's worker thread, which owns the `DecodeGraphs`.
    unsafe impl Send for Set {}
    unsafe impl Send for Graph {}
    impl Drop for Set {
        fn drop(&mut self) {
            // SAFETY: allocated by gyre_graphs_new, freed once.
            unsafe { ffi::gyre_graphs_free(self.0) }
        }
    }
    impl Drop for Graph {
        fn drop(&mut self) {
            // SAFETY: allocated by gyre_graph_begin, freed once.
            unsafe { ffi::gyre_graph_free(self.0) }
        }
    }
}

#[cfg(gyre_cuda_graphs)]
#[allow(unsafe_code)]
impl Set {
    fn new() -> Result<Self, EngineError> {
        let mut p = std::ptr::null_mut();
        // SAFETY: `p` receives a heap object on success; the buffer is writable.
        call("set", |e, n| unsafe { ffi::gyre_graphs_new(&mut p, e, n) })?;
        Ok(Self(p))
    }
    fn enter(&self) -> Result<(), EngineError> {
        // SAFETY: a live set.
        call("enter", |e, n| unsafe {
            ffi::gyre_graphs_enter(self.0, e, n)
        })
    }
    fn leave(&self) -> Result<(), EngineError> {
        // SAFETY: a live set.
        call("leave", |e, n| unsafe {
            ffi::gyre_graphs_leave(self.0, e, n)
        })
    }
    fn begin(&self) -> Result<Graph, EngineError> {
        let mut p = std::ptr::null_mut();
        // SAFETY: a live set; `p` receives a heap graph on success.
        call("capture", |e, n| unsafe {
            ffi::gyre_graph_begin(self.0, &mut p, e, n)
        })?;
        Ok(Graph(p))
    }
}

#[cfg(gyre_cuda_graphs)]
#[allow(unsafe_code)]
impl Graph {
    fn end(&self) -> Result<(), EngineError> {
        // SAFETY: a live graph being captured.
        call("capture", |e, n| unsafe {
            ffi::gyre_graph_end(self.0, e, n)
        })
    }
    fn replay(&self) -> Result<(), EngineError> {
        // SAFETY: a live, captured graph.
        call("replay", |e, n| unsafe {
            ffi::gyre_graph_replay(self.0, e, n)
        })
    }
}

#[cfg(not(gyre_cuda_graphs))]
impl Set {
    fn new() -> Result<Self, EngineError> {
        Err(EngineError::Step(
            "built without CUDA graphs (no CUDA headers beside libtorch)".into(),
        ))
    }
    fn enter(&self) -> Result<(), EngineError> {
        unreachable!("no set without CUDA graphs")
    }
    fn leave(&self) -> Result<(), EngineError> {
        unreachable!("no set without CUDA graphs")
    }
    fn begin(&self) -> Result<Graph, EngineError> {
        unreachable!("no set without CUDA graphs")
    }
}

#[cfg(not(gyre_cuda_graphs))]
impl Graph {
    fn end(&self) -> Result<(), EngineError> {
        unreachable!("no graph without CUDA graphs")
    }
    fn replay(&self) -> Result<(), EngineError> {
        unreachable!("no graph without CUDA graphs")
    }
}

/// A captured decode step of `b` rows at key stride `l`, with its inputs
/// and output (device tensors whose memory the graph reads and writes).
struct Captured {
    graph: Graph,
    /// The batch the graph was captured from: its flash packing (cu_q,
    /// cu_k) lives on the device and the graph reads it at every replay, so
    /// it must live as long as the graph.
    _batch: StepBatch,
    /// int64 [3b + b*l]: ids, positions, new slots, then the gather index.
    inputs: Tensor,
    /// int32 [b]: keys each row uses.
    seqused: Tensor,
    /// float32 [b, vocab].
    logits: Tensor,
    /// Replays so far.
    replays: u64,
}

/// The replay of a graph's life at which `GYRE_PROFILE_GRAPHS=1` times it.
const PROFILE_AT: u64 = 64;

fn profiling() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("GYRE_PROFILE_GRAPHS").is_ok_and(|v| v == "1"))
}

/// Times 32 back-to-back replays of `c` (the step just replayed, so they
/// rewrite the same keys and values) and logs the device time of one: what
/// a step costs with no host work between replays, to set beside the
/// measured step time (the difference is the host's part).
fn profile(c: &Captured, b: i64, l: i64) -> Result<(), EngineError> {
    const N: u32 = 32;
    tch::Cuda::synchronize(0);
    let t0 = std::time::Instant::now();
    for _ in 0..N {
        c.graph.replay()?;
    }
    tch::Cuda::synchronize(0);
    let ms = t0.elapsed().as_secs_f64() * 1e3 / f64::from(N);
    tracing::info!(
        batch = b,
        stride = l,
        replay_ms = format!("{ms:.3}"),
        "decode graph replayed back to back"
    );
    Ok(())
}

/// The decode graphs of one model.
pub(crate) struct DecodeGraphs {
    set: Set,
    graphs: HashMap<(i64, i64), Captured>,
    /// A pool slot no sequence owns: padding rows write and read it.
    scratch: i64,
    /// Graphs gave up after a failed capture: every step runs eagerly.
    off: bool,
}

/// Whether decode graphs are wanted: on CUDA, for a model that can be
/// captured, unless `GYRE_CUDA_GRAPHS=0`.
pub(crate) fn wanted(model: &dyn Model) -> bool {
    model.device().is_cuda()
        && model.cuda_graphs()
        && model.flash_attention()
        && std::env::var("GYRE_CUDA_GRAPHS").map_or(true, |v| v != "0")
}

fn bucket(n: i64, min: i64) -> i64 {
    (n.max(min) as u64).next_power_of_two() as i64
}

impl DecodeGraphs {
    /// Graphs for a model whose pool has a slot no sequence owns
    /// (`scratch`). Fails where CUDA graphs cannot be made.
    pub(crate) fn new(scratch: i64) -> Result<Self, EngineError> {
        Ok(Self {
            set: Set::new()?,
            graphs: HashMap::new(),
            scratch,
            off: false,
        })
    }

    /// Runs a step whose sequences each decode one token through a graph
    /// and returns the logits of its rows ([rows, vocab], float32, on the
    /// device: the graph's output, valid until its next replay); None when
    /// this step runs eagerly instead (too large, or graphs are off).
    pub(crate) fn decode(
        &mut self,
        model: &dyn Model,
        seqs: &[SeqInput<'_>],
        pool: &mut KvPool,
    ) -> Result<Option<Tensor>, EngineError> {
        if self.off || seqs.is_empty() || seqs.iter().any(|s| s.tokens.len() != 1) {
            return Ok(None);
        }
        let n = seqs.len() as i64;
        let longest = seqs.iter().map(|s| s.start + 1).max().unwrap_or(1);
        let (b, l) = (bucket(n, 1), bucket(longest, MIN_STRIDE));
        if b * l > MAX_ROWS {
            return Ok(None);
        }
        // The step's inputs, padded to the graph's shape.
        let mut host = vec![self.scratch; (3 * b + b * l) as usize];
        let mut used = vec![1i32; b as usize];
        for (i, s) in seqs.iter().enumerate() {
            let end = s.start + 1;
            if (s.block_table.len() as i64) * pool.block_size() < end {
                return Err(EngineError::Step(format!(
                    "block table of {} blocks cannot hold {end} tokens",
                    s.block_table.len()
                )));
            }
            let slots = pool.slots(s.block_table, 0, end);
            host[i] = i64::from(s.tokens[0]);
            host[b as usize + i] = s.start;
            host[2 * b as usize + i] = slots[s.start as usize];
            let row = (3 * b + i as i64 * l) as usize;
            host[row..row + slots.len()].copy_from_slice(&slots);
            used[i] = end as i32;
        }
        for i in n..b {
            host[i as usize] = 0;
            host[(b + i) as usize] = 0;
        }
        if !self.graphs.contains_key(&(b, l)) {
            match self.capture(model, pool, b, l, &host, &used) {
                Ok(c) => {
                    tracing::debug!(batch = b, stride = l, "decode graph captured");
                    self.graphs.insert((b, l), c);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "CUDA graphs off for this model; decode steps run eagerly");
                    self.off = true;
                    return Ok(None);
                }
            }
        }
        let Some(c) = self.graphs.get_mut(&(b, l)) else {
            return Ok(None);
        };
        c.inputs.f_copy_(&Tensor::from_slice(&host))?;
        c.seqused.f_copy_(&Tensor::from_slice(&used))?;
        c.graph.replay()?;
        c.replays += 1;
        if c.replays == PROFILE_AT && profiling() {
            profile(c, b, l)?;
        }
        Ok(Some(c.logits.f_narrow(0, 0, n)?))
    }

    /// Warms up and captures a graph of `b` rows at stride `l`, its inputs
    /// set to this step's (`host`, `used`); nothing runs on the device yet
    /// but the warm-up (which writes the same keys and values the replay will).
    fn capture(
        &self,
        model: &dyn Model,
        pool: &mut KvPool,
        b: i64,
        l: i64,
        host: &[i64],
        used: &[i32],
    ) -> Result<Captured, EngineError> {
        let dev = model.device();
        let inputs = Tensor::from_slice(host).f_to_device(dev)?;
        let seqused = Tensor::from_slice(used).f_to_device(dev)?;
        let batch = || -> Result<StepBatch, EngineError> {
            Ok(StepBatch {
                n: b,
                ids: inputs.f_narrow(0, 0, b)?,
                pos: inputs.f_narrow(0, b, b)?,
                new_slots: inputs.f_narrow(0, 2 * b, b)?,
                seqs: Vec::new(),
                cpu_decode: false,
                flash: Some((
                    Varlen::fixed_stride(b, l, seqused.shallow_clone())?,
                    inputs.f_narrow(0, 3 * b, b * l)?,
                )),
                graphed: true,
            })
        };
        let step = batch()?;
        let run = |pool: &mut KvPool| -> Result<Tensor, EngineError> {
            let hidden = model.forward_batch(&step, pool)?;
            model.logits(&hidden)
        };
        self.set.enter()?;
        let mut capture = || -> Result<(Graph, Tensor), EngineError> {
            // Warm-up, then the capture proper (which runs nothing).
            drop(run(pool)?);
            let graph = self.set.begin()?;
            let out = run(pool);
            // End the capture even after a failure inside it.
            let end = graph.end();
            let logits = out?;
            end?;
            Ok((graph, logits))
        };
        let captured = capture();
        let left = self.set.leave();
        let (graph, logits) = captured?;
        left?;
        // The first replay computes this step.
        Ok(Captured {
            graph,
            _batch: step,
            inputs,
            seqused,
            logits,
            replays: 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_powers_of_two_above_a_floor() {
        assert_eq!(bucket(1, 1), 1);
        assert_eq!(bucket(3, 1), 4);
        assert_eq!(bucket(64, 1), 64);
        assert_eq!(bucket(65, 1), 128);
        assert_eq!(bucket(5, MIN_STRIDE), 256);
        assert_eq!(bucket(257, MIN_STRIDE), 512);
    }

    /// Without a GPU, making the graph set fails with an error (never a
    /// crash), and no CUDA model would ask for one.
    #[test]
    fn no_graphs_without_cuda() {
        if tch::Cuda::is_available() {
            return;
        }
        let e = DecodeGraphs::new(0).err().expect("no CUDA device");
        assert!(!e.to_string().is_empty());
    }
}
