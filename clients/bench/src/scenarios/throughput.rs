//! S1 and S2: output tokens per second of gyre against transformers'
//! `generate` on the same model, prompts and output lengths.
//!
//! S1: one gRPC stream at a time (`s1_repeats` requests in a row, each a new
//! prompt with a fresh cache salt so no prefix is reused; the median counts)
//! vs `generate` at batch 1. A request's figure is tokens / (send to
//! finish), prefill included, as transformers' is.
//!
//! S2: `s2_streams` concurrent HTTP streams (HTTP -> shim -> gRPC -> engine)
//! with distinct prompts, total tokens / wall time (median of `s2_rounds`
//! rounds), vs `generate` on a static batch of the same prompts.

use serde_json::json;

use super::{Ctx, Outcome, median};
use crate::load::Api;
use crate::reference::{HfResult, HfSpec, run_hf};
use crate::report::Row;
use crate::stats::{Summary, ms};

pub async fn s1(ctx: &Ctx) -> Outcome {
    let sz = &ctx.sizes;
    ctx.warm_up(11).await;
    let prompts = ctx.prompts(sz.s1_repeats.max(1), sz.prompt_len, 12);
    let mut specs = ctx.specs(&prompts, sz.output_len);
    for (i, spec) in specs.iter_mut().enumerate() {
        spec.cache_salt = Some(format!("s1-{}-{i}", ctx.seed));
    }
    let records = ctx.load(Api::Grpc, 1, specs.len(), &specs).await;
    let summary = Summary::of(&records);
    anyhow::ensure!(
        summary.errors == 0,
        "gyre requests failed: {:?}",
        summary.error_samples
    );
    let per_request: Vec<f64> = records
        .iter()
        .map(|r| f64::from(r.tokens) / r.elapsed.as_secs_f64())
        .collect();
    let gyre = median(&per_request);
    let hf = reference(ctx, &prompts[..1], sz.output_len).await?;
    let mut row = Row::new("S1", "batch-1 output tok/s (gRPC)")
        .gyre(format!("{gyre:.1} tok/s"))
        .target(">= 1.0");
    if let Some(hf) = &hf {
        row = row.reference(format!("{:.1} tok/s", hf.tok_per_s)).compare(
            gyre / hf.tok_per_s,
            ">= 1.0",
            gyre >= hf.tok_per_s,
        );
    }
    let ttft = Row::new("S1", "batch-1 TTFT p50 / ITL p50 (ms)").gyre(format!(
        "{:.2} / {:.2}",
        summary.ttft_ms.p50, summary.itl_ms.p50
    ));
    let details = json!({
        "prompt_tokens": sz.prompt_len,
        "output_tokens": sz.output_len,
        "gyre_tok_per_s": gyre,
        "gyre_tok_per_s_per_request": per_request,
        "gyre_seconds_per_request": records.iter().map(|r| r.elapsed.as_secs_f64()).collect::<Vec<_>>(),
        "gyre": summary,
        "hf": hf,
        "ratio": hf.as_ref().map(|h| gyre / h.tok_per_s),
    });
    Ok((vec![row, ttft], details))
}

