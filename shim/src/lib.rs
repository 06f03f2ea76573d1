//! gyre-shim: an OpenAI-compatible HTTP API in front of gyre's gRPC service.
//!
//! The shim owns no model and no state beyond a small [`pool`] of lazily
//! connected tonic channels: every HTTP generation request becomes one
//! `GenerateStream` call (HTTP/2 multiplexes them on the pool's
//! connections), and every gRPC status maps to an OpenAI-shaped error in
//! exactly one place, [`error`].
//!
//! Layout: [`openai`] (serde types of the HTTP API), [`extract`] (JSON body
//! parsing with precise `param`s), [`limits`] (the edge's nesting and size
//! limits), [`convert`] (OpenAI -> proto), [`upstream`] (the gRPC call),
//! [`sse`] (streaming), [`routes`] (the handlers), [`cors`] (closed unless
//! configured), [`playground`] (the web page of `gyre serve`), [`grpc_cors`]
//! (the gRPC port's CORS for that page and the configured origins),
//! [`observe`] and [`telemetry`] (request ids, spans, access log lines),
//! [`conn`] (accepting and limiting connections, for this port and the
//! service's), [`tls`] (rustls for both ports and the hop to the
//! service), [`idempotency`] (`Idempotency-Key` replays). The Responses API has its own JSON mapping
//! (`openai::responses_*`) and event stream ([`responses_upstream`]).
#![forbid(unsafe_code)]

pub mod conn;
pub mod convert;
pub mod cors;
pub mod error;
pub mod extract;
pub mod grpc_cors;
pub mod guarded;
pub mod idempotency;
pub mod keepalive;
pub mod limits;
pub mod logging;
pub mod metrics;
pub mod notice;
pub mod observe;
pub mod openai;
pub mod playground;
pub mod pool;
pub mod responses_upstream;
pub mod routes;
pub mod sse;
pub mod structured;
pub mod telemetry;
pub mod tls;
pub mod upstream;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use gyre_api::v1::embeddings_client::EmbeddingsClient;
use gyre_api::v1::generation_client::GenerationClient;
use gyre_api::v1::responses_client::ResponsesClient;
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::Endpoint;
use tower_http::trace::TraceLayer;

use crate::conn::ConnLimits;
use crate::error::ApiError;
use crate::pool::Pool;

/// Largest accepted request body (JSON), in bytes; larger bodies get 413.
pub const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

/// How the shim reaches the gRPC service and guards its HTTP API.
#[derive(Debug, Clone)]
pub struct ShimConfig {
    /// URI of the gyre gRPC service, e.g. `http://127.0.0.1:50051`.
    pub grpc_endpoint: String,
    /// When set, HTTP clients must send `Authorization: Bearer <key>`, and the
    /// same header is sent to the gRPC service. When unset, a client's own
    /// `Authorization` header is passed through to the service unchanged.
    pub api_key: Option<String>,
    /// Deadline of each generation, whole streams included (sent as
    /// `grpc-timeout` and enforced by the shim: 504 when it passes);
    /// `None`: no deadline.
    pub request_timeout: Option<Duration>,
    /// Origins allowed to call the API from a browser (CORS); entries may
    /// hold several, comma-separated; `*` is any origin. Empty: CORS stays
    /// closed (no `Access-Control-Allow-Origin`, no preflight grant).
    pub cors_allow_origins: Vec<String>,
    /// HTTP/2 connections to the gRPC service (see [`pool`]; at least 1).
    pub upstream_connections: usize,
    /// A request body not fully received this long after the request head
    /// is answered 408 (see [`conn::body`]); `None`: no limit.
    pub body_timeout: Option<Duration>,
    /// TLS of the hop to the service (for an `https://` endpoint); `None`:
    /// plain HTTP/2.
    pub upstream_tls: Option<Arc<rustls::ClientConfig>>,
    /// Reach the service through in-process connections instead (`gyre
    /// serve`, whose gRPC server serves them; see [`conn::inproc`]); the
    /// endpoint then only names the service, and `upstream_tls` is unused.
    pub upstream_inproc: Option<conn::inproc::Connector>,
    /// `Idempotency-Key` handling (see [`idempotency`]).
    pub idempotency: idempotency::Settings,
    /// A streamed response with no event this long gets a `: keep-alive`
    /// comment (see [`keepalive`]); `None`: no heartbeat.
    pub sse_heartbeat: Option<Duration>,
    /// Interval of the HTTP/2 PINGs to the gRPC service; `None`: none.
    pub upstream_keepalive_interval: Option<Duration>,
    /// How long such a PING may go unanswered.
    pub upstream_keepalive_timeout: Duration,
    /// Who may read `/metrics` (see [`metrics::Access`]).
    pub metrics_access: metrics::Access,
    /// Serve the playground page at `/playground` (see [`playground`]);
    /// `None`: no such routes.
    pub playground: Option<playground::Settings>,
}

