//! A typed convenience client for gyre's gRPC API (feature `client`, on by
//! default).
//!
//! [`Client`] wraps the generated [`GenerationClient`] and the
//! `grpc.health.v1` client: it connects with an API key (sent as
//! `authorization: Bearer <key>` metadata on every call) and TLS (rustls,
//! a CA certificate and optionally a client certificate for mTLS), and turns
//! the wire messages into typed [`Event`]s, [`Completion`]s and [`Error`]s.
//!
//! - [`Client::generate`] streams one request's events (`GenerateStream`);
//!   [`Client::complete`] collects them. [`Client::chat_stream`] and
//!   [`Client::chat`] do the same for chat [`Message`]s.
//! - [`Client::session`] opens the multiplexed `Generate` stream: many
//!   requests at once on one call, each under its own id, any of them
//!   cancellable ([`Session::cancel`]).
//! - [`Client::tokenize`], [`Client::detokenize`], [`Client::models`],
//!   [`Client::stats`] and [`Client::health`].
//!
//! Everything the typed layer leaves out stays reachable: [`Params`] sets the
//! common request fields and [`Params::request`] gives the [`v1::Request`] to
//! adjust further, which [`Client::generate_request`] and
//! [`Session::send_request`] take as is; [`Client::raw`] is the generated
//! client itself.
//!
//! ```no_run
//! use futures::StreamExt as _;
//! use gyre_api::client::{Client, Event, Params};
//!
//! # async fn run() -> Result<(), gyre_api::client::Error> {
//! let client = Client::builder("http://127.0.0.1:50051")
//!     .api_key("sekret")
//!     .connect()
//!     .await?;
//! let mut events = client
//!     .generate("The capital of France is", &Params::new().max_tokens(16).temperature(0.0))
//!     .await?;
//! while let Some(event) = events.next().await {
//!     match event? {
//!         Event::Delta(d) => print!("{}", d.text),
//!         Event::Finish(f) => println!("\n[{:?}, {} tokens]", f.reason, f.usage.completion_tokens),
//!         Event::Prompt(..) => {}
//!     }
//! }
//! # Ok(())
//! # }
//! ```
//!
//! The examples under `examples/` (`cargo run --example generate`, `chat`,
//! `bidi`, `tokenize`) connect with [`Builder::from_env`].

use std::fmt;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tokio::sync::mpsc;
use tonic::Code;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_types::StatusExt as _;

use crate::v1;
use crate::v1::generation_client::GenerationClient;

/// The server URL the examples and [`Builder::from_env`] use when `GYRE_URL`
/// is not set.
pub const DEFAULT_URL: &str = "http://127.0.0.1:50051";

/// The channel every call goes through: tonic's, with the API key added.
pub type AuthChannel = InterceptedService<Channel, ApiKey>;

/// `Result` with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

// ---------------------------------------------------------------------------
// Errors

/// What went wrong, typed.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Error {
    /// The client's own settings are unusable (a bad URL, an unreadable
    /// certificate file, an API key that cannot be sent as metadata): no call
    /// was made.
    Config(String),
    /// The connection could not be made (refused, TLS handshake failed).
    Connect(String),
    /// The server (or the transport) answered with an error: a whole call's
    /// gRPC status, or one request's failure on a [`Session`].
    Api(ApiError),
    /// The stream ended without the event that ends a request (a `finish`).
    Incomplete(String),
    /// The server sent something this client cannot use (e.g. a choice
    /// index far beyond any request's `n`).
    Protocol(String),
    /// The [`Session`]'s stream has ended: nothing more can be sent on it.
    SessionClosed,
}

impl Error {
    /// The gRPC status code, for [`Error::Api`].
    pub fn code(&self) -> Option<Code> {
        match self {
            Self::Api(e) => Some(e.code),
            _ => None,
        }
    }

    /// The server's error, for [`Error::Api`].
    pub fn api(&self) -> Option<&ApiError> {
        match self {
            Self::Api(e) => Some(e),
            _ => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Config(m) => write!(f, "invalid client settings: {m}"),
            Self::Connect(m) => write!(f, "cannot connect: {m}"),
            Self::Api(e) => e.fmt(f),
            Self::Incomplete(m) => write!(f, "incomplete response: {m}"),
            Self::Protocol(m) => write!(f, "unexpected message from the server: {m}"),
            Self::SessionClosed => f.write_str("the session's stream has ended"),
        }
    }
}

impl std::error::Error for Error {}

impl From<tonic::Status> for Error {
    fn from(status: tonic::Status) -> Self {
        Self::Api(ApiError::from_status(&status))
    }
}

/// An error the server sent: the gRPC code and message, and what gyre adds
/// in the status details (google.rpc `ErrorInfo` reason, `BadRequest`
/// field, `RetryInfo` delay) or in a request's `RequestError`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// The gRPC status code (for a request on a [`Session`], the code its
    /// `RequestError` carried).
    pub code: Code,
    /// The human-readable message, safe to show to users.
    pub message: String,
    /// Machine-readable reason, e.g. `MODEL_NOT_FOUND`, `PROMPT_TOO_LONG`.
    pub reason: Option<String>,
    /// The request field at fault, e.g. `sampling.temperature`.
    pub field: Option<String>,
    /// How long to wait before retrying (RESOURCE_EXHAUSTED).
    pub retry_after: Option<Duration>,
    /// The request the error belongs to, on a [`Session`].
    pub request_id: Option<String>,
}

