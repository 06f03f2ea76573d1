//! The compute threads of the CPU's linear layers: the calling thread and
//! `threads - 1` workers that work with it on each product.
//!
//! A product is cut into chunks that every thread takes from one counter,
//! the caller included, so the caller computes instead of sleeping until
//! the workers are done, and no more threads run than were asked for. (A
//! rayon pool as large as the thread count, with the caller blocked on it,
//! put three threads on two cores; each product then cost a few context
//! switches, which at batch 1 on a small model was as much time as the
//! arithmetic.) The products [`Workers::run_ranges`] runs (the f32 ones,
//! and the one-row quantized ones) instead give each thread one contiguous
//! region of their units, and a thread done with its own takes from the
//! back of the others' ([`Workers::run_balanced`]).
//!
//! A worker idle between one-row products reads ahead the front of its
//! region of the product expected next ([`Stream`]; the order is learned
//! from the products' last run), so that the memory is busy while the
//! caller runs the serial work between products (norms, rotary, the
//! attention's bookkeeping): 1.00-1.06x at one stream on a 2-core Zen 3
//! (`steptime`'s `PREFETCH_AB`).
//!
//! Between products a worker stays awake for a while (`SPIN`: spinning,
//! then yielding its core) before it sleeps: a decode step runs a product
//! every few tens of microseconds, and waking a sleeping thread costs about
//! as much as a small product. Past that it sleeps on a condition
//! variable, so an idle server uses no CPU.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::EngineError;

mod ahead;

pub(crate) use ahead::Stream;
pub use ahead::set_gap_prefetch;
use ahead::{GAP_PREFETCH, Order, Planned, Prefetch, touch};

/// Whether [`Workers::run_balanced`] takes units from the back of other
/// threads' regions (the default) or leaves each region to its own thread.
static STEAL: AtomicBool = AtomicBool::new(true);

/// Sets, for the whole process, whether balanced runs take units from
/// other threads' regions (the default): for comparisons (`steptime`'s
/// `CHUNKS_AB`).
pub fn set_balanced_stealing(on: bool) {
    STEAL.store(on, Ordering::Relaxed);
}

/// Whether products of several rows run a unit at a time through
/// [`Workers::run_balanced`] (the default) or in [`Workers::chunks`]
/// contiguous ranges from one counter (see [`Workers::run_ranges`]).
static SPREAD: AtomicBool = AtomicBool::new(true);

/// Sets, for the whole process, whether products of several rows run as
/// balanced regions of single units (the default) or as a few chunks a
/// thread: for comparisons (`steptime`'s `SPREAD_AB`).
pub fn set_row_units(on: bool) {
    SPREAD.store(on, Ordering::Relaxed);
}

/// A thread's region of a balanced run, `front .. end`, packed in one word
/// (front in the low half) so that its owner taking from the front and
/// another thread taking from the back never take the same unit; on a
/// cache line of its own.
#[repr(align(64))]
struct Region(AtomicU64);

impl Region {
    fn new(front: usize, end: usize) -> Self {
        Self(AtomicU64::new(front as u64 | (end as u64) << 32))
    }

    /// Takes the unit at the front, if any is left.
    fn front(&self) -> Option<usize> {
        self.take(|f, e| (f, f + 1, e))
    }

    /// Takes the unit at the back, if any is left.
    fn back(&self) -> Option<usize> {
        self.take(|f, e| (e - 1, f, e - 1))
    }

    /// `pick(front, end)` gives the unit taken and the new front and end,
    /// called only when the region is not empty.
    fn take(&self, pick: impl Fn(u64, u64) -> (u64, u64, u64)) -> Option<usize> {
        let mut v = self.0.load(Ordering::Relaxed);
        loop {
            let (f, e) = (v & 0xffff_ffff, v >> 32);
            if f >= e {
                return None;
            }
            let (unit, f2, e2) = pick(f, e);
            match self.0.compare_exchange_weak(
                v,
                f2 | e2 << 32,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(unit as usize),
                Err(now) => v = now,
            }
        }
    }
}

