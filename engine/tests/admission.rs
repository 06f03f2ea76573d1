//! Admission (`EngineOptions::queue_capacity`, the `--max-queue` flag)
//! counts requests waiting while the engine is full, not a burst the engine
//! can start at its next step: on an idle engine with 64 running slots and
//! a queue of 8, a burst of 72 is accepted whole; one more, while all 72 are
//! running or waiting, is `QueueFull`; requests that end (here: dropped,
//! which cancels them) give their places back.

use std::path::PathBuf;

use gyre_engine::{DeviceChoice, Engine, EngineError, EngineOptions, GenerateRequest};

fn model_dir() -> PathBuf {
    std::env::var_os("GYRE_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.gyre/models"))
        .join("tiny-llama")
}

const MAX_RUNNING: usize = 64;
const MAX_QUEUE: usize = 8;

/// A request that runs far longer than the test looks at it.
fn long(i: u32) -> GenerateRequest {
    GenerateRequest {
        ignore_eos: true,
        ..GenerateRequest::new(vec![100 + i, 200 + i, 300 + i, 400 + i], 1000)
    }
}

#[test]
fn a_burst_the_engine_can_start_is_never_refused_and_one_more_is() {
    let mut o = EngineOptions::new(model_dir());
    o.device = DeviceChoice::Cpu;
    o.max_running = MAX_RUNNING;
    o.queue_capacity = MAX_QUEUE;
    let e = Engine::start(o).expect("engine starts (build fixtures with `make models`)");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let burst = (MAX_RUNNING + MAX_QUEUE) as u32;
    rt.block_on(async {
        // Back to back, against the idle engine.
        let held: Vec<_> = (0..burst)
            .map(|i| {
                e.submit(long(i))
                    .unwrap_or_else(|err| panic!("request {i} of the burst refused: {err}"))
            })
            .collect();
        // All of them run or wait (none can have finished): full.
        let refused = e.submit(long(burst));
        assert!(
            matches!(refused, Err(EngineError::QueueFull)),
            "{refused:?}"
        );
        let s = e.wait_stats(|s| s.running as usize == MAX_RUNNING).await;
        assert_eq!(s.waiting as usize, MAX_QUEUE, "{s:?}");
        let refused = e.submit(long(burst));
        assert!(
            matches!(refused, Err(EngineError::QueueFull)),
            "{refused:?}"
        );

        // Cancel them all: every place comes back.
        drop(held);
        e.wait_stats(|s| s.running == 0 && s.waiting == 0).await;
        let again: Vec<_> = (0..burst)
            .map(|i| {
                e.submit(long(i))
                    .unwrap_or_else(|err| panic!("request {i} of the second burst refused: {err}"))
            })
            .collect();
        assert!(matches!(e.submit(long(burst)), Err(EngineError::QueueFull)));
        drop(again);
    });
}

#[test]
fn short_requests_that_finish_give_their_places_back() {
    let mut o = EngineOptions::new(model_dir());
    o.device = DeviceChoice::Cpu;
    o.max_running = 2;
    o.queue_capacity = 1;
    let e = Engine::start(o).expect("engine starts (build fixtures with `make models`)");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        // Many rounds of requests that start and finish (one token each, so
        // each starts and ends within one step): none may leak a place.
        for round in 0..20u32 {
            let rxs: Vec<_> = (0..3)
                .map(|i| {
                    e.submit(GenerateRequest::new(vec![100 + round, 200 + i], 1))
                        .unwrap_or_else(|err| panic!("round {round}: refused: {err}"))
                })
                .collect();
            for mut rx in rxs {
                while let Some(ev) = rx.recv().await {
                    if let gyre_engine::Event::Failed(err) = ev {
                        panic!("round {round}: {err}");
                    }
                }
            }
            e.wait_stats(|s| s.running == 0 && s.waiting == 0).await;
        }
    });
}
