//! Speculative decoding with a draft model: a second, smaller model with
//! the target's vocabulary, loaded beside it on the engine thread with a
//! KV pool of its own. Before a step, each decoding sequence that
//! speculates with the draft gets up to `k` tokens proposed by the draft
//! (k single-token draft forwards, batched across the sequences that
//! speculate); they become the sequence's `drafts`, which the target
//! computes in its one batched forward and `sequence::verify` checks.
//!
//! How a proposal is made and checked depends on the request:
//! - greedy, or under a constraint: the draft's argmax (with the request's
//!   logit bias), checked as prompt lookup's are (see `speculate`): the
//!   target samples the position with the request's own sampler and keeps
//!   the proposal exactly when its draw is that token. Greedy output is
//!   token for token the same as without the draft.
//! - sampled: a token drawn from q, the request's sampling rules (bias,
//!   penalties, temperature, top-k/p, min-p) applied to the draft's
//!   logits, with a generator of its own (the request's seed, another
//!   stream); the target keeps it with probability min(1, p(x)/q(x)) and
//!   otherwise draws from max(0, p - q) renormalized (speculative
//!   sampling, Leviathan et al. 2023 and Chen et al. 2023): the token is
//!   distributed as p, and a draft that agrees with the target in
//!   distribution is kept nearly always, where its argmax would be kept
//!   only as often as the target draws its most likely token.
//!
//! The draft's cache follows the target's tokens lazily: each sequence
//! remembers the tokens whose keys and values the draft holds, and at its
//! next proposal keeps only their common prefix with the sequence's tokens
//! (the accepted proposals), recomputing the rest (the target's corrected
//! or extra token) in the first draft forward of that proposal. A sequence
//! that stops running (finished, cancelled, preempted) has its draft
//! blocks freed at the next proposal. When the draft pool has too few
//! blocks, a sequence proposes fewer tokens, or none (it decodes plainly).
//!
//! Not built: the draft's prefix cache (each sequence's prompt is computed
//! by the draft once per speculating sequence).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde_json::Value;
use tch::{Device, Kind, Tensor};

use crate::EngineError;
use crate::blocks::BlockId;
use crate::kv::KvPool;
use crate::layers::batch::SeqInput;
use crate::models::Model;
use crate::sampler::{Dist, Sampler};

/// Most tokens a request that gives a confidence threshold (and no token
/// count) has proposed per step.
pub const DRAFT_THRESHOLD_MAX_TOKENS: u32 = 16;

/// A request's settings for speculation with the draft model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DraftSpeculation {
    /// Most tokens the draft proposes per step (OpenVINO's
    /// `num_assistant_tokens`); at most `MAX_SPECULATIVE_TOKENS`.
    pub num_tokens: u32,
    /// The draft stops proposing at a token whose probability is below
    /// this (OpenVINO's `assistant_confidence_threshold`); that token is
    /// not proposed. The probability is the draft's softmax over its raw
    /// logits with the request's logit bias for an argmax proposal, and
    /// q(x) for a drawn one. In [0, 1]; None: always `num_tokens`.
    pub confidence_threshold: Option<f32>,
}

/// What the draft keeps of one sequence.
#[derive(Default)]
struct DraftSeq {
    blocks: Vec<BlockId>,
    /// The tokens whose keys and values are in `blocks`, in order.
    tokens: Vec<u32>,
    /// The draft's KV regime those were computed in.
    regime: u8,
}

/// One sequence's request for proposals.
pub(crate) struct Want<'a> {
    pub id: u64,
    /// The sequence's tokens (prompt and generated), none speculative.
    pub tokens: &'a [u32],
    pub k: usize,
    pub threshold: Option<f32>,
    /// Proposals drawn with the request's sampling rules (their
    /// distributions go to `q`); false: the draft's argmax, with the
    /// request's logit bias.
    pub drawn: bool,
    /// Tokens a drawn proposal may not be at its first `suppress_rows`
    /// positions (EOS and stop ids before `min_tokens`).
    pub suppress: Vec<u32>,
    pub suppress_rows: usize,
    pub sampler: &'a mut Sampler,
    /// Where each drawn proposal's distribution goes, in order.
    pub q: &'a mut Vec<Dist>,
}

