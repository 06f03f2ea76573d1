//! What one connection is doing, for its timeouts: requests in flight (a
//! service wrapper, [`Tracked`], whose response bodies hold a guard until
//! they are sent or dropped), when it last went idle, and when an idle
//! HTTP/1 connection started sending a new request head (an IO wrapper,
//! [`Watched`], that notes bytes arriving while no request is in flight).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::Body;
use hyper::body::Incoming;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;
use tokio::time::Instant;

use super::{BoxError, ConnLimits};
use crate::guarded::Guarded;

/// Shared between a connection's IO, its service and its watchdog. Times
/// are milliseconds since the connection was accepted.
pub(super) struct ConnState {
    start: Instant,
    in_flight: AtomicUsize,
    /// Whether any request started (before that, the header-read timeout
    /// counts from the accept).
    served: AtomicBool,
    http2: AtomicBool,
    idle_since: AtomicU64,
    /// 1 + when bytes first arrived since the connection went idle; 0: none.
    head_started: AtomicU64,
    /// Bumped on every change the watchdogs wait for.
    changed: watch::Sender<()>,
}

impl ConnState {
    pub(super) fn new() -> Self {
        Self {
            start: Instant::now(),
            in_flight: AtomicUsize::new(0),
            served: AtomicBool::new(false),
            http2: AtomicBool::new(false),
            idle_since: AtomicU64::new(0),
            head_started: AtomicU64::new(0),
            changed: watch::Sender::new(()),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn request_started(&self, version: http::Version) {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        self.served.store(true, Ordering::SeqCst);
        self.http2
            .store(version == http::Version::HTTP_2, Ordering::SeqCst);
        self.head_started.store(0, Ordering::SeqCst);
        self.changed.send_replace(());
    }

    fn request_ended(&self) {
        if self.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.idle_since.store(self.now(), Ordering::SeqCst);
            self.head_started.store(0, Ordering::SeqCst);
            self.changed.send_replace(());
        }
    }

    /// Bytes arrived: on an idle HTTP/1 connection that has served a
    /// request, they start the next request head (HTTP/2 peers send PINGs
    /// and SETTINGS while idle, which start nothing).
    fn bytes_read(&self) {
        if self.in_flight.load(Ordering::SeqCst) == 0
            && self.served.load(Ordering::SeqCst)
            && !self.http2.load(Ordering::SeqCst)
            && self.head_started.load(Ordering::SeqCst) == 0
        {
            self.head_started
                .store(self.now().saturating_add(1), Ordering::SeqCst);
            self.changed.send_replace(());
        }
    }

    /// When the connection must close if it is still without a request in
    /// flight, and why.
    fn deadline(&self, limits: &ConnLimits) -> Option<(u64, &'static str)> {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        if !self.served.load(Ordering::SeqCst) {
            return match (limits.header_read_timeout, limits.idle_timeout) {
                (Some(h), _) => Some((ms(h), "no request head within the header-read timeout")),
                (None, Some(i)) => Some((ms(i), "idle timeout")),
                (None, None) => None,
            };
        }
        let idle = limits.idle_timeout.map(|i| {
            let since = self.idle_since.load(Ordering::SeqCst);
            (since.saturating_add(ms(i)), "idle timeout")
        });
        let started = self.head_started.load(Ordering::SeqCst);
        let head = limits.header_read_timeout.filter(|_| started > 0).map(|h| {
            (
                (started - 1).saturating_add(ms(h)),
                "request head not completed within the header-read timeout",
            )
        });
        match (idle, head) {
            (Some(a), Some(b)) => Some(if b.0 < a.0 { b } else { a }),
            (a, b) => a.or(b),
        }
    }

