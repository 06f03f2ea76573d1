//! `Idempotency-Key` on the POST routes that create something (chat
//! completions, completions, responses, embeddings), after the IETF httpapi
//! draft "The Idempotency-Key HTTP Header Field".
//!
//! It lives in the shim because a replay must give back the HTTP answer
//! itself (status, body, headers), which only the shim has; keys are scoped
//! by a SHA-256 hash of the request's `Authorization` value (the tenant's
//! key; no `Authorization`, one shared anonymous scope), so one tenant can
//! neither see nor block another's keys. Only hashes are kept: the scope is
//! `SHA-256(SHA-256(authorization) || key)`, and the request's fingerprint
//! is `SHA-256(method, path, canonical JSON body)` (object keys sorted, no
//! insignificant whitespace; a body that is not JSON is hashed as it is).
//!
//! - First use of a key: the request runs; a 2xx answer whose body is sent
//!   to its end is stored, a streamed one as the whole SSE body. A 4xx or
//!   5xx answer, a body that breaks off before its end (the client went
//!   away) and a body over [`MAX_STORED_RESPONSE_BYTES`] are not stored:
//!   the key is free again, and a retry runs afresh. (A stream's status is
//!   sent first, so one that ends with an `error` event is stored as sent.)
//! - The same key and fingerprint again: the stored answer, with
//!   `Idempotent-Replayed: true` (a stream comes back as the same events at
//!   once; SSE clients read it as they read the first). While the first is
//!   still running: 409 `idempotency_key_in_use` with `Retry-After: 1`.
//! - The same key with another fingerprint (another body or route): 422
//!   `idempotency_key_reused`.
//! - A key expires [`Settings::ttl`] after its answer was stored. At most
//!   [`Settings::max_keys`] keys and [`Settings::max_bytes`] of stored
//!   answers are kept; the oldest stored answers go first. When every slot
//!   holds a running request, a new key gets 429 `idempotency_keys_exhausted`.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use http_body::Frame;
use http_body_util::BodyExt as _;
use sha2::{Digest, Sha256};

use crate::error::{ApiError, INVALID_REQUEST};

/// The request header.
pub const HEADER: &str = "idempotency-key";
/// Set on a replayed answer.
pub const REPLAYED: &str = "idempotent-replayed";
/// Longest accepted key, in bytes.
pub const MAX_KEY_LEN: usize = 255;
/// Largest answer body kept for replay.
pub const MAX_STORED_RESPONSE_BYTES: usize = 16 << 20;

/// The routes that take the header (others ignore it).
const ROUTES: [&str; 6] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/responses",
    "/v1/embeddings",
    "/embeddings",
];

/// Answer headers not stored for replay: those of the connection, and those
/// the outer layers (CORS) set for each request.
const NOT_STORED: [&str; 5] = [
    "content-length",
    "transfer-encoding",
    "connection",
    "date",
    "vary",
];

/// How long keys live and how many are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// How long a stored answer is replayed.
    pub ttl: Duration,
    /// Most keys kept (running and stored).
    pub max_keys: usize,
    /// Most bytes of stored answers (bodies and headers).
    pub max_bytes: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(24 * 3600),
            max_keys: 10_000,
            max_bytes: 256 << 20,
        }
    }
}

/// The `Idempotency-Key` flags of `gyre serve` and `gyre-shim`.
#[derive(Debug, Clone, clap::Args)]
pub struct IdempotencyArgs {
    /// Seconds an `Idempotency-Key`'s stored answer is replayed.
    #[arg(long, env = "GYRE_IDEMPOTENCY_TTL_SECS", default_value_t = 86_400,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub idempotency_ttl_secs: u64,
    /// Most `Idempotency-Key`s kept (running and stored); the oldest stored
    /// answers go first.
    #[arg(long, env = "GYRE_IDEMPOTENCY_MAX_KEYS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub idempotency_max_keys: u64,
    /// Most MiB of stored answers kept for `Idempotency-Key` replays.
    #[arg(long, env = "GYRE_IDEMPOTENCY_MAX_MIB", default_value_t = 256,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub idempotency_max_mib: u64,
}

impl IdempotencyArgs {
    pub fn settings(&self) -> Settings {
        Settings {
            ttl: Duration::from_secs(self.idempotency_ttl_secs),
            max_keys: usize::try_from(self.idempotency_max_keys).unwrap_or(usize::MAX),
            max_bytes: usize::try_from(self.idempotency_max_mib.saturating_mul(1 << 20))
                .unwrap_or(usize::MAX),
        }
    }
}

