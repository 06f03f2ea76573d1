//! Times the CPU's decode attention alone (no model): 16 sequences (or
//! the first argument's count) of SmolLM2-135M's heads (9 query heads, 3
//! KV heads of 64) at the given numbers of cached positions, over 30
//! layers' separate pools, so that keys and values stream from memory as
//! in a decode step. Mean microseconds per layer and the bytes of keys
//! and values read per second.
//!
//!     cargo run --release -p gyre-engine --example attntime -- [seqs] [context,..] [threads] [iters]
//!
//! `HEADS=h,kv,dim` times other heads; `KV=f16` a float16 cache;
//! `LAYERS=1` one layer's pool, which the caches hold (the arithmetic's
//! own rate).
//!
//! `ATTN_AB=1` compares, on a CPU with AVX-512, the AVX-512 kernel against
//! the AVX2 one (`set_attn_avx2`) in one process: `ROUNDS` (default 8)
//! timings at each context, alternating, and the geometric mean of each
//! kernel's, so that the machine's drift falls on both alike.
//! `ATTN_PF_AB=1` compares the same way the kernels prefetching keys and
//! values into L2 (the default) against into L1 (`set_attn_prefetch_l1`);
//! with `ATTN_AVX2=1` (on a CPU with AVX-512), the AVX2 kernel's.
use gyre_engine::internals::{set_attn_avx2, set_attn_prefetch_l1, time_decode_attention};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let seqs: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(16);
    let contexts: Vec<usize> = args
        .get(2)
        .map(|s| s.split(',').filter_map(|v| v.parse().ok()).collect())
        .unwrap_or_else(|| vec![64, 160, 288]);
    let threads: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(2);
    let iters: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(20);
    let heads = std::env::var("HEADS")
        .ok()
        .and_then(|v| {
            let p: Vec<usize> = v.split(',').filter_map(|x| x.parse().ok()).collect();
            (p.len() == 3).then(|| (p[0], p[1], p[2]))
        })
        .unwrap_or((9, 3, 64));
    let f16 = std::env::var("KV").is_ok_and(|v| v == "f16");
    let layers: usize = std::env::var("LAYERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let kernels = std::env::var("ATTN_AB").is_ok_and(|v| v == "1");
    let prefetch = std::env::var("ATTN_PF_AB").is_ok_and(|v| v == "1");
    let ab = kernels || prefetch;
    if prefetch && std::env::var("ATTN_AVX2").is_ok_and(|v| v == "1") {
        set_attn_avx2(true);
    }
    // Side A (false) and side B (true), and what sets a side.
    let (label_a, label_b, set): (&str, &str, fn(bool)) = if prefetch {
        ("prefetch into L2", "into L1", set_attn_prefetch_l1)
    } else {
        ("AVX-512", "AVX2", set_attn_avx2)
    };
    let rounds: usize = std::env::var("ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let name = format!("heads {heads:?}{}", if f16 { ", f16" } else { "" });
    for &t in &contexts {
        let bytes = 2 * seqs * t * heads.1 * heads.2 * if f16 { 2 } else { 4 };
        let time =
            || time_decode_attention(heads, seqs, t, layers, threads, iters, f16).expect("timing");
        if !ab {
            let ms = time();
            println!(
                "{seqs} seqs x {t} positions, {name}: {:.1} us a layer ({:.1} GB/s of keys and values)",
                ms * 1e3,
                bytes as f64 / ms / 1e6
            );
            continue;
        }
        let mut logs = [0f64; 2];
        for round in 0..2 * rounds {
            let b = round % 2 == 1;
            set(b);
            let ms = time();
            logs[usize::from(b)] += ms.ln();
            println!(
                "{seqs} seqs x {t} positions, {name}, {}: {:.1} us a layer",
                if b { label_b } else { label_a },
                ms * 1e3
            );
        }
        set(false);
        let [a, b] = logs.map(|l| (l / rounds as f64).exp() * 1e3);
        println!(
            "{seqs} seqs x {t} positions, {name}: geometric means {label_a} {a:.1} us, {label_b} {b:.1} us a layer: {label_a} {:.3}x",
            b / a
        );
    }
}
