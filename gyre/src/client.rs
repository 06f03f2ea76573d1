//! How `gyre chat` and `gyre models` reach a running server: its gRPC API
//! (`--grpc`, the default) through the generated client, or its OpenAI HTTP
//! API (`--url`) through a plain HTTP/1.1 client (JSON, and Server-Sent
//! Events for a streamed chat).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use clap::Args;
use gyre_api::v1;
use gyre_api::v1::generation_client::GenerationClient;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tonic::transport::{Channel, Endpoint};

/// The gRPC address used when neither --grpc nor --url is given.
pub const DEFAULT_GRPC: &str = "http://127.0.0.1:50051";

const HEADING: &str = "Server";

/// How long connecting may take before the server counts as not there.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the server is (flags shared by `gyre chat` and `gyre models`).
#[derive(Args, Debug, Clone)]
pub struct ServerArgs {
    /// The gRPC API of a running gyre (`gyre serve`, `gyre grpc`). Default:
    /// http://127.0.0.1:50051 (gyre serve's own default).
    #[arg(long, help_heading = HEADING, conflicts_with = "url")]
    pub grpc: Option<String>,
    /// Use the OpenAI HTTP API of a running gyre instead (`gyre serve` or
    /// `gyre-shim`), e.g. http://127.0.0.1:8000 (a trailing /v1 is fine).
    /// Plain http only.
    #[arg(long, help_heading = HEADING)]
    pub url: Option<String>,
    /// The server's API key (sent as `authorization: Bearer <key>`).
    #[arg(long, env = "GYRE_API_KEY", hide_env_values = true, help_heading = HEADING)]
    pub api_key: Option<String>,
    /// PEM CA certificate(s) the server's certificate chains to, for an
    /// https:// --grpc address.
    #[arg(long, help_heading = HEADING)]
    pub tls_ca: Option<PathBuf>,
}

/// A connected server, over either API.
pub enum Server {
    Grpc {
        client: GenerationClient<Channel>,
        url: String,
        api_key: Option<String>,
    },
    Http {
        base: HttpBase,
        api_key: Option<String>,
    },
}

impl Server {
    /// Connects as `args` say (checking that the server answers).
    pub async fn connect(args: &ServerArgs) -> anyhow::Result<Self> {
        if let Some(url) = &args.url {
            if args.tls_ca.is_some() {
                anyhow::bail!("--tls-ca applies to an https:// --grpc address, not to --url");
            }
            return Ok(Self::Http {
                base: HttpBase::parse(url)?,
                api_key: args.api_key.clone(),
            });
        }
        let url = with_scheme(args.grpc.as_deref().unwrap_or(DEFAULT_GRPC));
        let channel = grpc_channel(&url, args.tls_ca.as_deref()).await?;
        Ok(Self::Grpc {
            client: GenerationClient::new(channel),
            url,
            api_key: args.api_key.clone(),
        })
    }

    /// The server's address as given.
    pub fn describe(&self) -> String {
        match self {
            Self::Grpc { url, .. } => format!("gRPC {url}"),
            Self::Http { base, .. } => format!("HTTP {}", base.url),
        }
    }

    /// The catalogue, as the OpenAI API's model objects (gyre's fields
    /// included; over gRPC also `architecture` and `vocab_size`).
    pub async fn list_models(&mut self) -> anyhow::Result<Vec<Value>> {
        match self {
            Self::Grpc {
                client,
                url,
                api_key,
            } => {
                let request = grpc_request(v1::ListModelsRequest {}, api_key.as_deref())?;
                let models = client
                    .list_models(request)
                    .await
                    .map_err(|s| status_error(url, &s))?
                    .into_inner()
                    .models;
                models
                    .into_iter()
                    .map(|m| {
                        let (architecture, vocab_size) = (m.architecture.clone(), m.vocab_size);
                        let mut object = serde_json::to_value(
                            gyre_shim::openai::response::ModelObject::from(m),
                        )?;
                        object["architecture"] = Value::from(architecture);
                        object["vocab_size"] = Value::from(vocab_size);
                        Ok(object)
                    })
                    .collect()
            }
            Self::Http { base, api_key } => {
                let list = base.get_json("/v1/models", api_key.as_deref()).await?;
                match list.get("data") {
                    Some(Value::Array(data)) => Ok(data.clone()),
                    _ => anyhow::bail!(
                        "{}/v1/models did not answer with a model list: {}",
                        base.url,
                        clip(&list.to_string())
                    ),
                }
            }
        }
    }
}

/// The end of a client command: an error is one line on stderr and exit
/// status 1 (no backtrace, whatever RUST_BACKTRACE says).
pub fn finish(result: anyhow::Result<()>) -> anyhow::Result<()> {
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
    Ok(())
}

