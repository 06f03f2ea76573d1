//! The multiplexed `Generate` call: [`Session`] and [`SessionSender`], many
//! requests on one stream, each under its own id and cancellable.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use futures::Stream;
use tokio::sync::mpsc;

use crate::v1;

use super::*;

/// The sending half of a [`Session`]: starts and cancels requests. Clone it
/// to send from other tasks.
#[derive(Debug, Clone)]
pub struct SessionSender {
    pub(super) tx: Option<mpsc::Sender<v1::GenerateRequest>>,
    pub(super) ids: Arc<AtomicU64>,
    pub(super) prefix: String,
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
    pub(super) sender: SessionSender,
    pub(super) events: tonic::Streaming<v1::GenerateResponse>,
    pub(super) ended: bool,
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
