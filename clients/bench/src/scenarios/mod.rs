//! The comparison scenarios of `gyre-bench run` and what they share.
//!
//! | id | compares | target |
//! |---|---|---|
//! | S1 | gyre 1 gRPC stream vs transformers `generate` batch 1, output tok/s | ratio >= 1.0 |
//! | S2 | gyre 16 HTTP streams vs transformers static batch of 16, output tok/s | ratio >= 1.5 |
//! | S3 | TTFT with a cached 1,500-token prefix vs an uncached one | ratio <= 0.2 |
//! | S4 | the same load through HTTP vs straight gRPC: added latency per token | <= 50 µs |
//! | S5 | a cancellation storm, then the engine's KV blocks in use | 0 |
//! | O1 | S2's load with auth (a keys file), metrics (scraped every second) and tracing (OTLP to the bench's receiver) on vs all off, ABBA pairs: throughput, and server CPU per streamed token | ratio >= 0.98, <= 20 µs |
//! | B1 | beam search width 4 on SmolLM2 (own server): gyre gRPC vs transformers `generate(num_beams=4)`, tok/s of the best hypothesis | ratio >= 1.0 |
//! | E1 | gyre embeddings (its own server on an embedding model) vs sentence-transformers `encode`, sentences/s | ratio >= 1.5 |
//! | P1 | prompt lookup vs plain decoding, 1 stream, edit-style chat on SmolLM2-135M-Instruct (its own server), tok/s | ratio >= 1.5 |
//! | G1 | 1, 8, 64, 256 concurrent streams over gRPC and over HTTP vs transformers static batches of the same sizes (one process): output tok/s, TTFT and ITL p50/p99 | - |
//! | G2 | TTFT of 64 streams of 2,048-token prompts over gRPC: a burst, and closed-loop streams in steady state | p99 <= 800 ms (steady) |
//! | L1 | gyre vs llama.cpp's `llama-server` on the same GGUF files (each its own server, one at a time), 1 and 16 HTTP streams: output tok/s, TTFT, ITL, against the bandwidth limit and the matmul peak | ratio >= 1.0 (1 stream), >= 1.5 (16) |
//!
//! G1 and G2 (sized for a GPU) run only when `--only` names them.
//!
//! Each scenario returns its table rows and a JSON object of details; one
//! that fails is reported as failed and the others still run.

mod beam;
mod cancel;
pub mod embeddings;
pub mod llamacpp;
pub mod lookup;
pub mod ops;
mod overhead;
mod perplexity;
mod prefix;
mod sweep;
mod throughput;

use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;
use serde_json::Value;

use crate::load::{self, Api, Arrival, Clients, Prompt, RequestSpec};
use crate::reference::Python;
use crate::report::{Row, ScenarioResult};
use crate::stats::Record;

/// Every scenario id, in run order.
pub const ALL: [&str; 13] = [
    "S1", "S2", "S3", "S4", "S5", "O1", "B1", "G1", "G2", "E1", "P1", "D1", "L1",
];

/// Scenarios that run only when `--only` names them (sized for a GPU).
pub const OPT_IN: [&str; 2] = ["G1", "G2"];

/// Whether `only` (empty: all but [`OPT_IN`]) selects scenario `id`.
pub fn selected(only: &[String], id: &str) -> bool {
    if only.is_empty() {
        return !OPT_IN.contains(&id);
    }
    only.iter().any(|o| o.eq_ignore_ascii_case(id))
}

/// Whether scenario `id` runs on the generative model (S1-S5, O1, B1, G1,
/// G2).
fn generative(id: &str) -> bool {
    id.starts_with('S') || id.starts_with('G') || id == "O1" || id == "B1"
}

/// Whether `only` selects any scenario of the generative model (S1-S5, O1,
/// B1, G1, G2).
pub fn needs_generative(only: &[String]) -> bool {
    ALL.iter()
        .filter(|id| generative(id))
        .any(|id| selected(only, id))
}

