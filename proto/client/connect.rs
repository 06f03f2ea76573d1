//! Connection settings: the API-key interceptor ([`ApiKey`]), TLS
//! ([`Tls`], rustls through [`crate::tls::Connector`]) and the [`Builder`].

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::transport::Endpoint;

use crate::tls::Connector;

use super::*;

/// The interceptor that adds `authorization: Bearer <key>` to every call
/// (nothing without a key).
#[derive(Clone, Default)]
pub struct ApiKey(Option<MetadataValue<Ascii>>);

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the key.
        f.write_str(if self.0.is_some() {
            "ApiKey(set)"
        } else {
            "ApiKey(none)"
        })
    }
}

impl ApiKey {
    /// The metadata value of `key`; a key that is empty or holds anything but
    /// printable ASCII (spaces, control characters, non-ASCII) is refused.
    pub fn new(key: &str) -> Result<Self> {
        if key.is_empty() {
            return Err(Error::Config("the API key is empty".into()));
        }
        let refused = || {
            Error::Config(
                "the API key holds characters other than printable ASCII (no spaces), which a \
                 bearer token in gRPC metadata cannot carry"
                    .into(),
            )
        };
        if !key.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(refused());
        }
        let mut value: MetadataValue<Ascii> =
            format!("Bearer {key}").parse().map_err(|_| refused())?;
        value.set_sensitive(true);
        Ok(Self(Some(value)))
    }
}

impl Interceptor for ApiKey {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// TLS settings: the CA certificate(s) that verify the server, and
/// optionally a client certificate and key (mTLS) and the name to verify
/// the server's certificate against.
#[derive(Clone, Default)]
pub struct Tls {
    ca_pem: Vec<u8>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
    domain: Option<String>,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("ca_pem_bytes", &self.ca_pem.len())
            .field("client_identity", &self.identity.is_some())
            .field("domain", &self.domain)
            .finish()
    }
}

fn read_file(what: &str, path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| Error::Config(format!("{what} {}: {e}", path.display())))
}

impl Tls {
    /// Trust the CA certificate(s) in `ca_pem` (PEM).
    pub fn new(ca_pem: impl Into<Vec<u8>>) -> Self {
        Self {
            ca_pem: ca_pem.into(),
            ..Self::default()
        }
    }

    /// Trust the CA certificate(s) in the PEM file at `path`.
    pub fn ca_file(path: impl AsRef<Path>) -> Result<Self> {
        Ok(Self::new(read_file("CA certificate", path.as_ref())?))
    }

    /// Present this client certificate (PEM chain) and key (PEM) to servers
    /// that require one (mTLS).
    pub fn identity(mut self, cert_pem: impl Into<Vec<u8>>, key_pem: impl Into<Vec<u8>>) -> Self {
        self.identity = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// [`Tls::identity`] read from PEM files.
    pub fn identity_files(self, cert: impl AsRef<Path>, key: impl AsRef<Path>) -> Result<Self> {
        let cert = read_file("client certificate", cert.as_ref())?;
        let key = read_file("client key", key.as_ref())?;
        Ok(self.identity(cert, key))
    }

    /// Verify the server's certificate for `name` instead of the URL's host.
    pub fn domain_name(mut self, name: impl Into<String>) -> Self {
        self.domain = Some(name.into());
        self
    }

    /// The connector doing the TLS handshake with these settings (rustls
    /// with the ring provider, ALPN `h2`). gyre leaves tonic's own TLS off:
    /// see [`crate::tls`].
    fn connector(&self) -> Result<Connector> {
        let mut roots = RootCertStore::empty();
        for cert in pem_certs("the CA certificate", &self.ca_pem)? {
            roots
                .add(cert)
                .map_err(|e| Error::Config(format!("the CA certificate: {e}")))?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Config(format!("TLS protocol versions: {e}")))?
            .with_root_certificates(roots);
        let mut config = match &self.identity {
            Some((cert, key)) => {
                let chain = pem_certs("the client certificate", cert)?;
                let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| {
                    Error::Config(format!(
                        "the client key: no PEM private key (PKCS#8, PKCS#1 or SEC1): {e}"
                    ))
                })?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| Error::Config(format!("the client certificate and key: {e}")))?
            }
            None => builder.with_no_client_auth(),
        };
        // gRPC is HTTP/2 only.
        config.alpn_protocols = vec![b"h2".to_vec()];
        let mut connector = Connector::new(Arc::new(config));
        if let Some(domain) = &self.domain {
            let name = ServerName::try_from(domain.clone()).map_err(|e| {
                Error::Config(format!("TLS domain name `{}`: {e}", crate::clip(domain)))
            })?;
            connector = connector.server_name(name);
        }
        Ok(connector)
    }
}

/// Every certificate in `pem` (at least one); `what` names it in errors.
fn pem_certs(what: &str, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Error::Config(format!("{what} is not valid PEM: {e}")))?;
    if certs.is_empty() {
        return Err(Error::Config(format!(
            "{what} is not PEM (no `-----BEGIN CERTIFICATE-----`)"
        )));
    }
    Ok(certs)
}

