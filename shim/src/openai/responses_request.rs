//! The body of `POST /v1/responses` (and `/v1/responses/input_tokens`) ->
//! proto `CreateResponseRequest`, plus whether to stream.
//!
//! Scalars are typed with serde (errors name the field, see
//! [`crate::extract::fields`]); `input`, `tools`, `tool_choice`, `text`,
//! `reasoning` and `conversation` are read by hand so that their errors name
//! the exact place (`tools[1].type`, `text.format.schema`). Unknown keys are
//! ignored, as chat ignores them. Ranges and limits (`max_output_tokens` > 0,
//! metadata sizes, `conversation` with `previous_response_id`, ...) are the
//! service's to check: it answers INVALID_ARGUMENT naming the field.

use std::collections::HashMap;

use gyre_api::v1 as pb;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::int;
use super::responses_input::{
    input, invalid_value, missing, object, opt_bool, opt_str, req_str, wrong_type,
};
use crate::error::ApiError;
use crate::extract::fields;

/// The typed scalars of a Responses request body.
#[derive(Debug, Clone, Default, Deserialize)]
struct Scalars {
    model: Option<String>,
    stream: Option<bool>,
    instructions: Option<String>,
    parallel_tool_calls: Option<bool>,
    #[serde(default, deserialize_with = "int::opt")]
    max_tool_calls: Option<u32>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    #[serde(default, deserialize_with = "int::opt")]
    top_logprobs: Option<u32>,
    include: Option<Vec<String>>,
    #[serde(default, deserialize_with = "int::opt")]
    max_output_tokens: Option<u32>,
    metadata: Option<HashMap<String, String>>,
    store: Option<bool>,
    previous_response_id: Option<String>,
    prompt_cache_key: Option<String>,
    user: Option<String>,
    safety_identifier: Option<String>,
    service_tier: Option<String>,
    truncation: Option<String>,
    background: Option<bool>,
    /// Extensions (as chat's): sampling beyond OpenAI's Responses fields.
    #[serde(default, deserialize_with = "int::opt")]
    top_k: Option<u32>,
    #[serde(default, deserialize_with = "int::opt")]
    seed: Option<i64>,
    min_p: Option<f32>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    repetition_penalty: Option<f32>,
    logit_bias: Option<HashMap<String, f32>>,
}

/// A parsed Responses request.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponsesRequest {
    pub proto: pb::CreateResponseRequest,
    /// Answer as SSE events.
    pub stream: bool,
}

impl ResponsesRequest {
    /// Parses and type-checks a body; errors name the field as `param`.
    pub fn from_body(body: &Value) -> Result<Self, ApiError> {
        let s: Scalars = fields(body)?;
        let Some(obj) = body.as_object() else {
            return Err(ApiError::invalid_request(
                "The request body must be a JSON object.",
                None,
            ));
        };
        let input = obj
            .get("input")
            .filter(|v| !v.is_null())
            .map(input)
            .transpose()?;
        let tools = match obj.get("tools") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(list)) => list
                .iter()
                .enumerate()
                .map(|(i, t)| tool(t, i))
                .collect::<Result<_, _>>()?,
            Some(other) => return Err(wrong_type("tools", "an array", other)),
        };
        let tool_choice = obj
            .get("tool_choice")
            .filter(|v| !v.is_null())
            .map(tool_choice)
            .transpose()?;
        let (text_format, verbosity) = text(obj.get("text"))?;
        let (reasoning_effort, reasoning_summary) = reasoning(obj.get("reasoning"))?;
        let conversation = conversation(obj.get("conversation"))?;
        let logit_bias = s
            .logit_bias
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| {
                k.parse::<u32>().map(|id| (id, v)).map_err(|_| {
                    invalid_value(
                        &format!("logit_bias.{}", gyre_api::clip(&k)),
                        "logit_bias keys must be token ids.".into(),
                    )
                })
            })
            .collect::<Result<HashMap<_, _>, _>>()?;
        let sampling = pb::SamplingParams {
            top_k: s.top_k,
            // Seeds are i64 in OpenAI's APIs; reinterpreted as u64 as chat does.
            seed: s.seed.map(|v| v as u64),
            min_p: s.min_p,
            presence_penalty: s.presence_penalty,
            frequency_penalty: s.frequency_penalty,
            repetition_penalty: s.repetition_penalty,
            logit_bias,
            ..Default::default()
        };
        let proto = pb::CreateResponseRequest {
            model: s.model.unwrap_or_default(),
            input,
            instructions: s.instructions,
            tools,
            tool_choice,
            parallel_tool_calls: s.parallel_tool_calls,
            max_tool_calls: s.max_tool_calls,
            text_format,
            verbosity,
            reasoning_effort,
            reasoning_summary,
            temperature: s.temperature,
            top_p: s.top_p,
            top_logprobs: s.top_logprobs,
            include: s.include.unwrap_or_default(),
            max_output_tokens: s.max_output_tokens,
            metadata: s.metadata.unwrap_or_default(),
            store: s.store,
            previous_response_id: s.previous_response_id,
            conversation,
            prompt_cache_key: s.prompt_cache_key,
            user: s.user,
            safety_identifier: s.safety_identifier,
            service_tier: s.service_tier,
            truncation: s.truncation,
            background: s.background,
            sampling: (sampling != pb::SamplingParams::default()).then_some(sampling),
        };
        Ok(Self {
            proto,
            stream: s.stream.unwrap_or(false),
        })
    }
}

