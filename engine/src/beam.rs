//! Beam search's bookkeeping, as transformers' `_beam_search` does it with
//! `do_sample=False` (the reference its tests compare with): the scores of
//! the live beams, the finished hypotheses, and each step's choice of
//! continuations. The worker owns the beams' sequences and KV blocks
//! (`worker_beam`); this module never touches either.
//!
//! Each step, with every live beam's next-token log-probabilities:
//! - the best `K = max(2, 1 + eos ids) × width` continuations over all beams
//!   by cumulative log-probability;
//! - of those, the ones that end (an EOS or stop id, or `max_tokens`
//!   reached) among the first `width` become finished hypotheses, scored
//!   `sum_logprobs / generated_len ** length_penalty` (the generated
//!   length counts the new token and not the prompt), kept best `width`;
//! - the best `width` that do not end are the next step's beams;
//! - the search stops per `early_stopping` (see [`EarlyStopping`]), or when
//!   every continuation ended (`max_tokens`).

use crate::{EngineError, FinishReason, GenerateRequest, ModelInfo};

/// Widest beam search a request may ask for.
pub const MAX_BEAM_WIDTH: u32 = 16;

/// When a beam search stops: transformers' `early_stopping`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EarlyStopping {
    /// `False` (the default): stop once `width` hypotheses finished and
    /// the best live beam, scored at its current length, cannot beat the
    /// worst of them.
    #[default]
    Heuristic,
    /// `True`: stop as soon as `width` hypotheses finished.
    Always,
    /// `"never"`: as the heuristic, but with a positive length penalty
    /// the best live beam is scored at `max_tokens` (the longest it can
    /// get), so the search runs until no beam could improve.
    Never,
}

/// A request's beam-search parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BeamSearch {
    /// Beams kept per step (`num_beams`, the API's `best_of`); 2 to
    /// [`MAX_BEAM_WIDTH`]. The request's `n` best hypotheses are returned.
    pub width: u32,
    /// Exponent of the generated length that divides a finished
    /// hypothesis's log-probability (1.0: transformers' default).
    pub length_penalty: f32,
    pub early_stopping: EarlyStopping,
}

/// A finished hypothesis.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Hypothesis {
    pub tokens: Vec<u32>,
    /// `sum_logprobs / len ** length_penalty`.
    pub score: f32,
    pub sum_logprobs: f32,
    pub reason: FinishReason,
}

/// A live beam: its sequence in the worker and what it generated.
#[derive(Debug, Clone)]
pub(crate) struct Beam {
    pub seq: u64,
    pub sum_logprobs: f32,
    pub tokens: Vec<u32>,
}

/// A continuation chosen as one of the next step's beams.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Next {
    /// Index of the beam it continues (in [`Search::beams`]).
    pub parent: usize,
    pub token: u32,
    pub sum_logprobs: f32,
}

/// The state of one request's beam search.
pub(crate) struct Search {
    pub params: BeamSearch,
    /// Ids that end a hypothesis (the model's EOS ids, then stop ids).
    pub eos: Vec<u32>,
    pub max_tokens: u32,
    pub beams: Vec<Beam>,
    /// Best first, at most `width`.
    pub finished: Vec<Hypothesis>,
    /// Tokens generated per beam so far.
    pub step: u32,
    /// transformers' `is_early_stop_heuristic_unsatisfied`.
    improvable: bool,
}

impl Search {
    pub fn new(params: BeamSearch, eos: Vec<u32>, max_tokens: u32, first_seq: u64) -> Self {
        Self {
            params,
            eos,
            max_tokens,
            beams: vec![Beam {
                seq: first_seq,
                sum_logprobs: 0.0,
                tokens: Vec::new(),
            }],
            finished: Vec::new(),
            step: 0,
            improvable: true,
        }
    }

    fn width(&self) -> usize {
        self.params.width as usize
    }

    fn penalized(&self, sum: f32, len: u32) -> f32 {
        (sum as f64 / (len as f64).powf(self.params.length_penalty as f64)) as f32
    }

