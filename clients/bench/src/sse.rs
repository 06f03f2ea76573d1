//! Server-Sent Events of OpenAI streaming responses: framing and the parts
//! of a `text_completion` / `chat.completion.chunk` the benchmark needs.
//!
//! [`SseParser`] takes body bytes as they arrive and yields the `data` of
//! each complete event; [`parse_data`] reads one event's data.

use serde_json::Value;

/// Incremental SSE framing: events end with a blank line (`\n\n`, `\r\n\r\n`
/// or `\r\r`); `data:` lines of one event are joined with `\n`; comments
/// (`: keep-alive`) and other fields are skipped.
#[derive(Debug, Default)]
pub struct SseParser {
    buf: String,
    data: Vec<String>,
    /// Bytes of an incomplete UTF-8 sequence at the end of the last push.
    pending: Vec<u8>,
}

impl SseParser {
    /// Feeds bytes; returns the data of every event completed by them.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        self.pending.extend_from_slice(bytes);
        let valid = match std::str::from_utf8(&self.pending) {
            Ok(s) => s.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => self.pending.len(), // invalid: replaced, never waits
        };
        let rest = self.pending.split_off(valid);
        self.buf
            .push_str(&String::from_utf8_lossy(&std::mem::replace(
                &mut self.pending,
                rest,
            )));
        let mut events = Vec::new();
        while let Some(end) = self.buf.find(['\n', '\r']) {
            // A lone '\r' at the end may be the first half of "\r\n".
            if self.buf[end..].starts_with('\r') && end + 1 == self.buf.len() {
                break;
            }
            let line = self.buf[..end].to_owned();
            let skip = if self.buf[end..].starts_with("\r\n") {
                2
            } else {
                1
            };
            self.buf.drain(..end + skip);
            self.line(&line, &mut events);
        }
        events
    }

    fn line(&mut self, line: &str, events: &mut Vec<String>) {
        if line.is_empty() {
            if !self.data.is_empty() {
                events.push(self.data.join("\n"));
                self.data.clear();
            }
            return;
        }
        if let Some(value) = line.strip_prefix("data")
            && (value.is_empty() || value.starts_with(':'))
        {
            let value = value.strip_prefix(':').unwrap_or(value);
            self.data
                .push(value.strip_prefix(' ').unwrap_or(value).to_owned());
        }
    }
}

/// What one event's data says.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Chunk {
    /// `data: [DONE]`.
    pub done: bool,
    /// Generated text of the first choice (completions `text` or chat
    /// `delta.content`); empty when none.
    pub text: String,
    /// `finish_reason` of the first choice, when set.
    pub finish_reason: Option<String>,
    /// `usage` as (prompt_tokens, completion_tokens, cached_tokens).
    pub usage: Option<(u32, u32, u32)>,
    /// `error.message` of an error event.
    pub error: Option<String>,
}

/// Reads one event's data (a JSON chunk or `[DONE]`).
pub fn parse_data(data: &str) -> Chunk {
    if data.trim() == "[DONE]" {
        return Chunk {
            done: true,
            ..Chunk::default()
        };
    }
    let value: Value = match serde_json::from_str(data) {
        Ok(v) => v,
        Err(e) => {
            return Chunk {
                error: Some(format!("unparsable SSE data ({e}): {data:.200}")),
                ..Chunk::default()
            };
        }
    };
    if let Some(error) = value.get("error") {
        let message = error.get("message").and_then(Value::as_str);
        return Chunk {
            error: Some(message.map_or_else(|| error.to_string(), str::to_owned)),
            ..Chunk::default()
        };
    }
    let choice = value.pointer("/choices/0");
    let text = choice
        .and_then(|c| c.get("text").or_else(|| c.pointer("/delta/content")))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let finish_reason = choice
        .and_then(|c| c.get("finish_reason"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    let count = |v: &Value, p: &str| {
        v.pointer(p)
            .and_then(Value::as_u64)
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(0)
    };
    let usage = value.get("usage").filter(|u| u.is_object()).map(|u| {
        (
            count(u, "/prompt_tokens"),
            count(u, "/completion_tokens"),
            count(u, "/prompt_tokens_details/cached_tokens"),
        )
    });
    Chunk {
        done: false,
        text,
        finish_reason,
        usage,
        error: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_events_across_pushes() {
        let mut p = SseParser::default();
        assert!(p.push(b"data: {\"a\"").is_empty());
        assert_eq!(
            p.push(b":1}\n\n: keep-alive\n\ndata: x\r"),
            vec!["{\"a\":1}"]
        );
        assert_eq!(p.push(b"\n\r\ndata:y\ndata: z\n\n"), vec!["x", "y\nz"]);
        assert_eq!(p.push(b"event: e\ndata: [DONE]\n\n"), vec!["[DONE]"]);
        // A multi-byte character split between pushes.
        let bytes = "data: é\n\n".as_bytes();
        assert!(p.push(&bytes[..7]).is_empty());
        assert_eq!(p.push(&bytes[7..]), vec!["é"]);
    }

    #[test]
    fn reads_completion_and_chat_chunks() {
        let c = parse_data(
            r#"{"choices":[{"index":0,"text":"Hi","finish_reason":null}],"usage":null}"#,
        );
        assert_eq!((c.text.as_str(), c.usage, c.done), ("Hi", None, false));
        let c = parse_data(r#"{"choices":[{"delta":{"content":"yo"},"finish_reason":"length"}]}"#);
        assert_eq!(c.text, "yo");
        assert_eq!(c.finish_reason.as_deref(), Some("length"));
        let c = parse_data(
            r#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":7,
                "prompt_tokens_details":{"cached_tokens":3}}}"#,
        );
        assert_eq!(c.usage, Some((5, 7, 3)));
        assert!(parse_data("[DONE]").done);
        let e = parse_data(r#"{"error":{"message":"queue full","type":"rate_limit_error"}}"#);
        assert_eq!(e.error.as_deref(), Some("queue full"));
        assert!(parse_data("not json").error.is_some());
    }
}
