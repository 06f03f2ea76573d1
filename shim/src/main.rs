//! The `gyre-shim` binary: the OpenAI-compatible HTTP API of a gyre gRPC
//! service. Prints `gyre-shim: HTTP listening on http://<addr>` on stdout
//! once bound (logs go to stderr) and shuts down gracefully on Ctrl-C or
//! SIGTERM.
#![forbid(unsafe_code)]

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
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

    /// URI of the gyre gRPC service (`--upstream` is the same flag); an
    /// `https://` URI is reached over TLS and needs --upstream-ca.
    #[arg(
        long,
        alias = "upstream",
        env = "GYRE_GRPC_ENDPOINT",
        default_value = "http://127.0.0.1:50051"
    )]
    grpc_endpoint: String,

    /// PEM CA certificate(s) that the service's TLS certificate must chain
    /// to (for an `https://` --upstream).
    #[arg(long, env = "GYRE_UPSTREAM_CA")]
    upstream_ca: Option<PathBuf>,
    /// PEM client certificate chain to present to the service (when its
    /// gRPC port requires client certificates, `--tls-client-ca`).
    #[arg(long, env = "GYRE_UPSTREAM_CLIENT_CERT", requires_all = ["upstream_client_key", "upstream_ca"])]
    upstream_client_cert: Option<PathBuf>,
    /// PEM private key of --upstream-client-cert.
    #[arg(
        long,
        env = "GYRE_UPSTREAM_CLIENT_KEY",
        requires = "upstream_client_cert"
    )]
    upstream_client_key: Option<PathBuf>,

    /// HTTPS on the HTTP port.
    #[command(flatten)]
    tls: gyre_shim::tls::TlsArgs,

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
    /// call the HTTP API from a browser (CORS); `--cors-origin` is the same
    /// flag. Repeatable or comma-separated; unset: CORS stays closed.
    #[arg(
        long,
        alias = "cors-origin",
        env = "GYRE_CORS_ALLOW_ORIGIN",
        value_delimiter = ','
    )]
    cors_allow_origin: Vec<String>,

    #[command(flatten)]
    idempotency: gyre_shim::idempotency::IdempotencyArgs,
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

    /// Export traces over OTLP/gRPC to this collector (e.g.
    /// `http://127.0.0.1:4317`); also read from OTEL_EXPORTER_OTLP_ENDPOINT.
    /// Unset: no spans are made.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
    #[command(flatten)]
    keepalive: gyre_shim::keepalive::KeepaliveArgs,
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
    let telemetry = gyre_shim::telemetry::init(args.otlp_endpoint.as_deref())?;
    let upstream_tls = upstream_tls(&args)?;
    let http_tls = gyre_shim::tls::ServerTls::from_flags(
        args.tls.tls_cert.as_deref(),
        args.tls.tls_key.as_deref(),
        None,
    )?
    .map(|t| t.acceptor(false))
    .transpose()?;
    let mut config = ShimConfig {
        upstream_tls,
        idempotency: args.idempotency.settings(),
        grpc_endpoint: args.grpc_endpoint,
        api_key: args.api_key.filter(|k| !k.is_empty()),
        request_timeout: args.request_timeout_secs.map(Duration::from_secs),
        cors_allow_origins: args.cors_allow_origin,
        upstream_connections: usize::from(args.upstream_connections),
        body_timeout: (!args.body_timeout.is_zero()).then_some(args.body_timeout),
        ..ShimConfig::new("")
    };
    let metrics = match args.disable_metrics {
        true => None,
        false => Some(gyre_shim::metrics::install(args.metrics_vllm_names)?),
    };
    args.keepalive.apply(&mut config);
    let state = gyre_shim::connect(config).await?.with_metrics(metrics);
    let listener = tokio::net::TcpListener::bind(&args.http_addr)
        .await
        .with_context(|| format!("cannot bind HTTP address {}", args.http_addr))?;
    let addr = listener.local_addr()?;
    {
        let mut stdout = std::io::stdout().lock();
        let scheme = if http_tls.is_some() { "https" } else { "http" };
        writeln!(stdout, "gyre-shim: HTTP listening on {scheme}://{addr}")?;
        stdout.flush()?;
    }
    gyre_shim::serve_tls(
        listener,
        state,
        args.conn.limits(),
        http_tls,
        shutdown_signal(),
    )
    .await?;
    if let Some(t) = telemetry {
        tokio::task::spawn_blocking(move || t.shutdown()).await?;
    }
    tracing::info!("shut down");
    Ok(())
}

/// The TLS of the hop to the service: for an `https://` endpoint, trusting
/// --upstream-ca.
fn upstream_tls(args: &Args) -> anyhow::Result<Option<Arc<rustls::ClientConfig>>> {
    use gyre_shim::tls;
    let https = args.grpc_endpoint.starts_with("https://");
    match (&args.upstream_ca, https) {
        (None, false) => Ok(None),
        (None, true) => anyhow::bail!(
            "--upstream {} is https: give the CA its certificate chains to with --upstream-ca",
            args.grpc_endpoint
        ),
        (Some(_), false) => anyhow::bail!(
            "--upstream-ca is for an https:// --upstream, not {}",
            args.grpc_endpoint
        ),
        (Some(ca), true) => {
            let roots = tls::load_certs("--upstream-ca", ca)?;
            let identity = match (&args.upstream_client_cert, &args.upstream_client_key) {
                (Some(cert), Some(key)) => Some(tls::Identity::load(
                    ("--upstream-client-cert", cert),
                    ("--upstream-client-key", key),
                )?),
                _ => None,
            };
            Ok(Some(tls::upstream_client(roots, identity.as_ref())?))
        }
    }
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
