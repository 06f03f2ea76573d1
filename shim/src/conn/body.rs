//! The HTTP API's request-body timeout: a request whose body has not fully
//! arrived within the timeout (counted from the request head) is answered
//! 408 in the OpenAI error shape with `Connection: close`, and the
//! connection is closed after that response.
//!
//! The body is wrapped, not read here: a handler reads it as before (after
//! the API-key check), and the wrapper fails the read once the deadline
//! passes; the middleware then replaces whatever the handler answered to the
//! failed read with the 408. Bodies are only ever read whole (JSON), so a
//! response never starts before its body has arrived.
//!
//! gRPC has no such timeout: its request bodies are streams (the bidi
//! `Generate` call sends for as long as the client likes); a peer that stops
//! answering is caught by the HTTP/2 keepalive instead.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body::{Frame, SizeHint};

use crate::error::ApiError;

/// Middleware (`axum::middleware::from_fn_with_state`) enforcing `timeout`
/// on the request body.
pub async fn body_deadline(State(timeout): State<Duration>, req: Request, next: Next) -> Response {
    let expired = Arc::new(AtomicBool::new(false));
    let req = req.map(|body| {
        Body::new(TimedBody {
            inner: body,
            sleep: Box::pin(tokio::time::sleep(timeout)),
            expired: expired.clone(),
            done: false,
        })
    });
    let response = next.run(req).await;
    if expired.load(Ordering::SeqCst) {
        let mut response = ApiError::request_timeout(timeout).into_response();
        response.headers_mut().insert(
            http::header::CONNECTION,
            http::HeaderValue::from_static("close"),
        );
        return response;
    }
    response
}

/// The body's deadline passed before its end arrived.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within the body timeout")]
pub struct BodyTimeout;

struct TimedBody {
    inner: Body,
    sleep: Pin<Box<tokio::time::Sleep>>,
    expired: Arc<AtomicBool>,
    /// The whole body arrived: the deadline no longer applies.
    done: bool,
}

impl http_body::Body for TimedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                if frame.is_none() || this.inner.is_end_stream() {
                    this.done = true;
                }
                Poll::Ready(frame)
            }
            Poll::Pending => match this.sleep.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    this.expired.store(true, Ordering::SeqCst);
                    this.done = true;
                    Poll::Ready(Some(Err(axum::Error::new(BodyTimeout))))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