/// `url` with `http://` in front when it has no scheme (`127.0.0.1:50051`).
pub fn with_scheme(url: &str) -> String {
    if url.contains("://") {
        url.to_owned()
    } else {
        format!("http://{url}")
    }
}

/// A channel to the gRPC API at `url`, connected (so that a server that is
/// not there is an error here).
pub async fn grpc_channel(url: &str, tls_ca: Option<&Path>) -> anyhow::Result<Channel> {
    let endpoint = Endpoint::from_shared(url.to_owned())
        .map_err(|e| anyhow::anyhow!("invalid gRPC address {url:?}: {}", chain(&e)))?
        .connect_timeout(CONNECT_TIMEOUT);
    let connected = if url.starts_with("https://") {
        let ca = tls_ca.with_context(|| {
            format!("{url} is https: give the CA its certificate chains to with --tls-ca")
        })?;
        let roots = gyre_shim::tls::load_certs("--tls-ca", ca)?;
        let config = gyre_shim::tls::upstream_client(roots, None)?;
        endpoint
            .connect_with_connector(gyre_shim::tls::Connector::new(config))
            .await
    } else if url.starts_with("http://") {
        endpoint.connect().await
    } else {
        anyhow::bail!("gRPC address {url:?}: the scheme must be http:// or https://");
    };
    connected
        .map_err(|e| anyhow::anyhow!("cannot connect to gyre's gRPC API at {url}: {}", chain(&e)))
}

/// `message` with the API key, when there is one, as `authorization`.
pub fn grpc_request<T>(message: T, api_key: Option<&str>) -> anyhow::Result<tonic::Request<T>> {
    let mut request = tonic::Request::new(message);
    if let Some(key) = api_key {
        let mut value = tonic::metadata::AsciiMetadataValue::try_from(format!("Bearer {key}"))
            .context("the API key must be printable ASCII")?;
        value.set_sensitive(true);
        request.metadata_mut().insert("authorization", value);
    }
    Ok(request)
}

/// A gRPC error status as one line.
pub fn status_error(url: &str, status: &tonic::Status) -> anyhow::Error {
    let message = if status.message().is_empty() {
        chain(status)
    } else {
        status.message().to_owned()
    };
    anyhow::anyhow!("{url}: {:?}: {message}", status.code())
}

/// An error and its sources, `: `-separated (tonic's transport errors say
/// little at the top).
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = s.source();
    }
    parts.join(": ")
}

fn clip(s: &str) -> String {
    gyre_api::clip(s).into_owned()
}

/// The OpenAI HTTP API's base: `http://host:port` plus a path prefix.
#[derive(Debug, Clone)]
pub struct HttpBase {
    /// As given (for messages).
    pub url: String,
    /// `host:port`, to connect to and to send as `Host`.
    authority: String,
    /// The path before `/v1/...` (empty, or e.g. `/gyre`).
    prefix: String,
}