    /// One step, given each live beam's next-token log-probabilities (in
    /// the order of `beams`). Returns the next beams (best first), or None
    /// when the search is over (then `finished` holds the result).
    pub fn step(&mut self, logprobs: &[&[f32]]) -> Option<Vec<Next>> {
        let width = self.width();
        let k = 2.max(1 + self.eos.len()) * width;
        let mut cands: Vec<(f32, usize, u32)> = Vec::with_capacity(k * logprobs.len());
        for (b, row) in logprobs.iter().enumerate() {
            let base = self.beams[b].sum_logprobs;
            cands.extend(top_k(row, k).into_iter().map(|(t, lp)| (base + lp, b, t)));
        }
        // Best first; ties by (beam, token), as a flat top-k over beams × vocab.
        cands.sort_by(|a, b| {
            b.0.total_cmp(&a.0)
                .then_with(|| (a.1, a.2).cmp(&(b.1, b.2)))
        });
        cands.truncate(k);
        let len = self.step + 1;
        let at_max = len >= self.max_tokens;
        let ends = |t: u32| at_max || self.eos.contains(&t);
        let full = self.finished.len() == width;
        if self.improvable && !(full && self.params.early_stopping == EarlyStopping::Always) {
            for &(sum, b, t) in cands.iter().take(width).filter(|c| ends(c.2)) {
                let mut tokens = self.beams[b].tokens.clone();
                tokens.push(t);
                let reason = match self.eos.contains(&t) {
                    true => FinishReason::Stop(t),
                    false => FinishReason::Length,
                };
                self.finished.push(Hypothesis {
                    tokens,
                    score: self.penalized(sum, len),
                    sum_logprobs: sum,
                    reason,
                });
            }
            // Stable: among equal scores, the earlier-finished stays ahead.
            self.finished.sort_by(|a, b| b.score.total_cmp(&a.score));
            self.finished.truncate(width);
        }
        let next: Vec<Next> = cands
            .iter()
            .filter(|c| !ends(c.2))
            .take(width)
            .map(|&(sum_logprobs, parent, token)| Next {
                parent,
                token,
                sum_logprobs,
            })
            .collect();
        self.step = len;
        let all_ended = next.is_empty();
        if let (true, Some(best)) = (self.improvable, next.first()) {
            let hypothetical = match self.params.early_stopping {
                EarlyStopping::Never if self.params.length_penalty > 0.0 => self.max_tokens,
                _ => self.step,
            };
            let best = self.penalized(best.sum_logprobs, hypothetical);
            if self.finished.len() == width {
                let worst = self
                    .finished
                    .iter()
                    .map(|h| h.score)
                    .fold(f32::INFINITY, f32::min);
                self.improvable = best > worst;
            }
        }
        let full = self.finished.len() == width;
        let done = !self.improvable
            || (full && self.params.early_stopping == EarlyStopping::Always)
            || all_ended;
        (!done).then_some(next)
    }

    /// Makes `next` the live beams (their sequences are assigned by the
    /// worker: `seqs[i]` for `next[i]`).
    pub fn advance(&mut self, next: &[Next], seqs: &[u64]) {
        let beams = next
            .iter()
            .zip(seqs)
            .map(|(n, &seq)| {
                let mut tokens = self.beams[n.parent].tokens.clone();
                tokens.push(n.token);
                Beam {
                    seq,
                    sum_logprobs: n.sum_logprobs,
                    tokens,
                }
            })
            .collect();
        self.beams = beams;
    }
}

