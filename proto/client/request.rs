//! What a request is made of: chat [`Message`]s, the [`Input`] and the
//! common request fields ([`Params`]).

use crate::v1;

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

pub(super) fn chat_input(messages: impl IntoIterator<Item = Message>) -> v1::ChatInput {
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
    /// session's (on a [`Session`](super::Session)).
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