impl ApiError {
    /// Reads the code, message and gyre's error details out of a status.
    pub fn from_status(status: &tonic::Status) -> Self {
        let details = status.get_error_details();
        let reason = details
            .error_info()
            .map(|i| i.reason.clone())
            .filter(|r| !r.is_empty());
        let field = details
            .bad_request()
            .and_then(|b| b.field_violations.first())
            .map(|v| v.field.clone())
            .filter(|f| !f.is_empty());
        let retry_after = details.retry_info().and_then(|r| r.retry_delay);
        // A status tonic made from a transport failure says "transport
        // error"; the why (a refused certificate, a reset) is its source.
        let mut message = status.message().to_string();
        if let Some(source) = std::error::Error::source(status) {
            let why = error_chain(source);
            if !message.contains(&why) {
                message = if message.is_empty() {
                    why
                } else {
                    format!("{message}: {why}")
                };
            }
        }
        Self {
            code: status.code(),
            message,
            reason,
            field,
            retry_after,
            request_id: None,
        }
    }

    /// The error of one request on the `Generate` stream (a `finish` with
    /// reason ERROR, or a `rejected` start).
    pub fn from_request_error(request_id: &str, e: &v1::RequestError) -> Self {
        Self {
            code: Code::from_i32(e.code),
            message: e.message.clone(),
            reason: Some(e.reason.clone()).filter(|r| !r.is_empty()),
            field: Some(e.field.clone()).filter(|f| !f.is_empty()),
            retry_after: None,
            request_id: Some(request_id.to_string()),
        }
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", code_name(self.code))?;
        if let Some(reason) = &self.reason {
            write!(f, " ({reason})")?;
        }
        write!(f, ": {}", self.message)?;
        if let Some(field) = &self.field {
            write!(f, " [field {field}]")?;
        }
        if let Some(id) = &self.request_id {
            write!(f, " [request {id}]")?;
        }
        Ok(())
    }
}

/// The canonical name of a gRPC code, as in the gRPC spec
/// (`UNAUTHENTICATED`, `NOT_FOUND`, ...).
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// `e` and its sources, joined: tonic's transport errors keep the useful
/// part (refused, certificate unknown) in the sources.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}

// ---------------------------------------------------------------------------
// Connecting

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

    fn config(&self) -> Result<ClientTlsConfig> {
        if !String::from_utf8_lossy(&self.ca_pem).contains("-----BEGIN CERTIFICATE-----") {
            return Err(Error::Config(
                "the CA certificate is not PEM (no `-----BEGIN CERTIFICATE-----`)".into(),
            ));
        }
        let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&self.ca_pem));
        if let Some((cert, key)) = &self.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        if let Some(domain) = &self.domain {
            config = config.domain_name(domain.clone());
        }
        Ok(config)
    }
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

    /// The endpoint these settings describe; no connection is made.
    pub fn endpoint(&self) -> Result<Endpoint> {
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
        match (endpoint.uri().scheme_str(), &self.tls) {
            (Some("http"), None) => {}
            (Some("https"), Some(tls)) => {
                endpoint = endpoint
                    .tls_config(tls.config()?)
                    .map_err(|e| Error::Config(format!("TLS settings: {}", error_chain(&e))))?
            }
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
        }
        if let Some(t) = self.connect_timeout {
            endpoint = endpoint.connect_timeout(t);
        }
        Ok(endpoint)
    }

    /// Connects (TCP, and the TLS handshake with TLS). Fails with
    /// [`Error::Config`] for unusable settings and [`Error::Connect`] when
    /// the server cannot be reached.
    pub async fn connect(self) -> Result<Client> {
        let key = match &self.api_key {
            Some(k) => ApiKey::new(k)?,
            None => ApiKey::default(),
        };
        let endpoint = self.endpoint()?;
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| Error::Connect(error_chain(&e)))?;
        Ok(Client::from_channel(channel, key, self.timeout))
    }
}

/// A connection to a gyre server. Cheap to clone: clones share the
/// connection (HTTP/2 multiplexes concurrent calls).
#[derive(Debug, Clone)]
pub struct Client {
    generation: GenerationClient<AuthChannel>,
    health: HealthClient<AuthChannel>,
    timeout: Option<Duration>,
    ids: Arc<AtomicU64>,
}

impl Client {
    /// Connects to `url` with default settings (no key, no TLS).
    pub async fn connect(url: impl Into<String>) -> Result<Self> {
        Builder::new(url).connect().await
    }

    /// Settings for the server at `url`, to refine before
    /// [`Builder::connect`].
    pub fn builder(url: impl Into<String>) -> Builder {
        Builder::new(url)
    }

