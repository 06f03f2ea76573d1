//! The gRPC side: building calls (metadata, deadline) and reading one
//! `GenerateStream` call as a sequence of [`Step`]s.
//!
//! A [`Generation`] owns its `tonic::Streaming`; dropping it (for example
//! because the HTTP client went away and the SSE body was dropped) resets the
//! HTTP/2 stream, which cancels the generation on the service. Nothing else
//! holds the stream: no task is spawned here.

use axum::http::HeaderMap;
use gyre_api::v1::{self as pb, FinishReason, generate_response::Event};
use tokio::time::Instant;
use tonic::metadata::AsciiMetadataValue;
use tonic::{Status, Streaming};

use crate::AppState;
use crate::error::{Api, ApiError};
use crate::openai::response::Usage;

/// HTTP headers passed on to the service as gRPC metadata (W3C trace context).
const FORWARDED_HEADERS: [&str; 2] = ["traceparent", "tracestate"];

/// Wraps `message` as a gRPC request: deadline, `authorization` (the
/// configured key, or else the HTTP client's own header) and trace context.
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

/// What a generation produced next.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// New text of choice `index`, with the log-probabilities of its tokens
    /// when requested (text may be empty only when logprobs are not).
    Text {
        index: u32,
        text: String,
        logprobs: Vec<pb::TokenLogprob>,
    },
    /// New reasoning text of choice `index` (before any `Text` of the same
    /// delta).
    Reasoning { index: u32, text: String },
    /// The prompt sent back for choice `index` (the request asked for
    /// `echo`), before any of its text.
    Echo { index: u32, echo: pb::PromptEcho },
    /// Tool calls choice `index` made (after any text of the same delta).
    ToolCalls {
        index: u32,
        calls: Vec<pb::ToolCallDelta>,
    },
    /// Choice `index` ended with OpenAI's `finish_reason`.
    Finished { index: u32, reason: &'static str },
    /// Every choice ended: token counts (prompt once, completions summed).
    End { usage: Usage },
}

/// One running `GenerateStream` call.
pub struct Generation {
    stream: Streaming<pb::GenerateResponse>,
    /// Steps read ahead: the first (read by [`Generation::start`]) and the
    /// answer text of a delta that also carried reasoning.
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

/// The whole output of a generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Collected {
    /// Text, finish reason and token logprobs of each choice, by index.
    pub choices: Vec<(String, &'static str, Vec<pb::TokenLogprob>)>,
    /// The tool calls of each choice, by index.
    pub tool_calls: Vec<Vec<pb::ToolCallDelta>>,
    /// The prompt sent back for each choice, when the request asked for it.
    pub echoes: Vec<Option<pb::PromptEcho>>,
    /// Reasoning text of each choice, by index (empty: none).
    pub reasoning: Vec<String>,
    pub usage: Usage,
}

impl Generation {
    /// Starts the call and waits for its first step, so that errors the
    /// service reports before any output (bad input, unknown model, queue
    /// full) become HTTP errors rather than errors inside an event stream.
    pub async fn start(
        state: &AppState,
        headers: &HeaderMap,
        request: pb::Request,
        api: Api,
    ) -> Result<Self, ApiError> {
        let deadline = state.request_timeout.map(|t| Instant::now() + t);
        let n = request.n.unwrap_or(1).max(1);
        let mut client = state.client.clone();
        let stream = client
            .generate_stream(grpc_request(state, headers, request))
            .await
            .map_err(|status| ApiError::from_status(&status, api))?
            .into_inner();
        let mut generation = Self {
            stream,
            peeked: Default::default(),
            deadline,
            api,
            n,
            finished: 0,
            usage: Usage::default(),
        };
        let first = generation.next().await?;
        generation.peeked.push_front(first);
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
            match response.event {
                Some(Event::Delta(mut delta)) if !delta.reasoning.is_empty() => {
                    let text = std::mem::take(&mut delta.reasoning);
                    if !delta.text.is_empty() || !delta.logprobs.is_empty() {
                        self.peeked.push_back(Step::Text {
                            index,
                            text: delta.text,
                            logprobs: delta.logprobs,
                        });
                    }
                    if !delta.tool_calls.is_empty() {
                        self.peeked.push_back(Step::ToolCalls {
                            index,
                            calls: delta.tool_calls,
                        });
                    }
                    return Ok(Step::Reasoning { index, text });
                }
                Some(Event::Delta(delta))
                    if !delta.text.is_empty() || !delta.logprobs.is_empty() =>
                {
                    if !delta.tool_calls.is_empty() {
                        self.peeked.push_back(Step::ToolCalls {
                            index,
                            calls: delta.tool_calls,
                        });
                    }
                    return Ok(Step::Text {
                        index,
                        text: delta.text,
                        logprobs: delta.logprobs,
                    });
                }
                Some(Event::Delta(delta)) if !delta.tool_calls.is_empty() => {
                    return Ok(Step::ToolCalls {
                        index,
                        calls: delta.tool_calls,
                    });
                }
                Some(Event::Prompt(echo)) => return Ok(Step::Echo { index, echo }),
                // Token ids without text, or an event this shim does not know
                // (`Rejected` belongs to the bidi `Generate` call only).
                Some(Event::Delta(_) | Event::Rejected(_)) | None => {}
                Some(Event::Finish(finish)) => {
                    let (reason, usage) = finish_step(finish, self.api)?;
                    self.finished += 1;
                    self.usage.prompt_tokens = usage.prompt_tokens;
                    self.usage.prompt_tokens_details = usage.prompt_tokens_details;
                    self.usage.completion_tokens += usage.completion_tokens;
                    self.usage.add_reasoning(usage.completion_tokens_details);
                    self.usage.total_tokens =
                        self.usage.prompt_tokens + self.usage.completion_tokens;
                    return Ok(Step::Finished { index, reason });
                }
            }
        }
    }
}

