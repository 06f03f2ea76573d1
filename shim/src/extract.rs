//! Request bodies: the [`JsonObject`] extractor and typed field parsing whose
//! errors name the offending field as OpenAI's `param`.
//!
//! A body is parsed once into a JSON object; each part of a request type is
//! then deserialized from it with `serde_path_to_error`, so a wrong type for
//! `temperature` answers 400 with `param: "temperature"`, and a bad message
//! content answers with `param: "messages[0].content"`.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::ApiError;

/// A request body that is a JSON object (anything else is a 400 in OpenAI
/// shape; a body over the limit is a 413).
#[derive(Debug, Clone)]
pub struct JsonObject(pub Value);

impl<S: Send + Sync> FromRequest<S> for JsonObject {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
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

/// Parses `bytes` as JSON and checks that it is an object.
pub fn parse_object(bytes: &[u8]) -> Result<Value, ApiError> {
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
        let path = e.path().to_string();
        let path = (path != ".").then_some(path);
        let inner = e.into_inner().to_string();
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
    fn unknown_keys_are_ignored() {
        let body = parse_object(br#"{"temperature": 1, "whatever": [1]}"#).expect("object");
        let sample = fields::<Sample>(&body).expect("parses");
        assert_eq!(sample.temperature, Some(1.0));
    }
}
