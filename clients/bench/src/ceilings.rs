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
//! passes counts. Read bandwidth (for S2's memory-bound ceiling: a decode
//! step reads its weights and KV cache and writes little) counts bytes read
//! per second: each thread sums its share, four sequential streams at once
//! as a kernel walking several weight panels does.
//!
//! Both run over memory on transparent huge pages where the system allows
//! them ([`Words`]), as the engine keeps its weights (`engine/src/pages.rs`):
//! a ceiling measured on 4 KiB pages is lowered by their page walks and by
//! the hardware prefetchers stopping at each page's end. On a 2-core Zen 4,
//! alternated in one process (`gyre-bench ceilings`, three runs), copies
//! on huge pages measured 1.09-1.12x those on 4 KiB pages, reads
//! 0.97-1.08x.

use std::time::Instant;

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use crate::reference::Python;

/// Bytes each copy pass moves from source to destination.
const COPY_BYTES: usize = 512 << 20;
const COPY_PASSES: usize = 5;

/// The measured memory copy bandwidth, bytes read + written per second.
pub fn copy_bandwidth(threads: usize) -> f64 {
    copy_bandwidth_on(threads, Pages::Huge)
}

/// The memory a measurement runs over: huge pages (where the system
/// allows them), or small ones, for comparison (`gyre-bench ceilings`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pages {
    Huge,
    Small,
}

/// [`copy_bandwidth`] over `pages`.
pub fn copy_bandwidth_on(threads: usize, pages: Pages) -> f64 {
    let threads = threads.max(1);
    let words = (COPY_BYTES / 8).next_multiple_of(threads);
    let chunk = words / threads;
    let src = Words::filled(words, 1, pages);
    let mut dst = Words::filled(words, 0, pages);
    let mut best = f64::INFINITY;
    for _ in 0..COPY_PASSES {
        let started = Instant::now();
        std::thread::scope(|s| {
            for (d, from) in dst.chunks_mut(chunk).zip(src.chunks(chunk)) {
                s.spawn(move || d.copy_from_slice(from));
            }
        });
        best = best.min(started.elapsed().as_secs_f64());
        std::hint::black_box(&dst[..]);
    }
    2.0 * (words * 8) as f64 / best
}

/// The measured memory read bandwidth, bytes read per second.
pub fn read_bandwidth(threads: usize) -> f64 {
    read_bandwidth_on(threads, Pages::Huge)
}

