//! Checks of a `CreateResponseRequest` that the proto's types cannot make:
//! ranges, enumerations, limits and references between fields. Each
//! failure is INVALID_ARGUMENT naming the field in OpenAI's spelling
//! (`input[2].role`, `text.format.schema`, `metadata`, ...), before
//! anything is generated or stored.

use gyre_api::v1::{
    CreateResponseRequest, Item, create_response_request::Input, item::Item as It,
    text_format::Format, tool_choice::Mode,
};

use crate::error::ServiceError;

/// The one `include` value gyre honours.
pub const INCLUDE_LOGPROBS: &str = "message.output_text.logprobs";

const ROLES: [&str; 4] = ["user", "system", "developer", "assistant"];
const EFFORTS: [&str; 6] = ["none", "minimal", "low", "medium", "high", "xhigh"];
const SUMMARIES: [&str; 3] = ["auto", "concise", "detailed"];
const VERBOSITIES: [&str; 3] = ["low", "medium", "high"];
const TIERS: [&str; 5] = ["auto", "default", "flex", "scale", "priority"];
const TRUNCATIONS: [&str; 2] = ["disabled", "auto"];
const MAX_METADATA_KEYS: usize = 16;
const MAX_METADATA_KEY_CHARS: usize = 64;
const MAX_METADATA_VALUE_CHARS: usize = 512;
/// Most input items of one request.
pub const MAX_INPUT_ITEMS: usize = 2048;

fn bad(field: impl Into<String>, reason: &'static str, msg: impl Into<String>) -> ServiceError {
    ServiceError::invalid(field, reason, msg)
}

fn one_of(field: &str, v: &Option<String>, allowed: &[&str]) -> Result<(), ServiceError> {
    match v {
        Some(v) if !allowed.contains(&v.as_str()) => Err(bad(
            field,
            "INVALID_VALUE",
            format!(
                "{field} must be one of {}, got {:?}",
                allowed.join(", "),
                gyre_api::clip(v)
            ),
        )),
        _ => Ok(()),
    }
}

/// A name OpenAI accepts for functions and schemas: 1 to 64 of a-z, A-Z,
/// 0-9, `_` and `-`.
fn valid_name(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn json_object(field: &str, text: &str) -> Result<(), ServiceError> {
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(v) if v.is_object() => Ok(()),
        Ok(_) => Err(bad(
            field,
            "INVALID_JSON",
            format!("{field} must be a JSON object"),
        )),
        Err(e) => Err(bad(
            field,
            "INVALID_JSON",
            format!(
                "{field} is not valid JSON: {}",
                gyre_api::clip(&e.to_string())
            ),
        )),
    }
}