/// Beam search's own limits: a group whose beams shared nothing (each
/// recomputed after a preemption) must still fit the KV cache, and all
/// its beams must be able to run at once.
pub(crate) fn validate(
    req: &GenerateRequest,
    b: &BeamSearch,
    n: u32,
    info: &ModelInfo,
    block_size: u32,
    max_running: usize,
) -> Result<(), EngineError> {
    let bad = |field, message| Err(EngineError::InvalidBeam { field, message });
    if b.width < 2 || b.width > MAX_BEAM_WIDTH {
        return bad(
            "beam.width",
            format!(
                "the beam width (best_of) must be between 2 and {MAX_BEAM_WIDTH}, got {}",
                b.width
            ),
        );
    }
    if n > b.width {
        return bad(
            "n",
            format!(
                "n ({n}) must not exceed the beam width (best_of, {})",
                b.width
            ),
        );
    }
    if b.width as usize > max_running {
        return bad(
            "beam.width",
            format!(
                "the beam width ({}) exceeds the sequences this server runs at once ({})",
                b.width, max_running
            ),
        );
    }
    if !b.length_penalty.is_finite() {
        return bad(
            "beam.length_penalty",
            "length_penalty must be a finite number".into(),
        );
    }
    let refused = [
        (
            req.speculation.is_some(),
            "num_assistant_tokens",
            "prompt-lookup decoding",
        ),
        (
            req.draft.is_some(),
            "num_assistant_tokens",
            "speculative decoding with a draft model",
        ),
        (
            req.constraint.is_some(),
            "structured",
            "structured outputs or forced tool calls",
        ),
        (req.logprobs.is_some(), "logprobs", "logprobs"),
        (
            req.prompt_logprobs.is_some(),
            "prompt_logprobs",
            "prompt_logprobs",
        ),
        (req.min_tokens > 0, "min_tokens", "min_tokens"),
        (req.ignore_eos, "ignore_eos", "ignore_eos"),
    ];
    if let Some(&(_, field, what)) = refused.iter().find(|r| r.0) {
        return bad(field, format!("beam search cannot be combined with {what}"));
    }
    let block = block_size.max(1) as u64;
    let per_beam = (req.prompt.len() as u64 + req.max_tokens as u64).div_ceil(block) * block;
    if per_beam * b.width as u64 > info.kv_capacity_tokens as u64 {
        return Err(EngineError::ExceedsKvCapacity {
            prompt: req.prompt.len() as u32,
            requested: req.max_tokens,
            capacity: info.kv_capacity_tokens / b.width,
        });
    }
    Ok(())
}

/// Log-softmax of a row of logits (in f32, as transformers' scores).
pub(crate) fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&x| ((x - max) as f64).exp()).sum();
    let lse = max + sum.ln() as f32;
    logits.iter().map(|&x| x - lse).collect()
}

/// The `k` largest entries of `row` as (index, value), any order.
fn top_k(row: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut all: Vec<(u32, f32)> = row
        .iter()
        .enumerate()
        .map(|(i, &v)| (i as u32, v))
        .collect();
    if all.len() > k {
        all.select_nth_unstable_by(k - 1, |a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        all.truncate(k);
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    fn search(width: u32, early: EarlyStopping, max_tokens: u32) -> Search {
        let p = BeamSearch {
            width,
            length_penalty: 1.0,
            early_stopping: early,
        };
        Search::new(p, vec![0], max_tokens, 1)
    }

    #[test]
    fn the_best_continuations_over_all_beams_become_the_beams() {
        let mut s = search(2, EarlyStopping::Heuristic, 10);
        let row = log_softmax(&[-9.0, 3.0, 2.0, 0.0]);
        let next = s.step(&[&row]).expect("continues");
        assert_eq!(next.iter().map(|n| n.token).collect::<Vec<_>>(), vec![1, 2]);
        s.advance(&next, &[1, 2]);
        // Beam 1 (token 2) has a much better continuation than beam 0's best.
        let a = log_softmax(&[-9.0, 0.0, 0.0, 0.0]);
        let b = log_softmax(&[-9.0, 9.0, -9.0, -9.0]);
        let next = s.step(&[&a, &b]).expect("continues");
        assert_eq!((next[0].parent, next[0].token), (1, 1));
    }

    #[test]
    fn an_eos_among_the_best_finishes_a_hypothesis_scored_by_length() {
        let mut s = search(2, EarlyStopping::Always, 10);
        let row = log_softmax(&[2.0, 1.0, 0.5, -5.0]);
        let next = s.step(&[&row]).expect("continues");
        assert_eq!(s.finished.len(), 1);
        assert_eq!(s.finished[0].tokens, vec![0]);
        assert_eq!(s.finished[0].reason, FinishReason::Stop(0));
        assert!((s.finished[0].score - row[0]).abs() < 1e-6, "length 1");
        assert_eq!(next.len(), 2, "two live beams go on");
    }

    #[test]
    fn max_tokens_finishes_every_beam() {
        let mut s = search(2, EarlyStopping::Heuristic, 1);
        let row = log_softmax(&[-1.0, 1.0, 0.5, -5.0]);
        assert!(s.step(&[&row]).is_none());
        assert_eq!(s.finished.len(), 2);
        assert!(
            s.finished
                .iter()
                .all(|h| h.reason == FinishReason::Length && h.tokens.len() == 1)
        );
    }
}
