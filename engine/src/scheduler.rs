//! The iteration-level scheduler: each step, it decides which sequences run
//! how many tokens, within a token budget and a running limit, and keeps
//! their KV blocks (allocation, prefix reuse, copy-on-write, preemption).
//! It never touches tensors: the worker executes its plan.
//!
//! Order: running sequences first — decodes (one token each), then prefill
//! chunks, each group by priority, then age — so a long prompt being
//! prefilled never stalls streams already generating; then waiting requests
//! are admitted while budget and blocks last: the tenant furthest below its
//! fair share first (weighted fair queuing, see `fair`), then by priority
//! and age within the tenant. When blocks run out, a running sequence of the
//! tenant furthest over its share is preempted (within it, the
//! lowest-priority, newest): its blocks are released and it waits again, to
//! be resumed by recomputing its tokens (cheaply, when its full blocks are
//! still in the prefix cache).

use std::cmp::Ordering;
use std::sync::Arc;

use crate::blocks::{BlockAllocator, BlockId, block_hash};
use crate::fair::Fair;

/// What the scheduler needs to know of a sequence.
pub(crate) struct SeqState {
    pub id: u64,
    /// Age for ordering (admission, preemption): the id, but a beam's is
    /// its group's, so a group's beams rank together.
    pub order: u64,
    pub priority: i32,
    /// The tenant whose share the sequence's tokens count against.
    pub tenant: Arc<str>,
    /// The tenant's weight (its share relative to other tenants'; >= 1).
    pub weight: u32,
    /// Prompt, then generated tokens.
    pub tokens: Vec<u32>,
    /// Leading tokens whose keys and values are in the pool.
    pub computed: usize,
    pub blocks: Vec<BlockId>,
    /// Hashes of the leading full blocks already indexed for reuse.
    pub hashes: Vec<u64>,
    pub salt: String,
    /// The model's KV regime for the sequence's length (`Model::kv_regime`);
    /// part of `salt` when not 0.
    pub kv_regime: u8,
    /// Prompt tokens found in the prefix cache at first admission.
    pub cached_tokens: usize,
    pub admitted_once: bool,
    /// Speculative tokens at the end of `tokens` (proposed for this step,
    /// not generated yet; see `speculate`).
    pub drafts: usize,
}

impl SeqState {
    pub fn new(id: u64, priority: i32, prompt: Vec<u32>, salt: String) -> Self {
        Self {
            id,
            order: id,
            priority,
            tenant: Arc::from(""),
            weight: 1,
            tokens: prompt,
            computed: 0,
            blocks: Vec::new(),
            hashes: Vec::new(),
            salt,
            kv_regime: 0,
            cached_tokens: 0,
            admitted_once: false,
            drafts: 0,
        }
    }

    /// Drops the speculative tokens at the end of `tokens`.
    pub fn strip_drafts(&mut self) {
        let real = self.tokens.len() - self.drafts;
        self.tokens.truncate(real);
        self.drafts = 0;
    }

    /// The same sequence, counted against `tenant`'s share at `weight`.
    pub fn for_tenant(mut self, tenant: Arc<str>, weight: u32) -> Self {
        self.tenant = tenant;
        self.weight = weight.max(1);
        self
    }
}

/// Counters the scheduler keeps.
#[derive(Debug, Clone, Default)]
pub(crate) struct SchedStats {
    pub prefix_query_tokens: u64,
    pub prefix_hit_tokens: u64,
    pub preemptions: u64,
}

pub(crate) struct Scheduler {
    pub alloc: BlockAllocator,
    pub block_size: usize,
    pub max_running: usize,
    pub token_budget: usize,
    pub stats: SchedStats,
    fair: Fair,
}

/// One step's plan.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Plan {
    /// (sequence id, tokens to run from `computed`), in running order.
    pub runs: Vec<(u64, usize)>,
    /// Block copies (src, dst) to make before the forward (copy-on-write).
    pub copies: Vec<(BlockId, BlockId)>,
    /// Sequences moved from running back to waiting.
    pub preempted: Vec<u64>,
}

fn order_key(s: &SeqState) -> (i64, u64) {
    (-(s.priority as i64), s.order)
}

