//! The formats whose calls follow one marker to the end of the output
//! (Mistral's `[TOOL_CALLS]`, DeepSeek's calls-begin token): content until
//! the marker, then everything after it is parsed at the end.

use super::{Parsed, ParsedCall, ToolParser, whole};
use crate::holdback;

pub(super) struct Marked {
    mark: &'static str,
    /// Parses what follows the marker; None: it is not calls.
    parse: fn(&str) -> Option<Vec<ParsedCall>>,
    buf: String,
    /// The marker was seen: the rest is calls.
    in_calls: bool,
}

impl Marked {
    pub(super) fn new(mark: &'static str, parse: fn(&str) -> Option<Vec<ParsedCall>>) -> Self {
        Self {
            mark,
            parse,
            buf: String::new(),
            in_calls: false,
        }
    }
}

impl ToolParser for Marked {
    fn push(&mut self, text: &str) -> Parsed {
        self.buf.push_str(text);
        if self.in_calls {
            return (String::new(), Vec::new());
        }
        if let Some(at) = self.buf.find(self.mark) {
            let content = self.buf[..at].to_string();
            self.buf.drain(..at + self.mark.len());
            self.in_calls = true;
            return (content, Vec::new());
        }
        (holdback::release(&mut self.buf, [self.mark]), Vec::new())
    }

    fn finish(&mut self) -> Parsed {
        let text = std::mem::take(&mut self.buf);
        if !self.in_calls {
            return (text, Vec::new());
        }
        let t = text.trim();
        let t = t
            .strip_prefix(super::llama3::PYTHON_TAG)
            .unwrap_or(t)
            .trim();
        match (self.parse)(t) {
            Some(calls) => (String::new(), whole(calls)),
            None => (text, Vec::new()),
        }
    }
}
