//! O1: what running gyre as a platform team would (auth, metrics, tracing)
//! costs, side by side with all of it off, on S2's load.
//!
//! Two more `gyre serve` processes on the bench model: "off" with
//! `--disable-metrics` and no key, "on" with [`ON_ARGS`] plus every
//! `--ops-on-arg` (where tracing flags go, e.g. an OTLP endpoint) while a
//! scraper reads its `/metrics` every second, as Prometheus would. Rounds
//! of `s2_streams` concurrent HTTP streams (two requests each, fresh
//! prompts every round) alternate off, on, on, off, ... so drift in the
//! machine's load falls on both. Reported, as medians over the pairs of
//! rounds run back to back: the output tok/s of each and their ratio
//! (target >= 0.98), and the CPU time per streamed token of the threads that
//! carry requests (tokio's workers and blocking pool, `tokio-*`: HTTP, auth, the gRPC
//! hop, metrics, rendering `/metrics`, tracing), on minus off (target <= 20
//! µs). The engine's compute threads do the same work in both and are left
//! out of that figure, as its noise (milliseconds of CPU per token on a
//! busy machine) would hide microseconds; the whole process's CPU and the
//! wall time per token are in the details.

use std::time::{Duration, Instant};

use serde_json::json;

use super::{Ctx, Outcome, median};
use crate::http::HttpTarget;
use crate::load::{self, Api, Arrival, Clients};
use crate::report::Row;
use crate::server::{Server, ServerOptions};
use crate::stats::Summary;

/// The "on" configuration's own arguments: auth by API key (metrics are on
/// by default). `--ops-on-arg` adds to them.
pub const ON_ARGS: [&str; 2] = ["--api-key", "gyre-bench-ops-key"];

/// One configuration's server and client.
struct Side {
    name: &'static str,
    server: Server,
    clients: Clients,
    per_round: Vec<f64>,
    cpu_us_per_token: Vec<f64>,
    serving_cpu_us_per_token: Vec<f64>,
    wall_us_per_token: Vec<f64>,
}

/// Threads that carry requests: tokio's workers and blocking threads
/// (`tokio-rt-worker`; older tokio: `tokio-runtime-worker`).
const SERVING_THREADS: &str = "tokio-";

/// The value following `flag` in `args`.
fn flag_value(args: &[String], flag: &str) -> Option<String> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1).cloned())
}

async fn start(ctx: &Ctx, name: &'static str, args: Vec<String>) -> anyhow::Result<Side> {
    let server = Server::start(ServerOptions {
        bin: &ctx.gyre_bin,
        model: &ctx.model_dir,
        device: &ctx.device,
        threads: ctx.threads,
        log: ctx.scratch.join(format!("gyre-ops-{name}.log")),
        extra_args: &args,
    })
    .await?;
    let target = HttpTarget {
        addr: server.http_addr,
        model: ctx
            .clients
            .http
            .as_ref()
            .map_or_else(String::new, |h| h.model.clone()),
        api_key: flag_value(&args, "--api-key"),
    };
    let clients = Clients::connect(&server.grpc_url, 0, Some(target)).await?;
    Ok(Side {
        name,
        server,
        clients,
        per_round: Vec::new(),
        cpu_us_per_token: Vec::new(),
        serving_cpu_us_per_token: Vec::new(),
        wall_us_per_token: Vec::new(),
    })
}

/// Scrapes `/metrics` every second until dropped (the "on" side only).
fn scraper(addr: std::net::SocketAddr, key: Option<String>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            let _ = crate::http::get(addr, "/metrics", key.as_deref()).await;
        }
    })
}

impl Side {
    async fn round(&mut self, ctx: &Ctx, salt: u64) -> anyhow::Result<()> {
        let sz = &ctx.sizes;
        let prompts = ctx.prompts(sz.s2_streams * 2, sz.prompt_len, salt);
        let specs = ctx.specs(&prompts, sz.output_len);
        let arrival = Arrival::Concurrent {
            streams: sz.s2_streams,
            per_stream: 2,
        };
        let cpu0 = self.server.cpu_seconds();
        let serving0 = self.server.thread_cpu_seconds(SERVING_THREADS);
        let records = load::run(&self.clients, Api::Http, &arrival, &specs, Instant::now()).await;
        let cpu1 = self.server.cpu_seconds();
        let serving1 = self.server.thread_cpu_seconds(SERVING_THREADS);
        let summary = Summary::of(&records);
        anyhow::ensure!(
            summary.errors == 0,
            "{} requests failed: {:?}",
            self.name,
            summary.error_samples
        );
        let tokens = summary.output_tokens.max(1) as f64;
        self.per_round.push(summary.output_tok_per_s);
        self.wall_us_per_token.push(summary.wall_s * 1e6 / tokens);
        if let (Some(a), Some(b)) = (cpu0, cpu1) {
            self.cpu_us_per_token.push((b - a) * 1e6 / tokens);
        }
        if let (Some(a), Some(b)) = (serving0, serving1) {
            self.serving_cpu_us_per_token.push((b - a) * 1e6 / tokens);
        }
        Ok(())
    }

