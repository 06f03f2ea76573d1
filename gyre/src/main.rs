//! The `gyre` binary: a crate of its own over the service and the shim (so
//! the service library does not depend on the shim), with the libtorch link
//! settings in its `build.rs`.
//!
//! - `gyre serve`: the gRPC service and the OpenAI-compatible HTTP shim in one
//!   process (the shim reaches the service over gRPC on loopback, exactly as a
//!   standalone `gyre-shim` would).
//! - `gyre grpc`: the gRPC service alone.
//! - `gyre chat`, `gyre models`: clients of a running server (`chat`, `models_cmd`).
//! - `gyre bench`: the load generator, `gyre-bench` (`bench_cmd`).
//!
//! Every flag is also an environment variable (`GYRE_*`), and the flags of
//! `serve` and `grpc` can be set in the `--config` file (`config_file`).

use std::io::{IsTerminal as _, Write};
use std::sync::Arc;

use anyhow::Context;
use clap::{Args, CommandFactory as _, Parser, Subcommand, ValueEnum};
use gyre_engine::DeviceChoice;
use gyre_engine::progress::{LoadProgress, LogLines, TerminalBar};
use gyre_service::registry::load::{self, LoadDefaults};
use gyre_service::registry::spec::ModelSpec;
use gyre_service::resolve;
use gyre_service::server::{ServerOptions, grpc_service_for};
use gyre_shim::logging::LogFormat;
use tokio::net::TcpListener;
use tokio::sync::watch;

mod bench_cmd;
mod chat;
mod client;
mod config_file;
mod help_topics;
mod metrics_args;
mod models_cmd;

#[derive(Parser)]
#[command(name = "gyre", version, about = "gRPC-first LLM inference server")]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log lines as text (coloured only on a terminal) or one JSON object a line.
    #[arg(
        long,
        global = true,
        env = "GYRE_LOG_FORMAT",
        value_enum,
        default_value_t
    )]
    log_format: LogFormat,
    /// Export traces over OTLP/gRPC to this collector (e.g.
    /// `http://127.0.0.1:4317`); also read from OTEL_EXPORTER_OTLP_ENDPOINT.
    /// Unset: no spans are made.
    #[arg(long, global = true, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
    /// Put each request's prompt and output text in its `gyre::request`
    /// log line (off: they are never logged).
    #[arg(long, global = true, env = "GYRE_LOG_PROMPTS")]
    log_prompts: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Serve gRPC and the OpenAI-compatible HTTP API.
    Serve {
        #[command(flatten)]
        model: ModelArgs,
        #[command(flatten)]
        grpc: GrpcArgs,
        /// Address of the OpenAI-compatible HTTP API.
        #[arg(long, env = "GYRE_HTTP_ADDR", default_value = "127.0.0.1:8000")]
        http_addr: String,
        #[command(flatten)]
        http: HttpArgs,
    },
    /// Serve the gRPC API only.
    Grpc {
        #[command(flatten)]
        model: ModelArgs,
        #[command(flatten)]
        grpc: GrpcArgs,
    },
    /// API keys for --keys-file.
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// Chat with a model, streamed: against a running server (gRPC, or
    /// --url for the HTTP API) or a model loaded in this process
    /// (--model-dir). Reads lines from standard input (a terminal or a pipe).
    Chat(Box<chat::ChatArgs>),
    /// List the models a running server serves.
    Models(models_cmd::ModelsArgs),
    /// Run the load generator (`gyre-bench`, beside this binary) with these
    /// arguments: `gyre bench --help` for its own.
    #[command(disable_help_flag = true)]
    Bench(bench_cmd::BenchArgs),
}

#[derive(Subcommand)]
enum KeysCommand {
    /// Prints the SHA-256 (hex) of a key, as a keys file's `sha256`: of
    /// KEY, or of the first line of standard input without one (which
    /// keeps the key out of the shell's history).
    Hash { key: Option<String> },
}

/// `gyre keys hash`.
fn hash_key(key: Option<String>) -> anyhow::Result<()> {
    let key = match key {
        Some(k) => k,
        None => {
            let mut line = String::new();
            std::io::stdin().read_line(&mut line)?;
            line.trim_end_matches(['\r', '\n']).to_string()
        }
    };
    if key.is_empty() {
        anyhow::bail!("the key is empty");
    }
    announce(gyre_service::keys::hash_key(&key));
    Ok(())
}

