//! O1: what running gyre as a platform team would (auth, metrics, tracing)
//! costs, side by side with all of it off, on S2's load.
//!
//! Two more `gyre serve` processes on the bench model: "off" with
//! `--disable-metrics`, no keys and no tracing; "on" with every feature of
//! `--o1-on` (default all three): auth through a keys file in the scratch
//! directory (one tenant with quotas too large to refuse anything, so the
//! quota accounting runs), metrics (on by default in gyre) with `/metrics`
//! scraped every second as Prometheus would, and tracing to an OTLP
//! receiver in the bench's own process ([`crate::otlp`]), which counts the
//! spans it receives; plus every `--ops-on-arg`.
//!
//! `o1_pairs` pairs of rounds of `s2_streams` concurrent HTTP streams (two
//! requests each, fresh prompts every round) run back to back, alternating
//! which side goes first (off on, on off, off on, ...: ABBA), so drift in
//! the machine's load falls on both. The pairs are split into `o1_blocks`
//! blocks, each with both servers started afresh (and warmed up), the
//! "off" one first in even blocks and the "on" one first in odd ones: A/A
//! runs (`--o1-on none`) on the 2-core development machine showed two
//! identical servers differing by 5 to 15% in throughput for the whole of
//! their life, so one process per side would measure that, not the
//! features; blocks spread that over several processes. Each pair gives a throughput ratio
//! (on / off output tok/s, target >= 0.98) and CPU-time-per-streamed-token
//! differences (on - off): of the threads that carry requests (tokio's
//! workers and blocking pool, `tokio-*`: HTTP, auth, the gRPC hop, metrics,
//! rendering `/metrics`, tracing; target <= 20 µs; read per thread from
//! `schedstat`, in nanoseconds) and of the whole process.
//! Each is reported as the median over the pairs with a bootstrap 95%
//! interval ([`crate::paired`]); a target is met or missed only when the
//! interval is clear of it. The engine's compute threads do the same work
//! in both, and their noise (milliseconds of CPU per token on a busy
//! machine) would hide microseconds, so the serving threads' figure is the
//! one the target is read on.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;
use sha2::{Digest as _, Sha256};

use super::{Ctx, Outcome, median};
use crate::http::HttpTarget;
use crate::load::{self, Api, Arrival, Clients};
use crate::otlp;
use crate::paired::Paired;
use crate::report::Row;
use crate::server::{Server, ServerOptions};
use crate::stats::Summary;

/// The "on" side's API key (its SHA-256 is in the keys file).
pub const KEY: &str = "gyre-bench-ops-key";

/// What the "on" side turns on (`--o1-on`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Feature {
    /// A keys file with one tenant (quotas counted, never reached).
    Auth,
    /// Prometheus metrics, scraped every second.
    Metrics,
    /// OpenTelemetry spans exported over OTLP to the bench's receiver.
    Tracing,
    /// Nothing: both sides alike, an A/A run that shows how far two
    /// identical servers differ on this machine.
    None,
}

/// One configuration's figures, one entry per measured round, over every
/// block of servers.
#[derive(Default)]
struct Figures {
    requests: usize,
    per_round: Vec<f64>,
    cpu_us_per_token: Vec<f64>,
    serving_cpu_us_per_token: Vec<f64>,
    wall_us_per_token: Vec<f64>,
}

/// One configuration's server and client (one block's).
struct Side {
    name: &'static str,
    server: Server,
    clients: Clients,
}

/// Threads that carry requests: tokio's workers and blocking threads
/// (`tokio-rt-worker`; older tokio: `tokio-runtime-worker`).
const SERVING_THREADS: &str = "tokio-";

