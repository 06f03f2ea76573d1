//! Times the engine on one model: prefill of a long prompt and batch-1
//! decode, straight through `Engine` (no gRPC), for profiling.
//!
//!     cargo run --release -p gyre-engine --example steptime -- <model dir> [prompt_len] [new_tokens] [streams]
//!
//! The `gyre` binary runs with `OMP_WAIT_POLICY=PASSIVE` and glibc's
//! `MALLOC_MMAP_THRESHOLD_=268435456 MALLOC_TRIM_THRESHOLD_=1073741824`
//! (see `gyre/src/main.rs`); set them here too for figures that match the
//! server's (without them libtorch's idle OpenMP thread spins after each of
//! its ops, on the core the compute threads need: the 16-stream bench
//! model's prompts took 135-148 ms instead of 88-101 ms).
//!
//! `DEVICE=cuda` (or `auto`) runs it on the GPU; the default is the CPU.
//! `TEMP=1` samples (temperature 1, top-p 0.9) instead of decoding greedily.
//! `WEIGHTS=f32` dequantizes a GGUF's weights at load (the default keeps
//! Q8_0/Q5_0/Q4_0/Q4_1/Q4_K/Q6_K matrices quantized on an AVX-512 VNNI or AVX2
//! CPU);
//! `WEIGHTS=q-f32act` keeps them quantized with f32 activations instead of
//! int8 ones; `WEIGHTS=q-int8` with int8 activations and no residual.
//! `GYRE_PROFILE_GRAPHS=1` also logs each decode graph's device time per
//! replay, back to back (see `engine/src/graph.rs`).
//!
//! `HUGE_PAGES_AB=1` compares weights and KV cache on huge pages or not
//! (`engine/src/pages.rs`) side by side in one process: a second engine on
//! the same model, loaded without huge pages (as `GYRE_HUGE_PAGES=0`),
//! takes every other round, and the geometric mean of each engine's rounds
//! after the first pair (a warm-up) is printed, so the machine's drift
//! falls on both alike.
//!
//! `KV=f16` runs with a float16 KV cache (`--kv-cache-dtype f16`);
//! `KV_AB=1` compares it side by side with the default (float32) as
//! `HUGE_PAGES_AB` does: the second engine has the float16 cache.
//!
//! `CHUNKS_AB=1` compares, on one engine, round by round, one-row
//! products whose threads take from the back of each other's regions
//! once their own is done (the default) against each thread doing its
//! own region alone (`engine/src/workers.rs`, `Workers::run_balanced`).
//! `PREFETCH_AB=1` compares the same way idle workers prefetching the next
//! one-row product's weights (the default) against not doing so
//! (`Workers::run_ranges`).
//! `UNIT_AB=a,b` compares the same way one-row f32 products cut into
//! units of `a` panels of 32 columns against `b` (2 or 4; see
//! `engine/src/gemm/mod.rs`, `one_row_panels`), e.g. `UNIT_AB=4,2`.
//! `ROWS_AB=1` compares the same way decode steps through the row path
//! (the default) against the tensor path (`engine/src/layers/rows.rs`).
//! `TILE_AB=1` compares the same way the AVX2 f32 tile taking k in chunks
//! of up to 32 (the default) against leaving its assembly loop for each
//! prefetch (`engine/src/gemm/avx2.rs`, `chunk`).
//! `SPREAD_AB=1` compares the same way products of several rows taken a
//! unit (a panel of 32 columns) at a time in balanced regions (the
//! default) against a few contiguous chunks a thread from one counter
//! (`engine/src/workers.rs`, `Workers::run_ranges`).
//! `AVX2_AB=1` compares the same way, on a CPU with AVX-512, the f32
//! products' AVX-512 kernels (the default) against their AVX2 ones
//! (`engine/src/gemm/mod.rs`, `set_f32_avx2`).
//! `QPF_AB=1` compares the same way the AVX-512 int8 kernel in products of
//! one row without prefetching the next group (the default) against with
//! it (`engine/src/quant/avx512.rs`, `int8_rows`).
//! `ATTN_PF_AB=1` compares the same way decode attention prefetching the
//! keys and values ahead into L2 (the default) against into L1
//! (`engine/src/attn/mod.rs`, `prefetch_row`).
use std::time::Instant;