/// Sizes of the scenarios' loads.
#[derive(Debug, Clone, Serialize)]
pub struct Sizes {
    /// S1/S2/S4 prompt length in tokens.
    pub prompt_len: usize,
    /// S1/S2 output length in tokens.
    pub output_len: u32,
    /// S1 sequential gyre requests (the median counts).
    pub s1_repeats: usize,
    /// S2 concurrent HTTP streams = transformers batch size, and rounds
    /// (the median counts).
    pub s2_streams: usize,
    pub s2_rounds: usize,
    /// S3 shared prefix length, suffix length, output length, repetitions.
    pub s3_prefix: usize,
    pub s3_suffix: usize,
    pub s3_output: u32,
    pub s3_repeats: usize,
    /// S4 concurrent streams per run, output length, alternating rounds.
    pub s4_streams: usize,
    pub s4_output: u32,
    pub s4_rounds: usize,
    /// S5 gRPC and HTTP streams of the storm, prompt length, cancel point.
    pub s5_grpc: usize,
    pub s5_http: usize,
    pub s5_prompt: usize,
    pub s5_cancel_after: u32,
    /// O1 pairs of rounds (on and off back to back), and the blocks they
    /// are split into (each with both servers started afresh).
    pub o1_pairs: usize,
    pub o1_blocks: usize,
    /// Timed transformers runs after its warm-up (the median counts).
    pub hf_repeats: usize,
    /// G1 concurrency levels (each also a transformers batch size), prompt
    /// and output lengths.
    pub g1_streams: Vec<usize>,
    pub g1_prompt: usize,
    pub g1_new: u32,
    /// G2 streams, prompt and output lengths, and requests per stream of
    /// its steady (closed-loop) mode.
    pub g2_streams: usize,
    pub g2_prompt: usize,
    pub g2_new: u32,
    pub g2_requests: usize,
}

impl Sizes {
    pub fn full() -> Self {
        Self {
            prompt_len: 32,
            output_len: 128,
            s1_repeats: 3,
            s2_streams: 16,
            s2_rounds: 2,
            s3_prefix: 1500,
            s3_suffix: 16,
            s3_output: 4,
            s3_repeats: 3,
            s4_streams: 8,
            s4_output: 64,
            s4_rounds: 3,
            s5_grpc: 200,
            s5_http: 40,
            s5_prompt: 16,
            s5_cancel_after: 3,
            o1_pairs: 12,
            o1_blocks: 4,
            hf_repeats: 3,
            g1_streams: vec![1, 8, 64, 256],
            g1_prompt: 128,
            g1_new: 128,
            g2_streams: 64,
            g2_prompt: 2048,
            g2_new: 32,
            g2_requests: 3,
        }
    }

    pub fn quick() -> Self {
        Self {
            output_len: 32,
            s1_repeats: 2,
            s3_repeats: 2,
            s4_output: 32,
            s2_rounds: 1,
            s4_rounds: 1,
            s5_grpc: 60,
            s5_http: 12,
            o1_pairs: 2,
            o1_blocks: 2,
            hf_repeats: 1,
            g1_streams: vec![1, 8],
            g1_prompt: 32,
            g1_new: 16,
            g2_streams: 8,
            g2_prompt: 256,
            g2_new: 8,
            g2_requests: 2,
            ..Self::full()
        }
    }
}

/// What the scenarios run against.
pub struct Ctx {
    pub clients: Clients,
    pub python: Python,
    pub model_dir: PathBuf,
    pub vocab_size: u32,
    pub threads: usize,
    pub device: String,
    /// Directory for spec files.
    pub scratch: PathBuf,
    pub sizes: Sizes,
    pub seed: u64,
    /// Skip transformers (rows show gyre only).
    pub no_reference: bool,
    /// The gyre binary and the extra arguments of the server under test
    /// (O1 starts two more servers with them).
    pub gyre_bin: PathBuf,
    pub server_args: Vec<String>,
    /// O1's "on" arguments beyond its features' (`--ops-on-arg`).
    pub ops_on_args: Vec<String>,
    /// What O1's "on" side turns on (`--o1-on`).
    pub ops_on: Vec<ops::Feature>,
}

