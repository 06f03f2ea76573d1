//! One step's packed batch: the new tokens of several sequences laid end to
//! end, each with its block table into the shared paged KV pool. Built once
//! per step (token ids, positions, pool slots, the decode rows for the CPU
//! kernel, the flash-attention packing on CUDA) and read by every layer.

use tch::{Device, Kind, Tensor};

use super::Backend;
use crate::EngineError;
use crate::blocks::BlockId;
use crate::flash;
use crate::kv::KvPool;

/// One sequence's part of a packed batch.
pub struct SeqInput<'a> {
    /// The new tokens to run (a prompt, a chunk of it, or one decode token).
    pub tokens: &'a [u32],
    /// Position of `tokens[0]`: how many of the sequence's tokens are
    /// already in the KV pool.
    pub start: i64,
    /// The sequence's blocks, covering at least `start + tokens.len()` positions.
    pub block_table: &'a [BlockId],
    /// The sequence's whole length: every token it has, computed or not
    /// (for a prompt's chunk, the whole prompt). Longrope rotates all of a
    /// sequence with the table for this length (see `Model::kv_regime`).
    pub seq_len: usize,
}

/// Where one sequence sits in the step.
pub(crate) struct SeqSpan {
    /// Its first row in the packed batch.
    pub row: usize,
    /// Its new tokens.
    pub len: usize,
    /// Position of its first new token.
    pub start: i64,
    /// Pool slots of all its positions `0..start + len`.
    pub slots: Vec<i64>,
    /// The sequence's whole length (`SeqInput::seq_len`).
    pub seq_len: usize,
}

/// Opaque outside the engine: families read it, the model trait builds it.
pub struct StepBatch {
    /// Tokens in the step.
    pub(crate) n: i64,
    /// Token ids [n] and positions [n] (int64, on the device).
    pub(crate) ids: Tensor,
    pub(crate) pos: Tensor,
    /// Pool slots [n] the new tokens' keys and values go to.
    pub(crate) new_slots: Tensor,
    pub(crate) seqs: Vec<SeqSpan>,
    /// Decodes (one new token) go through `attn`'s kernel on a float32 CPU.
    pub(crate) cpu_decode: bool,
    /// On CUDA with flash attention: the packing of all sequences and the
    /// gather index of their slots.
    pub(crate) flash: Option<(flash::Varlen, Tensor)>,
    /// Built by a decode graph (`crate::graph`): every layer must take the
    /// flash path, which reads only the batch's device tensors; any other
    /// path is an error (the graph is then given up for the eager one).
    pub(crate) graphed: bool,
}

impl StepBatch {
    pub(crate) fn new(
        seqs: &[SeqInput<'_>],
        pool: &KvPool,
        be: &Backend,
    ) -> Result<Self, EngineError> {
        let dev = be.device;
        let mut ids = Vec::new();
        let mut pos = Vec::new();
        let mut new_slots = Vec::new();
        let mut spans = Vec::with_capacity(seqs.len());
        for s in seqs {
            let end = s.start + s.tokens.len() as i64;
            if (s.block_table.len() as i64) * pool.block_size() < end {
                return Err(EngineError::Step(format!(
                    "block table of {} blocks cannot hold {end} tokens",
                    s.block_table.len()
                )));
            }
            spans.push(SeqSpan {
                row: ids.len(),
                len: s.tokens.len(),
                start: s.start,
                slots: pool.slots(s.block_table, 0, end),
                seq_len: s.seq_len.max(end as usize),
            });
            ids.extend(s.tokens.iter().map(|&t| t as i64));
            pos.extend(s.start..end);
            new_slots.extend(pool.slots(s.block_table, s.start, end));
        }
        let flash = if be.flash_attention() {
            let lens: Vec<(i64, i64)> = spans
                .iter()
                .map(|s| (s.len as i64, s.slots.len() as i64))
                .collect();
            let gather: Vec<i64> = spans.iter().flat_map(|s| s.slots.iter().copied()).collect();
            Some((
                flash::Varlen::new(&lens, dev)?,
                Tensor::from_slice(&gather).f_to_device(dev)?,
            ))
        } else {
            None
        };
        Ok(Self {
            n: ids.len() as i64,
            ids: Tensor::from_slice(&ids).f_to_device(dev)?,
            pos: Tensor::from_slice(&pos).f_to_device(dev)?,
            new_slots: Tensor::from_slice(&new_slots).f_to_device(dev)?,
            seqs: spans,
            cpu_decode: dev == Device::Cpu && be.kind == Kind::Float,
            flash,
            graphed: false,
        })
    }
}
