//! `gyre-bench run`: builds (or finds) the model, starts `gyre serve` on it,
//! runs the scenarios, prints the table and writes the JSON report.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use gyre_api::v1::ListModelsRequest;
use serde_json::{Value, json};

use crate::cli::RunArgs;
use crate::http::HttpTarget;
use crate::load::Clients;
use crate::reference::Python;
use crate::report;
use crate::scenarios::embeddings::EmbedCtx;
use crate::scenarios::llamacpp::LlamaCtx;
use crate::scenarios::lookup::LookupCtx;
use crate::scenarios::{self, Ctx, Sizes};
use crate::server::{Server, ServerOptions};

pub async fn main(args: RunArgs) -> anyhow::Result<()> {
    let command = report::command_line();
    println!("$ {command}");
    let started = std::time::Instant::now();
    let python = Python::locate(args.python.clone(), args.scripts_dir.clone());
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, std::num::NonZero::get));
    let scratch = std::env::temp_dir().join(format!("gyre-bench-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let load_before = loadavg();
    if load_before.first().is_some_and(|l| *l > 0.5) {
        eprintln!(
            "gyre-bench: warning: the machine is already busy (load average {load_before:?}); \
             figures will be noisy"
        );
    }
    let generative = if scenarios::needs_generative(&args.only) {
        Some(generative(&args, &python, threads, &scratch).await?)
    } else {
        None
    };
    let bin = gyre_bin(args.gyre_bin.clone());
    let embed_ctx = EmbedCtx {
        bin: &bin,
        model: std::path::absolute(&args.embed_model)?,
        python: &python,
        threads,
        device: &args.device,
        scratch: &scratch,
        sentences: args.embed_sentences,
        repeats: if args.quick { 2 } else { 5 },
        seed: args.seed,
        no_reference: args.no_reference,
        server_args: &args.embed_server_args,
    };
    let embed_results = tokio::select! {
        results = scenarios::run_embeddings(&embed_ctx, &args.only) => results,
        () = interrupted() => anyhow::bail!("interrupted"),
    };
    let lookup_ctx = LookupCtx {
        bin: &bin,
        model: std::path::absolute(&args.lookup_model)?,
        threads,
        device: &args.device,
        scratch: &scratch,
        rounds: if args.quick { 1 } else { 3 },
        num_tokens: args.lookup_tokens,
        server_args: &args.lookup_server_args,
        draft: std::path::absolute(&args.draft_model)?,
        draft_tokens: args.draft_tokens,
        draft_temperature: args.draft_temperature,
    };
    let lookup_results = tokio::select! {
        results = scenarios::run_lookup(&lookup_ctx, &args.only) => results,
        () = interrupted() => anyhow::bail!("interrupted"),
    };
    let llama_ctx = LlamaCtx {
        gyre_bin: &bin,
        llama_server: args
            .llama_server
            .clone()
            .unwrap_or_else(default_llama_server),
        models: args
            .l1_models
            .iter()
            .map(std::path::absolute)
            .collect::<Result<_, _>>()?,
        python: &python,
        threads,
        device: &args.device,
        scratch: &scratch,
        streams: args.l1_streams.clone(),
        prompt_len: args.l1_prompt_tokens,
        new_tokens: args.l1_new_tokens,
        rounds: args.l1_rounds.unwrap_or(if args.quick { 1 } else { 3 }),
        solo_rounds: args
            .l1_solo_rounds
            .unwrap_or(if args.quick { 1 } else { 9 }),
        seed: args.seed,
        server_args: &args.server_args,
        llama_server_args: &args.llama_server_args,
        ppl: crate::scenarios::llamacpp::PplSpec {
            text: std::path::absolute(&args.l1_ppl_text)?,
            ctx: args.l1_ppl_ctx,
            chunks: args.l1_ppl_chunks,
        },
    };
    let llama_results = tokio::select! {
        results = scenarios::run_llamacpp(&llama_ctx, &args.only) => results,
        () = interrupted() => anyhow::bail!("interrupted"),
    };
    let load_after = loadavg();
    let mut results = generative
        .as_ref()
        .map(|g| g.results.clone())
        .unwrap_or_default();
    results.extend(embed_results);
    results.extend(lookup_results);
    results.extend(llama_results);

    println!("\n$ {command}");
    if let Some(g) = &generative {
        println!(
            "model {} ({} parameters, {}), {threads} threads, device {}",
            g.model_dir.display(),
            param_count(&g.model_dir).map_or("?".into(), |n| format!("{:.1} M", n as f64 / 1e6)),
            g.model.architecture,
            args.device,
        );
    }
    if scenarios::selected(&args.only, "E1") {
        println!(
            "embedding model {}, {threads} threads, device {}",
            embed_ctx.model.display(),
            args.device
        );
    }
    if scenarios::selected(&args.only, "L1") {
        println!(
            "L1: llama-server {}, {threads} threads, GGUF files {:?}",
            llama_ctx.llama_server.display(),
            llama_ctx.models
        );
    }
    println!("load average {load_before:?} -> {load_after:?}\n");
    print!("{}", report::table(&results));
    let sizes = generative.as_ref().map(|g| g.sizes.clone());
    let report = json!({
        "command": command,
        "unix_time": std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        "total_seconds": started.elapsed().as_secs_f64(),
        "model": generative.as_ref().map(|g| json!({
            "dir": g.model_dir,
            "id": g.model.id,
            "architecture": g.model.architecture,
            "parameters": param_count(&g.model_dir),
            "vocab_size": g.model.vocab_size,
            "max_model_len": g.model.max_model_len,
        })),
        "embedding_model": scenarios::selected(&args.only, "E1").then_some(&embed_ctx.model),
        "lookup_model": scenarios::selected(&args.only, "P1").then_some(&lookup_ctx.model),
        "draft_model": scenarios::selected(&args.only, "D1").then_some(&lookup_ctx.draft),
        "llama_server": scenarios::selected(&args.only, "L1").then_some(&llama_ctx.llama_server),
        "threads": threads,
        "device": args.device,
        "cpus": std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "quick": args.quick,
        "seed": args.seed,
        "sizes": sizes,
        "python": python,
        "grpc_url": generative.as_ref().map(|g| g.grpc_url.clone()),
        "http_addr": generative.as_ref().map(|g| g.http_addr.to_string()),
        "server_alive_at_end": generative.as_ref().and_then(|g| g.server_alive),
        "rows": results.iter().flat_map(|r| r.rows.clone()).collect::<Vec<_>>(),
        "scenarios": results,
    });
    report::write_json(&args.json_out, &report)?;
    println!("\nJSON: {}", args.json_out.display());
    if generative.as_ref().and_then(|g| g.server_alive) == Some(false) {
        anyhow::bail!(
            "the gyre server died during the run (log in {})",
            scratch.display()
        );
    }
    Ok(())
}

/// The outcome of the generative scenarios (S1-S5).
struct Generative {
    results: Vec<report::ScenarioResult>,
    model_dir: PathBuf,
    model: gyre_api::v1::Model,
    sizes: Sizes,
    grpc_url: String,
    http_addr: std::net::SocketAddr,
    server_alive: Option<bool>,
}

/// Builds (or finds) the generative model, serves it (unless a server is
/// given) and runs the S scenarios against it and transformers.
async fn generative(
    args: &RunArgs,
    python: &Python,
    threads: usize,
    scratch: &Path,
) -> anyhow::Result<Generative> {
    let model_dir = model_dir(args, python).await?;
    let (server, grpc_url, http_addr) = match (&args.grpc_url, args.http_addr) {
        (Some(url), Some(addr)) => (None, url.clone(), addr),
        _ => {
            let bin = gyre_bin(args.gyre_bin.clone());
            let server = Server::start(ServerOptions {
                bin: &bin,
                model: &model_dir,
                device: &args.device,
                threads,
                log: scratch.join("gyre.log"),
                extra_args: &args.server_args,
            })
            .await?;
            eprintln!(
                "gyre-bench: {} serving {} (gRPC {}, HTTP {}; log {})",
                bin.display(),
                model_dir.display(),
                server.grpc_url,
                server.http_addr,
                server.log.display()
            );
            let (url, addr) = (server.grpc_url.clone(), server.http_addr);
            (Some(server), url, addr)
        }
    };
    let mut clients = Clients::connect(&grpc_url, 1, None).await?;
    let models = clients.grpc[0]
        .list_models(ListModelsRequest::default())
        .await
        .context("ListModels")?
        .into_inner()
        .models;
    let model = models.first().context("the server lists no model")?.clone();
    clients.http = Some(HttpTarget {
        addr: http_addr,
        model: model.id.clone(),
        api_key: None,
    });

    let mut sizes = if args.quick {
        Sizes::quick()
    } else {
        Sizes::full()
    };
    override_sizes(&mut sizes, args);
    let ctx = Ctx {
        clients,
        python: python.clone(),
        model_dir: model_dir.clone(),
        vocab_size: model.vocab_size,
        threads,
        device: args.device.clone(),
        scratch: scratch.to_path_buf(),
        sizes: sizes.clone(),
        seed: args.seed,
        no_reference: args.no_reference,
        gyre_bin: gyre_bin(args.gyre_bin.clone()),
        server_args: args.server_args.clone(),
        ops_on_args: args.ops_on_args.clone(),
        ops_on: args.o1_on.clone(),
    };
    let results = tokio::select! {
        results = scenarios::run(&ctx, &args.only) => results,
        () = interrupted() => {
            if let Some(server) = server {
                server.stop().await;
            }
            anyhow::bail!("interrupted");
        }
    };
    let server_alive = match server {
        Some(mut s) => {
            let alive = s.alive();
            s.stop().await;
            Some(alive)
        }
        None => None,
    };
    Ok(Generative {
        results,
        model_dir,
        model,
        sizes,
        grpc_url,
        http_addr,
        server_alive,
    })
}

/// The model directory: `--model`, or the default bench model, built (or
/// checked up to date) with make_bench_model.py.
async fn model_dir(args: &RunArgs, python: &Python) -> anyhow::Result<PathBuf> {
    if let Some(dir) = &args.model {
        anyhow::ensure!(
            dir.join("config.json").is_file(),
            "{} has no config.json (build one with clients/bench/make_bench_model.py --out DIR)",
            dir.display()
        );
        return Ok(std::path::absolute(dir)?);
    }
    let (name, preset) = if args.quick {
        ("llama-quick", "quick")
    } else {
        ("llama-64m", "bench")
    };
    let dir = std::path::absolute(Path::new(".gyre/bench").join(name))?;
    let said = python.make_model(&dir, preset).await?;
    eprintln!("gyre-bench: {said}");
    Ok(dir)
}

/// Resolves on Ctrl-C or SIGTERM, so the server is stopped before exiting.
async fn interrupted() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

/// The 1, 5 and 15 minute load averages (empty where /proc is missing).
fn loadavg() -> Vec<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .filter_map(|v| v.parse().ok())
        .collect()
}

