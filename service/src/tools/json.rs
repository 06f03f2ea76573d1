//! The generic fallback (`json`): the whole output is one call object or a
//! list of them, with `arguments` or `parameters`. Also the streaming
//! machine of every whole-output format (`llama3_json` too): an output that
//! starts like a call (`{`, `[`, `<|python_tag|>`) is held to the end.

use super::llama3::PYTHON_TAG;
use super::{Parsed, ParsedCall, ToolParser, calls_from_json, whole};

/// The calls of a whole output (already trimmed and without the tag).
pub(super) fn parse(t: &str) -> Option<Vec<ParsedCall>> {
    calls_from_json(t)
}

pub(super) struct WholeOutput {
    parse: fn(&str) -> Option<Vec<ParsedCall>>,
    buf: String,
    /// The output started like a call: everything waits for the end.
    in_calls: bool,
    /// Content was released: the output is not calls.
    released: bool,
}

impl WholeOutput {
    pub(super) fn new(parse: fn(&str) -> Option<Vec<ParsedCall>>) -> Self {
        Self {
            parse,
            buf: String::new(),
            in_calls: false,
            released: false,
        }
    }
}

impl ToolParser for WholeOutput {
    fn push(&mut self, text: &str) -> Parsed {
        self.buf.push_str(text);
        if self.in_calls {
            return (String::new(), Vec::new());
        }
        if self.released {
            return (std::mem::take(&mut self.buf), Vec::new());
        }
        let t = self.buf.trim_start();
        if t.is_empty() || PYTHON_TAG.starts_with(t) {
            return (String::new(), Vec::new());
        }
        if t.starts_with('{') || t.starts_with('[') || t.starts_with(PYTHON_TAG) {
            self.in_calls = true;
            return (String::new(), Vec::new());
        }
        self.released = true;
        (std::mem::take(&mut self.buf), Vec::new())
    }

    fn finish(&mut self) -> Parsed {
        let text = std::mem::take(&mut self.buf);
        if !self.in_calls {
            return (text, Vec::new());
        }
        let t = text.trim();
        let t = t.strip_prefix(PYTHON_TAG).unwrap_or(t).trim();
        match (self.parse)(t) {
            Some(calls) => (String::new(), whole(calls)),
            None => (text, Vec::new()),
        }
    }
}
