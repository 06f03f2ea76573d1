//! Mistral: `[TOOL_CALLS]` then a JSON list of
//! `{"name": ..., "arguments": {...}}`, or the newer `name[ARGS]{...}`
//! (repeated after further `[TOOL_CALLS]`).

use serde_json::Value;

use super::{ParsedCall, calls_from_json};

pub(super) const MARK: &str = "[TOOL_CALLS]";

/// The calls after the first marker.
pub(super) fn parse(t: &str) -> Option<Vec<ParsedCall>> {
    if t.starts_with('[') {
        return calls_from_json(t);
    }
    t.split(MARK)
        .map(|part| {
            let (name, args) = part.trim().split_once("[ARGS]")?;
            serde_json::from_str::<Value>(args.trim()).ok()?;
            Some(ParsedCall {
                name: name.trim().to_string(),
                arguments: args.trim().to_string(),
            })
        })
        .collect()
}
