//! The gRPC side: building calls (metadata, deadline) and reading one
//! `GenerateStream` call as a sequence of [`Step`]s.
//!
//! A [`Generation`] owns its `tonic::Streaming`; dropping it (for example
//! because the HTTP client went away and the SSE body was dropped) resets the
//! HTTP/2 stream, which cancels the generation on the service. Nothing else
//! holds the stream: no task is spawned here.

use std::time::Duration;

use axum::http::HeaderMap;
use gyre_api::v1::{self as pb, FinishReason, generate_response::Event};
use tokio::time::Instant;
use tonic::metadata::AsciiMetadataValue;
use tonic::{Status, Streaming};

use crate::AppState;
use crate::error::{Api, ApiError};
use crate::openai::response::Usage;

/// HTTP headers passed on to the service as gRPC metadata: W3C trace
/// context and the request id (both set by [`crate::observe::layer`]).
const FORWARDED_HEADERS: [&str; 3] = ["traceparent", "tracestate", crate::observe::REQUEST_ID];

/// Wraps `message` as a gRPC request: deadline, `authorization` (the
/// configured key, or else the HTTP client's own header), trace context and
/// request id.
pub fn grpc_request<T>(state: &AppState, headers: &HeaderMap, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(timeout) = state.request_timeout {
        request.set_timeout(timeout);
    }
    let metadata = request.metadata_mut();
    let client_auth = || {
        headers
            .get(http::header::AUTHORIZATION)
            .and_then(|v| AsciiMetadataValue::try_from(v.as_bytes()).ok())
            .map(|mut v| {
                v.set_sensitive(true);
                v
            })
    };
    if let Some(auth) = state.grpc_auth.clone().or_else(client_auth) {
        metadata.insert("authorization", auth);
    }
    for name in FORWARDED_HEADERS {
        let value = headers
            .get(name)
            .and_then(|v| AsciiMetadataValue::try_from(v.as_bytes()).ok());
        if let Some(value) = value {
            metadata.insert(name, value);
        }
    }
    request
}

/// Why a choice ended normally (errors and cancellations are errors).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Finish {
    #[default]
    Stop,
    Length,
    ToolCalls,
}

impl Finish {
    /// OpenAI's `finish_reason`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::ToolCalls => "tool_calls",
        }
    }
}

/// Something new of one choice.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    /// New text, with the log-probabilities of its tokens when requested
    /// (text may be empty only when logprobs are not).
    Text {
        text: String,
        logprobs: Vec<pb::TokenLogprob>,
    },
    /// New reasoning text (before any `Text` of the same delta).
    Reasoning(String),
    /// The prompt sent back (the request asked for `echo`), before any text.
    Echo(pb::PromptEcho),
    /// Tool calls, or fragments of them (after any text of the same delta).
    ToolCalls(Vec<pb::ToolCallDelta>),
    /// The choice ended.
    Finished(Finish),
}

/// What a generation produced next.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Something new of choice `index`.
    Choice { index: u32, piece: Piece },
    /// Every choice ended: token counts (prompt once, completions summed).
    End { usage: Usage },
}

/// One running `GenerateStream` call.
pub struct Generation {
    stream: Streaming<pb::GenerateResponse>,
    /// What the service said about the model (response metadata).
    notice: crate::notice::ModelNotice,
    /// Steps read ahead: the first (read by [`Generation::start`]) and the
    /// later pieces of a delta that carried several.
    peeked: std::collections::VecDeque<Step>,
    /// When the configured request timeout passes; the shim enforces it on
    /// the whole stream (tonic's own `grpc-timeout` only bounds the headers).
    deadline: Option<Instant>,
    api: Api,
    /// Choices requested, and how many have finished.
    n: u32,
    finished: u32,
    usage: Usage,
}

/// The whole output of one choice.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ChoiceOutput {
    pub text: String,
    /// Reasoning text (empty: none).
    pub reasoning: String,
    /// Log-probabilities of the text's tokens, when requested.
    pub logprobs: Vec<pb::TokenLogprob>,
    /// Whole tool calls, by call index (fragments joined).
    pub tool_calls: Vec<pb::ToolCallDelta>,
    /// The prompt sent back, when the request asked for it.
    pub echo: Option<pb::PromptEcho>,
    pub finish: Finish,
}

