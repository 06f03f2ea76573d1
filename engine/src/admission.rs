//! Admission: whether a new request may wait for the engine.
//!
//! The queue limit (`--max-queue`) counts requests waiting while the engine
//! is full, not a burst the engine can start at its next step: a request is
//! refused (`QueueFull`) only when the requests submitted but not yet
//! started already number `max_queue` plus the free running slots
//! (`max_running` minus the sequences running as of the engine's last
//! step). Equivalently: at most `max_running + max_queue` requests are
//! started-or-waiting at once. A started request stops counting as waiting
//! for good: a sequence preempted back to waiting (when KV blocks run out)
//! is not counted again.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Counters shared by the engine handle (which admits) and the engine
/// thread (which starts, finishes and drops requests).
#[derive(Debug)]
pub(crate) struct Admission {
    max_queue: usize,
    max_running: usize,
    /// Requests submitted and not yet started (in the command channel or
    /// the engine's waiting list).
    queued: AtomicUsize,
    /// Sequences running as of the engine's last step.
    running: AtomicUsize,
}

impl Admission {
    pub(crate) fn new(max_queue: usize, max_running: usize) -> Self {
        Self {
            max_queue,
            max_running,
            queued: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
        }
    }

    /// Counts one more waiting request, or false when the queue is full.
    pub(crate) fn try_enter(&self) -> bool {
        let mut queued = self.queued.load(Ordering::SeqCst);
        loop {
            let free = self
                .max_running
                .saturating_sub(self.running.load(Ordering::SeqCst));
            if queued >= self.max_queue.saturating_add(free) {
                return false;
            }
            match self.queued.compare_exchange_weak(
                queued,
                queued + 1,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => return true,
                Err(now) => queued = now,
            }
        }
    }

    /// Requests submitted and not yet started.
    pub(crate) fn queued(&self) -> usize {
        self.queued.load(Ordering::SeqCst)
    }

    /// `n` waiting requests started, were dropped, or failed.
    pub(crate) fn leave(&self, n: usize) {
        if n > 0 {
            // Never below zero, even if the engine thread miscounted.
            let _ = self
                .queued
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |q| {
                    Some(q.saturating_sub(n))
                });
        }
    }

    /// The engine thread's count of running sequences. Set before the
    /// requests that started are released with [`leave`](Self::leave), so a
    /// concurrent `try_enter` never misses them in both counts.
    pub(crate) fn set_running(&self, n: usize) {
        self.running.store(n, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_engine_takes_its_free_slots_plus_the_queue() {
        let a = Admission::new(8, 64);
        assert_eq!((0..100).filter(|_| a.try_enter()).count(), 72);
        // The engine starts 64 of them: 8 still wait, the queue is full.
        a.set_running(64);
        a.leave(64);
        assert!(!a.try_enter());
        // Ten finish: ten slots are free again.
        a.set_running(54);
        assert_eq!((0..100).filter(|_| a.try_enter()).count(), 10);
        a.leave(1000);
        a.set_running(0);
        assert_eq!((0..100).filter(|_| a.try_enter()).count(), 72);
    }
}
