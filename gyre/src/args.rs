//! The flags of `gyre serve` and `gyre grpc`, grouped as clap `Args`: the
//! models and how they load, the engine, the gRPC service, the Responses
//! store and the HTTP API. `main` turns them into the service's and the
//! shim's settings.

use clap::{Args, ValueEnum};

#[derive(Args)]
pub(crate) struct ModelArgs {
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
    pub(crate) model: Vec<String>,
    /// A TOML file listing models to serve (after those of --model): a
    /// `[[models]]` table each, with `source` and the keys --model takes
    /// (`aliases` a list). Its top-level keys set flags by their long name
    /// (`kv-cache-mib = 512`); a flag or its environment variable wins.
    #[arg(long, env = "GYRE_CONFIG")]
    pub(crate) config: Option<std::path::PathBuf>,
    /// For a hub id: the branch, tag or commit to serve (default: main).
    /// Only with a single model (else use `revision=` in its spec).
    #[arg(long, env = "GYRE_REVISION")]
    pub(crate) revision: Option<String>,
    /// Model id clients use (default: the hub id; for a path, the
    /// directory's name, or the GGUF file's without `.gguf`). Only with a
    /// single model (else use `name=` in its spec).
    #[arg(long, env = "GYRE_SERVED_MODEL_NAME")]
    pub(crate) served_model_name: Option<String>,
    /// Device memory, in MiB, that the models' budgets (weights and KV
    /// cache) are checked against at start instead of the measured free
    /// memory (the host's available RAM on the CPU; on CUDA nothing is
    /// checked without this).
    #[arg(long, env = "GYRE_DEVICE_MEMORY_MIB")]
    pub(crate) device_memory_mib: Option<u64>,
    /// Where to run the model.
    #[arg(long, env = "GYRE_DEVICE", value_enum, default_value = "auto")]
    pub(crate) device: Device,
    /// A chat template to use instead of the model's: a Jinja file, or the
    /// template text itself.
    #[arg(long, env = "GYRE_CHAT_TEMPLATE")]
    pub(crate) chat_template: Option<String>,
    /// Accept requests that bring their own chat template (`chat_template`).
    /// Off by default: a template is code the server runs.
    #[arg(long, env = "GYRE_TRUST_REQUEST_CHAT_TEMPLATE")]
    pub(crate) trust_request_chat_template: bool,
    /// How tool calls are parsed out of the output: hermes (<tool_call>,
    /// Qwen), llama3_json, mistral, deepseek, json. Default: what the chat
    /// template uses. Mistral's and DeepSeek's markers are special tokens,
    /// kept in the text for the parser.
    #[arg(long, env = "GYRE_TOOL_CALL_PARSER", value_parser = ["hermes", "llama3_json", "mistral", "deepseek", "json"])]
    pub(crate) tool_call_parser: Option<String>,
    /// How reasoning sections are split from the answer: `auto` (from the
    /// chat template: `think` when it mentions `</think>`, `mistral` for
    /// `[/THINK]`), `none`, `think` (`<think>...</think>`; aliases qwen3,
    /// qwq, smollm3, granite, deepseek_v3), `deepseek_r1` (the same markers,
    /// output always starts inside the section) or `mistral` (`[THINK]`).
    #[arg(long, env = "GYRE_REASONING_PARSER", default_value = "auto")]
    pub(crate) reasoning_parser: gyre_service::reasoning::ParserChoice,
    /// Prompt-lookup decoding by default for every generative model: up to
    /// this many tokens proposed per step from n-gram matches in the
    /// prompt and output (0, the default: off; a request's
    /// `num_assistant_tokens` and `max_ngram_size` override it, up to 64).
    #[arg(long, env = "GYRE_PROMPT_LOOKUP_TOKENS",
          value_parser = clap::value_parser!(u32).range(0..=64))]
    pub(crate) prompt_lookup_tokens: Option<u32>,
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
    pub(crate) draft_model: Option<String>,
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
    pub(crate) speculative_config: Option<String>,
    #[command(flatten)]
    pub(crate) engine: EngineArgs,
}

