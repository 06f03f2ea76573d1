//! Weighted fair sharing of the engine between tenants.
//!
//! The algorithm is start-time fair queuing (SFQ) over *tokens*: each
//! tenant has a virtual time, the tokens the engine ran for it (prefill
//! chunks and decodes, as each step plans them) divided by its weight.
//! Admission takes the waiting request of the tenant with the smallest
//! virtual time, then by priority and age within that tenant; preemption
//! takes its victim from the tenant with the largest. Tokens rather than
//! requests are the cost because a request's cost is what it runs: a tenant
//! sending long prompts or long generations uses more of the engine per
//! request, and one counting requests would let it take more than its share.
//! SFQ rather than deficit round robin because the engine admits at most a
//! few requests a step and a request's cost is not known when it is
//! admitted: SFQ charges what actually ran, with no quantum to tune.
//!
//! Idle time earns no credit: the system virtual time (`clock`) follows the
//! smallest virtual time of the tenants with work in the engine, and a
//! tenant whose requests start waiting again resumes at no less than it, as
//! SFQ tags a newly backlogged flow. A tenant that has nothing in the engine
//! and no debt left (its virtual time at or below the clock) is forgotten,
//! so the table stays as small as the set of active tenants.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::scheduler::SeqState;

#[derive(Debug, Default)]
pub(crate) struct Fair {
    /// Virtual time of each tenant: tokens run for it divided by its weight.
    vtime: HashMap<Arc<str>, f64>,
    /// System virtual time: never decreases.
    clock: f64,
    /// Tenants with a request waiting at the end of the last step.
    backlogged: HashSet<Arc<str>>,
}

impl Fair {
    /// Starts a step: lifts tenants that began waiting since the last step
    /// to the clock, moves the clock, forgets idle tenants.
    pub fn begin(&mut self, running: &[SeqState], waiting: &[SeqState]) {
        for s in waiting {
            if !self.backlogged.contains(&s.tenant) {
                let v = self.vtime.entry(s.tenant.clone()).or_insert(self.clock);
                *v = v.max(self.clock);
            }
        }
        for s in running {
            self.vtime.entry(s.tenant.clone()).or_insert(self.clock);
        }
        let active: HashSet<&Arc<str>> = running.iter().chain(waiting).map(|s| &s.tenant).collect();
        let floor = active
            .iter()
            .filter_map(|t| self.vtime.get(*t).copied())
            .min_by(f64::total_cmp);
        if let Some(floor) = floor {
            self.clock = self.clock.max(floor);
        }
        let clock = self.clock;
        self.vtime.retain(|t, v| active.contains(t) || *v > clock);
    }

    /// Ends a step: remembers which tenants have requests waiting.
    pub fn end(&mut self, waiting: &[SeqState]) {
        self.backlogged = waiting.iter().map(|s| s.tenant.clone()).collect();
    }

    /// The virtual time of `s`'s tenant.
    pub fn vtime(&self, s: &SeqState) -> f64 {
        self.vtime.get(&s.tenant).copied().unwrap_or(self.clock)
    }

