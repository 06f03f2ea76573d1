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
    // FLOP/s against the machine's f32 matrix-product peak: the arithmetic
    // a round does (each prompt through the layers, the LM head on its last
    // token and on every decode step, attention over the keys each query
    // sees), at the output rate's pace. Earlier versions counted 2 x the
    // matrices' parameters for every token (the LM head on every prompt
    // token too, attention left out): 5-6% more than is done here.
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
    let shape = crate::run_cmd::token_flops(&ctx.model_dir)
        .zip(crate::run_cmd::matmul_params(&ctx.model_dir))
        .zip(crate::run_cmd::kv_floats_per_token(&ctx.model_dir));
    if let (Some(peak), Some(((flops, params), kv))) = (&peak, shape) {
        let load = S2Load {
            streams: sz.s2_streams,
            prompt: sz.prompt_len,
            output: sz.output_len as usize,
            flops,
            params,
            kv_floats_per_token: kv,
        };
        let flops = |tok_per_s: f64| load.flops_at(tok_per_s);
        let show = |f: f64| format!("{:.1} GFLOP/s, {:.0}%", f / 1e9, 100.0 * f / peak.flops);
        let share = flops(gyre) / peak.flops;
        let mut r = Row::new(
            "S2",
            &format!(
                "{} streams: FLOPs done (layers on every token, LM head on the last prompt token and each step, attention) / s vs f32 matmul peak ({})",
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
        let threads = ctx.threads;
        let read = tokio::task::spawn_blocking(move || crate::ceilings::read_bandwidth(threads))
            .await
            .unwrap_or(f64::NAN);
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
            "round_flops": load.round_flops(),
            "matmul_param_flops_per_round": 2.0 * params as f64
                * (load.streams * (load.prompt + load.output - 1)) as f64,
        }));
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

/// S2's load, for its FLOPs and its memory-bound ceiling.
struct S2Load {
    streams: usize,
    prompt: usize,
    output: usize,
    flops: crate::run_cmd::TokenFlops,
    /// Parameters of the matrices (f32 on the CPU: 4 bytes each).
    params: u64,
    kv_floats_per_token: u64,
}

impl S2Load {
    /// The prompts' pass: every prompt token through the layers, attending
    /// to the keys up to its own, and the LM head on each prompt's last.
    fn prompt_flops(&self) -> f64 {
        let (p, f) = (self.prompt as f64, &self.flops);
        self.streams as f64 * (p * f.layers + f.head + f.per_key * p * (p + 1.0) / 2.0)
    }

    /// One decode step of every stream, each query seeing `context` keys.
    fn step_flops(&self, context: usize) -> f64 {
        let f = &self.flops;
        self.streams as f64 * (f.layers + f.head + f.per_key * context as f64)
    }

    /// A round: the prompts' pass, then one decode step per output token
    /// but the first (the prompts' pass yields it), the step for output
    /// token s + 1 seeing prompt + s keys.
    fn round_flops(&self) -> f64 {
        self.prompt_flops()
            + (1..self.output)
                .map(|s| self.step_flops(self.prompt + s))
                .sum::<f64>()
    }

    /// FLOP/s of rounds run at `tok_per_s` output tokens a second.
    fn flops_at(&self, tok_per_s: f64) -> f64 {
        self.round_flops() * tok_per_s / (self.streams * self.output.max(1)) as f64
    }

    /// The output tokens per second of a round if every pass through the
    /// model took the longer of its arithmetic at `peak` FLOP/s and its
    /// reads at `read` bytes/s: the prompts' pass (all streams' prompt
    /// tokens at once), then one decode step per output token but the
    /// first, each reading every weight and each stream's KV cache so far.
    fn ceiling_tok_per_s(&self, peak: f64, read: f64) -> f64 {
        let weights = 4.0 * self.params as f64;
        let kv_token = 4.0 * self.kv_floats_per_token as f64;
        let streams = self.streams as f64;
        let pass = |flops: f64, bytes: f64| (flops / peak).max(bytes / read);
        let mut seconds = pass(self.prompt_flops(), weights);
        for s in 1..self.output {
            let context = self.prompt + s;
            seconds += pass(
                self.step_flops(context),
                weights + streams * context as f64 * kv_token,
            );
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

    fn load() -> S2Load {
        S2Load {
            streams: 2,
            prompt: 10,
            output: 3,
            flops: crate::run_cmd::TokenFlops {
                layers: 1600.0,
                head: 400.0,
                per_key: 2.0,
            },
            params: 1000,
            kv_floats_per_token: 5,
        }
    }

    /// A round's FLOPs: the prompts' layers and causal attention and one
    /// LM head each, then two steps over 11 and 12 keys.
    #[test]
    fn round_flops_count_what_each_pass_does() {
        let l = load();
        let prompts = 2.0 * (10.0 * 1600.0 + 400.0 + 2.0 * 55.0);
        let steps = 2.0 * (2000.0 + 2.0 * 11.0) + 2.0 * (2000.0 + 2.0 * 12.0);
        assert_eq!(l.round_flops(), prompts + steps);
        // Six output tokens a round: at 6 tok/s, one round a second.
        assert!((l.flops_at(6.0) - (prompts + steps)).abs() < 1e-9);
    }

    /// Decode steps bound by their reads, the prompts' pass by its
    /// arithmetic: the ceiling is the tokens over the sum of both.
    #[test]
    fn ceiling_adds_the_prompt_pass_and_the_steps_reads() {
        let l = load();
        let (peak, read) = (1e6, 1e6);
        // Prompts: 33,020 FLOP = 33.02 ms (reads 4 ms); steps 1 and 2
        // read 4000 B of weights + 2 x 11 (12) x 20 B of cache (their
        // 4,044 and 4,048 FLOP take about 4 ms).
        let prompts = 2.0 * (10.0 * 1600.0 + 400.0 + 2.0 * 55.0) / peak;
        let want = 6.0 / (prompts + (4000.0 + 440.0) / 1e6 + (4000.0 + 480.0) / 1e6);
        let got = l.ceiling_tok_per_s(peak, read);
        assert!((got - want).abs() < 1e-9 * want, "{got} vs {want}");
        // A slow enough peak makes the steps compute-bound too.
        let slow = l.ceiling_tok_per_s(1e3, read);
        let want = 6.0 / (1e3 * prompts + 4.044 + 4.048);
        assert!((slow - want).abs() < 1e-9 * want, "{slow} vs {want}");
    }
}
