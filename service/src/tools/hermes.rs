//! Hermes 2 Pro / 3, Qwen2.5, Qwen3, QwQ:
//! `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number,
//! text allowed before them. A call that does not parse stays content,
//! markup included.

use super::{Parsed, ToolParser, parse_call_object};
use crate::holdback;

pub(super) const OPEN: &str = "<tool_call>";
pub(super) const CLOSE: &str = "</tool_call>";

#[derive(Default)]
pub(super) struct Hermes {
    /// Undecided text.
    buf: String,
    /// Inside a `<tool_call>` section.
    in_call: bool,
    /// Just after a call: whitespace there is not content.
    after_call: bool,
}

impl Hermes {
    fn step(&mut self, end: bool) -> Parsed {
        let mut content = String::new();
        let mut calls = Vec::new();
        loop {
            if self.after_call && !self.in_call {
                let ws = self.buf.len() - self.buf.trim_start().len();
                self.buf.drain(..ws);
                if self.buf.is_empty() {
                    break;
                }
                self.after_call = false;
            }
            if self.in_call {
                let Some(close) = self.buf.find(CLOSE) else {
                    if end {
                        // An unfinished call: keep it if it parses.
                        let body = std::mem::take(&mut self.buf);
                        match parse_call_object(body.trim()) {
                            Some(c) => calls.push(c),
                            None => {
                                content.push_str(OPEN);
                                content.push_str(&body);
                            }
                        }
                        self.in_call = false;
                    }
                    break;
                };
                let body: String = self.buf[..close].to_string();
                self.buf.drain(..close + CLOSE.len());
                match parse_call_object(body.trim()) {
                    Some(c) => {
                        calls.push(c);
                        self.after_call = true;
                    }
                    None => {
                        content.push_str(OPEN);
                        content.push_str(&body);
                        content.push_str(CLOSE);
                    }
                }
                self.in_call = false;
                continue;
            }
            if let Some(open) = self.buf.find(OPEN) {
                content.push_str(&self.buf[..open]);
                self.buf.drain(..open + OPEN.len());
                self.in_call = true;
                continue;
            }
            if end {
                content.push_str(&std::mem::take(&mut self.buf));
            } else {
                content.push_str(&holdback::release(&mut self.buf, [OPEN]));
            }
            break;
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
        self.step(true)
    }
}
