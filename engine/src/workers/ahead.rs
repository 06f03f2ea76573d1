//! The read-ahead of idle workers between one-row products (see the
//! parent module): where a product's weights lie ([`Stream`]), the order
//! the products ran in, and a worker's walk through the front of its
//! region of the product expected next.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::Shared;

/// Whether workers idle between one-row products read ahead their part
/// of the product expected next (the default).
pub(super) static GAP_PREFETCH: AtomicBool = AtomicBool::new(true);

/// Sets, for the whole process, whether idle workers read ahead the next
/// one-row product's weights (the default): for comparisons (`steptime`'s
/// `PREFETCH_AB`).
pub fn set_gap_prefetch(on: bool) {
    GAP_PREFETCH.store(on, Ordering::Relaxed);
}

/// How many bytes of its region of the next product a worker reads ahead
/// at most between two products: half of a Zen 3 core's L2, so that what
/// it fetches is still there when the product reaches it (128 KiB to
/// 1 MiB measured alike).
const PREFETCH_BYTES: usize = 256 << 10;

/// Where a product's weights lie, for the workers to read ahead: column
/// unit `u` reads `bytes` bytes at `at + u * bytes`, and as many at `also +
/// u * bytes` where `also` is set (a stacked gate/up weight's second
/// half), all inside `at .. end`, memory that `keep` holds alive for as
/// long as a worker may read it.
#[derive(Clone)]
pub(crate) struct Stream {
    // Held, never read.
    #[allow(dead_code)]
    keep: Arc<dyn Send + Sync>,
    pub(super) at: usize,
    also: Option<usize>,
    bytes: usize,
    end: usize,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("at", &self.at)
            .field("also", &self.also)
            .field("bytes", &self.bytes)
            .finish_non_exhaustive()
    }
}

impl PartialEq for Stream {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.also, self.bytes, self.end) == (o.at, o.also, o.bytes, o.end)
    }
}

impl Stream {
    /// Units of `per_unit` elements of `data`, from its start.
    pub(crate) fn of<T, D>(data: &Arc<D>, per_unit: usize) -> Self
    where
        D: std::ops::Deref<Target = [T]> + Send + Sync + 'static,
    {
        let slice: &[T] = data;
        let at = slice.as_ptr() as usize;
        Self {
            keep: data.clone(),
            at,
            also: None,
            bytes: per_unit * std::mem::size_of::<T>(),
            end: at + std::mem::size_of_val(slice),
        }
    }

    /// The same units with a second run of them `offset` units on.
    pub(crate) fn and_at(self, offset: usize) -> Self {
        Self {
            also: Some(self.at + offset * self.bytes),
            ..self
        }
    }
}

/// A one-row product as [`super::Workers::run_ranges`] runs it: its weights,
/// column units, and units of them a balanced unit.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Planned {
    pub(super) stream: Stream,
    pub(super) units: usize,
    pub(super) per: usize,
}

impl Planned {
    /// The column units of thread `r`'s region (of `t`), as
    /// [`super::Workers::run_balanced`] cuts them.
    fn region(&self, r: usize, t: usize) -> (usize, usize) {
        let b = self.units.div_ceil(self.per.max(1));
        let unit = |i: usize| (i * b / t * self.per).min(self.units);
        (unit(r), unit(r + 1))
    }
}

/// The order the one-row products ran in last: each product's weights'
/// address and the product that ran after it.
#[derive(Default)]
pub(super) struct Order {
    pub(super) last: Option<usize>,
    pub(super) next: HashMap<usize, Planned>,
}

/// A worker's read-ahead of its region of the next product: the bytes of
/// each of the region's units in turn, up to [`PREFETCH_BYTES`].
#[derive(Default)]
pub(super) struct Prefetch {
    seq: u64,
    plan: Option<Planned>,
    unit: usize,
    end: usize,
    /// Bytes of `unit` already read.
    done: usize,
    budget: usize,
}

impl Prefetch {
    /// Takes up a new hint, if there is one.
    pub(super) fn refresh(&mut self, s: &Shared, index: usize) {
        let seq = s.hint_seq.load(Ordering::Acquire);
        if seq == self.seq {
            return;
        }
        self.seq = seq;
        self.plan = s.hint.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(p) = &self.plan {
            (self.unit, self.end) = p.region(index, s.threads);
            self.done = 0;
            self.budget = PREFETCH_BYTES;
        }
    }

