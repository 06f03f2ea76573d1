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
use gyre_engine::internals::time_decode_attention;

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
    for &t in &contexts {
        let ms =
            time_decode_attention(heads, seqs, t, layers, threads, iters, f16).expect("timing");
        let bytes = 2 * seqs * t * heads.1 * heads.2 * if f16 { 2 } else { 4 };
        println!(
            "{seqs} seqs x {t} positions, heads {heads:?}{}: {:.1} us a layer ({:.1} GB/s of keys and values)",
            if f16 { ", f16" } else { "" },
            ms * 1e3,
            bytes as f64 / ms / 1e6
        );
    }
}
