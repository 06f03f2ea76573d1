//! Batch-1 decode speed of a GGUF model with its weights dequantized to f32
//! and kept quantized (int8, int8 with residual, and f32 activations), on the CPU, model steps
//! straight (no scheduler): each step runs one token through every layer
//! and the LM head; also the prefill of the prompt (one batch of
//! `prompt_len` rows). Beside wall time it prints the CPU time the process
//! spent per step (all threads, from `/proc/self/task/*/schedstat`), which
//! other programs competing for the cores do not inflate. Prints the median step time of each way, interleaved
//! round by round so that a load change on the machine hits all alike.
//!
//!     cargo run --release -p gyre-engine --example quantbench -- <model.gguf> [steps] [rounds] [prompt_len]

use std::path::PathBuf;
use std::time::Instant;

use gyre_engine::internals::{Model, SeqInput, load_model_with};
use gyre_engine::{Activations, DeviceChoice, LoadOptions};

/// CPU seconds this process's threads have run (Linux), 0 elsewhere.
fn cpu_seconds() -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    let ns: u64 = tasks
        .filter_map(Result::ok)
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    ns as f64 * 1e-9
}

/// What one way measured: prefill wall and CPU seconds, the median and the
/// fastest decode step's wall seconds and the mean CPU seconds per decode
/// step. On a shared machine the fastest step is the one least disturbed.
struct Timing {
    prefill: f64,
    prefill_cpu: f64,
    step: f64,
    fastest: f64,
    step_cpu: f64,
}

/// A `plen`-token prefill, then `steps` batch-1 decode steps.
fn decode_steps(model: &dyn Model, plen: usize, steps: usize) -> Timing {
    let bs = 16usize;
    let total = plen + steps + 1;
    let blocks = total.div_ceil(bs);
    let mut pool = model
        .new_pool(blocks as i64, bs as i64, model.kind())
        .expect("pool");
    let table: Vec<u32> = (0..blocks as u32).collect();
    let prompt: Vec<u32> = (0..plen as u32).map(|i| 100 + (i * 7919) % 30000).collect();
    let run = |tokens: &[u32], start: usize, pool: &mut _| {
        let h = model
            .forward(
                &[SeqInput {
                    tokens,
                    start: start as i64,
                    block_table: &table,
                    seq_len: start + tokens.len(),
                }],
                pool,
            )
            .expect("forward");
        let last = h.narrow(0, tokens.len() as i64 - 1, 1);
        let logits = model.logits(&last).expect("logits");
        logits.argmax(-1, false).int64_value(&[0]) as u32
    };
    let (t0, c0) = (Instant::now(), cpu_seconds());
    let mut next = run(&prompt, 0, &mut pool);
    let prefill = t0.elapsed().as_secs_f64();
    let prefill_cpu = cpu_seconds() - c0;
    let c0 = cpu_seconds();
    let mut times = Vec::with_capacity(steps);
    for s in 0..steps {
        let t0 = Instant::now();
        next = run(&[next], plen + s, &mut pool);
        times.push(t0.elapsed().as_secs_f64());
    }
    let step_cpu = (cpu_seconds() - c0) / steps as f64;
    times.sort_by(f64::total_cmp);
    Timing {
        prefill,
        prefill_cpu,
        step: times[times.len() / 2],
        fastest: times[0],
        step_cpu,
    }
}

fn main() {
    let _guard = tch::no_grad_guard();
    let args: Vec<String> = std::env::args().collect();
    let path = PathBuf::from(args.get(1).expect("model.gguf"));
    let steps: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(32);
    let rounds: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(3);
    let plen: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(32);
    let ways = [
        ("f32 (dequantized)", true, Activations::Int8),
        ("quantized, int8 activations", false, Activations::Int8),
        (
            "quantized, int8 + residual",
            false,
            Activations::Int8Residual,
        ),
        ("quantized, f32 activations", false, Activations::F32),
    ];
    let models: Vec<_> = ways
        .iter()
        .map(|&(_, dequantize, activations)| {
            let opts = LoadOptions {
                dequantize,
                activations,
            };
            load_model_with(&path, DeviceChoice::Cpu, opts).expect("loads")
        })
        .collect();
    println!("libtorch threads: {}", tch::get_num_threads());
    for round in 0..rounds {
        for ((name, ..), model) in ways.iter().zip(&models) {
            let t = decode_steps(model.as_ref(), plen, steps);
            println!(
                "round {round}: {name}: decode step {:.2} ms median = {:.1} tok/s \
                 (fastest {:.2} ms), {:.2} CPU-ms; prefill of {plen} tokens {:.0} ms, \
                 {:.0} CPU-ms",
                t.step * 1e3,
                1.0 / t.step,
                t.fastest * 1e3,
                t.step_cpu * 1e3,
                t.prefill * 1e3,
                t.prefill_cpu * 1e3
            );
        }
    }
}
