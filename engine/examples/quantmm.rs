//! Times the CPU's quantized matrix products alone (no model): `x W^T` for
//! a random Q8_0, Q4_1 or Q4_K weight of SmolLM2-135M's projection shapes
//! (for Q4_K, whose super-blocks hold 256 values, k rounded up to 768),
//! at the given numbers of activation rows, with int8, int8 + residual and
//! f32 activations. Mean milliseconds per call and the multiply-adds per
//! second they reach, with each SIMD kernel this CPU runs (AVX-512 VNNI,
//! AVX2).
//!
//!     cargo run --release -p gyre-engine --example quantmm -- [rows,..] [threads] [iters]
//!
//! `SHAPE=n,k` times that weight shape alone; `FORMATS` (of q8_0, q4_1,
//! q4_k, q6_k) and `ACTS` (of int8, int8-residual, f32) pick which, all
//! but Q6_K by default.
use gyre_engine::Activations;
use gyre_engine::gguf::GgmlType;
use gyre_engine::internals::{QuantKernel, time_quant_matmul};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rows: Vec<usize> = args
        .get(1)
        .map(|s| s.split(',').filter_map(|v| v.parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 16, 512]);
    let threads: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(2);
    let iters: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(20);
    let kernels = [QuantKernel::Avx512Vnni, QuantKernel::Avx2];
    // `SHAPE=n,k` times that one weight shape instead (e.g. Gemma 3 270M's
    // vocabulary projection, 262144,640).
    let shapes: Vec<(&str, usize, usize)> = match std::env::var("SHAPE").ok().and_then(|v| {
        let (n, k) = v.split_once(',')?;
        Some((n.parse().ok()?, k.parse().ok()?))
    }) {
        Some((n, k)) => vec![("SHAPE", n, k)],
        None => vec![
            ("qkv", 960, 576),
            ("gate/up", 3072, 576),
            ("down", 576, 1536),
        ],
    };
    let formats = pick(
        "FORMATS",
        "q8_0,q4_1,q4_k",
        &[
            ("q8_0", GgmlType::Q8_0),
            ("q4_1", GgmlType::Q4_1),
            ("q4_k", GgmlType::Q4K),
            ("q6_k", GgmlType::Q6K),
        ],
    );
    let acts = pick(
        "ACTS",
        "int8,int8-residual,f32",
        &[
            ("int8", Activations::Int8),
            ("int8-residual", Activations::Int8Residual),
            ("f32", Activations::F32),
        ],
    );
    for kernel in kernels.into_iter().filter(|k| k.runs_here()) {
        for &fmt in &formats {
            for &m in &rows {
                for &(name, n, k) in &shapes {
                    let k = k.next_multiple_of(fmt.block().0);
                    let it = (iters * 64 / m.max(1)).max(3);
                    let times = time_quant_matmul(fmt, (n, k, m), threads, it, kernel, &acts)
                        .expect("timing");
                    let line: Vec<String> = times
                        .iter()
                        .map(|(acts, ms)| {
                            format!(
                                "{acts:?} {ms:.3} ms ({:.1} GMAC/s)",
                                (m * n * k) as f64 / ms / 1e6
                            )
                        })
                        .collect();
                    println!(
                        "{kernel:?} {fmt:?} m={m} {name} [{n}x{k}]: {}",
                        line.join(", ")
                    );
                }
            }
        }
    }
}

/// The comma-separated names in `var` (else `default`), each looked up in
/// `table`.
fn pick<T: Copy>(var: &str, default: &str, table: &[(&str, T)]) -> Vec<T> {
    std::env::var(var)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .map(|name| {
            let name = name.trim().to_lowercase();
            table
                .iter()
                .find(|(n, _)| *n == name)
                .map(|&(_, v)| v)
                .unwrap_or_else(|| panic!("{var}: unknown name {name}"))
        })
        .collect()
}