impl Ctx {
    /// `n` distinct random prompts of `len` ordinary token ids, from `salt`
    /// and the run's seed.
    pub fn prompts(&self, n: usize, len: usize, salt: u64) -> Vec<Vec<u32>> {
        let hi = self.vocab_size.saturating_sub(300).max(301);
        let seed = self.seed.wrapping_mul(1_000_003).wrapping_add(salt);
        load::random_prompts(n, len, 300..hi, seed)
    }

    /// One spec per prompt, `max_tokens` each.
    pub fn specs(&self, prompts: &[Vec<u32>], max_tokens: u32) -> Vec<RequestSpec> {
        prompts
            .iter()
            .map(|p| RequestSpec::new(Prompt::Ids(p.clone()), max_tokens))
            .collect()
    }

    /// Runs `specs` as `streams` concurrent streams (one request each, or
    /// `per_stream` in a row) over `api`.
    pub async fn load(
        &self,
        api: Api,
        streams: usize,
        per_stream: usize,
        specs: &[RequestSpec],
    ) -> Vec<Record> {
        let arrival = Arrival::Concurrent {
            streams,
            per_stream,
        };
        load::run(&self.clients, api, &arrival, specs, Instant::now()).await
    }

    /// A short request on each API, so first-use costs are not measured.
    pub async fn warm_up(&self, salt: u64) {
        let specs = self.specs(&self.prompts(1, 8, salt), 4);
        self.load(Api::Grpc, 1, 1, &specs).await;
        self.load(Api::Http, 1, 1, &specs).await;
    }
}

/// A scenario's rows and details.
pub type Outcome = anyhow::Result<(Vec<Row>, Value)>;

/// Pays the server's first-use costs (a long prompt, a full batch, both
/// APIs) before anything is measured; salted so nothing is reused later.
pub async fn warm_up_server(ctx: &Ctx) {
    let sz = &ctx.sizes;
    let long = ctx.prompts(1, sz.s3_prefix + sz.s3_suffix, 1);
    let mut specs = ctx.specs(&long, 4);
    specs[0].cache_salt = Some(format!("warm-up-{}", ctx.seed));
    ctx.load(Api::Grpc, 1, 1, &specs).await;
    let batch = ctx.specs(&ctx.prompts(sz.s2_streams, sz.prompt_len, 2), 8);
    ctx.load(Api::Http, batch.len(), 1, &batch).await;
    ctx.load(Api::Grpc, batch.len(), 1, &batch).await;
}

/// Runs scenario `id` to its result: its rows and details, or its error
/// (reported, so the other scenarios still run), and how long it took.
async fn run_one(id: &str, scenario: impl std::future::Future<Output = Outcome>) -> ScenarioResult {
    let started = Instant::now();
    eprintln!("gyre-bench: {id}: {} ...", title(id));
    let outcome = scenario.await.map_err(|e| format!("{e:#}"));
    let seconds = started.elapsed().as_secs_f64();
    eprintln!("gyre-bench: {id} done in {seconds:.1} s");
    let (rows, details, error) = match outcome {
        Ok((rows, details)) => (rows, details, None),
        Err(e) => {
            eprintln!("gyre-bench: {id} failed: {e}");
            (Vec::new(), Value::Null, Some(e))
        }
    };
    ScenarioResult {
        id: id.to_owned(),
        title: title(id).to_owned(),
        rows,
        details,
        error,
        seconds,
    }
}

/// Runs E1 when `only` selects it.
pub async fn run_embeddings(
    ctx: &embeddings::EmbedCtx<'_>,
    only: &[String],
) -> Vec<ScenarioResult> {
    if !selected(only, "E1") {
        return Vec::new();
    }
    vec![run_one("E1", embeddings::e1(ctx)).await]
}

/// Runs P1 when `only` selects it.
pub async fn run_lookup(ctx: &lookup::LookupCtx<'_>, only: &[String]) -> Vec<ScenarioResult> {
    let mut results = Vec::new();
    if selected(only, "P1") {
        results.push(run_one("P1", lookup::p1(ctx)).await);
    }
    if selected(only, "D1") {
        results.push(run_one("D1", lookup::d1(ctx)).await);
    }
    results
}