/// A function tool `{"type": "function", "name", "description",
/// "parameters", "strict"}` at `tools[i]`; any other type is a 400 naming
/// `tools[i].type`.
fn tool(v: &Value, i: usize) -> Result<pb::FunctionTool, ApiError> {
    let at = format!("tools[{i}]");
    let obj = object(v, &at)?;
    let kind = req_str(obj, "type", &at)?;
    if kind != "function" {
        return Err(ApiError::invalid_request(
            format!(
                "Only function tools are supported, got type '{}'.",
                gyre_api::clip(&kind)
            ),
            Some(&format!("{at}.type")),
        )
        .with_code(Some("unsupported_value".into())));
    }
    let name = req_str(obj, "name", &at)?;
    let parameters = match obj.get("parameters") {
        None | Some(Value::Null) => None,
        Some(p @ Value::Object(_)) => Some(p.to_string()),
        Some(other) => {
            return Err(wrong_type(
                &format!("{at}.parameters"),
                "a JSON Schema object",
                other,
            ));
        }
    };
    Ok(pb::FunctionTool {
        name,
        description: opt_str(obj, "description", &at)?,
        parameters,
        strict: opt_bool(obj, "strict", &at)?,
    })
}

/// `tool_choice`: "none", "auto", "required" or `{"type": "function",
/// "name"}`.
fn tool_choice(v: &Value) -> Result<pb::ToolChoice, ApiError> {
    use pb::tool_choice::Mode;
    let mode = |mode: Mode, function: String| pb::ToolChoice {
        mode: mode as i32,
        function,
    };
    match v {
        Value::String(s) => match s.as_str() {
            "none" => Ok(mode(Mode::None, String::new())),
            "auto" => Ok(mode(Mode::Auto, String::new())),
            "required" => Ok(mode(Mode::Required, String::new())),
            other => Err(invalid_value(
                "tool_choice",
                format!(
                    "tool_choice must be 'none', 'auto', 'required' or a function, got '{}'.",
                    gyre_api::clip(other)
                ),
            )),
        },
        Value::Object(obj) => {
            let kind = req_str(obj, "type", "tool_choice")?;
            if kind != "function" {
                return Err(invalid_value(
                    "tool_choice.type",
                    format!(
                        "Only function tool choices are supported, got type '{}'.",
                        gyre_api::clip(&kind)
                    ),
                ));
            }
            Ok(mode(Mode::Function, req_str(obj, "name", "tool_choice")?))
        }
        other => Err(wrong_type("tool_choice", "a string or an object", other)),
    }
}

/// `text`: its `format` and `verbosity`.
fn text(v: Option<&Value>) -> Result<(Option<pb::TextFormat>, Option<String>), ApiError> {
    use pb::text_format::Format;
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok((None, None));
    };
    let obj = object(v, "text")?;
    let verbosity = opt_str(obj, "verbosity", "text")?;
    let format = match obj.get("format") {
        None | Some(Value::Null) => None,
        Some(f) => {
            let at = "text.format";
            let f = object(f, at)?;
            let format = match req_str(f, "type", at)?.as_str() {
                "text" => Format::Text(true),
                "json_object" => Format::JsonObject(true),
                "json_schema" => Format::JsonSchema(json_schema(f, at)?),
                other => {
                    return Err(invalid_value(
                        "text.format.type",
                        format!(
                            "text.format.type must be 'text', 'json_object' or 'json_schema', got '{}'.",
                            gyre_api::clip(other)
                        ),
                    ));
                }
            };
            Some(pb::TextFormat {
                format: Some(format),
            })
        }
    };
    Ok((format, verbosity))
}

/// `text.format` of type `json_schema`.
fn json_schema(f: &Map<String, Value>, at: &str) -> Result<pb::JsonSchemaFormat, ApiError> {
    let schema = match f.get("schema") {
        None | Some(Value::Null) => return Err(missing(&format!("{at}.schema"))),
        Some(s @ Value::Object(_)) => s.to_string(),
        Some(other) => {
            return Err(wrong_type(
                &format!("{at}.schema"),
                "a JSON Schema object",
                other,
            ));
        }
    };
    Ok(pb::JsonSchemaFormat {
        name: req_str(f, "name", at)?,
        description: opt_str(f, "description", at)?,
        schema,
        strict: opt_bool(f, "strict", at)?,
    })
}

/// `reasoning`: its `effort` and `summary` (or the older
/// `generate_summary`).
fn reasoning(v: Option<&Value>) -> Result<(Option<String>, Option<String>), ApiError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok((None, None));
    };
    let obj = object(v, "reasoning")?;
    let summary = match opt_str(obj, "summary", "reasoning")? {
        Some(s) => Some(s),
        None => opt_str(obj, "generate_summary", "reasoning")?,
    };
    Ok((opt_str(obj, "effort", "reasoning")?, summary))
}

/// `conversation`: an id, or `{"id"}`.
fn conversation(v: Option<&Value>) -> Result<Option<String>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(id)) => Ok(Some(id.clone())),
        Some(Value::Object(obj)) => req_str(obj, "id", "conversation").map(Some),
        Some(other) => Err(wrong_type(
            "conversation",
            "a string or an object with an id",
            other,
        )),
    }
}

#[cfg(test)]
#[path = "responses_request_tests.rs"]
mod tests;