pub async fn s2(ctx: &Ctx) -> Outcome {
    let sz = &ctx.sizes;
    ctx.warm_up(21).await;
    let prompts = ctx.prompts(sz.s2_streams, sz.prompt_len, 22);
    let (mut records, mut per_round) = (Vec::new(), Vec::new());
    for round in 0..sz.s2_rounds.max(1) {
        // Fresh prompts each round: no round profits from another's cache.
        let round_prompts = match round {
            0 => prompts.clone(),
            r => ctx.prompts(sz.s2_streams, sz.prompt_len, 22 + 100 * r as u64),
        };
        let specs = ctx.specs(&round_prompts, sz.output_len);
        let round_records = ctx.load(Api::Http, specs.len(), 1, &specs).await;
        let summary = Summary::of(&round_records);
        anyhow::ensure!(
            summary.errors == 0,
            "gyre requests failed: {:?}",
            summary.error_samples
        );
        per_round.push(summary.output_tok_per_s);
        records.extend(round_records);
    }
    let summary = Summary::of(&records);
    let gyre = median(&per_round);
    let hf = reference(ctx, &prompts, sz.output_len).await?;
    let metric = format!("{}-stream output tok/s (HTTP)", sz.s2_streams);
    let mut row = Row::new("S2", &metric)
        .gyre(format!("{gyre:.1} tok/s"))
        .target(">= 1.5");
    if let Some(hf) = &hf {
        row = row
            .reference(format!("{:.1} tok/s (batch {})", hf.tok_per_s, hf.batch))
            .compare(gyre / hf.tok_per_s, ">= 1.5", gyre >= 1.5 * hf.tok_per_s);
    }
    // FLOP/s against the machine's f32 matrix-product peak: 2 x the
    // matrices' parameters per token through the model (each request's
    // prompt, then one step per output token but the last), at the output
    // rate's pace; attention's arithmetic is left out, so this is a floor.
    let peak = if ctx.no_reference {
        None
    } else {
        match crate::ceilings::matmul_peak(&ctx.python, ctx.threads).await {
            Ok(p) => Some(p),
            Err(e) => {
                eprintln!("gyre-bench: S2: no matmul peak: {e:#}");
                None
            }
        }
    };
    let mut rows = vec![row];
    let mut extra = None;
    if let (Some(peak), Some(params)) = (&peak, crate::run_cmd::matmul_params(&ctx.model_dir)) {
        let per_output =
            (sz.prompt_len + sz.output_len as usize - 1) as f64 / f64::from(sz.output_len.max(1));
        let flops = |tok_per_s: f64| 2.0 * params as f64 * tok_per_s * per_output;
        let show = |f: f64| format!("{:.1} GFLOP/s, {:.0}%", f / 1e9, 100.0 * f / peak.flops);
        let share = flops(gyre) / peak.flops;
        let mut r = Row::new(
            "S2",
            &format!(
                "{} streams: 2 x matrix params x tokens through the model / s vs f32 matmul peak ({})",
                sz.s2_streams,
                peak.describe()
            ),
        )
        .gyre(show(flops(gyre)))
        .compare(share, ">= 0.60", share >= 0.6);
        if let Some(hf) = &hf {
            r = r.reference(show(flops(hf.tok_per_s)));
        }
        rows.push(r);
        if let Some(kv) = crate::run_cmd::kv_floats_per_token(&ctx.model_dir) {
            let threads = ctx.threads;
            let read =
                tokio::task::spawn_blocking(move || crate::ceilings::read_bandwidth(threads))
                    .await
                    .unwrap_or(f64::NAN);
            let load = S2Load {
                streams: sz.s2_streams,
                prompt: sz.prompt_len,
                output: sz.output_len as usize,
                params,
                kv_floats_per_token: kv,
            };
            let ceiling = flops(load.ceiling_tok_per_s(peak.flops, read));
            rows.push(
                Row::new(
                    "S2",
                    &format!(
                        "{} streams: memory-bound ceiling (each decode step reads the f32 weights and KV cache at {:.1} GB/s read bandwidth, prompts at the peak) and gyre's share of it",
                        sz.s2_streams,
                        read / 1e9
                    ),
                )
                .gyre(format!(
                    "{:.1} GFLOP/s, {:.0}% of peak",
                    ceiling / 1e9,
                    100.0 * ceiling / peak.flops
                ))
                .value(flops(gyre) / ceiling),
            );
            extra = Some(json!({
                "read_bandwidth_bytes_per_s": read,
                "ceiling_flops": ceiling,
                "kv_floats_per_token": kv,
            }));
        }
    }
    let latency = Row::new("S2", "TTFT p50/p99, ITL p50/p99 (ms)").gyre(format!(
        "{:.1}/{:.1}, {:.1}/{:.1}",
        summary.ttft_ms.p50, summary.ttft_ms.p99, summary.itl_ms.p50, summary.itl_ms.p99
    ));
    let chunks: usize = records.iter().map(|r| r.events.len()).sum();
    let details = json!({
        "streams": sz.s2_streams,
        "rounds": per_round.len(),
        "gyre_tok_per_s": gyre,
        "gyre_tok_per_s_per_round": per_round,
        "prompt_tokens": sz.prompt_len,
        "output_tokens": sz.output_len,
        "gyre_pooled": summary,
        "http_chunks": chunks,
        "tpot_ms_mean": summary.tpot_ms.mean,
        "first_request_ttft_ms": records.first().and_then(|r| r.ttft()).map(ms),
        "hf": hf,
        "ratio": hf.as_ref().map(|h| gyre / h.tok_per_s),
        "matmul_peak": peak,
        "matmul_params": crate::run_cmd::matmul_params(&ctx.model_dir),
        "ceiling": extra,
    });
    rows.push(latency);
    Ok((rows, details))
}

