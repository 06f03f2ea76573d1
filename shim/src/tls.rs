//! TLS (rustls with the ring provider) for both ports and for the shim's hop
//! to the service.
//!
//! - Serving: [`ServerTls::load`] reads `--tls-cert` (a PEM chain, leaf
//!   first) and `--tls-key` (a PEM PKCS#8, PKCS#1 or SEC1 key), and with
//!   `--tls-client-ca` (PEM roots) requires every client of that port to
//!   present a certificate chaining to one of them (mTLS). [`conn`] does the
//!   handshake on each accepted connection (ALPN `h2`, `http/1.1`).
//! - The shim's hop: [`Connector`] (gyre-api's, shared with the Rust
//!   client) is the tonic connector of the pool's channels when the service
//!   is reached over TLS; this module makes its rustls config. A standalone
//!   `gyre-shim` trusts the roots given with `--upstream-ca` and may present
//!   a client certificate (`--upstream-client-cert`/`-key`). The shim inside
//!   `gyre serve` needs no TLS: it reaches its gRPC server in process
//!   ([`crate::conn::inproc`]).
//!
//! [`conn`]: crate::conn

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

pub use gyre_api::tls::Connector;

/// Why TLS could not be set up; each names the flag and file at fault.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{flag} {path}: cannot read the file: {source}")]
    Read {
        flag: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{flag} {path}: no PEM certificate (-----BEGIN CERTIFICATE-----) in the file")]
    NoCertificate { flag: &'static str, path: PathBuf },
    #[error("{flag} {path}: not valid PEM: {detail}")]
    BadPem {
        flag: &'static str,
        path: PathBuf,
        detail: String,
    },
    #[error("{flag} {path}: no PEM private key (PKCS#8, PKCS#1 or SEC1) in the file: {detail}")]
    NoKey {
        flag: &'static str,
        path: PathBuf,
        detail: String,
    },
    #[error("{what}: {source}")]
    Rustls {
        what: &'static str,
        source: rustls::Error,
    },
    #[error("--tls-client-ca {path}: {detail}")]
    ClientCa { path: PathBuf, detail: String },
    #[error("{0} needs {1} too")]
    Missing(&'static str, &'static str),
}

/// `--tls-cert` and `--tls-key`: serve the port over TLS (HTTPS).
#[derive(Debug, Clone, clap::Args)]
pub struct TlsArgs {
    /// PEM certificate chain (leaf first) to serve TLS with: HTTPS on the
    /// HTTP port, TLS on the gRPC port. Needs --tls-key.
    #[arg(long, env = "GYRE_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1) of --tls-cert.
    #[arg(long, env = "GYRE_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

/// The ring provider, the one crypto provider compiled in.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        flag,
        path: path.to_owned(),
        source,
    })
}

/// Every certificate in a PEM file (at least one).
pub fn load_certs(
    flag: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(flag, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::BadPem {
            flag,
            path: path.to_owned(),
            detail: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            flag,
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

/// The first private key in a PEM file.
pub fn load_key(flag: &'static str, path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read(flag, path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| TlsError::NoKey {
        flag,
        path: path.to_owned(),
        detail: e.to_string(),
    })
}

/// A certificate chain and its key.
pub struct Identity {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
}

impl Clone for Identity {
    fn clone(&self) -> Self {
        Self {
            chain: self.chain.clone(),
            key: self.key.clone_key(),
        }
    }
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Identity")
            .field("chain", &self.chain.len())
            .finish_non_exhaustive()
    }
}

