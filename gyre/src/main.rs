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
use clap::{CommandFactory as _, Parser, Subcommand};
use gyre_engine::DeviceChoice;
use gyre_engine::progress::{LoadProgress, LogLines, TerminalBar};
use gyre_service::registry::load::{self, LoadDefaults};
use gyre_service::registry::spec::ModelSpec;
use gyre_service::resolve;
use gyre_service::server::{ServerOptions, grpc_service_for};
use gyre_shim::logging::LogFormat;
use tokio::net::TcpListener;
use tokio::sync::watch;

mod args;
mod bench_cmd;
mod chat;
mod client;
mod config_file;
mod help_topics;
mod metrics_args;
mod models_cmd;

use args::{Device, GrpcArgs, HttpArgs, ModelArgs};

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
        max_queue: e.max_queue as usize,
        embed_batch_tokens: e.embed_batch_tokens as usize,
        compute_threads: e.compute_threads,
        dequantize: e.dequantize,
        quant_activations: e.quant_activations.into(),
        kv_cache_dtype: e.kv_cache_dtype.into(),
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
    let cli: Cli = config_file::parse(help_topics::apply(Cli::command()))?;
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = server_threads(&cli) {
        runtime.worker_threads(n);
    }
    runtime.enable_all().build()?.block_on(run(cli))
}

/// Worker threads of the server's runtime, when not tokio's default (one a
/// core, or `TOKIO_WORKER_THREADS`): `--server-threads`, else, for a model
/// on the CPU, the cores its compute threads leave, at least one. On a
/// 2-core machine, two runtime threads beside two compute threads cost a
/// 16-stream decode about a third more CPU a token in the server (three
/// times the futex and eventfd wakeups), taken from the compute threads.
fn server_threads(cli: &Cli) -> Option<usize> {
    let (Command::Serve { model, .. } | Command::Grpc { model, .. }) = &cli.command else {
        return None;
    };
    if let Some(n) = model.engine.server_threads {
        return Some(usize::from(n));
    }
    if std::env::var_os("TOKIO_WORKER_THREADS").is_some() {
        return None;
    }
    let cpu = match model.device {
        Device::Cpu => true,
        Device::Auto => !gyre_engine::cuda_available(),
        Device::Cuda => false,
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    cpu.then(|| {
        cores
            .saturating_sub(model.engine.compute_threads.unwrap_or(cores))
            .max(1)
    })
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

async fn run(cli: Cli) -> anyhow::Result<()> {
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
    // After the drain, streams still open (a health Watch) must not hold
    // the process: they get a short grace, then their connections go.
    let limits = gyre_shim::conn::ConnLimits {
        stop_grace: Some(gyre_shim::conn::STOP_GRACE),
        ..grpc.conn.limits()
    };
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
    // The HTTP API's shim reaches the gRPC server in process: in-memory
    // connections, no loopback TCP (or TLS) for every streamed token.
    let (local_connector, local_incoming) = match &http {
        Some(_) => {
            let (connector, incoming) = gyre_shim::conn::inproc::pair();
            (Some(connector), Some(incoming))
        }
        None => (None, None),
    };
    let grpc_task = tokio::spawn(gyre_shim::conn::serve_tls(
        grpc_listener,
        local_incoming,
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
            let mut cfg = gyre_shim::ShimConfig::new(format!("http://{grpc_local}"));
            cfg.upstream_inproc = local_connector;
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
    use super::{Cli, Command, ModelSpec, Parser as _, model_specs};
    use crate::args::parse_age;
    use std::time::Duration;

    /// The model specs of `gyre serve ARGS`.
    fn specs_of(args: &[&str]) -> anyhow::Result<Vec<ModelSpec>> {
        let cli = Cli::try_parse_from(["gyre", "serve"].iter().chain(args))?;
        let Command::Serve { model, .. } = cli.command else {
            unreachable!("serve")
        };
        model_specs(&model)
    }

    /// `server_threads` for `gyre ARGS`.
    fn server_threads_of(args: &[&str]) -> Option<usize> {
        let cli = Cli::try_parse_from(["gyre"].iter().chain(args)).expect("parses");
        super::server_threads(&cli)
    }

    #[test]
    fn the_server_runtime_gets_the_cores_the_compute_threads_leave() {
        if std::env::var_os("TOKIO_WORKER_THREADS").is_some() {
            // It overrides the default being tested; the explicit flag still wins.
            assert_eq!(
                server_threads_of(&["serve", "--server-threads", "3"]),
                Some(3)
            );
            return;
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(server_threads_of(&["serve", "--device", "cpu"]), Some(1));
        assert_eq!(
            server_threads_of(&["grpc", "--device", "cpu", "--compute-threads", "1"]),
            Some(cores.saturating_sub(1).max(1))
        );
        assert_eq!(
            server_threads_of(&["serve", "--device", "cpu", "--compute-threads", "64"]),
            Some(1)
        );
        assert_eq!(server_threads_of(&["serve", "--device", "cuda"]), None);
        assert_eq!(
            server_threads_of(&["serve", "--device", "cuda", "--server-threads", "5"]),
            Some(5)
        );
        assert_eq!(server_threads_of(&["models"]), None);
        assert!(
            Cli::try_parse_from(["gyre", "serve", "--server-threads", "0"]).is_err(),
            "zero threads is refused"
        );
    }

    /// A queue of no requests is refused with the flag's name, before any
    /// model loads (it failed the model's load, as 'unsupported model').
    #[test]
    fn an_empty_queue_is_refused_as_a_flag() {
        let err = Cli::try_parse_from(["gyre", "serve", "--max-queue", "0"])
            .err()
            .expect("refused");
        assert!(err.to_string().contains("--max-queue"), "{err}");
        assert!(Cli::try_parse_from(["gyre", "serve", "--max-queue", "1"]).is_ok());
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