/// [`read_bandwidth`] over `pages`.
pub fn read_bandwidth_on(threads: usize, pages: Pages) -> f64 {
    const STREAMS: usize = 4;
    let threads = threads.max(1);
    let words = (COPY_BYTES / 8).next_multiple_of(threads * STREAMS * 8);
    let mut src = Words::filled(words, 0, pages);
    for (i, w) in src.iter_mut().enumerate() {
        *w = i as u64;
    }
    let chunk = words / threads;
    let mut best = f64::INFINITY;
    for _ in 0..COPY_PASSES {
        let started = Instant::now();
        let sum = std::thread::scope(|s| {
            let handles: Vec<_> = src
                .chunks(chunk)
                .map(|part| s.spawn(move || sum_streams::<STREAMS>(part)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(0))
                .fold(0u64, u64::wrapping_add)
        });
        best = best.min(started.elapsed().as_secs_f64());
        std::hint::black_box(sum);
    }
    (words * 8) as f64 / best
}

/// A buffer of words for the measurements above: a fresh anonymous
/// mapping advised `MADV_HUGEPAGE` before its first touch, so its pages
/// fault in huge where transparent huge pages are left to `madvise` (as on
/// most Linux systems), or `MADV_NOHUGEPAGE` for small pages; the heap
/// where the mapping fails.
enum Words {
    Mapped(memmap2::MmapMut),
    Heap(Vec<u64>),
}

impl Words {
    /// `len` words, each `value` (written here, so every page is in).
    fn filled(len: usize, value: u64, pages: Pages) -> Self {
        let Ok(map) = memmap2::MmapMut::map_anon(len * 8) else {
            return Self::Heap(vec![value; len]);
        };
        // Refused advice (huge pages off) leaves small pages.
        #[cfg(target_os = "linux")]
        let _ = map.advise(match pages {
            Pages::Huge => memmap2::Advice::HugePage,
            Pages::Small => memmap2::Advice::NoHugePage,
        });
        #[cfg(not(target_os = "linux"))]
        let _ = pages;
        let mut words = Self::Mapped(map);
        words.fill(value);
        words
    }
}

impl std::ops::Deref for Words {
    type Target = [u64];
    fn deref(&self) -> &[u64] {
        match self {
            // A mapping starts on a page, so its bytes align as words.
            Self::Mapped(map) => bytemuck::cast_slice(map),
            Self::Heap(v) => v,
        }
    }
}

impl std::ops::DerefMut for Words {
    fn deref_mut(&mut self) -> &mut [u64] {
        match self {
            Self::Mapped(map) => bytemuck::cast_slice_mut(map),
            Self::Heap(v) => v,
        }
    }
}

/// The wrapping sum of `part`, read as `S` equal streams side by side,
/// eight words (a cache line) of each in turn.
fn sum_streams<const S: usize>(part: &[u64]) -> u64 {
    let len = part.len() / S / 8 * 8;
    let mut acc = [[0u64; 8]; S];
    for i in (0..len).step_by(8) {
        for (j, a) in acc.iter_mut().enumerate() {
            let line = &part[j * len + i..j * len + i + 8];
            for (x, &v) in a.iter_mut().zip(line) {
                *x = x.wrapping_add(v);
            }
        }
    }
    let tail = part[S * len..].iter().fold(0u64, |a, &v| a.wrapping_add(v));
    acc.iter().flatten().fold(tail, |a, &v| a.wrapping_add(v))
}

/// `gyre-bench ceilings`: copy and read bandwidth on huge pages and on
/// small ones, alternated `rounds` times (so the machine's drift falls on
/// both), each round's figures and their geometric means.
pub fn compare_pages(threads: usize, rounds: usize) {
    const ALL: [Pages; 2] = [Pages::Huge, Pages::Small];
    let rounds = rounds.max(1);
    let mut logs = [[0.0f64; 2]; 2];
    println!("copy (read + write) and read bandwidth, {threads} threads, GB/s");
    for r in 0..rounds {
        let mut line = format!("round {r}:");
        for (i, pages) in ALL.into_iter().enumerate() {
            let copy = copy_bandwidth_on(threads, pages) / 1e9;
            let read = read_bandwidth_on(threads, pages) / 1e9;
            logs[i][0] += copy.ln();
            logs[i][1] += read.ln();
            line += &format!(" {pages:?} pages: copy {copy:.1}, read {read:.1};");
        }
        println!("{}", line.trim_end_matches(';'));
    }
    for (i, pages) in ALL.into_iter().enumerate() {
        let mean = |l: f64| (l / rounds as f64).exp();
        println!(
            "{pages:?} pages, geometric mean: copy {:.1}, read {:.1}",
            mean(logs[i][0]),
            mean(logs[i][1])
        );
    }
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

    /// The streams' sum covers every word once (a ragged tail included).
    #[test]
    fn stream_sum_reads_every_word() {
        for n in [0usize, 7, 64, 1000, 4096 + 13] {
            let v: Vec<u64> = (1..=n as u64).collect();
            let want = (n as u64) * (n as u64 + 1) / 2;
            assert_eq!(sum_streams::<4>(&v), want, "n={n}");
        }
    }

    /// A buffer holds its words on either kind of page (6 MiB: whole huge
    /// pages and a tail), and writes land.
    #[test]
    fn buffers_hold_their_words() {
        for pages in [Pages::Huge, Pages::Small] {
            let len = 3 << 18;
            let mut w = Words::filled(len, 7, pages);
            assert_eq!(w.len(), len, "{pages:?}");
            assert!(w.iter().all(|&v| v == 7), "{pages:?}");
            w[len - 1] = 9;
            assert_eq!(w.iter().filter(|&&v| v == 9).count(), 1, "{pages:?}");
        }
    }

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
