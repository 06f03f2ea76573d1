//! The shim's connections to the gRPC service: a small pool of lazily
//! connected tonic [`Channel`]s (each its own HTTP/2 connection), used as one
//! tower service by the generated clients.
//!
//! Each call goes to the channel with the fewest calls in flight (ties taken
//! in turn); a call counts until its response body is done or dropped, so a
//! long generation stream counts for its whole life, not only until its
//! response headers. Why a pool and not one connection: a connection-level
//! failure (a protocol error, a GOAWAY, a reset TCP connection) ends every
//! stream on that connection, so with N connections one such failure ends
//! about 1/N of the streams in flight; the service's per-connection stream
//! limit (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS, 200 by default in hyper)
//! caps calls in flight per connection, beyond which calls wait in the shim;
//! and one TCP connection's loss or slow window stalls all of its streams.
//! The cost is N TCP connections and their keepalive pings. See
//! docs/ARCHITECTURE.md.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use tonic::transport::{Channel, Endpoint};

use crate::guarded::Guarded;

/// Default number of HTTP/2 connections to the service.
pub const DEFAULT_CONNECTIONS: u16 = 4;

struct Slot {
    channel: Channel,
    /// Calls in flight on this channel.
    load: Arc<AtomicUsize>,
}

/// Several channels used as one (see the module docs). Cheap to clone.
#[derive(Clone)]
pub struct Pool {
    slots: Arc<[Slot]>,
    next: Arc<AtomicUsize>,
}

impl Pool {
    /// A pool of `n` (at least one) lazily connected channels to `endpoint`.
    pub fn connect_lazy(endpoint: &Endpoint, n: usize) -> Self {
        let slots: Vec<Slot> = (0..n.max(1))
            .map(|_| Slot {
                channel: endpoint.connect_lazy(),
                load: Arc::new(AtomicUsize::new(0)),
            })
            .collect();
        Self {
            slots: slots.into(),
            next: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// [`Pool::connect_lazy`] through `connector` (a TLS connector, or
    /// [`crate::conn::inproc::Connector`]'s in-process connections).
    pub fn connect_lazy_with<C>(endpoint: &Endpoint, n: usize, connector: &C) -> Self
    where
        C: tower::Service<http::Uri> + Clone + Send + 'static,
        C::Response: hyper::rt::Read + hyper::rt::Write + Send + Unpin,
        C::Future: Send,
        Box<dyn std::error::Error + Send + Sync>: From<C::Error>,
    {
        let slots: Vec<Slot> = (0..n.max(1))
            .map(|_| Slot {
                channel: endpoint.connect_with_connector_lazy(connector.clone()),
                load: Arc::new(AtomicUsize::new(0)),
            })
            .collect();
        Self {
            slots: slots.into(),
            next: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Calls in flight on each channel.
    pub fn loads(&self) -> Vec<usize> {
        self.slots
            .iter()
            .map(|s| s.load.load(Ordering::SeqCst))
            .collect()
    }

    /// The index of the least-loaded channel, ties taken in turn.
    fn pick(&self) -> usize {
        let n = self.slots.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        (0..n)
            .map(|i| (start + i) % n)
            .min_by_key(|&i| self.slots[i].load.load(Ordering::SeqCst))
            .unwrap_or(0)
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl tower::Service<http::Request<tonic::body::Body>> for Pool {
    type Response = http::Response<Counted>;
    type Error = tonic::transport::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Readiness is the chosen channel's, awaited in `call`.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        // Never empty (see `connect_lazy`), and `pick` is in range.
        let slot = &self.slots[self.pick()];
        slot.load.fetch_add(1, Ordering::SeqCst);
        let guard = LoadGuard(slot.load.clone());
        let mut channel = slot.channel.clone();
        Box::pin(async move {
            std::future::poll_fn(|cx| channel.poll_ready(cx)).await?;
            let response = channel.call(req).await?;
            Ok(response.map(|body| Guarded::new(body, guard)))
        })
    }
}

/// Counts one call in flight on a channel until dropped.
pub struct LoadGuard(Arc<AtomicUsize>);

impl Drop for LoadGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A response body that keeps its call counted until done or dropped.
pub type Counted = Guarded<tonic::body::Body, LoadGuard>;

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn calls_go_to_the_least_loaded_channel_in_turn() {
        let endpoint = tonic::transport::Endpoint::from_static("http://127.0.0.1:9");
        let pool = Pool::connect_lazy(&endpoint, 3);
        // Ties are taken in turn.
        let picks: Vec<usize> = (0..3).map(|_| pool.pick()).collect();
        let mut sorted = picks.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, vec![0, 1, 2], "{picks:?}");
        // A loaded channel is avoided until the others are as loaded.
        let loads: Vec<_> = pool.slots.iter().map(|s| s.load.clone()).collect();
        loads[0].store(2, Ordering::SeqCst);
        loads[1].store(1, Ordering::SeqCst);
        assert_eq!(pool.pick(), 2);
        loads[2].store(1, Ordering::SeqCst);
        assert!([1, 2].contains(&pool.pick()));
        assert_eq!(pool.loads(), vec![2, 1, 1]);
    }

    #[test]
    fn a_guard_counts_until_dropped() {
        let load = Arc::new(AtomicUsize::new(1));
        let guard = LoadGuard(load.clone());
        assert_eq!(load.load(Ordering::SeqCst), 1);
        drop(guard);
        assert_eq!(load.load(Ordering::SeqCst), 0);
    }
}