pub(crate) struct Draft {
    model: Box<dyn Model>,
    pool: KvPool,
    block_size: usize,
    total: u32,
    free: Vec<BlockId>,
    seqs: HashMap<u64, DraftSeq>,
    /// Draft forward passes run.
    pub forwards: u64,
}

impl Draft {
    /// Loads the draft at `path` for `target` (loaded from `target_path`)
    /// with a pool of `num_blocks` blocks of `kv_kind` elements, its weights
    /// held as `load` says; fails when the vocabularies differ.
    pub fn load(
        path: &Path,
        target_path: &Path,
        target: &dyn Model,
        num_blocks: usize,
        block_size: usize,
        load: crate::models::LoadOptions,
        kv_kind: tch::Kind,
    ) -> Result<Self, EngineError> {
        let model = crate::models::load_with(path, target.device(), target.kind(), load)?;
        same_vocabulary(target_path, target, path, model.as_ref())?;
        let bs = block_size as i64;
        let per_block = model.kv_bytes_per_block(bs, kv_kind).max(1);
        let blocks = num_blocks.max(1) as i64;
        let pool = model.new_pool(blocks, bs, kv_kind)?;
        tracing::info!(
            path = %path.display(),
            architecture = %model.config().architecture,
            layers = model.config().num_layers,
            blocks,
            mib = blocks * per_block / (1 << 20),
            "draft model loaded"
        );
        Ok(Self {
            model,
            pool,
            block_size,
            total: blocks as u32,
            free: (0..blocks as BlockId).rev().collect(),
            seqs: HashMap::new(),
            forwards: 0,
        })
    }

    pub fn describe(&self) -> String {
        let c = self.model.config();
        format!("{} ({} layers)", c.architecture, c.num_layers)
    }

    pub fn blocks_total(&self) -> u32 {
        self.total
    }

    pub fn blocks_used(&self) -> u32 {
        self.total - self.free.len() as u32
    }

    /// Frees the blocks of every sequence for which `live` is false.
    pub fn retain(&mut self, live: impl Fn(u64) -> bool) {
        let gone: Vec<u64> = self.seqs.keys().copied().filter(|&id| !live(id)).collect();
        for id in gone {
            if let Some(ds) = self.seqs.remove(&id) {
                self.free.extend(ds.blocks);
            }
        }
    }

