//! G1 and G2: gyre at the concurrency of a GPU server, and its time to first
//! token under long prompts, against transformers on the same machine in
//! the same run. Sized for a GPU (an 8B model); they run only when `--only`
//! names them, and `--g1-*` / `--g2-*` shrink them for the CPU.
//!
//! G1: for each level N of `g1_streams` (ascending), N concurrent streams
//! over gRPC `GenerateStream`, then the same N over HTTP `/v1/completions`
//! (SSE, through the shim). Every request is greedy with `ignore_eos`, a
//! `g1_prompt`-token prompt of random ids and `g1_new` new tokens; the N
//! prompts differ from each other, and every request has a cache salt of its
//! own, so nothing is served from the prefix cache. Before each level, N
//! short gRPC requests (other prompts, 4 tokens) pay the engine's first-use
//! costs of that batch size (CUDA graph capture of its decode step), so
//! neither protocol pays them in its measurement. Per level and protocol:
//! output tok/s (total tokens / wall, first send to last finish), TTFT and
//! ITL p50/p99. transformers: `generate` on a static batch of the same first
//! N prompts, every N in one process (`hf_sweep.py`: the model loads once;
//! a warm-up of the same shape per N, the median of `hf_repeats`); a batch
//! size it cannot run (out of memory) is recorded with its error.
//!
//! G2: `g2_streams` gRPC streams of `g2_prompt`-token prompts and `g2_new`
//! new tokens (distinct prompts, salted). "burst": all sent at once; TTFT
//! p50/p99. "steady": as many closed-loop streams, each sending
//! `g2_requests` requests back to back; stream i starts at i/N of the
//! burst's wall time (the expected duration of one request while N streams
//! share the engine, by Little's law), so the streams' phases are spread as
//! in a steady state; TTFT p50/p99 over every request after each stream's
//! first, against the serving spec's objective (p99 <= 800 ms).
//! transformers' TTFT of one such prompt at batch 1 is shown for context
//! (measured by G1's reference process when G1 runs too).

use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde_json::{Value, json};
use tokio::task::JoinSet;

use super::{Ctx, Outcome};
use crate::load::{self, Api, Arrival, Clients, RequestSpec};
use crate::reference::{HfJob, HfPoint, HfResult, run_hf_sweep};
use crate::report::Row;
use crate::stats::{Record, Summary, ms};

/// The serving spec's objective for G2: p99 TTFT in steady state.
pub const SLO_TTFT_MS: f64 = 800.0;

/// gRPC streams per HTTP/2 connection at most: G1 and G2 open enough
/// connections that no server's limit on concurrent streams queues them.
const STREAMS_PER_CONNECTION: usize = 64;

/// G2's transformers figure when G1's reference process measured it: the
/// result, or why there is none.
pub type Carried = Option<Result<HfResult, String>>;

