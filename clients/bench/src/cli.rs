//! Command line: `gyre-bench run` (the whole comparison against
//! transformers) and `gyre-bench load` (the load generator alone, against a
//! running server). Every option also reads an environment variable.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::load::Api;

#[derive(Debug, Parser)]
#[command(
    name = "gyre-bench",
    version,
    about = "Benchmarks gyre's gRPC and OpenAI HTTP APIs"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Threads of the benchmark client's own runtime (1 keeps it off the
    /// cores the server needs).
    #[arg(
        long,
        env = "GYRE_BENCH_CLIENT_THREADS",
        default_value_t = 1,
        global = true
    )]
    pub client_threads: usize,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start `gyre serve` on a model, run scenarios S1-S5 against it and
    /// transformers, and E1 (embeddings) against sentence-transformers on an
    /// embedding model, and P1 (prompt lookup) and D1 (a draft model) on a
    /// real chat model, and L1 (llama.cpp's llama-server on the same GGUF
    /// files) (G1, G2 when --only names them); print a table and write JSON.
    Run(Box<RunArgs>),
    /// Drive a running server with N concurrent streams or Poisson arrivals
    /// and report TTFT, ITL and output tok/s per API.
    Load(Box<LoadArgs>),
    /// Measure this machine's memory copy and read bandwidth (L1's
    /// ceilings) on huge pages and on small ones, alternated.
    Ceilings(CeilingsArgs),
}