/// Scheduler and KV-cache settings.
#[derive(Args)]
pub(crate) struct EngineArgs {
    /// Memory for the paged KV cache of each model, in MiB (capped at what
    /// --max-running sequences of full context need; a model's
    /// `kv_cache_mib` overrides it).
    #[arg(long, env = "GYRE_KV_CACHE_MIB", default_value_t = 1024)]
    pub(crate) kv_cache_mib: u64,
    /// Exact number of KV blocks (overrides --kv-cache-mib).
    #[arg(long, env = "GYRE_NUM_KV_BLOCKS")]
    pub(crate) num_kv_blocks: Option<usize>,
    /// Tokens per KV block.
    #[arg(long, env = "GYRE_BLOCK_SIZE", default_value_t = 16)]
    pub(crate) block_size: usize,
    /// Most sequences running at once.
    #[arg(long, env = "GYRE_MAX_RUNNING", default_value_t = 64)]
    pub(crate) max_running: usize,
    /// Most tokens per scheduler step (decodes + prefill chunks).
    #[arg(long, env = "GYRE_MAX_BATCH_TOKENS", default_value_t = 512)]
    pub(crate) max_batch_tokens: usize,
    /// libtorch compute threads on CPU (default: one per core). On small
    /// machines, leaving a core to the server stack can help under load.
    #[arg(long, env = "GYRE_COMPUTE_THREADS")]
    pub(crate) compute_threads: Option<usize>,
    /// Threads of the async runtime that serves gRPC and HTTP and streams
    /// the tokens out. Default on the CPU: the cores the compute threads
    /// leave, at least one (where every core computes, one thread wakes
    /// fewer threads a token than one a core, and so takes less of the
    /// cores from the compute threads); with CUDA, one per core.
    /// `TOKIO_WORKER_THREADS` also sets it.
    #[arg(long, env = "GYRE_SERVER_THREADS", value_parser = clap::value_parser!(u16).range(1..))]
    pub(crate) server_threads: Option<u16>,
    /// Dequantize a GGUF's weights to f32 at load. By default its Q8_0,
    /// Q4_0 and Q4_1 matrices stay in their blocks on a CPU with AVX-512
    /// VNNI and are multiplied by quantized kernels (4.5-8.5 bits per weight
    /// read per token instead of 32); this restores the f32 path (the
    /// reference the quantized one is tested against).
    #[arg(long, env = "GYRE_DEQUANTIZE")]
    pub(crate) dequantize: bool,
    /// How the quantized kernels take their activations. `int8-residual`
    /// (default): each 32-value block rounded to int8 plus its rounding
    /// residual, two integer dot products per block, about 15 bits per
    /// activation (perplexity within 0.5% of the f32 weights' in the
    /// bench's L1). `int8`: one int8 rounding per block, as llama.cpp does
    /// (half the integer work; llama.cpp's perplexity moves by up to 1.8%
    /// on the same files). `f32`: activations kept f32, quants widened in
    /// registers.
    #[arg(
        long,
        env = "GYRE_QUANT_ACTIVATIONS",
        value_enum,
        default_value_t = QuantActivations::Int8Residual
    )]
    pub(crate) quant_activations: QuantActivations,
    /// The KV cache's element type. `auto` (default): the model's own
    /// (float32 on the CPU, bfloat16 on CUDA). `f16` (CPU, float32 models):
    /// keys and values rounded to float16 when stored and widened back to
    /// float32 when read, as llama.cpp's default cache; half the memory, so
    /// twice the tokens in --kv-cache-mib, and faster decodes at long
    /// contexts. `f32`: float32 (the CPU's `auto`).
    #[arg(
        long,
        env = "GYRE_KV_CACHE_DTYPE",
        value_enum,
        default_value_t = KvDtype::Auto
    )]
    pub(crate) kv_cache_dtype: KvDtype,
    /// Requests that may wait while the engine is full. A new request gets
    /// RESOURCE_EXHAUSTED (HTTP 429) only when the requests not yet started
    /// already number this plus the free running slots (--max-running minus
    /// the sequences running): at most --max-running + --max-queue requests
    /// run or wait at once, and a burst the engine can start at its next
    /// step is never refused.
    #[arg(long, env = "GYRE_MAX_QUEUE", default_value_t = 1024,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) max_queue: u32,
    /// Embedding models: most padded tokens (inputs times the longest one)
    /// per forward pass of the embedding worker.
    #[arg(long, env = "GYRE_EMBED_BATCH_TOKENS", default_value_t = 8192,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) embed_batch_tokens: u32,
}

