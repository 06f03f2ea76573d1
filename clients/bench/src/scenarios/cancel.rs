//! S5: a cancellation storm, then the engine's own account of its KV blocks.
//!
//! `s5_grpc` gRPC streams (over several HTTP/2 connections) and `s5_http`
//! HTTP streams start at once, each dropped after `s5_cancel_after` output
//! events (gRPC: RST_STREAM; HTTP: the connection is closed). Then
//! `GetStats` is polled until nothing is running or waiting, and its
//! `kv_blocks_used` is the figure (target 0). Where `GetStats` fails or
//! answers an empty pool, that is reported as such, never as a pass. A
//! single-stream probe before and after the storm shows whether decode speed
//! came back (no leftover sequences in the batch).

use std::time::{Duration, Instant};

use gyre_api::v1::{EngineStats, GetStatsRequest};
use serde_json::{Value, json};

use super::{Ctx, Outcome};
use crate::grpc::status_text;
use crate::load::{self, Api, Arrival, Clients};
use crate::report::{Met, Row};
use crate::stats::{Outcome as Ended, Record, Summary, ms};

const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);

pub async fn s5(ctx: &Ctx) -> Outcome {
    let sz = &ctx.sizes;
    ctx.warm_up(51).await;
    let before = stats(&ctx.clients).await;
    let probe_before = probe(ctx, 52).await?;

    let storm = Clients::connect(&ctx.clients.grpc_url, 4, ctx.clients.http.clone()).await?;
    let mut grpc_specs = ctx.specs(&ctx.prompts(sz.s5_grpc, sz.s5_prompt, 53), 64);
    let mut http_specs = ctx.specs(&ctx.prompts(sz.s5_http, sz.s5_prompt, 54), 64);
    for spec in grpc_specs.iter_mut().chain(http_specs.iter_mut()) {
        spec.cancel_after = Some(sz.s5_cancel_after);
    }
    let (grpc_load, http_load) = (concurrent(sz.s5_grpc), concurrent(sz.s5_http));
    let t0 = Instant::now();
    let (grpc, http) = tokio::join!(
        load::run(&storm, Api::Grpc, &grpc_load, &grpc_specs, t0),
        load::run(&storm, Api::Http, &http_load, &http_specs, t0),
    );
    let storm_s = t0.elapsed().as_secs_f64();
    drop(storm);
    let drained = drain(&ctx.clients).await;
    let probe_after = probe(ctx, 55).await?;
    let after_probe = stats(&ctx.clients).await;

    let cancelled = |rs: &[Record]| rs.iter().filter(|r| r.outcome == Ended::Cancelled).count();
    let (gs, hs) = (Summary::of(&grpc), Summary::of(&http));
    let mut rows = Vec::new();
    let blocks = Row::new("S5", "KV blocks used after the storm").target("== 0");
    rows.push(match &drained.stats {
        Err(e) => blocks.gyre(format!("GetStats failed: {e:.60}")),
        Ok(s) if s.kv_blocks_total == 0 => blocks.gyre(format!(
            "GetStats: empty pool (kv_blocks_total 0, running {})",
            s.running
        )),
        Ok(s) => {
            let mut row = blocks
                .gyre(format!(
                    "{} of {} blocks",
                    s.kv_blocks_used, s.kv_blocks_total
                ))
                .reference(format!("running {}, waiting {}", s.running, s.waiting))
                .value(f64::from(s.kv_blocks_used));
            row.met = Met::from(s.kv_blocks_used == 0 && s.running == 0);
            row
        }
    });
    rows.push(Row::new("S5", "streams cancelled as planned").gyre(format!(
        "gRPC {}/{}, HTTP {}/{} ({} errors)",
        cancelled(&grpc),
        grpc.len(),
        cancelled(&http),
        http.len(),
        gs.errors + hs.errors
    )));
    if let Ok(wait) = &drained.waited {
        rows.push(
            Row::new("S5", "storm, then drain to running == 0 (s)")
                .gyre(format!("{storm_s:.2} + {:.2}", wait.as_secs_f64())),
        );
    }
    let ratio = probe_after / probe_before;
    rows.push(
        Row::new("S5", "probe ITL after / before the storm")
            .gyre(format!("{probe_after:.2} ms"))
            .reference(format!("{probe_before:.2} ms"))
            .value(ratio)
            .target("~1 (info)"),
    );
    let details = json!({
        "grpc_streams": sz.s5_grpc,
        "http_streams": sz.s5_http,
        "cancel_after": sz.s5_cancel_after,
        "storm_seconds": storm_s,
        "grpc": gs,
        "http": hs,
        "cancelled_grpc": cancelled(&grpc),
        "cancelled_http": cancelled(&http),
        "stats_before": stats_json(&before),
        "stats_after_drain": stats_json(&drained.stats),
        "drain_seconds": drained.waited.as_ref().ok().map(Duration::as_secs_f64),
        "drain_problem": drained.waited.as_ref().err(),
        "stats_after_probe": stats_json(&after_probe),
        "probe_tpot_ms_before": probe_before,
        "probe_tpot_ms_after": probe_after,
    });
    Ok((rows, details))
}

