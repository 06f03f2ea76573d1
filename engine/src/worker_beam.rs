//! The engine thread's side of beam search: a request's beams are
//! sequences like any other (scheduled, batched, preempted), grouped by a
//! [`Group`] that advances once every live beam has its next-token logits.
//!
//! Beams share KV blocks: a beam chosen by several continuations is forked
//! (the fork takes a reference to each of its blocks; the scheduler copies
//! the partial last block on its first write, as for `n > 1`), a beam no
//! continuation chose is freed. The prompt's blocks stay shared by all.
//! The `n` best hypotheses are sent at the end, one choice each: its
//! tokens, its [`Event::Beam`] score, then `Finished`.

use std::collections::HashMap;
use std::time::Instant;

use tokio::sync::mpsc;

use super::Worker;
use crate::beam::{BeamSearch, Search, log_softmax};
use crate::scheduler::SeqState;
use crate::{EngineError, Event, FinishReason, GenerateRequest, Timings, Usage};

/// One request's beam search.
pub(super) struct Group {
    search: Search,
    /// One per returned hypothesis, best first.
    events: Vec<mpsc::UnboundedSender<Event>>,
    /// Log-probabilities of beams computed this round, by sequence.
    pending: HashMap<u64, Vec<f32>>,
    prompt_len: u32,
    /// Not started yet: counted as waiting by admission.
    pub queued: bool,
    submitted: Instant,
    pub scheduled: Option<Instant>,
    first_token: Option<Instant>,
    cached_tokens: u32,
}

impl Group {
    pub fn new(
        params: BeamSearch,
        req: &GenerateRequest,
        eos: &[u32],
        events: Vec<mpsc::UnboundedSender<Event>>,
        submitted: Instant,
        seq: u64,
    ) -> Self {
        let mut ends: Vec<u32> = eos.to_vec();
        for &t in &req.stop_token_ids {
            if !ends.contains(&t) {
                ends.push(t);
            }
        }
        Self {
            search: Search::new(params, ends, req.max_tokens, seq),
            events,
            pending: HashMap::new(),
            prompt_len: req.prompt.len() as u32,
            queued: true,
            submitted,
            scheduled: None,
            first_token: None,
            cached_tokens: 0,
        }
    }

    /// Every client of the group went away.
    pub fn abandoned(&self) -> bool {
        self.events.iter().all(|e| e.is_closed())
    }

    fn timings(&self, end: Instant) -> Timings {
        let scheduled = self.scheduled.unwrap_or(self.submitted);
        let first = self.first_token.unwrap_or(end);
        Timings {
            queued: scheduled.saturating_duration_since(self.submitted),
            prefill: first.saturating_duration_since(scheduled),
            decode: end.saturating_duration_since(first),
        }
    }
}

impl Worker {
    /// Finds a sequence, running or waiting.
    fn seq_mut(&mut self, id: u64) -> Option<&mut SeqState> {
        self.running
            .iter_mut()
            .chain(self.waiting.iter_mut())
            .find(|s| s.id == id)
    }

    /// Removes a beam's sequence and frees its blocks.
    fn drop_beam(&mut self, id: u64) {
        self.beam_of.remove(&id);
        for list in [&mut self.running, &mut self.waiting] {
            if let Some(i) = list.iter().position(|s| s.id == id) {
                let mut s = list.swap_remove(i);
                self.sched.free(&mut s);
            }
        }
    }

    /// Keeps the log-probabilities a beam's step computed. Returns its
    /// group when it is a beam.
    pub(super) fn beam_row(&mut self, seq: u64, logits: &[f32]) -> Option<u64> {
        let gid = *self.beam_of.get(&seq)?;
        let cached = self
            .running
            .iter()
            .find(|s| s.id == seq)
            .map_or(0, |s| s.cached_tokens as u32);
        let g = self.groups.get_mut(&gid)?;
        if g.search.step == 0 {
            g.cached_tokens = cached;
        }
        g.pending.insert(seq, log_softmax(logits));
        Some(gid)
    }

    /// Advances each group whose live beams all have their log-probabilities.
    pub(super) fn beam_steps(&mut self, mut gids: Vec<u64>) {
        gids.sort_unstable();
        gids.dedup();
        for gid in gids {
            let Some(g) = self.groups.get_mut(&gid) else {
                continue;
            };
            if !g
                .search
                .beams
                .iter()
                .all(|b| g.pending.contains_key(&b.seq))
            {
                continue;
            }
            g.first_token.get_or_insert_with(Instant::now);
            let rows: Vec<Vec<f32>> = g
                .search
                .beams
                .iter()
                .filter_map(|b| g.pending.remove(&b.seq))
                .collect();
            let refs: Vec<&[f32]> = rows.iter().map(Vec::as_slice).collect();
            let next = g.search.step(&refs);
            let old: Vec<u64> = g.search.beams.iter().map(|b| b.seq).collect();
            match next {
                None => self.finish_group(gid),
                Some(next) => {
                    // A parent's first continuation keeps its sequence; the
                    // others fork it (before the first takes its token).
                    let mut used = vec![false; old.len()];
                    let mut seqs = Vec::with_capacity(next.len());
                    for n in &next {
                        if !used[n.parent] {
                            used[n.parent] = true;
                            seqs.push(old[n.parent]);
                        } else {
                            seqs.push(self.fork_beam(gid, old[n.parent]));
                        }
                    }
                    for (i, &seq) in old.iter().enumerate() {
                        if !used[i] {
                            self.drop_beam(seq);
                        }
                    }
                    for (n, &seq) in next.iter().zip(&seqs) {
                        if let Some(s) = self.seq_mut(seq) {
                            s.tokens.push(n.token);
                        }
                    }
                    self.stats.generated_tokens_total += next.len() as u64;
                    if let Some(g) = self.groups.get_mut(&gid) {
                        g.search.advance(&next, &seqs);
                    }
                }
            }
        }
    }