#[derive(Args)]
struct ModelArgs {
    /// A model to serve (repeatable; the first is the default): a GGUF file,
    /// a HuggingFace model directory (config.json, *.safetensors,
    /// tokenizer.json, ...), or a hub id (`org/name`) already in the local
    /// HuggingFace cache (HF_HUB_CACHE, else HF_HOME/hub, else
    /// ~/.cache/huggingface/hub; nothing is downloaded), optionally
    /// followed by `,key=value` items: name, alias (repeatable), version,
    /// revision, deprecated, sunset (dates: YYYY-MM-DD or RFC 3339),
    /// owned_by, kv_cache_mib, prompt_lookup (tokens per step, 0 to 64),
    /// draft (a draft model), draft_tokens (its tokens per step, 0 to 64).
    /// An existing path wins over a hub id. A
    /// sentence-transformers directory (modules.json) or a `BertModel` one
    /// is served as an embedding model (/v1/embeddings, gyre.v1.Embeddings)
    /// with the same catalogue keys (kv_cache_mib aside).
    /// Default (without --model and --config): SmolLM2-135M-Instruct,
    /// linked there by `make setup`.
    #[arg(long, env = "GYRE_MODEL")]
    model: Vec<String>,
    /// A TOML file listing models to serve (after those of --model): a
    /// `[[models]]` table each, with `source` and the keys --model takes
    /// (`aliases` a list). Its top-level keys set flags by their long name
    /// (`kv-cache-mib = 512`); a flag or its environment variable wins.
    #[arg(long, env = "GYRE_CONFIG")]
    config: Option<std::path::PathBuf>,
    /// For a hub id: the branch, tag or commit to serve (default: main).
    /// Only with a single model (else use `revision=` in its spec).
    #[arg(long, env = "GYRE_REVISION")]
    revision: Option<String>,
    /// Model id clients use (default: the hub id; for a path, the
    /// directory's name, or the GGUF file's without `.gguf`). Only with a
    /// single model (else use `name=` in its spec).
    #[arg(long, env = "GYRE_SERVED_MODEL_NAME")]
    served_model_name: Option<String>,
    /// Device memory, in MiB, that the models' budgets (weights and KV
    /// cache) are checked against at start instead of the measured free
    /// memory (the host's available RAM on the CPU; on CUDA nothing is
    /// checked without this).
    #[arg(long, env = "GYRE_DEVICE_MEMORY_MIB")]
    device_memory_mib: Option<u64>,
    /// Where to run the model.
    #[arg(long, env = "GYRE_DEVICE", value_enum, default_value = "auto")]
    device: Device,
    /// A chat template to use instead of the model's: a Jinja file, or the
    /// template text itself.
    #[arg(long, env = "GYRE_CHAT_TEMPLATE")]
    chat_template: Option<String>,
    /// Accept requests that bring their own chat template (`chat_template`).
    /// Off by default: a template is code the server runs.
    #[arg(long, env = "GYRE_TRUST_REQUEST_CHAT_TEMPLATE")]
    trust_request_chat_template: bool,
    /// How tool calls are parsed out of the output: hermes (<tool_call>,
    /// Qwen), llama3_json, mistral, deepseek, json. Default: what the chat
    /// template uses. Mistral's and DeepSeek's markers are special tokens,
    /// kept in the text for the parser.
    #[arg(long, env = "GYRE_TOOL_CALL_PARSER", value_parser = ["hermes", "llama3_json", "mistral", "deepseek", "json"])]
    tool_call_parser: Option<String>,
    /// How reasoning sections are split from the answer: `auto` (from the
    /// chat template: `think` when it mentions `</think>`, `mistral` for
    /// `[/THINK]`), `none`, `think` (`<think>...</think>`; aliases qwen3,
    /// qwq, smollm3, granite, deepseek_v3), `deepseek_r1` (the same markers,
    /// output always starts inside the section) or `mistral` (`[THINK]`).
    #[arg(long, env = "GYRE_REASONING_PARSER", default_value = "auto")]
    reasoning_parser: gyre_service::reasoning::ParserChoice,
    /// Prompt-lookup decoding by default for every generative model: up to
    /// this many tokens proposed per step from n-gram matches in the
    /// prompt and output (0, the default: off; a request's
    /// `num_assistant_tokens` and `max_ngram_size` override it, up to 64).
    #[arg(long, env = "GYRE_PROMPT_LOOKUP_TOKENS",
          value_parser = clap::value_parser!(u32).range(0..=64))]
    prompt_lookup_tokens: Option<u32>,
    /// Speculative decoding with a draft model: a smaller model with the
    /// same tokenizer (a GGUF file or HuggingFace directory), loaded beside
    /// the model with a KV cache of its own; its proposals (argmax for
    /// greedy requests, drawn for sampled ones) are verified by the model
    /// so the output's distribution is unchanged. Requests then use
    /// it by default (`num_assistant_tokens` / `assistant_confidence_threshold`;
    /// 5 tokens unless generation_config.json says). A draft whose vocabulary
    /// differs is refused at load. Only with a single model (else give each
    /// its own `draft=`).
    #[arg(long, env = "GYRE_DRAFT_MODEL")]
    draft_model: Option<String>,
    /// vLLM's speculative decoding flag, with vLLM's keys (a JSON object),
    /// for a single model. `{"method": "ngram", "num_speculative_tokens":
    /// K, "prompt_lookup_max": N, "prompt_lookup_min": M}`: prompt lookup by
    /// default with K tokens per step (1 to 64), n-grams from N down to M
    /// (1 to 16; vLLM's defaults: both 5, or one given, the other equal to
    /// it) for requests that do not send `max_ngram_size`. `{"model": PATH,
    /// "num_speculative_tokens": K}` (method absent or "draft_model"): as
    /// --draft-model PATH, K tokens per step by default instead of
    /// generation_config.json's `num_assistant_tokens` (a request's own still
    /// wins). Other methods (eagle, medusa, mtp, suffix...) and other keys
    /// are refused. Not with --draft-model or --prompt-lookup-tokens.
    #[arg(long, env = "GYRE_SPECULATIVE_CONFIG", value_name = "JSON")]
    speculative_config: Option<String>,
    #[command(flatten)]
    engine: EngineArgs,
}

