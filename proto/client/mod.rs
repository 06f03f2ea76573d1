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
//! use gyre_api::client::{Client, Event, Params, Tls};
//!
//! # async fn run() -> Result<(), gyre_api::client::Error> {
//! // An API key and TLS (the client certificate is for mTLS, optional).
//! let tls = Tls::ca_file("ca.pem")?.identity_files("client.pem", "client.key")?;
//! let client = Client::builder("https://127.0.0.1:50051")
//!     .api_key("sekret")
//!     .tls(tls)
//!     .connect()
//!     .await?;
//!
//! // One request, streamed.
//! let greedy = Params::new().max_tokens(16).temperature(0.0);
//! let mut events = client.generate("The capital of France is", &greedy).await?;
//! while let Some(event) = events.next().await {
//!     match event? {
//!         Event::Delta(d) => print!("{}", d.text),
//!         Event::Finish(f) => println!("\n[{}, {} tokens]", f.reason, f.usage.completion_tokens),
//!         Event::Prompt(..) => {}
//!     }
//! }
//!
//! // Two requests on one `Generate` stream, one of them cancelled.
//! let mut session = client.session().await?;
//! let short = session.send("One, two, three,", &greedy).await?;
//! let story = session.send("Once upon a time", &Params::new().max_tokens(500)).await?;
//! session.cancel(story.as_str()).await?;
//! session.close(); // nothing more to send: the stream ends when both have finished
//! while let Some(item) = session.next().await {
//!     let item = item?;
//!     if let Event::Finish(f) = item.event? {
//!         println!("{}: {}", item.request_id, f.reason); // the story's: cancelled
//!     }
//! }
//! # let _ = short;
//! # Ok(())
//! # }
//! ```
//!
//! The examples under `examples/` (`cargo run --example generate`, `chat`,
//! `bidi`, `tokenize`) connect with [`Builder::from_env`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::v1;
use crate::v1::generation_client::GenerationClient;

mod connect;
mod error;
mod event;
mod request;
mod session;
#[cfg(test)]
mod tests;

pub use connect::*;
pub use error::*;
pub use event::*;
pub use request::*;
pub use session::*;

/// The server URL the examples and [`Builder::from_env`] use when `GYRE_URL`
/// is not set.
pub const DEFAULT_URL: &str = "http://127.0.0.1:50051";

/// The channel every call goes through: tonic's, with the API key added.
pub type AuthChannel = InterceptedService<Channel, ApiKey>;

/// `Result` with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

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
