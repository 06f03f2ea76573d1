//! Connection handling for both of gyre's ports (the OpenAI HTTP API and
//! gRPC): one accept loop over hyper-util's HTTP/1 + HTTP/2 connection
//! builder, with the limits a server that faces untrusted clients needs.
//!
//! - **Connection limit** ([`ConnLimits::max_connections`], per port): at the
//!   limit a new connection is accepted and closed at once (the client sees
//!   the connection closed, not a hang in the kernel's backlog); a slot frees
//!   as soon as one of the open connections ends.
//! - **Header-read timeout**: a new connection must start its first request
//!   (HTTP/1: a complete request head; HTTP/2: the preface, SETTINGS and a
//!   request's HEADERS) within this time; an HTTP/1 keep-alive connection that
//!   starts sending its next request head must complete it within this time.
//! - **Idle timeout**: a connection with no request in flight for this long
//!   is closed (HTTP/2: GOAWAY). A request is in flight from its head until
//!   its response body has been sent or dropped, so a long stream, or a
//!   request waiting in the engine's queue, keeps its connection open.
//! - **HTTP/2 keepalive**: the server pings every interval and closes a
//!   connection whose ping is not answered within the timeout (a dead peer
//!   holding a long stream open).
//!
//! A connection the limits close is first asked to close gracefully
//! (HTTP/1: after the response in progress; HTTP/2: GOAWAY); once it has had
//! no request in flight for [`CLOSE_GRACE`] it is dropped. Shutdown works the
//! same way for every connection: requests in flight finish, idle connections
//! go; with [`ConnLimits::stop_grace`] (`gyre serve`'s ports), a connection
//! still busy that long after shutdown began is dropped with its streams
//! (by then `gyre serve` has drained its engines, so what is left is
//! long-lived: a health `Watch`, an idle bidirectional `Generate`, or
//! requests the drain timeout gave up on). The request-body timeout of the
//! HTTP API is in [`body`].
//!
//! `gyre serve`'s own shim reaches its gRPC port through in-process
//! connections ([`inproc`], [`serve_tls`]), served like the others but
//! without TCP, TLS or a connection slot.
//!
//! With TLS ([`serve_tls`]), each accepted connection first completes its
//! handshake, within the header-read timeout (10 s when that is off); a
//! connection that fails it (a plain-text client, an unknown or missing
//! client certificate under mTLS) is closed and logged at debug level.

pub mod body;
pub mod inproc;
mod track;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

use track::{ConnState, Tracked, Watched};

/// How long a connection being closed may stay open without a request in
/// flight before it is dropped (a peer that ignores GOAWAY, or a half-sent
/// request head).
pub const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// `gyre serve`'s [`ConnLimits::stop_grace`]: after its drain, how long a
/// connection may keep requests in flight before it is dropped with them
/// (a client's stream that would otherwise hold the process open: a health
/// `Watch` never ends by itself).
pub const STOP_GRACE: Duration = Duration::from_secs(2);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Per-port connection limits; a `None` timeout is off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    pub header_read_timeout: Option<Duration>,
    pub idle_timeout: Option<Duration>,
    /// Most connections open at once on the port (at least 1).
    pub max_connections: usize,
    /// Interval of the server's HTTP/2 PINGs.
    pub http2_keepalive_interval: Option<Duration>,
    /// How long a PING may go unanswered before the connection is closed.
    pub http2_keepalive_timeout: Duration,
    /// After shutdown begins, how long a connection may keep requests in
    /// flight before it is dropped with them; None: until they finish
    /// (`gyre-shim`, which has no drain of its own before it stops).
    pub stop_grace: Option<Duration>,
}

impl Default for ConnLimits {
    fn default() -> Self {
        Self {
            header_read_timeout: Some(Duration::from_secs(10)),
            idle_timeout: Some(Duration::from_secs(120)),
            max_connections: 4096,
            http2_keepalive_interval: Some(Duration::from_secs(30)),
            http2_keepalive_timeout: Duration::from_secs(20),
            stop_grace: None,
        }
    }
}

