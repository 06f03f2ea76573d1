//! Mistral: `[TOOL_CALLS]` then a JSON list of
//! `{"name": ..., "arguments": {...}}` (read as `json` reads calls), or the
//! newer `name[ARGS]{...}`, repeated after further `[TOOL_CALLS]`, whose
//! arguments stream as a bare value (`args::RawArgs`).

use super::CallPiece;
use super::args::{CallEnd, RawArgs, skip_ws};
use super::calls::{Calls, Flow};
use super::json::JsonCalls;

pub(super) const MARK: &str = "[TOOL_CALLS]";
const ARGS: &str = "[ARGS]";

enum State {
    /// Just after the first marker: a list (or object), or a name.
    Start,
    Json(JsonCalls),
    /// A call's name, up to `[ARGS]`.
    Name,
    Args(RawArgs),
    /// After a call: another marker, or the end.
    After,
}

/// The calls after the first marker.
pub(super) struct MistralCalls {
    buf: String,
    state: State,
}

impl MistralCalls {
    pub(super) fn reader() -> Box<dyn Calls> {
        Box::new(Self {
            buf: String::new(),
            state: State::Start,
        })
    }
}

impl Calls for MistralCalls {
    fn push(&mut self, text: &str, end: bool, out: &mut Vec<CallPiece>) -> Flow {
        self.buf.push_str(text);
        loop {
            match &mut self.state {
                State::Start => match skip_ws(&mut self.buf) {
                    None => return Flow::Calls,
                    Some('[' | '{') => self.state = State::Json(JsonCalls::new(false)),
                    Some(_) => self.state = State::Name,
                },
                State::Json(calls) => {
                    let text = std::mem::take(&mut self.buf);
                    return calls.push(&text, end, out);
                }
                State::Name => {
                    let Some(at) = self.buf.find(ARGS) else {
                        return Flow::Calls;
                    };
                    let name = self.buf[..at].trim().to_string();
                    if name.is_empty() {
                        return Flow::NotCalls;
                    }
                    self.buf.drain(..at + ARGS.len());
                    self.state = State::Args(RawArgs::new(name));
                }
                State::Args(args) => match args.push(&mut self.buf, end, MARK, out) {
                    CallEnd::More => return Flow::Calls,
                    CallEnd::Call => self.state = State::After,
                    CallEnd::NotCall => return Flow::NotCalls,
                },
                State::After => {
                    skip_ws(&mut self.buf);
                    if let Some(rest) = self.buf.strip_prefix(MARK) {
                        self.buf = rest.to_string();
                        self.state = State::Name;
                    } else if MARK.starts_with(self.buf.as_str()) {
                        return Flow::Calls;
                    } else {
                        return Flow::NotCalls;
                    }
                }
            }
        }
    }
}
