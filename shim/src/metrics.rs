//! Prometheus metrics: the process's recorder and `/metrics`.
//!
//! Every crate records through the `metrics` facade under the `gyre:` prefix
//! (the service its requests and engines, the shim its HTTP requests, the
//! auth layer its rejections); a binary installs one Prometheus recorder for
//! the whole process with [`install`] and the HTTP API renders it at
//! `/metrics` (and, with `--metrics-addr`, on an address of its own,
//! [`serve_separately`]). Figures that are state rather than events (running
//! and waiting requests, KV blocks) are read when scraped: a binary adds
//! [`Collector`]s that set them just before each render. Histograms of
//! seconds share buckets from 1 ms to 10 minutes. With `vllm_names`, the
//! metrics whose meaning is vLLM's are rendered as `vllm:` instead of
//! `gyre:` ([`VLLM_NAMES`]), for dashboards made for vLLM.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::error::ApiError;

/// A check of a bearer key against keys the shim does not hold itself (the
/// service's keys file, in the same process): true when it is known.
pub type KeyCheck = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// Who may read `/metrics` on the HTTP port (`--metrics-addr` is always
/// open: it is the operator's own address).
#[derive(Clone, Default)]
pub enum Access {
    /// As every other route: the shim's own API key when it has one, else
    /// open.
    #[default]
    AsRoutes,
    /// Open to callers without a key (`--open-endpoints`).
    Open,
    /// A valid tenant key: 401 without one or with one the check does not
    /// know (`--keys-file`).
    Keys(KeyCheck),
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::AsRoutes => "AsRoutes",
            Self::Open => "Open",
            Self::Keys(_) => "Keys",
        })
    }
}

/// Upper bounds of every `_seconds` histogram: 1 ms to 10 minutes.
pub const SECONDS_BUCKETS: [f64; 20] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0,
    20.0, 40.0, 80.0, 160.0, 600.0,
];

/// The metrics whose meaning is vLLM's metric of the same name: with
/// `--metrics-vllm-names` they are rendered as `vllm:<name>`.
pub const VLLM_NAMES: [&str; 16] = [
    "num_requests_running",
    "num_requests_waiting",
    "kv_cache_usage_perc",
    "prefix_cache_queries_total",
    "prefix_cache_hits_total",
    "num_preemptions_total",
    "prompt_tokens_total",
    "generation_tokens_total",
    "request_success_total",
    "time_to_first_token_seconds",
    "inter_token_latency_seconds",
    "e2e_request_latency_seconds",
    "request_queue_time_seconds",
    "request_prefill_time_seconds",
    "request_decode_time_seconds",
    "request_inference_time_seconds",
];

/// Sets state-like figures (gauges) just before a render.
pub type Collector = Arc<dyn Fn() + Send + Sync>;

/// Why the recorder could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("invalid histogram buckets: {0}")]
    Buckets(String),
    #[error("a metrics recorder is already installed in this process")]
    AlreadyInstalled,
}

struct Inner {
    handle: PrometheusHandle,
    vllm_names: bool,
    collectors: RwLock<Vec<Collector>>,
}

/// The installed recorder: renders it; cheap to clone.
#[derive(Clone)]
pub struct Metrics(Arc<Inner>);

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("vllm_names", &self.0.vllm_names)
            .finish_non_exhaustive()
    }
}

/// The recorder gyre installs (buckets set), not installed: for
/// [`install`], and for tests that record into one of their own.
pub fn builder() -> Result<PrometheusBuilder, MetricsError> {
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &SECONDS_BUCKETS)
        .map_err(|e| MetricsError::Buckets(e.to_string()))
}

impl Metrics {
    /// Wraps a recorder's handle (see [`install`]).
    pub fn new(handle: PrometheusHandle, vllm_names: bool) -> Self {
        Self(Arc::new(Inner {
            handle,
            vllm_names,
            collectors: RwLock::new(Vec::new()),
        }))
    }

    /// Publishes the help texts described since the last upkeep (they show
    /// from the next render on; the upkeep task also does this every 5 s).
    pub fn publish_descriptions(&self) {
        self.0.handle.run_upkeep();
    }

