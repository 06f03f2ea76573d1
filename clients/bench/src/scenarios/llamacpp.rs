//! L1: gyre against llama.cpp's `llama-server` on the same GGUF files, at 1
//! and 16 concurrent streams through each one's OpenAI HTTP API.
//!
//! For each file, both servers loaded (`gyre serve --model FILE`, and
//! `llama-server` on the same file with 16 slots, continuous batching, no
//! prompt cache and the same thread count, see `llama_server.rs`), only one
//! sent requests at a time: the rounds are interleaved, each round run on
//! one server and then on the other (which goes first alternates from round
//! to round and from file to file), so that the machine's speed changing
//! during the run (seen here: the same binary moving between two speeds
//! 30% apart from minute to minute) falls on both alike. Both get the same
//! requests from the load generator:
//! streaming `/v1/completions` with prompts of random token ids (so both see
//! exactly the same prompt tokens), greedy, EOS ignored, `new_tokens` each;
//! every request must come back with exactly that many tokens. Per level,
//! the median over `rounds` rounds of output tokens / wall time counts
//! (fresh prompts each round, the same ones for both servers), with TTFT
//! p50/p99, inter-token latency p50 and time per output token over all the
//! rounds' requests. At 1 stream a round is one request of about half a
//! second, in which the machine's speed moved by a fifth or more (session
//! forty-two: one file's three rounds at 0.77-1.00 of llama.cpp's, six more
//! right after at 1.21-1.91), so that level runs `solo_rounds` rounds (9 by
//! default; 3 before session forty-three). Targets: gyre / llama.cpp >= 1.0
//! at 1 stream and >= 1.5 at 16.
//!
//! Perplexity, per file: a fixed text (`clients/bench/data/perplexity.txt`)
//! tokenized once by llama.cpp's `llama-tokenize`, cut into chunks of `ctx`
//! tokens (BOS first when the vocabulary adds one), the second half of each
//! scored: llama.cpp's `llama-perplexity` protocol, which gives llama.cpp's
//! figure; gyre's comes from the same token ids through `/v1/completions`
//! with `echo` and `logprobs` (the prompt tokens' log-probabilities).
//! Target: gyre's within 2% of llama.cpp's.
//!
//! Ceilings (`ceilings.rs`): at 1 stream, the weights a decode step reads
//! (`gguf_info.rs`) over the memory copy bandwidth gives the bandwidth limit
//! in tokens/s, and each server's decode rate (1 / time per output token
//! p50) is shown as a share of it (target for gyre on an f32 file: >= 80%).
//! The bandwidth moved 2x within seconds on the shared machines, so at 1
//! stream it is measured before the first round and after each server's
//! round, and each round's decode rate is held against the mean of the
//! measurements just before and just after it: the share shown is the
//! median of the rounds' shares (the bandwidth shown, the median of the
//! rounds' means; the run's first measurement stands in where there are
//! none). Beside it, the memory read bandwidth (measured at the same
//! moments) against the weights' bytes read per second: a decode reads and
//! barely writes, and on a machine that reads slower than it copies (a
//! 2-core Zen 3 here: 27-33 GB/s read, 33-53 GB/s copied; a 2-core Zen 4:
//! 35-37 GB/s read, 43-48 GB/s copied, both on huge pages) the copy-based
//! limit is out of reach. Both are measured on huge pages, as the engine
//! keeps its weights (`ceilings.rs`). At 16 streams,
//! 2 x the matrices' parameters x output tok/s is shown against the f32
//! matrix-product peak, measured once per run, and beside it the
//! arithmetic of the prompts and the outputs together (each prompt position
//! through every matrix but the head, each output token through all of
//! them) per second of the run: the share of the peak each server
//! sustained, and the share the 1.5x target asks of gyre (1.5 x llama.cpp's
//! rate). Where that is above what gyre's product reaches on operands in
//! the caches (`F32MM_CACHED=1 cargo run --release -p gyre-engine --example
//! f32mm -- 16`), the target is out of reach on that machine.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context as _;
use serde::Serialize;
use serde_json::{Value, json};

