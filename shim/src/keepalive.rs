//! Keeping long, quiet streams alive through proxies and dead-peer checks.
//!
//! - **SSE heartbeat**: a streamed HTTP response with no event for
//!   `--sse-heartbeat-secs` (15 s by default) gets an SSE comment,
//!   `: keep-alive`, which clients ignore and which keeps proxies and load
//!   balancers from cutting a stream that looks idle (a request waiting in
//!   a long queue, or a slow prefill). The timer restarts with every event,
//!   so a stream whose tokens flow carries no heartbeats.
//! - **HTTP/2 keepalive of the shim's gRPC client**: PINGs on each
//!   connection to the service every `--upstream-keepalive-interval`, even
//!   with no call in flight, and the connection is dropped (its calls fail
//!   with 502/503) when one goes unanswered for
//!   `--upstream-keepalive-timeout`. The server side has its own flags
//!   (`--http2-keepalive-interval`, `--http2-keepalive-timeout`, in `conn`).

use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;

use crate::ShimConfig;

/// Default interval of the SSE heartbeat.
pub const SSE_HEARTBEAT: Duration = Duration::from_secs(15);
/// Default interval of the gRPC client's HTTP/2 PINGs.
pub const UPSTREAM_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// Default time a PING of the gRPC client may go unanswered.
pub const UPSTREAM_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// The keepalive flags of `gyre serve` and `gyre-shim` (each also an
/// environment variable). Seconds; 0 turns one off.
#[derive(Debug, Clone, clap::Args)]
pub struct KeepaliveArgs {
    /// Seconds without an event after which a streamed (SSE) response
    /// gets a `: keep-alive` comment; 0: no heartbeat.
    #[arg(long, env = "GYRE_SSE_HEARTBEAT_SECS", default_value = "15", value_parser = crate::conn::parse_secs)]
    pub sse_heartbeat_secs: Duration,
    /// Seconds between the HTTP/2 PINGs of the HTTP API's gRPC client on
    /// each connection to the service; 0: none.
    #[arg(long, env = "GYRE_UPSTREAM_KEEPALIVE_INTERVAL", default_value = "30", value_parser = crate::conn::parse_secs)]
    pub upstream_keepalive_interval: Duration,
    /// Seconds such a PING may go unanswered before the connection is dropped.
    #[arg(long, env = "GYRE_UPSTREAM_KEEPALIVE_TIMEOUT", default_value = "20", value_parser = crate::conn::parse_secs)]
    pub upstream_keepalive_timeout: Duration,
}

impl KeepaliveArgs {
    /// Sets these flags' settings in `cfg`.
    pub fn apply(&self, cfg: &mut ShimConfig) {
        let on = |d: Duration| (!d.is_zero()).then_some(d);
        cfg.sse_heartbeat = on(self.sse_heartbeat_secs);
        cfg.upstream_keepalive_interval = on(self.upstream_keepalive_interval);
        cfg.upstream_keepalive_timeout = self.upstream_keepalive_timeout;
    }
}

/// The response of `sse`, with a `: keep-alive` comment after every `every`
/// without an event (none when `every` is None).
pub fn heartbeat<S, E>(sse: Sse<S>, every: Option<Duration>) -> Response
where
    S: Stream<Item = Result<Event, E>> + Send + 'static,
    E: Into<axum::BoxError>,
{
    match every {
        Some(every) => sse
            .keep_alive(KeepAlive::new().interval(every).text("keep-alive"))
            .into_response(),
        None => sse.into_response(),
    }
}
