//! Scanning a JSON value as it streams, to release a tool call's arguments
//! text as it is generated: knows where the value ends without parsing it.

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