use super::Outcome;
pub use super::perplexity::PplSpec;
use super::perplexity::{PplTokens, gyre_perplexity, llama_perplexity, ppl_row, ppl_tokens};
use crate::ceilings::{self, MatmulPeak};
use crate::gguf_info::GgufInfo;
use crate::http::HttpTarget;
use crate::llama_server::{LlamaOptions, LlamaServer};
use crate::load::{self, Api, Arrival, Clients, Prompt, RequestSpec};
use crate::reference::Python;
use crate::report::Row;
use crate::server::{Server, ServerOptions};
use crate::stats::{Record, Summary};
use rows::{Work, model_rows};

mod rows;

/// What L1 needs.
pub struct LlamaCtx<'a> {
    pub gyre_bin: &'a Path,
    pub llama_server: PathBuf,
    /// GGUF files, each served in turn by both.
    pub models: Vec<PathBuf>,
    pub python: &'a Python,
    pub threads: usize,
    pub device: &'a str,
    pub scratch: &'a Path,
    /// Concurrency levels (1 and 16).
    pub streams: Vec<usize>,
    pub prompt_len: usize,
    pub new_tokens: u32,
    /// Rounds per level above 1 stream (the median counts).
    pub rounds: usize,
    /// Rounds at 1 stream: each is one request of about half a second, in
    /// which the machine's speed can move by a fifth, so more of them.
    pub solo_rounds: usize,
    pub seed: u64,
    /// Extra arguments of `gyre serve`.
    pub server_args: &'a [String],
    /// Extra arguments of `llama-server`.
    pub llama_server_args: &'a [String],
    /// The perplexity comparison.
    pub ppl: PplSpec,
}

impl LlamaCtx<'_> {
    /// Rounds per server at `streams` concurrent streams.
    fn rounds_at(&self, streams: usize) -> usize {
        match streams {
            1 => self.solo_rounds,
            _ => self.rounds,
        }
        .max(1)
    }
}

/// Which server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Engine {
    Gyre,
    LlamaCpp,
}

/// One server's figures at one concurrency level.
#[derive(Debug, Clone, Serialize)]
struct Level {
    streams: usize,
    /// Median over the rounds of output tokens / wall time.
    tok_per_s: f64,
    rounds_tok_per_s: Vec<f64>,
    /// Over every round's requests.
    summary: Summary,
    /// At 1 stream, each round's decode rate with the memory bandwidth
    /// measured around it (the mean of the measurements just before and
    /// just after this server's round), for the decode rate's share of the
    /// bandwidth limit at the time.
    rounds_bandwidth: Vec<RoundBandwidth>,
}

/// One 1-stream round's decode rate and the bandwidth measured around it.
#[derive(Debug, Clone, Copy, Serialize)]
struct RoundBandwidth {
    /// 1 / time per output token (p50) of the round's request.
    decode_tok_per_s: f64,
    /// Memory copy bandwidth, bytes read + written per second.
    copy: f64,
    /// Memory read bandwidth, bytes read per second: the most a decode,
    /// which reads its weights and writes little, could stream.
    read: f64,
}

impl Level {
    /// Decode tokens per second of one stream: 1 / time per output token
    /// (p50), prefill left out.
    fn decode_tok_per_s(&self) -> f64 {
        1e3 / self.summary.tpot_ms.p50
    }

    /// The median over the rounds of `f` of each round; none without
    /// rounds.
    fn median_over(&self, f: impl Fn(&RoundBandwidth) -> f64) -> Option<f64> {
        let all: Vec<f64> = self.rounds_bandwidth.iter().map(f).collect();
        (!all.is_empty()).then(|| super::median(&all))
    }

    /// The median over the rounds of the copy bandwidth measured around
    /// each.
    fn copy_bandwidth(&self) -> Option<f64> {
        self.median_over(|r| r.copy)
    }