impl ChoiceOutput {
    /// Adds a piece of this choice.
    fn add(&mut self, piece: Piece) {
        match piece {
            Piece::Text { text, logprobs } => {
                self.text.push_str(&text);
                self.logprobs.extend(logprobs);
            }
            Piece::Reasoning(text) => self.reasoning.push_str(&text),
            Piece::Echo(echo) => self.echo = Some(echo),
            Piece::ToolCalls(calls) => {
                for call in calls {
                    // A later fragment of a call only adds argument text.
                    match self.tool_calls.iter_mut().find(|c| c.index == call.index) {
                        Some(c) => c.arguments.push_str(&call.arguments),
                        None => self.tool_calls.push(call),
                    }
                }
            }
            Piece::Finished(finish) => self.finish = finish,
        }
    }
}

/// The whole output of a generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Collected {
    /// Each choice's output, by index.
    pub choices: Vec<ChoiceOutput>,
    pub usage: Usage,
}

impl Generation {
    /// Starts the call and waits for its first step, so that errors the
    /// service reports before any output (bad input, unknown model, queue
    /// full) become HTTP errors rather than errors inside an event stream.
    /// With `patience`, it waits for the first step that long at most: a
    /// stream whose request waits longer (in a long queue) starts without
    /// it, so that its SSE heartbeats flow while it waits; a later error
    /// is then an error event of the stream.
    pub async fn start(
        state: &AppState,
        headers: &HeaderMap,
        request: pb::Request,
        api: Api,
        patience: Option<Duration>,
    ) -> Result<Self, ApiError> {
        let deadline = state.request_timeout.map(|t| Instant::now() + t);
        let n = request.n.unwrap_or(1).max(1);
        let mut client = state.client.clone();
        let response = client
            .generate_stream(grpc_request(state, headers, request))
            .await
            .map_err(|status| ApiError::from_status(&status, api))?;
        let notice = crate::notice::ModelNotice::from_metadata(response.metadata());
        let stream = response.into_inner();
        let mut generation = Self {
            stream,
            notice,
            peeked: Default::default(),
            deadline,
            api,
            n,
            finished: 0,
            usage: Usage::default(),
        };
        // `next` is cancel-safe: it awaits nothing but the next message.
        let first = match patience {
            Some(p) => tokio::time::timeout(p, generation.next()).await.ok(),
            None => Some(generation.next().await),
        };
        if let Some(first) = first {
            generation.peeked.push_front(first?);
        }
        Ok(generation)
    }

    /// The next step; deltas without text (token ids only) are skipped.
    /// Call no more after `Finished` or an error.
    pub async fn next(&mut self) -> Result<Step, ApiError> {
        if let Some(step) = self.peeked.pop_front() {
            return Ok(step);
        }
        if self.finished == self.n {
            return Ok(Step::End { usage: self.usage });
        }
        loop {
            let message = match self.deadline {
                Some(deadline) => tokio::time::timeout_at(deadline, self.stream.message())
                    .await
                    .unwrap_or_else(|_| Err(Status::deadline_exceeded("request timeout passed"))),
                None => self.stream.message().await,
            };
            let response = message
                .map_err(|status| ApiError::from_status(&status, self.api))?
                .ok_or_else(|| ApiError::internal("gRPC stream ended without a finish event"))?;
            let index = response.index;
            if index >= self.n {
                return Err(ApiError::internal(format!(
                    "event for choice {index} of {}",
                    self.n
                )));
            }
            let piece = |piece| Step::Choice { index, piece };
            match response.event {
                Some(Event::Delta(delta)) => {
                    // One delta in order: reasoning, text, tool calls.
                    let mut pieces = Vec::new();
                    if !delta.reasoning.is_empty() {
                        pieces.push(piece(Piece::Reasoning(delta.reasoning)));
                    }
                    if !delta.text.is_empty() || !delta.logprobs.is_empty() {
                        pieces.push(piece(Piece::Text {
                            text: delta.text,
                            logprobs: delta.logprobs,
                        }));
                    }
                    if !delta.tool_calls.is_empty() {
                        pieces.push(piece(Piece::ToolCalls(delta.tool_calls)));
                    }
                    // Token ids without text are skipped.
                    let mut pieces = pieces.into_iter();
                    if let Some(first) = pieces.next() {
                        self.peeked.extend(pieces);
                        return Ok(first);
                    }
                }
                Some(Event::Prompt(echo)) => return Ok(piece(Piece::Echo(echo))),
                // An event this shim does not know (`Rejected` belongs to the
                // bidi `Generate` call only).
                Some(Event::Rejected(_)) | None => {}
                Some(Event::Finish(finish)) => {
                    let (reason, usage) = finish_step(finish, self.api)?;
                    self.finished += 1;
                    self.usage.prompt_tokens = usage.prompt_tokens;
                    self.usage.prompt_tokens_details = usage.prompt_tokens_details;
                    self.usage.completion_tokens += usage.completion_tokens;
                    self.usage.add_details(usage.completion_tokens_details);
                    self.usage.total_tokens =
                        self.usage.prompt_tokens + self.usage.completion_tokens;
                    return Ok(piece(Piece::Finished(reason)));
                }
            }
        }
    }
}