/// How long an idle worker waits awake before it sleeps: it spins for
/// `HOT`, then yields its core to any other runnable thread (the server's
/// own, at many streams) between checks until `SPIN`.
const SPIN: Duration = Duration::from_micros(300);
const HOT: Duration = Duration::from_micros(30);

/// The job of the current generation: the caller's closure, which lives on
/// the caller's stack for as long as any worker may call it.
type Job<'a> = &'a (dyn Fn() + Sync);

struct Shared {
    /// Bumped by the caller to publish a job.
    generation: AtomicU64,
    /// Points at the current generation's `Job` (set before the bump).
    job: AtomicPtr<()>,
    /// Workers that have not yet finished the current generation's job.
    busy: AtomicUsize,
    /// Workers asleep (or about to be) on `wake`.
    sleepers: AtomicUsize,
    /// A worker's job panicked during the current generation.
    panicked: AtomicBool,
    shutdown: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
    /// Threads, the caller included.
    threads: usize,
    /// The product expected next, for idle workers to read ahead;
    /// `hint_seq` is bumped when it changes.
    hint: Mutex<Option<Planned>>,
    hint_seq: AtomicU64,
}

pub(crate) struct Workers {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    /// One product at a time on these workers.
    serial: Mutex<()>,
    order: Mutex<Order>,
}

/// Waits, when dropped (also while unwinding from a panic in the caller's
/// own chunk), until every worker has left the current job.
struct Joined<'a>(&'a Shared);