/// Admission order: the tenant furthest below its share first, then by
/// priority and age within it. Preemption takes the greatest.
fn fair_order(fair: &Fair, a: &SeqState, b: &SeqState) -> Ordering {
    fair.vtime(a)
        .total_cmp(&fair.vtime(b))
        .then_with(|| order_key(a).cmp(&order_key(b)))
}

impl Scheduler {
    pub fn new(
        num_blocks: u32,
        block_size: usize,
        max_running: usize,
        token_budget: usize,
    ) -> Self {
        Self {
            alloc: BlockAllocator::new(num_blocks),
            block_size,
            max_running,
            token_budget: token_budget.max(1),
            stats: SchedStats::default(),
            fair: Fair::default(),
        }
    }

    /// Blocks a sequence of `tokens` tokens needs.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// Releases every block of a sequence (finished, cancelled or preempted).
    pub fn free(&mut self, s: &mut SeqState) {
        for b in s.blocks.drain(..) {
            self.alloc.release(b);
        }
        s.hashes.clear();
        s.computed = 0;
    }

    /// Gives `s` blocks for its first `upto` tokens, making the block that
    /// position `s.computed` falls in private first. False when out of blocks.
    fn ensure_blocks(
        &mut self,
        s: &mut SeqState,
        upto: usize,
        copies: &mut Vec<(BlockId, BlockId)>,
    ) -> bool {
        let first = s.computed / self.block_size;
        if !s.computed.is_multiple_of(self.block_size)
            && let Some(&shared) = s.blocks.get(first)
            && self.alloc.refcount(shared) > 1
        {
            let Some(own) = self.alloc.allocate() else {
                return false;
            };
            copies.push((shared, own));
            self.alloc.release(shared);
            s.blocks[first] = own;
        }
        while s.blocks.len() < self.blocks_for(upto) {
            match self.alloc.allocate() {
                Some(b) => s.blocks.push(b),
                None => return false,
            }
        }
        true
    }

    /// Releases the blocks of `s` past those its tokens need (after
    /// speculative tokens were dropped).
    pub fn trim_blocks(&mut self, s: &mut SeqState) {
        let keep = self.blocks_for(s.tokens.len()).max(s.hashes.len());
        while s.blocks.len() > keep {
            if let Some(b) = s.blocks.pop() {
                self.alloc.release(b);
            }
        }
    }

    /// Takes the longest cached prefix of a never-run sequence (leaving at
    /// least its last token to compute, whose logits are needed).
    fn match_prefix(&mut self, s: &mut SeqState) {
        let reusable = (s.tokens.len() - 1) / self.block_size;
        let mut prev = None;
        for b in 0..reusable {
            let chunk = &s.tokens[b * self.block_size..(b + 1) * self.block_size];
            let h = block_hash(prev, chunk, &s.salt);
            match self.alloc.lookup(h) {
                Some(blk) => {
                    s.blocks.push(blk);
                    s.hashes.push(h);
                    prev = Some(h);
                }
                None => break,
            }
        }
        s.computed = s.blocks.len() * self.block_size;
        if !s.admitted_once {
            s.admitted_once = true;
            s.cached_tokens = s.computed;
            self.stats.prefix_query_tokens += s.tokens.len() as u64;
            self.stats.prefix_hit_tokens += s.computed as u64;
        }
    }

    /// Indexes the full blocks of `s` computed since the last call.
    pub fn register_full_blocks(&mut self, s: &mut SeqState) {
        let full = s.computed / self.block_size;
        while s.hashes.len() < full {
            let b = s.hashes.len();
            let chunk = &s.tokens[b * self.block_size..(b + 1) * self.block_size];
            let h = block_hash(s.hashes.last().copied(), chunk, &s.salt);
            self.alloc.register(s.blocks[b], h);
            s.hashes.push(h);
        }
    }