#[derive(Args)]
pub(crate) struct GrpcArgs {
    /// Address of the gRPC API.
    #[arg(long, env = "GYRE_GRPC_ADDR", default_value = "127.0.0.1:50051")]
    pub(crate) grpc_addr: String,
    /// When set, clients must send `Authorization: Bearer <key>` (HTTP) or
    /// the `authorization` metadata (gRPC; health and reflection excepted),
    /// the scheme in any case; the key is compared in constant time.
    #[arg(long, env = "GYRE_API_KEY", hide_env_values = true)]
    pub(crate) api_key: Option<String>,
    /// A TOML file (YAML when its name ends in .yaml or .yml) mapping API
    /// keys (as SHA-256 hashes: `gyre keys hash`) to tenants with allowed
    /// models and quotas (see the README's
    /// "Operations: tenants and keys"). Reloaded when it changes and on
    /// SIGHUP; a file that does not parse keeps the previous keys. Instead
    /// of --api-key.
    #[arg(long, env = "GYRE_KEYS_FILE", conflicts_with = "api_key")]
    pub(crate) keys_file: Option<std::path::PathBuf>,
    /// Leave the probes open to callers without a key: with --keys-file,
    /// gRPC health and server reflection (otherwise they need one); with
    /// --keys-file or --api-key, /metrics on the HTTP port (otherwise it
    /// needs a valid key; --metrics-addr is always open). HTTP /health
    /// and /version are always open.
    #[arg(long, env = "GYRE_OPEN_ENDPOINTS")]
    pub(crate) open_endpoints: bool,
    /// Turns the admin service (gyre.v1.Admin: load and unload models) on,
    /// guarded by this key (`authorization: Bearer <key>`). It grants
    /// nothing else, and --api-key does not grant it. Unset: the admin
    /// service answers UNIMPLEMENTED.
    #[arg(long, env = "GYRE_ADMIN_API_KEY", hide_env_values = true)]
    pub(crate) admin_api_key: Option<String>,
    /// On SIGTERM or Ctrl-C: seconds to let running requests finish while
    /// health reports NOT_SERVING (HTTP /health 503) and new requests get
    /// UNAVAILABLE (HTTP 503). A second signal stops at once.
    #[arg(long, env = "GYRE_DRAIN_TIMEOUT", default_value_t = 30.0)]
    pub(crate) drain_timeout: f64,
    /// Seconds between deep health probes: a one-token prefill and decode
    /// through each generative model's engine; a model whose probe fails or
    /// stalls reports NOT_SERVING in gRPC health until one passes. 0: off.
    #[arg(long, env = "GYRE_DEEP_HEALTH_INTERVAL_SECS", default_value = "0", value_parser = gyre_shim::conn::parse_secs)]
    pub(crate) deep_health_interval_secs: std::time::Duration,
    /// Seconds a deep health probe may take (queue wait included) before it
    /// counts as failed.
    #[arg(long, env = "GYRE_DEEP_HEALTH_TIMEOUT_SECS", default_value = "30", value_parser = gyre_shim::conn::parse_secs)]
    pub(crate) deep_health_timeout_secs: std::time::Duration,
    /// Connection limits, applied to each port.
    #[command(flatten)]
    pub(crate) conn: gyre_shim::conn::ConnArgs,
    /// The Responses API's store.
    #[command(flatten)]
    pub(crate) responses: ResponsesArgs,
    /// TLS on both ports.
    #[command(flatten)]
    pub(crate) tls: gyre_shim::tls::TlsArgs,
    /// PEM CA certificate(s): gRPC clients must present a certificate
    /// chaining to one of them (mTLS). Needs --tls-cert and --tls-key. The
    /// HTTP port does not ask for client certificates.
    #[arg(long, env = "GYRE_TLS_CLIENT_CA", requires = "tls_cert")]
    pub(crate) tls_client_ca: Option<std::path::PathBuf>,
    /// Prometheus metrics.
    #[command(flatten)]
    pub(crate) metrics: crate::metrics_args::MetricsArgs,
}