    /// A new beam sharing every block of beam `parent` (in the same list).
    fn fork_beam(&mut self, gid: u64, parent: u64) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.beam_of.insert(id, gid);
        let in_running = self.running.iter().any(|s| s.id == parent);
        let Some(p) = self
            .running
            .iter()
            .chain(self.waiting.iter())
            .find(|s| s.id == parent)
        else {
            return id;
        };
        for &b in &p.blocks {
            self.sched.alloc.retain(b);
        }
        let child = SeqState {
            id,
            order: p.order,
            priority: p.priority,
            tenant: p.tenant.clone(),
            weight: p.weight,
            tokens: p.tokens.clone(),
            computed: p.computed,
            blocks: p.blocks.clone(),
            hashes: p.hashes.clone(),
            salt: p.salt.clone(),
            kv_regime: p.kv_regime,
            cached_tokens: p.cached_tokens,
            admitted_once: true,
            drafts: 0,
        };
        match in_running {
            true => self.running.push(child),
            false => self.waiting.push(child),
        }
        id
    }

    /// Ends a group: frees its beams and sends each client its hypothesis.
    fn finish_group(&mut self, gid: u64) {
        let Some(g) = self.groups.remove(&gid) else {
            return;
        };
        for b in &g.search.beams {
            self.drop_beam(b.seq);
        }
        if g.queued {
            self.admission.leave(1);
        }
        let end = Instant::now();
        let started = g.scheduled.unwrap_or(g.submitted);
        let timings = g.timings(end);
        let mut hyps = g.search.finished.iter();
        for events in &g.events {
            let Some(h) = hyps.next() else {
                let _ = events.send(Event::Failed(EngineError::Step(
                    "beam search ended with fewer hypotheses than choices".into(),
                )));
                continue;
            };
            let _ = events.send(Event::Prefilled {
                cached_tokens: g.cached_tokens,
                started,
            });
            for &t in &h.tokens {
                let _ = events.send(Event::Token(t));
            }
            let _ = events.send(Event::Beam {
                score: h.score,
                cumulative_logprob: h.sum_logprobs,
            });
            let usage = Usage {
                prompt_tokens: g.prompt_len,
                completion_tokens: h.tokens.len() as u32,
                cached_tokens: g.cached_tokens,
            };
            let reason: FinishReason = h.reason;
            let _ = events.send(Event::Finished {
                reason,
                usage,
                timings,
            });
        }
    }

    /// Whether a beam's sequence should be reaped (its group is gone or
    /// abandoned); None when `seq` is no beam. Forgets an abandoned group.
    pub(super) fn beam_reap(&mut self, seq: u64) -> Option<bool> {
        let gid = *self.beam_of.get(&seq)?;
        let gone = self.groups.get(&gid).is_none_or(Group::abandoned);
        if gone {
            self.beam_of.remove(&seq);
            if self.groups.remove(&gid).is_some_and(|g| g.queued) {
                self.admission.leave(1);
            }
        }
        Some(gone)
    }

    /// Fails the group of beam `seq`; its other beams are reaped next step.
    /// False when `seq` is no beam.
    pub(super) fn fail_beam(&mut self, seq: u64, e: &EngineError) -> bool {
        let Some(gid) = self.beam_of.remove(&seq) else {
            return false;
        };
        if let Some(g) = self.groups.remove(&gid) {
            if g.queued {
                self.admission.leave(1);
            }
            for events in &g.events {
                let _ = events.send(Event::Failed(EngineError::Step(e.to_string())));
            }
        }
        true
    }
}

impl Worker {
    /// A group advances all or nothing: when the scheduler preempted one of
    /// its beams, every beam of the group goes back to wait (its blocks
    /// freed; its full blocks stay in the prefix cache, so the beams share
    /// them again on resuming), and their runs leave the plan. When nothing
    /// can run because beams hold blocks waiting for siblings that cannot
    /// be admitted, the newest group is preempted the same way.
    /// Returns whether it preempted a group because nothing could run.
    pub(super) fn preempt_groups(&mut self, plan: &mut crate::scheduler::Plan) -> bool {
        let mut gids: Vec<u64> = plan
            .preempted
            .iter()
            .filter_map(|id| self.beam_of.get(id).copied())
            .collect();
        let stuck = plan.runs.is_empty();
        if stuck {
            // Every group holding blocks but the oldest.
            let mut held: Vec<u64> = self
                .running
                .iter()
                .filter_map(|s| self.beam_of.get(&s.id).copied())
                .collect();
            held.sort_unstable();
            held.dedup();
            if held.len() == 1
                && !self
                    .waiting
                    .iter()
                    .any(|s| self.beam_of.contains_key(&s.id))
            {
                held.clear();
            }
            gids.extend(held.into_iter().skip(1));
        }
        if gids.is_empty() {
            return false;
        }
        let mut moved = Vec::new();
        let mut i = 0;
        while i < self.running.len() {
            let s = &self.running[i];
            if self.beam_of.get(&s.id).is_some_and(|g| gids.contains(g)) {
                let mut s = self.running.swap_remove(i);
                self.sched.free(&mut s);
                self.sched.stats.preemptions += 1;
                moved.push(s.id);
                self.waiting.push(s);
            } else {
                i += 1;
            }
        }
        plan.runs.retain(|(id, _)| !moved.contains(id));
        stuck && !moved.is_empty()
    }
}
