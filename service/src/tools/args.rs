//! Scanning a JSON value as it streams, to release a tool call's arguments
//! text as it is generated: knows where the value ends without parsing it
//! (`ValueScan`); and the arguments of the formats that write them as a
//! bare value after the function's name (`RawArgs`: Mistral's
//! `name[ARGS]{...}`, DeepSeek's `name<sep>{...}`).

use super::CallPiece;

/// Where a scan stands after some text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Scan {
    /// The value goes on; all the text given so far belongs to it.
    More,
    /// The value ended after this many bytes of the text given last.
    Done(usize),
    /// Text that cannot continue a JSON value (a `<` outside strings: the
    /// format's markup) begins at this byte of the text given last.
    Broken(usize),
}

/// Nesting of one JSON object or array value, from its opening bracket.
#[derive(Debug, Default)]
pub(super) struct ValueScan {
    depth: u32,
    in_string: bool,
    escaped: bool,
}

impl ValueScan {
    /// A scan already inside one object (to find where it closes).
    pub(super) fn inside() -> Self {
        Self {
            depth: 1,
            ..Self::default()
        }
    }

    /// Scans more of the value (starting with its opening bracket).
    pub(super) fn push(&mut self, text: &str) -> Scan {
        for (i, c) in text.char_indices() {
            if self.in_string {
                match (self.escaped, c) {
                    (true, _) => self.escaped = false,
                    (false, '\\') => self.escaped = true,
                    (false, '"') => self.in_string = false,
                    _ => {}
                }
                continue;
            }
            match c {
                '"' => self.in_string = true,
                '{' | '[' => self.depth += 1,
                '}' | ']' => {
                    self.depth = self.depth.saturating_sub(1);
                    if self.depth == 0 {
                        return Scan::Done(i + 1);
                    }
                }
                '<' => return Scan::Broken(i),
                _ => {}
            }
        }
        Scan::More
    }
}

/// Where a call's scan stands after some text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CallEnd {
    /// The call goes on.
    More,
    /// The call ended; what follows it is left in the buffer.
    Call,
    /// The text is not a call (nothing of it was released).
    NotCall,
}

/// Drops the whitespace `buf` starts with; returns its first other char.
pub(super) fn skip_ws(buf: &mut String) -> Option<char> {
    let ws = buf.len() - buf.trim_start().len();
    buf.drain(..ws);
    buf.chars().next()
}

/// A call's arguments written as a bare JSON value after its name. An object
/// or array streams (the call begins at its opening bracket, and its text is
/// released as it comes, up to the closing one); any other value is read
/// whole up to the format's next marker and must be JSON.
pub(super) struct RawArgs {
    name: String,
    state: Raw,
}

enum Raw {
    /// Before the value (whitespace is skipped).
    Start,
    Stream(ValueScan),
    Whole,
}

impl RawArgs {
    pub(super) fn new(name: String) -> Self {
        Self {
            name,
            state: Raw::Start,
        }
    }

    /// Takes text from `buf` (which starts where the value may start);
    /// `until`: the marker after a value that is not streamed; `end`: the
    /// output ended.
    pub(super) fn push(
        &mut self,
        buf: &mut String,
        end: bool,
        until: &str,
        out: &mut Vec<CallPiece>,
    ) -> CallEnd {
        loop {
            match &mut self.state {
                Raw::Start => match skip_ws(buf) {
                    None => return if end { CallEnd::NotCall } else { CallEnd::More },
                    Some('{' | '[') => {
                        out.push(CallPiece::Begin(std::mem::take(&mut self.name)));
                        self.state = Raw::Stream(ValueScan::default());
                    }
                    Some(_) => self.state = Raw::Whole,
                },
                Raw::Stream(scan) => {
                    let (n, done) = match scan.push(buf) {
                        Scan::More => (buf.len(), false),
                        Scan::Done(n) | Scan::Broken(n) => (n, true),
                    };
                    let args: String = buf.drain(..n).collect();
                    if !args.is_empty() {
                        out.push(CallPiece::Args(args));
                    }
                    return if done || end {
                        CallEnd::Call
                    } else {
                        CallEnd::More
                    };
                }
                Raw::Whole => {
                    let at = match buf.find(until) {
                        Some(at) => at,
                        None if end => buf.len(),
                        None => return CallEnd::More,
                    };
                    let value = buf[..at].trim();
                    if serde_json::from_str::<serde_json::Value>(value).is_err() {
                        return CallEnd::NotCall;
                    }
                    out.push(CallPiece::Begin(std::mem::take(&mut self.name)));
                    out.push(CallPiece::Args(value.to_string()));
                    buf.drain(..at);
                    return CallEnd::Call;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_end_through_strings_escapes_and_nesting() {
        let v = r#"{"a": "}\"{", "b": [1, {"c": "]"}]} trailing"#;
        let end = v.find(" trailing").unwrap_or(0);
        assert_eq!(ValueScan::default().push(v), Scan::Done(end));
        // The same in pieces of one character.
        let mut s = ValueScan::default();
        let mut at = 0;
        for (i, c) in v.char_indices() {
            match s.push(&c.to_string()) {
                Scan::More => {}
                Scan::Done(n) => {
                    at = i + n;
                    break;
                }
                Scan::Broken(_) => panic!("broken at {i}"),
            }
        }
        assert_eq!(at, end);
        assert_eq!(ValueScan::default().push(r#"{"a": 1"#), Scan::More);
        assert_eq!(ValueScan::default().push(r#"{"a": "<"}"#), Scan::Done(10));
        assert_eq!(
            ValueScan::default().push("{\"a\": 1</tool_call>"),
            Scan::Broken(7)
        );
    }
}
