//! Weights and KV cache on huge pages or not, side by side in one process:
//! two engines on the same model, one loaded with transparent huge pages
//! (the default, see `engine/src/pages.rs`) and one without (as
//! `GYRE_HUGE_PAGES=0`), taking turns at the same rounds of `streams`
//! concurrent greedy requests. Prints each round's decode tokens/s and the
//! geometric mean of each engine's after the first pair (a warm-up), so
//! the machine's drift falls on both alike.
//!
//!     cargo run --release -p gyre-engine --example hugepages -- <model dir> [prompt_len] [new_tokens] [streams] [rounds]
//!
//! `WEIGHTS=f32` dequantizes a GGUF's weights at load.
use std::time::Instant;

use gyre_engine::internals::set_huge_pages;
use gyre_engine::{Engine, EngineOptions, Event, GenerateRequest, Sampling};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = args.get(1).expect("model dir");
    let arg = |i: usize, default: u32| -> u32 {
        args.get(i).and_then(|s| s.parse().ok()).unwrap_or(default)
    };
    let (plen, new_tokens, streams, rounds) = (arg(2, 32), arg(3, 128), arg(4, 16), arg(5, 22));
    let mut o = EngineOptions::new(dir);
    o.max_running = o.max_running.max(streams as usize);
    if std::env::var("WEIGHTS").is_ok_and(|v| v == "f32") {
        o.load_options.dequantize = true;
    }
    // Load order alternates with the rounds' order: the small-page engine
    // loads first and runs second.
    set_huge_pages(false);
    let small = Engine::start(o.clone()).expect("engine");
    set_huge_pages(true);
    let huge = Engine::start(o).expect("engine");
    let rollup = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap_or_default();
    if let Some(l) = rollup.lines().find(|l| l.starts_with("AnonHugePages")) {
        println!("{l}");
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("rt");
    let mut logs = [0f64; 2];
    for round in 0..rounds {
        let (name, e) = if round % 2 == 0 {
            ("huge", &huge)
        } else {
            ("small", &small)
        };
        let prompt: Vec<u32> = (0..plen)
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
        let mut n = 0u32;
        rt.block_on(async {
            for mut rx in rxs {
                while let Some(ev) = rx.recv().await {
                    match ev {
                        Event::Token(_) => n += 1,
                        Event::Finished { .. } => break,
                        _ => {}
                    }
                }
            }
        });
        let rate = f64::from(n) / t0.elapsed().as_secs_f64();
        println!("round {round} ({name} pages): {rate:.1} tok/s");
        if round >= 2 {
            logs[(round % 2) as usize] += rate.ln();
        }
    }
    let pairs = f64::from(rounds.saturating_sub(2) / 2).max(1.0);
    let (h, s) = ((logs[0] / pairs).exp(), (logs[1] / pairs).exp());
    println!(
        "geometric mean over {pairs} pairs: huge pages {h:.1} tok/s, small pages {s:.1} tok/s, ratio {:.3}",
        h / s
    );
}