/// Runs L1 when `only` selects it.
pub async fn run_llamacpp(ctx: &llamacpp::LlamaCtx<'_>, only: &[String]) -> Vec<ScenarioResult> {
    if !selected(only, "L1") {
        return Vec::new();
    }
    vec![run_one("L1", llamacpp::l1(ctx)).await]
}

/// Runs the generative scenarios (S1-S5, O1, B1, G1, G2) in `only` (all
/// but [`OPT_IN`] when empty), in the order of [`ALL`].
pub async fn run(ctx: &Ctx, only: &[String]) -> Vec<ScenarioResult> {
    eprintln!("gyre-bench: warming the server up ...");
    warm_up_server(ctx).await;
    let mut results = Vec::new();
    // G2's transformers figure, measured by G1's reference process when
    // both run (the model loads once).
    let mut g2_reference = None;
    for id in ALL {
        if !selected(only, id) || !generative(id) {
            continue;
        }
        let scenario = async {
            match id {
                "S1" => throughput::s1(ctx).await,
                "S2" => throughput::s2(ctx).await,
                "S3" => prefix::s3(ctx).await,
                "S4" => overhead::s4(ctx).await,
                "O1" => ops::o1(ctx).await,
                "B1" => beam::b1(ctx).await,
                "G1" => sweep::g1(ctx, selected(only, "G2"), &mut g2_reference).await,
                "G2" => sweep::g2(ctx, g2_reference.take()).await,
                _ => cancel::s5(ctx).await,
            }
        };
        let result = run_one(id, scenario).await;
        if OPT_IN.contains(&id) {
            // Long GPU runs: the figures are on stderr even if the run is
            // cut short before the report.
            eprint!("{}", crate::report::table(std::slice::from_ref(&result)));
        }
        results.push(result);
    }
    results
}

/// The one-line description of scenario `id`.
pub fn title(id: &str) -> &'static str {
    match id {
        "S1" => "batch 1: gyre gRPC stream vs transformers generate",
        "S2" => "concurrency: gyre HTTP streams vs transformers static batch",
        "S3" => "prefix cache: TTFT with a cached long prefix vs an uncached one",
        "S4" => "HTTP shim overhead: the same load through HTTP vs gRPC",
        "S5" => "cancellation storm: KV blocks released",
        "O1" => "operations overhead: auth, metrics and tracing on vs all off (S2 load)",
        "B1" => "beam search width 4 on SmolLM2: gyre vs transformers generate(num_beams=4)",
        "E1" => "embeddings: gyre vs sentence-transformers encode, same batch and threads",
        "P1" => "prompt lookup vs plain decoding: 1 stream, edit-style prompts, real model",
        "D1" => "draft model (the model's first layers) vs plain decoding: 1 stream, as P1",
        "G1" => "throughput per concurrency level, gRPC and HTTP, vs transformers batches",
        "G2" => "TTFT of many streams with long prompts: a burst, then steady state (gRPC)",
        "L1" => "gyre vs llama.cpp llama-server on the same GGUF files: 1 and 16 HTTP streams",
        _ => "?",
    }
}

/// Median of `values` (0 when empty).
pub fn median(values: &[f64]) -> f64 {
    crate::stats::Dist::of(values.to_vec()).p50
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_scenarios_run_only_when_named() {
        let only = |ids: &[&str]| ids.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert!(selected(&[], "S1") && selected(&[], "E1"));
        assert!(!selected(&[], "G1") && !selected(&[], "G2"));
        assert!(selected(&only(&["g1", "G2"]), "G1") && selected(&only(&["G2"]), "G2"));
        assert!(!selected(&only(&["G1"]), "S1"));
        assert!(needs_generative(&only(&["G2"])) && needs_generative(&[]));
        assert!(!needs_generative(&only(&["E1", "P1", "D1", "L1"])));
        assert!(selected(&[], "L1") && selected(&only(&["l1"]), "L1"));
    }
}