/// Several generations (one per prompt of a batch) read as one: choice `j`
/// of prompt `i` becomes choice `i * n + j`, and the single `End` carries the
/// summed usage. Dropping it drops (cancels) every call.
pub struct Merged {
    /// The first call's model notice (every call of a batch names the same
    /// model).
    notice: crate::notice::ModelNotice,
    streams: futures::stream::SelectAll<
        futures::stream::BoxStream<'static, (u32, Result<Step, ApiError>)>,
    >,
    n: u32,
    remaining: usize,
    usage: Usage,
}

impl Merged {
    /// `n`: choices per generation.
    pub fn new(generations: Vec<Generation>, n: u32) -> Self {
        use futures::StreamExt;
        let remaining = generations.len();
        let notice = generations
            .first()
            .map(|g| g.notice.clone())
            .unwrap_or_default();
        let streams = generations.into_iter().zip(0u32..).map(|(g, i)| {
            futures::stream::unfold(Some(g), move |g| async move {
                let mut g = g?;
                let step = g.next().await;
                let last = matches!(step, Ok(Step::End { .. }) | Err(_));
                Some(((i, step), (!last).then_some(g)))
            })
            .boxed()
        });
        Self {
            notice,
            streams: futures::stream::select_all(streams),
            n: n.max(1),
            remaining,
            usage: Usage::default(),
        }
    }

    /// Starts one call per request (all must start, else the first error;
    /// `patience` as in [`Generation::start`]).
    pub async fn start(
        state: &AppState,
        headers: &HeaderMap,
        requests: Vec<pb::Request>,
        api: Api,
        patience: Option<Duration>,
    ) -> Result<Self, ApiError> {
        let n = requests.first().and_then(|r| r.n).unwrap_or(1);
        let starts = requests
            .into_iter()
            .map(|r| Generation::start(state, headers, r, api, patience));
        Ok(Self::new(futures::future::try_join_all(starts).await?, n))
    }

    /// What the service said about the model that serves these calls.
    pub fn notice(&self) -> &crate::notice::ModelNotice {
        &self.notice
    }

    /// The next step of any generation, with the merged choice index.
    pub async fn next(&mut self) -> Result<Step, ApiError> {
        use futures::StreamExt;
        loop {
            let Some((i, step)) = self.streams.next().await else {
                return Ok(Step::End { usage: self.usage });
            };
            let base = i * self.n;
            match step? {
                Step::Choice { index, piece } => {
                    return Ok(Step::Choice {
                        index: base + index,
                        piece,
                    });
                }
                Step::End { usage } => {
                    self.usage.prompt_tokens += usage.prompt_tokens;
                    self.usage.completion_tokens += usage.completion_tokens;
                    self.usage.total_tokens += usage.total_tokens;
                    self.usage.prompt_tokens_details.cached_tokens +=
                        usage.prompt_tokens_details.cached_tokens;
                    self.usage.add_details(usage.completion_tokens_details);
                    self.remaining -= 1;
                    if self.remaining == 0 {
                        return Ok(Step::End { usage: self.usage });
                    }
                }
            }
        }
    }

    /// Reads every generation to its end: choices in merged index order.
    pub async fn collect(mut self, choices: u32) -> Result<Collected, ApiError> {
        let mut out = vec![ChoiceOutput::default(); choices as usize];
        loop {
            match self.next().await? {
                Step::Choice { index, piece } => out
                    .get_mut(index as usize)
                    .ok_or_else(|| ApiError::internal(format!("choice {index} out of range")))?
                    .add(piece),
                Step::End { usage } => {
                    return Ok(Collected {
                        choices: out,
                        usage,
                    });
                }
            }
        }
    }
}

