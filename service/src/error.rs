//! The service's error type and its one mapping to `tonic::Status`
//! (with google.rpc ErrorInfo and BadRequest details). Internal details are
//! logged here and never sent to clients.

use std::collections::HashMap;

use gyre_engine::EngineError;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

/// The `ErrorInfo.domain` of every gyre error.
pub const DOMAIN: &str = "gyre.v1";

/// The gRPC metadata key of a `QUEUE_FULL` refusal's queue position.
pub const QUEUE_POSITION: &str = "x-queue-position";

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// Bad input; `field` names the request field at fault.
    #[error("{message}")]
    InvalidArgument {
        field: String,
        reason: &'static str,
        message: String,
    },
    /// A valid request this model cannot serve (e.g. chat input for a model
    /// without a chat template): FAILED_PRECONDITION.
    #[error("{message}")]
    Unservable {
        field: String,
        reason: &'static str,
        message: String,
    },
    /// The name as the client sent it; the message quotes it clipped.
    #[error("the model `{}` does not exist", gyre_api::clip(.0))]
    ModelNotFound(String),
    /// A `start` on the `Generate` stream naming a request id that is still
    /// running there: ALREADY_EXISTS.
    #[error("request_id `{}` is already running on this stream", gyre_api::clip(.0))]
    DuplicateRequestId(String),
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The engine's queue is full: RESOURCE_EXHAUSTED, reason QUEUE_FULL,
    /// like `Engine(QueueFull)`, with the place the request would have
    /// taken at the back of the queue (requests submitted and not yet
    /// started when it was refused, plus one), sent as `x-queue-position`
    /// metadata and `queue_position` in the ErrorInfo.
    #[error("the engine is full and so is its queue")]
    QueueFull { position: usize },
    #[error("the deadline passed after {0} generated tokens")]
    DeadlineExceeded(u32),
    #[error("internal error: {0}")]
    Internal(String),
    /// The server is draining for shutdown and takes no new requests.
    #[error("the server is shutting down and accepts no new requests")]
    Draining,
    /// A stored object (response, conversation) the request names does not
    /// exist: NOT_FOUND, reason "not_found", `field` naming the parameter.
    #[error("{message}")]
    NotFound { field: String, message: String },
    /// Admin: a name or alias already served: ALREADY_EXISTS.
    #[error("the name `{}` is already served", gyre_api::clip(.0))]
    ModelExists(String),
    /// Admin: a model that does not fit the device's memory:
    /// RESOURCE_EXHAUSTED.
    #[error("{0}")]
    OutOfMemory(String),
    /// The caller's tenant may not use this model (the name as the request
    /// gave it): PERMISSION_DENIED.
    #[error("this API key may not use the model `{}`", gyre_api::clip(.0))]
    ModelNotAllowed(String),
    /// Over one of the tenant's quotas: RESOURCE_EXHAUSTED with RetryInfo
    /// and the rate-limit headers as metadata.
    #[error("{}", .0.message)]
    RateLimited(Box<RateLimited>),
}

/// A quota refusal.
#[derive(Debug)]
pub struct RateLimited {
    pub message: String,
    /// Which limit: `requests_per_minute`, `tokens_per_minute`, ...
    pub limit: &'static str,
    pub retry_after: std::time::Duration,
    /// `x-ratelimit-*` headers, sent as response metadata.
    pub headers: Vec<(&'static str, String)>,
}

impl ServiceError {
    pub fn invalid(
        field: impl Into<String>,
        reason: &'static str,
        message: impl Into<String>,
    ) -> Self {
        Self::InvalidArgument {
            field: field.into(),
            reason,
            message: message.into(),
        }
    }