/// S2's load, for its memory-bound ceiling.
struct S2Load {
    streams: usize,
    prompt: usize,
    output: usize,
    /// Parameters of the matrices (f32 on the CPU: 4 bytes each).
    params: u64,
    kv_floats_per_token: u64,
}

impl S2Load {
    /// The output tokens per second of a round if every pass through the
    /// model took the longer of its arithmetic at `peak` FLOP/s and its
    /// reads at `read` bytes/s: the prompts' pass (all streams' prompt
    /// tokens at once), then one decode step per output token but the
    /// first, each reading every weight and each stream's KV cache so far.
    fn ceiling_tok_per_s(&self, peak: f64, read: f64) -> f64 {
        let weights = 4.0 * self.params as f64;
        let kv_token = 4.0 * self.kv_floats_per_token as f64;
        let streams = self.streams as f64;
        let pass =
            |tokens: f64, bytes: f64| (2.0 * self.params as f64 * tokens / peak).max(bytes / read);
        let mut seconds = pass(streams * self.prompt as f64, weights);
        for s in 1..self.output {
            let context = (self.prompt + s) as f64;
            seconds += pass(streams, weights + streams * context * kv_token);
        }
        streams * self.output as f64 / seconds
    }
}

/// transformers' `generate` on `prompts` (None with `--no-reference`).
async fn reference(
    ctx: &Ctx,
    prompts: &[Vec<u32>],
    new_tokens: u32,
) -> anyhow::Result<Option<HfResult>> {
    if ctx.no_reference {
        return Ok(None);
    }
    let spec = HfSpec {
        model: &ctx.model_dir,
        prompts,
        new_tokens,
        threads: ctx.threads,
        repeats: ctx.sizes.hf_repeats,
        mode: "generate",
        device: &ctx.device,
        scratch: &ctx.scratch,
    };
    run_hf(&ctx.python, spec).await.map(Some)
}

/// transformers' time to the first token on `prompts` (None with `--no-reference`).
pub async fn reference_ttft(ctx: &Ctx, prompts: &[Vec<u32>]) -> anyhow::Result<Option<HfResult>> {
    if ctx.no_reference {
        return Ok(None);
    }
    let spec = HfSpec {
        model: &ctx.model_dir,
        prompts,
        new_tokens: 1,
        threads: ctx.threads,
        repeats: ctx.sizes.hf_repeats,
        mode: "ttft",
        device: &ctx.device,
        scratch: &ctx.scratch,
    };
    run_hf(&ctx.python, spec).await.map(Some)
}

#[cfg(test)]
mod tests {
    use super::S2Load;

    /// Decode steps bound by their reads, the prompts' pass by its
    /// arithmetic: the ceiling is the tokens over the sum of both.
    #[test]
    fn ceiling_adds_the_prompt_pass_and_the_steps_reads() {
        let load = S2Load {
            streams: 2,
            prompt: 10,
            output: 3,
            params: 1000,
            kv_floats_per_token: 5,
        };
        let (peak, read) = (1e6, 1e6);
        // Prompts: 2 x 1000 x 20 FLOP = 40 ms (reads 4 ms); steps 1 and 2
        // read 4000 B of weights + 2 x 11 (12) x 20 B of cache.
        let want = 6.0 / (0.04 + (4000.0 + 440.0) / 1e6 + (4000.0 + 480.0) / 1e6);
        let got = load.ceiling_tok_per_s(peak, read);
        assert!((got - want).abs() < 1e-9 * want, "{got} vs {want}");
        // A slow enough peak makes the steps compute-bound too.
        let slow = load.ceiling_tok_per_s(1e3, read);
        assert!((slow - 6.0 / (40.0 + 2.0 * 4.0)).abs() < 1e-9, "{slow}");
    }
}
