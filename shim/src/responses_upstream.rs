//! The gRPC side of the Responses API: one `Responses.Create` (or `Replay`)
//! call read as proto `ResponseEvent`s, and its framing as SSE.
//!
//! An [`EventStream`] owns its `tonic::Streaming`: dropping it (the HTTP
//! client went away) cancels the call, which the service turns into a
//! cancelled response unless it runs in the background. The first event is
//! read before any HTTP answer, so that errors the service reports before
//! any output (bad input, unknown id or model) become HTTP errors; an error
//! after that is an `error` event numbered after the last event sent, and
//! the stream ends. There is no `[DONE]`: the Responses stream ends with its
//! terminal event.

use std::convert::Infallible;

use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, stream};
use gyre_api::v1 as pb;
use tokio::time::Instant;
use tonic::{Status, Streaming};

use crate::AppState;
use crate::error::{Api, ApiError};
use crate::notice::ModelNotice;
use crate::openai::responses_events::{error_event, event, terminal};

/// A running `Create` or `Replay` call.
pub struct EventStream {
    stream: Streaming<pb::ResponseEvent>,
    /// The first event, read by [`EventStream::start`] (`None` once taken or
    /// when the call had none).
    first: Option<pb::ResponseEvent>,
    started: bool,
    /// When the configured request timeout passes (enforced on the whole
    /// stream, as for chat).
    deadline: Option<Instant>,
    /// The sequence number of the last event read.
    last_seq: Option<u64>,
    done: bool,
    /// The SSE heartbeat's interval (see `keepalive`).
    heartbeat: Option<std::time::Duration>,
    /// The call's response metadata as headers (rate limits).
    notice: ModelNotice,
}

impl EventStream {
    /// Reads the first event of `stream` (an error there is the call's).
    pub async fn start(
        state: &AppState,
        stream: Result<tonic::Response<Streaming<pb::ResponseEvent>>, Status>,
    ) -> Result<Self, ApiError> {
        let deadline = state.request_timeout.map(|t| Instant::now() + t);
        let stream = stream.map_err(|s| ApiError::from_status(&s, Api::Responses))?;
        let notice = ModelNotice::from_metadata(stream.metadata());
        let stream = stream.into_inner();
        let mut this = Self {
            stream,
            first: None,
            started: false,
            deadline,
            last_seq: None,
            done: false,
            heartbeat: state.sse_heartbeat,
            notice,
        };
        this.first = this.read().await?;
        this.started = true;
        Ok(this)
    }

    /// The next event from the service; `None` at the end of the call.
    async fn read(&mut self) -> Result<Option<pb::ResponseEvent>, ApiError> {
        if self.started
            && let Some(first) = self.first.take()
        {
            return Ok(Some(first));
        }
        let message = match self.deadline {
            Some(deadline) => tokio::time::timeout_at(deadline, self.stream.message())
                .await
                .unwrap_or_else(|_| Err(Status::deadline_exceeded("request timeout passed"))),
            None => self.stream.message().await,
        };
        let message = message.map_err(|s| ApiError::from_status(&s, Api::Responses))?;
        if let Some(e) = &message {
            self.last_seq = Some(e.sequence_number);
        }
        Ok(message)
    }

    /// The call's headers for the HTTP answer (see [`ModelNotice::apply`]).
    pub fn notice(&self) -> &ModelNotice {
        &self.notice
    }

    /// Reads on until the response is final and returns it: the
    /// `completed`, `incomplete` or `failed` response, or with `background`
    /// the first (queued) one, leaving the generation running.
    pub async fn final_response(mut self, background: bool) -> Result<pb::Response, ApiError> {
        use pb::response_event::Event as E;
        while let Some(e) = self.read().await? {
            if let Some(r) = terminal(&e) {
                return Ok(r.clone());
            }
            match e.event {
                Some(E::Created(r) | E::Queued(r)) if background => return Ok(r),
                Some(E::Error(err)) => {
                    return Err(ApiError::internal(format!(
                        "error event {}: {}",
                        err.code, err.message
                    )));
                }
                _ => {}
            }
        }
        Err(ApiError::internal(
            "the Responses stream ended without a final response",
        ))
    }

    /// The next SSE event, or `None` once the stream is over.
    async fn next_sse(&mut self) -> Option<Event> {
        if self.done {
            return None;
        }
        match self.read().await {
            Ok(Some(e)) => {
                let (kind, json) = event(&e);
                self.done = terminal(&e).is_some() || kind == "error";
                Some(Event::default().event(kind).data(json.to_string()))
            }
            Ok(None) => None,
            Err(err) => {
                self.done = true;
                let seq = self.last_seq.map_or(0, |s| s + 1);
                let body = err.body();
                let field = |k: &str| body["error"][k].as_str().map(str::to_owned);
                let (kind, json) = error_event(
                    seq,
                    &field("code").unwrap_or_else(|| "server_error".into()),
                    &field("message").unwrap_or_default(),
                    field("param").as_deref(),
                );
                Some(Event::default().event(kind).data(json.to_string()))
            }
        }
    }

    /// The SSE events of the rest of the call.
    pub fn sse_events(self) -> impl Stream<Item = Result<Event, Infallible>> + Send + 'static {
        stream::unfold(self, |mut s| async move {
            let event = s.next_sse().await?;
            Some((Ok(event), s))
        })
    }

    /// The SSE answer. `X-Accel-Buffering: no` asks reverse proxies to pass
    /// events on as they come.
    pub fn sse(self) -> Response {
        let (heartbeat, notice) = (self.heartbeat, self.notice.clone());
        let sse = crate::keepalive::heartbeat(Sse::new(self.sse_events()), heartbeat);
        notice.apply(([("x-accel-buffering", "no")], sse).into_response())
    }
}
