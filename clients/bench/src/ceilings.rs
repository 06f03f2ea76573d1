//! The machine's ceilings that L1 holds its figures against: the memory
//! copy bandwidth (measured here, with plain slice copies) and the f32
//! matrix-product peak (measured by `matmul_peak.py`: the fastest of
//! libtorch's and NumPy's GEMMs on square matrices with the same thread
//! count; on AMD CPUs libtorch's MKL runs its AVX2 path at about half of
//! what OpenBLAS's AVX-512 kernels reach).
//!
//! Copy bandwidth counts bytes read plus bytes written per second, as
//! `tests/gpu/bandwidth.py` does on the GPU: `threads` threads each copy
//! their share of a buffer far larger than the caches, and the best of a few
//! passes counts.

use std::time::Instant;

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use crate::reference::Python;

/// Bytes each copy pass moves from source to destination.
const COPY_BYTES: usize = 512 << 20;
const COPY_PASSES: usize = 5;

/// The measured memory copy bandwidth, bytes read + written per second.
pub fn copy_bandwidth(threads: usize) -> f64 {
    let threads = threads.max(1);
    let chunk = COPY_BYTES / threads;
    let src = vec![1u8; chunk * threads];
    let mut dst = vec![0u8; chunk * threads];
    let mut best = f64::INFINITY;
    for _ in 0..COPY_PASSES {
        let started = Instant::now();
        std::thread::scope(|s| {
            for (d, from) in dst.chunks_mut(chunk).zip(src.chunks(chunk)) {
                s.spawn(move || d.copy_from_slice(from));
            }
        });
        best = best.min(started.elapsed().as_secs_f64());
        std::hint::black_box(&dst);
    }
    2.0 * (chunk * threads) as f64 / best
}

/// What `matmul_peak.py` prints.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MatmulPeak {
    /// Best FLOP/s over the sizes tried (2 n^3 per product).
    pub flops: f64,
    /// The size that gave it.
    pub n: usize,
    pub threads: usize,
    pub torch: String,
    /// The library that gave `flops`.
    #[serde(default)]
    pub source: Option<String>,
    /// Each library's best FLOP/s.
    #[serde(default)]
    pub by_source: std::collections::BTreeMap<String, f64>,
}

impl MatmulPeak {
    /// "470.2 GFLOP/s, numpy (OpenBLAS, AVX-512 kernels); torch.mm 224.7"
    pub fn describe(&self) -> String {
        let mut s = format!("{:.1} GFLOP/s", self.flops / 1e9);
        if let Some(src) = &self.source {
            s += &format!(", {src}");
        }
        let others: Vec<String> = self
            .by_source
            .iter()
            .filter(|(k, _)| Some(*k) != self.source.as_ref())
            .map(|(k, v)| format!("{k} {:.1}", v / 1e9))
            .collect();
        if !others.is_empty() {
            s += &format!("; {}", others.join(", "));
        }
        s
    }
}

/// Runs `matmul_peak.py` with `threads` threads.
pub async fn matmul_peak(python: &Python, threads: usize) -> anyhow::Result<MatmulPeak> {
    let threads = threads.to_string();
    let out = python
        .run("matmul_peak.py", &["--threads".as_ref(), threads.as_ref()])
        .await?;
    let line = out
        .lines()
        .last()
        .context("matmul_peak.py printed nothing")?;
    serde_json::from_str(line).with_context(|| format!("matmul_peak.py printed {line:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peak_output_parses() {
        let p: MatmulPeak = serde_json::from_str(
            r#"{"flops": 1.5e11, "n": 2048, "threads": 2, "torch": "2.11.0"}"#,
        )
        .expect("parses");
        assert_eq!((p.n, p.threads), (2048, 2));
        assert_eq!(p.describe(), "150.0 GFLOP/s");
        let p: MatmulPeak = serde_json::from_str(
            r#"{"flops": 4.7e11, "n": 2048, "source": "numpy (OpenBLAS)", "threads": 2,
                "torch": "2.11.0", "by_source": {"torch.mm": 2.2e11, "numpy (OpenBLAS)": 4.7e11}}"#,
        )
        .expect("parses");
        assert_eq!(
            p.describe(),
            "470.0 GFLOP/s, numpy (OpenBLAS); torch.mm 220.0"
        );
    }
}
