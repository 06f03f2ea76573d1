//! The TLS connector of gyre's gRPC clients (feature `tls`): TCP, then a
//! rustls handshake, handed to tonic's `Endpoint::connect_with_connector`.
//!
//! gyre never turns on tonic's own TLS features (`tls-ring`, ...). Cargo
//! unifies features across a workspace, and with them on, tonic refuses an
//! `https://` endpoint that reaches it through a custom connector without
//! tonic's TLS config ("Connecting to HTTPS without TLS enabled"), which is
//! how the shim reaches a TLS gRPC port. So every TLS client in gyre (the
//! shim's upstream pool, `gyre chat`/`gyre models --tls-ca`, and
//! [`crate::client`]) connects through this one [`Connector`], and the
//! caller owns the rustls [`ClientConfig`] (roots, client certificate,
//! ALPN `h2`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tonic::transport::Uri;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What a [`Connector`] yields: the TLS stream, in hyper's I/O traits.
pub type Connection = TokioIo<TlsStream<TcpStream>>;

/// A `tower::Service<Uri>` for `Endpoint::connect_with_connector`: connects
/// to the URI's host and port (443 when none), then does the TLS handshake
/// with its config, verifying the server's certificate for the URI's host
/// or for the name set with [`Connector::server_name`].
#[derive(Clone)]
pub struct Connector {
    config: Arc<ClientConfig>,
    server_name: Option<ServerName<'static>>,
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector")
            .field("alpn", &self.config.alpn_protocols)
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl Connector {
    /// Connects with `config` (gRPC needs `alpn_protocols = [b"h2"]`).
    pub fn new(config: Arc<ClientConfig>) -> Self {
        Self {
            config,
            server_name: None,
        }
    }

    /// Verify the server's certificate for `name` (and send it as SNI)
    /// instead of the URI's host.
    pub fn server_name(mut self, name: ServerName<'static>) -> Self {
        self.server_name = Some(name);
        self
    }
}

/// The host of `uri` as a TLS server name: a DNS name, or an IP address
/// (brackets of an IPv6 literal removed).
fn host_of(uri: &Uri) -> Result<(String, ServerName<'static>), BoxError> {
    let host = uri
        .host()
        .ok_or("the gRPC endpoint has no host")?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let name = ServerName::try_from(host.clone())
        .map_err(|e| format!("`{host}` is not a TLS server name: {e}"))?;
    Ok((host, name))
}

impl tower_service::Service<Uri> for Connector {
    type Response = Connection;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Connection, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connector = tokio_rustls::TlsConnector::from(self.config.clone());
        let server_name = self.server_name.clone();
        Box::pin(async move {
            let (host, name) = host_of(&uri)?;
            let port = uri.port_u16().unwrap_or(443);
            let tcp = TcpStream::connect((host.as_str(), port)).await?;
            tcp.set_nodelay(true)?;
            let tls = connector.connect(server_name.unwrap_or(name), tcp).await?;
            Ok(TokioIo::new(tls))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(uri: &str) -> String {
        let uri: Uri = uri.parse().expect("a URI");
        match host_of(&uri) {
            Ok((host, name)) => format!("{host} {name:?}"),
            Err(e) => format!("error: {e}"),
        }
    }

    #[test]
    fn the_server_name_is_the_uri_host() {
        assert_eq!(
            name("https://gyre.example:50051"),
            r#"gyre.example DnsName("gyre.example")"#
        );
        assert_eq!(
            name("https://127.0.0.1:50051"),
            "127.0.0.1 IpAddress(V4(Ipv4Addr([127, 0, 0, 1])))"
        );
        assert!(name("https://[::1]:50051").starts_with("::1 IpAddress(V6("));
        assert_eq!(name("/no/host"), "error: the gRPC endpoint has no host");
    }
}