/// L1's default `llama-server`: where `make llamacpp` builds it.
fn default_llama_server() -> PathBuf {
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    home.join(".cache/gyre/llama.cpp/0.3.36/bin/llama-server")
}

/// `--gyre-bin`, else `gyre` beside this executable, else `gyre` on PATH.
fn gyre_bin(given: Option<PathBuf>) -> PathBuf {
    given.unwrap_or_else(|| {
        std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().map(|d| d.join("gyre")))
            .filter(|p| p.is_file())
            .unwrap_or_else(|| PathBuf::from("gyre"))
    })
}

fn override_sizes(sizes: &mut Sizes, args: &RunArgs) {
    if let Some(v) = args.prompt_len {
        sizes.prompt_len = v;
    }
    if let Some(v) = args.output_len {
        sizes.output_len = v;
    }
    if let Some(v) = args.streams {
        sizes.s2_streams = v;
    }
    if let Some(v) = args.prefix_len {
        sizes.s3_prefix = v;
    }
    if let Some(v) = args.storm {
        sizes.s5_grpc = v;
    }
    if let Some(v) = args.hf_repeats {
        sizes.hf_repeats = v;
    }
    if let Some(v) = args.o1_pairs {
        sizes.o1_pairs = v;
    }
    if let Some(v) = args.o1_blocks {
        sizes.o1_blocks = v;
    }
    if !args.g1_streams.is_empty() {
        sizes.g1_streams.clone_from(&args.g1_streams);
    }
    if let Some(v) = args.g1_prompt_tokens {
        sizes.g1_prompt = v;
    }
    if let Some(v) = args.g1_new_tokens {
        sizes.g1_new = v;
    }
    if let Some(v) = args.g2_streams {
        sizes.g2_streams = v;
    }
    if let Some(v) = args.g2_prompt_tokens {
        sizes.g2_prompt = v;
    }
    if let Some(v) = args.g2_new_tokens {
        sizes.g2_new = v;
    }
    if let Some(v) = args.g2_requests {
        sizes.g2_requests = v;
    }
}

