//! Limits the HTTP edge enforces on every request body before anything of it
//! reaches the service: one JSON nesting depth for the whole body, and the
//! most items of the lists (and maps) whose size nothing else bounds.
//!
//! Each limit answers 400 in the OpenAI error shape, naming the limit and
//! the field (`param`). Limits checked elsewhere are not repeated here: the
//! body size (413, [`crate::MAX_BODY_BYTES`]), prompts per completions
//! request (`openai::request::MAX_PROMPTS`), and, in the service, stop
//! strings, `n` and top logprobs.

use gyre_api::clip;
use http::StatusCode;
use serde_json::Value;

use crate::error::{ApiError, INVALID_REQUEST};

/// Deepest nesting of JSON arrays and objects in a request body, the body's
/// own object being level 1. The service decodes `chat_template_kwargs` as a
/// protobuf `Struct`, where each JSON level costs two message levels of the
/// decoder's recursion limit of 100: 32 stays well under it, and leaves
/// JSON schemas (sent on as text) a dozen levels of properties.
pub const MAX_JSON_DEPTH: usize = 32;

/// Most chat messages (or Responses input items) in one request.
pub const MAX_MESSAGES: usize = 4096;

/// Most tools in one chat request (OpenAI's documented limit too).
pub const MAX_TOOLS: usize = 128;

/// Most `logit_bias` entries: each is applied at every step of the request.
pub const MAX_LOGIT_BIAS: usize = 1024;

/// Most `stop_token_ids`: each generated token is compared with all of them.
pub const MAX_STOP_TOKEN_IDS: usize = 1024;

/// Most options of a `choice` structured output.
pub const MAX_CHOICES: usize = 1024;

/// Fails when a JSON array or object in `bytes` is nested more than
/// [`MAX_JSON_DEPTH`] levels deep. Works on the raw bytes, before parsing,
/// so that no depth reaches the JSON parser's own limit; malformed JSON is
/// left to the parser.
pub fn check_depth(bytes: &[u8]) -> Result<(), ApiError> {
    let mut scan = Scan::default();
    for (i, &b) in bytes.iter().enumerate() {
        if scan.step(i, b) > MAX_JSON_DEPTH {
            let key = scan.key.map(|(start, end)| &bytes[start..end]);
            let param = key.map(String::from_utf8_lossy);
            return Err(too_deeply_nested(param.as_deref()));
        }
    }
    Ok(())
}

/// State of [`check_depth`]'s scan: nesting depth, string state, and the
/// byte range of the last key of the top-level object.
#[derive(Default)]
struct Scan {
    depth: usize,
    in_string: bool,
    escaped: bool,
    top_is_object: bool,
    expect_key: bool,
    key_start: Option<usize>,
    key: Option<(usize, usize)>,
}

impl Scan {
    /// Reads byte `b` at offset `i`; returns the depth after it.
    fn step(&mut self, i: usize, b: u8) -> usize {
        if self.in_string {
            if self.escaped {
                self.escaped = false;
            } else if b == b'\\' {
                self.escaped = true;
            } else if b == b'"' {
                self.in_string = false;
                if let Some(start) = self.key_start.take() {
                    self.key = Some((start, i));
                }
            }
            return self.depth;
        }
        match b {
            b'"' => {
                self.in_string = true;
                if self.depth == 1 && self.top_is_object && self.expect_key {
                    self.key_start = Some(i + 1);
                    self.expect_key = false;
                }
            }
            b'{' | b'[' => {
                self.depth += 1;
                if self.depth == 1 {
                    self.top_is_object = b == b'{';
                    self.expect_key = true;
                }
            }
            b'}' | b']' => self.depth = self.depth.saturating_sub(1),
            b',' if self.depth == 1 => self.expect_key = true,
            _ => {}
        }
        self.depth
    }
}

/// Fails when a list (or map) of the request body has more items than its
/// limit. `body` is the parsed top-level object.
pub fn check_sizes(body: &Value) -> Result<(), ApiError> {
    let limits: [(&[&str], &str, usize); 7] = [
        (&["messages"], "messages", MAX_MESSAGES),
        // The Responses API's input items.
        (&["input"], "items", MAX_MESSAGES),
        (&["tools"], "tools", MAX_TOOLS),
        (&["logit_bias"], "entries", MAX_LOGIT_BIAS),
        (&["stop_token_ids"], "token ids", MAX_STOP_TOKEN_IDS),
        (&["guided_choice"], "choices", MAX_CHOICES),
        (&["structured_outputs", "choice"], "choices", MAX_CHOICES),
    ];
    for (path, what, limit) in limits {
        let value = path.iter().try_fold(body, |v, key| v.get(key));
        let count = match value {
            Some(Value::Array(items)) => items.len(),
            Some(Value::Object(entries)) => entries.len(),
            _ => continue,
        };
        if count > limit {
            return Err(too_many_items(&path.join("."), what, limit, count));
        }
    }
    Ok(())
}

