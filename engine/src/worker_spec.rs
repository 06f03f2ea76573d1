//! The engine thread's side of speculation: proposals from prompt lookup
//! or the draft model appended to decoding sequences before a step, and
//! trimmed to what the step's plan computes.

use std::collections::HashMap;

use super::Worker;
use crate::EngineError;
use crate::sequence::Gen;

impl Worker {
    /// Gives each decoding sequence that speculates the tokens prompt
    /// lookup or the draft model proposes for it, at the end of its tokens
    /// (`drafts`), to be computed in the coming step beside its last token.
    pub(super) fn propose_drafts(&mut self) -> Result<(), EngineError> {
        let max_len = self.model.config().max_position_embeddings as usize;
        // Distributions of proposals drawn for an earlier step are stale.
        for g in self.gens.values_mut() {
            g.draft_q.clear();
        }
        // (index in running, tokens to propose) of the draft's sequences.
        let mut by_draft = Vec::new();
        for (i, s) in self.running.iter_mut().enumerate() {
            let Some(g) = self.gens.get(&s.id) else {
                continue;
            };
            let num_tokens = match (g.req.speculation, g.req.draft) {
                (Some(spec), _) => spec.num_tokens,
                (None, Some(d)) => d.num_tokens,
                (None, None) => continue,
            };
            let decoding = s.drafts == 0 && s.computed + 1 == s.tokens.len();
            if !decoding || g.generated == 0 || !g.forks.is_empty() {
                continue;
            }
            // No more than can still be generated: take_token ends the
            // sequence at max_tokens, or once it would reach max_len.
            let left = (g.req.max_tokens.saturating_sub(g.generated + 1) as usize)
                .min(max_len.saturating_sub(s.tokens.len() + 1));
            let mut k = (num_tokens as usize).min(left);
            // Never across a KV-regime boundary (longrope).
            while k > 0 && self.model.kv_regime(s.tokens.len() + k) != s.kv_regime {
                k -= 1;
            }
            let Some(spec) = g.req.speculation else {
                if k > 0 {
                    by_draft.push((i, k));
                }
                continue;
            };
            let drafts = crate::speculate::lookup_predicted(
                &g.req.predicted,
                &s.tokens,
                spec.min_ngram as usize,
                spec.max_ngram as usize,
                k,
            );
            s.drafts = drafts.len();
            s.tokens.extend(drafts);
        }
        let Some(draft) = self.draft.as_mut() else {
            return Ok(());
        };
        // The draft's blocks of sequences not proposing now are freed.
        let proposing: HashMap<u64, usize> = by_draft
            .iter()
            .map(|&(i, k)| (self.running[i].id, k))
            .collect();
        draft.retain(|id| proposing.contains_key(&id));
        if by_draft.is_empty() {
            return Ok(());
        }
        let mut gens: HashMap<u64, &mut Gen> = self
            .gens
            .iter_mut()
            .filter(|(id, _)| proposing.contains_key(id))
            .map(|(&id, g)| (id, g))
            .collect();
        let mut wants: Vec<crate::draft::Want<'_>> = by_draft
            .iter()
            .map(|&(i, k)| {
                let s = &self.running[i];
                let g = gens.remove(&s.id).expect("a generating sequence");
                let d = g.req.draft.expect("speculates with the draft");
                // A sampled request without a constraint has proposals
                // drawn from its sampler's rules over the draft's logits
                // (checked by the speculative-sampling rule); the others
                // get the draft's argmax (compared with their draws).
                let drawn = !g.sampler.is_greedy() && g.req.constraint.is_none();
                let suppress_rows = g.req.min_tokens.saturating_sub(g.generated) as usize;
                let suppress = if suppress_rows > 0 {
                    g.eos.iter().chain(&g.req.stop_token_ids).copied().collect()
                } else {
                    Vec::new()
                };
                crate::draft::Want {
                    id: s.id,
                    tokens: &s.tokens,
                    k,
                    threshold: d.confidence_threshold,
                    drawn,
                    suppress,
                    suppress_rows,
                    sampler: &mut g.sampler,
                    q: &mut g.draft_q,
                }
            })
            .collect();
        let proposals = draft.propose(&mut wants)?;
        drop(wants);
        for ((i, _), p) in by_draft.into_iter().zip(proposals) {
            let s = &mut self.running[i];
            s.drafts = p.len();
            s.tokens.extend(p);
        }
        Ok(())
    }

    /// Keeps the speculative tokens that the plan computes: all of them
    /// when the sequence runs whole, the first few when the token budget
    /// cut its run, none when it does not run this step.
    pub(super) fn fit_drafts(&mut self, runs: &[(u64, usize)]) {
        let n_of: HashMap<u64, usize> = runs.iter().copied().collect();
        for s in &mut self.running {
            if s.drafts == 0 {
                continue;
            }
            let real = s.tokens.len() - s.drafts;
            let covered = n_of
                .get(&s.id)
                .map_or(0, |&n| (s.computed + n).saturating_sub(real));
            if covered < s.drafts {
                s.tokens.truncate(real + covered);
                s.drafts = covered;
                if let Some(g) = self.gens.get_mut(&s.id) {
                    g.draft_q.truncate(covered);
                }
            }
        }
    }
}
