//! The shim's one error type, [`ApiError`], and the single exhaustive mapping
//! from `tonic::Status` (and per-request `RequestError`s) to OpenAI error JSON.
//!
//! Every error response has the body
//! `{"error":{"message":..,"type":..,"param":..|null,"code":..|null}}`.
//! Messages of 4xx errors come from the service, which promises they are safe
//! to show; 5xx errors carry a generic message and their details are logged.

use std::time::Duration;

use axum::Json;
use axum::response::{IntoResponse, Response};
use gyre_api::clip;
use gyre_api::v1::RequestError;
use http::StatusCode;
use serde::Serialize;
use tonic::{Code, Status};
use tonic_types::StatusExt;

/// Which API an error belongs to: proto field names map to its OpenAI names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `/v1/chat/completions`: the proto input is `messages`.
    Chat,
    /// `/v1/completions`: the proto input is `prompt`.
    Completions,
    /// `/v1/models`.
    Models,
    /// `/v1/responses` and `/v1/conversations`: the service names fields in
    /// OpenAI's spelling already (`input[2].content`), and a NOT_FOUND for a
    /// response or conversation id keeps its own `param` and `code`.
    Responses,
    /// `/v1/embeddings`: the proto's `inputs` is `input`.
    Embeddings,
}

/// An error answered as OpenAI error JSON with an HTTP status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    status: StatusCode,
    kind: &'static str,
    message: String,
    param: Option<String>,
    code: Option<String>,
    /// Seconds for the `Retry-After` header.
    retry_after: Option<u64>,
    /// Headers the service sent with the status (the `x-ratelimit-*` ones,
    /// and `X-Queue-Position` of a `queue_full` 429; boxed: most errors
    /// have none, and errors stay small).
    headers: Option<Box<Headers>>,
}

/// Headers an error carries besides `Retry-After`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Headers(Vec<(http::HeaderName, http::HeaderValue)>);

pub(crate) const INVALID_REQUEST: &str = "invalid_request_error";
const SERVER_ERROR: &str = "server_error";