    /// The median over the rounds of the read bandwidth measured around
    /// each.
    fn read_bandwidth(&self) -> Option<f64> {
        self.median_over(|r| r.read)
    }

    /// The median over the rounds of each round's weights streamed per
    /// second (`bytes` a token) over the bandwidth `of` it measured around
    /// that round: each round against its own moment, so the machine's
    /// speed moving between rounds cancels.
    fn paired_share(&self, bytes: f64, of: fn(&RoundBandwidth) -> f64) -> Option<f64> {
        self.median_over(|r| r.decode_tok_per_s * bytes / of(r))
    }

    fn latency(&self) -> String {
        let s = &self.summary;
        format!(
            "{:.1} / {:.1}, {:.2}",
            s.ttft_ms.p50, s.ttft_ms.p99, s.itl_ms.p50
        )
    }
}

/// The target ratio gyre / llama.cpp at `streams` concurrent streams.
fn target(streams: usize) -> Option<f64> {
    match streams {
        1 => Some(1.0),
        16 => Some(1.5),
        _ => None,
    }
}

/// The request every stream sends: `prompt`, `new_tokens` greedy tokens,
/// EOS ignored; llama-server's prompt cache off for it too.
fn spec(prompt: Vec<u32>, new_tokens: u32) -> RequestSpec {
    let mut spec = RequestSpec::new(Prompt::Ids(prompt), new_tokens);
    spec.extra_body.insert("cache_prompt".into(), json!(false));
    spec
}

/// Why a round's records do not count: a failed request, or one whose
/// token count is not `new_tokens` (both must do the same work).
fn check(records: &[Record], new_tokens: u32) -> anyhow::Result<()> {
    let summary = Summary::of(records);
    anyhow::ensure!(
        summary.errors == 0,
        "{} of {} requests failed: {:?}",
        summary.errors,
        summary.requests,
        summary.error_samples
    );
    if let Some(r) = records.iter().find(|r| r.tokens != new_tokens) {
        anyhow::bail!(
            "a request returned {} tokens, not {new_tokens} (EOS not ignored?)",
            r.tokens
        );
    }
    Ok(())
}

/// The first model id `GET /v1/models` lists.
pub(super) async fn model_id(addr: std::net::SocketAddr) -> anyhow::Result<String> {
    let (status, body) = crate::http::get(addr, "/v1/models", None).await?;
    anyhow::ensure!(status.is_success(), "GET /v1/models: HTTP {status}");
    let models: Value = serde_json::from_slice(&body)?;
    models
        .pointer("/data/0/id")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .context("GET /v1/models lists no model")
}

/// One server's HTTP clients.
async fn http_clients(addr: std::net::SocketAddr) -> anyhow::Result<Clients> {
    Ok(Clients {
        grpc_url: String::new(),
        grpc: Vec::new(),
        http: Some(HttpTarget {
            addr,
            model: model_id(addr).await?,
            api_key: None,
        }),
    })
}

/// `specs`, one stream each, all at once.
async fn run_specs(clients: &Clients, specs: Vec<RequestSpec>) -> Vec<Record> {
    let arrival = Arrival::Concurrent {
        streams: specs.len(),
        per_stream: 1,
    };
    load::run(clients, Api::Http, &arrival, &specs, Instant::now()).await
}

/// The prompts' token ids: away from both ends of the vocabulary.
fn prompt_ids(vocab: u32) -> std::ops::Range<u32> {
    300..vocab.saturating_sub(300).max(301)
}

/// Warm-up: one stream, then a full batch, of short requests.
async fn warm_up(ctx: &LlamaCtx<'_>, clients: &Clients, vocab: u32) -> anyhow::Result<()> {
    let most = ctx.streams.iter().copied().max().unwrap_or(1);
    for n in [1, most] {
        let prompts = load::random_prompts(n, ctx.prompt_len, prompt_ids(vocab), ctx.seed ^ 0x5eed);
        check(
            &run_specs(clients, prompts.into_iter().map(|p| spec(p, 4)).collect()).await,
            4,
        )?;
    }
    Ok(())
}

