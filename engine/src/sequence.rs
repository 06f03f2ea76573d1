//! A generating sequence's side of the engine thread: its request, event
//! channel and sampler, and what happens to each of its tokens (sampling
//! within its constraint, log-probabilities, stop and length checks). The
//! scheduler keeps its tokens and blocks (`scheduler::SeqState`).

use std::time::Instant;

use tokio::sync::mpsc;

use crate::sampler::{Dist, Sampler};
use crate::scheduler::SeqState;
use crate::{EngineError, EngineStats, Event, FinishReason, GenerateRequest, Timings};

/// Generation state of a sequence (the scheduler keeps the rest).
pub(crate) struct Gen {
    pub req: GenerateRequest,
    pub events: mpsc::UnboundedSender<Event>,
    pub sampler: Sampler,
    pub generated: u32,
    pub eos: Vec<u32>,
    /// Further choices (n > 1) to fork off once the prompt is prefilled.
    pub forks: Vec<(mpsc::UnboundedSender<Event>, Sampler)>,
    /// With `prompt_logprobs`: prompt positions whose next token's
    /// log-probability was sent (kept across preemption, so none is sent twice).
    pub prompt_lp_done: usize,
    /// Not started yet: counted as waiting by admission.
    pub queued: bool,
    /// When it was submitted, first scheduled, and sampled its first token.
    pub submitted: Instant,
    pub scheduled: Option<Instant>,
    pub first_token: Option<Instant>,
    /// The distributions the draft model drew this step's proposals from
    /// (one per speculative token; empty when they were not drawn, as
    /// greedy or prompt-lookup proposals are not).
    pub draft_q: Vec<Dist>,
}

impl Gen {
    /// Its phases' durations when it ends at `end`.
    pub(crate) fn timings(&self, end: Instant) -> Timings {
        let scheduled = self.scheduled.unwrap_or(self.submitted);
        let first = self.first_token.unwrap_or(end);
        Timings {
            queued: scheduled.saturating_duration_since(self.submitted),
            prefill: first.saturating_duration_since(scheduled),
            decode: end.saturating_duration_since(first),
        }
    }
}

/// Rows of prompt positions converted to logits at once (bounds the memory
/// of `prompt_logprobs` on a long prefill chunk).
pub(crate) const PROMPT_LP_ROWS: usize = 64;

/// Sends the token's log-probabilities first, when the request asked.
pub(crate) fn send_logprobs(g: &Gen, row: &[f32], tok: u32) {
    if let Some(k) = g.req.logprobs {
        let lp = crate::sampler::logprobs(row, tok, k.min(crate::MAX_TOP_LOGPROBS) as usize);
        let _ = g.events.send(Event::Logprobs(lp));
    }
}

/// Samples the next token of `g` from its logits `row`, within its
/// constraint if it has one.
pub(crate) fn sample_next(g: &mut Gen, row: &[f32]) -> Result<u32, EngineError> {
    let constrained = g.req.constraint.as_ref().is_some_and(|c| !c.is_free());
    let (Some(c), true) = (g.req.constraint.as_mut(), constrained) else {
        // Free text (or a reasoning section before its structure applies).
        let suppress = suppressed(g);
        let tok = g.sampler.sample(row, &suppress);
        if let Some(c) = g.req.constraint.as_mut() {
            c.consume(tok)
                .map_err(|e| EngineError::Step(format!("constraint: {e}")))?;
        }
        return Ok(tok);
    };
    let mut masked = row.to_vec();
    c.mask(&mut masked)
        .map_err(|e| EngineError::Step(format!("constraint: {e}")))?;
    let tok = g.sampler.sample(&masked, &[]);
    c.consume(tok)
        .map_err(|e| EngineError::Step(format!("constraint: {e}")))?;
    Ok(tok)
}

/// Samples the next token of `g` from its logits `row` given a proposal
/// `x` the draft drew from `q`, by the speculative-sampling rule
/// ([`Sampler::sample_speculative`]); a sequence under a constraint that
/// is not free samples as [`sample_next`] does (and keeps `x` only when it
/// draws it). Returns the token and whether it is `x`.
fn sample_proposed(g: &mut Gen, row: &[f32], x: u32, q: &Dist) -> Result<(u32, bool), EngineError> {
    if g.req.constraint.as_ref().is_some_and(|c| !c.is_free()) {
        let tok = sample_next(g, row)?;
        return Ok((tok, tok == x));
    }
    let suppress = suppressed(g);
    let (tok, kept) = g.sampler.sample_speculative(row, &suppress, x, q);
    if let Some(c) = g.req.constraint.as_mut() {
        c.consume(tok)
            .map_err(|e| EngineError::Step(format!("constraint: {e}")))?;
    }
    Ok((tok, kept))
}

