//! What the HTTP API records about each request: its request id, its span
//! and its access log line.
//!
//! [`layer`] is the outermost middleware, so every response carries the id,
//! errors from any layer included. The id is the client's `X-Request-Id`
//! (or `X-Request-Trace`, an alias some gateways use), else a fresh UUID;
//! a malformed one is refused with 400. It is written back into the
//! request's headers, which [`crate::upstream::grpc_request`] forwards to
//! the service as `x-request-id` metadata, and returned as `X-Request-Id`
//! (and as `X-Request-Trace` when the client sent that).
//!
//! With tracing on, the request gets a server span, child of the caller's
//! W3C `traceparent` when it sent one; the request's `traceparent` header is
//! replaced by this span's, so the service's span becomes its child. The
//! span, and the `gyre::http` log line, end when the response body has been
//! sent (or dropped), so a stream is counted whole.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll};
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::{IntoResponse as _, Response};
use http::HeaderValue;
use opentelemetry::KeyValue;
use opentelemetry::trace::{SpanKind, Status, TraceContextExt as _, Tracer as _};

use crate::error::ApiError;
use crate::telemetry::{self, HeaderCarrier, HeaderWriter};

/// The request id header, both ways (and gRPC metadata to the service).
pub const REQUEST_ID: &str = "x-request-id";
/// Accepted as the request id when `X-Request-Id` is absent, and echoed.
pub const REQUEST_TRACE: &str = "x-request-trace";
/// Longest accepted request id, in bytes.
pub const MAX_REQUEST_ID_BYTES: usize = 128;

/// What the inner [`route`] middleware tells the outer [`layer`]: the
/// matched route, once routing has happened.
#[derive(Clone, Default)]
struct RouteSlot(Arc<Mutex<Option<String>>>);

/// A client's request id when it is usable: 1 to 128 visible ASCII bytes.
pub fn valid_request_id(v: &HeaderValue) -> Option<&str> {
    let s = v.to_str().ok()?;
    let ok =
        !s.is_empty() && s.len() <= MAX_REQUEST_ID_BYTES && s.bytes().all(|b| b.is_ascii_graphic());
    ok.then_some(s)
}

fn new_request_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// The outermost middleware (see the module's comment).
pub async fn layer(mut req: Request, next: Next) -> Response {
    let start = Instant::now();
    let method = req.method().as_str().to_owned();
    let path = req.uri().path().to_owned();
    let echo_trace = req.headers().contains_key(REQUEST_TRACE);
    let given = req
        .headers()
        .get(REQUEST_ID)
        .or_else(|| req.headers().get(REQUEST_TRACE))
        .cloned();
    let (id, refused) = match given.as_ref().map(valid_request_id) {
        None => (new_request_id(), None),
        Some(Some(id)) => (id.to_owned(), None),
        Some(None) => (
            new_request_id(),
            Some(
                ApiError::invalid_request(
                    format!(
                        "X-Request-Id must be 1 to {MAX_REQUEST_ID_BYTES} visible ASCII characters"
                    ),
                    Some("X-Request-Id"),
                )
                .with_code(Some("invalid_request_id".into())),
            ),
        ),
    };
    let id_value = HeaderValue::try_from(id.as_str()).ok();
    if let Some(v) = &id_value {
        req.headers_mut().insert(REQUEST_ID, v.clone());
    }
    let slot = RouteSlot::default();
    req.extensions_mut().insert(slot.clone());
    let cx = telemetry::enabled().then(|| {
        let parent = telemetry::extract(&HeaderCarrier(req.headers()));
        let tracer = opentelemetry::global::tracer(telemetry::TRACER);
        let span = tracer
            .span_builder(method.clone())
            .with_kind(SpanKind::Server)
            .with_attributes([
                KeyValue::new("http.request.method", method.clone()),
                KeyValue::new("url.path", path.clone()),
                KeyValue::new("gyre.request_id", id.clone()),
            ])
            .start_with_context(&tracer, &parent);
        let cx = parent.with_span(span);
        telemetry::inject(&cx, &mut HeaderWriter(req.headers_mut()));
        req.extensions_mut().insert(cx.clone());
        cx
    });
    let mut resp = match refused {
        Some(e) => e.into_response(),
        None => next.run(req).await,
    };
    if let Some(v) = id_value {
        if echo_trace {
            resp.headers_mut().insert(REQUEST_TRACE, v.clone());
        }
        resp.headers_mut().insert(REQUEST_ID, v);
    }
    let done = Done {
        id,
        method,
        path,
        route: slot,
        status: resp.status().as_u16(),
        start,
        cx,
    };
    resp.map(|body| {
        Body::new(Observed {
            inner: body,
            done: Some(done),
        })
    })
}

/// Inside the router: names the matched route for [`layer`] (and its span).
pub async fn route(req: Request, next: Next) -> Response {
    let matched = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_owned());
    if let (Some(route), Some(slot)) = (matched, req.extensions().get::<RouteSlot>()) {
        if let Some(cx) = req.extensions().get::<opentelemetry::Context>() {
            let span = cx.span();
            span.update_name(format!("{} {route}", req.method()));
            span.set_attribute(KeyValue::new("http.route", route.clone()));
        }
        if let Ok(mut g) = slot.0.lock() {
            *g = Some(route);
        }
    }
    next.run(req).await
}

/// What is recorded when the response body ends.
struct Done {
    id: String,
    method: String,
    path: String,
    route: RouteSlot,
    status: u16,
    start: Instant,
    cx: Option<opentelemetry::Context>,
}

impl Done {
    fn finish(self, completed: bool) {
        let latency_ms = self.start.elapsed().as_secs_f64() * 1000.0;
        let route = self.route.0.lock().ok().and_then(|mut g| g.take());
        let route = route.as_deref().unwrap_or(&self.path);
        tracing::info!(
            target: "gyre::http",
            request_id = %self.id,
            method = %self.method,
            route,
            status = self.status,
            latency_ms,
            completed,
            "request finished"
        );
        if let Some(cx) = self.cx {
            let span = cx.span();
            span.set_attribute(KeyValue::new(
                "http.response.status_code",
                i64::from(self.status),
            ));
            if self.status >= 500 {
                span.set_status(Status::error(format!("HTTP {}", self.status)));
            }
            span.end();
        }
    }
}

/// A response body that calls [`Done::finish`] once it ends or is dropped.
struct Observed {
    inner: Body,
    done: Option<Done>,
}

impl http_body::Body for Observed {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => {
                if let Some(d) = self.done.take() {
                    d.finish(true);
                }
            }
            // The last frame: hyper may drop the body without polling on.
            Poll::Ready(Some(Ok(_))) if self.inner.is_end_stream() => {
                if let Some(d) = self.done.take() {
                    d.finish(true);
                }
            }
            Poll::Ready(Some(Err(_))) => {
                if let Some(d) = self.done.take() {
                    d.finish(false);
                }
            }
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Observed {
    fn drop(&mut self) {
        if let Some(d) = self.done.take() {
            d.finish(false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_short_visible_ascii() {
        for ok in ["a", "req-1", &"x".repeat(MAX_REQUEST_ID_BYTES)] {
            let v = HeaderValue::try_from(ok).expect("header");
            assert_eq!(valid_request_id(&v), Some(ok));
        }
        let long = "x".repeat(MAX_REQUEST_ID_BYTES + 1);
        for bad in ["", "a b", long.as_str()] {
            let v = HeaderValue::try_from(bad).expect("header");
            assert_eq!(valid_request_id(&v), None, "{bad:?}");
        }
    }
}