mod store;

pub use store::Store;
use store::{Hash, Lookup, Stored};

/// The key's value: a structured-field string (`"..."`) as the draft
/// writes it, or the bare token many clients send; visible ASCII, 1 to
/// [`MAX_KEY_LEN`] bytes.
fn parse_key(headers: &HeaderMap) -> Result<Option<Vec<u8>>, ApiError> {
    let mut values = headers.get_all(HEADER).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(bad_key("send one Idempotency-Key header, not several"));
    }
    let raw = value.as_bytes().trim_ascii();
    let key = match raw {
        [b'"', inner @ .., b'"'] => inner,
        _ => raw,
    };
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Err(bad_key(&format!(
            "the Idempotency-Key must be 1 to {MAX_KEY_LEN} characters"
        )));
    }
    if !key.iter().all(|b| (0x20..0x7f).contains(b)) {
        return Err(bad_key("the Idempotency-Key must be printable ASCII"));
    }
    Ok(Some(key.to_vec()))
}

fn bad_key(why: &str) -> ApiError {
    ApiError::new(
        StatusCode::BAD_REQUEST,
        INVALID_REQUEST,
        format!("Invalid Idempotency-Key header: {why}."),
    )
    .with_code(Some("invalid_idempotency_key".into()))
}

fn in_use() -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        INVALID_REQUEST,
        "A request with this Idempotency-Key is still being processed; retry once it has finished.",
    )
    .with_code(Some("idempotency_key_in_use".into()))
    .with_retry_after(1)
}

fn reused() -> ApiError {
    ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        INVALID_REQUEST,
        "This Idempotency-Key was already used with a different request (another body or route); use a new key for a new request.",
    )
    .with_code(Some("idempotency_key_reused".into()))
}

fn full() -> ApiError {
    ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "rate_limit_error",
        "Too many requests with an Idempotency-Key are running; retry shortly.",
    )
    .with_code(Some("idempotency_keys_exhausted".into()))
    .with_retry_after(1)
}

fn sha256(parts: &[&[u8]]) -> Hash {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_be_bytes());
        h.update(p);
    }
    h.finalize().into()
}

/// The body as canonical JSON (sorted object keys, compact), or as it is
/// when it is not JSON.
fn canonical(body: &[u8]) -> Vec<u8> {
    fn sort(v: serde_json::Value) -> serde_json::Value {
        match v {
            serde_json::Value::Object(map) => {
                let mut entries: Vec<_> = map.into_iter().collect();
                entries.sort_by(|a, b| a.0.cmp(&b.0));
                serde_json::Value::Object(entries.into_iter().map(|(k, v)| (k, sort(v))).collect())
            }
            serde_json::Value::Array(items) => {
                serde_json::Value::Array(items.into_iter().map(sort).collect())
            }
            other => other,
        }
    }
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(v) => serde_json::to_vec(&sort(v)).unwrap_or_else(|_| body.to_vec()),
        Err(_) => body.to_vec(),
    }
}

/// Middleware (`axum::middleware::from_fn_with_state`): see the module docs.
pub async fn guard(State(store): State<Arc<Store>>, req: Request, next: Next) -> Response {
    if req.method() != Method::POST || !ROUTES.contains(&req.uri().path()) {
        return next.run(req).await;
    }
    let key = match parse_key(req.headers()) {
        Ok(Some(key)) => key,
        Ok(None) => return next.run(req).await,
        Err(e) => return e.into_response(),
    };
    let auth = req
        .headers()
        .get(http::header::AUTHORIZATION)
        .map(|v| Sha256::digest(v.as_bytes()))
        .unwrap_or_default();
    let scope = sha256(&[&auth, &key]);
    let (parts, body) = req.into_parts();
    let bytes = match http_body_util::Limited::new(body, crate::MAX_BODY_BYTES)
        .collect()
        .await
    {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return ApiError::payload_too_large().into_response();
        }
        Err(e) => {
            // The body timeout's middleware answers 408 when that was it.
            return ApiError::invalid_request(format!("Cannot read the request body: {e}"), None)
                .into_response();
        }
    };
    let fingerprint = sha256(&[
        parts.method.as_str().as_bytes(),
        parts.uri.path().as_bytes(),
        &canonical(&bytes),
    ]);
    let id = match store.begin(scope, fingerprint) {
        Lookup::Started(id) => id,
        Lookup::Replay(stored) => return replay(&stored),
        Lookup::InUse => return in_use().into_response(),
        Lookup::Reused => return reused().into_response(),
        Lookup::Full => return full().into_response(),
    };
    let pending = Pending {
        store,
        scope,
        id,
        armed: true,
    };
    let response = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    if !response.status().is_success() {
        // Dropping `pending` frees the key.
        return response;
    }
    let (parts, body) = response.into_parts();
    let mut headers = parts.headers.clone();
    for name in NOT_STORED {
        headers.remove(name);
    }
    let recording = Recording {
        inner: body,
        buf: Vec::new(),
        too_big: false,
        status: parts.status,
        headers: Some(headers),
        pending: Some(pending),
    };
    Response::from_parts(parts, Body::new(recording))
}