impl Identity {
    /// Reads `cert_flag`'s chain and `key_flag`'s key.
    pub fn load(
        (cert_flag, cert): (&'static str, &Path),
        (key_flag, key): (&'static str, &Path),
    ) -> Result<Self, TlsError> {
        Ok(Self {
            chain: load_certs(cert_flag, cert)?,
            key: load_key(key_flag, key)?,
        })
    }
}

/// The TLS of a server's ports: its identity and, for mTLS, the client
/// CA's roots.
#[derive(Clone, Debug)]
pub struct ServerTls {
    pub identity: Identity,
    pub client_ca: Option<(PathBuf, Vec<CertificateDer<'static>>)>,
}

impl ServerTls {
    /// `--tls-cert` and `--tls-key`, optionally `--tls-client-ca`: `None`
    /// when none is given. Both acceptors are built once here, so a key
    /// that does not fit the certificate fails the start.
    pub fn from_flags(
        cert: Option<&Path>,
        key: Option<&Path>,
        client_ca: Option<&Path>,
    ) -> Result<Option<Self>, TlsError> {
        let (cert, key) = match (cert, key) {
            (Some(c), Some(k)) => (c, k),
            (None, None) if client_ca.is_none() => return Ok(None),
            (Some(_), None) => return Err(TlsError::Missing("--tls-cert", "--tls-key")),
            (None, Some(_)) => return Err(TlsError::Missing("--tls-key", "--tls-cert")),
            (None, None) => {
                return Err(TlsError::Missing(
                    "--tls-client-ca",
                    "--tls-cert and --tls-key",
                ));
            }
        };
        let identity = Identity::load(("--tls-cert", cert), ("--tls-key", key))?;
        let client_ca = client_ca
            .map(|p| load_certs("--tls-client-ca", p).map(|c| (p.to_owned(), c)))
            .transpose()?;
        let tls = Self {
            identity,
            client_ca,
        };
        tls.acceptor(false)?;
        tls.acceptor(true)?;
        Ok(Some(tls))
    }

    /// The acceptor for [`crate::conn::serve_tls`]; with `verify_clients`
    /// and a client CA, a client certificate is required (the gRPC port).
    pub fn acceptor(&self, verify_clients: bool) -> Result<tokio_rustls::TlsAcceptor, TlsError> {
        let rustls_err = |what| move |source| TlsError::Rustls { what, source };
        let builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(rustls_err("TLS protocol versions"))?;
        let builder = match (&self.client_ca, verify_clients) {
            (Some((path, roots)), true) => {
                let bad = |detail: String| TlsError::ClientCa {
                    path: path.to_owned(),
                    detail,
                };
                let mut store = RootCertStore::empty();
                for cert in roots {
                    store.add(cert.clone()).map_err(|e| bad(e.to_string()))?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(store), provider())
                        .build()
                        .map_err(|e| bad(e.to_string()))?;
                builder.with_client_cert_verifier(verifier)
            }
            _ => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(self.identity.chain.clone(), self.identity.key.clone_key())
            .map_err(rustls_err(
                "--tls-cert and --tls-key do not make a usable certificate and key",
            ))?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
    }
}

/// A client config trusting `roots` (a standalone shim's `--upstream-ca`),
/// presenting `identity` when given.
pub fn upstream_client(
    roots: Vec<CertificateDer<'static>>,
    identity: Option<&Identity>,
) -> Result<Arc<ClientConfig>, TlsError> {
    let mut store = RootCertStore::empty();
    for cert in roots {
        store.add(cert).map_err(|source| TlsError::Rustls {
            what: "--upstream-ca",
            source,
        })?;
    }
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|source| TlsError::Rustls {
            what: "TLS protocol versions",
            source,
        })?
        .with_root_certificates(store);
    client_config(builder, identity)
}

fn client_config(
    builder: rustls::ConfigBuilder<ClientConfig, rustls::client::WantsClientCert>,
    identity: Option<&Identity>,
) -> Result<Arc<ClientConfig>, TlsError> {
    let mut config = match identity {
        Some(id) => builder
            .with_client_auth_cert(id.chain.clone(), id.key.clone_key())
            .map_err(|source| TlsError::Rustls {
                what: "the client certificate and key",
                source,
            })?,
        None => builder.with_no_client_auth(),
    };
    // gRPC is HTTP/2 only.
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}
