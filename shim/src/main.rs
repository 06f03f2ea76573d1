//! The `gyre-shim` binary: the OpenAI-compatible HTTP API of a gyre gRPC
//! service. Prints `gyre-shim: HTTP listening on http://<addr>` on stdout
//! once bound (logs go to stderr) and shuts down gracefully on Ctrl-C or
//! SIGTERM.
#![forbid(unsafe_code)]

use std::io::Write as _;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use gyre_shim::ShimConfig;

/// OpenAI-compatible HTTP API for a gyre gRPC inference service.
#[derive(Debug, Parser)]
#[command(name = "gyre-shim", version, about)]
struct Args {
    /// Log lines as text (coloured only on a terminal) or one JSON object a line.
    #[arg(long, env = "GYRE_LOG_FORMAT", value_enum, default_value_t)]
    log_format: gyre_shim::logging::LogFormat,

    /// URI of the gyre gRPC service.
    #[arg(
        long,
        env = "GYRE_GRPC_ENDPOINT",
        default_value = "http://127.0.0.1:50051"
    )]
    grpc_endpoint: String,

    /// Address to serve HTTP on (port 0 picks a free port).
    #[arg(long, env = "GYRE_HTTP_ADDR", default_value = "127.0.0.1:8000")]
    http_addr: String,

    /// Require `Authorization: Bearer <key>` on HTTP and send it to the service.
    #[arg(long, env = "GYRE_API_KEY", hide_env_values = true)]
    api_key: Option<String>,

    /// Deadline of each gRPC call in seconds (none when unset).
    #[arg(long, env = "GYRE_REQUEST_TIMEOUT_SECS")]
    request_timeout_secs: Option<u64>,

    /// Let web pages of this origin (`scheme://host[:port]`, or `*` for any)
    /// call the HTTP API from a browser (CORS). Repeatable or
    /// comma-separated; unset: CORS stays closed.
    #[arg(long, env = "GYRE_CORS_ALLOW_ORIGIN", value_delimiter = ',')]
    cors_allow_origin: Vec<String>,
    /// HTTP/2 connections to the gRPC service; each call takes the one with
    /// the fewest calls in flight.
    #[arg(long, env = "GYRE_UPSTREAM_CONNECTIONS", default_value_t = gyre_shim::pool::DEFAULT_CONNECTIONS,
          value_parser = clap::value_parser!(u16).range(1..))]
    upstream_connections: u16,

    /// Seconds a request body may take to arrive after its head (then 408
    /// and the connection is closed); 0: no limit.
    #[arg(long, env = "GYRE_BODY_TIMEOUT", default_value = "30", value_parser = gyre_shim::conn::parse_secs)]
    body_timeout: Duration,

    #[command(flatten)]
    conn: gyre_shim::conn::ConnArgs,

    /// Record no metrics (`/metrics` answers 404). The standalone shim's
    /// metrics are its HTTP requests; the service's are on its own process.
    #[arg(long, env = "GYRE_DISABLE_METRICS")]
    disable_metrics: bool,
    /// Render the metrics vLLM also has as `vllm:<name>` (see README).
    #[arg(long, env = "GYRE_METRICS_VLLM_NAMES")]
    metrics_vllm_names: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    gyre_shim::logging::init(args.log_format);
    let config = ShimConfig {
        grpc_endpoint: args.grpc_endpoint,
        api_key: args.api_key.filter(|k| !k.is_empty()),
        request_timeout: args.request_timeout_secs.map(Duration::from_secs),
        cors_allow_origins: args.cors_allow_origin,
        upstream_connections: usize::from(args.upstream_connections),
        body_timeout: (!args.body_timeout.is_zero()).then_some(args.body_timeout),
    };
    let metrics = match args.disable_metrics {
        true => None,
        false => Some(gyre_shim::metrics::install(args.metrics_vllm_names)?),
    };
    let state = gyre_shim::connect(config).await?.with_metrics(metrics);
    let listener = tokio::net::TcpListener::bind(&args.http_addr)
        .await
        .with_context(|| format!("cannot bind HTTP address {}", args.http_addr))?;
    let addr = listener.local_addr()?;
    {
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "gyre-shim: HTTP listening on http://{addr}")?;
        stdout.flush()?;
    }
    gyre_shim::serve(listener, state, args.conn.limits(), shutdown_signal()).await?;
    tracing::info!("shut down");
    Ok(())
}

/// Resolves on Ctrl-C or (on Unix) SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(%e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(e) => {
                tracing::error!(%e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
    tracing::info!("shutdown signal received, finishing requests in flight");
}