    /// A client over a channel made elsewhere (e.g. a lazy or balanced one).
    pub fn from_channel(channel: Channel, key: ApiKey, timeout: Option<Duration>) -> Self {
        Self {
            generation: GenerationClient::with_interceptor(channel.clone(), key.clone()),
            health: HealthClient::with_interceptor(channel, key),
            timeout,
            ids: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The generated client, for whatever this layer does not cover.
    pub fn raw(&self) -> GenerationClient<AuthChannel> {
        self.generation.clone()
    }

    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some(t) = self.timeout {
            request.set_timeout(t);
        }
        request
    }

    /// Streams the events of one request (`GenerateStream`). Bad input
    /// (unknown model, invalid parameters) fails here, before any event.
    pub async fn generate(&self, input: impl Into<Input>, params: &Params) -> Result<EventStream> {
        self.generate_request(params.request(input)).await
    }

    /// [`Client::generate`] of a request built by hand.
    pub async fn generate_request(&self, request: v1::Request) -> Result<EventStream> {
        let response = self
            .generation
            .clone()
            .generate_stream(self.request(request))
            .await?;
        let model = response
            .metadata()
            .get("gyre-model")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        Ok(EventStream {
            model,
            request_id: None,
            inner: response.into_inner(),
        })
    }

    /// Generates and collects the whole answer (every choice).
    pub async fn complete(&self, input: impl Into<Input>, params: &Params) -> Result<Completion> {
        self.generate(input, params)
            .await?
            .collect_completion()
            .await
    }

    /// [`Client::generate`] for chat messages (rendered with the model's chat
    /// template).
    pub async fn chat_stream(
        &self,
        messages: impl IntoIterator<Item = Message>,
        params: &Params,
    ) -> Result<EventStream> {
        self.generate(Input::chat(messages), params).await
    }

    /// [`Client::complete`] for chat messages.
    pub async fn chat(
        &self,
        messages: impl IntoIterator<Item = Message>,
        params: &Params,
    ) -> Result<Completion> {
        self.complete(Input::chat(messages), params).await
    }

    /// Opens a multiplexed `Generate` stream (see [`Session`]).
    pub async fn session(&self) -> Result<Session> {
        let (tx, rx) = mpsc::channel(64);
        let response = self
            .generation
            .clone()
            .generate(self.request(tokio_stream::wrappers::ReceiverStream::new(rx)))
            .await?;
        let session = self.ids.fetch_add(1, Ordering::Relaxed);
        Ok(Session {
            sender: SessionSender {
                tx: Some(tx),
                ids: Arc::new(AtomicU64::new(0)),
                prefix: format!("s{session}-"),
            },
            events: response.into_inner(),
            ended: false,
        })
    }

    /// The token ids of `text` (with the tokenizer's special tokens, e.g.
    /// BOS) under `model` (`None`: the server's default model).
    pub async fn tokenize(&self, text: impl Into<String>, model: Option<&str>) -> Result<Tokens> {
        self.tokenize_request(v1::TokenizeRequest {
            model: model.unwrap_or_default().to_string(),
            input: Some(v1::tokenize_request::Input::Text(text.into())),
            add_special_tokens: None,
        })
        .await
    }

    /// The token ids of chat messages rendered with the model's template.
    pub async fn tokenize_chat(
        &self,
        messages: impl IntoIterator<Item = Message>,
        model: Option<&str>,
    ) -> Result<Tokens> {
        self.tokenize_request(v1::TokenizeRequest {
            model: model.unwrap_or_default().to_string(),
            input: Some(v1::tokenize_request::Input::Chat(chat_input(messages))),
            add_special_tokens: None,
        })
        .await
    }

    /// [`Client::tokenize`] of a request built by hand.
    pub async fn tokenize_request(&self, request: v1::TokenizeRequest) -> Result<Tokens> {
        let r = self
            .generation
            .clone()
            .tokenize(self.request(request))
            .await?
            .into_inner();
        Ok(Tokens {
            token_ids: r.token_ids,
            max_model_len: r.max_model_len,
            prompt: r.prompt,
        })
    }

    /// The text of `token_ids` (special tokens left out).
    pub async fn detokenize(&self, token_ids: Vec<u32>, model: Option<&str>) -> Result<String> {
        let r = self
            .generation
            .clone()
            .detokenize(self.request(v1::DetokenizeRequest {
                model: model.unwrap_or_default().to_string(),
                token_ids,
                skip_special_tokens: None,
            }))
            .await?;
        Ok(r.into_inner().text)
    }

    /// The models the server hosts, the default one first.
    pub async fn models(&self) -> Result<Vec<v1::Model>> {
        let r = self
            .generation
            .clone()
            .list_models(self.request(v1::ListModelsRequest {}))
            .await?;
        Ok(r.into_inner().models)
    }

    /// A snapshot of a model's engine counters (`None`: the default model).
    pub async fn stats(&self, model: Option<&str>) -> Result<v1::EngineStats> {
        let r = self
            .generation
            .clone()
            .get_stats(self.request(v1::GetStatsRequest {
                model: model.unwrap_or_default().to_string(),
            }))
            .await?;
        Ok(r.into_inner())
    }

    /// grpc.health.v1: the server's status (`service` empty) or a model's
    /// (its id). Never needs the API key.
    pub async fn health(&self, service: &str) -> Result<Health> {
        let r = self
            .health
            .clone()
            .check(self.request(HealthCheckRequest {
                service: service.to_string(),
            }))
            .await?;
        Ok(Health::from_wire(r.into_inner().status))
    }
}

/// A grpc.health.v1 serving status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// SERVING.
    Serving,
    /// NOT_SERVING (e.g. the server is draining, or the model failed).
    NotServing,
    /// UNKNOWN, SERVICE_UNKNOWN or a value this client does not know.
    Unknown,
}

impl Health {
    fn from_wire(status: i32) -> Self {
        match ServingStatus::try_from(status) {
            Ok(ServingStatus::Serving) => Self::Serving,
            Ok(ServingStatus::NotServing) => Self::NotServing,
            _ => Self::Unknown,
        }
    }
}

