//! One call object, `{"name": ..., "arguments" | "parameters": ...}`, as it
//! streams (the call inside Hermes' `<tool_call>`, and every call of the
//! JSON formats: `llama3_json`, `json`, Mistral's list).
//!
//! An object in the usual shape (`name` first, then the arguments as an
//! object or array) begins its call as soon as the name and the arguments'
//! first bracket are in; the arguments' text is then released as it comes,
//! up to the bracket that closes them, so a call's arguments are exactly the
//! model's own text (not re-serialized). An object in any other shape
//! (arguments first, arguments as a JSON string, no arguments) is read to
//! its closing brace and parsed whole.

use super::args::{CallEnd, Scan, ValueScan};
use super::{CallPiece, parse_call_object, whole};

/// What the start of a call object says about its shape.
pub(super) enum Header {
    /// Too little text yet.
    Undecided,
    /// Not `{"name": "...", "arguments" | "parameters": {` or `[`.
    Whole,
    /// That shape: the name, and where the arguments value starts.
    Stream { name: String, value_at: usize },
}

/// Decides a call's shape from the start of its object.
pub(super) fn header(body: &str) -> Header {
    let mut at = 0;
    let ws = |at: &mut usize| {
        let t = &body[*at..];
        *at += t.len() - t.trim_start().len();
    };
    // Some(true): one of `alts` matched; Some(false): none can match;
    // None: too short to tell.
    let lit = |at: &mut usize, alts: &[&str]| {
        let t = &body[*at..];
        if let Some(l) = alts.iter().find(|l| t.starts_with(**l)) {
            *at += l.len();
            Some(true)
        } else if alts.iter().any(|l| l.starts_with(t)) {
            None
        } else {
            Some(false)
        }
    };
    for l in ["{", "\"name\"", ":", "\""] {
        ws(&mut at);
        match lit(&mut at, &[l]) {
            None => return Header::Undecided,
            Some(false) => return Header::Whole,
            Some(true) => {}
        }
    }
    // The name: a JSON string up to its first unescaped quote.
    let start = at - 1;
    let mut escaped = false;
    let Some(end) = body[at..].char_indices().find_map(|(i, c)| {
        let end = !escaped && c == '"';
        escaped = !escaped && c == '\\';
        end.then_some(at + i)
    }) else {
        return Header::Undecided;
    };
    let Ok(name) = serde_json::from_str::<String>(&body[start..=end]) else {
        return Header::Whole;
    };
    at = end + 1;
    for alts in [&[","][..], &["\"arguments\"", "\"parameters\""], &[":"]] {
        ws(&mut at);
        match lit(&mut at, alts) {
            None => return Header::Undecided,
            Some(false) => return Header::Whole,
            Some(true) => {}
        }
    }
    ws(&mut at);
    match body[at..].chars().next() {
        None => Header::Undecided,
        Some('{' | '[') => Header::Stream { name, value_at: at },
        Some(_) => Header::Whole,
    }
}

/// One call object's scan.
#[derive(Default)]
pub(super) enum ObjectCall {
    /// Its shape not yet known.
    #[default]
    Header,
    /// Read whole: `scanned` bytes of the buffer are scanned.
    Whole { scan: ValueScan, scanned: usize },
    /// Streaming the arguments.
    Args(ValueScan),
    /// After streamed arguments: the rest of the object, dropped.
    Rest(ValueScan),
}

impl ObjectCall {
    /// Takes text from `buf`, which starts with the object's `{`; releases
    /// call pieces into `out`. `end`: the output ended, so an unfinished
    /// call that began keeps what it had, and any other is not a call.
    pub(super) fn push(
        &mut self,
        buf: &mut String,
        end: bool,
        out: &mut Vec<CallPiece>,
    ) -> CallEnd {
        loop {
            match self {
                Self::Header => match header(buf) {
                    Header::Stream { name, value_at } => {
                        out.push(CallPiece::Begin(name));
                        buf.drain(..value_at);
                        *self = Self::Args(ValueScan::default());
                    }
                    Header::Undecided if !end => return CallEnd::More,
                    Header::Undecided | Header::Whole => {
                        *self = Self::Whole {
                            scan: ValueScan::default(),
                            scanned: 0,
                        }
                    }
                },
                Self::Whole { scan, scanned } => {
                    let n = match scan.push(&buf[*scanned..]) {
                        Scan::More if end => return CallEnd::NotCall,
                        Scan::More => {
                            *scanned = buf.len();
                            return CallEnd::More;
                        }
                        Scan::Broken(_) => return CallEnd::NotCall,
                        Scan::Done(n) => *scanned + n,
                    };
                    let Some(call) = parse_call_object(&buf[..n]) else {
                        return CallEnd::NotCall;
                    };
                    buf.drain(..n);
                    out.extend(whole(vec![call]));
                    return CallEnd::Call;
                }
                Self::Args(scan) => {
                    let (n, done) = match scan.push(buf) {
                        Scan::More => (buf.len(), false),
                        Scan::Done(n) => (n, true),
                        // Markup inside the arguments: the call ends there.
                        Scan::Broken(n) => {
                            let args: String = buf.drain(..n).collect();
                            if !args.is_empty() {
                                out.push(CallPiece::Args(args));
                            }
                            return CallEnd::Call;
                        }
                    };
                    let args: String = buf.drain(..n).collect();
                    if !args.is_empty() {
                        out.push(CallPiece::Args(args));
                    }
                    if done {
                        *self = Self::Rest(ValueScan::inside());
                    } else {
                        return if end { CallEnd::Call } else { CallEnd::More };
                    }
                }
                Self::Rest(scan) => {
                    return match scan.push(buf) {
                        Scan::More => {
                            buf.clear();
                            if end { CallEnd::Call } else { CallEnd::More }
                        }
                        Scan::Done(n) | Scan::Broken(n) => {
                            buf.drain(..n);
                            CallEnd::Call
                        }
                    };
                }
            }
        }
    }
}