    fn clear(&mut self) {
        self.per_round.clear();
        self.cpu_us_per_token.clear();
        self.serving_cpu_us_per_token.clear();
        self.wall_us_per_token.clear();
    }
}

pub async fn o1(ctx: &Ctx) -> Outcome {
    let sz = &ctx.sizes;
    let base = &ctx.server_args;
    let mut off_args = base.clone();
    off_args.push("--disable-metrics".into());
    let mut on_args = base.clone();
    on_args.extend(ON_ARGS.iter().map(|s| s.to_string()));
    on_args.extend(ctx.ops_on_args.iter().cloned());
    let mut off = start(ctx, "off", off_args.clone()).await?;
    let mut on = start(ctx, "on", on_args.clone()).await?;
    let scrape = scraper(on.server.http_addr, flag_value(&on_args, "--api-key"));
    // Warm-up rounds (first-use costs), not counted.
    for side in [&mut off, &mut on] {
        side.round(ctx, 900).await?;
        side.clear();
    }
    let pairs = sz.s2_rounds.max(1) * 3;
    let mut outcome = Ok(());
    for pair in 0..pairs {
        let salt = 1000 + 10 * pair as u64;
        let result = if pair % 2 == 0 {
            match off.round(ctx, salt).await {
                Ok(()) => on.round(ctx, salt + 1).await,
                e => e,
            }
        } else {
            match on.round(ctx, salt).await {
                Ok(()) => off.round(ctx, salt + 1).await,
                e => e,
            }
        };
        if let Err(e) = result {
            outcome = Err(e);
            break;
        }
    }
    scrape.abort();
    let (on_alive, off_alive) = (on.server.alive(), off.server.alive());
    on.server.stop().await;
    off.server.stop().await;
    outcome?;
    anyhow::ensure!(
        on_alive && off_alive,
        "an O1 server died (logs in the scratch directory)"
    );
    let (t_on, t_off) = (median(&on.per_round), median(&off.per_round));
    // Paired: each pair's two rounds ran back to back.
    let paired = |a: &[f64], b: &[f64], f: fn(f64, f64) -> f64| {
        median(&a.iter().zip(b).map(|(x, y)| f(*x, *y)).collect::<Vec<_>>())
    };
    let ratio = paired(&on.per_round, &off.per_round, |a, b| {
        if b > 0.0 { a / b } else { 0.0 }
    });
    let minus = |a: f64, b: f64| a - b;
    let serving = paired(
        &on.serving_cpu_us_per_token,
        &off.serving_cpu_us_per_token,
        minus,
    );
    let cpu = paired(&on.cpu_us_per_token, &off.cpu_us_per_token, minus);
    let wall = paired(&on.wall_us_per_token, &off.wall_us_per_token, minus);
    let streams = sz.s2_streams;
    let throughput = Row::new(
        "O1",
        &format!("{streams}-stream output tok/s, ops on vs off"),
    )
    .gyre(format!("{t_on:.1} tok/s"))
    .reference(format!("{t_off:.1} tok/s (off)"))
    .compare(ratio, ">= 0.98", ratio >= 0.98);
    let per_token = Row::new("O1", "serving threads' CPU per streamed token (µs)")
        .gyre(format!("{:.1} on", median(&on.serving_cpu_us_per_token)))
        .reference(format!("{:.1} off", median(&off.serving_cpu_us_per_token)))
        .compare(serving, "<= 20 (on - off)", serving <= 20.0);
    let details = json!({
        "on_args": on_args,
        "off_args": off_args,
        "streams": streams,
        "requests_per_stream": 2,
        "output_tokens": sz.output_len,
        "rounds_per_side": on.per_round.len(),
        "on_tok_per_s": on.per_round,
        "off_tok_per_s": off.per_round,
        "throughput_ratio": ratio,
        "throughput_ratio_of_medians": if t_off > 0.0 { t_on / t_off } else { 0.0 },
        "on_serving_cpu_us_per_token": on.serving_cpu_us_per_token,
        "off_serving_cpu_us_per_token": off.serving_cpu_us_per_token,
        "serving_cpu_us_per_token_delta": serving,
        "on_cpu_us_per_token": on.cpu_us_per_token,
        "off_cpu_us_per_token": off.cpu_us_per_token,
        "cpu_us_per_token_delta": cpu,
        "on_wall_us_per_token": on.wall_us_per_token,
        "off_wall_us_per_token": off.wall_us_per_token,
        "wall_us_per_token_delta": wall,
    });
    Ok((vec![throughput, per_token], details))
}