/// Scheduler and KV-cache settings.
#[derive(Args)]
struct EngineArgs {
    /// Memory for the paged KV cache of each model, in MiB (capped at what
    /// --max-running sequences of full context need; a model's
    /// `kv_cache_mib` overrides it).
    #[arg(long, env = "GYRE_KV_CACHE_MIB", default_value_t = 1024)]
    kv_cache_mib: u64,
    /// Exact number of KV blocks (overrides --kv-cache-mib).
    #[arg(long, env = "GYRE_NUM_KV_BLOCKS")]
    num_kv_blocks: Option<usize>,
    /// Tokens per KV block.
    #[arg(long, env = "GYRE_BLOCK_SIZE", default_value_t = 16)]
    block_size: usize,
    /// Most sequences running at once.
    #[arg(long, env = "GYRE_MAX_RUNNING", default_value_t = 64)]
    max_running: usize,
    /// Most tokens per scheduler step (decodes + prefill chunks).
    #[arg(long, env = "GYRE_MAX_BATCH_TOKENS", default_value_t = 512)]
    max_batch_tokens: usize,
    /// libtorch compute threads on CPU (default: one per core). On small
    /// machines, leaving a core to the server stack can help under load.
    #[arg(long, env = "GYRE_COMPUTE_THREADS")]
    compute_threads: Option<usize>,
    /// Dequantize a GGUF's weights to f32 at load. By default its Q8_0,
    /// Q4_0 and Q4_1 matrices stay in their blocks on a CPU with AVX-512
    /// VNNI and are multiplied by quantized kernels (4.5-8.5 bits per weight
    /// read per token instead of 32); this restores the f32 path (the
    /// reference the quantized one is tested against).
    #[arg(long, env = "GYRE_DEQUANTIZE")]
    dequantize: bool,
    /// Requests that may wait while the engine is full. A new request gets
    /// RESOURCE_EXHAUSTED (HTTP 429) only when the requests not yet started
    /// already number this plus the free running slots (--max-running minus
    /// the sequences running): at most --max-running + --max-queue requests
    /// run or wait at once, and a burst the engine can start at its next
    /// step is never refused.
    #[arg(long, env = "GYRE_MAX_QUEUE", default_value_t = 1024)]
    max_queue: usize,
    /// Embedding models: most padded tokens (inputs times the longest one)
    /// per forward pass of the embedding worker.
    #[arg(long, env = "GYRE_EMBED_BATCH_TOKENS", default_value_t = 8192,
          value_parser = clap::value_parser!(u32).range(1..))]
    embed_batch_tokens: u32,
}