/// 400 for a body nested deeper than [`MAX_JSON_DEPTH`]; `param` is the
/// top-level field holding the too-deep value.
fn too_deeply_nested(param: Option<&str>) -> ApiError {
    let param = param.map(|p| clip(p).into_owned());
    let place = match &param {
        Some(p) => format!(" (in '{p}')"),
        None => String::new(),
    };
    let limit = MAX_JSON_DEPTH;
    ApiError::new(
        StatusCode::BAD_REQUEST,
        INVALID_REQUEST,
        format!(
            "The request body nests JSON values more than {limit} levels deep{place}; the limit is {limit} levels."
        ),
    )
    .with_param(param)
    .with_code(Some("nesting_too_deep".into()))
}

/// 400 for a list (or object) `param` with `got` items, over `limit`.
fn too_many_items(param: &str, what: &str, limit: usize, got: usize) -> ApiError {
    ApiError::invalid_request(
        format!("'{param}' holds {got} {what}; the limit is {limit}."),
        Some(param),
    )
    .with_code(Some("too_many_items".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// `{"<key>": {"a": {"a": ... 1}}}` with `levels` levels in all.
    fn nested(key: &str, levels: usize) -> String {
        let inner = levels - 1;
        format!(
            "{{\"{key}\": {}1{}}}",
            "{\"a\": ".repeat(inner),
            "}".repeat(inner)
        )
    }

    fn error(result: Result<(), ApiError>) -> Value {
        let err = result.expect_err("over the limit");
        assert_eq!(err.status(), http::StatusCode::BAD_REQUEST);
        err.body()["error"].clone()
    }

    #[test]
    fn depth_up_to_the_limit_passes() {
        let body = nested("chat_template_kwargs", MAX_JSON_DEPTH);
        assert!(serde_json::from_str::<Value>(&body).is_ok());
        assert!(check_depth(body.as_bytes()).is_ok());
    }

    #[test]
    fn depth_over_the_limit_names_the_top_level_field() {
        // A string holding brackets and an escaped quote comes first.
        let deep = nested("chat_template_kwargs", MAX_JSON_DEPTH + 1);
        let body = format!(r#"{{"model": "m", "x": ["{{[\""], {}"#, &deep[1..]);
        assert!(serde_json::from_str::<Value>(&body).is_ok(), "{body}");
        let err = error(check_depth(body.as_bytes()));
        assert_eq!(err["param"], "chat_template_kwargs");
        assert_eq!(err["code"], "nesting_too_deep");
        let message = err["message"].as_str().unwrap_or_default();
        assert!(message.contains(&MAX_JSON_DEPTH.to_string()), "{message}");
    }

    #[test]
    fn brackets_inside_strings_do_not_count() {
        let body = format!("{{\"s\": \"{}\"}}", "[{".repeat(100));
        assert!(check_depth(body.as_bytes()).is_ok());
    }

    #[test]
    fn a_deep_top_level_array_has_no_param() {
        let body = "[".repeat(MAX_JSON_DEPTH + 1);
        assert_eq!(error(check_depth(body.as_bytes()))["param"], Value::Null);
    }

    #[test]
    fn list_sizes_are_limited() {
        let ok = json!({"tools": vec![json!({}); MAX_TOOLS], "messages": "not a list"});
        assert!(check_sizes(&ok).is_ok());
        let err = error(check_sizes(
            &json!({"tools": vec![json!({}); MAX_TOOLS + 1]}),
        ));
        assert_eq!(err["param"], "tools");
        assert_eq!(err["code"], "too_many_items");
        let bias: serde_json::Map<String, Value> = (0..=MAX_LOGIT_BIAS)
            .map(|i| (i.to_string(), json!(1)))
            .collect();
        let err = error(check_sizes(&json!({ "logit_bias": bias })));
        assert_eq!(err["param"], "logit_bias");
        let choices = vec![json!("x"); MAX_CHOICES + 1];
        let err = error(check_sizes(
            &json!({"structured_outputs": {"choice": choices}}),
        ));
        assert_eq!(err["param"], "structured_outputs.choice");
    }
}
