//! Hermes 2 Pro / 3, Qwen2.5, Qwen3, QwQ:
//! `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number,
//! text allowed before them.
//!
//! A call in that shape (name first, arguments an object or array) streams
//! as every JSON call object does (`object`): once its name and the
//! arguments' first bracket are in, the call begins, and the arguments' text
//! is released as it comes, up to the bracket that closes them (what
//! follows, to `</tool_call>`, is dropped). Its arguments
//! are then exactly the text the model wrote, even when the output ends
//! before they close. A call in any other shape is parsed whole at
//! `</tool_call>` (or at the end of the output), and stays content, markup
//! included, when it does not parse.

use super::args::{Scan, ValueScan};
use super::object::{Header, header};
use super::{CallPiece, Parsed, ToolParser, parse_call_object, whole};
use crate::holdback;

pub(super) const OPEN: &str = "<tool_call>";
pub(super) const CLOSE: &str = "</tool_call>";

#[derive(Default)]
enum State {
    /// Content, outside calls.
    #[default]
    Text,
    /// Inside `<tool_call>`, the call's shape not yet known.
    Header,
    /// Inside a call that is parsed whole at its end.
    Whole,
    /// Streaming a call's arguments.
    Args(ValueScan),
    /// After a streamed call's arguments: dropped until `</tool_call>`.
    AfterArgs,
}

#[derive(Default)]
pub(super) struct Hermes {
    /// Undecided text.
    buf: String,
    state: State,
    /// Just after a call: whitespace there is not content.
    after_call: bool,
}

impl Hermes {
    fn step(&mut self, end: bool) -> Parsed {
        let mut content = String::new();
        let mut calls = Vec::new();
        loop {
            match &mut self.state {
                State::Text => {
                    if self.after_call {
                        let ws = self.buf.len() - self.buf.trim_start().len();
                        self.buf.drain(..ws);
                        if self.buf.is_empty() {
                            break;
                        }
                        self.after_call = false;
                    }
                    if let Some(open) = self.buf.find(OPEN) {
                        content.push_str(&self.buf[..open]);
                        self.buf.drain(..open + OPEN.len());
                        self.state = State::Header;
                        continue;
                    }
                    if end {
                        content.push_str(&std::mem::take(&mut self.buf));
                    } else {
                        content.push_str(&holdback::release(&mut self.buf, [OPEN]));
                    }
                    break;
                }
                State::Header => {
                    let close = self.buf.find(CLOSE);
                    let body = &self.buf[..close.unwrap_or(self.buf.len())];
                    match header(body) {
                        Header::Stream { name, value_at } => {
                            calls.push(CallPiece::Begin(name));
                            self.buf.drain(..value_at);
                            self.state = State::Args(ValueScan::default());
                        }
                        Header::Undecided if close.is_none() && !end => break,
                        Header::Undecided | Header::Whole => self.state = State::Whole,
                    }
                }
                State::Whole => {
                    let Some(close) = self.buf.find(CLOSE) else {
                        if end {
                            // An unfinished call: keep it if it parses.
                            let body = std::mem::take(&mut self.buf);
                            match parse_call_object(body.trim()) {
                                Some(c) => calls.extend(whole(vec![c])),
                                None => {
                                    content.push_str(OPEN);
                                    content.push_str(&body);
                                }
                            }
                            self.state = State::Text;
                        }
                        break;
                    };
                    let body: String = self.buf[..close].to_string();
                    self.buf.drain(..close + CLOSE.len());
                    match parse_call_object(body.trim()) {
                        Some(c) => {
                            calls.extend(whole(vec![c]));
                            self.after_call = true;
                        }
                        None => {
                            content.push_str(OPEN);
                            content.push_str(&body);
                            content.push_str(CLOSE);
                        }
                    }
                    self.state = State::Text;
                }
                State::Args(scan) => {
                    let cut = match scan.push(&self.buf) {
                        Scan::More => {
                            let args = std::mem::take(&mut self.buf);
                            if !args.is_empty() {
                                calls.push(CallPiece::Args(args));
                            }
                            break;
                        }
                        Scan::Done(n) | Scan::Broken(n) => n,
                    };
                    let args: String = self.buf.drain(..cut).collect();
                    if !args.is_empty() {
                        calls.push(CallPiece::Args(args));
                    }
                    self.state = State::AfterArgs;
                }
                State::AfterArgs => {
                    if let Some(close) = self.buf.find(CLOSE) {
                        self.buf.drain(..close + CLOSE.len());
                        self.state = State::Text;
                        self.after_call = true;
                        continue;
                    }
                    if end {
                        self.buf.clear();
                    } else {
                        holdback::release(&mut self.buf, [CLOSE]);
                    }
                    break;
                }
            }
        }
        (content, calls)
    }
}

impl ToolParser for Hermes {
    fn push(&mut self, text: &str) -> Parsed {
        self.buf.push_str(text);
        self.step(false)
    }

    fn finish(&mut self) -> Parsed {
        let out = self.step(true);
        self.state = State::Text;
        out
    }
}