#[derive(Args)]
struct GrpcArgs {
    /// Address of the gRPC API.
    #[arg(long, env = "GYRE_GRPC_ADDR", default_value = "127.0.0.1:50051")]
    grpc_addr: String,
    /// When set, clients must send `Authorization: Bearer <key>` (HTTP) or
    /// the `authorization` metadata (gRPC; health and reflection excepted),
    /// the scheme in any case; the key is compared in constant time.
    #[arg(long, env = "GYRE_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// A TOML file (YAML when its name ends in .yaml or .yml) mapping API
    /// keys (as SHA-256 hashes: `gyre keys hash`) to tenants with allowed
    /// models and quotas (see the README's
    /// "Operations: tenants and keys"). Reloaded when it changes and on
    /// SIGHUP; a file that does not parse keeps the previous keys. Instead
    /// of --api-key.
    #[arg(long, env = "GYRE_KEYS_FILE", conflicts_with = "api_key")]
    keys_file: Option<std::path::PathBuf>,
    /// Leave the probes open to callers without a key: with --keys-file,
    /// gRPC health and server reflection (otherwise they need one); with
    /// --keys-file or --api-key, /metrics on the HTTP port (otherwise it
    /// needs a valid key; --metrics-addr is always open). HTTP /health
    /// and /version are always open.
    #[arg(long, env = "GYRE_OPEN_ENDPOINTS")]
    open_endpoints: bool,
    /// Turns the admin service (gyre.v1.Admin: load and unload models) on,
    /// guarded by this key (`authorization: Bearer <key>`). It grants
    /// nothing else, and --api-key does not grant it. Unset: the admin
    /// service answers UNIMPLEMENTED.
    #[arg(long, env = "GYRE_ADMIN_API_KEY", hide_env_values = true)]
    admin_api_key: Option<String>,
    /// On SIGTERM or Ctrl-C: seconds to let running requests finish while
    /// health reports NOT_SERVING (HTTP /health 503) and new requests get
    /// UNAVAILABLE (HTTP 503). A second signal stops at once.
    #[arg(long, env = "GYRE_DRAIN_TIMEOUT", default_value_t = 30.0)]
    drain_timeout: f64,
    /// Seconds between deep health probes: a one-token prefill and decode
    /// through each generative model's engine; a model whose probe fails or
    /// stalls reports NOT_SERVING in gRPC health until one passes. 0: off.
    #[arg(long, env = "GYRE_DEEP_HEALTH_INTERVAL_SECS", default_value = "0", value_parser = gyre_shim::conn::parse_secs)]
    deep_health_interval_secs: std::time::Duration,
    /// Seconds a deep health probe may take (queue wait included) before it
    /// counts as failed.
    #[arg(long, env = "GYRE_DEEP_HEALTH_TIMEOUT_SECS", default_value = "30", value_parser = gyre_shim::conn::parse_secs)]
    deep_health_timeout_secs: std::time::Duration,
    /// Connection limits, applied to each port.
    #[command(flatten)]
    conn: gyre_shim::conn::ConnArgs,
    /// The Responses API's store.
    #[command(flatten)]
    responses: ResponsesArgs,
    /// TLS on both ports.
    #[command(flatten)]
    tls: gyre_shim::tls::TlsArgs,
    /// PEM CA certificate(s): gRPC clients must present a certificate
    /// chaining to one of them (mTLS). Needs --tls-cert and --tls-key. The
    /// HTTP port does not ask for client certificates.
    #[arg(long, env = "GYRE_TLS_CLIENT_CA", requires = "tls_cert")]
    tls_client_ca: Option<std::path::PathBuf>,
    /// Prometheus metrics.
    #[command(flatten)]
    metrics: metrics_args::MetricsArgs,
}

/// Where the Responses API keeps responses and conversations, and how many.
#[derive(Args)]
struct ResponsesArgs {
    /// Data directory of the Responses store (an SQLite database). Default:
    /// `$XDG_DATA_HOME/gyre/responses`, else `~/.local/share/gyre/responses`,
    /// else `.gyre/responses` under the working directory. Several gyre
    /// processes may share one.
    #[arg(long, env = "GYRE_RESPONSES_DIR")]
    responses_dir: Option<std::path::PathBuf>,
    /// Most stored responses (and, separately, conversations); the oldest
    /// finished ones are evicted first, running ones never.
    #[arg(long, env = "GYRE_RESPONSES_MAX_ENTRIES", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    responses_max_entries: u64,
    /// Oldest age of a stored response or conversation: a number of
    /// seconds, or with a unit `s`, `m`, `h` or `d` (e.g. `30d`).
    #[arg(long, env = "GYRE_RESPONSES_MAX_AGE", default_value = "30d", value_parser = parse_age)]
    responses_max_age: std::time::Duration,
}

impl ResponsesArgs {
    fn config(&self) -> gyre_service::responses::StoreConfig {
        let dir = self.responses_dir.clone().unwrap_or_else(|| {
            let data = std::env::var_os("XDG_DATA_HOME")
                .filter(|d| !d.is_empty())
                .map(std::path::PathBuf::from)
                .or_else(|| {
                    std::env::var_os("HOME")
                        .filter(|h| !h.is_empty())
                        .map(|h| std::path::PathBuf::from(h).join(".local/share"))
                });
            match data {
                Some(d) => d.join("gyre/responses"),
                None => std::path::PathBuf::from(".gyre/responses"),
            }
        });
        gyre_service::responses::StoreConfig {
            dir: Some(dir),
            max_entries: self.responses_max_entries,
            max_age: self.responses_max_age,
        }
    }
}

/// `30d`, `12h`, `90m`, `3600s` or `3600` (seconds), more than 0.
fn parse_age(s: &str) -> Result<std::time::Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => (&s[..i], c),
        _ => (s, 's'),
    };
    let scale = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86_400,
        _ => return Err(format!("unknown unit `{unit}`: use s, m, h or d")),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a whole number with an optional unit s, m, h or d"))?;
    if n == 0 {
        return Err("the age must be more than 0".into());
    }
    n.checked_mul(scale)
        .map(std::time::Duration::from_secs)
        .ok_or_else(|| format!("`{s}` is too long"))
}