pub async fn g1(ctx: &Ctx, g2_too: bool, carry: &mut Carried) -> Outcome {
    let sz = &ctx.sizes;
    let mut levels: Vec<usize> = sz.g1_streams.iter().copied().filter(|&n| n > 0).collect();
    levels.sort_unstable();
    levels.dedup();
    let most = *levels.last().context("--g1-streams names no level")?;
    let clients = connect(ctx, most).await?;
    let prompts = ctx.prompts(most, sz.g1_prompt, 51);
    let mut runs = Vec::new();
    for &n in &levels {
        eprintln!("gyre-bench: G1: {} ...", streams(n));
        let warm = ctx.specs(&ctx.prompts(n, sz.g1_prompt, 5100 + n as u64), 4);
        let warm = salted(warm, &format!("g1-warm-{}-{n}", ctx.seed));
        load::run(&clients, Api::Grpc, &concurrent(n), &warm, Instant::now()).await;
        for api in [Api::Grpc, Api::Http] {
            let specs = ctx.specs(&prompts[..n], sz.g1_new);
            let specs = salted(specs, &format!("g1-{}-{n}-{}", ctx.seed, api_name(api)));
            let records = load::run(&clients, api, &concurrent(n), &specs, Instant::now()).await;
            let summary = Summary::of(&records);
            eprintln!(
                "gyre-bench: G1: {} {}: {:.1} tok/s, TTFT p50/p99 {}/{} ms, \
                 ITL p50/p99 {}/{} ms, {} failed",
                streams(n),
                api_name(api),
                summary.output_tok_per_s,
                fmt_ms(summary.ttft_ms.p50),
                fmt_ms(summary.ttft_ms.p99),
                fmt_ms(summary.itl_ms.p50),
                fmt_ms(summary.itl_ms.p99),
                summary.errors
            );
            runs.push((n, api, summary));
        }
    }

    let g2_prompt = g2_reference_prompt(ctx);
    let hf = if ctx.no_reference {
        None
    } else {
        let mut jobs = vec![HfJob {
            name: "G1",
            mode: "generate",
            prompts: &prompts,
            batches: &levels,
            new_tokens: sz.g1_new,
        }];
        if g2_too {
            jobs.push(g2_reference_job(&g2_prompt));
        }
        eprintln!("gyre-bench: G1: transformers at batch sizes {levels:?} ...");
        let sweep = run_hf_sweep(
            &ctx.python,
            &ctx.model_dir,
            &jobs,
            ctx.threads,
            sz.hf_repeats,
            &ctx.device,
            &ctx.scratch,
        )
        .await
        .map_err(|e| format!("{e:#}"));
        if let Err(e) = &sweep {
            eprintln!("gyre-bench: G1: transformers failed: {e}");
        }
        Some(sweep)
    };
    if g2_too && let Some(sweep) = &hf {
        *carry = Some(match sweep {
            Ok(s) => point_result(s.job("G2").and_then(|j| j.point(1))),
            Err(e) => Err(e.clone()),
        });
    }
    let hf_job = hf
        .as_ref()
        .and_then(|s| s.as_ref().ok())
        .and_then(|s| s.job("G1"));

    let mut rows = Vec::new();
    let mut details_runs = Vec::new();
    for (n, api, summary) in &runs {
        let name = api_name(*api);
        let point = hf_job.and_then(|j| j.point(*n));
        let hf_tps = point.and_then(|p| p.result.as_ref()).map(|r| r.tok_per_s);
        let ratio = hf_tps.map(|h| summary.output_tok_per_s / h);
        let mut gyre = format!("{:.1} tok/s", summary.output_tok_per_s);
        if summary.errors > 0 {
            gyre += &format!(" ({} of {} failed)", summary.errors, summary.requests);
        }
        let reference = match (&hf, point) {
            (None, _) => "-".to_owned(),
            (Some(Err(_)), _) => "failed (see details)".to_owned(),
            (Some(Ok(_)), None) => "missing".to_owned(),
            (Some(Ok(_)), Some(p)) => match (&p.result, &p.error) {
                (Some(r), _) => format!("{:.1} tok/s (batch {n})", r.tok_per_s),
                (None, e) => format!("failed: {:.60}", e.as_deref().unwrap_or("?")),
            },
        };
        let mut row = Row::new("G1", &format!("{} output tok/s ({name})", streams(*n)))
            .gyre(gyre)
            .reference(reference);
        if let Some(r) = ratio {
            row = row.value(r);
        }
        rows.push(row);
        rows.push(
            Row::new(
                "G1",
                &format!("  {} TTFT p50/p99, ITL p50/p99 ms ({name})", streams(*n)),
            )
            .gyre(format!(
                "{}/{}, {}/{}",
                fmt_ms(summary.ttft_ms.p50),
                fmt_ms(summary.ttft_ms.p99),
                fmt_ms(summary.itl_ms.p50),
                fmt_ms(summary.itl_ms.p99)
            )),
        );
        let mut run = serde_json::to_value(summary)?;
        if let Value::Object(m) = &mut run {
            m.insert("streams".into(), json!(n));
            m.insert("api".into(), json!(name));
            m.insert(
                "expected_output_tokens".into(),
                json!(*n as u64 * u64::from(sz.g1_new)),
            );
            m.insert("hf_tok_per_s".into(), json!(hf_tps));
            m.insert("ratio".into(), json!(ratio));
        }
        details_runs.push(run);
    }
    let details = json!({
        "levels": levels,
        "prompt_tokens": sz.g1_prompt,
        "new_tokens": sz.g1_new,
        "grpc_connections": clients.grpc.len(),
        "runs": details_runs,
        "hf": hf_job,
        "hf_load_seconds": hf.as_ref().and_then(|s| s.as_ref().ok()).map(|s| s.load_seconds),
        "hf_repeats": sz.hf_repeats,
        "hf_error": hf.as_ref().and_then(|s| s.as_ref().err()),
    });
    Ok((rows, details))
}