impl ApiError {
    pub(crate) fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            message: message.into(),
            param: None,
            code: None,
            retry_after: None,
            headers: None,
        }
    }

    pub(crate) fn with_param(mut self, param: Option<String>) -> Self {
        self.param = param;
        self
    }

    pub(crate) fn with_code(mut self, code: Option<String>) -> Self {
        self.code = code;
        self
    }

    pub(crate) fn with_retry_after(mut self, secs: u64) -> Self {
        self.retry_after = Some(secs);
        self
    }

    /// 400 for bad input; `param` names the offending request field.
    pub fn invalid_request(message: impl Into<String>, param: Option<&str>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, INVALID_REQUEST, message)
            .with_param(param.map(str::to_owned))
    }

    /// 400 for a feature the request asks for that gyre does not offer yet.
    pub fn unsupported(param: &str, what: &str) -> Self {
        Self::invalid_request(format!("{what} is not supported yet."), Some(param))
            .with_code(Some("unsupported_parameter".into()))
    }

    /// 404 for a model id the service does not host: the one message every
    /// route gives (the service's own wording, the id clipped).
    pub fn model_not_found(model: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            INVALID_REQUEST,
            format!("the model `{}` does not exist", clip(model)),
        )
        .with_param(Some("model".into()))
        .with_code(Some("model_not_found".into()))
    }

    /// This error, with an unknown-model 404 restated for `model` (the id
    /// the client asked for) in [`ApiError::model_not_found`]'s one format,
    /// whatever the service's message said.
    pub fn for_model(self, model: &str) -> Self {
        if self.status == StatusCode::NOT_FOUND && self.code.as_deref() == Some("model_not_found") {
            Self::model_not_found(model)
        } else {
            self
        }
    }

    /// This error with its `param` `from` (and the word in its message)
    /// spelled `to`: the field the client sent where the proto has one
    /// name for two (chat's `max_completion_tokens` is `max_tokens`).
    pub fn renamed(mut self, from: &str, to: &str) -> Self {
        if self.param.as_deref() == Some(from) {
            self.param = Some(to.to_owned());
            self.message = self.message.replace(from, to);
        }
        self
    }

    /// 404 for a path no route serves.
    pub fn route_not_found(method: &str, path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            INVALID_REQUEST,
            format!("Invalid URL ({} {})", clip(method), clip(path)),
        )
        .with_code(Some("not_found".into()))
    }

    /// 405 for a known path used with the wrong method.
    pub fn method_not_allowed(method: &str, path: &str) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            INVALID_REQUEST,
            format!("Method {} is not allowed for {}", clip(method), clip(path)),
        )
        .with_code(Some("method_not_allowed".into()))
    }

    /// 413 for a body over [`crate::MAX_BODY_BYTES`].
    pub fn payload_too_large() -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            INVALID_REQUEST,
            format!(
                "The request body is larger than the limit of {} bytes.",
                crate::MAX_BODY_BYTES
            ),
        )
        .with_code(Some("request_too_large".into()))
    }

    /// 401: no bearer token although the shim requires one.
    pub fn missing_api_key() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "You didn't provide an API key. Send it as 'Authorization: Bearer <key>'.",
        )
        .with_code(Some("invalid_api_key".into()))
    }

    /// 401: a bearer token that is not the configured key.
    pub fn invalid_api_key() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "Incorrect API key provided.",
        )
        .with_code(Some("invalid_api_key".into()))
    }

    /// 408: the request body did not arrive within the body timeout.
    pub fn request_timeout(timeout: Duration) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            INVALID_REQUEST,
            format!(
                "The request body did not arrive within {} s.",
                timeout.as_secs_f64()
            ),
        )
        .with_code(Some("request_timeout".into()))
    }

    /// 503: the connection to the gRPC service failed (refused, reset, or
    /// dropped while the request was running).
    pub fn upstream_unavailable() -> Self {
        let mut err = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            SERVER_ERROR,
            "The gRPC service is unavailable: the connection to it failed. Please retry.",
        )
        .with_code(Some("upstream_unavailable".into()));
        err.retry_after = Some(1);
        err
    }

    /// 500 with a generic message; `detail` is logged, never sent.
    pub fn internal(detail: impl std::fmt::Display) -> Self {
        tracing::error!(%detail, "internal error");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            SERVER_ERROR,
            "The server had an error while processing your request.",
        )
    }

    /// Maps a gRPC status, reading google.rpc BadRequest (for `param`),
    /// ErrorInfo (for `code`) and RetryInfo (for `Retry-After`) details.
    pub fn from_status(status: &Status, api: Api) -> Self {
        let field = status
            .get_details_bad_request()
            .and_then(|b| b.field_violations.into_iter().next())
            .map(|v| v.field);
        let reason = status.get_details_error_info().map(|i| i.reason);
        let retry = status.get_details_retry_info().and_then(|r| r.retry_delay);
        // tonic reports its own client-side timeout as CANCELLED.
        let code = if is_client_timeout(status) {
            Code::DeadlineExceeded
        } else if is_transport_failure(status) {
            tracing::warn!(%status, "the connection to the gRPC service failed");
            return Self::upstream_unavailable();
        } else {
            status.code()
        };
        let mut err = map_code(code, status.message(), field, reason, retry, api);
        let mut headers = crate::notice::rate_limit_headers(status.metadata());
        if err.status == StatusCode::TOO_MANY_REQUESTS
            && let Some(position) = status
                .metadata()
                .get("x-queue-position")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u32>().ok())
        {
            headers.push((
                http::HeaderName::from_static("x-queue-position"),
                http::HeaderValue::from(position),
            ));
        }
        err.headers = (!headers.is_empty()).then(|| Box::new(Headers(headers)));
        err
    }

    /// Maps the error of a request that finished with reason ERROR.
    pub fn from_request_error(err: &RequestError, api: Api) -> Self {
        let nonempty = |s: &str| (!s.is_empty()).then(|| s.to_owned());
        map_code(
            Code::from(err.code),
            &err.message,
            nonempty(&err.field),
            nonempty(&err.reason),
            None,
            api,
        )
    }

    /// The HTTP status of this error.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The OpenAI error JSON, `{"error":{...}}`.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({ "error": ErrorBody::from(self) })
    }
}