    /// Plans one step. Moves admitted sequences from `waiting` to `running`
    /// and preempted ones back.
    pub fn schedule(&mut self, running: &mut Vec<SeqState>, waiting: &mut Vec<SeqState>) -> Plan {
        let mut plan = Plan::default();
        let mut budget = self.token_budget;
        self.fair.begin(running, waiting);
        // Decodes (one token each) first, so a long prompt being prefilled in
        // chunks never stalls the streams already generating; then prefill
        // chunks. Within each, by priority then age.
        running.sort_by_key(|s| (s.tokens.len() - s.computed > 1, order_key(s)));
        let mut i = 0;
        while i < running.len() && budget > 0 {
            let need = running[i].tokens.len() - running[i].computed;
            if need == 0 {
                // A beam waiting for the rest of its group's step.
                i += 1;
                continue;
            }
            let n = need.min(budget);
            loop {
                let s = &mut running[i];
                let upto = s.computed + n;
                if self.ensure_blocks(s, upto, &mut plan.copies) {
                    plan.runs.push((s.id, n));
                    self.fair.charge(s, n);
                    budget -= n;
                    i += 1;
                    break;
                }
                // Out of blocks: preempt a sequence not yet planned of the
                // tenant most over its share (within it, the lowest-priority,
                // newest), which is this one when none ranks below it.
                let fair = &self.fair;
                let victim = (i..running.len())
                    .max_by(|&a, &b| fair_order(fair, &running[a], &running[b]))
                    .unwrap_or(i);
                let mut v = running.remove(victim);
                self.free(&mut v);
                v.strip_drafts();
                self.stats.preemptions += 1;
                plan.preempted.push(v.id);
                waiting.push(v);
                if victim == i {
                    break;
                }
            }
        }
        while budget > 0 && running.len() < self.max_running && !waiting.is_empty() {
            let fair = &self.fair;
            let next = (0..waiting.len())
                .min_by(|&a, &b| fair_order(fair, &waiting[a], &waiting[b]))
                .unwrap_or(0);
            let mut s = waiting.remove(next);
            if s.blocks.is_empty() {
                self.match_prefix(&mut s);
            }
            let n = (s.tokens.len() - s.computed).min(budget);
            let upto = s.computed + n;
            if !self.ensure_blocks(&mut s, upto, &mut plan.copies) {
                self.free(&mut s);
                waiting.insert(0, s);
                break;
            }
            plan.runs.push((s.id, n));
            self.fair.charge(&s, n);
            budget -= n;
            running.push(s);
        }
        self.fair.end(waiting);
        plan
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(id: u64, priority: i32, len: usize) -> SeqState {
        SeqState::new(
            id,
            priority,
            (0..len as u32).map(|t| t + 100 * id as u32).collect(),
            String::new(),
        )
    }

    /// Applies a plan as the worker would: mark tokens computed, index full
    /// blocks, and append one generated token to sequences that caught up.
    fn execute(s: &mut Scheduler, running: &mut [SeqState], plan: &Plan) {
        for &(id, n) in &plan.runs {
            let q = running
                .iter_mut()
                .find(|q| q.id == id)
                .expect("planned seq runs");
            q.computed += n;
            s.register_full_blocks(q);
            if q.computed == q.tokens.len() {
                q.tokens.push(7);
            }
        }
    }

    #[test]
    fn chunked_prefill_respects_the_token_budget_and_decodes_go_first() {
        let mut s = Scheduler::new(64, 4, 8, 10);
        let (mut run, mut wait) = (vec![], vec![seq(1, 0, 25)]);
        let p = s.schedule(&mut run, &mut wait);
        assert_eq!(p.runs, vec![(1, 10)]);
        execute(&mut s, &mut run, &p);
        wait.push(seq(2, 0, 3));
        let p = s.schedule(&mut run, &mut wait);
        assert_eq!(
            p.runs,
            vec![(1, 10)],
            "the running prefill takes the budget first"
        );
        execute(&mut s, &mut run, &p);
        let p = s.schedule(&mut run, &mut wait);
        assert_eq!(
            p.runs,
            vec![(1, 5), (2, 3)],
            "the rest of the budget admits the next request"
        );
        execute(&mut s, &mut run, &p);
        let p = s.schedule(&mut run, &mut wait);
        assert_eq!(p.runs, vec![(1, 1), (2, 1)], "both decode");
    }

    #[test]
    fn decodes_go_before_an_older_prefill() {
        let mut s = Scheduler::new(64, 4, 8, 6);
        let (mut run, mut wait) = (vec![], vec![seq(1, 0, 2)]);
        let p = s.schedule(&mut run, &mut wait);
        execute(&mut s, &mut run, &p);
        // An older sequence mid-prefill (id 0) and a decoding one (id 1).
        let mut old = seq(0, 0, 30);
        old.admitted_once = true;
        run.push(old);
        let p = s.schedule(&mut run, &mut wait);
        assert_eq!(p.runs, vec![(1, 1), (0, 5)]);
    }

    #[test]
    fn prefix_blocks_are_reused_and_counted() {
        let mut s = Scheduler::new(16, 4, 8, 100);
        let (mut run, mut wait) = (vec![], vec![seq(1, 0, 10)]);
        let p = s.schedule(&mut run, &mut wait);
        execute(&mut s, &mut run, &p);
        let mut done = run.pop().expect("seq 1");
        s.free(&mut done);
        // Same first 9 tokens (two full blocks of 4), different tail.
        let mut again = seq(1, 0, 10);
        again.id = 2;
        again.tokens[9] = 999;
        wait.push(again);
        let p = s.schedule(&mut run, &mut wait);
        assert_eq!(p.runs, vec![(2, 2)], "8 of 10 tokens come from the cache");
        assert_eq!(run[0].cached_tokens, 8);
        assert_eq!(
            (s.stats.prefix_query_tokens, s.stats.prefix_hit_tokens),
            (20, 8)
        );
        let mut salted = seq(1, 0, 10);
        salted.id = 3;
        salted.salt = "tenant".into();
        wait.push(salted);
        let p = s.schedule(&mut run, &mut wait);
        assert!(
            p.runs.contains(&(3, 10)),
            "another salt must not hit: {p:?}"
        );
    }

    #[test]
    fn out_of_blocks_preempts_the_lowest_priority_newest() {
        // 6 blocks of 4 tokens; three sequences of 8 tokens need 2 blocks each.
        let mut s = Scheduler::new(6, 4, 8, 100);
        let mut run = vec![];
        let mut wait = vec![seq(1, 0, 8), seq(2, 5, 8), seq(3, 0, 8)];
        let p = s.schedule(&mut run, &mut wait);
        assert_eq!(p.runs.len(), 3);
        execute(&mut s, &mut run, &p);
        // Each now needs a third block for its 9th token: only two can have one.
        let p = s.schedule(&mut run, &mut wait);
        assert_eq!(p.preempted, vec![3], "lowest priority, newest goes first");
        assert_eq!(p.runs, vec![(2, 1), (1, 1)]);
        assert_eq!(wait.len(), 1);
        assert_eq!(s.stats.preemptions, 1);
        assert!(wait[0].blocks.is_empty() && wait[0].computed == 0);
        // Everything is accounted for: 2 running x 3 blocks, seq 3's full blocks cached.
        assert_eq!(s.alloc.used(), 6);
    }

    #[test]
    fn a_preempted_sequence_resumes_from_its_cached_blocks() {
        let mut s = Scheduler::new(4, 4, 8, 100);
        let (mut run, mut wait) = (vec![], vec![seq(1, 0, 8)]);
        let p = s.schedule(&mut run, &mut wait);
        execute(&mut s, &mut run, &p);
        let mut v = run.pop().expect("seq");
        s.free(&mut v); // as a preemption would
        wait.push(v);
        let p = s.schedule(&mut run, &mut wait);
        // 9 tokens now (8 + 1 generated): two full blocks reused, 1 recomputed.
        assert_eq!(p.runs, vec![(1, 1)]);
        assert_eq!(
            run[0].cached_tokens, 0,
            "only the first admission counts as a prefix hit"
        );
    }

    #[test]
    fn shared_partial_block_is_copied_before_writing() {
        let mut s = Scheduler::new(8, 4, 8, 100);
        let (mut run, mut wait) = (vec![], vec![seq(1, 0, 6)]);
        let p = s.schedule(&mut run, &mut wait);
        execute(&mut s, &mut run, &p);
        // Fork: a second sequence sharing both blocks (the second one partial).
        let mut fork = seq(9, 0, 0);
        fork.tokens = run[0].tokens.clone();
        fork.computed = run[0].computed;
        for &b in &run[0].blocks {
            s.alloc.retain(b);
        }
        fork.blocks = run[0].blocks.clone();
        fork.admitted_once = true;
        run.push(fork);
        let p = s.schedule(&mut run, &mut wait);
        assert_eq!(
            p.copies.len(),
            1,
            "the first writer copies the shared partial block"
        );
        assert_ne!(run[0].blocks[1], run[1].blocks[1]);
        assert_eq!(
            run[0].blocks[0], run[1].blocks[0],
            "full blocks stay shared"
        );
    }
}
