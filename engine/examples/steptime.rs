//! Times the engine on one model: prefill of a long prompt and batch-1
//! decode, straight through `Engine` (no gRPC), for profiling.
//!
//!     cargo run --release -p gyre-engine --example steptime -- <model dir> [prompt_len] [new_tokens] [streams]
//!
//! `DEVICE=cuda` (or `auto`) runs it on the GPU; the default is the CPU.
use std::time::Instant;

use gyre_engine::{DeviceChoice, Engine, EngineOptions, Event, GenerateRequest, Sampling};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = args.get(1).expect("model dir");
    let plen: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1500);
    let new_tokens: u32 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(64);
    let streams: u32 = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(1);
    let mut o = EngineOptions::new(dir);
    o.device = match std::env::var("DEVICE").as_deref() {
        Ok("cuda") => DeviceChoice::Cuda,
        Ok("auto") => DeviceChoice::Auto,
        _ => DeviceChoice::Cpu,
    };
    o.max_running = o.max_running.max(streams as usize);
    println!("libtorch threads on main: {}", tch::get_num_threads());
    let e = Engine::start(o).expect("engine");
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("rt");
    let rounds: u32 = std::env::var("ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    for round in 0..rounds {
        let prompt: Vec<u32> = (0..plen as u32)
            .map(|i| 100 + (i * 7919 + round) % 30000)
            .collect();
        let req = GenerateRequest {
            sampling: Sampling {
                temperature: 0.0,
                ..Sampling::default()
            },
            ignore_eos: true,
            cache_salt: format!("{round}"),
            ..GenerateRequest::new(prompt, new_tokens)
        };
        let t0 = Instant::now();
        let rxs: Vec<_> = (0..streams)
            .map(|i| {
                let mut r = req.clone();
                r.prompt[0] = 100 + i;
                e.submit(r).expect("submit")
            })
            .collect();
        let mut first = None;
        let mut n = 0;
        rt.block_on(async {
            for mut rx in rxs {
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
            }
        });
        let total = t0.elapsed();
        let ttft = first.expect("a token");
        println!(
            "round {round}: {streams} streams: TTFT {:.1} ms for {plen} prompt tokens; then {:.1} tok/s ({} tokens in {:.2} s)",
            ttft.as_secs_f64() * 1e3,
            n as f64 / total.as_secs_f64(),
            n,
            total.as_secs_f64()
        );
    }
}
