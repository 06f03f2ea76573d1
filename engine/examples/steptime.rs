//! Times the engine on one model: prefill of a long prompt and batch-1
//! decode, straight through `Engine` (no gRPC), for profiling.
//!
//!     cargo run --release -p gyre-engine --example steptime -- <model dir> [prompt_len] [new_tokens]
use std::time::Instant;

use gyre_engine::{DeviceChoice, Engine, EngineOptions, Event, GenerateRequest, Sampling};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = args.get(1).expect("model dir");
    let plen: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1500);
    let new_tokens: u32 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(64);
    let mut o = EngineOptions::new(dir);
    o.device = DeviceChoice::Cpu;
    let e = Engine::start(o).expect("engine");
    let rt = tokio::runtime::Builder::new_current_thread().build().expect("rt");
    for round in 0..2 {
        let prompt: Vec<u32> = (0..plen as u32).map(|i| 100 + (i * 7919 + round) % 30000).collect();
        let req = GenerateRequest {
            prompt,
            max_tokens: new_tokens,
            sampling: Sampling { temperature: 0.0, ..Sampling::default() },
            stop_token_ids: vec![],
            ignore_eos: true,
            priority: 0,
            cache_salt: format!("{round}"),
        };
        let t0 = Instant::now();
        let mut rx = e.submit(req).expect("submit");
        let mut first = None;
        let mut n = 0;
        rt.block_on(async {
            while let Some(ev) = rx.recv().await {
                match ev {
                    Event::Token(_) => {
                        n += 1;
                        first.get_or_insert(t0.elapsed());
                    }
                    Event::Finished { .. } => break,
                    _ => {}
                }
            }
        });
        let total = t0.elapsed();
        let ttft = first.expect("a token");
        println!(
            "round {round}: TTFT {:.1} ms for {plen} prompt tokens; decode {:.2} ms/token over {} tokens",
            ttft.as_secs_f64() * 1e3,
            (total - ttft).as_secs_f64() * 1e3 / (n - 1).max(1) as f64,
            n
        );
    }
}
