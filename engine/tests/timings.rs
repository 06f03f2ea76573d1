//! The per-request timings the engine reports with `Event::Finished` (what
//! the metrics' queue, prefill and decode times come from): each phase is
//! measured, they add up to no more than the request's whole life, and a
//! request that had to wait for a running slot reports its wait as queue
//! time.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use gyre_engine::{DeviceChoice, Engine, EngineOptions, Event, GenerateRequest, Sampling, Timings};
use tokio::sync::mpsc::UnboundedReceiver;

fn model_dir() -> PathBuf {
    std::env::var_os("GYRE_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.gyre/models"))
        .join("tiny-llama")
}

fn greedy(len: u32, max_tokens: u32) -> GenerateRequest {
    GenerateRequest {
        sampling: Sampling {
            temperature: 0.0,
            ..Sampling::default()
        },
        ignore_eos: true,
        ..GenerateRequest::new((0..len).map(|i| 100 + i * 7).collect(), max_tokens)
    }
}

/// Reads events to the finish: (timings, completion tokens, when received).
async fn finish(mut rx: UnboundedReceiver<Event>) -> (Timings, u32, Instant) {
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Finished { usage, timings, .. } => {
                return (timings, usage.completion_tokens, Instant::now());
            }
            Event::Failed(e) => panic!("request failed: {e}"),
            _ => {}
        }
    }
    panic!("the engine dropped the request");
}

#[test]
fn finished_requests_report_queue_prefill_and_decode_times() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut o = EngineOptions::new(model_dir());
    o.device = DeviceChoice::Cpu;
    // One running slot: the second request waits for the first to end.
    o.max_running = 1;
    let engine = Engine::start(o).expect("engine starts (build fixtures with `make models`)");
    rt.block_on(async {
        let start = Instant::now();
        let a = engine.submit(greedy(24, 12)).expect("submit a");
        let b = engine.submit(greedy(20, 6)).expect("submit b");
        let ((ta, na, end_a), (tb, nb, end_b)) = tokio::join!(finish(a), finish(b));
        assert_eq!((na, nb), (12, 6));
        for (t, end) in [(ta, end_a), (tb, end_b)] {
            assert!(t.prefill > Duration::ZERO, "{t:?}");
            assert!(t.decode > Duration::ZERO, "{t:?}");
            assert!(t.queued + t.prefill + t.decode <= end - start, "{t:?}");
        }
        // b could not start before a had ended: its queue time covers a's decode.
        assert!(tb.queued >= ta.decode, "a {ta:?}, b {tb:?}");
        assert!(end_b >= end_a);
    });
}