/// Validates everything but what needs the store or the model.
pub fn request(r: &CreateResponseRequest) -> Result<(), ServiceError> {
    match &r.input {
        None if r.previous_response_id.is_none() && r.conversation.is_none() => {
            return Err(bad("input", "MISSING_INPUT", "input is required"));
        }
        Some(Input::Text(t)) if t.is_empty() => {
            return Err(bad("input", "EMPTY_INPUT", "input must not be empty"));
        }
        Some(Input::Items(items)) => {
            if items.items.is_empty() {
                return Err(bad("input", "EMPTY_INPUT", "input must not be empty"));
            }
            if items.items.len() > MAX_INPUT_ITEMS {
                return Err(bad(
                    "input",
                    "TOO_MANY_ITEMS",
                    format!("at most {MAX_INPUT_ITEMS} input items"),
                ));
            }
            for (i, item) in items.items.iter().enumerate() {
                self::item(&format!("input[{i}]"), item)?;
            }
        }
        _ => {}
    }
    if r.previous_response_id.is_some() && r.conversation.is_some() {
        return Err(bad(
            "conversation",
            "CONFLICTING_PARAMETERS",
            "previous_response_id and conversation cannot both be given",
        ));
    }
    for (i, t) in r.tools.iter().enumerate() {
        if !valid_name(&t.name) {
            return Err(bad(
                format!("tools[{i}].name"),
                "INVALID_TOOL",
                "a function name is 1 to 64 characters of a-z, A-Z, 0-9, _ and -",
            ));
        }
        if let Some(p) = &t.parameters {
            json_object(&format!("tools[{i}].parameters"), p)?;
        }
    }
    if let Some(c) = &r.tool_choice {
        let mode = Mode::try_from(c.mode).unwrap_or(Mode::Auto);
        if matches!(mode, Mode::Required | Mode::Function) && r.tools.is_empty() {
            return Err(bad(
                "tool_choice",
                "TOOL_CHOICE_WITHOUT_TOOLS",
                "tool_choice needs tools",
            ));
        }
        if mode == Mode::Function && !r.tools.iter().any(|t| t.name == c.function) {
            return Err(bad(
                "tool_choice",
                "UNKNOWN_TOOL",
                format!(
                    "tool_choice names `{}`, which is not among the tools",
                    gyre_api::clip(&c.function)
                ),
            ));
        }
    }
    if let Some(Format::JsonSchema(s)) = r.text_format.as_ref().and_then(|f| f.format.as_ref()) {
        if !valid_name(&s.name) {
            return Err(bad(
                "text.format.name",
                "INVALID_VALUE",
                "the schema's name is 1 to 64 characters of a-z, A-Z, 0-9, _ and -",
            ));
        }
        json_object("text.format.schema", &s.schema)?;
    }
    one_of("text.verbosity", &r.verbosity, &VERBOSITIES)?;
    one_of("reasoning.effort", &r.reasoning_effort, &EFFORTS)?;
    one_of("reasoning.summary", &r.reasoning_summary, &SUMMARIES)?;
    one_of("service_tier", &r.service_tier, &TIERS)?;
    one_of("truncation", &r.truncation, &TRUNCATIONS)?;
    if let Some(t) = r.temperature
        && !(t.is_finite() && (0.0..=2.0).contains(&t))
    {
        return Err(bad(
            "temperature",
            "OUT_OF_RANGE",
            format!("temperature must be in [0, 2], got {t}"),
        ));
    }
    if let Some(p) = r.top_p
        && !(p > 0.0 && p <= 1.0)
    {
        return Err(bad(
            "top_p",
            "OUT_OF_RANGE",
            format!("top_p must be in (0, 1], got {p}"),
        ));
    }
    if let Some(k) = r.top_logprobs
        && k > gyre_engine::MAX_TOP_LOGPROBS
    {
        return Err(bad(
            "top_logprobs",
            "OUT_OF_RANGE",
            format!(
                "top_logprobs must be in [0, {}], got {k}",
                gyre_engine::MAX_TOP_LOGPROBS
            ),
        ));
    }
    for (i, inc) in r.include.iter().enumerate() {
        if inc != INCLUDE_LOGPROBS {
            return Err(bad(
                format!("include[{i}]"),
                "UNSUPPORTED_INCLUDE",
                format!(
                    "include value {:?} is not supported; gyre supports {INCLUDE_LOGPROBS:?}",
                    gyre_api::clip(inc)
                ),
            ));
        }
    }
    if r.max_output_tokens == Some(0) {
        return Err(bad(
            "max_output_tokens",
            "OUT_OF_RANGE",
            "max_output_tokens must be greater than 0",
        ));
    }
    metadata(&r.metadata)?;
    if r.background == Some(true) && r.store == Some(false) {
        return Err(bad(
            "background",
            "BACKGROUND_WITHOUT_STORE",
            "background responses must be stored: background needs store true",
        ));
    }
    Ok(())
}

