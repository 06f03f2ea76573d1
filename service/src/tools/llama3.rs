//! Llama 3.1 / 3.2 / 3.3 (`llama3_json`): the whole output is
//! `{"name": ..., "parameters": {...}}`, optionally after `<|python_tag|>`,
//! several separated by `;`.

use super::{ParsedCall, calls_from_json, parse_call_object};

pub(super) const PYTHON_TAG: &str = "<|python_tag|>";

/// The calls of a whole output (already trimmed and without the tag).
pub(super) fn parse(t: &str) -> Option<Vec<ParsedCall>> {
    calls_from_json(t).or_else(|| {
        t.split(';')
            .map(|p| parse_call_object(p.trim()))
            .collect::<Option<Vec<_>>>()
            .filter(|v| v.len() > 1)
    })
}