    /// The gRPC code, ErrorInfo reason, offending field and client-safe message.
    pub fn parts(&self) -> (Code, &'static str, Option<String>, String) {
        use EngineError as E;
        match self {
            Self::InvalidArgument {
                field,
                reason,
                message,
            } => (
                Code::InvalidArgument,
                reason,
                Some(field.clone()),
                message.clone(),
            ),
            Self::Unservable {
                field,
                reason,
                message,
            } => (
                Code::FailedPrecondition,
                reason,
                Some(field.clone()),
                message.clone(),
            ),
            Self::Draining => (Code::Unavailable, "DRAINING", None, self.to_string()),
            Self::NotFound { field, message } => (
                Code::NotFound,
                "not_found",
                Some(field.clone()),
                message.clone(),
            ),
            Self::ModelExists(_) => (
                Code::AlreadyExists,
                "MODEL_EXISTS",
                Some("name".into()),
                self.to_string(),
            ),
            Self::OutOfMemory(m) => (Code::ResourceExhausted, "OUT_OF_MEMORY", None, m.clone()),
            Self::ModelNotAllowed(_) => (
                Code::PermissionDenied,
                "MODEL_NOT_ALLOWED",
                Some("model".into()),
                self.to_string(),
            ),
            Self::RateLimited(r) => (
                Code::ResourceExhausted,
                "RATE_LIMIT_EXCEEDED",
                None,
                r.message.clone(),
            ),
            Self::QueueFull { .. } => Self::Engine(E::QueueFull).parts(),
            Self::DuplicateRequestId(_) => (
                Code::AlreadyExists,
                "DUPLICATE_REQUEST_ID",
                Some("start.request_id".into()),
                self.to_string(),
            ),
            Self::ModelNotFound(_) => (
                Code::NotFound,
                "MODEL_NOT_FOUND",
                Some("model".into()),
                self.to_string(),
            ),
            Self::Engine(e) => match e {
                E::EmptyPrompt => (
                    Code::InvalidArgument,
                    "EMPTY_PROMPT",
                    Some("input".into()),
                    e.to_string(),
                ),
                E::TokenOutOfVocab { .. } => (
                    Code::InvalidArgument,
                    "TOKEN_OUT_OF_VOCABULARY",
                    Some("input".into()),
                    e.to_string(),
                ),
                E::ContextTooLong { .. } => (
                    Code::InvalidArgument,
                    "CONTEXT_LENGTH_EXCEEDED",
                    Some("max_tokens".into()),
                    e.to_string(),
                ),
                E::ExceedsKvCapacity { .. } => (
                    Code::InvalidArgument,
                    "EXCEEDS_KV_CAPACITY",
                    Some("max_tokens".into()),
                    e.to_string(),
                ),
                E::InvalidSpeculation { field, .. } => (
                    Code::InvalidArgument,
                    "INVALID_SPECULATION",
                    Some((*field).into()),
                    e.to_string(),
                ),
                E::InvalidBeam { field, .. } => (
                    Code::InvalidArgument,
                    "INVALID_BEAM_SEARCH",
                    Some((*field).into()),
                    e.to_string(),
                ),
                E::InvalidN { .. } => (
                    Code::InvalidArgument,
                    "INVALID_N",
                    Some("n".into()),
                    e.to_string(),
                ),
                E::ZeroMaxTokens => (
                    Code::InvalidArgument,
                    "INVALID_MAX_TOKENS",
                    Some("max_tokens".into()),
                    e.to_string(),
                ),
                E::QueueFull => (
                    Code::ResourceExhausted,
                    "QUEUE_FULL",
                    None,
                    "the server is overloaded; retry later".into(),
                ),
                E::Stopped => (
                    Code::Unavailable,
                    "ENGINE_STOPPED",
                    None,
                    "the engine is not running".into(),
                ),
                E::Load { .. }
                | E::Draft(_)
                | E::Unsupported(_)
                | E::MissingWeight(_)
                | E::Step(_)
                | E::Torch(_) => (
                    Code::Internal,
                    "MODEL_FAILURE",
                    None,
                    "the model failed to run this request".into(),
                ),
            },
            Self::DeadlineExceeded(_) => (
                Code::DeadlineExceeded,
                "DEADLINE_EXCEEDED",
                None,
                self.to_string(),
            ),
            Self::Internal(_) => (
                Code::Internal,
                "INTERNAL",
                None,
                "internal server error".into(),
            ),
        }
    }
}

/// Most bytes of a status message. Messages quote client input through
/// `gyre_api::clip` already; this bounds the whole, whatever a message is
/// built from, so that a status (sent as HTTP/2 headers, on a connection
/// other requests share) stays far from any header-size limit.
pub const MAX_MESSAGE_BYTES: usize = 1024;
/// Most bytes of a `BadRequest` violation's description (with the field,
/// at most [`MAX_FIELD_BYTES`]): the encoded details stay under 1 KiB.
pub const MAX_DESCRIPTION_BYTES: usize = 512;
/// Most bytes of a `BadRequest` field path.
pub const MAX_FIELD_BYTES: usize = 128;

/// `s` cut to at most `max` bytes on a character boundary, "…" marking a cut
/// (the mark counts within `max`).
pub fn bounded(mut s: String, max: usize) -> String {
    const MARK: &str = "…";
    if s.len() <= max {
        return s;
    }
    let mut end = max.saturating_sub(MARK.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    s.push_str(MARK);
    s
}

impl From<ServiceError> for Status {
    fn from(e: ServiceError) -> Self {
        let (code, reason, field, message) = e.parts();
        crate::metrics::error(reason);
        if code == Code::Internal {
            tracing::error!(error = %e, "request failed");
        }
        let message = bounded(message, MAX_MESSAGE_BYTES);
        let mut details = ErrorDetails::new();
        let position = match &e {
            ServiceError::QueueFull { position } => Some(position.to_string()),
            _ => None,
        };
        let info: HashMap<String, String> = position
            .iter()
            .map(|p| ("queue_position".to_string(), p.clone()))
            .collect();
        details.set_error_info(reason, DOMAIN, info);
        if let Some(f) = field {
            details.add_bad_request_violation(
                bounded(f, MAX_FIELD_BYTES),
                bounded(message.clone(), MAX_DESCRIPTION_BYTES),
            );
        }
        let (retry, headers) = match &e {
            ServiceError::RateLimited(r) => (r.retry_after, r.headers.as_slice()),
            _ => (std::time::Duration::from_secs(1), &[][..]),
        };
        if code == Code::ResourceExhausted {
            details.set_retry_info(Some(retry));
        }
        let mut status = Status::with_error_details(code, message, details);
        crate::access::put_headers(status.metadata_mut(), headers);
        if let Some(p) = position.and_then(|p| p.parse().ok()) {
            status.metadata_mut().insert(QUEUE_POSITION, p);
        }
        status
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_stays_small_whatever_its_message_quotes() {
        let huge = "ü".repeat(100_000);
        for e in [
            ServiceError::ModelNotFound(huge.clone()),
            ServiceError::DuplicateRequestId(huge.clone()),
            ServiceError::invalid(huge.clone(), "X", huge.clone()),
            ServiceError::Unservable {
                field: huge.clone(),
                reason: "X",
                message: huge.clone(),
            },
        ] {
            let s = status(e);
            assert!(
                s.message().len() <= MAX_MESSAGE_BYTES,
                "{}",
                s.message().len()
            );
            assert!(
                s.details().len() <= 2048,
                "details: {} bytes",
                s.details().len()
            );
            if let Some(br) = s.get_details_bad_request() {
                let v = &br.field_violations[0];
                assert!(
                    v.field.len() <= MAX_FIELD_BYTES
                        && v.description.len() <= MAX_DESCRIPTION_BYTES
                );
            }
            // The status as headers: message percent-encoded, details base64.
            let mut headers = http::HeaderMap::new();
            s.add_header(&mut headers).expect("headers");
            let size: usize = headers
                .iter()
                .map(|(k, v)| k.as_str().len() + v.len())
                .sum();
            assert!(size < 8192, "status headers are {size} bytes");
        }
        // The name is quoted clipped: its first MAX_ECHO_CHARS characters.
        let s = status(ServiceError::ModelNotFound(huge.clone()));
        let quoted = "ü".repeat(gyre_api::MAX_ECHO_CHARS);
        assert!(
            s.message().contains(&format!("`{quoted}…`")),
            "{}",
            s.message()
        );
        // A message built of anything else is cut by the backstop.
        let s = status(ServiceError::invalid("f", "X", huge.clone()));
        assert!(s.message().ends_with('…'));
    }

    #[test]
    fn bounded_cuts_on_a_char_boundary() {
        assert_eq!(bounded("abc".into(), 3), "abc");
        let cut = bounded("ééé".into(), 5);
        assert!(cut.len() <= 5 && cut.ends_with('…'), "{cut}");
        assert_eq!(bounded("é".repeat(600), 1024).chars().count(), 511);
    }

    fn status(e: ServiceError) -> Status {
        e.into()
    }

    #[test]
    fn bad_input_maps_to_invalid_argument_with_field() {
        let s = status(ServiceError::invalid(
            "sampling.temperature",
            "OUT_OF_RANGE",
            "bad",
        ));
        assert_eq!(s.code(), Code::InvalidArgument);
        let br = s.get_details_bad_request().expect("bad request details");
        assert_eq!(br.field_violations[0].field, "sampling.temperature");
        assert_eq!(
            s.get_details_error_info().expect("info").reason,
            "OUT_OF_RANGE"
        );
    }

    #[test]
    fn engine_errors_map_per_table() {
        let cases = [
            (EngineError::EmptyPrompt, Code::InvalidArgument),
            (
                EngineError::TokenOutOfVocab { id: 9, vocab: 5 },
                Code::InvalidArgument,
            ),
            (
                EngineError::ContextTooLong {
                    prompt: 10,
                    requested: 10,
                    max: 16,
                },
                Code::InvalidArgument,
            ),
            (EngineError::ZeroMaxTokens, Code::InvalidArgument),
            (EngineError::QueueFull, Code::ResourceExhausted),
            (EngineError::Stopped, Code::Unavailable),
            (
                EngineError::Step("boom /secret/path".into()),
                Code::Internal,
            ),
        ];
        for (e, code) in cases {
            let s = status(ServiceError::Engine(e));
            assert_eq!(s.code(), code);
            assert!(
                !s.message().contains("/secret"),
                "internal details leaked: {}",
                s.message()
            );
        }
        let s = status(ServiceError::ModelNotFound("x".into()));
        assert_eq!(s.code(), Code::NotFound);
        assert_eq!(
            s.get_details_error_info().expect("info").reason,
            "MODEL_NOT_FOUND"
        );
    }
}
