//! What comes back: a request's typed [`Event`]s, its stream
//! ([`EventStream`]) and the collected [`Completion`].

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Stream;

use crate::v1;

use super::*;

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
pub(super) fn event_of(r: v1::GenerateResponse) -> Option<Result<Event>> {
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
    pub(super) model: Option<String>,
    pub(super) request_id: Option<String>,
    pub(super) inner: tonic::Streaming<v1::GenerateResponse>,
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