pub async fn g2(ctx: &Ctx, carried: Carried) -> Outcome {
    let sz = &ctx.sizes;
    let (n, k) = (sz.g2_streams.max(1), sz.g2_requests.max(1));
    let clients = connect(ctx, n).await?;
    // One long prompt alone first: the first-use costs of long prefill chunks.
    let warm = ctx.specs(&ctx.prompts(1, sz.g2_prompt, 6100), 2);
    let warm = salted(warm, &format!("g2-warm-{}", ctx.seed));
    load::run(&clients, Api::Grpc, &concurrent(1), &warm, Instant::now()).await;

    eprintln!("gyre-bench: G2: burst of {n} ...");
    let specs = ctx.specs(&ctx.prompts(n, sz.g2_prompt, 6101), sz.g2_new);
    let specs = salted(specs, &format!("g2-burst-{}", ctx.seed));
    let burst = load::run(&clients, Api::Grpc, &concurrent(n), &specs, Instant::now()).await;
    let burst_summary = Summary::of(&burst);
    eprintln!(
        "gyre-bench: G2: burst TTFT p50/p99 {}/{} ms, wall {:.2} s, {} failed",
        fmt_ms(burst_summary.ttft_ms.p50),
        fmt_ms(burst_summary.ttft_ms.p99),
        burst_summary.wall_s,
        burst_summary.errors
    );

    let spread = Duration::from_secs_f64(burst_summary.wall_s.max(0.0));
    eprintln!(
        "gyre-bench: G2: {n} closed-loop streams x {k}, starts spread over {:.2} s ...",
        spread.as_secs_f64()
    );
    let specs = ctx.specs(&ctx.prompts(n * k, sz.g2_prompt, 6102), sz.g2_new);
    let specs = salted(specs, &format!("g2-steady-{}", ctx.seed));
    let steady = staggered(&clients, n, k, &specs, spread).await;
    let all: Vec<Record> = steady.iter().map(|(_, _, r)| r.clone()).collect();
    let later: Vec<Record> = steady
        .iter()
        .filter(|(_, j, _)| *j > 0)
        .map(|(_, _, r)| r.clone())
        .collect();
    let (all_summary, later_summary) = (Summary::of(&all), Summary::of(&later));
    eprintln!(
        "gyre-bench: G2: steady TTFT p50/p99 {}/{} ms after the first ({} requests), {} failed",
        fmt_ms(later_summary.ttft_ms.p50),
        fmt_ms(later_summary.ttft_ms.p99),
        later_summary.ttft_ms.n,
        all_summary.errors
    );

    let hf = match carried {
        Some(c) => Some(c),
        None if ctx.no_reference => None,
        None => {
            let prompt = g2_reference_prompt(ctx);
            eprintln!("gyre-bench: G2: transformers TTFT ...");
            let sweep = run_hf_sweep(
                &ctx.python,
                &ctx.model_dir,
                &[g2_reference_job(&prompt)],
                ctx.threads,
                sz.hf_repeats,
                &ctx.device,
                &ctx.scratch,
            )
            .await;
            Some(match sweep {
                Ok(s) => point_result(s.job("G2").and_then(|j| j.point(1))),
                Err(e) => Err(format!("{e:#}")),
            })
        }
    };
    let reference = match &hf {
        None => "-".to_owned(),
        Some(Ok(r)) => format!(
            "{} ms (transformers, 1 prompt alone)",
            fmt_ms(r.seconds * 1e3)
        ),
        Some(Err(e)) => format!("failed: {e:.60}"),
    };

    let p = sz.g2_prompt;
    let failed = |s: &Summary| {
        if s.errors > 0 {
            format!(" ({} of {} failed)", s.errors, s.requests)
        } else {
            String::new()
        }
    };
    let burst_row = Row::new(
        "G2",
        &format!("burst: {n} x {p}-token prompts at once, TTFT p50/p99 (gRPC)"),
    )
    .gyre(format!(
        "{} / {} ms{}",
        fmt_ms(burst_summary.ttft_ms.p50),
        fmt_ms(burst_summary.ttft_ms.p99),
        failed(&burst_summary)
    ))
    .reference(reference.clone());
    let target = format!("p99 <= {SLO_TTFT_MS:.0} ms");
    let mut steady_row = Row::new(
        "G2",
        &format!("steady: {n} streams x {k} requests, TTFT p50/p99 after the first (gRPC)"),
    )
    .gyre(format!(
        "{} / {} ms{}",
        fmt_ms(later_summary.ttft_ms.p50),
        fmt_ms(later_summary.ttft_ms.p99),
        failed(&later_summary)
    ))
    .reference(reference)
    .target(&target);
    let met = (later_summary.ttft_ms.n > 0)
        .then_some(later_summary.ttft_ms.p99 <= SLO_TTFT_MS && later_summary.errors == 0);
    if let Some(met) = met {
        steady_row = steady_row.compare(later_summary.ttft_ms.p99, &target, met);
    }

    let requests: Vec<Value> = steady
        .iter()
        .map(|(s, j, r)| {
            json!({
                "stream": s,
                "index": j,
                "sent_at_ms": ms(r.sent_at),
                "ttft_ms": r.ttft().map(ms),
                "elapsed_ms": ms(r.elapsed),
                "tokens": r.tokens,
                "cached_tokens": r.cached_tokens,
                "outcome": r.outcome,
            })
        })
        .collect();
    let details = json!({
        "streams": n,
        "prompt_tokens": p,
        "new_tokens": sz.g2_new,
        "requests_per_stream": k,
        "slo_ttft_ms": SLO_TTFT_MS,
        "grpc_connections": clients.grpc.len(),
        "burst": {
            "summary": burst_summary,
            "expected_output_tokens": n as u64 * u64::from(sz.g2_new),
            "ttft_ms": burst.iter().map(|r| r.ttft().map(ms)).collect::<Vec<_>>(),
        },
        "steady": {
            "stagger_s": spread.as_secs_f64(),
            "all": all_summary,
            "after_first": later_summary,
            "expected_output_tokens": (n * k) as u64 * u64::from(sz.g2_new),
            "met": met,
            "requests": requests,
        },
        "hf_ttft": hf.as_ref().and_then(|h| h.as_ref().ok()),
        "hf_error": hf.as_ref().and_then(|h| h.as_ref().err()),
    });
    Ok((vec![burst_row, steady_row], details))
}