/// Settings of the HTTP API that `gyre serve` adds.
#[derive(Args)]
struct HttpArgs {
    /// HTTP/2 connections from the HTTP API to the gRPC service (they count
    /// against the gRPC port's --max-connections).
    #[arg(long, env = "GYRE_UPSTREAM_CONNECTIONS", default_value_t = gyre_shim::pool::DEFAULT_CONNECTIONS,
          value_parser = clap::value_parser!(u16).range(1..))]
    upstream_connections: u16,
    /// Seconds a request body may take to arrive after its head (then 408
    /// and the connection is closed); 0: no limit.
    #[arg(long, env = "GYRE_BODY_TIMEOUT", default_value = "30", value_parser = gyre_shim::conn::parse_secs)]
    body_timeout: std::time::Duration,
    /// Let web pages of this origin (`scheme://host[:port]`, or `*` for
    /// any) call the HTTP API, and the gRPC port over gRPC-Web, from a
    /// browser (CORS); `--cors-origin` is the same flag. Repeatable or
    /// comma-separated; unset: CORS stays closed (but for the playground).
    #[arg(
        long,
        alias = "cors-origin",
        env = "GYRE_CORS_ALLOW_ORIGIN",
        value_delimiter = ','
    )]
    cors_allow_origin: Vec<String>,
    #[command(flatten)]
    idempotency: gyre_shim::idempotency::IdempotencyArgs,
    /// The playground page (`/playground`).
    #[command(flatten)]
    playground: gyre_shim::playground::PlaygroundArgs,
    /// SSE heartbeat and the HTTP API's gRPC client keepalive.
    #[command(flatten)]
    keepalive: gyre_shim::keepalive::KeepaliveArgs,
}

#[derive(Clone, Copy, ValueEnum)]
enum Device {
    /// CUDA when available, else CPU.
    Auto,
    Cpu,
    Cuda,
}

fn announce(line: String) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// SIGTERM or Ctrl-C.
async fn wait_for_signal() -> std::io::Result<()> {
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r,
            _ = term.recv() => Ok(()),
        }
    }
    #[cfg(not(unix))]
    tokio::signal::ctrl_c().await
}

async fn shutdown_signal(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

/// The default model, when neither --model nor --config names one.
const DEFAULT_MODEL: &str = ".gyre/models/smollm2-135m-instruct.gguf";

/// The models to serve, as specs: --model's, then the config file's.
fn model_specs(args: &ModelArgs) -> anyhow::Result<Vec<ModelSpec>> {
    let mut specs = args
        .model
        .iter()
        .map(|m| ModelSpec::parse(m))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(path) = &args.config {
        specs.extend(config_file::models(path)?);
    }
    if specs.is_empty() {
        specs.push(ModelSpec::source(DEFAULT_MODEL));
    }
    if args.served_model_name.is_some() || args.revision.is_some() {
        let [only] = specs.as_mut_slice() else {
            anyhow::bail!(
                "--served-model-name and --revision apply to a single model; with several, give each its own `name=` / `revision=`"
            );
        };
        if args.served_model_name.is_some() {
            only.name.clone_from(&args.served_model_name);
        }
        if args.revision.is_some() {
            only.revision.clone_from(&args.revision);
        }
    }
    if let Some(json) = &args.speculative_config {
        for (flag, given) in [
            ("--draft-model", args.draft_model.is_some()),
            (
                "--prompt-lookup-tokens",
                args.prompt_lookup_tokens.is_some(),
            ),
        ] {
            if given {
                anyhow::bail!(
                    "--speculative-config and {flag} both set speculation; give one (a draft \
                     model is {{\"model\": PATH}} in --speculative-config, prompt lookup \
                     {{\"method\": \"ngram\", \"num_speculative_tokens\": K}})"
                );
            }
        }
        let config = gyre_service::registry::speculative::SpeculativeConfig::parse(json)?;
        config.apply(&mut specs)?;
        tracing::info!(
            ?config,
            "speculative decoding by default (--speculative-config)"
        );
    }
    if let Some(draft) = &args.draft_model {
        let [only] = specs.as_mut_slice() else {
            anyhow::bail!(
                "--draft-model applies to a single model; with several, give each its own `draft=`"
            );
        };
        if only.draft.is_some() {
            anyhow::bail!("--draft-model and the model's `draft=` both name a draft");
        }
        only.draft = Some(draft.clone());
    }
    Ok(specs)
}

fn device_choice(d: &Device) -> DeviceChoice {
    match d {
        Device::Auto => DeviceChoice::Auto,
        Device::Cpu => DeviceChoice::Cpu,
        Device::Cuda => DeviceChoice::Cuda,
    }
}

/// How every model is loaded (also the admin service's).
fn load_defaults(args: &ModelArgs, log_format: LogFormat) -> anyhow::Result<LoadDefaults> {
    let device = device_choice(&args.device);
    let text = gyre_service::runtime::TextOptions {
        chat_template: args
            .chat_template
            .as_deref()
            .map(gyre_service::runtime::chat_template_arg)
            .transpose()?,
        trust_request_chat_template: args.trust_request_chat_template,
        tool_call_parser: args
            .tool_call_parser
            .as_deref()
            .and_then(gyre_service::tools::ToolFormat::from_name),
        reasoning_parser: args.reasoning_parser,
        prompt_lookup_tokens: args.prompt_lookup_tokens.unwrap_or(0),
        prompt_lookup_max: None,
        prompt_lookup_min: None,
        draft_tokens: None,
    };
    let e = &args.engine;
    Ok(LoadDefaults {
        device,
        kv_cache_mib: e.kv_cache_mib,
        num_kv_blocks: e.num_kv_blocks,
        block_size: e.block_size,
        max_running: e.max_running,
        max_batch_tokens: e.max_batch_tokens,
        max_queue: e.max_queue,
        embed_batch_tokens: e.embed_batch_tokens as usize,
        compute_threads: e.compute_threads,
        dequantize: e.dequantize,
        text,
        load_progress: Some(load_progress(log_format)),
        hub_cache: resolve::hub_cache_dir(),
        device_memory: args.device_memory_mib.map(|m| m << 20),
    })
}

/// How weight loading shows progress: a bar redrawn in place when text
/// logs go to a terminal (as `logging` colours them), log lines otherwise.
fn load_progress(format: LogFormat) -> Arc<dyn LoadProgress> {
    if format == LogFormat::Text && std::io::stderr().is_terminal() {
        Arc::new(TerminalBar::new())
    } else {
        Arc::new(LogLines)
    }
}

fn main() -> anyhow::Result<()> {
    bench_cmd::exec_if_first();
    #[cfg(unix)]
    passive_openmp();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run())
}

