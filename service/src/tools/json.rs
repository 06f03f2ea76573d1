//! The generic fallback (`json`) and `llama3_json`: the whole output is one
//! call object, a list of them, or several separated by `;` (what the
//! forcing grammar writes for parallel calls), with `arguments` or
//! `parameters`, optionally after `<|python_tag|>`. An output that starts
//! like a call (`{`, `[`, `<|python_tag|>`) is read as calls; [`JsonCalls`]
//! also reads Mistral's list.

use super::args::{CallEnd, skip_ws};
use super::calls::{Calls, Flow, Guarded};
use super::llama3::PYTHON_TAG;
use super::object::ObjectCall;
use super::{CallPiece, Parsed, ToolParser};

enum State {
    /// Before the first call: `[` opens a list, `{` a call.
    Start,
    /// Before a call (after `[`, `,` or `;`).
    Next,
    Call(ObjectCall),
    /// After a call: a separator, the list's end, or the end.
    After,
    /// After the list: only whitespace may follow.
    Closed,
}

/// Call objects: one, a list, or (`semicolons`) several separated by `;`.
pub(super) struct JsonCalls {
    buf: String,
    semicolons: bool,
    list: bool,
    state: State,
}

impl JsonCalls {
    pub(super) fn new(semicolons: bool) -> Self {
        Self {
            buf: String::new(),
            semicolons,
            list: false,
            state: State::Start,
        }
    }
}

impl Calls for JsonCalls {
    fn push(&mut self, text: &str, end: bool, out: &mut Vec<CallPiece>) -> Flow {
        self.buf.push_str(text);
        loop {
            match &mut self.state {
                State::Start | State::Next => match skip_ws(&mut self.buf) {
                    None => return Flow::Calls,
                    Some('[') if matches!(self.state, State::Start) => {
                        self.buf.drain(..1);
                        self.list = true;
                        self.state = State::Next;
                    }
                    Some('{') => self.state = State::Call(ObjectCall::default()),
                    Some(_) => return Flow::NotCalls,
                },
                State::Call(call) => match call.push(&mut self.buf, end, out) {
                    CallEnd::More => return Flow::Calls,
                    CallEnd::Call => self.state = State::After,
                    CallEnd::NotCall => return Flow::NotCalls,
                },
                State::After => {
                    let next = match skip_ws(&mut self.buf) {
                        None => return Flow::Calls,
                        Some(',') if self.list => State::Next,
                        Some(']') if self.list => State::Closed,
                        Some(';') if self.semicolons && !self.list => State::Next,
                        Some(_) => return Flow::NotCalls,
                    };
                    self.buf.drain(..1);
                    self.state = next;
                }
                State::Closed => {
                    return match skip_ws(&mut self.buf) {
                        None => Flow::Calls,
                        Some(_) => Flow::NotCalls,
                    };
                }
            }
        }
    }
}

/// The streaming machine of the whole-output formats.
#[derive(Default)]
pub(super) struct WholeOutput {
    /// The output's start, while it is undecided.
    head: String,
    /// It started like a call.
    calls: Option<Guarded>,
    /// It did not: all of it is content.
    content: bool,
}

impl WholeOutput {
    fn step(&mut self, text: &str, end: bool) -> Parsed {
        if self.content {
            return (text.to_string(), Vec::new());
        }
        if let Some(calls) = &mut self.calls {
            return calls.push(text, end);
        }
        self.head.push_str(text);
        let t = self.head.trim_start();
        let at = self.head.len() - t.len();
        let from = if t.starts_with(PYTHON_TAG) {
            at + PYTHON_TAG.len()
        } else if t.starts_with(['{', '[']) {
            at
        } else if !end && PYTHON_TAG.starts_with(t) {
            return (String::new(), Vec::new());
        } else {
            self.content = true;
            return (std::mem::take(&mut self.head), Vec::new());
        };
        let mut head = std::mem::take(&mut self.head);
        let section = head.split_off(from);
        let mut calls = Guarded::new(Box::new(JsonCalls::new(true)), head);
        let out = calls.push(&section, end);
        self.calls = Some(calls);
        out
    }
}

impl ToolParser for WholeOutput {
    fn push(&mut self, text: &str) -> Parsed {
        self.step(text, false)
    }

    fn finish(&mut self) -> Parsed {
        self.step("", true)
    }
}
