//! Proto -> OpenAI JSON for the Responses API: the `response` object, its
//! items, item lists and conversations.
//!
//! Every key OpenAI's `Response` schema requires is present (null where
//! gyre has no value); the request's settings come back from the service's
//! echo (`Response.request`). `output_text` is the SDK's convenience field:
//! the text of every `output_text` part of the output's messages, joined.

use gyre_api::v1 as pb;
use serde_json::{Map, Value, json};

use super::response::bytes;

/// `v` as JSON: the shortest decimal that reads back as the same `f32`
/// (0.7, not 0.699999988079071).
pub fn float(v: f32) -> Value {
    format!("{v}")
        .parse::<f64>()
        .ok()
        .and_then(serde_json::Number::from_f64)
        .map_or(Value::Null, Value::Number)
}

/// An optional value as JSON (null when unset).
fn opt<T: Into<Value>>(v: Option<T>) -> Value {
    v.map_or(Value::Null, Into::into)
}

/// The `response` object.
pub fn response(r: &pb::Response) -> Value {
    let req = r.request.clone().unwrap_or_default();
    let output: Vec<Value> = r.output.iter().map(item).collect();
    let error = r.error.as_ref().map_or(
        Value::Null,
        |e| json!({"code": e.code, "message": e.message}),
    );
    let incomplete = r
        .incomplete_reason
        .as_ref()
        .map_or(Value::Null, |reason| json!({ "reason": reason }));
    let usage = r.usage.as_ref().map_or(Value::Null, usage);
    let mut out = json!({
        "id": r.id,
        "object": "response",
        "created_at": r.created_at,
        "status": r.status,
        "background": req.background.unwrap_or(false),
        "completed_at": opt(r.completed_at),
        "conversation": req.conversation.as_ref().map_or(Value::Null, |id| json!({ "id": id })),
        "error": error,
        "incomplete_details": incomplete,
        "instructions": opt(req.instructions.clone()),
        "max_output_tokens": opt(req.max_output_tokens),
        "max_tool_calls": opt(req.max_tool_calls),
        "metadata": metadata(&req.metadata),
        "model": r.model,
        "output": output,
        "output_text": output_text(&r.output),
        "parallel_tool_calls": req.parallel_tool_calls.unwrap_or(true),
        "previous_response_id": opt(req.previous_response_id.clone()),
        "prompt_cache_key": opt(req.prompt_cache_key.clone()),
        "reasoning": {
            "effort": opt(req.reasoning_effort.clone()),
            "summary": opt(req.reasoning_summary.clone()),
        },
        "safety_identifier": opt(req.safety_identifier.clone()),
        "service_tier": req.service_tier.clone().unwrap_or_else(|| "default".into()),
        "store": req.store.unwrap_or(true),
        "temperature": req.temperature.map_or(Value::Null, float),
        "text": text(&req),
        "tool_choice": tool_choice(req.tool_choice.as_ref(), !req.tools.is_empty()),
        "tools": req.tools.iter().map(tool).collect::<Vec<_>>(),
        "top_logprobs": opt(req.top_logprobs),
        "top_p": req.top_p.map_or(Value::Null, float),
        "truncation": req.truncation.clone().unwrap_or_else(|| "disabled".into()),
        "usage": usage,
        "user": opt(req.user.clone()),
    });
    // Keys the schema has as optional but not nullable: left out when unset.
    if let Some(obj) = out.as_object_mut() {
        for key in OMITTED_WHEN_UNSET {
            if obj.get(key).is_some_and(Value::is_null) {
                obj.remove(key);
            }
        }
    }
    out
}

/// The `response` object's keys that OpenAI's schema lets be absent but
/// not null.
const OMITTED_WHEN_UNSET: [&str; 2] = ["usage", "user"];

/// A string map (`metadata`) as a JSON object, keys sorted.
fn metadata(map: &std::collections::HashMap<String, String>) -> Value {
    let mut keys: Vec<_> = map.iter().collect();
    keys.sort();
    Value::Object(
        keys.into_iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect::<Map<String, Value>>(),
    )
}

/// The text of every `output_text` part of the output's messages.
pub fn output_text(output: &[pb::Item]) -> String {
    use pb::content_part::Part;
    output
        .iter()
        .filter_map(|i| match &i.item {
            Some(pb::item::Item::Message(m)) => Some(m),
            _ => None,
        })
        .flat_map(|m| &m.content)
        .filter_map(|p| match &p.part {
            Some(Part::OutputText(t)) => Some(t.text.as_str()),
            _ => None,
        })
        .collect()
}

/// `usage`.
fn usage(u: &pb::ResponseUsage) -> Value {
    json!({
        "input_tokens": u.input_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": u.output_tokens,
        "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
        "total_tokens": u.input_tokens + u.output_tokens,
    })
}

/// `text`: the format (`{"type": "text"}` when unset) and verbosity.
fn text(req: &pb::CreateResponseRequest) -> Value {
    use pb::text_format::Format;
    let format = match req.text_format.as_ref().and_then(|f| f.format.as_ref()) {
        None | Some(Format::Text(_)) => json!({"type": "text"}),
        Some(Format::JsonObject(_)) => json!({"type": "json_object"}),
        Some(Format::JsonSchema(s)) => {
            let mut f = json!({
                "type": "json_schema",
                "name": s.name,
                "schema": json_text(&s.schema),
                "strict": opt(s.strict),
            });
            // Optional, and not nullable in OpenAI's schema.
            if let Some(d) = &s.description {
                f["description"] = d.clone().into();
            }
            f
        }
    };
    let mut out = json!({ "format": format });
    if let Some(v) = &req.verbosity {
        out["verbosity"] = v.clone().into();
    }
    out
}

