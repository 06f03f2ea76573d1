//! What the service says about the model that served a call, in the call's
//! response metadata: `gyre-model` (the model's id, whatever name or alias
//! the request used: responses name it, as OpenAI names the pinned version
//! behind an alias) and, for a deprecated model, `deprecation` (RFC 9745)
//! and `sunset` (RFC 8594). [`ModelNotice::apply`] is the layer that puts
//! the last two on the HTTP response, as `Deprecation` and `Sunset`, with
//! the tenant's rate-limit headers (`x-ratelimit-*`, keys file only). Every
//! route that makes a call of the tenant's passes them on this way.

use axum::http::{HeaderName, HeaderValue};
use axum::response::Response;
use tonic::metadata::MetadataMap;

/// Metadata keys passed on as HTTP headers.
const PASSED: [&str; 2] = ["deprecation", "sunset"];

/// The rate-limit headers (OpenAI's names) a service's call may carry, on
/// success and with a RESOURCE_EXHAUSTED status alike.
pub const RATE_LIMIT: [&str; 6] = [
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
];

/// The `x-ratelimit-*` entries of `meta`, as HTTP headers.
pub fn rate_limit_headers(meta: &MetadataMap) -> Vec<(HeaderName, HeaderValue)> {
    passed(meta, &RATE_LIMIT)
}

fn passed(meta: &MetadataMap, names: &[&'static str]) -> Vec<(HeaderName, HeaderValue)> {
    names
        .iter()
        .filter_map(|name| {
            let value = meta.get(*name)?.to_str().ok()?;
            Some((
                HeaderName::from_static(name),
                HeaderValue::from_str(value).ok()?,
            ))
        })
        .collect()
}

/// The model notice of one call.
#[derive(Debug, Clone, Default)]
pub struct ModelNotice {
    /// The id of the model that served the call.
    pub model: Option<String>,
    headers: Vec<(HeaderName, HeaderValue)>,
    limits: Vec<(HeaderName, HeaderValue)>,
}

impl ModelNotice {
    /// Reads a call's response metadata.
    pub fn from_metadata(meta: &MetadataMap) -> Self {
        let model = meta
            .get("gyre-model")
            .and_then(|v| v.to_str().ok())
            .filter(|s| !s.is_empty())
            .map(str::to_owned);
        Self {
            model,
            headers: passed(meta, &PASSED),
            limits: rate_limit_headers(meta),
        }
    }

    /// Whether the model is deprecated (the call carried a notice).
    pub fn is_deprecated(&self) -> bool {
        !self.headers.is_empty()
    }

    /// The JSON answer `body` of a unary call, with the headers of the
    /// call's metadata `meta` (see [`Self::apply`]).
    pub fn json<T, B: serde::Serialize>(
        call: &tonic::Response<T>,
        body: impl FnOnce(&T) -> B,
    ) -> Response {
        use axum::response::IntoResponse as _;
        Self::from_metadata(call.metadata()).apply(axum::Json(body(call.get_ref())).into_response())
    }

    /// Adds the `Deprecation`, `Sunset` and rate-limit headers to
    /// `response`.
    pub fn apply(&self, mut response: Response) -> Response {
        for (name, value) in self.headers.iter().chain(&self.limits) {
            response.headers_mut().insert(name.clone(), value.clone());
        }
        response
    }
}