/// Token ids of a text or chat prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tokens {
    /// The ids.
    pub token_ids: Vec<u32>,
    /// The model's context length in tokens.
    pub max_model_len: u32,
    /// What was tokenized (for chat input: the rendered template).
    pub prompt: String,
}

// ---------------------------------------------------------------------------
// Requests

/// One chat message; build with [`Message::system`], [`Message::user`],
/// [`Message::assistant`] or [`Message::tool`].
#[derive(Debug, Clone, PartialEq)]
pub struct Message(pub v1::ChatMessage);

impl Message {
    /// A message of any `role` ("system", "developer", "user", ...).
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self(v1::ChatMessage {
            role: role.into(),
            content: Some(content.into()),
            ..Default::default()
        })
    }

    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }

    /// An earlier assistant answer.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }

    /// A tool's answer to the call `tool_call_id`.
    pub fn tool(tool_call_id: impl Into<String>, content: impl Into<String>) -> Self {
        let mut m = Self::new("tool", content);
        m.0.tool_call_id = Some(tool_call_id.into());
        m
    }

    /// Sets the participant name.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.0.name = Some(name.into());
        self
    }
}

fn chat_input(messages: impl IntoIterator<Item = Message>) -> v1::ChatInput {
    v1::ChatInput {
        messages: messages.into_iter().map(|m| m.0).collect(),
        ..Default::default()
    }
}

/// What a request continues from.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// Prompt text, tokenized by the server.
    Text(String),
    /// Prompt token ids, used verbatim.
    TokenIds(Vec<u32>),
    /// Chat, rendered with the model's chat template.
    Chat(v1::ChatInput),
}

impl Input {
    /// Chat input of these messages (template defaults).
    pub fn chat(messages: impl IntoIterator<Item = Message>) -> Self {
        Self::Chat(chat_input(messages))
    }

    fn into_wire(self) -> v1::request::Input {
        match self {
            Self::Text(t) => v1::request::Input::Text(t),
            Self::TokenIds(ids) => v1::request::Input::TokenIds(v1::TokenIds { ids }),
            Self::Chat(c) => v1::request::Input::Chat(c),
        }
    }
}

impl From<&str> for Input {
    fn from(s: &str) -> Self {
        Self::Text(s.to_string())
    }
}

impl From<String> for Input {
    fn from(s: String) -> Self {
        Self::Text(s)
    }
}

impl From<Vec<u32>> for Input {
    fn from(ids: Vec<u32>) -> Self {
        Self::TokenIds(ids)
    }
}

impl From<Vec<Message>> for Input {
    fn from(messages: Vec<Message>) -> Self {
        Self::chat(messages)
    }
}

/// The common request fields; every one left unset takes the server's
/// default (the model's `generation_config.json`, or the proto's fallback).
/// Build with the chained setters:
/// `Params::new().max_tokens(32).temperature(0.0)`.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct Params {
    /// Model id or alias; `None`: the server's default model.
    pub model: Option<String>,
    /// The request id; `None`: the server's (on `GenerateStream`) or the
    /// session's (on a [`Session`]).
    pub request_id: Option<String>,
    /// Most tokens to generate.
    pub max_tokens: Option<u32>,
    /// Sampling: temperature (0 is greedy), top-p, top-k, min-p, seed.
    pub sampling: v1::SamplingParams,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Keep generating past EOS.
    pub ignore_eos: bool,
    /// Number of choices.
    pub n: Option<u32>,
}

impl Params {
    /// All defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Use this model (id or alias).
    pub fn model(mut self, model: impl Into<String>) -> Self {
        self.model = Some(model.into());
        self
    }

    /// Use this request id.
    pub fn request_id(mut self, id: impl Into<String>) -> Self {
        self.request_id = Some(id.into());
        self
    }

    /// Generate at most `n` tokens.
    pub fn max_tokens(mut self, n: u32) -> Self {
        self.max_tokens = Some(n);
        self
    }

    /// Softmax temperature; 0 is greedy.
    pub fn temperature(mut self, t: f32) -> Self {
        self.sampling.temperature = Some(t);
        self
    }

    /// Nucleus sampling mass.
    pub fn top_p(mut self, p: f32) -> Self {
        self.sampling.top_p = Some(p);
        self
    }

    /// Keep only the `k` most likely tokens.
    pub fn top_k(mut self, k: u32) -> Self {
        self.sampling.top_k = Some(k);
        self
    }

    /// The request's random seed.
    pub fn seed(mut self, seed: u64) -> Self {
        self.sampling.seed = Some(seed);
        self
    }

    /// Adds a stop string.
    pub fn stop(mut self, s: impl Into<String>) -> Self {
        self.stop.push(s.into());
        self
    }

    /// Whether EOS tokens are ignored.
    pub fn ignore_eos(mut self, ignore: bool) -> Self {
        self.ignore_eos = ignore;
        self
    }

    /// Generate `n` choices.
    pub fn n(mut self, n: u32) -> Self {
        self.n = Some(n);
        self
    }

    /// The wire request of `input` under these parameters, to send as is or
    /// to adjust (any field of [`v1::Request`]).
    pub fn request(&self, input: impl Into<Input>) -> v1::Request {
        v1::Request {
            request_id: self.request_id.clone().unwrap_or_default(),
            model: self.model.clone().unwrap_or_default(),
            input: Some(input.into().into_wire()),
            sampling: (self.sampling != v1::SamplingParams::default())
                .then(|| self.sampling.clone()),
            max_tokens: self.max_tokens,
            stop: self.stop.clone(),
            ignore_eos: self.ignore_eos,
            n: self.n,
            ..Default::default()
        }
    }
}