/// Largest response header block the shim accepts from the service. h2
/// answers a header block over the limit by closing the whole connection,
/// with every stream on it: with hyper's default, 16 KiB, one request whose
/// error echoed a long model name did that. The service clips what its
/// errors repeat; this is the margin for anything it still sends (a 4 MiB
/// body's worth of echoed ASCII fits several times over).
pub const UPSTREAM_MAX_HEADER_LIST_BYTES: u32 = 16 << 20;

impl ShimConfig {
    /// A config for `grpc_endpoint` without API key or deadline.
    pub fn new(grpc_endpoint: impl Into<String>) -> Self {
        Self {
            grpc_endpoint: grpc_endpoint.into(),
            api_key: None,
            request_timeout: None,
            cors_allow_origins: Vec::new(),
            upstream_connections: usize::from(pool::DEFAULT_CONNECTIONS),
            body_timeout: Some(Duration::from_secs(30)),
            upstream_tls: None,
            upstream_inproc: None,
            idempotency: idempotency::Settings::default(),
            sse_heartbeat: Some(keepalive::SSE_HEARTBEAT),
            upstream_keepalive_interval: Some(keepalive::UPSTREAM_KEEPALIVE_INTERVAL),
            upstream_keepalive_timeout: keepalive::UPSTREAM_KEEPALIVE_TIMEOUT,
            metrics_access: metrics::Access::AsRoutes,
            playground: None,
        }
    }
}

/// Shared state of the HTTP handlers: cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub(crate) client: GenerationClient<Pool>,
    /// The `gyre.v1.Responses` service (same connections).
    pub(crate) responses: ResponsesClient<Pool>,
    pub(crate) embeddings: EmbeddingsClient<Pool>,
    pub(crate) health: tonic_health::pb::health_client::HealthClient<Pool>,
    pub(crate) api_key: Option<Arc<str>>,
    /// `Bearer <api_key>`, ready to put in gRPC metadata.
    pub(crate) grpc_auth: Option<AsciiMetadataValue>,
    pub(crate) request_timeout: Option<Duration>,
    /// The CORS layer, when origins are configured.
    pub(crate) cors: Option<tower_http::cors::CorsLayer>,
    pub(crate) body_timeout: Option<Duration>,
    /// `Idempotency-Key`s and their stored answers.
    pub(crate) idempotency: Arc<idempotency::Store>,
    pub(crate) sse_heartbeat: Option<Duration>,
    /// The process's metrics, rendered at `/metrics` (None: metrics off,
    /// `/metrics` is a 404).
    pub(crate) metrics: Option<metrics::Metrics>,
    /// Who may read `/metrics`.
    pub(crate) metrics_access: metrics::Access,
    /// The playground's settings, when it is served.
    pub(crate) playground: Option<Arc<playground::Settings>>,
}