/// Maps a `Finish` event: STOP / LENGTH end normally, CANCELLED / ERROR are
/// errors (the service cancelled, since this client did not).
fn finish_step(finish: pb::Finish, api: Api) -> Result<(Finish, Usage), ApiError> {
    let usage = Usage::from(finish.usage.unwrap_or_default());
    let reason = match FinishReason::try_from(finish.reason) {
        Ok(FinishReason::Stop) => Finish::Stop,
        Ok(FinishReason::Length) => Finish::Length,
        Ok(FinishReason::ToolCalls) => Finish::ToolCalls,
        Ok(reason @ (FinishReason::Cancelled | FinishReason::Error)) => {
            return Err(match (&finish.error, reason) {
                (Some(error), _) => ApiError::from_request_error(error, api),
                (None, FinishReason::Cancelled) => ApiError::from_status(
                    &tonic::Status::cancelled("the service cancelled the request"),
                    api,
                ),
                (None, _) => ApiError::internal("finish reason ERROR without an error"),
            });
        }
        Ok(FinishReason::Unspecified) | Err(_) => {
            tracing::warn!(
                reason = finish.reason,
                "unknown finish reason, reporting stop"
            );
            Finish::Stop
        }
    };
    Ok((reason, usage))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finish(reason: FinishReason, error: Option<pb::RequestError>) -> pb::Finish {
        pb::Finish {
            reason: reason as i32,
            usage: Some(pb::Usage {
                prompt_tokens: 4,
                completion_tokens: 2,
                cached_tokens: 0,
                ..Default::default()
            }),
            error,
            ..Default::default()
        }
    }

    #[test]
    fn finish_reasons_map() {
        let (reason, usage) =
            finish_step(finish(FinishReason::Length, None), Api::Chat).expect("ok");
        assert_eq!((reason, usage.total_tokens), (Finish::Length, 6));
        let (reason, _) = finish_step(finish(FinishReason::Stop, None), Api::Chat).expect("ok");
        assert_eq!(reason, Finish::Stop);
        let (reason, _) =
            finish_step(finish(FinishReason::ToolCalls, None), Api::Chat).expect("ok");
        assert_eq!(reason.as_str(), "tool_calls");
    }

    #[test]
    fn error_finishes_are_errors() {
        let error = pb::RequestError {
            code: tonic::Code::InvalidArgument as i32,
            message: "prompt too long".into(),
            reason: "PROMPT_TOO_LONG".into(),
            field: String::new(),
        };
        let err =
            finish_step(finish(FinishReason::Error, Some(error)), Api::Chat).expect_err("error");
        assert_eq!(err.status(), http::StatusCode::BAD_REQUEST);
        let err =
            finish_step(finish(FinishReason::Cancelled, None), Api::Chat).expect_err("cancelled");
        assert_eq!(err.status(), http::StatusCode::SERVICE_UNAVAILABLE);
        let err = finish_step(finish(FinishReason::Error, None), Api::Chat).expect_err("error");
        assert_eq!(err.status(), http::StatusCode::INTERNAL_SERVER_ERROR);
    }

    fn call(index: u32, id: &str, name: &str, arguments: &str) -> pb::ToolCallDelta {
        pb::ToolCallDelta {
            index,
            id: id.into(),
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    #[test]
    fn a_choice_joins_its_pieces_and_call_fragments() {
        let mut c = ChoiceOutput::default();
        c.add(Piece::Reasoning("think".into()));
        c.add(Piece::Text {
            text: "Hi".into(),
            logprobs: Vec::new(),
        });
        c.add(Piece::ToolCalls(vec![call(0, "a1", "f", "{\"x\":")]));
        c.add(Piece::ToolCalls(vec![
            call(0, "", "", " 1}"),
            call(1, "b2", "g", "{}"),
        ]));
        c.add(Piece::Finished(Finish::ToolCalls));
        assert_eq!((c.text.as_str(), c.reasoning.as_str()), ("Hi", "think"));
        assert_eq!(
            c.tool_calls,
            vec![call(0, "a1", "f", "{\"x\": 1}"), call(1, "b2", "g", "{}")]
        );
        assert_eq!(c.finish, Finish::ToolCalls);
    }
}