// ---------------------------------------------------------------------------
// Events

/// Why a choice ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An EOS token, a stop token id or a stop string.
    Stop,
    /// `max_tokens`, or the context, reached.
    Length,
    /// Cancelled by the client.
    Cancelled,
    /// The model made tool calls.
    ToolCalls,
    /// A value this client does not know (a newer server).
    Other(i32),
}

impl FinishReason {
    /// OpenAI's name: "stop", "length", "cancelled", "tool_calls".
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::Cancelled => "cancelled",
            Self::ToolCalls => "tool_calls",
            Self::Other(_) => "other",
        }
    }
}

impl fmt::Display for FinishReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// New output of one choice.
#[derive(Debug, Clone, PartialEq)]
pub struct Delta {
    /// The choice (0 unless the request asked for `n` > 1).
    pub index: u32,
    /// New text (always whole characters).
    pub text: String,
    /// The ids of the tokens generated since the previous delta.
    pub token_ids: Vec<u32>,
    /// New text of the model's reasoning section, if it has one.
    pub reasoning: String,
    /// Tool calls, or fragments of them.
    pub tool_calls: Vec<v1::ToolCallDelta>,
    /// Log-probabilities, when the request asked for them.
    pub logprobs: Vec<v1::TokenLogprob>,
}

/// The end of one choice.
#[derive(Debug, Clone, PartialEq)]
pub struct Finish {
    /// The choice.
    pub index: u32,
    /// Why it ended.
    pub reason: FinishReason,
    /// Token counts.
    pub usage: v1::Usage,
    /// The stop string that ended it, if one did.
    pub matched_stop: Option<String>,
    /// The stop token id that ended it, if one did.
    pub matched_stop_token_id: Option<u32>,
}

/// An event of one request.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The prompt, sent back when the request asked for `echo` or
    /// `prompt_logprobs` (index, echo).
    Prompt(u32, v1::PromptEcho),
    /// New output.
    Delta(Delta),
    /// A choice ended (its last event).
    Finish(Finish),
}

/// One wire event as a typed event (or a request's error); `None` for a
/// message without an event (a newer server's unknown kind).
fn event_of(r: v1::GenerateResponse) -> Option<Result<Event>> {
    use v1::generate_response::Event as E;
    let index = r.index;
    Some(match r.event? {
        E::Delta(d) => Ok(Event::Delta(Delta {
            index,
            text: d.text,
            token_ids: d.token_ids,
            reasoning: d.reasoning,
            tool_calls: d.tool_calls,
            logprobs: d.logprobs,
        })),
        E::Prompt(p) => Ok(Event::Prompt(index, p)),
        E::Finish(f) => {
            let reason = match v1::FinishReason::try_from(f.reason) {
                Ok(v1::FinishReason::Stop) => FinishReason::Stop,
                Ok(v1::FinishReason::Length) => FinishReason::Length,
                Ok(v1::FinishReason::Cancelled) => FinishReason::Cancelled,
                Ok(v1::FinishReason::ToolCalls) => FinishReason::ToolCalls,
                Ok(v1::FinishReason::Error) => {
                    let e = f.error.unwrap_or_default();
                    return Some(Err(Error::Api(ApiError::from_request_error(
                        &r.request_id,
                        &e,
                    ))));
                }
                Ok(v1::FinishReason::Unspecified) | Err(_) => FinishReason::Other(f.reason),
            };
            Ok(Event::Finish(Finish {
                index,
                reason,
                usage: f.usage.unwrap_or_default(),
                matched_stop: f.matched_stop,
                matched_stop_token_id: f.matched_stop_token_id,
            }))
        }
        E::Rejected(rej) => {
            let e = rej.error.unwrap_or_default();
            Err(Error::Api(ApiError::from_request_error(&r.request_id, &e)))
        }
    })
}

/// The events of one `GenerateStream` call: a [`Stream`] of
/// `Result<Event>`. A failure after events started ends it with an
/// [`Error::Api`]; dropping it cancels the generation.
pub struct EventStream {
    model: Option<String>,
    request_id: Option<String>,
    inner: tonic::Streaming<v1::GenerateResponse>,
}

impl fmt::Debug for EventStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventStream")
            .field("model", &self.model)
            .field("request_id", &self.request_id)
            .finish_non_exhaustive()
    }
}

impl EventStream {
    /// The id of the model serving the request (the `gyre-model` metadata).
    pub fn model(&self) -> Option<&str> {
        self.model.as_deref()
    }

    /// The request id, once the first event has named it.
    pub fn request_id(&self) -> Option<&str> {
        self.request_id.as_deref()
    }

    /// Reads the stream to its end into a [`Completion`].
    pub async fn collect_completion(mut self) -> Result<Completion> {
        use futures::StreamExt as _;
        let mut choices: Vec<Choice> = Vec::new();
        while let Some(event) = self.next().await {
            add_event(&mut choices, event?)?;
        }
        if choices.is_empty() {
            return Err(Error::Incomplete(
                "the stream ended without any event".into(),
            ));
        }
        if let Some(i) = choices.iter().position(|c| c.finish.is_none()) {
            return Err(Error::Incomplete(format!(
                "choice {i} ended without a finish"
            )));
        }
        Ok(Completion {
            request_id: self.request_id.unwrap_or_default(),
            model: self.model,
            choices,
        })
    }
}