/// gRPC connections for `streams` concurrent streams (at most
/// [`STREAMS_PER_CONNECTION`] each), and the server's HTTP address.
async fn connect(ctx: &Ctx, streams: usize) -> anyhow::Result<Clients> {
    let connections = streams.div_ceil(STREAMS_PER_CONNECTION).max(1);
    Clients::connect(&ctx.clients.grpc_url, connections, ctx.clients.http.clone()).await
}

fn concurrent(streams: usize) -> Arrival {
    Arrival::Concurrent {
        streams,
        per_stream: 1,
    }
}

/// `specs`, each with a cache salt of its own (`prefix-i`).
fn salted(mut specs: Vec<RequestSpec>, prefix: &str) -> Vec<RequestSpec> {
    for (i, spec) in specs.iter_mut().enumerate() {
        spec.cache_salt = Some(format!("{prefix}-{i}"));
    }
    specs
}

fn api_name(api: Api) -> &'static str {
    match api {
        Api::Grpc => "gRPC",
        Api::Http => "HTTP",
    }
}

/// The prompt of G2's transformers TTFT (one, `g2_prompt` tokens).
fn g2_reference_prompt(ctx: &Ctx) -> Vec<u32> {
    ctx.prompts(1, ctx.sizes.g2_prompt, 6103).remove(0)
}

