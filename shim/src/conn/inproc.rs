//! In-process connections from `gyre serve`'s own shim to its gRPC server:
//! each is an in-memory byte stream ([`tokio::io::duplex`]) carrying the
//! same HTTP/2 as a TCP connection would, served by the gRPC port's
//! [`super::serve_tls`] with the port's limits, keepalive and graceful
//! shutdown. Only the kernel's part goes: no loopback TCP sends, receives
//! and wakeups for every streamed token, and no TLS on the hop when the
//! ports use TLS (the bytes never leave the process).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use tokio::io::DuplexStream;
use tokio::sync::mpsc;

/// Bytes either direction of a connection buffers before its writer waits
/// (HTTP/2 flow control keeps what is in flight far below this).
const BUFFER: usize = 256 * 1024;

/// The server's end: connections the shim opened, not yet served.
pub type Incoming = mpsc::UnboundedReceiver<DuplexStream>;

/// A connector for tonic's channels (`Endpoint::connect_with_connector`):
/// each connection is a new in-memory stream whose other end goes to the
/// gRPC server's [`Incoming`].
#[derive(Clone, Debug)]
pub struct Connector {
    server: mpsc::UnboundedSender<DuplexStream>,
}

/// A connector and the server's end of its connections.
pub fn pair() -> (Connector, Incoming) {
    let (server, incoming) = mpsc::unbounded_channel();
    (Connector { server }, incoming)
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower::Service<http::Uri> for Connector {
    type Response = TokioIo<DuplexStream>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: http::Uri) -> Self::Future {
        let (client, server) = tokio::io::duplex(BUFFER);
        let sent = self.server.send(server);
        Box::pin(async move {
            sent.map_err(|_| "the gRPC server has stopped accepting connections")?;
            Ok(TokioIo::new(client))
        })
    }
}

#[cfg(test)]
mod tests {
    use tonic_health::ServingStatus;
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;

    use super::super::{ConnLimits, serve_tls};

    /// A tonic client reaches the gRPC server through in-process
    /// connections, served by `serve_tls` beside its TCP listener; after
    /// the server's shutdown a new connection is refused, not left hanging.
    #[tokio::test]
    async fn a_client_reaches_the_server_in_process() {
        let (connector, incoming) = super::pair();
        let (reporter, health) = tonic_health::server::health_reporter();
        reporter
            .set_service_status("", ServingStatus::Serving)
            .await;
        let routes = tonic::service::Routes::new(health);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_tls(
            listener,
            Some(incoming),
            routes,
            ConnLimits::default(),
            None,
            async {
                let _ = stopped.await;
            },
        ));
        let endpoint = tonic::transport::Endpoint::from_static("http://in-process");
        let pool = crate::pool::Pool::connect_lazy_with(&endpoint, 2, &connector);
        let mut client = HealthClient::new(pool);
        for _ in 0..3 {
            let call = client.check(HealthCheckRequest {
                service: String::new(),
            });
            let reply = tokio::time::timeout(std::time::Duration::from_secs(10), call)
                .await
                .expect("answered within 10 s")
                .expect("health check in process");
            assert_eq!(reply.into_inner().status, ServingStatus::Serving as i32);
        }
        drop(client);
        let _ = stop.send(());
        server.await.expect("server task");
        let refused =
            tower::ServiceExt::oneshot(connector, http::Uri::from_static("http://x")).await;
        assert!(refused.is_err(), "a connection after shutdown is refused");
    }
}