/// Round `round` at `n` streams: the same fresh prompts whichever server
/// runs it.
async fn round(
    ctx: &LlamaCtx<'_>,
    clients: &Clients,
    vocab: u32,
    n: usize,
    round: usize,
) -> anyhow::Result<Vec<Record>> {
    let seed = ctx.seed.wrapping_mul(1_000_003) + (n * 1000 + round) as u64;
    let prompts = load::random_prompts(n, ctx.prompt_len, prompt_ids(vocab), seed);
    let records = run_specs(
        clients,
        prompts
            .into_iter()
            .map(|p| spec(p, ctx.new_tokens))
            .collect(),
    )
    .await;
    check(&records, ctx.new_tokens).with_context(|| format!("{n} streams, round {round}"))?;
    Ok(records)
}

/// Both servers on one file, started one after the other and both kept
/// loaded; only one is sent requests at a time.
struct Pair {
    gyre: Server,
    llama: LlamaServer,
}

impl Pair {
    async fn start(ctx: &LlamaCtx<'_>, model: &Path, index: usize) -> anyhow::Result<Self> {
        let gyre = Server::start(ServerOptions {
            bin: ctx.gyre_bin,
            model,
            device: ctx.device,
            threads: ctx.threads,
            log: ctx.scratch.join(format!("l1-gyre-{index}.log")),
            extra_args: ctx.server_args,
        })
        .await
        .context("gyre")?;
        let most = ctx.streams.iter().copied().max().unwrap_or(1);
        let llama = LlamaServer::start(LlamaOptions {
            bin: &ctx.llama_server,
            model,
            threads: ctx.threads,
            slots: most,
            slot_context: (ctx.prompt_len + ctx.new_tokens as usize + 64).next_power_of_two(),
            log: ctx.scratch.join(format!("l1-llama-{index}.log")),
            extra_args: ctx.llama_server_args,
        })
        .await;
        match llama {
            Ok(llama) => Ok(Self { gyre, llama }),
            Err(e) => {
                gyre.stop().await;
                Err(e.context("llama.cpp"))
            }
        }
    }

    fn addr(&self, engine: Engine) -> std::net::SocketAddr {
        match engine {
            Engine::Gyre => self.gyre.http_addr,
            Engine::LlamaCpp => self.llama.http_addr,
        }
    }

    /// A failed measurement on `engine` with its server's log and state.
    fn explain<T>(&mut self, engine: Engine, result: anyhow::Result<T>) -> anyhow::Result<T> {
        let (alive, log) = match engine {
            Engine::Gyre => (self.gyre.alive(), self.gyre.log.clone()),
            Engine::LlamaCpp => (self.llama.alive(), self.llama.log.clone()),
        };
        with_log(result, alive, &log).with_context(|| engine_name(engine))
    }

    async fn stop(self) {
        self.gyre.stop().await;
        self.llama.stop().await;
    }
}

/// Measures both servers on `model`, rounds interleaved: per level, round r
/// runs on one server and then the other (which first alternates from
/// round to round and file to file), so that a change in the machine's
/// speed during the run falls on both. Then gyre's perplexity. Each
/// server's levels, and gyre's perplexity.
async fn measure_pair(
    ctx: &LlamaCtx<'_>,
    model: &Path,
    index: usize,
    vocab: u32,
    ppl: Option<&PplTokens>,
) -> anyhow::Result<([Vec<Level>; 2], Option<anyhow::Result<f64>>)> {
    let mut pair = Pair::start(ctx, model, index).await?;
    let result = measure_started(ctx, &mut pair, index, vocab, ppl).await;
    pair.stop().await;
    result
}