/// The connection flags of `gyre serve`, `gyre grpc` and `gyre-shim` (each
/// also an environment variable). Timeouts are in seconds; 0 turns one off.
#[derive(Debug, Clone, clap::Args)]
pub struct ConnArgs {
    /// Seconds a new connection may take to start its first request (HTTP/1:
    /// a complete request head; HTTP/2: preface and first HEADERS), and an
    /// HTTP/1 keep-alive connection to finish the head of its next request;
    /// 0: off.
    #[arg(long, env = "GYRE_HEADER_READ_TIMEOUT", default_value = "10", value_parser = parse_secs)]
    pub header_read_timeout: Duration,
    /// Seconds a connection may stay open with no request in flight; 0: off.
    #[arg(long, env = "GYRE_IDLE_TIMEOUT", default_value = "120", value_parser = parse_secs)]
    pub idle_timeout: Duration,
    /// Most open connections per port; more are accepted and closed at once.
    #[arg(long, env = "GYRE_MAX_CONNECTIONS", default_value_t = 4096,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,
    /// Seconds between the server's HTTP/2 keepalive PINGs; 0: none.
    #[arg(long, env = "GYRE_HTTP2_KEEPALIVE_INTERVAL", default_value = "30", value_parser = parse_secs)]
    pub http2_keepalive_interval: Duration,
    /// Seconds an HTTP/2 PING may go unanswered before the connection is closed.
    #[arg(long, env = "GYRE_HTTP2_KEEPALIVE_TIMEOUT", default_value = "20", value_parser = parse_secs)]
    pub http2_keepalive_timeout: Duration,
}

impl ConnArgs {
    /// The limits these flags ask for.
    pub fn limits(&self) -> ConnLimits {
        let on = |d: Duration| (!d.is_zero()).then_some(d);
        ConnLimits {
            header_read_timeout: on(self.header_read_timeout),
            idle_timeout: on(self.idle_timeout),
            max_connections: usize::try_from(self.max_connections).unwrap_or(usize::MAX),
            http2_keepalive_interval: on(self.http2_keepalive_interval),
            http2_keepalive_timeout: self.http2_keepalive_timeout,
            stop_grace: None,
        }
    }
}

/// Parses a flag's seconds (a non-negative number, fractions allowed).
pub fn parse_secs(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    Duration::try_from_secs_f64(secs).map_err(|e| format!("{s:?}: {e}"))
}

/// Serves `service` on every connection `listener` accepts until `shutdown`
/// resolves; then stops accepting and waits for the open connections to
/// finish their requests (see the module docs).
pub async fn serve<S, B>(
    listener: TcpListener,
    service: S,
    limits: ConnLimits,
    shutdown: impl Future<Output = ()>,
) where
    S: tower::Service<http::Request<Incoming>, Response = http::Response<B>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    serve_tls(listener, None, service, limits, None, shutdown).await;
}