/// The shape of a Llama-family model, read from its `config.json`.
struct Shape {
    config: Value,
    hidden: u64,
    inter: u64,
    layers: u64,
    vocab: u64,
    /// Query and key/value widths (heads x head dim).
    q: u64,
    kv: u64,
}

impl Shape {
    fn read(dir: &Path) -> Option<Self> {
        let text = std::fs::read_to_string(dir.join("config.json")).ok()?;
        let config: Value = serde_json::from_str(&text).ok()?;
        let get = |k: &str| config.get(k).and_then(Value::as_u64);
        let hidden = get("hidden_size")?;
        let heads = get("num_attention_heads")?;
        let hd = get("head_dim").unwrap_or(hidden / heads.max(1));
        Some(Self {
            hidden,
            inter: get("intermediate_size")?,
            layers: get("num_hidden_layers")?,
            vocab: get("vocab_size")?,
            q: heads * hd,
            kv: get("num_key_value_heads").unwrap_or(heads) * hd,
            config,
        })
    }

    /// Parameters of every layer's projections (q, k, v, o; gate, up,
    /// down), the LM head and embedding not included.
    fn layer_matrix_params(&self) -> u64 {
        let h = self.hidden;
        self.layers * (2 * h * self.q + 2 * h * self.kv + 3 * h * self.inter)
    }