/// The one exhaustive mapping of gRPC codes (see docs/ARCHITECTURE.md). Codes
/// outside the architecture's table follow google.rpc.Code's documented HTTP
/// mapping, except CANCELLED: the shim's own client never cancels a call it
/// still answers, so a cancelled call was stopped by the server (503); and
/// FAILED_PRECONDITION, which gyre uses for a valid request the model cannot
/// serve (422, where malformed or out-of-range input is 400).
fn map_code(
    code: Code,
    message: &str,
    field: Option<String>,
    reason: Option<String>,
    retry: Option<Duration>,
    api: Api,
) -> ApiError {
    let param = field.as_deref().map(|f| openai_param(f, api));
    let client = |status, kind| {
        ApiError::new(status, kind, message)
            .with_param(param.clone())
            .with_code(reason.as_deref().map(openai_code))
    };
    let server = |status, kind, generic: &str| {
        tracing::warn!(?code, message, ?reason, ?field, "gRPC call failed");
        ApiError::new(status, kind, generic)
    };
    match code {
        Code::InvalidArgument | Code::OutOfRange => {
            client(StatusCode::BAD_REQUEST, INVALID_REQUEST)
        }
        // A valid request this model cannot serve (no chat template).
        Code::FailedPrecondition => client(StatusCode::UNPROCESSABLE_ENTITY, INVALID_REQUEST),
        // A stored response or conversation that does not exist.
        Code::NotFound
            if api == Api::Responses
                && reason
                    .as_deref()
                    .is_some_and(|r| r.eq_ignore_ascii_case("not_found")) =>
        {
            client(StatusCode::NOT_FOUND, INVALID_REQUEST)
        }
        Code::NotFound => client(StatusCode::NOT_FOUND, INVALID_REQUEST)
            .with_param(Some("model".into()))
            .with_code(Some("model_not_found".into())),
        Code::AlreadyExists | Code::Aborted => client(StatusCode::CONFLICT, INVALID_REQUEST),
        Code::Unauthenticated => client(StatusCode::UNAUTHORIZED, "authentication_error")
            .with_code(Some("invalid_api_key".into())),
        Code::PermissionDenied => client(StatusCode::FORBIDDEN, "permission_error"),
        Code::ResourceExhausted => {
            let mut err = client(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error");
            err.retry_after = Some(retry_after_secs(retry));
            err
        }
        Code::DeadlineExceeded => server(
            StatusCode::GATEWAY_TIMEOUT,
            "timeout",
            "The request timed out before the model finished.",
        ),
        // The service is draining for shutdown: say so (other replicas or
        // a restarted server can take the request).
        Code::Unavailable if reason.as_deref() == Some("DRAINING") => {
            let mut err = client(StatusCode::SERVICE_UNAVAILABLE, SERVER_ERROR);
            err.retry_after = Some(retry_after_secs(retry));
            err
        }
        Code::Unavailable | Code::Cancelled => {
            let mut err = server(
                StatusCode::SERVICE_UNAVAILABLE,
                SERVER_ERROR,
                "The model server is unavailable right now. Please retry.",
            );
            err.retry_after = retry.map(|d| retry_after_secs(Some(d)));
            err
        }
        Code::Unimplemented => server(
            StatusCode::NOT_IMPLEMENTED,
            SERVER_ERROR,
            "The model server does not implement this operation.",
        ),
        Code::Ok | Code::Unknown | Code::Internal | Code::DataLoss => server(
            StatusCode::INTERNAL_SERVER_ERROR,
            SERVER_ERROR,
            "The server had an error while processing your request.",
        ),
    }
}

/// Whether `status` is tonic's client-side `grpc-timeout` expiring.
fn is_client_timeout(status: &Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(err) = source {
        if err.is::<tonic::TimeoutExpired>() {
            return true;
        }
        source = err.source();
    }
    false
}

/// Whether `status` is one tonic made from a failure of the connection
/// (connect refused, reset, GOAWAY, keepalive timeout) rather than one the
/// service sent: tonic keeps such errors as the status's source.
fn is_transport_failure(status: &Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(err) = source {
        if err.is::<tonic::transport::Error>()
            || err.is::<hyper::Error>()
            || err.is::<std::io::Error>()
        {
            return true;
        }
        source = err.source();
    }
    false
}

/// Whole seconds for `Retry-After`, rounded up; 1 when the service gave none.
fn retry_after_secs(delay: Option<Duration>) -> u64 {
    delay
        .map_or(1, |d| d.as_secs() + u64::from(d.subsec_nanos() > 0))
        .max(1)
}

/// OpenAI's name for a field of the proto `Request` (as named in BadRequest
/// field violations and `RequestError.field`).
pub fn openai_param(field: &str, api: Api) -> String {
    let field = field.strip_prefix("request.").unwrap_or(field);
    if api == Api::Responses {
        return field.strip_prefix("sampling.").unwrap_or(field).to_owned();
    }
    if api == Api::Embeddings {
        return match field {
            "inputs" | "inputs.texts" | "inputs.token_ids" => "input".to_owned(),
            other => other.to_owned(),
        };
    }
    let input = if api == Api::Completions {
        "prompt"
    } else {
        "messages"
    };
    if let Some(rest) = field.strip_prefix("sampling.") {
        return rest.to_owned();
    }
    if let Some(rest) = field.strip_prefix("chat.") {
        return rest.to_owned();
    }
    match field {
        "input" | "input.text" | "text" | "token_ids" | "token_ids.ids" | "chat" => {
            input.to_owned()
        }
        // The number of top logprobs: chat's `top_logprobs`.
        "logprobs" if api == Api::Chat => "top_logprobs".to_owned(),
        // Chat's response_format, or the structured-outputs extensions.
        "structured" if api == Api::Completions => "structured_outputs".to_owned(),
        "structured" => "response_format".to_owned(),
        "beam" | "beam.width" => "best_of".to_owned(),
        "beam.length_penalty" => "length_penalty".to_owned(),
        "beam.early_stopping" => "early_stopping".to_owned(),
        other => other.to_owned(),
    }
}

/// OpenAI-style `code` for a google.rpc.ErrorInfo reason.
fn openai_code(reason: &str) -> String {
    match reason {
        "PROMPT_TOO_LONG" | "CONTEXT_LENGTH_EXCEEDED" => "context_length_exceeded".to_owned(),
        other => other.to_ascii_lowercase(),
    }
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

impl<'a> From<&'a ApiError> for ErrorBody<'a> {
    fn from(e: &'a ApiError) -> Self {
        Self {
            message: &e.message,
            kind: e.kind,
            param: e.param.as_deref(),
            code: e.code.as_deref(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body())).into_response();
        if let Some(secs) = self.retry_after {
            response
                .headers_mut()
                .insert(http::header::RETRY_AFTER, http::HeaderValue::from(secs));
        }
        for (name, value) in self.headers.into_iter().flat_map(|h| h.0) {
            response.headers_mut().insert(name, value);
        }
        response
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status.as_u16(),
            self.kind,
            self.message
        )
    }
}

