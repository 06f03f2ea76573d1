//! gyre-shim: an OpenAI-compatible HTTP API in front of gyre's gRPC service.
//!
//! The shim owns no model and no state beyond one lazily connected tonic
//! [`Channel`]: every HTTP generation request becomes one `GenerateStream`
//! call (HTTP/2 multiplexes them on the channel), and every gRPC status maps to
//! an OpenAI-shaped error in exactly one place, [`error`].
//!
//! Layout: [`openai`] (serde types of the HTTP API), [`extract`] (JSON body
//! parsing with precise `param`s), [`convert`] (OpenAI -> proto), [`upstream`]
//! (the gRPC call), [`sse`] (streaming), [`routes`] (the handlers).
#![forbid(unsafe_code)]

pub mod convert;
pub mod error;
pub mod extract;
pub mod openai;
pub mod routes;
pub mod sse;
pub mod structured;
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
use gyre_api::v1::generation_client::GenerationClient;
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::{Channel, Endpoint};
use tower_http::trace::TraceLayer;

use crate::error::ApiError;

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
}

impl ShimConfig {
    /// A config for `grpc_endpoint` without API key or deadline.
    pub fn new(grpc_endpoint: impl Into<String>) -> Self {
        Self {
            grpc_endpoint: grpc_endpoint.into(),
            api_key: None,
            request_timeout: None,
        }
    }
}

/// Shared state of the HTTP handlers: cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub(crate) client: GenerationClient<Channel>,
    pub(crate) health: tonic_health::pb::health_client::HealthClient<Channel>,
    pub(crate) api_key: Option<Arc<str>>,
    /// `Bearer <api_key>`, ready to put in gRPC metadata.
    pub(crate) grpc_auth: Option<AsciiMetadataValue>,
    pub(crate) request_timeout: Option<Duration>,
}

/// Builds the state for `cfg`. The channel connects lazily (on the first
/// call, reconnecting as needed), so this succeeds while the service is down.
pub async fn connect(cfg: ShimConfig) -> anyhow::Result<AppState> {
    let endpoint = Endpoint::from_shared(cfg.grpc_endpoint.clone())
        .with_context(|| format!("invalid gRPC endpoint {:?}", cfg.grpc_endpoint))?
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_while_idle(true);
    let channel = endpoint.connect_lazy();
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
        client: GenerationClient::new(channel.clone()),
        health: tonic_health::pb::health_client::HealthClient::new(channel),
        api_key: cfg.api_key.map(Arc::from),
        grpc_auth,
        request_timeout: cfg.request_timeout,
    })
}

/// The OpenAI-compatible HTTP API.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(routes::chat::create))
        .route("/v1/completions", post(routes::completions::create))
        .route("/v1/models", get(routes::models::list))
        .route("/v1/models/{*id}", get(routes::models::retrieve))
        .route("/tokenize", post(routes::tokens::tokenize))
        .route("/detokenize", post(routes::tokens::detokenize))
        .route("/health", get(routes::tokens::health))
        .route("/version", get(routes::tokens::version))
        .fallback(routes::not_found)
        .method_not_allowed_fallback(routes::method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), authenticate))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}

/// Serves [`router`] on `listener` until `shutdown` resolves, then lets the
/// requests in flight finish.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    use axum::serve::ListenerExt as _;
    // Streamed tokens are small writes: without TCP_NODELAY, Nagle's
    // algorithm holds each behind the peer's delayed ACK (~40 ms).
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::warn!(error = %e, "cannot set TCP_NODELAY");
        }
    });
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
        .context("HTTP server failed")
}

/// Rejects requests without the configured bearer key (401).
async fn authenticate(
    State(state): State<AppState>,
    req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    // Probes (load balancers, orchestrators) carry no key.
    let open = matches!(req.uri().path(), "/health" | "/version");
    if let Some(key) = state.api_key.as_ref().filter(|_| !open) {
        let given = req
            .headers()
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(gyre_api::auth::bearer_token);
        match given {
            None => return Err(ApiError::missing_api_key()),
            Some(given) if !gyre_api::auth::constant_time_eq(given.as_bytes(), key.as_bytes()) => {
                return Err(ApiError::invalid_api_key());
            }
            Some(_) => {}
        }
    }
    Ok(next.run(req).await)
}