impl AppState {
    /// The same state, rendering `metrics` at `/metrics`.
    pub fn with_metrics(mut self, metrics: Option<metrics::Metrics>) -> Self {
        self.metrics = metrics;
        self
    }
}

/// Builds the state for `cfg`. The channels connect lazily (on the first
/// call, reconnecting as needed), so this succeeds while the service is down.
pub async fn connect(cfg: ShimConfig) -> anyhow::Result<AppState> {
    let mut endpoint = Endpoint::from_shared(cfg.grpc_endpoint.clone())
        .with_context(|| format!("invalid gRPC endpoint {:?}", cfg.grpc_endpoint))?
        .http2_max_header_list_size(UPSTREAM_MAX_HEADER_LIST_BYTES);
    if let Some(every) = cfg.upstream_keepalive_interval {
        endpoint = endpoint
            .http2_keep_alive_interval(every)
            .keep_alive_timeout(cfg.upstream_keepalive_timeout)
            .keep_alive_while_idle(true);
    }
    let pool = match (&cfg.upstream_inproc, &cfg.upstream_tls) {
        (Some(local), _) => Pool::connect_lazy_with(&endpoint, cfg.upstream_connections, local),
        (None, Some(tls)) => Pool::connect_lazy_with(
            &endpoint,
            cfg.upstream_connections,
            &tls::Connector::new(tls.clone()),
        ),
        (None, None) => Pool::connect_lazy(&endpoint, cfg.upstream_connections),
    };
    let grpc_auth = match &cfg.api_key {
        Some(key) => {
            let mut value = AsciiMetadataValue::try_from(format!("Bearer {key}"))
                .context("the API key must be printable ASCII")?;
            value.set_sensitive(true);
            Some(value)
        }
        None => None,
    };
    Ok(AppState {
        client: GenerationClient::new(pool.clone()),
        responses: ResponsesClient::new(pool.clone()),
        // 2048 vectors of a large model exceed tonic's default 4 MiB.
        embeddings: EmbeddingsClient::new(pool.clone()).max_decoding_message_size(64 << 20),
        health: tonic_health::pb::health_client::HealthClient::new(pool),
        api_key: cfg.api_key.map(Arc::from),
        grpc_auth,
        request_timeout: cfg.request_timeout,
        cors: cors::layer(&cfg.cors_allow_origins)?,
        body_timeout: cfg.body_timeout,
        idempotency: Arc::new(idempotency::Store::new(cfg.idempotency)),
        sse_heartbeat: cfg.sse_heartbeat,
        metrics: None,
        metrics_access: cfg.metrics_access,
        playground: cfg.playground.map(Arc::new),
    })
}

/// The OpenAI-compatible HTTP API, with the request-body timeout (see
/// [`conn::body`]) when configured.
pub fn router(state: AppState) -> Router {
    let router = Router::new()
        .route("/v1/chat/completions", post(routes::chat::create))
        .route("/v1/completions", post(routes::completions::create))
        .route("/v1/embeddings", post(routes::embeddings::create))
        .route("/embeddings", post(routes::embeddings::create))
        .route("/v1/models", get(routes::models::list))
        .route("/v1/models/{*id}", get(routes::models::retrieve))
        .route(
            "/dynamo/alpha/list-models",
            get(routes::models::dynamo_list),
        )
        .route("/tokenize", post(routes::tokens::tokenize))
        .route("/detokenize", post(routes::tokens::detokenize))
        .route("/health", get(routes::tokens::health))
        .route("/version", get(routes::tokens::version))
        .route(
            "/metrics",
            get(|State(s): State<AppState>| metrics::handler(s.metrics)),
        );
    let router = match state.playground.as_deref() {
        Some(settings) => playground::add_routes(router, settings),
        None => router,
    };
    let router = responses_routes(router)
        .fallback(routes::not_found)
        .method_not_allowed_fallback(routes::method_not_allowed)
        .layer(middleware::from_fn(observe::route))
        // Inside authentication: a refused request claims no key.
        .layer(middleware::from_fn_with_state(
            state.idempotency.clone(),
            idempotency::guard,
        ))
        .layer(middleware::from_fn_with_state(state.clone(), authenticate))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES));
    let router = match state.body_timeout {
        Some(timeout) => router.layer(middleware::from_fn_with_state(
            timeout,
            conn::body::body_deadline,
        )),
        None => router,
    };
    // Outside authentication (a browser's preflight carries no key) and
    // every error, the body timeout's 408 included.
    let router = match state.cors.clone() {
        Some(cors) => router.layer(cors),
        None => router,
    };
    let router = if state.metrics.is_some() {
        router.layer(middleware::from_fn(metrics::count_requests))
    } else {
        router
    };
    router.layer(TraceLayer::new_for_http()).with_state(state)
}