fn concurrent(streams: usize) -> Arrival {
    Arrival::Concurrent {
        streams,
        per_stream: 1,
    }
}

/// `GetStats` of the default model, or the error text.
async fn stats(clients: &Clients) -> Result<EngineStats, String> {
    let mut client = clients.grpc[0].clone();
    client
        .get_stats(GetStatsRequest::default())
        .await
        .map(tonic::Response::into_inner)
        .map_err(|s| status_text(&s))
}

fn stats_json(stats: &Result<EngineStats, String>) -> Value {
    match stats {
        Ok(s) => json!({
            "model": s.model, "waiting": s.waiting, "running": s.running,
            "block_size": s.block_size, "kv_blocks_total": s.kv_blocks_total,
            "kv_blocks_used": s.kv_blocks_used, "kv_blocks_cached": s.kv_blocks_cached,
            "prefix_query_tokens_total": s.prefix_query_tokens_total,
            "prefix_hit_tokens_total": s.prefix_hit_tokens_total,
            "last_step_tokens": s.last_step_tokens, "steps_total": s.steps_total,
            "preemptions_total": s.preemptions_total,
            "generated_tokens_total": s.generated_tokens_total,
        }),
        Err(e) => json!({ "error": e }),
    }
}

struct Drained {
    /// The last stats read.
    stats: Result<EngineStats, String>,
    /// How long until running == waiting == 0, or why that was not seen.
    waited: Result<Duration, String>,
}

/// Polls `GetStats` every 50 ms until nothing runs or waits.
async fn drain(clients: &Clients) -> Drained {
    let start = Instant::now();
    loop {
        let stats = stats(clients).await;
        let waited = match &stats {
            Err(e) => Err(format!("GetStats failed: {e}")),
            Ok(s) if s.running == 0 && s.waiting == 0 => Ok(start.elapsed()),
            Ok(s) if start.elapsed() > DRAIN_TIMEOUT => Err(format!(
                "still running {} / waiting {} after {} s",
                s.running,
                s.waiting,
                DRAIN_TIMEOUT.as_secs()
            )),
            Ok(_) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        return Drained { stats, waited };
    }
}

/// Mean time per output token (ms) of one lone gRPC request.
async fn probe(ctx: &Ctx, salt: u64) -> anyhow::Result<f64> {
    let specs = ctx.specs(&ctx.prompts(1, ctx.sizes.s5_prompt, salt), 32);
    let record = ctx.load(Api::Grpc, 1, 1, &specs).await.remove(0);
    if let Ended::Error(e) = &record.outcome {
        anyhow::bail!("probe failed: {e}");
    }
    record
        .tpot()
        .map(ms)
        .ok_or_else(|| anyhow::anyhow!("probe got no tokens"))
}