/// How long a TLS handshake may take when the header-read timeout is off.
const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// [`serve`], with each connection's TLS handshake first when `tls` is
/// set, also serving the in-process connections of `inproc` (see
/// [`inproc`]): without TLS, outside the connection limit (they are the
/// process's own shim), otherwise as any other connection.
pub async fn serve_tls<S, B>(
    listener: TcpListener,
    mut inproc: Option<inproc::Incoming>,
    service: S,
    limits: ConnLimits,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shutdown: impl Future<Output = ()>,
) where
    S: tower::Service<http::Request<Incoming>, Response = http::Response<B>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let builder = Arc::new(builder(&limits));
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    // Every connection task holds a receiver; `closed()` on the sender
    // resolves once all of them are gone.
    let (close_tx, close_rx) = watch::channel(false);
    let mut refused_logged: Option<tokio::time::Instant> = None;
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => accepted,
            local = next_inproc(&mut inproc) => {
                let (builder, service, close) = (builder.clone(), service.clone(), close_rx.clone());
                tokio::spawn(async move {
                    serve_connection(local, service, &builder, limits, close).await;
                });
                continue;
            }
        };
        let (tcp, peer) = match accepted {
            Ok(conn) => conn,
            Err(e) => {
                // Out of file descriptors and the like: back off a little
                // rather than spin; per-connection errors are not fatal.
                tracing::warn!(error = %e, "accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            if refused_logged.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                tracing::warn!(
                    limit = limits.max_connections,
                    %peer,
                    "connection limit reached: closing new connections"
                );
                refused_logged = Some(tokio::time::Instant::now());
            }
            drop(tcp);
            continue;
        };
        // Streamed tokens are small writes: without TCP_NODELAY, Nagle's
        // algorithm holds each behind the peer's delayed ACK (~40 ms).
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::warn!(error = %e, "cannot set TCP_NODELAY");
        }
        let (builder, service, close) = (builder.clone(), service.clone(), close_rx.clone());
        let tls = tls.clone();
        tokio::spawn(async move {
            match tls {
                None => serve_connection(tcp, service, &builder, limits, close).await,
                Some(acceptor) => {
                    let limit = limits
                        .header_read_timeout
                        .unwrap_or(DEFAULT_HANDSHAKE_TIMEOUT);
                    match tokio::time::timeout(limit, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => {
                            serve_connection(stream, service, &builder, limits, close).await;
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(error = %e, %peer, "TLS handshake failed");
                        }
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                }
            }
            drop(slot);
        });
    }
    drop(listener);
    drop(inproc);
    let _ = close_tx.send(true);
    drop(close_rx);
    close_tx.closed().await;
}

/// The next in-process connection; pending for good once there is no
/// sender left (or none was given).
async fn next_inproc(inproc: &mut Option<inproc::Incoming>) -> tokio::io::DuplexStream {
    if let Some(rx) = inproc {
        if let Some(conn) = rx.recv().await {
            return conn;
        }
        *inproc = None;
    }
    std::future::pending().await
}

fn builder(limits: &ConnLimits) -> Builder<TokioExecutor> {
    let mut builder = Builder::new(TokioExecutor::new());
    // The header-read timeout is enforced by `serve_connection` for both
    // protocols; hyper's own would also cut idle keep-alive connections.
    builder.http1().header_read_timeout(None);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(limits.http2_keepalive_interval)
        .keep_alive_timeout(limits.http2_keepalive_timeout);
    builder
}

/// Serves one connection until it ends, the limits close it, or shutdown
/// (`close` turning true) has let its requests finish.
async fn serve_connection<S, B, T>(
    tcp: T,
    service: S,
    builder: &Builder<TokioExecutor>,
    limits: ConnLimits,
    mut close: watch::Receiver<bool>,
) where
    S: tower::Service<http::Request<Incoming>, Response = http::Response<B>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let state = Arc::new(ConnState::new());
    let io = TokioIo::new(Watched::new(tcp, state.clone()));
    let conn = builder.serve_connection(io, Tracked::new(service, state.clone()));
    let expired = state.expired(&limits);
    let quiet = state.quiet_for(CLOSE_GRACE);
    // Armed when shutdown begins, with `stop_grace`.
    let stop = tokio::time::sleep(Duration::MAX);
    tokio::pin!(conn, expired, quiet, stop);
    let (mut closing, mut stopping) = (false, false);
    loop {
        tokio::select! {
            served = conn.as_mut() => {
                if let Err(e) = served {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            why = &mut expired, if !closing => {
                tracing::debug!(why, "closing connection");
                closing = true;
                conn.as_mut().graceful_shutdown();
            }
            _ = close.wait_for(|c| *c), if !stopping => {
                stopping = true;
                if let Some(grace) = limits.stop_grace {
                    stop.as_mut().reset(tokio::time::Instant::now() + grace);
                }
                if !closing {
                    closing = true;
                    conn.as_mut().graceful_shutdown();
                }
            }
            () = &mut quiet, if closing => return,
            () = &mut stop, if stopping => {
                tracing::debug!("shutdown: dropping a connection with requests still in flight");
                return;
            }
        }
    }
}
