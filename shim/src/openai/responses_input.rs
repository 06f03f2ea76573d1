//! The `input` of `POST /v1/responses` (and the `items` of
//! `POST /v1/conversations`): OpenAI's input items as JSON -> proto `Item`s.
//!
//! Items are read by hand rather than through serde's tagged enums so that
//! every error names the exact place in OpenAI's spelling
//! (`input[1].content[0].text`) and says what was expected. Shapes taken:
//! `message` (also the `{"role", "content"}` shorthand without `type`;
//! content as a string or as `input_text` / `output_text` / `refusal` parts),
//! `function_call`, `function_call_output` (output as a string or as
//! `input_text` parts), and `reasoning` (`summary` and `content` parts).
//! Other item and part types (images, files, `item_reference`, built-in tool
//! calls) are a 400 naming their `type`. Roles and emptiness are the
//! service's to check.

use gyre_api::clip;
use gyre_api::v1 as pb;
use serde_json::{Map, Value};

use crate::error::ApiError;

/// The JSON type name of `v`, as OpenAI's error messages name them.
fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_f64() => "a decimal",
        Value::Number(_) => "an integer",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// 400 naming `at`: `v` is not of the `expected` type.
pub(crate) fn wrong_type(at: &str, expected: &str, v: &Value) -> ApiError {
    ApiError::invalid_request(
        format!(
            "Invalid type for '{at}': expected {expected}, but got {} instead.",
            type_name(v)
        ),
        Some(at),
    )
    .with_code(Some("invalid_type".into()))
}

/// 400 naming `at`: a required key is absent (or null).
pub(crate) fn missing(at: &str) -> ApiError {
    ApiError::invalid_request(format!("Missing required parameter: '{at}'."), Some(at))
        .with_code(Some("missing_required_parameter".into()))
}

/// 400 naming `at`: a value gyre does not take there.
pub(crate) fn invalid_value(at: &str, message: String) -> ApiError {
    ApiError::invalid_request(message, Some(at)).with_code(Some("invalid_value".into()))
}

/// `v` as an object, else a 400 naming `at`.
pub(crate) fn object<'a>(v: &'a Value, at: &str) -> Result<&'a Map<String, Value>, ApiError> {
    v.as_object().ok_or_else(|| wrong_type(at, "an object", v))
}

/// `obj[key]` as a string; `None` when absent or null.
pub(crate) fn opt_str(
    obj: &Map<String, Value>,
    key: &str,
    at: &str,
) -> Result<Option<String>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(v) => Err(wrong_type(&format!("{at}.{key}"), "a string", v)),
    }
}

/// `obj[key]` as a string, required.
pub(crate) fn req_str(obj: &Map<String, Value>, key: &str, at: &str) -> Result<String, ApiError> {
    opt_str(obj, key, at)?.ok_or_else(|| missing(&format!("{at}.{key}")))
}

/// `obj[key]` as a boolean; `None` when absent or null.
pub(crate) fn opt_bool(
    obj: &Map<String, Value>,
    key: &str,
    at: &str,
) -> Result<Option<bool>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(wrong_type(&format!("{at}.{key}"), "a boolean", v)),
    }
}

/// `obj[key]` as an array; empty when absent or null.
fn opt_array<'a>(
    obj: &'a Map<String, Value>,
    key: &str,
    at: &str,
) -> Result<&'a [Value], ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(a)) => Ok(a),
        Some(v) => Err(wrong_type(&format!("{at}.{key}"), "an array", v)),
    }
}

/// A `type` gyre does not take at `at.type`.
fn unsupported_type(at: &str, what: &str, kind: &str) -> ApiError {
    ApiError::invalid_request(
        format!("{what} of type '{}' is not supported.", clip(kind)),
        Some(&format!("{at}.type")),
    )
    .with_code(Some("unsupported_value".into()))
}

/// The `input` of a request: a string (one user message) or items.
pub fn input(v: &Value) -> Result<pb::create_response_request::Input, ApiError> {
    use pb::create_response_request::Input;
    match v {
        Value::String(s) => Ok(Input::Text(s.clone())),
        Value::Array(list) => items(list, "input").map(|items| Input::Items(pb::Items { items })),
        other => Err(wrong_type("input", "a string or an array of items", other)),
    }
}

/// Items of a list named `name` (`input`, `items`).
pub fn items(list: &[Value], name: &str) -> Result<Vec<pb::Item>, ApiError> {
    list.iter()
        .enumerate()
        .map(|(i, v)| item(v, &format!("{name}[{i}]")))
        .collect()
}