impl HttpBase {
    /// `http://host[:port][/prefix][/v1]`.
    pub fn parse(url: &str) -> anyhow::Result<Self> {
        let full = with_scheme(url);
        let uri: http::Uri = full
            .parse()
            .map_err(|e| anyhow::anyhow!("invalid --url {url:?}: {e}"))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => anyhow::bail!(
                "--url {url}: https is not supported by this client; use --grpc (with --tls-ca) for a TLS server"
            ),
            _ => anyhow::bail!("--url {url}: the scheme must be http://"),
        }
        let authority = uri
            .authority()
            .with_context(|| format!("--url {url}: no host"))?;
        let authority = match authority.port_u16() {
            Some(_) => authority.to_string(),
            None => format!("{}:80", authority.host()),
        };
        let path = uri.path().trim_end_matches('/');
        let prefix = path.strip_suffix("/v1").unwrap_or(path).to_owned();
        Ok(Self {
            url: url.trim_end_matches('/').to_owned(),
            authority,
            prefix,
        })
    }

    /// Sends one request on a connection of its own; the connection's task
    /// is aborted (closing it) when the returned guard is dropped.
    pub async fn send(
        &self,
        method: http::Method,
        path: &str,
        body: Option<&Value>,
        api_key: Option<&str>,
    ) -> anyhow::Result<(http::Response<Incoming>, Connection)> {
        let tcp = tokio::time::timeout(
            CONNECT_TIMEOUT,
            tokio::net::TcpStream::connect(&self.authority),
        )
        .await
        .map_err(|_| anyhow::anyhow!("cannot connect to {}: timed out", self.url))?
        .map_err(|e| anyhow::anyhow!("cannot connect to {}: {e}", self.url))?;
        let _ = tcp.set_nodelay(true);
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(|e| anyhow::anyhow!("{}: {}", self.url, chain(&e)))?;
        let task = Connection(tokio::spawn(async move {
            let _ = conn.await;
        }));
        let mut request = http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.prefix))
            .header(http::header::HOST, &self.authority)
            .header(http::header::ACCEPT, "application/json, text/event-stream");
        if let Some(key) = api_key {
            request = request.header(http::header::AUTHORIZATION, format!("Bearer {key}"));
        }
        let payload = match body {
            Some(b) => {
                request = request.header(http::header::CONTENT_TYPE, "application/json");
                Bytes::from(serde_json::to_vec(b)?)
            }
            None => Bytes::new(),
        };
        let request = request
            .body(Full::new(payload))
            .context("cannot build the HTTP request")?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| anyhow::anyhow!("{}{path}: {}", self.url, chain(&e)))?;
        Ok((response, task))
    }

    /// GETs `path` and reads its JSON answer (an error for a status that
    /// is not 2xx, with the API's message).
    pub async fn get_json(&self, path: &str, api_key: Option<&str>) -> anyhow::Result<Value> {
        let (response, _conn) = self.send(http::Method::GET, path, None, api_key).await?;
        let status = response.status();
        let bytes = read_body(response.into_body()).await?;
        if !status.is_success() {
            return Err(self.http_error(path, status, &bytes));
        }
        serde_json::from_slice(&bytes)
            .map_err(|e| anyhow::anyhow!("{}{path}: the answer is not JSON: {e}", self.url))
    }

    /// An error answer as one line: the status and the API's message.
    pub fn http_error(&self, path: &str, status: http::StatusCode, body: &[u8]) -> anyhow::Error {
        let message = serde_json::from_slice::<Value>(body)
            .ok()
            .and_then(|v| {
                v.pointer("/error/message")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            })
            .unwrap_or_else(|| clip(String::from_utf8_lossy(body).trim()));
        anyhow::anyhow!("{}{path}: HTTP {status}: {message}", self.url)
    }
}

/// The whole body.
pub async fn read_body(body: Incoming) -> anyhow::Result<Bytes> {
    Ok(body
        .collect()
        .await
        .map_err(|e| anyhow::anyhow!("reading the answer: {}", chain(&e)))?
        .to_bytes())
}

/// An HTTP connection's task: aborted (the socket closed) when dropped.
pub struct Connection(tokio::task::JoinHandle<()>);

impl Drop for Connection {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Splits a Server-Sent Events body into its events' data.
#[derive(Default)]
pub struct SseReader {
    buffer: Vec<u8>,
    data: Vec<String>,
}

impl SseReader {
    /// Feeds bytes; returns the data of each event they complete.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        self.buffer.extend_from_slice(bytes);
        let mut events = Vec::new();
        while let Some(end) = self.buffer.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.buffer.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            let line = line.trim_end_matches(['\n', '\r']);
            if line.is_empty() {
                if !self.data.is_empty() {
                    events.push(self.data.join("\n"));
                    self.data.clear();
                }
            } else if let Some(value) = line.strip_prefix("data:") {
                self.data
                    .push(value.strip_prefix(' ').unwrap_or(value).to_owned());
            }
            // Comments (`: keep-alive`), `event:`, `id:` and `retry:` lines
            // carry nothing this client needs.
        }
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_bases_take_a_port_a_prefix_and_v1() {
        let b = HttpBase::parse("http://127.0.0.1:8000/v1/").expect("parses");
        assert_eq!(
            (b.authority.as_str(), b.prefix.as_str()),
            ("127.0.0.1:8000", "")
        );
        let b = HttpBase::parse("localhost/gyre").expect("parses");
        assert_eq!(
            (b.authority.as_str(), b.prefix.as_str()),
            ("localhost:80", "/gyre")
        );
        assert!(HttpBase::parse("https://x:1").is_err());
        assert!(HttpBase::parse("ftp://x:1").is_err());
        assert!(HttpBase::parse("http://").is_err());
    }

    #[test]
    fn sse_events_split_across_chunks() {
        let mut r = SseReader::default();
        assert!(r.push(b"data: {\"a\"").is_empty());
        assert!(r.push(b":1}\n").is_empty());
        assert_eq!(
            r.push(b"\n: keep-alive\n\ndata: [DONE]\r\n\r\n"),
            ["{\"a\":1}", "[DONE]"]
        );
    }

    #[test]
    fn addresses_without_a_scheme_are_http() {
        assert_eq!(with_scheme("127.0.0.1:50051"), "http://127.0.0.1:50051");
        assert_eq!(with_scheme("https://h:1"), "https://h:1");
    }
}