/// What the device sampler needs to pick `g`'s next token from row `row`
/// of the step's logits: the same rules as [`sample_next`] (its
/// constraint's mask, or the tokens suppressed before min_tokens).
pub(crate) fn device_plan(
    g: &mut Gen,
    row: i64,
    vocab: usize,
) -> Result<crate::sampler_device::RowPick, EngineError> {
    let constrained = g.req.constraint.as_ref().is_some_and(|c| !c.is_free());
    if let (Some(c), true) = (g.req.constraint.as_mut(), constrained) {
        let mut mask = vec![0f32; vocab];
        c.mask(&mut mask)
            .map_err(|e| EngineError::Step(format!("constraint: {e}")))?;
        return Ok(g.sampler.device_plan(row, &[], Some(mask), vocab));
    }
    let suppress = suppressed(g);
    Ok(g.sampler.device_plan(row, &suppress, None, vocab))
}

/// Takes the token the device sampler picked for `g` (its penalties'
/// counts and its constraint follow it).
pub(crate) fn take_device_pick(g: &mut Gen, tok: u32) -> Result<(), EngineError> {
    g.sampler.record(tok);
    if let Some(c) = g.req.constraint.as_mut() {
        c.consume(tok)
            .map_err(|e| EngineError::Step(format!("constraint: {e}")))?;
    }
    Ok(())
}

/// Tokens that may not be sampled yet: EOS and stop ids before min_tokens.
fn suppressed(g: &Gen) -> Vec<u32> {
    if g.generated >= g.req.min_tokens {
        return Vec::new();
    }
    g.eos.iter().chain(&g.req.stop_token_ids).copied().collect()
}

/// Hands a sampled token to its sequence. Returns how it ended, if it did
/// (`None` inside: the client is gone, nothing to report).
pub(crate) fn take_token(
    g: &mut Gen,
    s: &mut SeqState,
    tok: u32,
    max_len: usize,
    stats: &mut EngineStats,
) -> Option<Option<FinishReason>> {
    if g.generated == 0 {
        g.first_token = Some(Instant::now());
        let cached_tokens = s.cached_tokens as u32;
        let started = g.scheduled.unwrap_or_else(std::time::Instant::now);
        let _ = g.events.send(Event::Prefilled {
            cached_tokens,
            started,
        });
    }
    g.generated += 1;
    stats.generated_tokens_total += 1;
    if g.events.send(Event::Token(tok)).is_err() {
        return Some(None);
    }
    let stop = (!g.req.ignore_eos && g.eos.contains(&tok)) || g.req.stop_token_ids.contains(&tok);
    if stop {
        Some(Some(FinishReason::Stop(tok)))
    } else if g.generated >= g.req.max_tokens || s.tokens.len() + 1 >= max_len {
        Some(Some(FinishReason::Length))
    } else {
        s.tokens.push(tok);
        None
    }
}

/// Checks a sequence's speculative tokens (its last `s.drafts` tokens, all
/// computed this step) against what it samples from `rows`: the logits
/// after its last real token, then after each speculative one. Row after
/// row it samples a token and keeps it; the proposal at that row counts
/// as accepted when the token is the proposal, and the next row is used,
/// else the rest are dropped (the last row adds one more token when all
/// were accepted). A proposal that the draft model drew from a
/// distribution (`g.draft_q`) is checked by the speculative-sampling rule;
/// any other (a point: prompt lookup, a greedy draft) by sampling the row
/// as plain decoding would and comparing. The keys and values of accepted
/// proposals stay computed; the rest are dropped. Returns how the sequence
/// ended, if it did.
pub(crate) fn verify(
    g: &mut Gen,
    s: &mut SeqState,
    rows: &[f32],
    vocab: usize,
    max_len: usize,
    stats: &mut EngineStats,
) -> Result<Option<Option<FinishReason>>, EngineError> {
    let drafts = s.tokens.split_off(s.tokens.len() - s.drafts);
    s.drafts = 0;
    let q = std::mem::take(&mut g.draft_q);
    let drawn = q.len() == drafts.len();
    let real = s.tokens.len();
    let mut accepted = 0;
    let mut ended = None;
    for (j, row) in rows.chunks_exact(vocab).enumerate() {
        let (tok, kept) = match drafts.get(j) {
            Some(&x) if drawn => sample_proposed(g, row, x, &q[j])?,
            Some(&x) => {
                let tok = sample_next(g, row)?;
                (tok, tok == x)
            }
            None => (sample_next(g, row)?, false),
        };
        send_logprobs(g, row, tok);
        if let Some(reason) = take_token(g, s, tok, max_len, stats) {
            ended = Some(reason);
            break;
        }
        if !kept {
            break;
        }
        accepted += 1;
    }
    stats.spec_proposed_tokens_total += drafts.len() as u64;
    stats.spec_accepted_tokens_total += accepted as u64;
    if !drafts.is_empty() {
        let _ = g.events.send(Event::Speculated {
            proposed: drafts.len() as u32,
            accepted: accepted as u32,
        });
    }
    // Computed: the real tokens, then the proposals that were generated.
    s.computed = real + accepted;
    Ok(ended)
}