    /// Proposals for each sequence of `wants` (in order; empty where the
    /// draft proposes nothing).
    pub fn propose(&mut self, wants: &mut [Want<'_>]) -> Result<Vec<Vec<u32>>, EngineError> {
        let max_len = self.model.config().max_position_embeddings as usize;
        // Per want: tokens still to compute before the next proposal, and
        // how many to propose (0: none).
        let mut pending: Vec<Vec<u32>> = Vec::with_capacity(wants.len());
        let mut ks = Vec::with_capacity(wants.len());
        for w in wants.iter() {
            let len = w.tokens.len();
            let regime = self.model.kv_regime(len);
            let ds = self.seqs.entry(w.id).or_default();
            if ds.regime != regime {
                ds.tokens.clear();
                ds.regime = regime;
            }
            // The draft computes positions up to len + k - 2 (its last
            // proposal is not fed back): within its context and regime.
            let mut k = w.k.min((max_len + 1).saturating_sub(len));
            while k > 1 && self.model.kv_regime(len + k - 1) != regime {
                k -= 1;
            }
            // Keep what the draft computed of the sequence's tokens (the
            // accepted prefix); at least the last token is recomputed, its
            // row gives the first proposal.
            let keep = ds
                .tokens
                .iter()
                .zip(w.tokens)
                .take_while(|(a, b)| a == b)
                .count()
                .min(len.saturating_sub(1));
            ds.tokens.truncate(keep);
            // Blocks for len + k - 1 positions, fewer proposals if short.
            let bs = self.block_size;
            while k > 0 {
                let need = (len + k - 1).div_ceil(bs);
                if need <= ds.blocks.len() + self.free.len() {
                    break;
                }
                k -= 1;
            }
            if k == 0 {
                // Nothing to propose: give the blocks back.
                if let Some(ds) = self.seqs.remove(&w.id) {
                    self.free.extend(ds.blocks);
                }
                pending.push(Vec::new());
                ks.push(0);
                continue;
            }
            let need = (len + k - 1).div_ceil(bs);
            while ds.blocks.len() < need {
                ds.blocks.push(self.free.pop().expect("counted above"));
            }
            while ds.blocks.len() > need {
                self.free.push(ds.blocks.pop().expect("non-empty"));
            }
            pending.push(w.tokens[keep..].to_vec());
            ks.push(k);
        }
        let mut out: Vec<Vec<u32>> = vec![Vec::new(); wants.len()];
        loop {
            let active: Vec<usize> = (0..wants.len())
                .filter(|&i| out[i].len() < ks[i] && !pending[i].is_empty())
                .collect();
            if active.is_empty() {
                break;
            }
            let mut rows = Vec::with_capacity(active.len());
            let mut row = 0i64;
            let inputs: Vec<SeqInput<'_>> = active
                .iter()
                .map(|&i| {
                    let ds = &self.seqs[&wants[i].id];
                    row += pending[i].len() as i64;
                    rows.push(row - 1);
                    SeqInput {
                        tokens: &pending[i],
                        start: ds.tokens.len() as i64,
                        block_table: &ds.blocks,
                        seq_len: ds.tokens.len() + pending[i].len(),
                    }
                })
                .collect();
            let hidden = self.model.forward(&inputs, &mut self.pool)?;
            drop(inputs);
            self.forwards += 1;
            let idx = Tensor::from_slice(&rows).f_to_device(self.model.device())?;
            let logits = self
                .model
                .logits(&hidden.f_index_select(0, &idx)?)?
                .f_to_device(Device::Cpu)?
                .f_to_kind(Kind::Float)?;
            let vocab = logits.size()[1] as usize;
            let numel = logits.numel();
            let mut flat = vec![0f32; numel];
            logits.f_copy_data(&mut flat, numel)?;
            for (r, &i) in active.iter().enumerate() {
                let w = &mut wants[i];
                let ds = self.seqs.get_mut(&w.id).expect("proposing");
                ds.tokens.append(&mut pending[i]);
                let row = &mut flat[r * vocab..(r + 1) * vocab];
                let tok = if w.drawn {
                    let at = out[i].len();
                    let suppress: &[u32] = if at < w.suppress_rows {
                        &w.suppress
                    } else {
                        &[]
                    };
                    let (tok, q) = w.sampler.draft_draw(row, suppress, &out[i]);
                    if w.threshold.is_some_and(|th| q.prob(tok) < f64::from(th)) {
                        continue;
                    }
                    w.q.push(q);
                    tok
                } else {
                    for &(t, b) in w.sampler.logit_bias() {
                        if let Some(l) = row.get_mut(t as usize) {
                            *l += b;
                        }
                    }
                    let tok = crate::sampler::argmax(row);
                    if let Some(th) = w.threshold {
                        let top = row[tok as usize];
                        let z: f32 = row.iter().map(|&l| (l - top).exp()).sum();
                        if 1.0 / z < th {
                            continue;
                        }
                    }
                    tok
                };
                out[i].push(tok);
                if out[i].len() < ks[i] {
                    pending[i].push(tok);
                }
            }
        }
        Ok(out)
    }
}

/// The token of each id, from a tokenizer.json document: its model's
/// vocabulary (a token-to-id map, or Unigram's list of pieces) and its
/// added tokens.
fn id_to_token(doc: &Value) -> BTreeMap<u64, String> {
    let mut map = BTreeMap::new();
    match doc.pointer("/model/vocab") {
        Some(Value::Object(v)) => {
            for (tok, id) in v {
                if let Some(id) = id.as_u64() {
                    map.insert(id, tok.clone());
                }
            }
        }
        Some(Value::Array(pieces)) => {
            for (id, p) in pieces.iter().enumerate() {
                if let Some(tok) = p.get(0).and_then(Value::as_str) {
                    map.insert(id as u64, tok.to_string());
                }
            }
        }
        _ => {}
    }
    if let Some(Value::Array(added)) = doc.get("added_tokens") {
        for a in added {
            if let (Some(id), Some(tok)) = (
                a.get("id").and_then(Value::as_u64),
                a.get("content").and_then(Value::as_str),
            ) {
                map.insert(id, tok.to_string());
            }
        }
    }
    map
}

/// The tokenizer of a model directory (its tokenizer.json) or GGUF file
/// (built from its metadata); None when it has none we can read.
fn tokenizer_of(path: &Path) -> Option<BTreeMap<u64, String>> {
    let text = if crate::gguf::is_gguf(path) {
        let file = crate::gguf::GgufFile::open(path).ok()?;
        crate::gguf::tokenizer::tokenizer_json(&file).ok()?
    } else {
        std::fs::read_to_string(path.join("tokenizer.json")).ok()?
    };
    let doc: Value = serde_json::from_str(&text).ok()?;
    Some(id_to_token(&doc))
}

/// Fails unless the draft's vocabulary is the target's: the same
/// vocabulary size (the logits' width) and, where both have a tokenizer,
/// the same token for every id (the model vocabulary and added tokens).
/// EOS and BOS ids are not compared: the target's decide when generation
/// ends, and a base and an instruct model with one tokenizer often name
/// different EOS tokens.
pub(crate) fn same_vocabulary(
    target_path: &Path,
    target: &dyn Model,
    draft_path: &Path,
    draft: &dyn Model,
) -> Result<(), EngineError> {
    let refuse = |reason: String| EngineError::Load {
        path: draft_path.display().to_string(),
        reason: format!("the draft model's vocabulary differs from the target's: {reason}"),
    };
    let (tv, dv) = (target.config().vocab_size, draft.config().vocab_size);
    if tv != dv {
        return Err(refuse(format!("vocab_size {dv} (the target's is {tv})")));
    }
    match (tokenizer_of(target_path), tokenizer_of(draft_path)) {
        (Some(t), Some(d)) => {
            if let Some(id) = (0..tv as u64).find(|id| t.get(id) != d.get(id)) {
                return Err(refuse(format!(
                    "token id {id} is {:?} in the draft, {:?} in the target",
                    d.get(&id),
                    t.get(&id)
                )));
            }
        }
        _ => tracing::warn!(
            "the draft or the target has no readable tokenizer: only vocab sizes compared"
        ),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::id_to_token;

    #[test]
    fn ids_come_from_the_vocab_and_the_added_tokens() {
        let bpe = serde_json::json!({
            "model": {"vocab": {"a": 0, "b": 1}},
            "added_tokens": [{"id": 2, "content": "<eos>"}]
        });
        let m = id_to_token(&bpe);
        assert_eq!(m.get(&1).map(String::as_str), Some("b"));
        assert_eq!(m.get(&2).map(String::as_str), Some("<eos>"));
        let unigram = serde_json::json!({"model": {"vocab": [["x", 0.0], ["y", -1.0]]}});
        assert_eq!(id_to_token(&unigram).get(&1).map(String::as_str), Some("y"));
    }
}