impl Stream for EventStream {
    type Item = Result<Event>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            return match Pin::new(&mut self.inner).poll_next(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Ready(Some(Err(status))) => Poll::Ready(Some(Err(status.into()))),
                Poll::Ready(Some(Ok(r))) => {
                    if self.request_id.is_none() && !r.request_id.is_empty() {
                        self.request_id = Some(r.request_id.clone());
                    }
                    match event_of(r) {
                        Some(e) => Poll::Ready(Some(e)),
                        None => continue,
                    }
                }
            };
        }
    }
}

/// Most choices a request may ask for (`Request.n`).
const MAX_CHOICES: usize = 128;

/// Adds one event to the choices it belongs to.
fn add_event(choices: &mut Vec<Choice>, event: Event) -> Result<()> {
    let index = match &event {
        Event::Prompt(..) => return Ok(()),
        Event::Delta(d) => d.index,
        Event::Finish(f) => f.index,
    } as usize;
    if index >= MAX_CHOICES {
        return Err(Error::Protocol(format!(
            "an event of choice {index} (at most {MAX_CHOICES} choices)"
        )));
    }
    if choices.len() <= index {
        choices.resize_with(index + 1, Choice::default);
    }
    let choice = &mut choices[index];
    match event {
        Event::Prompt(..) => {}
        Event::Delta(d) => {
            choice.text.push_str(&d.text);
            choice.reasoning.push_str(&d.reasoning);
            choice.token_ids.extend(d.token_ids);
            choice.tool_calls.extend(d.tool_calls);
        }
        Event::Finish(f) => choice.finish = Some(f),
    }
    Ok(())
}

/// One choice of a [`Completion`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Choice {
    /// The generated text.
    pub text: String,
    /// The generated token ids (a final stop token included).
    pub token_ids: Vec<u32>,
    /// The reasoning text, for a model with a reasoning section.
    pub reasoning: String,
    /// Tool-call fragments, in order.
    pub tool_calls: Vec<v1::ToolCallDelta>,
    /// How it ended (always set in a returned [`Completion`]).
    pub finish: Option<Finish>,
}

/// A whole answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// The request id.
    pub request_id: String,
    /// The model that served it.
    pub model: Option<String>,
    /// The choices, by index (one unless `n` asked for more).
    pub choices: Vec<Choice>,
}

impl Completion {
    /// The first choice's text.
    pub fn text(&self) -> &str {
        self.choices.first().map_or("", |c| c.text.as_str())
    }

    /// The first choice's finish reason.
    pub fn finish_reason(&self) -> Option<FinishReason> {
        self.choices.first()?.finish.as_ref().map(|f| f.reason)
    }

    /// Token counts (of the first choice's finish: the prompt, and that
    /// choice's tokens).
    pub fn usage(&self) -> v1::Usage {
        self.choices
            .first()
            .and_then(|c| c.finish.as_ref())
            .map(|f| f.usage)
            .unwrap_or_default()
    }
}

// ---------------------------------------------------------------------------
// The multiplexed session

/// The sending half of a [`Session`]: starts and cancels requests. Clone it
/// to send from other tasks.
#[derive(Debug, Clone)]
pub struct SessionSender {
    tx: Option<mpsc::Sender<v1::GenerateRequest>>,
    ids: Arc<AtomicU64>,
    prefix: String,
}

impl SessionSender {
    async fn put(&self, action: v1::generate_request::Action) -> Result<()> {
        let tx = self.tx.as_ref().ok_or(Error::SessionClosed)?;
        tx.send(v1::GenerateRequest {
            action: Some(action),
        })
        .await
        .map_err(|_| Error::SessionClosed)
    }

    /// Starts a request; returns its id (`params.request_id`, else a fresh
    /// one of this session). Its events arrive on the [`Session`].
    pub async fn send(&self, input: impl Into<Input>, params: &Params) -> Result<String> {
        self.send_request(params.request(input)).await
    }

    /// Starts a request built by hand (an empty `request_id` gets a fresh
    /// one); returns its id.
    pub async fn send_request(&self, mut request: v1::Request) -> Result<String> {
        if request.request_id.is_empty() {
            let n = self.ids.fetch_add(1, Ordering::Relaxed);
            request.request_id = format!("{}{n}", self.prefix);
        }
        let id = request.request_id.clone();
        self.put(v1::generate_request::Action::Start(request))
            .await?;
        Ok(id)
    }

    /// Cancels a running request: it ends with a finish of reason
    /// [`FinishReason::Cancelled`]. Unknown or finished ids are ignored by
    /// the server.
    pub async fn cancel(&self, request_id: impl Into<String>) -> Result<()> {
        self.put(v1::generate_request::Action::Cancel(v1::Cancel {
            request_id: request_id.into(),
        }))
        .await
    }
}

/// An event of a [`Session`]: which request, and its event or its error (a
/// finish with an error, or a refused start such as a duplicate id).
#[derive(Debug, Clone, PartialEq)]
pub struct SessionEvent {
    /// The request the event belongs to.
    pub request_id: String,
    /// The event, or that request's error ([`Error::Api`] with the id set).
    pub event: Result<Event>,
}