async fn measure_started(
    ctx: &LlamaCtx<'_>,
    pair: &mut Pair,
    index: usize,
    vocab: u32,
    ppl: Option<&PplTokens>,
) -> anyhow::Result<([Vec<Level>; 2], Option<anyhow::Result<f64>>)> {
    const ENGINES: [Engine; 2] = [Engine::Gyre, Engine::LlamaCpp];
    let mut clients = Vec::new();
    for engine in ENGINES {
        let c = http_clients(pair.addr(engine)).await;
        let c = pair.explain(engine, c)?;
        let warm = warm_up(ctx, &c, vocab).await;
        pair.explain(engine, warm)?;
        clients.push(c);
    }
    let mut levels: [Vec<Level>; 2] = [Vec::new(), Vec::new()];
    let threads = ctx.threads;
    let bandwidth = || async move {
        tokio::task::spawn_blocking(move || {
            (
                ceilings::copy_bandwidth(threads),
                ceilings::read_bandwidth(threads),
            )
        })
        .await
    };
    for &n in &ctx.streams {
        let mut rates: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
        let mut records: [Vec<Record>; 2] = [Vec::new(), Vec::new()];
        let mut paired: [Vec<RoundBandwidth>; 2] = [Vec::new(), Vec::new()];
        // At 1 stream, the bandwidth before each server's round (the one
        // after the previous round) and after it.
        let mut before = if n == 1 {
            Some(bandwidth().await?)
        } else {
            None
        };
        for r in 0..ctx.rounds_at(n) {
            let first = (index + r) % 2;
            for e in [first, 1 - first] {
                let got = round(ctx, &clients[e], vocab, n, r).await;
                let got = pair.explain(ENGINES[e], got)?;
                let summary = Summary::of(&got);
                if let Some((copy0, read0)) = before {
                    let (copy1, read1) = bandwidth().await?;
                    paired[e].push(RoundBandwidth {
                        decode_tok_per_s: 1e3 / summary.tpot_ms.p50,
                        copy: (copy0 + copy1) / 2.0,
                        read: (read0 + read1) / 2.0,
                    });
                    before = Some((copy1, read1));
                }
                rates[e].push(summary.output_tok_per_s);
                records[e].extend(got);
            }
        }
        for e in 0..2 {
            levels[e].push(Level {
                streams: n,
                tok_per_s: super::median(&rates[e]),
                rounds_tok_per_s: std::mem::take(&mut rates[e]),
                summary: Summary::of(&records[e]),
                rounds_bandwidth: std::mem::take(&mut paired[e]),
            });
        }
    }
    let perplexity = match ppl {
        Some(t) => Some(gyre_perplexity(pair.gyre.http_addr, t, ctx.ppl.ctx).await),
        None => None,
    };
    Ok((levels, perplexity))
}

/// A failed measurement with where the server's log is, and whether the
/// server had died.
fn with_log<T>(result: anyhow::Result<T>, alive: bool, log: &Path) -> anyhow::Result<T> {
    result.with_context(|| {
        let state = if alive { "running" } else { "dead" };
        format!("server {state}, log {}", log.display())
    })
}