/// Several generations (one per prompt of a batch) read as one: choice `j`
/// of prompt `i` becomes choice `i * n + j`, and the single `End` carries the
/// summed usage. Dropping it drops (cancels) every call.
pub struct Merged {
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
            streams: futures::stream::select_all(streams),
            n: n.max(1),
            remaining,
            usage: Usage::default(),
        }
    }

    /// Starts one call per request (all must start, else the first error).
    pub async fn start(
        state: &AppState,
        headers: &HeaderMap,
        requests: Vec<pb::Request>,
        api: Api,
    ) -> Result<Self, ApiError> {
        let n = requests.first().and_then(|r| r.n).unwrap_or(1);
        let starts = requests
            .into_iter()
            .map(|r| Generation::start(state, headers, r, api));
        Ok(Self::new(futures::future::try_join_all(starts).await?, n))
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
                Step::Text {
                    index,
                    text,
                    logprobs,
                } => {
                    return Ok(Step::Text {
                        index: base + index,
                        text,
                        logprobs,
                    });
                }
                Step::Reasoning { index, text } => {
                    return Ok(Step::Reasoning {
                        index: base + index,
                        text,
                    });
                }
                Step::Echo { index, echo } => {
                    return Ok(Step::Echo {
                        index: base + index,
                        echo,
                    });
                }
                Step::ToolCalls { index, calls } => {
                    return Ok(Step::ToolCalls {
                        index: base + index,
                        calls,
                    });
                }
                Step::Finished { index, reason } => {
                    return Ok(Step::Finished {
                        index: base + index,
                        reason,
                    });
                }
                Step::End { usage } => {
                    self.usage.prompt_tokens += usage.prompt_tokens;
                    self.usage.completion_tokens += usage.completion_tokens;
                    self.usage.total_tokens += usage.total_tokens;
                    self.usage.prompt_tokens_details.cached_tokens +=
                        usage.prompt_tokens_details.cached_tokens;
                    self.usage.add_reasoning(usage.completion_tokens_details);
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
        let mut out = vec![(String::new(), "stop", Vec::new()); choices as usize];
        let mut echoes = vec![None; choices as usize];
        let mut tool_calls = vec![Vec::new(); choices as usize];
        let mut reasoning = vec![String::new(); choices as usize];
        loop {
            match self.next().await? {
                Step::ToolCalls { index, calls } => {
                    if let Some(c) = tool_calls.get_mut(index as usize) {
                        c.extend(calls);
                    }
                }
                Step::Text {
                    index,
                    text,
                    logprobs,
                } => {
                    let c = out.get_mut(index as usize).ok_or_else(|| {
                        ApiError::internal(format!("choice {index} out of range"))
                    })?;
                    c.0.push_str(&text);
                    c.2.extend(logprobs);
                }
                Step::Reasoning { index, text } => {
                    if let Some(r) = reasoning.get_mut(index as usize) {
                        r.push_str(&text);
                    }
                }
                Step::Echo { index, echo } => {
                    if let Some(e) = echoes.get_mut(index as usize) {
                        *e = Some(echo);
                    }
                }
                Step::Finished { index, reason } => {
                    if let Some(c) = out.get_mut(index as usize) {
                        c.1 = reason;
                    }
                }
                Step::End { usage } => {
                    return Ok(Collected {
                        choices: out,
                        echoes,
                        tool_calls,
                        reasoning,
                        usage,
                    });
                }
            }
        }
    }
}

/// Maps a `Finish` event: STOP / LENGTH end normally, CANCELLED / ERROR are
/// errors (the service cancelled, since this client did not).
fn finish_step(finish: pb::Finish, api: Api) -> Result<(&'static str, Usage), ApiError> {
    let usage = Usage::from(finish.usage.unwrap_or_default());
    let reason = match FinishReason::try_from(finish.reason) {
        Ok(FinishReason::Stop) => "stop",
        Ok(FinishReason::Length) => "length",
        Ok(FinishReason::ToolCalls) => "tool_calls",
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
            "stop"
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
        assert_eq!((reason, usage.total_tokens), ("length", 6));
        let (reason, _) = finish_step(finish(FinishReason::Stop, None), Api::Chat).expect("ok");
        assert_eq!(reason, "stop");
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
}