impl Drop for Joined<'_> {
    fn drop(&mut self) {
        let mut spins = 0u32;
        while self.0.busy.load(Ordering::Acquire) > 0 {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(64) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

impl Shared {
    fn new(threads: usize) -> Self {
        Self {
            generation: AtomicU64::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            busy: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            threads: threads.max(1),
            hint: Mutex::new(None),
            hint_seq: AtomicU64::new(0),
        }
    }
}

impl Workers {
    pub(crate) fn new(threads: usize) -> Result<Self, EngineError> {
        let shared = Arc::new(Shared::new(threads));
        let mut handles = Vec::new();
        for i in 1..threads.max(1) {
            let s = Arc::clone(&shared);
            let h = std::thread::Builder::new()
                .name(format!("gyre-gemm-{i}"))
                .spawn(move || worker(&s, i))
                .map_err(|e| EngineError::Step(format!("cannot start compute threads: {e}")))?;
            handles.push(h);
        }
        Ok(Self {
            shared,
            threads: handles,
            serial: Mutex::new(()),
            order: Mutex::new(Order::default()),
        })
    }

    /// Threads a product runs on, the caller included.
    pub(crate) fn threads(&self) -> usize {
        1 + self.threads.len()
    }

    /// How many chunks a product of several activation rows over `units`
    /// independent column runs is cut into: four a thread, which even out
    /// threads that run at different speeds (at least one, at most
    /// `units`). One-row products take [`Workers::run_balanced`] instead.
    fn chunks(&self, units: usize) -> usize {
        (self.threads() * 4).clamp(1, units.max(1))
    }

    /// Runs `work(lo, hi)` for ranges that cover `0..units` once between
    /// them, for a product of `rows` activation rows: with one row, units
    /// of `one_row_unit` through [`Workers::run_balanced`]; with more,
    /// single units through it too (a thread's region from the front, then
    /// the others' from the back, so the threads end within one unit of
    /// each other: against [`Workers::chunks`] contiguous ranges from one
    /// counter, 1.01-1.03x at 16 streams of SmolLM2 F32 and the bench
    /// model on a 2-core Zen 1, `steptime`'s `SPREAD_AB`).
    /// `weights` says where each unit's weights lie: a one-row product
    /// learns which product follows it, and once it is done the workers
    /// read ahead the front of their regions of that one while the caller
    /// does what comes between the two.
    pub(crate) fn run_ranges(
        &self,
        rows: usize,
        units: usize,
        one_row_unit: usize,
        weights: Stream,
        work: impl Fn(usize, usize) + Sync,
    ) {
        if rows == 1 {
            let per = one_row_unit.max(1);
            let next = self.follow(Planned {
                stream: weights,
                units,
                per,
            });
            self.run_balanced(units.div_ceil(per), |u| {
                work(u * per, ((u + 1) * per).min(units));
            });
            if let Some(next) = next
                && GAP_PREFETCH.load(Ordering::Relaxed)
            {
                let old = self
                    .shared
                    .hint
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .replace(next);
                // Not under the lock: the last holder may free weights.
                drop(old);
                self.shared.hint_seq.fetch_add(1, Ordering::Release);
            }
        } else if SPREAD.load(Ordering::Relaxed) {
            self.run_balanced(units, |u| work(u, u + 1));
        } else {
            self.run_chunked(units, work);
        }
    }

    /// Notes that `p` runs now, after the product that ran last, and gives
    /// the product that followed `p` the last time it ran.
    fn follow(&self, p: Planned) -> Option<Planned> {
        if self.threads.is_empty() {
            return None;
        }
        let mut o = self.order.lock().unwrap_or_else(|e| e.into_inner());
        let key = p.stream.at;
        if let Some(last) = o.last.replace(key) {
            if o.next.len() >= 1 << 14 {
                // Weights come and go (tests): forget rather than grow.
                o.next.clear();
            }
            o.next.insert(last, p);
        }
        o.next.get(&key).cloned()
    }

    /// Runs `work(lo, hi)` for [`Workers::chunks`] contiguous ranges that
    /// cover `0..units` once between them, through [`Workers::run`].
    pub(crate) fn run_chunked(&self, units: usize, work: impl Fn(usize, usize) + Sync) {
        let per = units.div_ceil(self.chunks(units)).max(1);
        self.run(units.div_ceil(per), |c| {
            work(c * per, ((c + 1) * per).min(units));
        });
    }

    /// Runs `work(u)` for every unit `u` in `0..units`, each exactly once,
    /// as [`Workers::run`] does, for a product that streams its weights
    /// once (one row: a batch-1 decode step's): each thread takes one
    /// contiguous region of the units and works through it from the
    /// front; a thread whose region is done takes units one at a time from
    /// the back of the others' until none is left, so the threads finish
    /// together and a thread starts a second stream only to take over the
    /// end of another's.
    ///
    /// Each further run a thread starts seems to cost a cold start (its
    /// first lines' latency, the hardware prefetcher picking up a new
    /// stream). On a 2-core Zen 3, one chunk a thread against four, taken
    /// from one counter, rounds alternating in one process: SmolLM2 Q8_0
    /// 1.11-1.13x, Q4_1 1.07x, the F32 files 1.01-1.05x, Gemma 3 Q4_K_M
    /// 0.98-1.03x. With one chunk a thread, the caller, which starts
    /// first, then spent about a tenth of a SmolLM2 Q8_0 step waiting at
    /// the ends of products; taking from the back of the others' regions
    /// leaves it the wait for the others' last unit (about 2% of the step)
    /// and measured 1.00-1.05x against each thread keeping to its own
    /// region, two runs on five files, one of the ten 0.996x (`CHUNKS_AB=1`
    /// in the `steptime` example compares the two).
    pub(crate) fn run_balanced(&self, units: usize, work: impl Fn(usize) + Sync) {
        let t = self.threads();
        if t == 1 || units <= 1 {
            (0..units).for_each(work);
            return;
        }
        if u32::try_from(units).is_err() {
            // More units than a region's word holds: plain chunks.
            self.run_chunked(units, |lo, hi| (lo..hi).for_each(&work));
            return;
        }
        let regions: Vec<Region> = (0..t)
            .map(|r| Region::new(r * units / t, (r + 1) * units / t))
            .collect();
        let steal = STEAL.load(Ordering::Relaxed);
        self.run(t, |r| {
            while let Some(u) = regions[r].front() {
                work(u);
            }
            if steal {
                for o in (1..t).map(|i| (r + i) % t) {
                    while let Some(u) = regions[o].back() {
                        work(u);
                    }
                }
            }
        });
    }

    /// Runs `work(c)` for every `c` in `0..chunks`, each exactly once, on
    /// the caller and the workers; returns when all are done. Calls from
    /// several threads take turns.
    pub(crate) fn run(&self, chunks: usize, work: impl Fn(usize) + Sync) {
        let next = AtomicUsize::new(0);
        let take = || {
            loop {
                let c = next.fetch_add(1, Ordering::Relaxed);
                if c >= chunks {
                    break;
                }
                work(c);
            }
        };
        if self.threads.is_empty() || chunks <= 1 {
            take();
            return;
        }
        let _serial = self.serial.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        let job: Job<'_> = &take;
        s.busy.store(self.threads.len(), Ordering::SeqCst);
        s.job
            .store(&job as *const Job<'_> as *mut (), Ordering::SeqCst);
        s.generation.fetch_add(1, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            // Under the lock: a worker between its last check and its wait
            // holds it, so it is waiting by the time this notifies.
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        // Every worker leaves the job before `job` (on this stack) goes,
        // even if the caller's own chunk panics.
        let joined = Joined(s);
        take();
        drop(joined);
        if s.panicked.swap(false, Ordering::SeqCst) {
            panic!("a compute thread panicked in a linear layer");
        }
    }
}

fn worker(s: &Shared, index: usize) {
    let mut seen = 0u64;
    let mut pf = Prefetch::default();
    loop {
        // Wait for the next generation: spin, then sleep.
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            if s.shutdown.load(Ordering::Acquire) {
                return;
            }
            let g = s.generation.load(Ordering::SeqCst);
            if g != seen {
                seen = g;
                break;
            }
            pf.refresh(s, index);
            // A few kilobytes at a time, checking for a job between.
            // SAFETY: `step` passes addresses inside its plan's stream,
            // whose memory the plan (held in `pf` meanwhile) keeps alive.
            #[allow(unsafe_code)]
            if pf.step(64, |a, n| unsafe { touch(a, n) }) {
                continue;
            }
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(256) {
                std::hint::spin_loop();
                continue;
            }
            let waited = start.elapsed();
            if waited < HOT {
                continue;
            }
            if waited < SPIN {
                std::thread::yield_now();
                continue;
            }
            let mut guard = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.sleepers.fetch_add(1, Ordering::SeqCst);
            while s.generation.load(Ordering::SeqCst) == seen && !s.shutdown.load(Ordering::SeqCst)
            {
                guard = s.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
            }
            s.sleepers.fetch_sub(1, Ordering::SeqCst);
        }
        let ptr = s.job.load(Ordering::SeqCst) as *const Job<'static>;
        #[allow(unsafe_code)]
        // SAFETY: the caller stored a pointer to its live `Job` before
        // bumping the generation this worker just saw, and does not return
        // (so neither the closure nor the pointer to it goes away) until
        // `busy` is 0, which needs this worker's decrement below. The
        // 'static is a lie confined to this block: the reference is not
        // kept past the call.
        let job: Job<'_> = unsafe { *ptr };
        if catch_unwind(AssertUnwindSafe(job)).is_err() {
            s.panicked.store(true, Ordering::SeqCst);
        }
        s.busy.fetch_sub(1, Ordering::Release);
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _g = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every chunk runs exactly once, with and without workers, for many
    /// products in a row.
    #[test]
    fn each_chunk_runs_once() {
        for threads in [1, 2, 3] {
            let w = Workers::new(threads).expect("workers");
            assert_eq!(w.threads(), threads);
            for round in 0..300 {
                let chunks = [0, 1, 2, 7, 64][round % 5];
                let hits: Vec<AtomicUsize> = (0..chunks).map(|_| AtomicUsize::new(0)).collect();
                w.run(chunks, |c| {
                    hits[c].fetch_add(1, Ordering::Relaxed);
                });
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
            }
        }
    }

    /// A balanced run takes every unit exactly once, for any number of
    /// threads and units.
    #[test]
    fn balanced_runs_take_each_unit_once() {
        for threads in [1, 2, 3, 4] {
            let w = Workers::new(threads).expect("workers");
            for round in 0..300 {
                let units = [0, 1, 2, 3, 7, 64, 1001][round % 7];
                let hits: Vec<AtomicUsize> = (0..units).map(|_| AtomicUsize::new(0)).collect();
                w.run_balanced(units, |u| {
                    hits[u].fetch_add(1, Ordering::Relaxed);
                });
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
            }
        }
    }

    /// A product of several rows covers every unit exactly once, in
    /// ranges that do not overlap, whether it runs a unit at a time (the
    /// default) or in chunks. (Another test flipping the process-wide
    /// switch meanwhile changes only which of the two ways runs.)
    #[test]
    fn row_products_cover_each_unit_once() {
        for threads in [1, 2, 3] {
            let w = Workers::new(threads).expect("workers");
            for spread in [true, false, true] {
                set_row_units(spread);
                for units in [1, 2, 5, 30, 96, 1537] {
                    let hits: Vec<AtomicUsize> = (0..units).map(|_| AtomicUsize::new(0)).collect();
                    let stream = Stream::of(&Arc::new(vec![0f32; 64]), 1);
                    w.run_ranges(16, units, 2, stream, |lo, hi| {
                        assert!(lo < hi && hi <= units, "range {lo}..{hi} of {units}");
                        for h in &hits[lo..hi] {
                            h.fetch_add(1, Ordering::Relaxed);
                        }
                    });
                    assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
                }
            }
        }
    }

    /// A thread whose own region is done takes units from another's: the
    /// thread that owns the first region stops at its first unit until
    /// some other unit of that region has run, which only another thread
    /// can have done.
    #[test]
    fn balanced_runs_share_a_slow_region() {
        for threads in [2, 3] {
            let w = Workers::new(threads).expect("workers");
            let units = 8 * threads;
            let hits: Vec<AtomicUsize> = (0..units).map(|_| AtomicUsize::new(0)).collect();
            let stolen = AtomicBool::new(false);
            w.run_balanced(units, |u| {
                if u == 0 {
                    let start = Instant::now();
                    while !stolen.load(Ordering::Acquire) {
                        assert!(
                            start.elapsed() < Duration::from_secs(60),
                            "no thread took a unit of the first region"
                        );
                        std::thread::yield_now();
                    }
                } else if u < 8 {
                    stolen.store(true, Ordering::Release);
                }
                hits[u].fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        }
    }

    /// Workers that fell asleep between products wake for the next one,
    /// and dropping the set ends them.
    #[test]
    fn sleeping_workers_wake_and_stop() {
        let w = Workers::new(3).expect("workers");
        for _ in 0..3 {
            std::thread::sleep(SPIN * 4);
            let total = AtomicUsize::new(0);
            w.run(16, |c| {
                total.fetch_add(c, Ordering::Relaxed);
            });
            assert_eq!(total.load(Ordering::Relaxed), (0..16).sum::<usize>());
        }
        drop(w);
    }

    /// A panic on a worker comes back to the caller instead of hanging it.
    #[test]
    fn a_panic_reaches_the_caller() {
        let w = Workers::new(2).expect("workers");
        let caller = std::thread::current().id();
        let r = catch_unwind(AssertUnwindSafe(|| {
            w.run(64, |_| {
                if std::thread::current().id() != caller {
                    panic!("worker");
                }
                std::thread::sleep(Duration::from_micros(50));
            });
        }));
        assert!(r.is_err());
        // Still usable afterwards.
        let n = AtomicUsize::new(0);
        w.run(8, |_| {
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(n.load(Ordering::Relaxed), 8);
    }
}