    /// Charges `tokens` run for `s` to its tenant.
    pub fn charge(&mut self, s: &SeqState, tokens: usize) {
        let clock = self.clock;
        let v = self.vtime.entry(s.tenant.clone()).or_insert(clock);
        *v += tokens as f64 / f64::from(s.weight.max(1));
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use crate::scheduler::{Scheduler, SeqState};

    const PROMPT: usize = 4;
    /// Tokens each simulated request generates before it finishes.
    const GENERATES: usize = 3;

    /// A simulated engine: the scheduler's plans executed as the worker
    /// would, each request finishing after [`GENERATES`] tokens.
    struct Sim {
        sched: Scheduler,
        running: Vec<SeqState>,
        waiting: Vec<SeqState>,
        generated: HashMap<u64, usize>,
        next_id: u64,
    }

    impl Sim {
        fn new(max_running: usize) -> Self {
            Self {
                sched: Scheduler::new(4096, 4, max_running, 1024),
                running: Vec::new(),
                waiting: Vec::new(),
                generated: HashMap::new(),
                next_id: 0,
            }
        }

        fn submit(&mut self, tenant: &str, weight: u32, n: usize) {
            for _ in 0..n {
                let id = self.next_id;
                self.next_id += 1;
                let prompt = (0..PROMPT as u32).map(|t| t + 10 * id as u32).collect();
                let s = SeqState::new(id, 0, prompt, String::new())
                    .for_tenant(Arc::from(tenant), weight);
                self.waiting.push(s);
            }
        }

        fn waiting_of(&self, tenant: &str) -> usize {
            self.waiting.iter().filter(|s| &*s.tenant == tenant).count()
        }

        /// Runs one step; returns the tenants of the requests it admitted.
        fn step(&mut self) -> Vec<String> {
            let before: Vec<u64> = self.running.iter().map(|s| s.id).collect();
            let plan = self.sched.schedule(&mut self.running, &mut self.waiting);
            let admitted = self
                .running
                .iter()
                .filter(|s| !before.contains(&s.id))
                .map(|s| s.tenant.to_string())
                .collect();
            for &(id, n) in &plan.runs {
                let Some(s) = self.running.iter_mut().find(|s| s.id == id) else {
                    panic!("planned sequence {id} is not running");
                };
                s.computed += n;
                self.sched.register_full_blocks(s);
                if s.computed == s.tokens.len() {
                    s.tokens.push(7);
                    *self.generated.entry(id).or_default() += 1;
                }
            }
            let generated = &self.generated;
            let sched = &mut self.sched;
            self.running.retain_mut(|s| {
                let done = generated.get(&s.id).copied().unwrap_or(0) >= GENERATES;
                if done {
                    sched.free(s);
                }
                !done
            });
            admitted
        }
    }

    fn count(admitted: &[String], tenant: &str) -> usize {
        admitted.iter().filter(|t| *t == tenant).count()
    }

    #[test]
    fn a_tenant_sending_ten_times_the_requests_does_not_starve_the_other() {
        let mut sim = Sim::new(4);
        // The heavy tenant floods the queue first; the light one sends a
        // tenth as many requests after it.
        sim.submit("heavy", 1, 40);
        sim.submit("light", 1, 4);
        let (mut heavy, mut light) = (0, 0);
        while sim.waiting_of("light") > 0 {
            let both_waiting = sim.waiting_of("heavy") > 0;
            let admitted = sim.step();
            let (h, l) = (count(&admitted, "heavy"), count(&admitted, "light"));
            if both_waiting && h + l > 0 {
                // Equal weights: every step's admissions are split evenly
                // (first-come-first-served would give all four to heavy).
                assert!(h.abs_diff(l) <= 1, "step admitted heavy {h}, light {l}");
            }
            heavy += h;
            light += l;
        }
        assert_eq!(light, 4);
        assert!(
            heavy <= 5,
            "the light tenant waited for {heavy} of the heavy tenant's requests"
        );
    }

    #[test]
    fn weights_set_each_tenants_share_of_admissions() {
        let mut sim = Sim::new(4);
        sim.submit("one", 1, 100);
        sim.submit("three", 3, 100);
        let (mut one, mut three) = (0, 0);
        while one + three < 40 {
            let admitted = sim.step();
            one += count(&admitted, "one");
            three += count(&admitted, "three");
        }
        // Both always have work waiting: admissions follow the weights, 3:1.
        assert!(
            (27..=33).contains(&three) && three + one < 44,
            "weight 3 got {three}, weight 1 got {one}"
        );
    }

    #[test]
    fn an_idle_tenant_earns_no_credit() {
        let mut sim = Sim::new(4);
        sim.submit("early", 1, 200);
        for _ in 0..40 {
            sim.step();
        }
        // Arriving after "early" has had the engine to itself, "late" gets
        // about an even share (a little more at first, while the requests
        // "early" already runs count against it), not the whole engine until
        // it has caught up with everything "early" ran alone.
        sim.submit("late", 1, 40);
        let (mut early, mut late) = (0, 0);
        for _ in 0..20 {
            let admitted = sim.step();
            early += count(&admitted, "early");
            late += count(&admitted, "late");
        }
        assert!(
            late > 0 && early * 2 >= late && late * 2 >= early,
            "after the late arrival: early {early}, late {late}"
        );
    }

    #[test]
    fn preemption_takes_from_the_tenant_most_over_its_share() {
        // 6 blocks of 4 tokens; three sequences of 8 tokens need 2 blocks
        // each: two of tenant "a", then (newest) one of "b".
        let mut s = Scheduler::new(6, 4, 8, 100);
        let seq = |id: u64, tenant: &str| {
            let prompt = (0..8u32).map(|t| t + 100 * id as u32).collect();
            SeqState::new(id, 0, prompt, String::new()).for_tenant(Arc::from(tenant), 1)
        };
        let mut run = vec![];
        let mut wait = vec![seq(1, "a"), seq(2, "a"), seq(3, "b")];
        let p = s.schedule(&mut run, &mut wait);
        assert_eq!(p.runs.len(), 3);
        for q in &mut run {
            q.computed = q.tokens.len();
            s.register_full_blocks(q);
            q.tokens.push(7);
        }
        // Each now needs a third block: "a" ran twice the tokens of "b", so
        // its newest sequence goes, not "b"'s (the newest of all).
        let p = s.schedule(&mut run, &mut wait);
        assert_eq!(p.preempted, vec![2]);
        assert_eq!(p.runs, vec![(1, 1), (3, 1)]);
    }
}
