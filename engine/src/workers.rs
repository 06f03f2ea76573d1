//! The compute threads of the CPU's linear layers: the calling thread and
//! `threads - 1` workers that work with it on each product.
//!
//! A product is cut into chunks that every thread takes from one counter,
//! the caller included, so the caller computes instead of sleeping until
//! the workers are done, and no more threads run than were asked for. (A
//! rayon pool as large as the thread count, with the caller blocked on it,
//! put three threads on two cores; each product then cost a few context
//! switches, which at batch 1 on a small model was as much time as the
//! arithmetic.)
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

/// How long an idle worker waits awake before it sleeps: it spins for
/// `HOT`, then yields its core to any other runnable thread (the server's
/// own, at many streams) between checks until `SPIN`.
/// Runs a thread takes in a one-row product (see [`Workers::chunks`]).
static ONE_ROW_RUNS: AtomicUsize = AtomicUsize::new(1);

/// Sets how many runs a thread takes in a one-row product, for the whole
/// process (the default is 1): for comparisons (`steptime`'s `CHUNKS_AB`).
pub fn set_one_row_runs(runs: usize) {
    ONE_ROW_RUNS.store(runs.max(1), Ordering::Relaxed);
}

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
}

pub(crate) struct Workers {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    /// One product at a time on these workers.
    serial: Mutex<()>,
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

impl Workers {
    pub(crate) fn new(threads: usize) -> Result<Self, EngineError> {
        let shared = Arc::new(Shared {
            generation: AtomicU64::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            busy: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let mut handles = Vec::new();
        for i in 1..threads.max(1) {
            let s = Arc::clone(&shared);
            let h = std::thread::Builder::new()
                .name(format!("gyre-gemm-{i}"))
                .spawn(move || worker(&s))
                .map_err(|e| EngineError::Step(format!("cannot start compute threads: {e}")))?;
            handles.push(h);
        }
        Ok(Self {
            shared,
            threads: handles,
            serial: Mutex::new(()),
        })
    }

    /// Threads a product runs on, the caller included.
    pub(crate) fn threads(&self) -> usize {
        1 + self.threads.len()
    }

    /// How many chunks a product of `rows` activation rows over `units`
    /// independent column runs is cut into (at least one, at most
    /// `units`).
    ///
    /// One row (a batch-1 decode) streams its weights once and does little
    /// arithmetic a byte: one contiguous run of columns a thread. Each
    /// further run a thread starts seems to cost a cold start (its first
    /// lines' latency, the hardware prefetcher picking up a new stream,
    /// the kernel's setup). On a 2-core Zen 3, one run against four, rounds
    /// alternating in one process (`CHUNKS_AB=1` in the `steptime`
    /// example; two runs each): SmolLM2 Q8_0 1.11-1.13x, Q4_1 1.07x, the
    /// F32 files 1.01-1.05x, Gemma 3 Q4_K_M 0.98-1.03x. Every thread takes
    /// chunks from one counter, so a worker that wakes late takes none and
    /// the caller runs them all. With more rows the arithmetic dominates,
    /// and four runs a thread even out threads that run at different
    /// speeds (at 16 rows one run a thread measured 6% slower, in separate
    /// runs).
    pub(crate) fn chunks(&self, rows: usize, units: usize) -> usize {
        let per_thread = if rows == 1 {
            ONE_ROW_RUNS.load(Ordering::Relaxed).max(1)
        } else {
            4
        };
        (self.threads() * per_thread).clamp(1, units.max(1))
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

fn worker(s: &Shared) {
    let mut seen = 0u64;
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