#[derive(Debug, Args)]
pub struct CeilingsArgs {
    /// Threads that copy or read at once. Default: the machine's cores.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Rounds, each measuring both kinds of page.
    #[arg(long, default_value_t = 8)]
    pub rounds: usize,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// HuggingFace model directory. Default: .gyre/bench/llama-64m (with
    /// --quick .gyre/bench/llama-quick), built by make_bench_model.py when
    /// missing or stale.
    #[arg(long, env = "GYRE_BENCH_MODEL")]
    pub model: Option<PathBuf>,
    /// Compute threads of both gyre (OMP_NUM_THREADS) and transformers
    /// (torch.set_num_threads). Default: the machine's cores.
    #[arg(long, env = "GYRE_BENCH_THREADS")]
    pub threads: Option<usize>,
    /// Device of both (gyre --device; transformers: cuda bf16 / cpu f32).
    #[arg(long, env = "GYRE_BENCH_DEVICE", default_value = "auto")]
    pub device: String,
    /// Scenarios to run, e.g. S1,S3 (default: all but G1 and G2, which run
    /// only when named here).
    #[arg(long, env = "GYRE_BENCH_ONLY", value_delimiter = ',')]
    pub only: Vec<String>,
    /// Where to write the JSON results.
    #[arg(
        long,
        env = "GYRE_BENCH_JSON_OUT",
        default_value = "bench-results.json"
    )]
    pub json_out: PathBuf,
    /// Smaller model (~9 M parameters) and shorter loads, for smoke tests.
    #[arg(long, env = "GYRE_BENCH_QUICK")]
    pub quick: bool,
    /// Skip transformers; report gyre's figures only.
    #[arg(long, env = "GYRE_BENCH_NO_REFERENCE")]
    pub no_reference: bool,
    /// The gyre binary. Default: `gyre` beside this binary, else on PATH.
    #[arg(long, env = "GYRE_BIN")]
    pub gyre_bin: Option<PathBuf>,
    /// Extra argument for `gyre serve` (repeatable).
    #[arg(long = "server-arg", allow_hyphen_values = true)]
    pub server_args: Vec<String>,
    /// Extra argument of O1's "on" server (repeatable), after the flags of
    /// --o1-on.
    #[arg(long = "ops-on-arg", allow_hyphen_values = true)]
    pub ops_on_args: Vec<String>,
    /// What O1's "on" server turns on (the "off" one has none of it): auth
    /// (a keys file with a tenant), metrics (scraped every second), tracing
    /// (OTLP to a receiver in the bench). One alone measures its own cost;
    /// `none` runs two identical servers (an A/A calibration).
    #[arg(
        long,
        env = "GYRE_BENCH_O1_ON",
        value_enum,
        value_delimiter = ',',
        default_value = "auth,metrics,tracing"
    )]
    pub o1_on: Vec<crate::scenarios::ops::Feature>,
    /// O1's pairs of rounds (on/off back to back, alternating which goes
    /// first). Default: 12 (2 with --quick).
    #[arg(long, env = "GYRE_BENCH_O1_PAIRS")]
    pub o1_pairs: Option<usize>,
    /// Blocks O1's pairs are split into: each block starts both servers
    /// afresh, alternating which starts first, so that one process's luck
    /// (two identical servers can differ by several percent) is not taken
    /// for the features' cost. Default: 4 (2 with --quick).
    #[arg(long, env = "GYRE_BENCH_O1_BLOCKS")]
    pub o1_blocks: Option<usize>,
    /// Benchmark a server that is already running at this gRPC URL (with
    /// --http-addr) instead of starting one. --model must be the directory
    /// it serves.
    #[arg(long, env = "GYRE_BENCH_GRPC_URL", requires = "http_addr")]
    pub grpc_url: Option<String>,
    /// The OpenAI HTTP address of that server.
    #[arg(long, env = "GYRE_BENCH_HTTP_ADDR", requires = "grpc_url")]
    pub http_addr: Option<SocketAddr>,
    /// Python with torch and transformers. Default: .venv/bin/python, else
    /// ~/.cache/gyre/venv/bin/python, else python3.
    #[arg(long, env = "GYRE_BENCH_PYTHON")]
    pub python: Option<PathBuf>,
    /// Directory of hf_reference.py and make_bench_model.py. Default:
    /// clients/bench, else this crate's source directory.
    #[arg(long, env = "GYRE_BENCH_SCRIPTS")]
    pub scripts_dir: Option<PathBuf>,
    /// Seed of the random prompts.
    #[arg(long, env = "GYRE_BENCH_SEED", default_value_t = 0)]
    pub seed: u64,
    /// Prompt length of S1, S2 and S4 (tokens).
    #[arg(long)]
    pub prompt_len: Option<usize>,
    /// Output length of S1 and S2 (tokens).
    #[arg(long)]
    pub output_len: Option<u32>,
    /// Concurrent streams of S2 (= transformers batch size).
    #[arg(long)]
    pub streams: Option<usize>,
    /// Shared prefix length of S3 (tokens).
    #[arg(long)]
    pub prefix_len: Option<usize>,
    /// gRPC streams of the S5 storm.
    #[arg(long)]
    pub storm: Option<usize>,
    /// Timed transformers runs per reference figure (median).
    #[arg(long)]
    pub hf_repeats: Option<usize>,
    /// G1's concurrency levels, each run over gRPC and over HTTP and as a
    /// transformers batch size. Default: 1,8,64,256 (1,8 with --quick).
    #[arg(long, value_delimiter = ',')]
    pub g1_streams: Vec<usize>,
    /// G1's prompt length (tokens). Default: 128 (32 with --quick).
    #[arg(long)]
    pub g1_prompt_tokens: Option<usize>,
    /// G1's new tokens per request. Default: 128 (16 with --quick).
    #[arg(long)]
    pub g1_new_tokens: Option<u32>,
    /// G2's concurrent streams. Default: 64 (8 with --quick).
    #[arg(long)]
    pub g2_streams: Option<usize>,
    /// G2's prompt length (tokens). Default: 2048 (256 with --quick).
    #[arg(long)]
    pub g2_prompt_tokens: Option<usize>,
    /// G2's new tokens per request. Default: 32 (8 with --quick).
    #[arg(long)]
    pub g2_new_tokens: Option<u32>,
    /// Requests each stream of G2's steady mode sends back to back (TTFT
    /// counts those after the first). Default: 3 (2 with --quick).
    #[arg(long)]
    pub g2_requests: Option<usize>,
    /// E1's embedding model directory (a sentence-transformers model),
    /// served by a `gyre serve` of its own.
    #[arg(
        long,
        env = "GYRE_BENCH_EMBED_MODEL",
        default_value = ".gyre/models/all-minilm-l6-v2"
    )]
    pub embed_model: PathBuf,
    /// Sentences in E1's batch (mixed lengths).
    #[arg(long, env = "GYRE_BENCH_EMBED_SENTENCES", default_value_t = 256)]
    pub embed_sentences: usize,
    /// Extra argument for E1's `gyre serve` (repeatable).
    #[arg(long = "embed-server-arg", allow_hyphen_values = true)]
    pub embed_server_args: Vec<String>,
    /// P1's chat model (a GGUF file or model directory), served by a
    /// `gyre serve` of its own.
    #[arg(
        long,
        env = "GYRE_BENCH_LOOKUP_MODEL",
        default_value = ".gyre/models/smollm2-135m-instruct.gguf"
    )]
    pub lookup_model: PathBuf,
    /// P1's tokens proposed per step (`num_assistant_tokens`).
    #[arg(long, default_value_t = 10)]
    pub lookup_tokens: u32,
    /// Extra argument for P1's `gyre serve` (repeatable).
    #[arg(long = "lookup-server-arg", allow_hyphen_values = true)]
    pub lookup_server_args: Vec<String>,
    /// D1's draft model for P1's model (`make models` writes SmolLM2's
    /// first 6 layers there).
    #[arg(
        long,
        env = "GYRE_BENCH_DRAFT_MODEL",
        default_value = ".gyre/models/smollm2-135m-draft6.gguf"
    )]
    pub draft_model: PathBuf,
    /// D1's tokens proposed per step (`num_assistant_tokens`).
    #[arg(long, default_value_t = 5)]
    pub draft_tokens: u32,
    /// L1's `llama-server` binary. Default:
    /// ~/.cache/gyre/llama.cpp/0.3.36/bin/llama-server (`make llamacpp`).
    #[arg(long, env = "GYRE_BENCH_LLAMA_SERVER")]
    pub llama_server: Option<PathBuf>,
    /// Extra argument of L1's `llama-server` (repeatable), after its own
    /// (a later flag wins: `--llama-server-arg=--threads
    /// --llama-server-arg=1`).
    #[arg(long = "llama-server-arg", allow_hyphen_values = true)]
    pub llama_server_args: Vec<String>,
    /// L1's GGUF files, each served by gyre and by llama-server in turn
    /// (`make llamacpp` makes the converted ones).
    #[arg(
        long,
        env = "GYRE_BENCH_L1_MODELS",
        value_delimiter = ',',
        default_value = ".gyre/models/smollm2-135m-instruct.gguf,\
            .gyre/llamacpp/smollm2-135m-instruct-q8_0.gguf,\
            .gyre/llamacpp/smollm2-135m-instruct-f32.gguf,\
            .gyre/llamacpp/llama-64m-f32.gguf,\
            .gyre/models/gemma3-270m-q4_k_m.gguf"
    )]
    pub l1_models: Vec<PathBuf>,
    /// L1's concurrency levels (HTTP streams).
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    pub l1_streams: Vec<usize>,
    /// L1's prompt length (random token ids).
    #[arg(long, default_value_t = 32)]
    pub l1_prompt_tokens: usize,
    /// L1's new tokens per request (EOS ignored, so exactly this many).
    #[arg(long, default_value_t = 64)]
    pub l1_new_tokens: u32,
    /// L1's rounds per level and server above 1 stream (the median
    /// counts). Default: 3 (1 with --quick).
    #[arg(long)]
    pub l1_rounds: Option<usize>,
    /// L1's rounds per server at 1 stream, each a single request. Default:
    /// 9 (1 with --quick).
    #[arg(long)]
    pub l1_solo_rounds: Option<usize>,
    /// L1's perplexity text: each file's perplexity on it, by gyre and by
    /// llama.cpp's `llama-perplexity` (beside --llama-server), over the same
    /// token ids (`llama-tokenize`).
    #[arg(long, default_value = "clients/bench/data/perplexity.txt")]
    pub l1_ppl_text: PathBuf,
    /// L1's perplexity context: chunks of this many tokens, the second
    /// half of each scored (llama-perplexity's protocol).
    #[arg(long, default_value_t = 128)]
    pub l1_ppl_ctx: usize,
    /// L1's perplexity chunks (at most; 0 skips the perplexity).
    #[arg(long, default_value_t = 8)]
    pub l1_ppl_chunks: usize,
    /// D1's sampling temperature (0: greedy, and both sides' answers must
    /// be the same text; above 0, each round's two requests are sampled
    /// with one seed, and the answers are not compared).
    #[arg(long, default_value_t = 0.0)]
    pub draft_temperature: f32,
}