/// Process settings that libraries read once, as they load (before `main`),
/// so the binary re-executes itself with them unless the user set them:
/// - `OMP_WAIT_POLICY=PASSIVE`: libtorch's OpenMP (libgomp) otherwise spins
///   its idle compute threads after every parallel op; on a server they then
///   hold the cores that the gRPC and HTTP threads (and the shim, and clients
///   on the same host) need to ship each token, and under any other load
///   they fight for the CPU.
/// - `MALLOC_MMAP_THRESHOLD_` (256 MiB) and `MALLOC_TRIM_THRESHOLD_` (1 GiB):
///   glibc otherwise serves every activation buffer of a step over its
///   default threshold with a fresh `mmap`, and the kernel zeroes those
///   pages on first touch, step after step (a third of the engine's CPU time
///   was in the kernel, mostly `clear_page`). Kept on the heap, the buffers
///   are reused.
const PROCESS_ENV: [(&str, &str); 3] = [
    ("OMP_WAIT_POLICY", "PASSIVE"),
    ("MALLOC_MMAP_THRESHOLD_", "268435456"),
    ("MALLOC_TRIM_THRESHOLD_", "1073741824"),
];

#[cfg(unix)]
fn passive_openmp() {
    use std::os::unix::process::CommandExt;
    let missing: Vec<_> = PROCESS_ENV
        .iter()
        .filter(|(k, _)| std::env::var_os(k).is_none())
        .collect();
    if missing.is_empty() {
        return;
    }
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let mut args = std::env::args_os();
    let mut cmd = std::process::Command::new(exe);
    if let Some(arg0) = args.next() {
        cmd.arg0(arg0);
    }
    cmd.args(args);
    for (k, v) in missing {
        cmd.env(k, v);
    }
    let err = cmd.exec();
    eprintln!("warning: could not re-execute with the process settings: {err}");
}