    /// Resolves (with the reason) once the connection has been without a
    /// request in flight past its header-read or idle deadline.
    pub(super) async fn expired(&self, limits: &ConnLimits) -> &'static str {
        let mut changed = self.changed.subscribe();
        loop {
            changed.borrow_and_update();
            if self.in_flight.load(Ordering::SeqCst) > 0 {
                let _ = changed.changed().await;
                continue;
            }
            let Some((deadline, why)) = self.deadline(limits) else {
                let _ = changed.changed().await;
                continue;
            };
            let now = self.now();
            if now >= deadline {
                return why;
            }
            let wait = Duration::from_millis(deadline - now);
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                _ = changed.changed() => {}
            }
        }
    }

    /// Resolves once no request has been in flight for `grace`.
    pub(super) async fn quiet_for(&self, grace: Duration) {
        let mut changed = self.changed.subscribe();
        loop {
            changed.borrow_and_update();
            if self.in_flight.load(Ordering::SeqCst) > 0 {
                let _ = changed.changed().await;
                continue;
            }
            tokio::select! {
                () = tokio::time::sleep(grace) => {
                    if self.in_flight.load(Ordering::SeqCst) == 0 {
                        return;
                    }
                }
                _ = changed.changed() => {}
            }
        }
    }
}

/// Counts one request as in flight until dropped.
pub(super) struct InFlight(Arc<ConnState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.request_ended();
    }
}

/// The connection's IO, noting reads for [`ConnState::bytes_read`].
pub(super) struct Watched<T> {
    inner: T,
    state: Arc<ConnState>,
}

impl<T> Watched<T> {
    pub(super) fn new(inner: T, state: Arc<ConnState>) -> Self {
        Self { inner, state }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.state.bytes_read();
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// The connection's service: a tower service, with each request counted as
/// in flight until its response body is done.
pub(super) struct Tracked<S> {
    inner: S,
    state: Arc<ConnState>,
}

impl<S> Tracked<S> {
    pub(super) fn new(inner: S, state: Arc<ConnState>) -> Self {
        Self { inner, state }
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> hyper::service::Service<http::Request<Incoming>> for Tracked<S>
where
    S: tower::Service<http::Request<Incoming>, Response = http::Response<B>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Body + Send + 'static,
{
    type Response = http::Response<Guarded<B, InFlight>>;
    type Error = BoxError;
    type Future = BoxFuture<Result<Self::Response, BoxError>>;

    fn call(&self, req: http::Request<Incoming>) -> Self::Future {
        self.state.request_started(req.version());
        let guard = InFlight(self.state.clone());
        let mut service = self.inner.clone();
        Box::pin(async move {
            std::future::poll_fn(|cx| service.poll_ready(cx))
                .await
                .map_err(Into::into)?;
            let response = service.call(req).await.map_err(Into::into)?;
            Ok(response.map(|body| Guarded::new(body, guard)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> ConnLimits {
        ConnLimits {
            header_read_timeout: Some(Duration::from_secs(1)),
            idle_timeout: Some(Duration::from_secs(60)),
            ..ConnLimits::default()
        }
    }

    #[test]
    fn a_new_connection_has_the_header_read_deadline() {
        let state = ConnState::new();
        let (at, why) = state.deadline(&limits()).expect("a deadline");
        assert_eq!(at, 1000);
        assert!(why.contains("header-read"), "{why}");
        let no_header = ConnLimits {
            header_read_timeout: None,
            ..limits()
        };
        assert_eq!(state.deadline(&no_header).map(|d| d.0), Some(60_000));
    }

    #[test]
    fn an_idle_http1_connection_that_starts_a_head_gets_the_header_deadline() {
        let state = ConnState::new();
        state.request_started(http::Version::HTTP_11);
        // Bytes while a request is in flight start nothing.
        state.bytes_read();
        assert_eq!(state.head_started.load(Ordering::SeqCst), 0);
        state.request_ended();
        let (idle_at, why) = state.deadline(&limits()).expect("a deadline");
        assert!(why.contains("idle") && idle_at >= 60_000, "{why} {idle_at}");
        state.bytes_read();
        let (head_at, why) = state.deadline(&limits()).expect("a deadline");
        assert!(
            why.contains("header-read") && head_at < idle_at,
            "{why} {head_at}"
        );
    }

    #[test]
    fn http2_bytes_while_idle_do_not_start_a_head() {
        let state = ConnState::new();
        state.request_started(http::Version::HTTP_2);
        state.request_ended();
        state.bytes_read();
        let (_, why) = state.deadline(&limits()).expect("a deadline");
        assert_eq!(why, "idle timeout");
    }

    #[test]
    fn no_timeouts_no_deadline() {
        let state = ConnState::new();
        let off = ConnLimits {
            header_read_timeout: None,
            idle_timeout: None,
            ..limits()
        };
        assert_eq!(state.deadline(&off), None);
    }
}