/// Writes the "on" side's keys file: one tenant, [`KEY`], limits far above
/// what the load uses.
fn write_keys_file(path: &Path) -> anyhow::Result<()> {
    let hash: String = Sha256::digest(KEY.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let text = format!(
        "[tenants.bench]\nrequests_per_minute = 1000000\nrequests_per_day = 100000000\n\
         tokens_per_minute = 1000000000\nmax_concurrent_streams = 10000\n\n\
         [[keys]]\nsha256 = \"{hash}\"\ntenant = \"bench\"\n"
    );
    std::fs::write(path, text)?;
    Ok(())
}

async fn start(
    ctx: &Ctx,
    name: &'static str,
    args: &[String],
    key: Option<&str>,
    block: usize,
) -> anyhow::Result<Side> {
    let server = Server::start(ServerOptions {
        bin: &ctx.gyre_bin,
        model: &ctx.model_dir,
        device: &ctx.device,
        threads: ctx.threads,
        log: ctx.scratch.join(format!("gyre-ops-{name}-{block}.log")),
        extra_args: args,
    })
    .await?;
    let target = HttpTarget {
        addr: server.http_addr,
        model: ctx
            .clients
            .http
            .as_ref()
            .map_or_else(String::new, |h| h.model.clone()),
        api_key: key.map(str::to_owned),
    };
    let clients = Clients::connect(&server.grpc_url, 0, Some(target)).await?;
    Ok(Side {
        name,
        server,
        clients,
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
    /// One round of S2's load; its figures go to `into` (None: a warm-up).
    async fn round(
        &mut self,
        ctx: &Ctx,
        salt: u64,
        into: Option<&mut Figures>,
    ) -> anyhow::Result<()> {
        let sz = &ctx.sizes;
        let prompts = ctx.prompts(sz.s2_streams * 2, sz.prompt_len, salt);
        let specs = ctx.specs(&prompts, sz.output_len);
        let arrival = Arrival::Concurrent {
            streams: sz.s2_streams,
            per_stream: 2,
        };
        let cpu0 = self.server.cpu_seconds();
        let serving0 = self.server.thread_cpu(SERVING_THREADS);
        let records = load::run(&self.clients, Api::Http, &arrival, &specs, Instant::now()).await;
        let cpu1 = self.server.cpu_seconds();
        let serving1 = self.server.thread_cpu(SERVING_THREADS);
        let summary = Summary::of(&records);
        anyhow::ensure!(
            summary.errors == 0,
            "{} requests failed: {:?}",
            self.name,
            summary.error_samples
        );
        let Some(f) = into else {
            return Ok(());
        };
        f.requests += records.len();
        let tokens = summary.output_tokens.max(1) as f64;
        f.per_round.push(summary.output_tok_per_s);
        f.wall_us_per_token.push(summary.wall_s * 1e6 / tokens);
        if let (Some(a), Some(b)) = (cpu0, cpu1) {
            f.cpu_us_per_token.push((b - a) * 1e6 / tokens);
        }
        if let (Some(a), Some(b)) = (serving0, serving1) {
            f.serving_cpu_us_per_token.push(b.since(&a) * 1e6 / tokens);
        }
        Ok(())
    }
}

/// Both sides' servers, started for one block.
struct Block {
    off: Side,
    on: Side,
    scrape: Option<tokio::task::JoinHandle<()>>,
}

/// The servers' arguments and the "on" side's key.
struct Setup {
    off_args: Vec<String>,
    on_args: Vec<String>,
    key: Option<&'static str>,
    scrape: bool,
}

impl Setup {
    /// Starts block `block`'s servers, the "off" one first in even blocks
    /// and the "on" one first in odd ones, and warms both up.
    async fn start(&self, ctx: &Ctx, block: usize) -> anyhow::Result<Block> {
        let (off, on) = if block.is_multiple_of(2) {
            let off = start(ctx, "off", &self.off_args, None, block).await?;
            (off, start(ctx, "on", &self.on_args, self.key, block).await?)
        } else {
            let on = start(ctx, "on", &self.on_args, self.key, block).await?;
            (start(ctx, "off", &self.off_args, None, block).await?, on)
        };
        let scrape = self
            .scrape
            .then(|| scraper(on.server.http_addr, self.key.map(Into::into)));
        let mut b = Block { off, on, scrape };
        // First-use costs, not counted.
        b.off.round(ctx, 900, None).await?;
        b.on.round(ctx, 900, None).await?;
        Ok(b)
    }
}

impl Block {
    /// Runs `pairs` pairs of rounds, ABBA (off on, on off, ...).
    async fn rounds(
        &mut self,
        ctx: &Ctx,
        first: usize,
        pairs: usize,
        figures: (&mut Figures, &mut Figures),
    ) -> anyhow::Result<()> {
        let (off_f, on_f) = figures;
        for pair in first..first + pairs {
            let salt = 1000 + 10 * pair as u64;
            if pair.is_multiple_of(2) {
                self.off.round(ctx, salt, Some(off_f)).await?;
                self.on.round(ctx, salt + 1, Some(on_f)).await?;
            } else {
                self.on.round(ctx, salt, Some(on_f)).await?;
                self.off.round(ctx, salt + 1, Some(off_f)).await?;
            }
            eprintln!(
                "gyre-bench: O1 pair {}: on {:.1} tok/s, off {:.1} tok/s",
                pair + 1,
                on_f.per_round.last().copied().unwrap_or(0.0),
                off_f.per_round.last().copied().unwrap_or(0.0),
            );
        }
        Ok(())
    }

    /// Stops both servers; whether both were still running.
    async fn stop(mut self) -> bool {
        if let Some(s) = self.scrape.take() {
            s.abort();
        }
        let alive = self.on.server.alive() && self.off.server.alive();
        self.on.server.stop().await;
        self.off.server.stop().await;
        alive
    }
}

pub async fn o1(ctx: &Ctx) -> Outcome {
    let sz = &ctx.sizes;
    let features = &ctx.ops_on;
    let has = |f: Feature| features.contains(&f);
    let base = &ctx.server_args;
    let mut off_args = base.clone();
    off_args.push("--disable-metrics".into());
    let mut on_args = base.clone();
    let receiver = if has(Feature::Tracing) {
        let r = otlp::Receiver::start().await?;
        on_args.extend(["--otlp-endpoint".to_owned(), r.endpoint()]);
        Some(r)
    } else {
        None
    };
    let key = has(Feature::Auth).then_some(KEY);
    if key.is_some() {
        let path = ctx.scratch.join("gyre-ops-keys.toml");
        write_keys_file(&path)?;
        on_args.extend(["--keys-file".to_owned(), path.display().to_string()]);
    }
    if !has(Feature::Metrics) {
        on_args.push("--disable-metrics".into());
    }
    on_args.extend(ctx.ops_on_args.iter().cloned());
    let setup = Setup {
        off_args,
        on_args,
        key,
        scrape: has(Feature::Metrics),
    };
    let blocks = sz.o1_blocks.clamp(1, sz.o1_pairs.max(1));
    let pairs = sz.o1_pairs.max(1);
    let (mut off_f, mut on_f) = (Figures::default(), Figures::default());
    let mut done = 0;
    for block in 0..blocks {
        // The pairs split as evenly as they go over the blocks.
        let n = pairs * (block + 1) / blocks - done;
        eprintln!("gyre-bench: O1 block {}/{blocks}: {n} pairs", block + 1);
        let mut b = setup.start(ctx, block).await?;
        let ran = b.rounds(ctx, done, n, (&mut off_f, &mut on_f)).await;
        let alive = b.stop().await;
        ran?;
        anyhow::ensure!(alive, "an O1 server died (logs in the scratch directory)");
        done += n;
    }
    // The batch exporter sends every 5 s: let the last spans arrive.
    let spans = match &receiver {
        Some(r) => {
            let mut last = (r.counts.spans(), Instant::now());
            while last.1.elapsed() < Duration::from_secs(7) {
                tokio::time::sleep(Duration::from_millis(250)).await;
                if r.counts.spans() != last.0 {
                    last = (r.counts.spans(), Instant::now());
                }
            }
            anyhow::ensure!(
                r.counts.spans() > 0,
                "tracing was on but the OTLP receiver got no spans (logs in the scratch directory)"
            );
            Some((r.counts.spans(), r.counts.exports()))
        }
        None => None,
    };
    let (mut rows, mut details) = report(ctx, &on_f, &off_f);
    details["blocks"] = json!(blocks);
    details["on_args"] = json!(setup.on_args);
    details["off_args"] = json!(setup.off_args);
    details["on_features"] = json!(features);
    if let Some((n, exports)) = spans {
        // Warm-up requests export spans too: per request of the measured
        // rounds plus one warm-up round per block.
        let requests = on_f.requests + blocks * sz.s2_streams * 2;
        details["spans_received"] = json!(n);
        details["span_exports"] = json!(exports);
        details["on_requests"] = json!(requests);
        rows.push(
            Row::new("O1", "spans received by the bench's OTLP receiver")
                .gyre(format!(
                    "{:.1} per request ({requests} requests, {exports} exports)",
                    n as f64 / requests.max(1) as f64
                ))
                .value(n as f64),
        );
    }
    Ok((rows, details))
}

/// The rows and details of the measured pairs.
fn report(ctx: &Ctx, on: &Figures, off: &Figures) -> (Vec<Row>, serde_json::Value) {
    let streams = ctx.sizes.s2_streams;
    let seed = ctx.seed;
    let ratio = Paired::of(&Paired::ratios(&on.per_round, &off.per_round), seed);
    let serving = Paired::of(
        &Paired::differences(&on.serving_cpu_us_per_token, &off.serving_cpu_us_per_token),
        seed + 1,
    );
    let cpu = Paired::of(
        &Paired::differences(&on.cpu_us_per_token, &off.cpu_us_per_token),
        seed + 2,
    );
    let wall = Paired::of(
        &Paired::differences(&on.wall_us_per_token, &off.wall_us_per_token),
        seed + 3,
    );
    let (t_on, t_off) = (median(&on.per_round), median(&off.per_round));
    let mut throughput = Row::new(
        "O1",
        &format!("{streams}-stream output tok/s, ops on vs off (median paired ratio)"),
    )
    .gyre(format!("{t_on:.1} tok/s"))
    .reference(format!("{t_off:.1} tok/s (off)"))
    .compare(ratio.median, ">= 0.98", ratio.median >= 0.98);
    throughput.met = ratio.at_least(0.98);
    let mut per_token = Row::new(
        "O1",
        "serving threads' CPU per streamed token, on - off (µs)",
    )
    .gyre(format!("{:.1} on", median(&on.serving_cpu_us_per_token)))
    .reference(format!("{:.1} off", median(&off.serving_cpu_us_per_token)))
    .compare(serving.median, "<= 20", serving.median <= 20.0);
    per_token.met = serving.at_most(20.0);
    let rows = vec![
        throughput,
        Row::new("O1", "  that ratio's spread").gyre(ratio.spread(3)),
        per_token,
        Row::new("O1", "  that delta's spread").gyre(serving.spread(1)),
        Row::new("O1", "whole process CPU per streamed token, on - off (µs)")
            .gyre(format!("{:.0} on", median(&on.cpu_us_per_token)))
            .reference(format!("{:.0} off", median(&off.cpu_us_per_token)))
            .value(cpu.median),
        Row::new("O1", "  that delta's spread").gyre(cpu.spread(0)),
    ];
    let details = json!({
        "streams": streams,
        "requests_per_stream": 2,
        "output_tokens": ctx.sizes.output_len,
        "pairs": on.per_round.len(),
        "order": "ABBA: pair 0 off then on, pair 1 on then off, ...",
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
    (rows, details)
}