use gyre_engine::internals::{
    set_attn_prefetch_l1, set_balanced_stealing, set_f32_avx2, set_gap_prefetch, set_huge_pages,
    set_one_row_panels, set_one_row_quant_prefetch, set_row_path, set_row_units, set_tile_chunks,
};
use gyre_engine::{
    Activations, DeviceChoice, Engine, EngineOptions, Event, GenerateRequest, KvCacheDtype,
    Sampling,
};

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new("warn,gyre_engine::graph=info")
            }),
        )
        .init();
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
    match std::env::var("WEIGHTS").as_deref() {
        Ok("f32") => o.load_options.dequantize = true,
        Ok("q-f32act") => o.load_options.activations = Activations::F32,
        Ok("q-int8") => o.load_options.activations = Activations::Int8,
        _ => {}
    }
    if let Ok(kv) = std::env::var("KV") {
        o.kv_cache_dtype = kv.parse().expect("KV: auto, f32 or f16");
    }
    println!("libtorch threads on main: {}", tch::get_num_threads());
    if std::env::var_os("OMP_WAIT_POLICY").is_none() {
        println!("note: OMP_WAIT_POLICY is unset; the gyre binary sets it to PASSIVE (see above)");
    }
    // The compared engine (small pages, or a float16 cache), if any, loads
    // first and runs second.
    let kv_ab = std::env::var("KV_AB").is_ok_and(|v| v == "1");
    let small = if kv_ab {
        let mut b = o.clone();
        b.kv_cache_dtype = KvCacheDtype::Float16;
        Some(Engine::start(b).expect("engine"))
    } else {
        std::env::var("HUGE_PAGES_AB")
            .is_ok_and(|v| v == "1")
            .then(|| {
                set_huge_pages(false);
                let small = Engine::start(o.clone()).expect("engine");
                set_huge_pages(true);
                small
            })
    };
    let chunks_ab = std::env::var("CHUNKS_AB").is_ok_and(|v| v == "1");
    let prefetch_ab = std::env::var("PREFETCH_AB").is_ok_and(|v| v == "1");
    let rows_ab = std::env::var("ROWS_AB").is_ok_and(|v| v == "1");
    let tile_ab = std::env::var("TILE_AB").is_ok_and(|v| v == "1");
    let spread_ab = std::env::var("SPREAD_AB").is_ok_and(|v| v == "1");
    let avx2_ab = std::env::var("AVX2_AB").is_ok_and(|v| v == "1");
    let qpf_ab = std::env::var("QPF_AB").is_ok_and(|v| v == "1");
    let attn_pf_ab = std::env::var("ATTN_PF_AB").is_ok_and(|v| v == "1");
    let unit_ab: Option<(usize, usize)> = std::env::var("UNIT_AB").ok().and_then(|v| {
        let (a, b) = v.split_once(',')?;
        Some((a.parse().ok()?, b.parse().ok()?))
    });
    let units = unit_ab.map(|(a, b)| {
        (
            format!("units of {a} panels"),
            format!("units of {b} panels"),
        )
    });
    // Each one-engine switch: its two sides' labels and what sets side A
    // (true) or side B (false) for a round.
    type Switch<'a> = (bool, &'a str, &'a str, fn(bool));
    let switches: [Switch; 8] = [
        (
            chunks_ab,
            "taking from others' regions",
            "one region a thread",
            set_balanced_stealing,
        ),
        (
            prefetch_ab,
            "prefetching between products",
            "no prefetch",
            set_gap_prefetch,
        ),
        (rows_ab, "row path", "tensor path", set_row_path),
        (
            tile_ab,
            "tile k in chunks",
            "tile k a prefetch at a time",
            set_tile_chunks,
        ),
        (
            spread_ab,
            "row products a unit at a time",
            "row products in chunks",
            set_row_units,
        ),
        (avx2_ab, "f32 AVX-512 kernels", "f32 AVX2 kernels", |a| {
            set_f32_avx2(!a)
        }),
        (
            qpf_ab,
            "one-row quantized without prefetch",
            "with prefetch",
            |a| set_one_row_quant_prefetch(!a),
        ),
        (
            attn_pf_ab,
            "attention prefetching into L2",
            "into L1",
            |a| set_attn_prefetch_l1(!a),
        ),
    ];
    // The switch flipped round by round on one engine, if any.
    let switch = switches.iter().find(|s| s.0);
    let (label_a, label_b) = match (kv_ab, switch, &units) {
        (true, _, _) => ("default KV", "f16 KV"),
        (false, Some(&(_, a, b, _)), _) => (a, b),
        (false, None, Some((a, b))) => (a.as_str(), b.as_str()),
        (false, None, None) => ("huge pages", "small pages"),
    };
    let one_engine = switch.is_some() || unit_ab.is_some();
    let huge = Engine::start(o).expect("engine");
    if small.is_some() {
        let rollup = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap_or_default();
        if let Some(l) = rollup.lines().find(|l| l.starts_with("AnonHugePages")) {
            println!("{l}");
        }
    }
    // Per engine (huge, small): the sum of log rates and the rounds.
    let mut logs = [(0f64, 0u32); 2];
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("rt");
    let rounds: u32 = std::env::var("ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    for round in 0..rounds {
        let (e, pages) = match &small {
            Some(small) if round % 2 == 1 => (small, format!(" ({label_b})")),
            Some(_) => (&huge, format!(" ({label_a})")),
            None if one_engine => {
                let side_a = round % 2 == 0;
                match (switch, unit_ab) {
                    (Some(&(_, _, _, set)), _) => set(side_a),
                    (None, Some((a, b))) => set_one_row_panels(if side_a { a } else { b }),
                    (None, None) => unreachable!("one_engine"),
                }
                let label = if round % 2 == 1 { label_b } else { label_a };
                (&huge, format!(" ({label})"))
            }
            None => (&huge, String::new()),
        };
        let prompt: Vec<u32> = (0..plen as u32)
            .map(|i| 100 + (i * 7919 + round) % 30000)
            .collect();
        // TEMP=1: temperature 1 with top-p 0.9 (seeded) instead of greedy.
        let sampled = std::env::var("TEMP").is_ok_and(|v| v == "1");
        let req = GenerateRequest {
            sampling: Sampling {
                temperature: if sampled { 1.0 } else { 0.0 },
                top_p: if sampled { 0.9 } else { 1.0 },
                seed: Some(u64::from(round)),
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
        let rate = n as f64 / total.as_secs_f64();
        println!(
            "round {round}{pages}: {streams} streams: TTFT {:.1} ms for {plen} prompt tokens; then {rate:.1} tok/s ({} tokens in {:.2} s)",
            ttft.as_secs_f64() * 1e3,
            n,
            total.as_secs_f64()
        );
        if round >= 2 {
            let side = &mut logs[(round % 2) as usize];
            side.0 += rate.ln();
            side.1 += 1;
        }
    }
    if small.is_some() || one_engine {
        let mean = |(sum, n): (f64, u32)| (sum / f64::from(n.max(1))).exp();
        let (h, s) = (mean(logs[0]), mean(logs[1]));
        println!(
            "geometric mean over rounds 2..{rounds}: {label_a} {h:.1} tok/s, {label_b} {s:.1} tok/s, ratio {:.3}",
            h / s
        );
    }
}