fn replay(stored: &Stored) -> Response {
    let mut response = Response::new(Body::from(stored.body.clone()));
    *response.status_mut() = stored.status;
    *response.headers_mut() = stored.headers.clone();
    response
        .headers_mut()
        .insert(REPLAYED, HeaderValue::from_static("true"));
    response
}

/// The key of a running request: freed when dropped still armed.
struct Pending {
    store: Arc<Store>,
    scope: Hash,
    id: u64,
    armed: bool,
}

impl Drop for Pending {
    fn drop(&mut self) {
        if self.armed {
            self.store.abandon(&self.scope, self.id);
        }
    }
}

/// The answer's body, passed on frame by frame and kept for the store
/// once it has been sent to its end.
struct Recording {
    inner: Body,
    buf: Vec<u8>,
    too_big: bool,
    status: StatusCode,
    headers: Option<HeaderMap>,
    pending: Option<Pending>,
}

impl Recording {
    fn complete(&mut self) {
        let Some(mut pending) = self.pending.take() else {
            return;
        };
        if self.too_big {
            return; // dropped armed: the key is freed
        }
        pending.armed = false;
        let headers = self.headers.take().unwrap_or_default();
        let body = Bytes::from(std::mem::take(&mut self.buf));
        pending
            .store
            .finish(&pending.scope, pending.id, self.status, headers, body);
    }
}

impl http_body::Body for Recording {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref()
                    && !this.too_big
                {
                    if this.buf.len() + data.len() > MAX_STORED_RESPONSE_BYTES {
                        this.too_big = true;
                        this.buf = Vec::new();
                    } else {
                        this.buf.extend_from_slice(data);
                    }
                }
                if this.inner.is_end_stream() {
                    this.complete();
                }
            }
            Poll::Ready(None) => this.complete(),
            Poll::Ready(Some(Err(_))) => {
                // A failed body is not an answer to keep.
                this.pending = None;
            }
            Poll::Pending => {}
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

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(HEADER, HeaderValue::from_str(value).expect("valid header"));
        h
    }

    #[test]
    fn keys_are_tokens_or_sf_strings() {
        assert_eq!(parse_key(&HeaderMap::new()).ok(), Some(None));
        assert_eq!(
            parse_key(&headers("\"abc-1\"")).ok().flatten(),
            Some(b"abc-1".to_vec())
        );
        assert_eq!(
            parse_key(&headers("stainless-python-retry-1"))
                .ok()
                .flatten(),
            Some(b"stainless-python-retry-1".to_vec())
        );
        assert!(parse_key(&headers("\"\"")).is_err());
        assert!(parse_key(&headers(&"k".repeat(MAX_KEY_LEN + 1))).is_err());
        assert!(parse_key(&headers(&"k".repeat(MAX_KEY_LEN))).is_ok());
    }

    #[test]
    fn canonical_json_ignores_key_order_and_spacing() {
        let a = canonical(br#"{"b": 1, "a": {"y": [1, {"d": 2, "c": 3}], "x": null}}"#);
        let b = canonical(br#"{"a":{"x":null,"y":[1,{"c":3,"d":2}]},"b":1}"#);
        assert_eq!(a, b);
        assert_ne!(
            a,
            canonical(br#"{"a":{"x":null,"y":[{"c":3,"d":2},1]},"b":1}"#)
        );
        assert_eq!(canonical(b"not json"), b"not json");
    }
}