/// One input item at `at`.
pub fn item(v: &Value, at: &str) -> Result<pb::Item, ApiError> {
    use pb::item::Item;
    let obj = object(v, at)?;
    let kind = match obj.get("type") {
        None | Some(Value::Null) if obj.contains_key("role") => "message".to_owned(),
        None | Some(Value::Null) => return Err(missing(&format!("{at}.type"))),
        Some(Value::String(s)) => s.clone(),
        Some(other) => return Err(wrong_type(&format!("{at}.type"), "a string", other)),
    };
    let id = opt_str(obj, "id", at)?.unwrap_or_default();
    let status = opt_str(obj, "status", at)?.unwrap_or_default();
    let item = match kind.as_str() {
        "message" => Item::Message(message(obj, at)?),
        "function_call" => Item::FunctionCall(pb::FunctionCallItem {
            call_id: req_str(obj, "call_id", at)?,
            name: req_str(obj, "name", at)?,
            arguments: req_str(obj, "arguments", at)?,
        }),
        "function_call_output" => Item::FunctionCallOutput(pb::FunctionCallOutputItem {
            call_id: req_str(obj, "call_id", at)?,
            output: call_output(obj, at)?,
        }),
        "reasoning" => Item::Reasoning(reasoning(obj, at)?),
        other => return Err(unsupported_type(at, "An input item", other)),
    };
    Ok(pb::Item {
        id,
        status,
        item: Some(item),
    })
}

/// A `message` item's role and content.
fn message(obj: &Map<String, Value>, at: &str) -> Result<pb::MessageItem, ApiError> {
    let role = req_str(obj, "role", at)?;
    let content_at = format!("{at}.content");
    let content = match obj.get("content") {
        None | Some(Value::Null) => return Err(missing(&content_at)),
        Some(Value::String(text)) => vec![text_part(&role, text.clone())],
        Some(Value::Array(parts)) => parts
            .iter()
            .enumerate()
            .map(|(j, p)| part(p, &format!("{content_at}[{j}]")))
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(wrong_type(
                &content_at,
                "a string or an array of content parts",
                other,
            ));
        }
    };
    Ok(pb::MessageItem { role, content })
}

/// String content as a part: the model's own text for the assistant,
/// input text for everyone else.
fn text_part(role: &str, text: String) -> pb::ContentPart {
    use pb::content_part::Part;
    let part = if role == "assistant" {
        Part::OutputText(pb::OutputText {
            text,
            logprobs: Vec::new(),
        })
    } else {
        Part::InputText(text)
    };
    pb::ContentPart { part: Some(part) }
}

/// One content part of a message at `at`.
fn part(v: &Value, at: &str) -> Result<pb::ContentPart, ApiError> {
    use pb::content_part::Part;
    let obj = object(v, at)?;
    let kind = req_str(obj, "type", at)?;
    let part = match kind.as_str() {
        "input_text" => Part::InputText(req_str(obj, "text", at)?),
        // Earlier output sent back: its annotations and logprobs are not
        // part of the conversation.
        "output_text" => Part::OutputText(pb::OutputText {
            text: req_str(obj, "text", at)?,
            logprobs: Vec::new(),
        }),
        "refusal" => Part::Refusal(req_str(obj, "refusal", at)?),
        other => return Err(unsupported_type(at, "A content part", other)),
    };
    Ok(pb::ContentPart { part: Some(part) })
}

/// A `function_call_output`'s output: a string, or `input_text` parts
/// joined.
fn call_output(obj: &Map<String, Value>, at: &str) -> Result<String, ApiError> {
    let out_at = format!("{at}.output");
    match obj.get("output") {
        None | Some(Value::Null) => Err(missing(&out_at)),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, p) in parts.iter().enumerate() {
                let p_at = format!("{out_at}[{j}]");
                let p = object(p, &p_at)?;
                match req_str(p, "type", &p_at)?.as_str() {
                    "input_text" => text.push_str(&req_str(p, "text", &p_at)?),
                    other => return Err(unsupported_type(&p_at, "An output part", other)),
                }
            }
            Ok(text)
        }
        Some(other) => Err(wrong_type(
            &out_at,
            "a string or an array of content parts",
            other,
        )),
    }
}

/// A `reasoning` item: `content` parts joined as its text, `summary` parts
/// kept.
fn reasoning(obj: &Map<String, Value>, at: &str) -> Result<pb::ReasoningItem, ApiError> {
    let texts = |key: &str, kind: &str| -> Result<Vec<String>, ApiError> {
        opt_array(obj, key, at)?
            .iter()
            .enumerate()
            .map(|(j, p)| {
                let p_at = format!("{at}.{key}[{j}]");
                let p = object(p, &p_at)?;
                let given = req_str(p, "type", &p_at)?;
                if given != kind {
                    return Err(unsupported_type(&p_at, "A reasoning part", &given));
                }
                req_str(p, "text", &p_at)
            })
            .collect()
    };
    Ok(pb::ReasoningItem {
        text: texts("content", "reasoning_text")?.concat(),
        summary: texts("summary", "summary_text")?,
        encrypted_content: opt_str(obj, "encrypted_content", at)?,
    })
}

#[cfg(test)]
#[path = "responses_input_tests.rs"]
mod tests;
