//! The calls section of an output, streamed: what follows Mistral's or
//! DeepSeek's marker, or a whole output that starts like a call
//! (`llama3_json`, `json`). Each format reads it with a [`Calls`] machine;
//! [`Guarded`] decides what is content.
//!
//! Until a call begins, the section's text is kept: when it turns out not to
//! be calls (or ends before one began), all of it is content, as if no
//! parser had looked. Once a call has begun it is committed: its pieces are
//! out, and text that does not go on with calls (trailing prose, a broken
//! next call) is dropped.

use super::{CallPiece, Parsed};

/// Whether the section goes on as calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Flow {
    Calls,
    /// From here on the text is not calls.
    NotCalls,
}

/// A format's reader of its calls section.
pub(super) trait Calls: Send {
    /// More text of the section (`end`: the output ended with it); adds the
    /// call pieces it completes to `out`.
    fn push(&mut self, text: &str, end: bool, out: &mut Vec<CallPiece>) -> Flow;
}

enum State {
    Calls,
    /// Not calls, and no call began: content.
    Content,
    /// Calls were made, and what follows is not calls: dropped.
    Dropped,
}

/// A calls section behind the content fallback.
pub(super) struct Guarded {
    calls: Box<dyn Calls>,
    /// The section's text (after `prefix`) while no call has begun.
    raw: String,
    made: bool,
    state: State,
}

impl Guarded {
    /// `prefix`: text before the section that is content when it is not
    /// calls (an output's leading whitespace and `<|python_tag|>`).
    pub(super) fn new(calls: Box<dyn Calls>, prefix: String) -> Self {
        Self {
            calls,
            raw: prefix,
            made: false,
            state: State::Calls,
        }
    }

    /// More of the section (`end`: the output ended): content and pieces.
    pub(super) fn push(&mut self, text: &str, end: bool) -> Parsed {
        match self.state {
            State::Content => return (text.to_string(), Vec::new()),
            State::Dropped => return (String::new(), Vec::new()),
            State::Calls => {}
        }
        if !self.made {
            self.raw.push_str(text);
        }
        let mut out = Vec::new();
        let flow = self.calls.push(text, end, &mut out);
        if !out.is_empty() && !self.made {
            self.made = true;
            self.raw = String::new();
        }
        if flow == Flow::Calls && (self.made || !end) {
            return (String::new(), out);
        }
        if self.made {
            self.state = State::Dropped;
            (String::new(), out)
        } else {
            self.state = State::Content;
            (std::mem::take(&mut self.raw), out)
        }
    }
}
