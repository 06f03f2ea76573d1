//! The client's typed errors: [`Error`], and [`ApiError`] for what the
//! server sent (gRPC code, message and gyre's status details).

use std::fmt;
use std::time::Duration;

use tonic::Code;
use tonic_types::StatusExt as _;

use crate::v1;

/// What went wrong, typed.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Error {
    /// The client's own settings are unusable (a bad URL, an unreadable
    /// certificate file, an API key that cannot be sent as metadata): no call
    /// was made.
    Config(String),
    /// The connection could not be made (refused, TLS handshake failed).
    Connect(String),
    /// The server (or the transport) answered with an error: a whole call's
    /// gRPC status, or one request's failure on a [`Session`](super::Session).
    Api(ApiError),
    /// The stream ended without the event that ends a request (a `finish`).
    Incomplete(String),
    /// The server sent something this client cannot use (e.g. a choice
    /// index far beyond any request's `n`).
    Protocol(String),
    /// The [`Session`](super::Session)'s stream has ended: nothing more can be sent on it.
    SessionClosed,
}

impl Error {
    /// The gRPC status code, for [`Error::Api`].
    pub fn code(&self) -> Option<Code> {
        match self {
            Self::Api(e) => Some(e.code),
            _ => None,
        }
    }

    /// The server's error, for [`Error::Api`].
    pub fn api(&self) -> Option<&ApiError> {
        match self {
            Self::Api(e) => Some(e),
            _ => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Config(m) => write!(f, "invalid client settings: {m}"),
            Self::Connect(m) => write!(f, "cannot connect: {m}"),
            Self::Api(e) => e.fmt(f),
            Self::Incomplete(m) => write!(f, "incomplete response: {m}"),
            Self::Protocol(m) => write!(f, "unexpected message from the server: {m}"),
            Self::SessionClosed => f.write_str("the session's stream has ended"),
        }
    }
}

impl std::error::Error for Error {}

impl From<tonic::Status> for Error {
    fn from(status: tonic::Status) -> Self {
        Self::Api(ApiError::from_status(&status))
    }
}

/// An error the server sent: the gRPC code and message, and what gyre adds
/// in the status details (google.rpc `ErrorInfo` reason, `BadRequest`
/// field, `RetryInfo` delay) or in a request's `RequestError`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// The gRPC status code (for a request on a [`Session`](super::Session), the code its
    /// `RequestError` carried).
    pub code: Code,
    /// The human-readable message, safe to show to users.
    pub message: String,
    /// Machine-readable reason, e.g. `MODEL_NOT_FOUND`, `PROMPT_TOO_LONG`.
    pub reason: Option<String>,
    /// The request field at fault, e.g. `sampling.temperature`.
    pub field: Option<String>,
    /// How long to wait before retrying (RESOURCE_EXHAUSTED).
    pub retry_after: Option<Duration>,
    /// The request the error belongs to, on a [`Session`](super::Session).
    pub request_id: Option<String>,
}

impl ApiError {
    /// Reads the code, message and gyre's error details out of a status.
    pub fn from_status(status: &tonic::Status) -> Self {
        let details = status.get_error_details();
        let reason = details
            .error_info()
            .map(|i| i.reason.clone())
            .filter(|r| !r.is_empty());
        let field = details
            .bad_request()
            .and_then(|b| b.field_violations.first())
            .map(|v| v.field.clone())
            .filter(|f| !f.is_empty());
        let retry_after = details.retry_info().and_then(|r| r.retry_delay);
        // A status tonic made from a transport failure says "transport
        // error"; the why (a refused certificate, a reset) is its source.
        let mut message = status.message().to_string();
        if let Some(source) = std::error::Error::source(status) {
            let why = error_chain(source);
            if !message.contains(&why) {
                message = if message.is_empty() {
                    why
                } else {
                    format!("{message}: {why}")
                };
            }
        }
        Self {
            code: status.code(),
            message,
            reason,
            field,
            retry_after,
            request_id: None,
        }
    }

    /// The error of one request on the `Generate` stream (a `finish` with
    /// reason ERROR, or a `rejected` start).
    pub fn from_request_error(request_id: &str, e: &v1::RequestError) -> Self {
        Self {
            code: Code::from_i32(e.code),
            message: e.message.clone(),
            reason: Some(e.reason.clone()).filter(|r| !r.is_empty()),
            field: Some(e.field.clone()).filter(|f| !f.is_empty()),
            retry_after: None,
            request_id: Some(request_id.to_string()),
        }
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", code_name(self.code))?;
        if let Some(reason) = &self.reason {
            write!(f, " ({reason})")?;
        }
        write!(f, ": {}", self.message)?;
        if let Some(field) = &self.field {
            write!(f, " [field {field}]")?;
        }
        if let Some(id) = &self.request_id {
            write!(f, " [request {id}]")?;
        }
        Ok(())
    }
}

/// The canonical name of a gRPC code, as in the gRPC spec
/// (`UNAUTHENTICATED`, `NOT_FOUND`, ...).
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// `e` and its sources, joined: tonic's transport errors keep the useful
/// part (refused, certificate unknown) in the sources.
pub(super) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}
