//! Tools, `tool_choice`, `response_format` and vLLM's structured-output
//! extensions: OpenAI JSON -> the proto's `Tool`, `ToolChoice` and
//! `StructuredOutput` (the service compiles and enforces them).

use gyre_api::v1 as pb;
use serde_json::Value;

use crate::error::ApiError;
use crate::openai::request::CommonParams;

/// An OpenAI function tool `{"type": "function", "function": {"name",
/// "description", "parameters", "strict"}}`.
pub(crate) fn tool_spec(t: Value, i: usize) -> Result<pb::Tool, ApiError> {
    let bad = |what: &str, at: &str| ApiError::invalid_request(what.to_string(), Some(at));
    let at = format!("tools[{i}]");
    let kind = t.get("type").and_then(Value::as_str).unwrap_or("function");
    if kind != "function" {
        return Err(bad(
            &format!(
                "Only function tools are supported, got type '{}'.",
                gyre_api::clip(kind)
            ),
            &format!("{at}.type"),
        ));
    }
    let f = t
        .get("function")
        .and_then(Value::as_object)
        .ok_or_else(|| {
            bad(
                "A tool needs a 'function' object.",
                &format!("{at}.function"),
            )
        })?;
    let name = f
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| bad("A function needs a name.", &format!("{at}.function.name")))?;
    let parameters = match f.get("parameters") {
        None | Some(Value::Null) => None,
        Some(p @ Value::Object(_)) => Some(p.to_string()),
        Some(_) => {
            return Err(bad(
                "Function parameters must be a JSON Schema object.",
                &format!("{at}.function.parameters"),
            ));
        }
    };
    Ok(pb::Tool {
        r#type: "function".into(),
        function: Some(pb::FunctionDefinition {
            name: name.to_string(),
            description: f
                .get("description")
                .and_then(Value::as_str)
                .map(str::to_string),
            parameters,
            strict: f.get("strict").and_then(Value::as_bool),
        }),
    })
}

/// OpenAI's `tool_choice`.
pub(crate) fn tool_choice(v: &Value) -> Result<pb::ToolChoice, ApiError> {
    use pb::tool_choice::Mode;
    let bad = || {
        ApiError::invalid_request(
            "tool_choice must be 'none', 'auto', 'required' or {\"type\": \"function\", \"function\": {\"name\": ...}}.",
            Some("tool_choice"),
        )
    };
    let (mode, function) = match v {
        Value::String(s) => match s.as_str() {
            "none" => (Mode::None, String::new()),
            "auto" => (Mode::Auto, String::new()),
            "required" => (Mode::Required, String::new()),
            _ => return Err(bad()),
        },
        Value::Object(o) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(bad)?;
            (Mode::Function, name.to_string())
        }
        _ => return Err(bad()),
    };
    Ok(pb::ToolChoice {
        mode: mode as i32,
        function,
    })
}

/// OpenAI's `response_format` as a structure to enforce (None for text).
pub(crate) fn response_format(
    f: Option<&crate::openai::request::ResponseFormat>,
) -> Result<Option<pb::StructuredOutput>, ApiError> {
    use pb::structured_output::Kind;
    let Some(f) = f else { return Ok(None) };
    let kind = match f.kind.as_str() {
        "text" => return Ok(None),
        "json_object" => Kind::JsonObject(true),
        "json_schema" => {
            let schema = f
                .json_schema
                .as_ref()
                .and_then(|j| j.get("schema"))
                .ok_or_else(|| {
                    ApiError::invalid_request(
                        "response_format of type 'json_schema' needs json_schema.schema.",
                        Some("response_format"),
                    )
                })?;
            Kind::JsonSchema(schema.to_string())
        }
        other => {
            return Err(ApiError::invalid_request(
                format!(
                    "response_format type must be 'text', 'json_object' or 'json_schema', got '{}'.",
                    gyre_api::clip(other)
                ),
                Some("response_format"),
            ));
        }
    };
    Ok(Some(pb::StructuredOutput { kind: Some(kind) }))
}

/// vLLM's structured-output extensions (`structured_outputs`, `guided_*`):
/// at most one structure.
pub(crate) fn structured_extension(
    c: &CommonParams,
) -> Result<Option<pb::StructuredOutput>, ApiError> {
    use pb::structured_output::Kind;
    let json_text = |v: &Value| match v {
        Value::String(s) => s.clone(),
        v => v.to_string(),
    };
    let mut found: Vec<(&str, Kind)> = Vec::new();
    if let Some(so) = &c.structured_outputs {
        if let Some(j) = &so.json {
            found.push(("structured_outputs", Kind::JsonSchema(json_text(j))));
        }
        if let Some(r) = &so.regex {
            found.push(("structured_outputs", Kind::Regex(r.clone())));
        }
        if let Some(ch) = &so.choice {
            found.push((
                "structured_outputs",
                Kind::Choice(pb::Choices {
                    options: ch.clone(),
                }),
            ));
        }
        if let Some(g) = &so.grammar {
            found.push(("structured_outputs", Kind::Grammar(g.clone())));
        }
        if so.json_object == Some(true) {
            found.push(("structured_outputs", Kind::JsonObject(true)));
        }
    }
    if let Some(j) = &c.guided_json {
        found.push(("guided_json", Kind::JsonSchema(json_text(j))));
    }
    if let Some(r) = &c.guided_regex {
        found.push(("guided_regex", Kind::Regex(r.clone())));
    }
    if let Some(ch) = &c.guided_choice {
        found.push((
            "guided_choice",
            Kind::Choice(pb::Choices {
                options: ch.clone(),
            }),
        ));
    }
    if let Some(g) = &c.guided_grammar {
        found.push(("guided_grammar", Kind::Grammar(g.clone())));
    }
    match found.len() {
        0 => Ok(None),
        1 => Ok(found
            .pop()
            .map(|(_, k)| pb::StructuredOutput { kind: Some(k) })),
        _ => Err(ApiError::invalid_request(
            "Give at most one structured-output constraint.",
            Some(found[1].0),
        )),
    }
}
