//! The engine thread's side of speculation: proposals from prompt lookup
//! or the draft model appended to decoding sequences before a step, and
//! trimmed to what the step's plan computes.

use std::collections::HashMap;

use super::Worker;
use crate::EngineError;

impl Worker {
    /// Gives each decoding sequence that speculates the tokens prompt
    /// lookup or the draft model proposes for it, at the end of its tokens
    /// (`drafts`), to be computed in the coming step beside its last token.
    pub(super) fn propose_drafts(&mut self) -> Result<(), EngineError> {
        let max_len = self.model.config().max_position_embeddings as usize;
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
        let proposing: std::collections::HashSet<u64> =
            by_draft.iter().map(|&(i, _)| self.running[i].id).collect();
        draft.retain(|id| proposing.contains(&id));
        if by_draft.is_empty() {
            return Ok(());
        }
        let wants: Vec<crate::draft::Want<'_>> = by_draft
            .iter()
            .map(|&(i, k)| {
                let s = &self.running[i];
                let d = self.gens[&s.id]
                    .req
                    .draft
                    .expect("speculates with the draft");
                crate::draft::Want {
                    id: s.id,
                    tokens: &s.tokens,
                    k,
                    threshold: d.confidence_threshold,
                    bias: &self.gens[&s.id].req.sampling.logit_bias,
                }
            })
            .collect();
        let proposals = draft.propose(&wants)?;
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
            }
        }
    }
}
