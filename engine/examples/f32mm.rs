//! Times the CPU's packed f32 matrix product alone (no model): `x W^T` for
//! random weights of SmolLM2-135M's projection shapes at the given numbers
//! of activation rows. Mean milliseconds per call and the FLOP/s reached.
//!
//!     cargo run --release -p gyre-engine --example f32mm -- [rows,..] [threads] [iters]
//!
//! For many rows, run it with the glibc settings the `gyre` binary runs
//! with (`MALLOC_MMAP_THRESHOLD_=268435456 MALLOC_TRIM_THRESHOLD_=1073741824`,
//! see `gyre/src/main.rs`): without them each call's output (100 MB for the
//! head at 512 rows) is a fresh mapping whose pages fault in during the
//! product, and 512 rows measured 290-330 GFLOP/s instead of 400-460.
//!
//! `F32MM_CACHED=1` times one copy of each weight, which the caches hold
//! (the head's does not), instead of cycling through copies that overflow
//! them: the arithmetic's own rate, without the memory stream.
//! `F32MM_AVX2=1` runs the AVX2 kernels on a CPU with AVX-512.
use gyre_engine::internals::{set_f32_avx2, time_f32_matmul};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rows: Vec<usize> = args
        .get(1)
        .map(|s| s.split(',').filter_map(|v| v.parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 16, 512]);
    let threads: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(2);
    let iters: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(20);
    let cached = std::env::var("F32MM_CACHED").is_ok_and(|v| v == "1");
    set_f32_avx2(std::env::var("F32MM_AVX2").is_ok_and(|v| v == "1"));
    for &m in &rows {
        for (name, n, k) in [
            ("qkv", 960, 576usize),
            ("gate/up", 3072, 576),
            ("down", 576, 1536),
            ("head", 49152, 576),
        ] {
            let it = (iters * 64 / m.max(1)).max(3);
            let ms = time_f32_matmul(n, k, m, threads, it, cached).expect("timing");
            println!(
                "m={m} {name} [{n}x{k}]: {ms:.3} ms ({:.1} GFLOP/s)",
                2.0 * (m * n * k) as f64 / ms / 1e6
            );
        }
    }
}