    /// Reads up to `lines` more cache lines, through `fetch(address,
    /// bytes)` with addresses inside the plan's `at .. end`; false once
    /// nothing is left to do.
    pub(super) fn step(&mut self, mut lines: usize, mut fetch: impl FnMut(usize, usize)) -> bool {
        let Some(p) = &self.plan else {
            return false;
        };
        let st = &p.stream;
        let halves = 1 + usize::from(st.also.is_some());
        while lines > 0 && self.unit < self.end && self.budget > 0 {
            let n = (st.bytes - self.done)
                .min(lines * 64)
                .min(self.budget / halves);
            for base in [Some(st.at), st.also].into_iter().flatten() {
                let from = base + self.unit * st.bytes + self.done;
                fetch(from, n.min(st.end.saturating_sub(from)));
            }
            self.done += n;
            self.budget = self.budget.saturating_sub(n * halves);
            lines = lines.saturating_sub(n.div_ceil(64));
            if self.done >= st.bytes {
                (self.unit, self.done) = (self.unit + 1, 0);
            }
            if n == 0 {
                self.budget = 0;
            }
        }
        let more = self.unit < self.end && self.budget > 0;
        if !more {
            self.plan = None;
        }
        more
    }
}

/// Reads a byte of each cache line of `len` bytes at address `at`, so
/// that they are in this core's caches. (Prefetch instructions, which
/// would not need the memory to be alive, made no difference on a Zen 3:
/// a core drops those it has no miss buffer for, and a loop of them
/// outruns the buffers; loads wait for them.)
///
/// # Safety
/// `at .. at + len` lies in memory that stays allocated until this returns.
#[allow(unsafe_code)]
pub(super) unsafe fn touch(at: usize, len: usize) {
    let mut a = at;
    while a < at + len {
        // SAFETY: `a` lies in `at .. at + len`, which the caller keeps
        // allocated; the read's value is not used.
        unsafe { std::ptr::read_volatile(a as *const u8) };
        a = (a | 63) + 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workers::Workers;

    /// Each one-row product learns the one that ran after it, and the
    /// workers' regions of it tile its units as `run_balanced` cuts them.
    #[test]
    fn products_learn_what_follows_them() {
        let w = Workers::new(2).expect("workers");
        let data: Vec<Arc<Vec<f32>>> = (0..3).map(|_| Arc::new(vec![0f32; 1024])).collect();
        let p = |i: usize, units: usize| Planned {
            stream: Stream::of(&data[i], 16),
            units,
            per: 4,
        };
        let cycle = [p(0, 64), p(1, 30), p(2, 7)];
        for (i, now) in cycle.iter().enumerate() {
            assert_eq!(
                w.follow(now.clone()),
                None,
                "nothing has followed product {i} yet"
            );
        }
        for round in 0..3 {
            for (i, now) in cycle.iter().enumerate() {
                let next = w.follow(now.clone());
                assert_eq!(next.as_ref(), Some(&cycle[(i + 1) % 3]), "round {round}");
            }
        }
        for t in 1..5 {
            for units in [0, 1, 5, 7, 64, 1001] {
                let q = p(0, units);
                let mut at = 0;
                for r in 0..t {
                    let (lo, hi) = q.region(r, t);
                    assert_eq!(lo, at, "{t} threads, {units} units");
                    assert!(hi >= lo && (hi - lo) % 4 == 0 || hi == units);
                    at = hi;
                }
                assert_eq!(at, units);
            }
        }
    }

    /// A worker's prefetch walks its region of the next product from the
    /// front, both halves of a stacked weight unit by unit, and stops at
    /// its budget or the region's end.
    #[test]
    fn prefetch_walks_the_front_of_its_region() {
        let s = Shared::new(2);
        let mut pf = Prefetch::default();
        for (units, bytes) in [(64, 1000), (64, 100_000), (8, 3000)] {
            let st = Stream {
                keep: Arc::new(()),
                at: 1 << 30,
                also: None,
                bytes,
                end: (1 << 30) + 2 * units * bytes,
            }
            .and_at(units);
            let plan = Planned {
                stream: st.clone(),
                units,
                per: 4,
            };
            *s.hint.lock().expect("hint") = Some(plan.clone());
            s.hint_seq.fetch_add(1, Ordering::Release);
            pf.refresh(&s, 1);
            let mut got = Vec::new();
            while pf.step(64, |a, n| got.push((a, n))) {}
            let (lo, hi) = plan.region(1, 2);
            // Each half: the region's bytes from its front, contiguous and
            // in order, as many as the budget allows; the halves in turn.
            let len = ((hi - lo) * bytes).min(PREFETCH_BYTES / 2);
            for (h, base) in [st.at, st.also.expect("also")].into_iter().enumerate() {
                let mut at = base + lo * bytes;
                for &(a, n) in got.iter().skip(h).step_by(2) {
                    assert_eq!(a, at, "{units} units of {bytes} bytes, half {h}");
                    at += n;
                }
                assert_eq!(
                    at - (base + lo * bytes),
                    len,
                    "{units} units of {bytes} bytes"
                );
            }
            assert!(!pf.step(64, |_, _| panic!("nothing is left")));
        }
    }
}