/// Where the Responses API keeps responses and conversations, and how many.
#[derive(Args)]
pub(crate) struct ResponsesArgs {
    /// Data directory of the Responses store (an SQLite database). Default:
    /// `$XDG_DATA_HOME/gyre/responses`, else `~/.local/share/gyre/responses`,
    /// else `.gyre/responses` under the working directory. Several gyre
    /// processes may share one.
    #[arg(long, env = "GYRE_RESPONSES_DIR")]
    pub(crate) responses_dir: Option<std::path::PathBuf>,
    /// Most stored responses (and, separately, conversations); the oldest
    /// finished ones are evicted first, running ones never.
    #[arg(long, env = "GYRE_RESPONSES_MAX_ENTRIES", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) responses_max_entries: u64,
    /// Oldest age of a stored response or conversation: a number of
    /// seconds, or with a unit `s`, `m`, `h` or `d` (e.g. `30d`).
    #[arg(long, env = "GYRE_RESPONSES_MAX_AGE", default_value = "30d", value_parser = parse_age)]
    pub(crate) responses_max_age: std::time::Duration,
}

impl ResponsesArgs {
    pub(crate) fn config(&self) -> gyre_service::responses::StoreConfig {
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
pub(crate) fn parse_age(s: &str) -> Result<std::time::Duration, String> {
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
pub(crate) struct HttpArgs {
    /// HTTP/2 connections from the HTTP API to the gRPC service (they count
    /// against the gRPC port's --max-connections).
    #[arg(long, env = "GYRE_UPSTREAM_CONNECTIONS", default_value_t = gyre_shim::pool::DEFAULT_CONNECTIONS,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub(crate) upstream_connections: u16,
    /// Seconds a request body may take to arrive after its head (then 408
    /// and the connection is closed); 0: no limit.
    #[arg(long, env = "GYRE_BODY_TIMEOUT", default_value = "30", value_parser = gyre_shim::conn::parse_secs)]
    pub(crate) body_timeout: std::time::Duration,
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
    pub(crate) cors_allow_origin: Vec<String>,
    #[command(flatten)]
    pub(crate) idempotency: gyre_shim::idempotency::IdempotencyArgs,
    /// The playground page (`/playground`).
    #[command(flatten)]
    pub(crate) playground: gyre_shim::playground::PlaygroundArgs,
    /// SSE heartbeat and the HTTP API's gRPC client keepalive.
    #[command(flatten)]
    pub(crate) keepalive: gyre_shim::keepalive::KeepaliveArgs,
}

/// `--quant-activations` (the engine's `Activations`).
#[derive(Clone, Copy, ValueEnum, Debug, PartialEq, Eq)]
pub(crate) enum QuantActivations {
    Int8Residual,
    Int8,
    F32,
}

impl From<QuantActivations> for gyre_engine::Activations {
    fn from(a: QuantActivations) -> Self {
        match a {
            QuantActivations::Int8Residual => Self::Int8Residual,
            QuantActivations::Int8 => Self::Int8,
            QuantActivations::F32 => Self::F32,
        }
    }
}

/// `--kv-cache-dtype` (the engine's `KvCacheDtype`).
#[derive(Clone, Copy, ValueEnum, Debug, PartialEq, Eq)]
pub(crate) enum KvDtype {
    Auto,
    F32,
    F16,
}

impl From<KvDtype> for gyre_engine::KvCacheDtype {
    fn from(d: KvDtype) -> Self {
        match d {
            KvDtype::Auto => Self::Auto,
            KvDtype::F32 => Self::Float32,
            KvDtype::F16 => Self::Float16,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum Device {
    /// CUDA when available, else CPU.
    Auto,
    Cpu,
    Cuda,
}