/// How to connect: start with [`Client::builder`] (or
/// [`Builder::from_env`]), end with [`Builder::connect`].
#[derive(Clone)]
pub struct Builder {
    url: String,
    api_key: Option<String>,
    tls: Option<Tls>,
    connect_timeout: Option<Duration>,
    timeout: Option<Duration>,
}

impl fmt::Debug for Builder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the key.
        f.debug_struct("Builder")
            .field("url", &self.url)
            .field("api_key", &self.api_key.as_ref().map(|_| "(set)"))
            .field("tls", &self.tls)
            .field("connect_timeout", &self.connect_timeout)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl Builder {
    /// Settings for the server at `url`: `http://host:port`, `https://...`
    /// (needs [`Builder::tls`]), or `host:port` (http, or https when TLS is
    /// set).
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            api_key: None,
            tls: None,
            connect_timeout: Some(Duration::from_secs(10)),
            timeout: None,
        }
    }

    /// Settings from the environment, as the examples use them: `GYRE_URL`
    /// (default [`DEFAULT_URL`]), `GYRE_API_KEY`, and for TLS `GYRE_CA_CERT`
    /// (a PEM file; turns TLS on), `GYRE_CLIENT_CERT` and `GYRE_CLIENT_KEY`
    /// (mTLS), `GYRE_TLS_DOMAIN`. Empty variables count as unset.
    pub fn from_env() -> Result<Self> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let mut builder = Self::new(var("GYRE_URL").unwrap_or_else(|| DEFAULT_URL.to_string()));
        if let Some(key) = var("GYRE_API_KEY") {
            builder = builder.api_key(key);
        }
        match (
            var("GYRE_CA_CERT"),
            var("GYRE_CLIENT_CERT"),
            var("GYRE_CLIENT_KEY"),
        ) {
            (None, None, None) => {}
            (None, _, _) => {
                return Err(Error::Config(
                    "GYRE_CLIENT_CERT and GYRE_CLIENT_KEY need GYRE_CA_CERT".into(),
                ));
            }
            (Some(ca), cert, key) => {
                let mut tls = Tls::ca_file(ca)?;
                match (cert, key) {
                    (Some(cert), Some(key)) => tls = tls.identity_files(cert, key)?,
                    (None, None) => {}
                    _ => {
                        return Err(Error::Config(
                            "GYRE_CLIENT_CERT and GYRE_CLIENT_KEY go together".into(),
                        ));
                    }
                }
                if let Some(domain) = var("GYRE_TLS_DOMAIN") {
                    tls = tls.domain_name(domain);
                }
                builder = builder.tls(tls);
            }
        }
        Ok(builder)
    }

    /// Send `authorization: Bearer <key>` on every call.
    pub fn api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(key.into());
        self
    }

    /// Connect over TLS.
    pub fn tls(mut self, tls: Tls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Give up connecting after this long (default 10 s; `None`: never).
    pub fn connect_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The deadline of every call (sent as `grpc-timeout`): it bounds a
    /// whole stream, including a [`Session`]; when it passes, the server
    /// cancels what is still running and the call ends with
    /// DEADLINE_EXCEEDED. Default: none.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The endpoint these settings describe and, for https, the connector
    /// that does its TLS; no connection is made.
    pub(super) fn endpoint(&self) -> Result<(Endpoint, Option<Connector>)> {
        let url = self.url.trim();
        let url = if url.contains("://") {
            url.to_string()
        } else if self.tls.is_some() {
            format!("https://{url}")
        } else {
            format!("http://{url}")
        };
        let mut endpoint = Endpoint::from_shared(url.clone())
            .map_err(|e| Error::Config(format!("bad server URL `{}`: {}", crate::clip(&url), e)))?;
        let connector = match (endpoint.uri().scheme_str(), &self.tls) {
            (Some("http"), None) => None,
            (Some("https"), Some(tls)) => Some(tls.connector()?),
            (Some("https"), None) => {
                return Err(Error::Config(format!(
                    "`{}` is https: give the CA certificate that verifies the server (Builder::tls)",
                    crate::clip(&url)
                )));
            }
            (Some("http"), Some(_)) => {
                return Err(Error::Config(format!(
                    "TLS settings given for the plain-text URL `{}`: use https://",
                    crate::clip(&url)
                )));
            }
            (scheme, _) => {
                return Err(Error::Config(format!(
                    "the server URL's scheme is {:?}, not http or https",
                    scheme.unwrap_or("")
                )));
            }
        };
        if let Some(t) = self.connect_timeout {
            endpoint = endpoint.connect_timeout(t);
        }
        Ok((endpoint, connector))
    }

    /// Connects (TCP, and the TLS handshake with TLS). Fails with
    /// [`Error::Config`] for unusable settings and [`Error::Connect`] when
    /// the server cannot be reached.
    pub async fn connect(self) -> Result<Client> {
        let key = match &self.api_key {
            Some(k) => ApiKey::new(k)?,
            None => ApiKey::default(),
        };
        let (endpoint, tls) = self.endpoint()?;
        let connected = match tls {
            Some(connector) => endpoint.connect_with_connector(connector).await,
            None => endpoint.connect().await,
        };
        let channel = connected.map_err(|e| Error::Connect(error_chain(&e)))?;
        Ok(Client::from_channel(channel, key, self.timeout))
    }
}