#[derive(Debug, Args)]
pub struct LoadArgs {
    /// gRPC URL of the server, e.g. http://127.0.0.1:50051.
    #[arg(
        long,
        env = "GYRE_BENCH_GRPC_URL",
        default_value = "http://127.0.0.1:50051"
    )]
    pub grpc_url: String,
    /// OpenAI HTTP address, e.g. 127.0.0.1:8000 (needed for --api http).
    #[arg(long, env = "GYRE_BENCH_HTTP_ADDR")]
    pub http_addr: Option<SocketAddr>,
    /// APIs to drive, one after the other: grpc, http or both.
    #[arg(long, value_delimiter = ',', default_value = "grpc")]
    pub api: Vec<Api>,
    /// Model id; default the server's first model (from ListModels). With
    /// it and `--api http` alone, no gRPC connection is made.
    #[arg(long, env = "GYRE_BENCH_MODEL_ID")]
    pub model_id: Option<String>,
    /// Vocabulary size for random prompts when gRPC is not used (ids are
    /// drawn from 300 to this minus 300).
    #[arg(long, default_value_t = 32000)]
    pub vocab_size: u32,
    /// Concurrent streams (closed loop); ignored with --rate.
    #[arg(long, default_value_t = 8)]
    pub streams: usize,
    /// Requests each stream sends in a row.
    #[arg(long, default_value_t = 1)]
    pub per_stream: usize,
    /// Poisson arrivals at this many requests per second (open loop).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Number of Poisson arrivals.
    #[arg(long, default_value_t = 32)]
    pub requests: usize,
    /// Send Poisson arrivals for this many seconds instead of --requests.
    #[arg(long)]
    pub duration_s: Option<f64>,
    /// Prompt of random token ids of this length.
    #[arg(long, default_value_t = 32)]
    pub prompt_len: usize,
    /// A text prompt instead of random token ids.
    #[arg(long)]
    pub prompt_text: Option<String>,
    /// Tokens generated per request (EOS ignored, greedy).
    #[arg(long, default_value_t = 128)]
    pub output_len: u32,
    /// Drop each stream after this many output events.
    #[arg(long)]
    pub cancel_after: Option<u32>,
    /// gRPC connections (HTTP/2) the requests share.
    #[arg(long, default_value_t = 1)]
    pub connections: usize,
    /// Seed of prompts and arrivals.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Write the summaries (and every request's record) as JSON here.
    #[arg(long)]
    pub json_out: Option<PathBuf>,
}
