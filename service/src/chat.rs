//! Chat input -> what the chat template sees. The one place where messages
//! from the wire (proto `ChatInput`, itself a plain mapping of OpenAI's
//! messages) are normalised before rendering, following vLLM:
//! - `content` null or unset (an OpenAI client sends null for an assistant
//!   turn that only calls tools) is empty text. transformers would drop the
//!   key, and then many templates (Qwen3, QwQ, DeepSeek R1, Phi, granite)
//!   fail on any tool-call history; with empty text they all render it
//!   (vLLM gives string-content templates empty text too);
//! - tool-call `arguments` arrive as JSON text and are parsed, so templates
//!   that iterate them (`arguments | items`) or dump them (`tojson`) get an
//!   object; empty text is `{}`; text that is not JSON is INVALID_ARGUMENT;
//! - tool `parameters` (JSON text in the proto) are parsed the same way, and
//!   tools are handed over in OpenAI's shape `{"type", "function": {"name",
//!   "description", "parameters", "strict"}}` (unset fields left out);
//! - `reasoning_content` is passed on (the template module aliases it as
//!   transformers does).
//!
//! Message keys keep the wire's order: role, content, name, tool_calls,
//! tool_call_id, reasoning_content.

use gyre_api::v1;
use serde_json::{Map, Value as Json};

use crate::error::ServiceError;
use crate::runtime::ModelRuntime;
use crate::template::RenderArgs;

/// Roles a message may have.
const ROLES: [&str; 6] = [
    "system",
    "developer",
    "user",
    "assistant",
    "tool",
    "function",
];

/// The messages of a chat input as template JSON (see the module docs).
pub fn template_messages(chat: &v1::ChatInput) -> Result<Vec<Json>, ServiceError> {
    chat.messages
        .iter()
        .enumerate()
        .map(|(i, m)| template_message(i, m))
        .collect()
}

fn template_message(i: usize, m: &v1::ChatMessage) -> Result<Json, ServiceError> {
    if !ROLES.contains(&m.role.as_str()) {
        return Err(ServiceError::invalid(
            format!("chat.messages[{i}].role"),
            "INVALID_ROLE",
            format!(
                "unknown role {:?}; expected one of {}",
                gyre_api::clip(&m.role),
                ROLES.join(", ")
            ),
        ));
    }
    let mut out = Map::new();
    out.insert("role".into(), Json::String(m.role.clone()));
    out.insert(
        "content".into(),
        Json::String(m.content.clone().unwrap_or_default()),
    );
    if let Some(name) = &m.name {
        out.insert("name".into(), Json::String(name.clone()));
    }
    if !m.tool_calls.is_empty() {
        let calls = m
            .tool_calls
            .iter()
            .enumerate()
            .map(|(j, c)| tool_call(&format!("chat.messages[{i}].tool_calls[{j}]"), c))
            .collect::<Result<Vec<_>, _>>()?;
        out.insert("tool_calls".into(), Json::Array(calls));
    }
    if let Some(id) = &m.tool_call_id {
        out.insert("tool_call_id".into(), Json::String(id.clone()));
    }
    if let Some(r) = &m.reasoning_content {
        out.insert("reasoning_content".into(), Json::String(r.clone()));
    }
    Ok(Json::Object(out))
}

fn kind(t: &str) -> Json {
    Json::String(if t.is_empty() { "function" } else { t }.to_string())
}