async fn run() -> anyhow::Result<()> {
    let cli: Cli = config_file::parse(help_topics::apply(Cli::command()))?;
    let (model, grpc, http) = match cli.command {
        Command::Serve {
            model,
            grpc,
            http_addr,
            http,
        } => (model, grpc, Some((http_addr, http))),
        Command::Grpc { model, grpc } => (model, grpc, None),
        Command::Keys {
            command: KeysCommand::Hash { key },
        } => return hash_key(key),
        Command::Chat(args) => return client::finish(chat::run(*args, cli.log_format).await),
        Command::Models(args) => return client::finish(models_cmd::run(args).await),
        Command::Bench(args) => bench_cmd::exit_with(args.args),
    };
    gyre_shim::logging::init(cli.log_format);
    let telemetry = gyre_shim::telemetry::init(cli.otlp_endpoint.as_deref())?;
    gyre_service::observe::configure(gyre_service::observe::Config {
        trace: telemetry.is_some(),
        log_prompts: cli.log_prompts,
    });
    // The first signal starts draining, the second (or the drain's end)
    // stops the servers.
    let (drain_tx, drain_rx) = watch::channel(false);
    let (stop_tx, stop_rx) = watch::channel(false);
    let signal_stop = stop_tx.clone();
    tokio::spawn(async move {
        for round in 0..2 {
            if wait_for_signal().await.is_err() {
                return;
            }
            if round == 0 {
                tracing::info!("draining: no new requests; a second signal stops at once");
                let _ = drain_tx.send(true);
            } else {
                tracing::info!("stopping now");
                let _ = signal_stop.send(true);
            }
        }
    });

    // A bad keys file fails the start, before any model loads.
    let keys = match &grpc.keys_file {
        Some(path) => {
            let store = gyre_service::access::KeyStore::open(path.clone())?;
            store.spawn_reloader();
            Some(store)
        }
        None => None,
    };
    let limits = grpc.conn.limits();
    let metrics = grpc.metrics.install()?;
    // Read before the models load, so that a bad path fails the start at once.
    let tls = gyre_shim::tls::ServerTls::from_flags(
        grpc.tls.tls_cert.as_deref(),
        grpc.tls.tls_key.as_deref(),
        grpc.tls_client_ca.as_deref(),
    )?;
    let specs = model_specs(&model)?;
    let defaults = load_defaults(&model, cli.log_format)?;
    let registry = Arc::new(load::load_all(specs, &defaults).await?);
    if let Some(m) = &metrics {
        metrics_args::collect_engines(m, &registry);
    }
    {
        // Stop once draining and every running request has finished (or
        // the drain timeout passed).
        let (mut drain_rx, registry, timeout) =
            (drain_rx.clone(), registry.clone(), grpc.drain_timeout);
        tokio::spawn(async move {
            if drain_rx.wait_for(|d| *d).await.is_err() {
                return;
            }
            let idle = registry.wait_idle();
            let limit = std::time::Duration::from_secs_f64(timeout.max(0.0));
            if tokio::time::timeout(limit, idle).await.is_err() {
                tracing::warn!(
                    timeout,
                    "drain timeout: stopping with requests still running"
                );
            } else {
                tracing::info!("drained: no request running");
            }
            let _ = stop_tx.send(true);
        });
    }
    let grpc_listener = TcpListener::bind(&grpc.grpc_addr)
        .await
        .with_context(|| format!("cannot bind gRPC address {}", grpc.grpc_addr))?;
    let grpc_local = grpc_listener.local_addr()?;
    let store_cfg = grpc.responses.config();
    let store = gyre_service::responses::Store::open(store_cfg.clone()).with_context(|| {
        format!(
            "cannot open the responses store (--responses-dir {})",
            store_cfg
                .dir
                .as_deref()
                .unwrap_or(std::path::Path::new(""))
                .display()
        )
    })?;
    // `/metrics` on the HTTP port: open with --open-endpoints, else behind
    // a tenant key with a keys file (--api-key: the shim's own check).
    let metrics_access = match (&keys, grpc.open_endpoints) {
        (_, true) => gyre_shim::metrics::Access::Open,
        (Some(store), false) => {
            let store = store.clone();
            gyre_shim::metrics::Access::Keys(Arc::new(move |token: &str| store.knows(token)))
        }
        (None, false) => gyre_shim::metrics::Access::AsRoutes,
    };
    let server_opts = ServerOptions {
        api_key: grpc.api_key.clone(),
        keys,
        open_endpoints: grpc.open_endpoints,
        admin_api_key: grpc.admin_api_key.clone(),
        load_defaults: Some(defaults),
        store: Some(Arc::new(store)),
        deep_health: (!grpc.deep_health_interval_secs.is_zero()).then_some(
            gyre_service::deep_health::DeepHealth {
                interval: grpc.deep_health_interval_secs,
                timeout: grpc.deep_health_timeout_secs,
            },
        ),
    };
    let grpc_routes = grpc_service_for(registry, server_opts, drain_rx).await?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let grpc_tls = tls.as_ref().map(|t| t.acceptor(true)).transpose()?;
    // Web pages call this port over gRPC-Web: CORS here for the playground
    // page and the --cors-allow-origin origins (see gyre_shim::grpc_cors).
    let grpc_cors = match &http {
        Some((_, h)) => gyre_shim::grpc_cors::GrpcCors::new(
            tls.is_some(),
            !h.playground.no_playground,
            &h.cors_allow_origin,
        )?,
        None => None,
    };
    let key_required = grpc.api_key.is_some() || grpc.keys_file.is_some();
    let grpc_task = tokio::spawn(gyre_shim::conn::serve_tls(
        grpc_listener,
        gyre_shim::grpc_cors::grpc_service(grpc_routes, grpc_cors.as_ref()),
        limits,
        grpc_tls,
        shutdown_signal(stop_rx.clone()),
    ));
    announce(format!("gyre: gRPC listening on {scheme}://{grpc_local}"));
    let metrics_task = match (&metrics, &grpc.metrics.metrics_addr) {
        (Some(m), Some(addr)) => {
            let listener = TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot bind metrics address {addr}"))?;
            let local = listener.local_addr()?;
            announce(format!("gyre: metrics listening on http://{local}"));
            Some(tokio::spawn(gyre_shim::metrics::serve_separately(
                listener,
                m.clone(),
                limits,
                shutdown_signal(stop_rx.clone()),
            )))
        }
        _ => None,
    };

    let http_task = match http {
        Some((addr, http)) => {
            let listener = TcpListener::bind(&addr)
                .await
                .with_context(|| format!("cannot bind HTTP address {addr}"))?;
            let local = listener.local_addr()?;
            let mut cfg = gyre_shim::ShimConfig::new(format!("{scheme}://{grpc_local}"));
            cfg.upstream_tls = tls.as_ref().map(|t| t.loopback_client()).transpose()?;
            cfg.idempotency = http.idempotency.settings();
            cfg.api_key = grpc.api_key;
            cfg.metrics_access = metrics_access;
            cfg.cors_allow_origins = http.cors_allow_origin;
            cfg.upstream_connections = usize::from(http.upstream_connections);
            cfg.body_timeout = (!http.body_timeout.is_zero()).then_some(http.body_timeout);
            http.keepalive.apply(&mut cfg);
            if let Some(cors) = &grpc_cors {
                cors.set_http_port(local.port());
            }
            let playground = !http.playground.no_playground;
            if playground {
                cfg.playground = Some(gyre_shim::playground::Settings {
                    grpc_scheme: scheme,
                    grpc_port: grpc_local.port(),
                    key_required,
                });
            }
            let state = gyre_shim::connect(cfg).await?.with_metrics(metrics);
            announce(format!("gyre: HTTP listening on {scheme}://{local}"));
            if playground {
                announce(format!("gyre: playground at {scheme}://{local}/playground"));
            }
            let http_tls = tls.as_ref().map(|t| t.acceptor(false)).transpose()?;
            Some(tokio::spawn(gyre_shim::serve_tls(
                listener,
                state,
                limits,
                http_tls,
                shutdown_signal(stop_rx.clone()),
            )))
        }
        None => None,
    };
    grpc_task.await?;
    if let Some(t) = http_task {
        t.await??;
    }
    if let Some(t) = metrics_task {
        t.await?;
    }
    if let Some(t) = telemetry {
        tokio::task::spawn_blocking(move || t.shutdown()).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{Cli, Command, ModelSpec, Parser as _, model_specs, parse_age};
    use std::time::Duration;

    /// The model specs of `gyre serve ARGS`.
    fn specs_of(args: &[&str]) -> anyhow::Result<Vec<ModelSpec>> {
        let cli = Cli::try_parse_from(["gyre", "serve"].iter().chain(args))?;
        let Command::Serve { model, .. } = cli.command else {
            unreachable!("serve")
        };
        model_specs(&model)
    }

    #[test]
    fn the_speculative_config_sets_the_models_speculation() {
        let ngram = r#"{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}"#;
        let specs = specs_of(&["--model", "m.gguf", "--speculative-config", ngram]).expect("ok");
        let s = &specs[0];
        assert_eq!(
            (
                s.prompt_lookup,
                s.prompt_lookup_max,
                s.prompt_lookup_min,
                &s.draft
            ),
            (Some(4), Some(3), Some(3), &None)
        );
        let draft = r#"{"model": "d.gguf", "num_speculative_tokens": 3}"#;
        let specs = specs_of(&["--model", "m.gguf", "--speculative-config", draft]).expect("ok");
        assert_eq!(specs[0].draft.as_deref(), Some("d.gguf"));
        assert_eq!(specs[0].draft_tokens, Some(3));
        assert_eq!(specs[0].prompt_lookup, None);
        // The default model, without --model.
        let specs = specs_of(&["--speculative-config", draft]).expect("ok");
        assert_eq!(specs[0].source, super::DEFAULT_MODEL);
        assert_eq!(specs[0].draft.as_deref(), Some("d.gguf"));
    }

    #[test]
    fn the_speculative_config_beside_other_speculation_is_refused() {
        let draft = r#"{"model": "d.gguf", "num_speculative_tokens": 3}"#;
        let err = |args: &[&str]| specs_of(args).expect_err("refused").to_string();
        for (flag, value) in [("--draft-model", "d.gguf"), ("--prompt-lookup-tokens", "0")] {
            let e = err(&[
                "--model",
                "m.gguf",
                "--speculative-config",
                draft,
                flag,
                value,
            ]);
            assert!(
                e.contains(&format!(
                    "--speculative-config and {flag} both set speculation"
                )),
                "{e}"
            );
        }
        let e = err(&[
            "--model",
            "a",
            "--model",
            "b",
            "--speculative-config",
            draft,
        ]);
        assert!(
            e.contains("applies to a single model, and 2 are served"),
            "{e}"
        );
        let e = err(&[
            "--model",
            "m.gguf,draft=x.gguf",
            "--speculative-config",
            draft,
        ]);
        assert!(
            e.contains("the model's `draft` sets speculation too"),
            "{e}"
        );
        let e = err(&[
            "--model",
            "m.gguf",
            "--speculative-config",
            r#"{"method": "eagle", "model": "e"}"#,
        ]);
        assert!(
            e.starts_with("--speculative-config: method `eagle` is not supported"),
            "{e}"
        );
    }

    #[test]
    fn ages_take_a_unit_or_seconds() {
        assert_eq!(parse_age("30d"), Ok(Duration::from_secs(30 * 86_400)));
        assert_eq!(parse_age("12h"), Ok(Duration::from_secs(12 * 3600)));
        assert_eq!(parse_age("90m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_age("7s"), Ok(Duration::from_secs(7)));
        assert_eq!(parse_age("3600"), Ok(Duration::from_secs(3600)));
        for bad in ["", "0", "0d", "5w", "d", "-1h", "1.5h"] {
            assert!(parse_age(bad).is_err(), "{bad:?}");
        }
    }
}
