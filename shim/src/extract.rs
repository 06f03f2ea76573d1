//! Request bodies: the [`JsonObject`] extractor and typed field parsing whose
//! errors name the offending field as OpenAI's `param`.
//!
//! A body must be declared as JSON (`Content-Type`, else 415), is checked
//! against the edge's limits ([`crate::limits`]), and is parsed once into a
//! JSON object; each part of a request type is then deserialized from it
//! with `serde_path_to_error`, so a wrong type for `temperature` answers 400
//! with `param: "temperature"`, and a bad message content answers with
//! `param: "messages[0].content"`. Client input quoted in a message is
//! clipped ([`gyre_api::clip`]).

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use gyre_api::clip;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::{ApiError, INVALID_REQUEST};
use crate::limits;

/// A request body that is a JSON object, sent with a JSON `Content-Type`
/// (else 415), within the edge's limits (else 400), and not over the size
/// limit (else 413). Anything else is a 400 in OpenAI shape.
#[derive(Debug, Clone)]
pub struct JsonObject(pub Value);

impl<S: Send + Sync> FromRequest<S> for JsonObject {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        check_content_type(req.headers())?;
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            if rejection.status() == http::StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::payload_too_large()
            } else {
                ApiError::invalid_request(
                    format!("Could not read the request body: {}", rejection.body_text()),
                    None,
                )
            }
        })?;
        parse_object(&bytes).map(JsonObject)
    }
}

/// Fails with 415 unless `headers` declare a JSON body: `application/json`
/// or `application/<anything>+json`, in any case, parameters (such as
/// `charset=utf-8`) allowed. A browser can send a cross-origin POST without
/// a CORS preflight only as `text/plain`, form data or multipart, so this
/// keeps web pages from starting generations with a visitor's browser.
pub fn check_content_type(headers: &http::HeaderMap) -> Result<(), ApiError> {
    let Some(value) = headers.get(http::header::CONTENT_TYPE) else {
        return Err(unsupported_media_type(None));
    };
    let text = String::from_utf8_lossy(value.as_bytes());
    if is_json_media_type(&text) {
        Ok(())
    } else {
        Err(unsupported_media_type(Some(&text)))
    }
}

/// 415 for a POST body not declared as JSON; `given` is the request's
/// `Content-Type`, if any.
fn unsupported_media_type(given: Option<&str>) -> ApiError {
    let got = match given {
        Some(t) => format!("got '{}'", clip(t)),
        None => "no Content-Type was given".to_owned(),
    };
    ApiError::new(
        http::StatusCode::UNSUPPORTED_MEDIA_TYPE,
        INVALID_REQUEST,
        format!("Send the request body as JSON with 'Content-Type: application/json' ({got})."),
    )
    .with_code(Some("unsupported_media_type".into()))
}

/// Whether a `Content-Type` value names JSON.
fn is_json_media_type(value: &str) -> bool {
    let essence = value.split(';').next().unwrap_or_default().trim();
    let Some((kind, subtype)) = essence.split_once('/') else {
        return false;
    };
    let subtype = subtype.to_ascii_lowercase();
    kind.eq_ignore_ascii_case("application")
        && (subtype == "json" || (subtype.len() > 5 && subtype.ends_with("+json")))
}

/// Parses `bytes` as JSON and checks that it is an object within the edge's
/// limits.
pub fn parse_object(bytes: &[u8]) -> Result<Value, ApiError> {
    limits::check_depth(bytes)?;
    let value: Value = serde_json::from_slice(bytes).map_err(|e| {
        ApiError::invalid_request(
            format!("We could not parse the JSON body of your request: {e}"),
            None,
        )
    })?;
    if !value.is_object() {
        return Err(ApiError::invalid_request(
            "The request body must be a JSON object.",
            None,
        ));
    }
    limits::check_sizes(&value)?;
    Ok(value)
}

/// Fails with 400 unless every one of `names` is present and not null.
pub fn require(body: &Value, names: &[&str]) -> Result<(), ApiError> {
    match names
        .iter()
        .find(|n| body.get(**n).is_none_or(Value::is_null))
    {
        Some(missing) => Err(missing_parameter(missing)),
        None => Ok(()),
    }
}

/// Deserializes `T` from `body`, ignoring keys `T` does not name.
pub fn fields<T: DeserializeOwned>(body: &Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(body).map_err(|e| {
        // Paths hold client-chosen map keys (e.g. of logit_bias).
        let path = clip(&e.path().to_string()).into_owned();
        let path = (path != ".").then_some(path);
        let inner = clip_serde_message(&e.into_inner().to_string());
        // serde reports a missing field at its parent; name the field itself.
        if let Some(field) = missing_field(&inner) {
            let param = match path {
                Some(parent) => format!("{parent}.{field}"),
                None => field.to_owned(),
            };
            return missing_parameter(&param);
        }
        match path {
            Some(param) => ApiError::invalid_request(
                format!("Invalid value for '{param}': {inner}"),
                Some(&param),
            ),
            None => ApiError::invalid_request(format!("Invalid request: {inner}"), None),
        }
    })
}