fn tool_call(field: &str, c: &v1::ToolCall) -> Result<Json, ServiceError> {
    let f = c.function.clone().unwrap_or_default();
    let arguments = parse_json_text(&format!("{field}.function.arguments"), &f.arguments)?;
    let mut out = Map::new();
    if !c.id.is_empty() {
        out.insert("id".into(), Json::String(c.id.clone()));
    }
    out.insert("type".into(), kind(&c.r#type));
    out.insert(
        "function".into(),
        serde_json::json!({"name": f.name, "arguments": arguments}),
    );
    Ok(Json::Object(out))
}

/// JSON text from the wire as a value; empty (or blank) text is `{}`.
fn parse_json_text(field: &str, text: &str) -> Result<Json, ServiceError> {
    if text.trim().is_empty() {
        return Ok(Json::Object(Map::new()));
    }
    serde_json::from_str(text).map_err(|e| {
        ServiceError::invalid(
            field.to_string(),
            "INVALID_JSON",
            format!(
                "{field} is not valid JSON: {}",
                gyre_api::clip(&e.to_string())
            ),
        )
    })
}

/// The tools of a chat input in OpenAI's shape; none when there are none.
pub fn template_tools(chat: &v1::ChatInput) -> Result<Option<Vec<Json>>, ServiceError> {
    if chat.tools.is_empty() {
        return Ok(None);
    }
    chat.tools
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let field = format!("chat.tools[{i}]");
            let f = t.function.clone().unwrap_or_default();
            if f.name.is_empty() {
                return Err(ServiceError::invalid(
                    format!("{field}.function.name"),
                    "MISSING_TOOL_NAME",
                    "a tool needs a function name",
                ));
            }
            let mut function = Map::new();
            function.insert("name".into(), Json::String(f.name.clone()));
            if let Some(d) = &f.description {
                function.insert("description".into(), Json::String(d.clone()));
            }
            if let Some(p) = &f.parameters {
                let params = parse_json_text(&format!("{field}.function.parameters"), p)?;
                if !params.is_object() {
                    return Err(ServiceError::invalid(
                        format!("{field}.function.parameters"),
                        "INVALID_JSON",
                        "function parameters must be a JSON Schema object",
                    ));
                }
                function.insert("parameters".into(), params);
            }
            if let Some(strict) = f.strict {
                function.insert("strict".into(), Json::Bool(strict));
            }
            Ok(serde_json::json!({"type": kind(&t.r#type), "function": function}))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// Renders chat input with the model's template (or the request's own),
/// honouring tools, `continue_final_message` and `chat_template_kwargs`.
pub fn render_chat_input(
    model: &ModelRuntime,
    chat: &v1::ChatInput,
) -> Result<String, ServiceError> {
    let messages = template_messages(chat)?;
    let tools = template_tools(chat)?;
    let cont = chat.continue_final_message.unwrap_or(false);
    let kwargs = chat
        .chat_template_kwargs
        .as_ref()
        .map(struct_to_json)
        .unwrap_or_default();
    model.render_chat_with(
        chat.chat_template.as_deref(),
        RenderArgs {
            messages: &messages,
            tools: tools.as_deref(),
            add_generation_prompt: chat.add_generation_prompt.unwrap_or(!cont),
            kwargs: &kwargs,
            continue_final_message: cont,
        },
    )
}

/// A protobuf Struct as JSON (the one conversion of `chat_template_kwargs`).
fn struct_to_json(s: &prost_types::Struct) -> Map<String, Json> {
    s.fields
        .iter()
        .map(|(k, v)| (k.clone(), value_to_json(v)))
        .collect()
}

fn value_to_json(v: &prost_types::Value) -> Json {
    use prost_types::value::Kind;
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Json::Null,
        Some(Kind::BoolValue(b)) => Json::Bool(*b),
        // Integral numbers stay integers, as templates compare them with ints.
        Some(Kind::NumberValue(n)) if n.fract() == 0.0 && n.abs() < 9.0e15 => Json::from(*n as i64),
        Some(Kind::NumberValue(n)) => serde_json::Number::from_f64(*n)
            .map(Json::Number)
            .unwrap_or(Json::Null),
        Some(Kind::StringValue(s)) => Json::String(s.clone()),
        Some(Kind::StructValue(s)) => Json::Object(struct_to_json(s)),
        Some(Kind::ListValue(l)) => Json::Array(l.values.iter().map(value_to_json).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(role: &str, content: Option<&str>) -> v1::ChatMessage {
        v1::ChatMessage {
            role: role.into(),
            content: content.map(str::to_string),
            ..Default::default()
        }
    }

    #[test]
    fn tool_call_arguments_become_objects_and_null_content_is_empty() {
        let mut assistant = msg("assistant", None);
        for (id, args) in [("a1", r#"{"city": "Paris", "days": 2}"#), ("a2", "")] {
            assistant.tool_calls.push(v1::ToolCall {
                id: id.into(),
                r#type: String::new(),
                function: Some(v1::FunctionCall {
                    name: "weather".into(),
                    arguments: args.into(),
                }),
            });
        }
        let mut tool = msg("tool", Some("sunny"));
        tool.tool_call_id = Some("a1".into());
        let chat = v1::ChatInput {
            messages: vec![msg("user", Some("hi")), assistant, tool],
            ..Default::default()
        };
        let got = template_messages(&chat).expect("valid");
        assert_eq!(
            Json::Array(got),
            serde_json::json!([
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "a1", "type": "function", "function": {"name": "weather", "arguments": {"city": "Paris", "days": 2}}},
                    {"id": "a2", "type": "function", "function": {"name": "weather", "arguments": {}}}
                ]},
                {"role": "tool", "content": "sunny", "tool_call_id": "a1"}
            ])
        );
        // Keys keep the wire's order (not sorted).
        assert!(
            Json::Array(template_messages(&chat).expect("valid"))
                .to_string()
                .contains(r#"{"city":"Paris","days":2}"#)
        );
        let mut reordered = chat.clone();
        reordered.messages[1].tool_calls[0]
            .function
            .as_mut()
            .expect("function")
            .arguments = r#"{"days": 2, "city": "Paris"}"#.into();
        assert!(
            Json::Array(template_messages(&reordered).expect("valid"))
                .to_string()
                .contains(r#"{"days":2,"city":"Paris"}"#)
        );
    }

    #[test]
    fn bad_arguments_and_parameters_name_the_field() {
        let mut assistant = msg("assistant", None);
        assistant.tool_calls.push(v1::ToolCall {
            function: Some(v1::FunctionCall {
                name: "f".into(),
                arguments: "{not json".into(),
            }),
            ..Default::default()
        });
        let chat = v1::ChatInput {
            messages: vec![assistant],
            ..Default::default()
        };
        let err = template_messages(&chat).expect_err("invalid");
        assert!(
            format!("{err:?}").contains("chat.messages[0].tool_calls[0].function.arguments"),
            "{err:?}"
        );
        let chat = v1::ChatInput {
            tools: vec![v1::Tool {
                r#type: "function".into(),
                function: Some(v1::FunctionDefinition {
                    name: "f".into(),
                    parameters: Some("[1]".into()),
                    ..Default::default()
                }),
            }],
            ..Default::default()
        };
        let err = template_tools(&chat).expect_err("not an object");
        assert!(
            format!("{err:?}").contains("chat.tools[0].function.parameters"),
            "{err:?}"
        );
    }

    #[test]
    fn tools_take_openais_shape() {
        let chat = v1::ChatInput {
            tools: vec![v1::Tool {
                r#type: String::new(),
                function: Some(v1::FunctionDefinition {
                    name: "f".into(),
                    description: Some("does f".into()),
                    parameters: Some(r#"{"type": "object", "properties": {}}"#.into()),
                    strict: None,
                }),
            }],
            ..Default::default()
        };
        let got = template_tools(&chat).expect("valid").expect("some");
        assert_eq!(
            got[0].to_string(),
            r#"{"type":"function","function":{"name":"f","description":"does f","parameters":{"type":"object","properties":{}}}}"#
        );
        assert!(
            template_tools(&v1::ChatInput::default())
                .expect("ok")
                .is_none()
        );
    }
}
