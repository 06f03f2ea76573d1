//! L1's rows for one file: each level's tok/s against its target, the
//! latencies, and the ceilings' shares (see the parent module's comment).

use super::{Ceilings, Level, target};
use crate::gguf_info::GgufInfo;
use crate::report::Row;

/// The matrix arithmetic of one request per output token: each prompt
/// position through every matrix but the head (the last one's head gives
/// the first output token), and each later output token through all of
/// them; 2 FLOPs a parameter. Attention's own arithmetic is left out.
#[derive(Clone, Copy, Debug)]
pub(super) struct Work {
    flops_per_output_token: f64,
}

impl Work {
    pub(super) fn of(info: &GgufInfo, prompt_len: usize, new_tokens: u32) -> Self {
        let all = info.params_per_token() as f64;
        let head = (info.head_params() as f64).min(all);
        let new = f64::from(new_tokens.max(1));
        let per_request = prompt_len as f64 * (all - head) + head + (new - 1.0) * all;
        Self {
            flops_per_output_token: 2.0 * per_request / new,
        }
    }
}

/// The rows of one file: per level, tok/s with the ratio and its target,
/// latencies, and the ceiling's share (the bandwidth limit at 1 stream, the
/// matmul peak at more).
pub(super) fn model_rows(
    label: &str,
    info: &GgufInfo,
    ceilings: &Ceilings,
    work: Work,
    gyre: &[Level],
    llama: &[Level],
) -> Vec<Row> {
    let mut rows = Vec::new();
    for (g, l) in gyre.iter().zip(llama) {
        let n = g.streams;
        let plural = if n == 1 { "stream" } else { "streams" };
        let ratio = g.tok_per_s / l.tok_per_s;
        let mut row = Row::new("L1", &format!("{label}: {n} {plural}, output tok/s"))
            .gyre(format!("{:.1}", g.tok_per_s))
            .reference(format!("{:.1} (llama.cpp)", l.tok_per_s));
        row = match target(n) {
            Some(t) => row.compare(ratio, &format!(">= {t:.1}"), ratio >= t),
            None => row.value(ratio),
        };
        rows.push(row);
        rows.push(
            Row::new(
                "L1",
                &format!("  {n} {plural}: TTFT p50 / p99, ITL p50 (ms)"),
            )
            .gyre(g.latency())
            .reference(l.latency()),
        );
        if n == 1 {
            let bytes = info.bytes_per_token() as f64;
            let bandwidth = g.copy_bandwidth().unwrap_or(ceilings.copy_bandwidth);
            let limit = bandwidth / bytes;
            // Each round against the copy bandwidth measured around it
            // where there is one, else against the run's.
            let share = |level: &Level| {
                level
                    .paired_share(bytes, |r| r.copy)
                    .unwrap_or_else(|| level.decode_tok_per_s() / limit)
            };
            let show = |level: &Level| {
                format!(
                    "{:.1} tok/s, {:.0}%",
                    level.decode_tok_per_s(),
                    100.0 * share(level)
                )
            };
            let mut row = Row::new(
                "L1",
                &format!(
                    "  1 stream: decode vs bandwidth limit ({:.1} MB / {:.1} GB/s = {limit:.1} tok/s)",
                    bytes / 1e6,
                    bandwidth / 1e9
                ),
            )
            .gyre(show(g))
            .reference(show(l));
            if info.main_type() == "F32" {
                row = row.compare(share(g), ">= 0.80 (gyre)", share(g) >= 0.8);
            } else {
                row = row.value(share(g));
            }
            rows.push(row);
            // The same decode against what reading alone reaches here: the
            // copy bandwidth counts bytes written too, and where a machine
            // reads slower than it copies, the limit above is out of reach.
            if let Some(read) = g.read_bandwidth() {
                let streamed = |level: &Level| bytes * level.decode_tok_per_s();
                let share = |level: &Level| {
                    level
                        .paired_share(bytes, |r| r.read)
                        .unwrap_or_else(|| streamed(level) / read)
                };
                let show = |level: &Level| {
                    format!(
                        "{:.1} GB/s, {:.0}%",
                        streamed(level) / 1e9,
                        100.0 * share(level)
                    )
                };
                rows.push(
                    Row::new(
                        "L1",
                        &format!(
                            "  1 stream: weights read per second vs read bandwidth ({:.1} GB/s)",
                            read / 1e9
                        ),
                    )
                    .gyre(show(g))
                    .reference(show(l))
                    .value(share(g)),
                );
            }
        } else if let Some(peak) = &ceilings.matmul {
            let of_peak =
                |f: f64| format!("{:.1} GFLOP/s, {:.0}%", f / 1e9, 100.0 * f / peak.flops);
            let flops = |level: &Level| 2.0 * info.params_per_token() as f64 * level.tok_per_s;
            let show = |level: &Level| of_peak(flops(level));
            rows.push(
                Row::new(
                    "L1",
                    &format!(
                        "  {n} streams: 2 x params x tok/s vs f32 matmul peak ({:.1} GFLOP/s)",
                        peak.flops / 1e9
                    ),
                )
                .gyre(show(g))
                .reference(show(l))
                .value(flops(g) / peak.flops),
            );
            // The prompts' arithmetic too, over the same wall time.
            let rate = |level: &Level| work.flops_per_output_token * level.tok_per_s;
            let show = |level: &Level| of_peak(rate(level));
            let needs = target(n).map_or_else(String::new, |t| {
                format!("; {t:.1}x needs {:.0}%", 100.0 * t * rate(l) / peak.flops)
            });
            rows.push(
                Row::new(
                    "L1",
                    &format!("  {n} streams: prompt + output FLOP/s vs the peak{needs}"),
                )
                .gyre(show(g))
                .reference(show(l))
                .value(rate(g) / peak.flops),
            );
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::super::RoundBandwidth;
    use super::super::tests::level;
    use super::*;
    use crate::ceilings::MatmulPeak;

    #[test]
    fn prompt_positions_skip_the_head() {
        let t = |name: &str, dims: Vec<u64>| crate::gguf_info::Tensor {
            name: name.into(),
            dims,
            ggml_type: 0,
            bytes: 0,
        };
        // Tied: the 1,000-parameter embedding is the head.
        let info = GgufInfo {
            tensors: vec![
                t("token_embd.weight", vec![10, 100]),
                t("blk.0.ffn_up.weight", vec![10, 10]),
            ],
            file_bytes: 0,
        };
        // 4 prompt positions x 100, the head once, 1 more step x 1,100:
        // 2,500 parameters for 2 output tokens, 2 FLOPs each.
        let work = Work::of(&info, 4, 2);
        assert!((work.flops_per_output_token - 2500.0).abs() < 1e-9);
    }

    #[test]
    fn rows_compare_against_targets_and_ceilings() {
        let info = GgufInfo {
            tensors: vec![crate::gguf_info::Tensor {
                name: "blk.0.ffn_up.weight".into(),
                dims: vec![1000, 1000],
                ggml_type: 0,
                bytes: 4_000_000,
            }],
            file_bytes: 4_001_000,
        };
        let ceilings = Ceilings {
            copy_bandwidth: 40e9, // 10,000 tok/s for 4 MB a token
            matmul: Some(MatmulPeak {
                flops: 100e9,
                n: 2048,
                threads: 2,
                torch: "t".into(),
                source: None,
                by_source: Default::default(),
            }),
        };
        // 1 stream: 10 ms a token = 100 tok/s decode, 1% of the limit.
        let gyre = [level(1, 90.0, 10), level(16, 600.0, 20)];
        let llama = [level(1, 100.0, 5), level(16, 300.0, 40)];
        // 9 prompt positions (no head here) and 3 more steps for 4 output
        // tokens: 2 x 1 M x (9 + 3) / 4 = 6 MFLOP an output token.
        let work = Work::of(&info, 9, 4);
        assert!((work.flops_per_output_token - 6e6).abs() < 1.0);
        let rows = model_rows("m (F32, 1 M params)", &info, &ceilings, work, &gyre, &llama);
        assert_eq!(rows.len(), 7);
        assert_eq!(rows[0].ratio, Some(0.9));
        assert_eq!(rows[0].met, crate::report::Met::No);
        assert!(
            rows[2].metric.contains("10000.0 tok/s"),
            "{}",
            rows[2].metric
        );
        assert_eq!(rows[2].gyre, "100.0 tok/s, 1%");
        assert_eq!(rows[2].met, crate::report::Met::No);
        assert_eq!(rows[3].ratio, Some(2.0));
        assert_eq!(rows[3].met, crate::report::Met::Yes);
        // 2 x 1 M params x 600 tok/s = 1.2 GFLOP/s of 100.
        assert_eq!(rows[5].gyre, "1.2 GFLOP/s, 1%");
        // 6 MFLOP x 600 tok/s = 3.6 GFLOP/s; llama.cpp's 1.8, and 1.5x of
        // that is 2.7% of the peak.
        assert_eq!(rows[6].gyre, "3.6 GFLOP/s, 4%");
        assert_eq!(rows[6].reference, "1.8 GFLOP/s, 2%");
        assert!(
            rows[6].metric.ends_with("1.5x needs 3%"),
            "{}",
            rows[6].metric
        );
        // The bandwidth measured around a file's rounds wins over the
        // run's, and each round's share is its decode rate against its own
        // bandwidth: rounds at 100, 150 and 50 tok/s against 0.8, 1.6 and
        // 0.4 GB/s (200, 400 and 100 tok/s for 4 MB a token) are each at
        // 50%, though their medians (100 tok/s, 0.8 GB/s) would say so only
        // by chance; the read bandwidths (0.5, 1.0, 0.25 GB/s) each 80%.
        let round = |decode_tok_per_s: f64, copy: f64, read: f64| RoundBandwidth {
            decode_tok_per_s,
            copy,
            read,
        };
        let mut gyre = gyre;
        gyre[0].rounds_bandwidth = vec![
            round(100.0, 0.8e9, 0.5e9),
            round(150.0, 1.6e9, 1.0e9),
            round(50.0, 0.4e9, 0.25e9),
        ];
        let rows = model_rows("m (F32, 1 M params)", &info, &ceilings, work, &gyre, &llama);
        assert_eq!(rows.len(), 8);
        assert!(
            rows[2].metric.contains("0.8 GB/s = 200.0 tok/s"),
            "{}",
            rows[2].metric
        );
        assert_eq!(rows[2].gyre, "100.0 tok/s, 50%");
        assert_eq!(rows[2].ratio, Some(0.5));
        // The weights' bytes read per second against the read bandwidth:
        // 4 MB x 100 tok/s = 0.4 GB/s, each round at 80% of its own.
        assert!(rows[3].metric.contains("read bandwidth (0.5 GB/s)"));
        assert_eq!(rows[3].gyre, "0.4 GB/s, 80%");
        assert_eq!(rows[3].ratio, Some(0.8));
        // llama.cpp measured without rounds of its own: against gyre's
        // median read bandwidth, 4 MB x 200 tok/s = 0.8 GB/s of 0.5.
        assert_eq!(rows[3].reference, "0.8 GB/s, 160%");
        // A round that moved the other way from its bandwidth lowers the
        // median share: 150 tok/s against 3.2 GB/s is 19%.
        gyre[0].rounds_bandwidth[1] = round(150.0, 3.2e9, 1.0e9);
        gyre[0].rounds_bandwidth[2] = round(50.0, 0.8e9, 0.25e9);
        let rows = model_rows("m (F32, 1 M params)", &info, &ceilings, work, &gyre, &llama);
        assert_eq!(rows[2].gyre, "100.0 tok/s, 25%");
        assert_eq!(rows[2].met, crate::report::Met::No);
    }
}