/// OpenAI's metadata limits.
pub fn metadata(m: &std::collections::HashMap<String, String>) -> Result<(), ServiceError> {
    if m.len() > MAX_METADATA_KEYS {
        return Err(bad(
            "metadata",
            "TOO_MANY_KEYS",
            format!(
                "metadata has at most {MAX_METADATA_KEYS} keys, got {}",
                m.len()
            ),
        ));
    }
    for (k, v) in m {
        if k.chars().count() > MAX_METADATA_KEY_CHARS {
            return Err(bad(
                "metadata",
                "KEY_TOO_LONG",
                format!("metadata keys are at most {MAX_METADATA_KEY_CHARS} characters"),
            ));
        }
        if v.chars().count() > MAX_METADATA_VALUE_CHARS {
            return Err(bad(
                "metadata",
                "VALUE_TOO_LONG",
                format!(
                    "metadata values are at most {MAX_METADATA_VALUE_CHARS} characters (key {:?})",
                    gyre_api::clip(k)
                ),
            ));
        }
    }
    Ok(())
}

/// One input item (also conversation items).
/// Each of `items` (the request's own, named `field[i]`) has an id that
/// none of `before` (what is already stored ahead of them: the
/// conversation's items, the previous responses') and none of the items
/// before it has: a list pages by item id, and OpenAI refuses duplicates
/// the same way. Items without an id are skipped (the server gives them
/// fresh ones).
pub fn unique_ids(field: &str, before: &[Item], items: &[Item]) -> Result<(), ServiceError> {
    let mut seen: std::collections::HashSet<&str> = before.iter().map(|i| i.id.as_str()).collect();
    for (i, it) in items.iter().enumerate() {
        if !it.id.is_empty() && !seen.insert(it.id.as_str()) {
            return Err(bad(
                format!("{field}[{i}].id"),
                "DUPLICATE_ITEM",
                format!(
                    "duplicate item found with id `{}`: remove duplicate items from your input and try again",
                    gyre_api::clip(&it.id)
                ),
            ));
        }
    }
    Ok(())
}

pub fn item(field: &str, item: &Item) -> Result<(), ServiceError> {
    match &item.item {
        None => Err(bad(field, "MISSING_ITEM", "an item needs a type")),
        Some(It::Message(m)) => {
            if !ROLES.contains(&m.role.as_str()) {
                return Err(bad(
                    format!("{field}.role"),
                    "INVALID_ROLE",
                    format!(
                        "unknown role {:?}; expected one of {}",
                        gyre_api::clip(&m.role),
                        ROLES.join(", ")
                    ),
                ));
            }
            use gyre_api::v1::content_part::Part;
            for (j, p) in m.content.iter().enumerate() {
                match &p.part {
                    None | Some(Part::ReasoningText(_)) => {
                        return Err(bad(
                            format!("{field}.content[{j}]"),
                            "INVALID_CONTENT",
                            "message content parts are input_text, output_text or refusal",
                        ));
                    }
                    _ => {}
                }
            }
            Ok(())
        }
        Some(It::FunctionCall(f)) => {
            if f.call_id.is_empty() {
                return Err(bad(
                    format!("{field}.call_id"),
                    "MISSING_CALL_ID",
                    "a function_call needs a call_id",
                ));
            }
            if f.name.is_empty() {
                return Err(bad(
                    format!("{field}.name"),
                    "MISSING_NAME",
                    "a function_call needs a name",
                ));
            }
            if !f.arguments.trim().is_empty() {
                serde_json::from_str::<serde_json::Value>(&f.arguments).map_err(|e| {
                    bad(
                        format!("{field}.arguments"),
                        "INVALID_JSON",
                        format!("arguments are not JSON: {}", gyre_api::clip(&e.to_string())),
                    )
                })?;
            }
            Ok(())
        }
        Some(It::FunctionCallOutput(o)) => {
            if o.call_id.is_empty() {
                return Err(bad(
                    format!("{field}.call_id"),
                    "MISSING_CALL_ID",
                    "a function_call_output needs a call_id",
                ));
            }
            Ok(())
        }
        Some(It::Reasoning(_)) => Ok(()),
    }
}