/// The Responses API's routes, each under `/v1` and without it.
fn responses_routes(mut router: Router<AppState>) -> Router<AppState> {
    use routes::{conversations as conv, responses as resp};
    for prefix in ["/v1", ""] {
        router = router
            .route(&format!("{prefix}/responses"), post(resp::create))
            .route(
                &format!("{prefix}/responses/input_tokens"),
                post(resp::input_tokens),
            )
            .route(
                &format!("{prefix}/responses/{{id}}"),
                get(resp::retrieve).delete(resp::delete),
            )
            .route(
                &format!("{prefix}/responses/{{id}}/cancel"),
                post(resp::cancel),
            )
            .route(
                &format!("{prefix}/responses/{{id}}/input_items"),
                get(resp::input_items),
            )
            .route(&format!("{prefix}/conversations"), post(conv::create))
            .route(
                &format!("{prefix}/conversations/{{id}}"),
                get(conv::retrieve).delete(conv::delete),
            )
            .route(
                &format!("{prefix}/conversations/{{id}}/items"),
                get(conv::list_items),
            );
    }
    router
}

/// Serves [`router`] (which applies the request-body timeout) on `listener` under
/// `limits` (see [`conn`]) until `shutdown` resolves, then lets the requests
/// in flight finish.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    limits: ConnLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    serve_tls(listener, state, limits, None, shutdown).await
}

/// [`serve`] over TLS (HTTPS) when `tls` is set.
pub async fn serve_tls(
    listener: tokio::net::TcpListener,
    state: AppState,
    limits: ConnLimits,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    // Outermost: every response, a 408 from the body deadline included,
    // carries the request id (see `observe`).
    let app = router(state).layer(middleware::from_fn(observe::layer));
    conn::serve_tls(listener, None, app, limits, tls, shutdown).await;
    Ok(())
}

/// Rejects requests without the configured bearer key (401); `/metrics`
/// as [`metrics::Access`] says.
async fn authenticate(
    State(state): State<AppState>,
    req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let path = req.uri().path();
    let metrics_access = (path == "/metrics").then_some(&state.metrics_access);
    // Probes (load balancers, orchestrators) carry no key, nor does a
    // browser loading the playground (its page sends the key itself).
    let open = matches!(path, "/health" | "/version")
        || matches!(metrics_access, Some(metrics::Access::Open))
        || (state.playground.is_some() && playground::is_playground_path(path));
    if let Some(metrics::Access::Keys(known)) = metrics_access {
        if !known(bearer(&req)?) {
            return Err(ApiError::invalid_api_key());
        }
    } else if let Some(key) = state.api_key.as_ref().filter(|_| !open) {
        let given = bearer(&req)?;
        if !gyre_api::auth::constant_time_eq(given.as_bytes(), key.as_bytes()) {
            return Err(ApiError::invalid_api_key());
        }
    }
    Ok(next.run(req).await)
}

/// The request's bearer key, or the 401 for a missing one.
fn bearer(req: &Request) -> Result<&str, ApiError> {
    req.headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(gyre_api::auth::bearer_token)
        .ok_or_else(ApiError::missing_api_key)
}