/// Serves `model` with both, one after the other: its rows and details.
async fn compare(
    ctx: &LlamaCtx<'_>,
    ceilings: &Ceilings,
    index: usize,
    model: &Path,
) -> anyhow::Result<(Vec<Row>, Value)> {
    let info = GgufInfo::read(model)?;
    let vocab = u32::try_from(info.vocab_size().unwrap_or(32000)).unwrap_or(u32::MAX);
    // The perplexity's token ids and llama.cpp's figure, with no server
    // loaded.
    let ppl_tokens = if ctx.ppl.chunks > 0 {
        Some(ppl_tokens(ctx, model).await)
    } else {
        None
    };
    let llama_ppl = match &ppl_tokens {
        Some(Ok(t)) => Some(llama_perplexity(ctx, model, t.chunks).await),
        _ => None,
    };
    eprintln!(
        "gyre-bench: L1: gyre and llama.cpp on {} ...",
        model.display()
    );
    let tokens = ppl_tokens.as_ref().and_then(|t| t.as_ref().ok());
    let ([gyre, llama], gyre_ppl) = measure_pair(ctx, model, index, vocab, tokens)
        .await
        .with_context(|| format!("{}", model.display()))?;
    let label = format!(
        "{} ({}, {:.0} M params)",
        model
            .file_stem()
            .map_or_else(String::new, |s| s.to_string_lossy().into_owned()),
        info.type_mix(),
        info.params_per_token() as f64 / 1e6
    );
    let work = Work::of(&info, ctx.prompt_len, ctx.new_tokens);
    let mut rows = model_rows(&label, &info, ceilings, work, &gyre, &llama);
    let chunks = match &ppl_tokens {
        Some(Ok(t)) => t.chunks,
        _ => 0,
    };
    let ppl_result = ppl_tokens.map(|t| -> anyhow::Result<(f64, f64)> {
        t?;
        let llama = llama_ppl.context("no llama.cpp perplexity")??;
        let gyre = gyre_ppl.context("no gyre perplexity")??;
        Ok((gyre, llama))
    });
    let ppl_details = match &ppl_result {
        Some(Ok((g, l))) => json!({"gyre": g, "llama_cpp": l, "ctx": ctx.ppl.ctx, "chunks": chunks,
            "text": ctx.ppl.text}),
        Some(Err(e)) => json!({"error": format!("{e:#}")}),
        None => Value::Null,
    };
    if let Some(result) = ppl_result {
        rows.push(ppl_row(&ctx.ppl, chunks, result));
    }
    // The copy bandwidth measured around this file's 1-stream rounds.
    let bandwidth = gyre
        .iter()
        .find_map(Level::copy_bandwidth)
        .unwrap_or(ceilings.copy_bandwidth);
    let details = json!({
        "perplexity": ppl_details,
        "model": model,
        "label": label,
        "main_type": info.main_type(),
        "bytes_by_type": info.bytes_by_type(),
        "file_bytes": info.file_bytes,
        "weights_bytes_per_token": info.bytes_per_token(),
        "params_per_token": info.params_per_token(),
        "copy_bandwidth_bytes_per_s": bandwidth,
        "bandwidth_limit_tok_per_s": bandwidth / info.bytes_per_token() as f64,
        "read_bandwidth_bytes_per_s": gyre.iter().find_map(Level::read_bandwidth),
        "gyre": gyre,
        "llama_cpp": llama,
    });
    Ok((rows, details))
}

/// The machine's ceilings, measured once.
struct Ceilings {
    /// Bytes read + written per second.
    copy_bandwidth: f64,
    matmul: Option<MatmulPeak>,
}

