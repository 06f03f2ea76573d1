//! DeepSeek V3 / R1 distills / V3.1: after `<｜tool▁calls▁begin｜>`, calls
//! `<｜tool▁call▁begin｜>name<｜tool▁sep｜>{...}<｜tool▁call▁end｜>` (V3.1) or
//! `...function<｜tool▁sep｜>name` and the arguments in a ```json block
//! (V3, R1).

use serde_json::Value;

use super::ParsedCall;

pub(super) const CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
pub(super) const CALLS_END: &str = "<｜tool▁calls▁end｜>";
pub(super) const CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
pub(super) const CALL_END: &str = "<｜tool▁call▁end｜>";
pub(super) const SEP: &str = "<｜tool▁sep｜>";

/// The calls after the calls-begin marker.
pub(super) fn parse(t: &str) -> Option<Vec<ParsedCall>> {
    let t = t.strip_suffix(CALLS_END).unwrap_or(t).trim();
    t.split(CALL_BEGIN)
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|part| {
            let part = part.strip_suffix(CALL_END).unwrap_or(part).trim();
            let (head, rest) = part.split_once(SEP)?;
            let (name, args) = if head.trim() == "function" && rest.contains("```") {
                // V3 / R1: function<sep>name\n```json\n{...}\n```
                let (name, block) = rest.split_once('\n')?;
                let block = block.trim();
                let block = block.strip_prefix("```json").unwrap_or(block);
                let block = block.strip_suffix("```").unwrap_or(block);
                (name.trim(), block.trim())
            } else {
                (head.trim(), rest.trim())
            };
            serde_json::from_str::<Value>(args).ok()?;
            Some(ParsedCall {
                name: name.to_string(),
                arguments: args.to_string(),
            })
        })
        .collect::<Option<Vec<_>>>()
        .filter(|v| !v.is_empty())
}