/// A serde error message with the client input it quotes clipped: serde
/// puts the input first (`invalid type: string "…", expected u32`), and
/// what was expected after the last ", expected ", which is kept whole.
fn clip_serde_message(message: &str) -> String {
    match message.rfind(", expected ") {
        Some(at) => format!("{}{}", clip(&message[..at]), &message[at..]),
        None => clip(message).into_owned(),
    }
}

fn missing_parameter(param: &str) -> ApiError {
    ApiError::invalid_request(
        format!("Missing required parameter: '{param}'."),
        Some(param),
    )
}

/// The field name of serde's "missing field `x`" message.
fn missing_field(message: &str) -> Option<&str> {
    message.strip_prefix("missing field `")?.split('`').next()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Sample {
        temperature: Option<f32>,
        messages: Option<Vec<Message>>,
    }

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Message {
        role: String,
        content: Option<String>,
    }

    fn err_json(err: ApiError) -> Value {
        assert_eq!(err.status(), http::StatusCode::BAD_REQUEST);
        err.body()["error"].clone()
    }

    #[test]
    fn bad_json_is_400_without_param() {
        let err = err_json(parse_object(b"{\"model\": ").expect_err("bad json"));
        assert_eq!(err["type"], "invalid_request_error");
        assert_eq!(err["param"], Value::Null);
    }

    #[test]
    fn non_object_is_400() {
        for body in [&b"[1,2]"[..], b"\"text\"", b"null", b"3"] {
            let err = err_json(parse_object(body).expect_err("not an object"));
            assert!(
                err["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("object"))
            );
        }
    }

    #[test]
    fn missing_or_null_required_field_names_it() {
        let body = parse_object(br#"{"model": "m", "messages": null}"#).expect("object");
        let err = err_json(require(&body, &["model", "messages"]).expect_err("missing"));
        assert_eq!(err["param"], "messages");
        assert!(require(&body, &["model"]).is_ok());
    }

    #[test]
    fn wrong_type_names_the_field() {
        let body = parse_object(br#"{"temperature": "hot"}"#).expect("object");
        let err = err_json(fields::<Sample>(&body).expect_err("wrong type"));
        assert_eq!(err["param"], "temperature");
        assert!(
            err["message"]
                .as_str()
                .is_some_and(|m| m.contains("temperature"))
        );
    }

    #[test]
    fn nested_errors_name_the_path() {
        let body = parse_object(br#"{"messages": [{"role": "user", "content": 5}]}"#).expect("obj");
        let err = err_json(fields::<Sample>(&body).expect_err("wrong type"));
        assert_eq!(err["param"], "messages[0].content");

        let body = parse_object(br#"{"messages": [{"content": "hi"}]}"#).expect("obj");
        let err = err_json(fields::<Sample>(&body).expect_err("missing role"));
        assert_eq!(err["param"], "messages[0].role");
    }

    #[test]
    fn json_content_types() {
        for ok in [
            "application/json",
            "Application/JSON; charset=utf-8",
            "application/json;charset=UTF-8",
            "application/merge-patch+json",
            " application/vnd.api+json ",
        ] {
            assert!(is_json_media_type(ok), "{ok}");
        }
        for bad in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "text/json",
            "application/+json",
            "application/jsonx",
            "json",
            "",
        ] {
            assert!(!is_json_media_type(bad), "{bad}");
        }
        let mut headers = http::HeaderMap::new();
        let err = check_content_type(&headers).expect_err("none");
        assert_eq!(err.status(), http::StatusCode::UNSUPPORTED_MEDIA_TYPE);
        assert_eq!(err.body()["error"]["code"], "unsupported_media_type");
        headers.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        assert!(check_content_type(&headers).is_ok());
    }

    #[test]
    fn quoted_input_is_clipped() {
        let long = "x".repeat(10_000);
        let body = serde_json::json!({ "temperature": long });
        let err = err_json(fields::<Sample>(&body).expect_err("wrong type"));
        let message = err["message"].as_str().unwrap_or_default();
        assert!(message.len() < 600, "{} bytes", message.len());
        assert!(
            message.contains('…') && message.ends_with("expected f32"),
            "{message}"
        );

        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct Bias {
            logit_bias: std::collections::HashMap<String, u8>,
        }
        let mut bias = serde_json::Map::new();
        bias.insert(long.clone(), serde_json::json!("not a number"));
        let body = serde_json::json!({ "logit_bias": bias });
        let err = err_json(fields::<Bias>(&body).expect_err("wrong type"));
        let param = err["param"].as_str().unwrap_or_default();
        assert!(
            param.starts_with("logit_bias.x") && param.len() < 600,
            "{param}"
        );
        assert!(err["message"].as_str().is_some_and(|m| m.len() < 1200));
    }

    #[test]
    fn unknown_keys_are_ignored() {
        let body = parse_object(br#"{"temperature": 1, "whatever": [1]}"#).expect("object");
        let sample = fields::<Sample>(&body).expect("parses");
        assert_eq!(sample.temperature, Some(1.0));
    }
}