pub async fn l1(ctx: &LlamaCtx<'_>) -> Outcome {
    anyhow::ensure!(
        ctx.llama_server.is_file(),
        "{} is missing (run `make llamacpp`, or pass --llama-server)",
        ctx.llama_server.display()
    );
    for model in &ctx.models {
        anyhow::ensure!(
            model.is_file(),
            "{} is missing (run `make llamacpp`, or pass --l1-models)",
            model.display()
        );
    }
    let threads = ctx.threads;
    let copy_bandwidth =
        tokio::task::spawn_blocking(move || ceilings::copy_bandwidth(threads)).await?;
    let matmul = match ceilings::matmul_peak(ctx.python, ctx.threads).await {
        Ok(peak) => Some(peak),
        Err(e) => {
            eprintln!("gyre-bench: L1: no matmul peak: {e:#}");
            None
        }
    };
    let ceilings = Ceilings {
        copy_bandwidth,
        matmul,
    };
    let mut rows = vec![
        Row::new("L1", "memory copy bandwidth (read + write, all threads)")
            .gyre(format!("{:.1} GB/s", copy_bandwidth / 1e9)),
        Row::new(
            "L1",
            "f32 matrix-product peak (fastest GEMM measured, same threads)",
        )
        .gyre(
            ceilings
                .matmul
                .as_ref()
                .map_or("-".into(), |p| p.describe()),
        ),
    ];
    let mut files = Vec::new();
    for (index, model) in ctx.models.iter().enumerate() {
        match compare(ctx, &ceilings, index, model).await {
            Ok((file_rows, file)) => {
                rows.extend(file_rows);
                files.push(file);
            }
            // One file's failure (a model one server cannot load) is
            // reported in its row; the other files still run.
            Err(e) => {
                let e = format!("{e:#}");
                eprintln!("gyre-bench: L1: {} failed: {e}", model.display());
                let first = e.lines().next().unwrap_or_default();
                rows.push(Row::new(
                    "L1",
                    &format!("{}: FAILED: {first:.160}", model.display()),
                ));
                files.push(json!({"model": model, "error": e}));
            }
        }
    }
    anyhow::ensure!(
        files.iter().any(|f| f.get("error").is_none()),
        "every file failed: {}",
        files
            .iter()
            .filter_map(|f| f["error"].as_str())
            .collect::<Vec<_>>()
            .join("; ")
    );
    let details = json!({
        "llama_server": ctx.llama_server,
        "threads": ctx.threads,
        "streams": ctx.streams,
        "prompt_tokens": ctx.prompt_len,
        "new_tokens": ctx.new_tokens,
        "llama_server_args": ctx.llama_server_args,
        "rounds": ctx.rounds,
        "solo_rounds": ctx.solo_rounds,
        "copy_bandwidth_bytes_per_s": ceilings.copy_bandwidth,
        "matmul_peak": ceilings.matmul,
        "files": files,
    });
    Ok((rows, details))
}

fn engine_name(engine: Engine) -> &'static str {
    match engine {
        Engine::Gyre => "gyre",
        Engine::LlamaCpp => "llama-server",
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::stats::Outcome as End;

    pub(super) fn record(tokens: u32, gap_ms: u64) -> Record {
        let mut r = Record::new(Duration::ZERO);
        r.events = (0..u64::from(tokens))
            .map(|i| (Duration::from_millis(100 + i * gap_ms), 1))
            .collect();
        r.tokens = tokens;
        r.elapsed = Duration::from_millis(100 + u64::from(tokens) * gap_ms);
        r.outcome = End::Finished("length".into());
        r
    }

    pub(super) fn level(streams: usize, tok_per_s: f64, gap_ms: u64) -> Level {
        Level {
            streams,
            tok_per_s,
            rounds_tok_per_s: vec![tok_per_s],
            summary: Summary::of(&[record(64, gap_ms)]),
            rounds_bandwidth: Vec::new(),
        }
    }

    #[test]
    fn targets_are_the_issues() {
        assert_eq!(target(1), Some(1.0));
        assert_eq!(target(16), Some(1.5));
        assert_eq!(target(4), None);
    }

    #[test]
    fn requests_are_greedy_fixed_length_and_uncached() {
        let body = crate::http::body(&spec(vec![5, 6, 7], 64), "m");
        assert_eq!(body["prompt"], json!([5, 6, 7]));
        assert_eq!(body["max_tokens"], 64);
        assert_eq!(body["ignore_eos"], true);
        assert_eq!(body["temperature"], 0);
        assert_eq!(body["stream"], true);
        assert_eq!(body["cache_prompt"], false);
    }

    #[test]
    fn a_short_or_failed_request_fails_the_round() {
        assert!(check(&[record(64, 10), record(64, 12)], 64).is_ok());
        let short = check(&[record(64, 10), record(20, 10)], 64);
        assert!(format!("{:#}", short.expect_err("short")).contains("20 tokens"));
        let mut failed = record(64, 10);
        failed.outcome = End::Error("HTTP 500".into());
        assert!(check(&[failed], 64).is_err());
    }
}
