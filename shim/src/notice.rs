//! What the service says about the model that served a call, in the call's
//! response metadata: `gyre-model` (the model's id, whatever name or alias
//! the request used: responses name it, as OpenAI names the pinned version
//! behind an alias) and, for a deprecated model, `deprecation` (RFC 9745)
//! and `sunset` (RFC 8594). [`ModelNotice::apply`] is the layer that puts
//! the last two on the HTTP response, as `Deprecation` and `Sunset`.

use axum::http::{HeaderName, HeaderValue};
use axum::response::Response;
use tonic::metadata::MetadataMap;

/// Metadata keys passed on as HTTP headers.
const PASSED: [&str; 2] = ["deprecation", "sunset"];

/// The model notice of one call.
#[derive(Debug, Clone, Default)]
pub struct ModelNotice {
    /// The id of the model that served the call.
    pub model: Option<String>,
    headers: Vec<(HeaderName, HeaderValue)>,
}

impl ModelNotice {
    /// Reads a call's response metadata.
    pub fn from_metadata(meta: &MetadataMap) -> Self {
        let model = meta
            .get("gyre-model")
            .and_then(|v| v.to_str().ok())
            .filter(|s| !s.is_empty())
            .map(str::to_owned);
        let headers = PASSED
            .iter()
            .filter_map(|name| {
                let value = meta.get(*name)?.to_str().ok()?;
                Some((
                    HeaderName::from_static(name),
                    HeaderValue::from_str(value).ok()?,
                ))
            })
            .collect();
        Self { model, headers }
    }

    /// Whether the model is deprecated (the call carried a notice).
    pub fn is_deprecated(&self) -> bool {
        !self.headers.is_empty()
    }

    /// Adds the `Deprecation` and `Sunset` headers to `response`.
    pub fn apply(&self, mut response: Response) -> Response {
        for (name, value) in &self.headers {
            response.headers_mut().insert(name.clone(), value.clone());
        }
        response
    }
}