fn g2_reference_job(prompt: &Vec<u32>) -> HfJob<'_> {
    HfJob {
        name: "G2",
        mode: "ttft",
        prompts: std::slice::from_ref(prompt),
        batches: &[1],
        new_tokens: 1,
    }
}

/// A point's result, or its error.
fn point_result(point: Option<&HfPoint>) -> Result<HfResult, String> {
    let point = point.ok_or("the reference returned no such point")?;
    match (&point.result, &point.error) {
        (Some(r), _) => Ok(r.clone()),
        (None, e) => Err(e.clone().unwrap_or_else(|| "no result".to_owned())),
    }
}

/// "1 stream", "8 streams".
fn streams(n: usize) -> String {
    if n == 1 {
        "1 stream".to_owned()
    } else {
        format!("{n} streams")
    }
}

/// Milliseconds with one decimal under 100, whole above.
fn fmt_ms(v: f64) -> String {
    if v < 100.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.0}")
    }
}

/// `streams` closed-loop gRPC streams, stream s sending `specs[s * per_stream
/// ..][..per_stream]` one after the other, starting at `s / streams` of
/// `spread`: every record with its stream and its index in the stream, in
/// that order.
async fn staggered(
    clients: &Clients,
    streams: usize,
    per_stream: usize,
    specs: &[RequestSpec],
    spread: Duration,
) -> Vec<(usize, usize, Record)> {
    let t0 = Instant::now();
    let mut tasks = JoinSet::new();
    for s in 0..streams {
        let clients = clients.clone();
        let mine = specs[s * per_stream..(s + 1) * per_stream].to_vec();
        let start = t0 + spread.mul_f64(s as f64 / streams as f64);
        tasks.spawn(async move {
            tokio::time::sleep_until(start.into()).await;
            let mut out = Vec::new();
            for (j, spec) in mine.iter().enumerate() {
                out.push((s, j, clients.send(Api::Grpc, s, spec, t0).await));
            }
            out
        });
    }
    let mut records = Vec::new();
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok(out) => records.extend(out),
            Err(e) => {
                let mut record = Record::new(t0.elapsed());
                record.outcome = crate::stats::Outcome::Error(format!("task: {e}"));
                records.push((usize::MAX, 0, record));
            }
        }
    }
    records.sort_by_key(|(s, j, _)| (*s, *j));
    records
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::Prompt;

    #[test]
    fn salts_are_distinct_and_ms_formats() {
        let specs = vec![RequestSpec::new(Prompt::Ids(vec![1, 2]), 4); 3];
        let salts: Vec<_> = salted(specs, "g1-0-8-gRPC")
            .into_iter()
            .map(|s| s.cache_salt.unwrap_or_default())
            .collect();
        assert_eq!(salts, ["g1-0-8-gRPC-0", "g1-0-8-gRPC-1", "g1-0-8-gRPC-2"]);
        assert_eq!(fmt_ms(12.34), "12.3");
        assert_eq!(fmt_ms(1234.5), "1234");
    }

    #[test]
    fn point_results_carry_errors() {
        let failed = HfPoint {
            batch: 256,
            result: None,
            error: Some("OutOfMemoryError: CUDA out of memory".into()),
        };
        assert_eq!(
            point_result(Some(&failed)).err().as_deref(),
            Some("OutOfMemoryError: CUDA out of memory")
        );
        assert!(point_result(None).is_err());
    }
}
