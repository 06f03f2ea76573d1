//! DeepSeek V3 / R1 distills / V3.1: after `<｜tool▁calls▁begin｜>`, calls
//! `<｜tool▁call▁begin｜>name<｜tool▁sep｜>{...}<｜tool▁call▁end｜>` (V3.1) or
//! `...function<｜tool▁sep｜>name` and the arguments in a ```json block
//! (V3, R1), then `<｜tool▁calls▁end｜>`. The arguments stream as a bare
//! value (`args::RawArgs`); what follows them, to the call's end marker,
//! is dropped.

use super::CallPiece;
use super::args::{CallEnd, RawArgs, skip_ws};
use super::calls::{Calls, Flow};
use crate::holdback;

pub(super) const CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
pub(super) const CALLS_END: &str = "<｜tool▁calls▁end｜>";
pub(super) const CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
pub(super) const CALL_END: &str = "<｜tool▁call▁end｜>";
pub(super) const SEP: &str = "<｜tool▁sep｜>";
const FENCE: &str = "```json";

enum State {
    /// Before a call, or the section's end.
    Between,
    /// A call's head (V3.1: the name; V3: `function`), up to the separator.
    Head,
    /// After `function<sep>`: V3's name line, or V3.1's arguments.
    Function,
    /// V3's name, up to the end of its line.
    Name,
    /// V3's code fence before the arguments.
    Fence(String),
    /// The arguments; the marker that ends them when they are not streamed.
    Args(RawArgs, &'static str),
    /// After the arguments: dropped to the call's end.
    Tail,
    /// After the section: dropped.
    Done,
}

/// The calls after the calls-begin marker.
pub(super) struct DeepSeekCalls {
    buf: String,
    state: State,
}

impl DeepSeekCalls {
    pub(super) fn reader() -> Box<dyn Calls> {
        Box::new(Self {
            buf: String::new(),
            state: State::Between,
        })
    }
}

impl Calls for DeepSeekCalls {
    fn push(&mut self, text: &str, end: bool, out: &mut Vec<CallPiece>) -> Flow {
        self.buf.push_str(text);
        loop {
            match &mut self.state {
                State::Between => {
                    skip_ws(&mut self.buf);
                    if let Some(rest) = self.buf.strip_prefix(CALL_BEGIN) {
                        self.buf = rest.to_string();
                        self.state = State::Head;
                    } else if self.buf.starts_with(CALLS_END) {
                        self.state = State::Done;
                    } else if CALL_BEGIN.starts_with(self.buf.as_str())
                        || CALLS_END.starts_with(self.buf.as_str())
                    {
                        return Flow::Calls;
                    } else {
                        return Flow::NotCalls;
                    }
                }
                State::Head => {
                    let Some(at) = self.buf.find(SEP) else {
                        return Flow::Calls;
                    };
                    let head = self.buf[..at].trim().to_string();
                    self.buf.drain(..at + SEP.len());
                    self.state = match head.as_str() {
                        "" => return Flow::NotCalls,
                        "function" => State::Function,
                        _ => State::Args(RawArgs::new(head), CALL_END),
                    };
                }
                State::Function => {
                    self.state = match self.buf.trim_start().chars().next() {
                        None if !end => return Flow::Calls,
                        Some('{' | '[') => State::Args(RawArgs::new("function".into()), CALL_END),
                        _ => State::Name,
                    };
                }
                State::Name => {
                    let Some(at) = self.buf.find('\n') else {
                        return if end { Flow::NotCalls } else { Flow::Calls };
                    };
                    let name = self.buf[..at].trim().to_string();
                    self.buf.drain(..=at);
                    if name.is_empty() {
                        return Flow::NotCalls;
                    }
                    self.state = State::Fence(name);
                }
                State::Fence(name) => {
                    skip_ws(&mut self.buf);
                    if FENCE.starts_with(self.buf.as_str()) && !end {
                        return Flow::Calls;
                    }
                    if self.buf.starts_with(FENCE) {
                        self.buf.drain(..FENCE.len());
                    }
                    self.state = State::Args(RawArgs::new(std::mem::take(name)), "```");
                }
                State::Args(args, until) => match args.push(&mut self.buf, end, until, out) {
                    CallEnd::More => return Flow::Calls,
                    CallEnd::Call => self.state = State::Tail,
                    CallEnd::NotCall => return Flow::NotCalls,
                },
                State::Tail => {
                    if let Some(at) = self.buf.find(CALL_END) {
                        self.buf.drain(..at + CALL_END.len());
                        self.state = State::Between;
                    } else {
                        holdback::release(&mut self.buf, [CALL_END]);
                        return Flow::Calls;
                    }
                }
                State::Done => {
                    self.buf.clear();
                    return Flow::Calls;
                }
            }
        }
    }
}