/// JSON text back as JSON (null when it does not parse).
fn json_text(s: &str) -> Value {
    serde_json::from_str(s).unwrap_or(Value::Null)
}

/// `tool_choice`: unset is "auto" with tools, "none" without.
fn tool_choice(c: Option<&pb::ToolChoice>, tools: bool) -> Value {
    use pb::tool_choice::Mode;
    let Some(c) = c else {
        return if tools { "auto" } else { "none" }.into();
    };
    match Mode::try_from(c.mode).unwrap_or(Mode::Auto) {
        Mode::Auto => "auto".into(),
        Mode::None => "none".into(),
        Mode::Required => "required".into(),
        Mode::Function => json!({"type": "function", "name": c.function}),
    }
}

/// A function tool.
fn tool(t: &pb::FunctionTool) -> Value {
    json!({
        "type": "function",
        "name": t.name,
        "description": opt(t.description.clone()),
        "parameters": t.parameters.as_deref().map_or(Value::Null, json_text),
        "strict": opt(t.strict),
    })
}

/// An item, input or output.
pub fn item(i: &pb::Item) -> Value {
    use pb::item::Item;
    let status = if i.status.is_empty() {
        "completed"
    } else {
        i.status.as_str()
    };
    match &i.item {
        Some(Item::Message(m)) => json!({
            "type": "message",
            "id": i.id,
            "status": status,
            "role": m.role,
            "content": m.content.iter().map(part).collect::<Vec<_>>(),
        }),
        Some(Item::FunctionCall(c)) => json!({
            "type": "function_call",
            "id": i.id,
            "call_id": c.call_id,
            "name": c.name,
            "arguments": c.arguments,
            "status": status,
        }),
        Some(Item::FunctionCallOutput(o)) => json!({
            "type": "function_call_output",
            "id": i.id,
            "call_id": o.call_id,
            "output": o.output,
            "status": status,
        }),
        Some(Item::Reasoning(r)) => json!({
            "type": "reasoning",
            "id": i.id,
            "status": status,
            "summary": r.summary.iter()
                .map(|s| json!({"type": "summary_text", "text": s}))
                .collect::<Vec<_>>(),
            "content": if r.text.is_empty() {
                json!([])
            } else {
                json!([{"type": "reasoning_text", "text": r.text}])
            },
            "encrypted_content": opt(r.encrypted_content.clone()),
        }),
        // An item of a kind this shim does not know (a newer service).
        None => json!({"type": "message", "id": i.id, "status": status,
                       "role": "assistant", "content": []}),
    }
}

/// A content part.
pub fn part(p: &pb::ContentPart) -> Value {
    use pb::content_part::Part;
    match &p.part {
        Some(Part::InputText(t)) => json!({"type": "input_text", "text": t}),
        Some(Part::OutputText(t)) => json!({
            "type": "output_text",
            "text": t.text,
            "annotations": [],
            "logprobs": t.logprobs.iter().map(content_logprob).collect::<Vec<_>>(),
        }),
        Some(Part::Refusal(r)) => json!({"type": "refusal", "refusal": r}),
        Some(Part::ReasoningText(t)) => json!({"type": "reasoning_text", "text": t}),
        None => json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []}),
    }
}

/// A token's logprob in an `output_text` part (OpenAI's `LogProb`: with
/// UTF-8 `bytes`).
fn content_logprob(l: &pb::TokenLogprob) -> Value {
    json!({
        "token": l.token,
        "logprob": float(l.logprob),
        "bytes": bytes(&l.token, &l.token_bytes),
        "top_logprobs": l.top_logprobs.iter().map(|t| json!({
            "token": t.token,
            "logprob": float(t.logprob),
            "bytes": bytes(&t.token, &t.token_bytes),
        })).collect::<Vec<_>>(),
    })
}

/// A token's logprob in a text delta or done event (OpenAI's
/// `ResponseLogProb`).
pub fn event_logprob(l: &pb::TokenLogprob) -> Value {
    json!({
        "token": l.token,
        "logprob": float(l.logprob),
        "top_logprobs": l.top_logprobs.iter().map(|t| json!({
            "token": t.token,
            "logprob": float(t.logprob),
        })).collect::<Vec<_>>(),
    })
}

/// An item list (`input_items`, conversation items).
pub fn item_list(list: &pb::ItemList) -> Value {
    let id = |i: Option<&pb::Item>| i.map_or(Value::Null, |i| i.id.clone().into());
    json!({
        "object": "list",
        "data": list.data.iter().map(item).collect::<Vec<_>>(),
        "first_id": id(list.data.first()),
        "last_id": id(list.data.last()),
        "has_more": list.has_more,
    })
}

/// A conversation.
pub fn conversation(c: &pb::Conversation) -> Value {
    json!({
        "id": c.id,
        "object": "conversation",
        "created_at": c.created_at,
        "metadata": metadata(&c.metadata),
    })
}

#[cfg(test)]
#[path = "responses_output_tests.rs"]
mod tests;