/// Many requests on one `Generate` stream. Send with [`Session::send`] (or
/// a [`SessionSender`] from [`Session::sender`]), cancel with
/// [`Session::cancel`], and read every request's events, interleaved, from
/// the session itself (a [`Stream`] of `Result<SessionEvent>`; an `Err` is
/// the whole stream failing). [`Session::close`] half-closes: the server
/// finishes what was started and then ends the stream. Dropping the session
/// cancels every request on it.
pub struct Session {
    sender: SessionSender,
    events: tonic::Streaming<v1::GenerateResponse>,
    ended: bool,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("sender", &self.sender)
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl Session {
    /// A sender for this session, to start and cancel requests from
    /// elsewhere while this handle reads events.
    pub fn sender(&self) -> SessionSender {
        self.sender.clone()
    }

    /// See [`SessionSender::send`].
    pub async fn send(&self, input: impl Into<Input>, params: &Params) -> Result<String> {
        self.sender.send(input, params).await
    }

    /// See [`SessionSender::send_request`].
    pub async fn send_request(&self, request: v1::Request) -> Result<String> {
        self.sender.send_request(request).await
    }

    /// See [`SessionSender::cancel`].
    pub async fn cancel(&self, request_id: impl Into<String>) -> Result<()> {
        self.sender.cancel(request_id).await
    }

    /// Half-closes the stream: nothing more (no start, no cancel) can be sent
    /// from this handle, which then fails with [`Error::SessionClosed`]
    /// (senders cloned earlier keep the stream open until they are dropped);
    /// the server finishes every started request and then ends the stream.
    pub fn close(&mut self) {
        self.sender.tx = None;
    }
}

impl Stream for Session {
    type Item = Result<SessionEvent>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.ended {
            return Poll::Ready(None);
        }
        loop {
            return match Pin::new(&mut self.events).poll_next(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(None) => {
                    self.ended = true;
                    Poll::Ready(None)
                }
                Poll::Ready(Some(Err(status))) => {
                    self.ended = true;
                    Poll::Ready(Some(Err(status.into())))
                }
                Poll::Ready(Some(Ok(r))) => {
                    let request_id = r.request_id.clone();
                    match event_of(r) {
                        Some(event) => Poll::Ready(Some(Ok(SessionEvent { request_id, event }))),
                        None => continue,
                    }
                }
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_build_the_wire_request_and_leave_unset_fields_unset() {
        let r = Params::new().request("Hi");
        assert_eq!(r.input, Some(v1::request::Input::Text("Hi".into())));
        assert_eq!(r.model, "");
        assert_eq!(r.request_id, "");
        assert_eq!(r.sampling, None);
        assert_eq!((r.max_tokens, r.n, r.ignore_eos), (None, None, false));

        let r = Params::new()
            .model("m")
            .request_id("r1")
            .max_tokens(16)
            .temperature(0.0)
            .seed(7)
            .stop("\n")
            .ignore_eos(true)
            .n(2)
            .request(vec![1u32, 2, 3]);
        assert_eq!(
            r.input,
            Some(v1::request::Input::TokenIds(v1::TokenIds {
                ids: vec![1, 2, 3]
            }))
        );
        assert_eq!((r.model.as_str(), r.request_id.as_str()), ("m", "r1"));
        let s = r.sampling.expect("sampling set");
        assert_eq!((s.temperature, s.seed, s.top_p), (Some(0.0), Some(7), None));
        assert_eq!((r.max_tokens, r.n, r.ignore_eos), (Some(16), Some(2), true));
        assert_eq!(r.stop, vec!["\n".to_string()]);
    }

    #[test]
    fn chat_messages_build_chat_input() {
        let r = Params::new().request(vec![
            Message::system("Be brief."),
            Message::user("Hi").name("ann"),
            Message::assistant("Hello."),
            Message::tool("call-1", "42"),
        ]);
        let Some(v1::request::Input::Chat(chat)) = r.input else {
            panic!("not chat input: {:?}", r.input);
        };
        let roles: Vec<_> = chat.messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool"]);
        assert_eq!(chat.messages[1].content.as_deref(), Some("Hi"));
        assert_eq!(chat.messages[1].name.as_deref(), Some("ann"));
        assert_eq!(chat.messages[3].tool_call_id.as_deref(), Some("call-1"));
        assert_eq!(chat.add_generation_prompt, None);
    }

    #[test]
    fn a_status_becomes_a_typed_error_with_gyres_details() {
        let mut details = tonic_types::ErrorDetails::new();
        details.set_error_info(
            "MODEL_NOT_FOUND",
            "gyre.v1",
            std::collections::HashMap::new(),
        );
        details.add_bad_request_violation("model", "no such model");
        details.set_retry_info(Some(Duration::from_secs(2)));
        let status = tonic::Status::with_error_details(
            Code::NotFound,
            "the model `x` does not exist",
            details,
        );
        let e = Error::from(status);
        assert_eq!(e.code(), Some(Code::NotFound));
        let api = e.api().expect("an API error");
        assert_eq!(api.reason.as_deref(), Some("MODEL_NOT_FOUND"));
        assert_eq!(api.field.as_deref(), Some("model"));
        assert_eq!(api.retry_after, Some(Duration::from_secs(2)));
        assert_eq!(
            e.to_string(),
            "NOT_FOUND (MODEL_NOT_FOUND): the model `x` does not exist [field model]"
        );
        // A status without details (e.g. from a proxy) keeps code and message.
        let e = Error::from(tonic::Status::unauthenticated("missing API key"));
        assert_eq!(e.to_string(), "UNAUTHENTICATED: missing API key");
        assert_eq!(e.api().and_then(|a| a.reason.clone()), None);
    }

    fn response(id: &str, event: v1::generate_response::Event) -> v1::GenerateResponse {
        v1::GenerateResponse {
            request_id: id.into(),
            index: 0,
            event: Some(event),
        }
    }

    #[test]
    fn wire_events_become_typed_events_and_request_errors() {
        use v1::generate_response::Event as E;
        let d = event_of(response(
            "a",
            E::Delta(v1::Delta {
                text: "Hi".into(),
                token_ids: vec![5],
                ..Default::default()
            }),
        ));
        assert!(
            matches!(d, Some(Ok(Event::Delta(Delta { ref text, ref token_ids, .. })))
            if text == "Hi" && token_ids == &[5])
        );
        let f = event_of(response(
            "a",
            E::Finish(v1::Finish {
                reason: v1::FinishReason::Cancelled as i32,
                usage: Some(v1::Usage {
                    prompt_tokens: 3,
                    completion_tokens: 1,
                    ..Default::default()
                }),
                ..Default::default()
            }),
        ));
        let Some(Ok(Event::Finish(f))) = f else {
            panic!("not a finish: {f:?}");
        };
        assert_eq!(
            (f.reason, f.usage.completion_tokens),
            (FinishReason::Cancelled, 1)
        );
        assert_eq!(FinishReason::Cancelled.to_string(), "cancelled");
        let unknown = event_of(response(
            "a",
            E::Finish(v1::Finish {
                reason: 99,
                ..Default::default()
            }),
        ));
        assert!(matches!(
            unknown,
            Some(Ok(Event::Finish(Finish {
                reason: FinishReason::Other(99),
                ..
            })))
        ));

        let err = event_of(response(
            "b",
            E::Finish(v1::Finish {
                reason: v1::FinishReason::Error as i32,
                error: Some(v1::RequestError {
                    code: Code::NotFound as i32,
                    message: "the model `x` does not exist".into(),
                    reason: "MODEL_NOT_FOUND".into(),
                    field: "model".into(),
                }),
                ..Default::default()
            }),
        ));
        let Some(Err(Error::Api(api))) = err else {
            panic!("not an error: {err:?}");
        };
        assert_eq!(api.code, Code::NotFound);
        assert_eq!(api.request_id.as_deref(), Some("b"));
        assert_eq!(api.reason.as_deref(), Some("MODEL_NOT_FOUND"));

        let rejected = event_of(response(
            "dup",
            E::Rejected(v1::Rejected {
                error: Some(v1::RequestError {
                    code: Code::AlreadyExists as i32,
                    message: "request_id `dup` is already running".into(),
                    reason: "DUPLICATE_REQUEST_ID".into(),
                    field: "start.request_id".into(),
                }),
            }),
        ));
        assert_eq!(
            rejected.and_then(|r| r.err()).and_then(|e| e.code()),
            Some(Code::AlreadyExists)
        );
        // A message without an event (a newer kind) is skipped, not an error.
        assert!(
            event_of(v1::GenerateResponse {
                request_id: "a".into(),
                index: 0,
                event: None
            })
            .is_none()
        );
    }

    #[test]
    fn bad_settings_are_config_errors_not_panics() {
        let config = |b: Builder| match b.endpoint() {
            Err(Error::Config(m)) => m,
            other => panic!("expected a config error, got {other:?}"),
        };
        assert!(config(Builder::new("https://example.com:443")).contains("CA certificate"));
        assert!(
            config(Builder::new("http://h:1").tls(Tls::new(b"x".to_vec()))).contains("https://")
        );
        assert!(config(Builder::new("ftp://h:1")).contains("ftp"));
        assert!(config(Builder::new("http://bad host:1")).contains("bad server URL"));
        assert!(
            config(Builder::new("https://h:1").tls(Tls::new(b"not pem".to_vec()))).contains("PEM")
        );
        assert!(matches!(
            Tls::ca_file("/nonexistent/ca.pem"),
            Err(Error::Config(m)) if m.contains("/nonexistent/ca.pem")
        ));
        for key in ["", "line\nbreak", "clé", "two words"] {
            assert!(matches!(ApiKey::new(key), Err(Error::Config(_))), "{key:?}");
        }
        // A bare host:port is http, or https with TLS.
        let e = Builder::new("127.0.0.1:50051")
            .endpoint()
            .expect("a valid endpoint");
        assert_eq!(e.uri().scheme_str(), Some("http"));
    }

    #[test]
    fn the_interceptor_adds_the_bearer_key_and_hides_it_in_debug() {
        let mut key = ApiKey::new("sekret").expect("a valid key");
        let r = key
            .call(tonic::Request::new(()))
            .expect("the interceptor never fails");
        let value = r
            .metadata()
            .get("authorization")
            .expect("authorization set");
        assert_eq!(value.to_str().ok(), Some("Bearer sekret"));
        assert!(crate::auth::bearer_matches(
            value.to_str().unwrap_or_default(),
            "sekret"
        ));
        assert!(!format!("{key:?}").contains("sekret"));
        assert!(!format!("{:?}", Builder::new("h:1").api_key("sekret")).contains("sekret"));
        let r = ApiKey::default()
            .call(tonic::Request::new(()))
            .expect("the interceptor never fails");
        assert!(r.metadata().get("authorization").is_none());
    }
}
