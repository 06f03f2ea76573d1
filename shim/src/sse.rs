//! Server-Sent Events: drives a [`Generation`] and frames it as OpenAI does.
//!
//! The event sequence is: the opening chunk of each choice (chat: the
//! assistant role), one chunk per non-empty text delta (tagged with its
//! choice index), ONE finishing chunk with `finish_reason` per choice, the
//! usage chunk when asked for, then `data: [DONE]`. An error after the
//! stream started is sent as one `data: {"error":{...}}` event and the stream
//! ends without `[DONE]`.
//!
//! The event stream owns the [`Generation`] (no spawned task), so when the
//! client disconnects and the body is dropped, the gRPC call is cancelled.
//!
//! `nvext.annotations` add named events (`event: formatted_prompt`,
//! `event: token_ids`) before a prompt's first text: their data is a chunk of
//! the endpoint's object with `choices: []` and an `nvext` member
//! `{"annotation", "index", "value"}`, so that clients which ignore event
//! names (the OpenAI SDK) read it as one more chunk without choices.

use std::convert::Infallible;

use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt, stream};
use serde::Serialize;

use crate::error::ApiError;
use crate::openai::response::Usage;
use crate::upstream::{Finish, Merged, Piece, Step};
use gyre_api::v1::PromptEcho;

/// An out-of-band SSE event a stream may ask for in `nvext.annotations`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Annotation {
    /// The prompt as the model saw it, as text (chat: the rendered template).
    FormattedPrompt,
    /// The prompt's token ids.
    TokenIds,
}

impl Annotation {
    /// The annotation of this name; `None` for names gyre does not know.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "formatted_prompt" => Some(Self::FormattedPrompt),
            "token_ids" => Some(Self::TokenIds),
            _ => None,
        }
    }

    /// The SSE event name.
    pub fn name(self) -> &'static str {
        match self {
            Self::FormattedPrompt => "formatted_prompt",
            Self::TokenIds => "token_ids",
        }
    }

    fn value(self, echo: &PromptEcho) -> serde_json::Value {
        match self {
            Self::FormattedPrompt => echo.text.clone().into(),
            Self::TokenIds => echo.token_ids.clone().into(),
        }
    }
}

/// The annotations of a stream and how to number them.
#[derive(Debug, Clone, Default)]
pub struct Annotations {
    pub list: Vec<Annotation>,
    /// Choices per prompt: a prompt's annotations are sent once, for its
    /// first choice (`index` is that choice's).
    pub per_prompt: u32,
}

/// How one endpoint shapes its chunks.
pub trait ChunkFormat: Send + 'static {
    /// The chunk sent before any text of choice `index`, if the endpoint has one.
    fn opening(&self, index: u32) -> Option<Event>;
    /// A chunk carrying new text of choice `index` and its tokens' logprobs.
    fn text(&mut self, index: u32, text: &str, logprobs: &[gyre_api::v1::TokenLogprob]) -> Event;
    /// A chunk carrying reasoning text of choice `index` (chat only).
    fn reasoning(&mut self, _index: u32, _text: &str) -> Option<Event> {
        None
    }
    /// The chunk carrying the prompt sent back for choice `index` (`echo`).
    fn echo(&mut self, index: u32, echo: &PromptEcho) -> Option<Event>;
    /// A chunk without choices, as JSON, for annotation events to extend.
    fn empty_chunk(&self) -> serde_json::Value;
    /// The chunk carrying tool calls of choice `index` (chat only: the
    /// other endpoints never ask for tools).
    fn tool_calls(&mut self, index: u32, calls: &[gyre_api::v1::ToolCallDelta]) -> Event {
        let _ = calls;
        self.text(index, "", &[])
    }
    /// The chunk carrying choice `index`'s `finish_reason`.
    fn finish(&self, index: u32, reason: Finish) -> Event;
    /// The usage-only chunk, or `None` when the client did not ask for it.
    fn usage(&self, usage: Usage) -> Option<Event>;
}

/// An SSE event whose data is `value` as JSON.
pub fn json_event<T: Serialize>(value: &T) -> Event {
    Event::default()
        .json_data(value)
        .unwrap_or_else(|e| error_event(&ApiError::internal(e)))
}

/// The event that reports an error after streaming started.
pub fn error_event(error: &ApiError) -> Event {
    Event::default().data(error.body().to_string())
}

/// The SSE response for a started generation. `X-Accel-Buffering: no` asks
/// reverse proxies such as nginx to pass chunks on as they come.
pub fn response<F: ChunkFormat>(
    generation: Merged,
    n: u32,
    annotations: Annotations,
    format: F,
    heartbeat: Option<std::time::Duration>,
) -> Response {
    let sse = Sse::new(events(generation, n, annotations, format));
    let sse = crate::keepalive::heartbeat(sse, heartbeat);
    ([("x-accel-buffering", "no")], sse).into_response()
}

/// The event stream of a started generation (see the module docs).
pub fn events<F: ChunkFormat>(
    generation: Merged,
    n: u32,
    annotations: Annotations,
    format: F,
) -> impl Stream<Item = Result<Event, Infallible>> + Send + 'static {
    let driver = Driver {
        opening: (0..n.max(1)).filter_map(|i| format.opening(i)).collect(),
        generation,
        format,
        annotations,
        done: false,
    };
    stream::unfold(driver, |mut driver| async move {
        let batch = driver.next_events().await?;
        Some((stream::iter(batch.into_iter().map(Ok)), driver))
    })
    .flatten()
}

struct Driver<F> {
    opening: Vec<Event>,
    generation: Merged,
    format: F,
    annotations: Annotations,
    done: bool,
}

impl<F: ChunkFormat> Driver<F> {
    /// The next events, or `None` once the stream is over.
    async fn next_events(&mut self) -> Option<Vec<Event>> {
        if self.done {
            return None;
        }
        if !self.opening.is_empty() {
            return Some(std::mem::take(&mut self.opening));
        }
        match self.generation.next().await {
            Ok(Step::Choice { index, piece }) => Some(self.piece_events(index, piece)),
            Ok(Step::End { usage }) => {
                self.done = true;
                let mut events: Vec<Event> = self.format.usage(usage).into_iter().collect();
                events.push(Event::default().data("[DONE]"));
                Some(events)
            }
            Err(error) => {
                self.done = true;
                Some(vec![error_event(&error)])
            }
        }
    }
}

impl<F: ChunkFormat> Driver<F> {
    /// The events of one choice's piece.
    fn piece_events(&mut self, index: u32, piece: Piece) -> Vec<Event> {
        match piece {
            Piece::Text { text, logprobs } => vec![self.format.text(index, &text, &logprobs)],
            Piece::Reasoning(text) => self.format.reasoning(index, &text).into_iter().collect(),
            Piece::Echo(echo) => {
                let mut events = Vec::new();
                if index.is_multiple_of(self.annotations.per_prompt.max(1)) {
                    for &a in &self.annotations.list {
                        let mut chunk = self.format.empty_chunk();
                        chunk["nvext"] = serde_json::json!({
                            "annotation": a.name(), "index": index, "value": a.value(&echo),
                        });
                        events.push(Event::default().event(a.name()).data(chunk.to_string()));
                    }
                }
                events.extend(self.format.echo(index, &echo));
                events
            }
            Piece::ToolCalls(calls) => vec![self.format.tool_calls(index, &calls)],
            Piece::Finished(reason) => vec![self.format.finish(index, reason)],
        }
    }
}