    fn flag(&self, key: &str) -> bool {
        self.config.get(key).and_then(Value::as_bool) == Some(true)
    }
}

/// Parameters of a Llama-family model from its config.json (untied or tied
/// embeddings, GQA), without loading weights.
pub fn param_count(dir: &Path) -> Option<u64> {
    let s = Shape::read(dir)?;
    let (h, q, kv) = (s.hidden, s.q, s.kv);
    let bias = if s.flag("attention_bias") {
        q + 2 * kv
    } else {
        0
    };
    let layer = 2 * h * q + 2 * h * kv + bias + 3 * h * s.inter + 2 * h;
    let tied = s.flag("tie_word_embeddings");
    Some(if tied { 1 } else { 2 } * s.vocab * h + s.layers * layer + h)
}

/// The parameters of the matrices one token's forward pass multiplies, from
/// a Llama-style `config.json`: every layer's projections and the LM head
/// (the embedding lookup multiplies nothing; norms and biases are not
/// matrices). For the FLOP/s of S2 (2 per parameter per token).
pub fn matmul_params(dir: &Path) -> Option<u64> {
    let s = Shape::read(dir)?;
    Some(s.layer_matrix_params() + s.vocab * s.hidden)
}

/// The arithmetic of one token through a Llama-style model, from its
/// `config.json`, in FLOPs (2 per multiply-add).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenFlops {
    /// The layers' projections (every token through the model).
    pub layers: f64,
    /// The LM head (only tokens whose logits are needed: each prompt's
    /// last, and every decode step's).
    pub head: f64,
    /// Attention, per key a query sees: q . k and p . v over every layer's
    /// query heads.
    pub per_key: f64,
}

/// [`TokenFlops`] of the model in `dir`.
pub fn token_flops(dir: &Path) -> Option<TokenFlops> {
    let s = Shape::read(dir)?;
    Some(TokenFlops {
        layers: 2.0 * s.layer_matrix_params() as f64,
        head: 2.0 * (s.vocab * s.hidden) as f64,
        per_key: 4.0 * (s.layers * s.q) as f64,
    })
}

/// Floats of KV cache one token keeps over all layers (keys and values),
/// from a Llama-style `config.json`.
pub fn kv_floats_per_token(dir: &Path) -> Option<u64> {
    let s = Shape::read(dir)?;
    Some(s.layers * 2 * s.kv)
}

#[cfg(test)]
mod tests {
    /// The bench model's shape: 8 layers of 512 wide (8 heads of 64, 4
    /// KV heads, 2048 inner), 32064 tokens, untied: the projections and the
    /// LM head, not the embedding.
    #[test]
    fn matmul_params_count_the_projections_and_the_head() {
        let dir = std::env::temp_dir().join(format!("gyre-bench-params-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(
            dir.join("config.json"),
            r#"{"hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 8,
                "vocab_size": 32064, "num_attention_heads": 8, "num_key_value_heads": 4,
                "head_dim": 64, "tie_word_embeddings": false}"#,
        )
        .expect("config");
        let layer = 2 * 512 * 512 + 2 * 512 * 256 + 3 * 512 * 2048;
        assert_eq!(super::matmul_params(&dir), Some(8 * layer + 32064 * 512));
        assert_eq!(
            super::param_count(&dir),
            Some(2 * 32064 * 512 + 8 * (layer + 2 * 512) + 512)
        );
        assert_eq!(super::kv_floats_per_token(&dir), Some(8 * 2 * 4 * 64));
        let f = super::token_flops(&dir).expect("flops");
        assert_eq!(f.layers, 2.0 * (8 * layer) as f64);
        assert_eq!(f.head, 2.0 * (32064 * 512) as f64);
        assert_eq!(f.per_key, 4.0 * (8 * 512) as f64);
        std::fs::remove_dir_all(&dir).ok();
    }
}
