//! The formats whose calls follow a marker (Mistral's `[TOOL_CALLS]`,
//! DeepSeek's calls-begin token): content until the marker, then the
//! format's calls, streamed (see `calls`). When what follows the marker is
//! not calls, it is content (without the marker).

use super::calls::{Calls, Guarded};
use super::{Parsed, ToolParser};
use crate::holdback;

pub(super) struct Marked {
    mark: &'static str,
    /// A fresh reader of the calls after the marker.
    reader: fn() -> Box<dyn Calls>,
    /// Text before the marker, undecided.
    buf: String,
    /// The marker was seen: the rest is the calls section.
    calls: Option<Guarded>,
}

impl Marked {
    pub(super) fn new(mark: &'static str, reader: fn() -> Box<dyn Calls>) -> Self {
        Self {
            mark,
            reader,
            buf: String::new(),
            calls: None,
        }
    }
}

impl ToolParser for Marked {
    fn push(&mut self, text: &str) -> Parsed {
        if let Some(calls) = &mut self.calls {
            return calls.push(text, false);
        }
        self.buf.push_str(text);
        let Some(at) = self.buf.find(self.mark) else {
            return (holdback::release(&mut self.buf, [self.mark]), Vec::new());
        };
        let rest = self.buf.split_off(at + self.mark.len());
        self.buf.truncate(at);
        let mut content = std::mem::take(&mut self.buf);
        let mut calls = Guarded::new((self.reader)(), String::new());
        let (c, pieces) = calls.push(&rest, false);
        content.push_str(&c);
        self.calls = Some(calls);
        (content, pieces)
    }

    fn finish(&mut self) -> Parsed {
        match &mut self.calls {
            Some(calls) => calls.push("", true),
            None => (std::mem::take(&mut self.buf), Vec::new()),
        }
    }
}
