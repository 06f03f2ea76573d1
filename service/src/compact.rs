//! The JSON layout of constrained outputs (structured outputs and forced
//! tool calls). Needs nothing but serde_json, so the engine-free parts of
//! the service (the tool-call parsers, fuzzed in `fuzz/`) can use it.

use serde_json::{Value, json};

/// Compact JSON output with ", " / ": " separators (no free whitespace, so a
/// finished structure cannot be padded forever), unless the schema chose
/// llguidance options itself.
pub(crate) fn compact(mut schema: Value) -> Value {
    if let Some(o) = schema.as_object_mut()
        && !o.contains_key("x-guidance")
    {
        o.insert(
            "x-guidance".into(),
            json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
        );
    }
    schema
}