    /// Runs `collector` before every render from now on.
    pub fn add_collector(&self, collector: Collector) {
        if let Ok(mut list) = self.0.collectors.write() {
            list.push(collector);
        }
    }

    /// The Prometheus text exposition of every metric recorded so far.
    pub fn render(&self) -> String {
        if let Ok(list) = self.0.collectors.read() {
            for c in list.iter() {
                c();
            }
        }
        let text = self.0.handle.render();
        if self.0.vllm_names {
            vllm_names(&text)
        } else {
            text
        }
    }
}

/// Installs the process's recorder (once per process) and keeps it drained:
/// a task runs its upkeep every 5 s, so histograms do not grow between
/// scrapes. Call it inside a tokio runtime, before anything is recorded.
pub fn install(vllm_names: bool) -> Result<Metrics, MetricsError> {
    let recorder = builder()?.build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).map_err(|_| MetricsError::AlreadyInstalled)?;
    describe();
    handle.run_upkeep();
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(Metrics::new(handle, vllm_names))
}

/// The help text of the shim's own metrics.
fn describe() {
    metrics::describe_counter!(
        "gyre:http_requests_total",
        "HTTP API responses by route (the matched path pattern) and status code"
    );
}

/// Renames the [`VLLM_NAMES`] metrics of a rendered exposition from `gyre:`
/// to `vllm:` (sample lines and their `# HELP` / `# TYPE` lines).
pub fn vllm_names(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let (head, rest) = match line.strip_prefix("# HELP ") {
            Some(r) => ("# HELP ", r),
            None => match line.strip_prefix("# TYPE ") {
                Some(r) => ("# TYPE ", r),
                None => ("", line),
            },
        };
        let renamed = rest.strip_prefix("gyre:").filter(|r| {
            let name_end = r.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'));
            let name = &r[..name_end.unwrap_or(r.len())];
            VLLM_NAMES.iter().any(|v| {
                name == *v
                    || name
                        .strip_prefix(v)
                        .is_some_and(|s| matches!(s, "_bucket" | "_sum" | "_count"))
            })
        });
        match renamed {
            Some(r) => {
                out.push_str(head);
                out.push_str("vllm:");
                out.push_str(r);
            }
            None => out.push_str(line),
        }
    }
    out
}

/// `GET /metrics`: the exposition, or 404 when metrics are off.
pub async fn handler(metrics: Option<Metrics>) -> Response {
    match metrics {
        Some(m) => {
            let body = tokio::task::spawn_blocking(move || m.render())
                .await
                .unwrap_or_default();
            (
                [(
                    http::header::CONTENT_TYPE,
                    "text/plain; version=0.0.4; charset=utf-8",
                )],
                body,
            )
                .into_response()
        }
        None => ApiError::new(
            http::StatusCode::NOT_FOUND,
            crate::error::INVALID_REQUEST,
            "metrics are off on this server (it runs with --disable-metrics)",
        )
        .with_code(Some("metrics_disabled".into()))
        .into_response(),
    }
}

/// Counts each HTTP API response as `gyre:http_requests_total{route,
/// status}` (the route is the matched path pattern, `unmatched` for none).
pub async fn count_requests(req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let response = next.run(req).await;
    metrics::counter!(
        "gyre:http_requests_total",
        "route" => route,
        "status" => response.status().as_str().to_owned()
    )
    .increment(1);
    response
}

/// A router serving only `/metrics` (for `--metrics-addr`).
pub fn router(metrics: Metrics) -> Router {
    Router::new()
        .route("/metrics", get(separate))
        .with_state(metrics)
}

async fn separate(State(m): State<Metrics>) -> Response {
    handler(Some(m)).await
}

/// Serves [`router`] on `listener` under `limits` until `shutdown`.
pub async fn serve_separately(
    listener: tokio::net::TcpListener,
    metrics: Metrics,
    limits: crate::conn::ConnLimits,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    crate::conn::serve(listener, router(metrics), limits, shutdown).await;
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