impl std::error::Error for ApiError {}

#[cfg(test)]
mod tests {
    #[test]
    fn transport_failures_are_upstream_unavailable() {
        let reset = Status::from_error(Box::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset,
        )));
        let err = ApiError::from_status(&reset, Api::Chat);
        assert_eq!(err.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(err.body()["error"]["code"], "upstream_unavailable");
        assert_eq!(err.body()["error"]["type"], "server_error");
        // A status the service sent has no source: mapped by its code.
        let sent = Status::internal("boom");
        assert_eq!(
            ApiError::from_status(&sent, Api::Chat).status(),
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }

    use super::*;
    use tonic_types::{ErrorDetails, FieldViolation};

    fn mapped(code: Code) -> ApiError {
        ApiError::from_status(&Status::new(code, "detail"), Api::Chat)
    }

    #[test]
    fn every_code_maps() {
        use StatusCode as S;
        let table = [
            (Code::Ok, S::INTERNAL_SERVER_ERROR, SERVER_ERROR),
            (Code::Cancelled, S::SERVICE_UNAVAILABLE, SERVER_ERROR),
            (Code::Unknown, S::INTERNAL_SERVER_ERROR, SERVER_ERROR),
            (Code::InvalidArgument, S::BAD_REQUEST, INVALID_REQUEST),
            (Code::DeadlineExceeded, S::GATEWAY_TIMEOUT, "timeout"),
            (Code::NotFound, S::NOT_FOUND, INVALID_REQUEST),
            (Code::AlreadyExists, S::CONFLICT, INVALID_REQUEST),
            (Code::PermissionDenied, S::FORBIDDEN, "permission_error"),
            (
                Code::ResourceExhausted,
                S::TOO_MANY_REQUESTS,
                "rate_limit_error",
            ),
            (
                Code::FailedPrecondition,
                S::UNPROCESSABLE_ENTITY,
                INVALID_REQUEST,
            ),
            (Code::Aborted, S::CONFLICT, INVALID_REQUEST),
            (Code::OutOfRange, S::BAD_REQUEST, INVALID_REQUEST),
            (Code::Unimplemented, S::NOT_IMPLEMENTED, SERVER_ERROR),
            (Code::Internal, S::INTERNAL_SERVER_ERROR, SERVER_ERROR),
            (Code::Unavailable, S::SERVICE_UNAVAILABLE, SERVER_ERROR),
            (Code::DataLoss, S::INTERNAL_SERVER_ERROR, SERVER_ERROR),
            (
                Code::Unauthenticated,
                S::UNAUTHORIZED,
                "authentication_error",
            ),
        ];
        for (code, status, kind) in table {
            let err = mapped(code);
            assert_eq!((err.status, err.kind), (status, kind), "{code:?}");
            // 4xx pass the service's message through; 5xx never leak it.
            assert_eq!(
                err.message == "detail",
                status.is_client_error(),
                "{code:?}"
            );
            let body = err.body();
            let obj = body["error"].as_object().expect("error object");
            for key in ["message", "type", "param", "code"] {
                assert!(obj.contains_key(key), "{code:?} lacks {key}");
            }
        }
    }

    #[test]
    fn client_timeout_is_a_deadline() {
        let status = Status::from_error(Box::new(tonic::TimeoutExpired(())));
        assert_eq!(status.code(), Code::Cancelled);
        let err = ApiError::from_status(&status, Api::Chat);
        assert_eq!(err.status, StatusCode::GATEWAY_TIMEOUT);
    }

    #[test]
    fn not_found_is_model_not_found() {
        let body = mapped(Code::NotFound).body();
        assert_eq!(body["error"]["code"], "model_not_found");
        assert_eq!(body["error"]["param"], "model");
    }

    #[test]
    fn bad_request_details_fill_param_and_code() {
        let mut details = ErrorDetails::with_bad_request(vec![FieldViolation::new(
            "sampling.temperature",
            "must be in [0, 2]",
        )]);
        details.set_error_info(
            "TEMPERATURE_OUT_OF_RANGE",
            "gyre",
            std::collections::HashMap::new(),
        );
        let status = Status::with_error_details(Code::InvalidArgument, "bad temp", details);
        let body = ApiError::from_status(&status, Api::Chat).body();
        assert_eq!(
            body,
            serde_json::json!({"error": {
                "message": "bad temp",
                "type": "invalid_request_error",
                "param": "temperature",
                "code": "temperature_out_of_range",
            }})
        );
    }

    #[test]
    fn resource_exhausted_sets_retry_after() {
        let response = mapped(Code::ResourceExhausted).into_response();
        assert_eq!(response.headers()[http::header::RETRY_AFTER], "1");

        let details = ErrorDetails::with_retry_info(Some(Duration::from_millis(2500)));
        let status = Status::with_error_details(Code::ResourceExhausted, "queue full", details);
        let err = ApiError::from_status(&status, Api::Completions);
        assert_eq!(err.retry_after, Some(3));
    }

    #[test]
    fn request_error_maps_like_status() {
        let err = RequestError {
            code: Code::InvalidArgument as i32,
            message: "prompt is too long".into(),
            reason: "PROMPT_TOO_LONG".into(),
            field: "text".into(),
        };
        let body = ApiError::from_request_error(&err, Api::Completions).body();
        assert_eq!(body["error"]["param"], "prompt");
        assert_eq!(body["error"]["code"], "context_length_exceeded");
        assert_eq!(body["error"]["message"], "prompt is too long");
    }

    #[test]
    fn responses_not_found_keeps_param_and_code() {
        let details =
            ErrorDetails::with_error_info("not_found", "gyre", std::collections::HashMap::new());
        let mut details = details;
        details.set_bad_request(vec![FieldViolation::new("previous_response_id", "unknown")]);
        let status = Status::with_error_details(Code::NotFound, "no such response", details);
        let body = ApiError::from_status(&status, Api::Responses).body();
        assert_eq!(body["error"]["param"], "previous_response_id");
        assert_eq!(body["error"]["code"], "not_found");
        // An unknown model stays model_not_found on this API too.
        let details = ErrorDetails::with_error_info(
            "MODEL_NOT_FOUND",
            "gyre",
            std::collections::HashMap::new(),
        );
        let status = Status::with_error_details(Code::NotFound, "no model", details);
        let body = ApiError::from_status(&status, Api::Responses).body();
        assert_eq!(body["error"]["param"], "model");
        assert_eq!(body["error"]["code"], "model_not_found");
        assert_eq!(
            openai_param("input[2].content", Api::Responses),
            "input[2].content"
        );
        assert_eq!(
            openai_param("sampling.temperature", Api::Responses),
            "temperature"
        );
    }

    #[test]
    fn proto_fields_become_openai_params() {
        assert_eq!(openai_param("sampling.top_p", Api::Chat), "top_p");
        assert_eq!(
            openai_param("chat.messages[2].role", Api::Chat),
            "messages[2].role"
        );
        assert_eq!(openai_param("token_ids", Api::Completions), "prompt");
        assert_eq!(openai_param("input.text", Api::Completions), "prompt");
        assert_eq!(openai_param("input", Api::Chat), "messages");
        assert_eq!(openai_param("max_tokens", Api::Chat), "max_tokens");
        assert_eq!(openai_param("request.stop", Api::Chat), "stop");
        assert_eq!(openai_param("logprobs", Api::Chat), "top_logprobs");
        assert_eq!(openai_param("logprobs", Api::Completions), "logprobs");
    }

    #[test]
    fn local_errors_have_all_keys() {
        let errors = [
            ApiError::payload_too_large(),
            ApiError::missing_api_key(),
            ApiError::route_not_found("GET", "/x"),
            ApiError::internal("boom"),
        ];
        for err in errors {
            let body = err.body();
            assert_eq!(body["error"].as_object().map(|o| o.len()), Some(4));
        }
        assert_eq!(
            ApiError::internal("secret").body()["error"]["message"],
            "The server had an error while processing your request."
        );
    }
}
