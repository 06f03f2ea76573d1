//! Tool calls: parsing them out of generated text, per model family, as it
//! streams; and the grammar that forces a call when `tool_choice` is
//! `required` or names a function.
//!
//! Formats:
//! - `hermes` (Hermes 2 Pro / 3, Qwen2.5, Qwen3, QwQ):
//!   `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number,
//!   text allowed before them.
//! - `llama3_json` (Llama 3.1 / 3.2 / 3.3): the whole output is
//!   `{"name": ..., "parameters": {...}}` (optionally after
//!   `<|python_tag|>`, several separated by `;`).
//! - `mistral`: `[TOOL_CALLS]` then a JSON list of
//!   `{"name": ..., "arguments": {...}}` (or the newer `name[ARGS]{...}`).
//! - `deepseek` (DeepSeek V3 / R1 distills / V3.1): after
//!   `<｜tool▁calls▁begin｜>`, calls `<｜tool▁call▁begin｜>name<｜tool▁sep｜>{...}
//!   <｜tool▁call▁end｜>` (V3.1) or `...function<｜tool▁sep｜>name` and the
//!   arguments in a ```json block (V3, R1).
//! - `json` (fallback): the whole output is one call object or a list of
//!   them, with `arguments` or `parameters`.

use rand::Rng;

use crate::compact::compact;
use serde_json::{Value, json};

/// A tool-call format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    Hermes,
    Llama3Json,
    Mistral,
    DeepSeek,
    Json,
}

impl ToolFormat {
    /// By name (`--tool-call-parser`).
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "hermes" | "qwen" => Some(Self::Hermes),
            "llama3_json" | "llama" => Some(Self::Llama3Json),
            "mistral" => Some(Self::Mistral),
            "deepseek" | "deepseek_v3" | "deepseek_v31" => Some(Self::DeepSeek),
            "json" => Some(Self::Json),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Hermes => "hermes",
            Self::Llama3Json => "llama3_json",
            Self::Mistral => "mistral",
            Self::DeepSeek => "deepseek",
            Self::Json => "json",
        }
    }

    /// The format a chat template asks its model to use.
    pub fn detect(template: &str) -> Self {
        if template.contains("<tool_call>") {
            Self::Hermes
        } else if template.contains("[TOOL_CALLS]") {
            Self::Mistral
        } else if template.contains(DS_CALLS_BEGIN) {
            Self::DeepSeek
        } else if template.contains("<|python_tag|>") || template.contains("\"parameters\"") {
            Self::Llama3Json
        } else {
            Self::Json
        }
    }

    /// A fresh call id: 9 alphanumerics for Mistral (its templates require
    /// exactly that), 24 otherwise.
    pub fn call_id(self) -> String {
        let len = if self == Self::Mistral { 9 } else { 24 };
        let mut rng = rand::rng();
        (0..len)
            .map(|_| {
                let c = rng.random_range(0..62u8);
                char::from(match c {
                    0..=9 => b'0' + c,
                    10..=35 => b'a' + c - 10,
                    _ => b'A' + c - 36,
                })
            })
            .collect()
    }
}

/// One parsed call: the function's name and its arguments as JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCall {
    pub name: String,
    pub arguments: String,
}

const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";
const MISTRAL_MARK: &str = "[TOOL_CALLS]";
const PYTHON_TAG: &str = "<|python_tag|>";
const DS_CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
const DS_CALLS_END: &str = "<｜tool▁calls▁end｜>";
const DS_CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
const DS_CALL_END: &str = "<｜tool▁call▁end｜>";
const DS_SEP: &str = "<｜tool▁sep｜>";

impl ToolFormat {
    /// Whether the format's markers are special tokens that must stay in
    /// the decoded text for the parser to see them.
    pub fn needs_special_tokens(self) -> bool {
        matches!(self, Self::Mistral | Self::DeepSeek)
    }
}

/// Splits streamed text into content and tool calls. Text that may be the
/// start of a call is held back until it is decided, so no markup reaches
/// the content.
pub struct ToolStream {
    format: ToolFormat,
    /// Undecided text.
    buf: String,
    /// Inside a call (Hermes) or in whole-output call mode (the others).
    in_calls: bool,
    /// Whether any content was already released (for the formats where a
    /// call must be the whole output).
    released: bool,
    /// Just after a call: whitespace there is not content.
    after_call: bool,
}

impl ToolStream {
    pub fn new(format: ToolFormat) -> Self {
        Self {
            format,
            buf: String::new(),
            in_calls: false,
            released: false,
            after_call: false,
        }
    }

    /// Takes new text; returns the content that is now certain and the
    /// calls completed by it.
    pub fn push(&mut self, text: &str) -> (String, Vec<ParsedCall>) {
        self.buf.push_str(text);
        match self.format {
            ToolFormat::Hermes => self.hermes(false),
            ToolFormat::Mistral => self.marker(MISTRAL_MARK),
            ToolFormat::DeepSeek => self.marker(DS_CALLS_BEGIN),
            ToolFormat::Llama3Json | ToolFormat::Json => self.whole(),
        }
    }

    /// The end of the output: everything left, parsed or as content.
    pub fn finish(&mut self) -> (String, Vec<ParsedCall>) {
        match self.format {
            ToolFormat::Hermes => self.hermes(true),
            _ if self.in_calls => {
                let text = std::mem::take(&mut self.buf);
                match parse_calls(self.format, &text) {
                    Some(calls) => (String::new(), calls),
                    None => (text, Vec::new()),
                }
            }
            _ => (std::mem::take(&mut self.buf), Vec::new()),
        }
    }

    fn hermes(&mut self, end: bool) -> (String, Vec<ParsedCall>) {
        let mut content = String::new();
        let mut calls = Vec::new();
        loop {
            if self.after_call && !self.in_calls {
                let ws = self.buf.len() - self.buf.trim_start().len();
                self.buf.drain(..ws);
                if self.buf.is_empty() {
                    break;
                }
                self.after_call = false;
            }
            if self.in_calls {
                let Some(close) = self.buf.find(HERMES_CLOSE) else {
                    if end {
                        // An unfinished call: keep it if it parses.
                        let body = std::mem::take(&mut self.buf);
                        match parse_call_object(body.trim()) {
                            Some(c) => calls.push(c),
                            None => {
                                content.push_str(HERMES_OPEN);
                                content.push_str(&body);
                            }
                        }
                        self.in_calls = false;
                    }
                    break;
                };
                let body: String = self.buf[..close].to_string();
                self.buf.drain(..close + HERMES_CLOSE.len());
                match parse_call_object(body.trim()) {
                    Some(c) => {
                        calls.push(c);
                        self.after_call = true;
                    }
                    None => {
                        content.push_str(HERMES_OPEN);
                        content.push_str(&body);
                        content.push_str(HERMES_CLOSE);
                    }
                }
                self.in_calls = false;
                continue;
            }
            if let Some(open) = self.buf.find(HERMES_OPEN) {
                content.push_str(&self.buf[..open]);
                self.buf.drain(..open + HERMES_OPEN.len());
                self.in_calls = true;
                continue;
            }
            // Hold back a tail that may begin the marker.
            let keep = if end {
                0
            } else {
                partial_suffix(&self.buf, HERMES_OPEN)
            };
            let cut = self.buf.len() - keep;
            content.push_str(&self.buf[..cut]);
            self.buf.drain(..cut);
            break;
        }
        (content, calls)
    }

    /// Mistral: content until the marker, calls after it (to the end).
    fn marker(&mut self, mark: &str) -> (String, Vec<ParsedCall>) {
        if self.in_calls {
            return (String::new(), Vec::new());
        }
        if let Some(at) = self.buf.find(mark) {
            let content = self.buf[..at].to_string();
            self.buf.drain(..at + mark.len());
            self.in_calls = true;
            return (content, Vec::new());
        }
        let keep = partial_suffix(&self.buf, mark);
        let cut = self.buf.len() - keep;
        let content: String = self.buf.drain(..cut).collect();
        (content, Vec::new())
    }

    /// Llama 3 / generic JSON: a call is the whole output, so an output
    /// that starts like one (`{`, `[`, `<|python_tag|>`) is held to the end.
    fn whole(&mut self) -> (String, Vec<ParsedCall>) {
        if self.in_calls {
            return (String::new(), Vec::new());
        }
        if self.released {
            return (std::mem::take(&mut self.buf), Vec::new());
        }
        let t = self.buf.trim_start();
        if t.is_empty() || (PYTHON_TAG.starts_with(t) && !t.is_empty()) {
            return (String::new(), Vec::new());
        }
        if t.starts_with('{') || t.starts_with('[') || t.starts_with(PYTHON_TAG) {
            self.in_calls = true;
            return (String::new(), Vec::new());
        }
        self.released = true;
        (std::mem::take(&mut self.buf), Vec::new())
    }
}

/// The length of the longest suffix of `text` that is a proper prefix of
/// `mark` (text that may still become the marker).
fn partial_suffix(text: &str, mark: &str) -> usize {
    (1..mark.len().min(text.len() + 1))
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && mark.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

/// `{"name": ..., "arguments" | "parameters": {...} or "..."}`.
fn call_from_value(v: &Value) -> Option<ParsedCall> {
    let o = v.as_object()?;
    let name = o.get("name")?.as_str()?.to_string();
    let args = o.get("arguments").or_else(|| o.get("parameters"));
    let arguments = match args {
        None | Some(Value::Null) => "{}".to_string(),
        Some(Value::String(s)) => {
            // Arguments sent as JSON text: keep it if it is JSON.
            serde_json::from_str::<Value>(s).ok()?;
            s.clone()
        }
        Some(v) => v.to_string(),
    };
    Some(ParsedCall { name, arguments })
}

fn parse_call_object(text: &str) -> Option<ParsedCall> {
    call_from_value(&serde_json::from_str(text).ok()?)
}

/// Calls of a whole-output format, or None when the text is not calls.
fn parse_calls(format: ToolFormat, text: &str) -> Option<Vec<ParsedCall>> {
    let t = text.trim();
    let t = t.strip_prefix(PYTHON_TAG).unwrap_or(t).trim();
    let from_json = |t: &str| -> Option<Vec<ParsedCall>> {
        match serde_json::from_str::<Value>(t).ok()? {
            Value::Array(items) if !items.is_empty() => items.iter().map(call_from_value).collect(),
            v => Some(vec![call_from_value(&v)?]),
        }
    };
    match format {
        ToolFormat::Mistral => {
            if t.starts_with('[') {
                return from_json(t);
            }
            // Newer format: name[ARGS]{...}, repeated after [TOOL_CALLS].
            t.split(MISTRAL_MARK)
                .map(|part| {
                    let (name, args) = part.trim().split_once("[ARGS]")?;
                    serde_json::from_str::<Value>(args.trim()).ok()?;
                    Some(ParsedCall {
                        name: name.trim().to_string(),
                        arguments: args.trim().to_string(),
                    })
                })
                .collect()
        }
        ToolFormat::DeepSeek => {
            let t = t.strip_suffix(DS_CALLS_END).unwrap_or(t).trim();
            t.split(DS_CALL_BEGIN)
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(|part| {
                    let part = part.strip_suffix(DS_CALL_END).unwrap_or(part).trim();
                    let (head, rest) = part.split_once(DS_SEP)?;
                    let (name, args) = if head.trim() == "function" && rest.contains("```") {
                        // V3 / R1: function<sep>name\n```json\n{...}\n```
                        let (name, block) = rest.split_once('\n')?;
                        let block = block.trim();
                        let block = block.strip_prefix("```json").unwrap_or(block);
                        let block = block.strip_suffix("```").unwrap_or(block);
                        (name.trim(), block.trim())
                    } else {
                        (head.trim(), rest.trim())
                    };
                    serde_json::from_str::<Value>(args).ok()?;
                    Some(ParsedCall {
                        name: name.to_string(),
                        arguments: args.to_string(),
                    })
                })
                .collect::<Option<Vec<_>>>()
                .filter(|v| !v.is_empty())
        }
        ToolFormat::Llama3Json => from_json(t).or_else(|| {
            // Several calls separated by ';'.
            t.split(';')
                .map(|p| parse_call_object(p.trim()))
                .collect::<Option<Vec<_>>>()
                .filter(|v| v.len() > 1)
        }),
        ToolFormat::Json | ToolFormat::Hermes => from_json(t),
    }
}

/// Parses a whole output at once: (content, calls).
pub fn parse_all(format: ToolFormat, text: &str) -> (String, Vec<ParsedCall>) {
    let mut s = ToolStream::new(format);
    let (mut content, mut calls) = s.push(text);
    let (c2, k2) = s.finish();
    content.push_str(&c2);
    calls.extend(k2);
    (content, calls)
}

/// A function the model may call: its name and parameters' JSON Schema.
pub struct FunctionSpec {
    pub name: String,
    pub parameters: Value,
}

impl FunctionSpec {
    /// The parameters' schema; any object when the tool gave none.
    fn parameters_schema(&self) -> Value {
        if self.parameters.is_object() {
            self.parameters.clone()
        } else {
            json!({"type": "object"})
        }
    }
}

/// A Lark grammar (llguidance dialect) whose every sentence is a valid call
/// in `format` to one of `functions` (at least one; several only when
/// `parallel`), with arguments valid against the function's schema.
pub fn forcing_grammar(format: ToolFormat, functions: &[FunctionSpec], parallel: bool) -> String {
    let key = if format == ToolFormat::Llama3Json {
        "parameters"
    } else {
        "arguments"
    };
    let one_of: Vec<Value> = functions
        .iter()
        .map(|f| {
            let params = f.parameters_schema();
            json!({
                "type": "object",
                "properties": {"name": {"const": f.name}, key: params},
                "required": ["name", key],
                "additionalProperties": false,
            })
        })
        .collect();
    let call = compact(json!({"anyOf": one_of}));
    let many = if parallel { "+" } else { "" };
    match format {
        ToolFormat::Hermes => format!(
            "start: (\"<tool_call>\\n\" call \"\\n</tool_call>\\n\"){many}\ncall: %json {call}\n"
        ),
        ToolFormat::Mistral => {
            let mut list = json!({"type": "array", "items": {"anyOf": one_of}, "minItems": 1});
            if !parallel && let Some(o) = list.as_object_mut() {
                o.insert("maxItems".into(), json!(1));
            }
            let list = compact(list);
            format!("start: \"[TOOL_CALLS]\" calls\ncalls: %json {list}\n")
        }
        ToolFormat::DeepSeek => {
            // V3.1's form: name<sep>{arguments}, one rule per function.
            let rules: Vec<String> = functions
                .iter()
                .enumerate()
                .map(|(i, f)| {
                    let params = compact(f.parameters_schema());
                    let name = serde_json::to_string(&format!("{DS_CALL_BEGIN}{}{DS_SEP}", f.name))
                        .unwrap_or_default();
                    let end = serde_json::to_string(DS_CALL_END).unwrap_or_default();
                    format!("call{i}: {name} args{i} {end}\nargs{i}: %json {params}\n")
                })
                .collect();
            let alts: Vec<String> = (0..functions.len()).map(|i| format!("call{i}")).collect();
            let begin = serde_json::to_string(DS_CALLS_BEGIN).unwrap_or_default();
            let end = serde_json::to_string(DS_CALLS_END).unwrap_or_default();
            format!(
                "start: {begin} call{many} {end}\ncall: {}\n{}",
                alts.join(" | "),
                rules.concat()
            )
        }
        ToolFormat::Llama3Json | ToolFormat::Json => {
            if parallel {
                format!("start: call (\"; \" call)*\ncall: %json {call}\n")
            } else {
                format!("start: call\ncall: %json {call}\n")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream_in_pieces(format: ToolFormat, text: &str, size: usize) -> (String, Vec<ParsedCall>) {
        let mut s = ToolStream::new(format);
        let (mut content, mut calls) = (String::new(), Vec::new());
        let chars: Vec<char> = text.chars().collect();
        for piece in chars.chunks(size) {
            let (c, k) = s.push(&piece.iter().collect::<String>());
            content.push_str(&c);
            calls.extend(k);
        }
        let (c, k) = s.finish();
        content.push_str(&c);
        calls.extend(k);
        (content, calls)
    }

    fn call(name: &str, arguments: &str) -> ParsedCall {
        ParsedCall {
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    #[test]
    fn hermes_calls_with_text_before_and_split_markers() {
        let text = "Let me check.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
        let want = (
            "Let me check.".to_string(),
            vec![
                call("get_weather", r#"{"city":"Paris"}"#),
                call("get_time", "{}"),
            ],
        );
        assert_eq!(parse_all(ToolFormat::Hermes, text), want);
        for size in [1, 2, 3, 7, 13] {
            assert_eq!(
                stream_in_pieces(ToolFormat::Hermes, text, size),
                want,
                "pieces of {size}"
            );
        }
    }

    #[test]
    fn hermes_plain_text_and_broken_calls_stay_content() {
        let plain = "a < b and <tool is not a call";
        assert_eq!(
            parse_all(ToolFormat::Hermes, plain),
            (plain.to_string(), vec![])
        );
        assert_eq!(
            stream_in_pieces(ToolFormat::Hermes, plain, 1),
            (plain.to_string(), vec![])
        );
        let broken = "x<tool_call>{not json}</tool_call>";
        assert_eq!(
            parse_all(ToolFormat::Hermes, broken),
            (broken.to_string(), vec![])
        );
        // Arguments given as JSON text are kept as that text.
        let s = r#"<tool_call>{"name": "f", "arguments": "{\"a\": 1}"}</tool_call>"#;
        assert_eq!(
            parse_all(ToolFormat::Hermes, s).1,
            vec![call("f", r#"{"a": 1}"#)]
        );
    }

    #[test]
    fn llama3_json_whole_output_calls() {
        let text = r#"{"name": "get_weather", "parameters": {"city": "Oslo"}}"#;
        let want = (
            String::new(),
            vec![call("get_weather", r#"{"city":"Oslo"}"#)],
        );
        assert_eq!(parse_all(ToolFormat::Llama3Json, text), want);
        assert_eq!(stream_in_pieces(ToolFormat::Llama3Json, text, 2), want);
        let tagged = format!("<|python_tag|>{text}; {text}");
        assert_eq!(parse_all(ToolFormat::Llama3Json, &tagged).1.len(), 2);
        let prose = "The weather is {fine}.";
        assert_eq!(
            stream_in_pieces(ToolFormat::Llama3Json, prose, 3),
            (prose.to_string(), vec![])
        );
        let not_a_call = "{this is not json";
        assert_eq!(
            parse_all(ToolFormat::Llama3Json, not_a_call),
            (not_a_call.to_string(), vec![])
        );
    }

    #[test]
    fn mistral_both_formats() {
        let old = r#"Sure.[TOOL_CALLS][{"name": "f", "arguments": {"x": 1}}, {"name": "g", "arguments": {}}]"#;
        let want = (
            "Sure.".to_string(),
            vec![call("f", r#"{"x":1}"#), call("g", "{}")],
        );
        assert_eq!(parse_all(ToolFormat::Mistral, old), want);
        assert_eq!(stream_in_pieces(ToolFormat::Mistral, old, 3), want);
        let new = r#"[TOOL_CALLS]f[ARGS]{"x": 1}[TOOL_CALLS]g[ARGS]{}"#;
        assert_eq!(
            parse_all(ToolFormat::Mistral, new).1,
            vec![call("f", r#"{"x": 1}"#), call("g", "{}")]
        );
    }

    #[test]
    fn deepseek_both_formats() {
        let v31 = "Let me see.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Oslo\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
        let want = (
            "Let me see.".to_string(),
            vec![
                call("get_weather", r#"{"city": "Oslo"}"#),
                call("get_time", "{}"),
            ],
        );
        assert_eq!(parse_all(ToolFormat::DeepSeek, v31), want);
        assert_eq!(stream_in_pieces(ToolFormat::DeepSeek, v31, 2), want);
        let v3 = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Oslo\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
        assert_eq!(
            parse_all(ToolFormat::DeepSeek, v3),
            (
                String::new(),
                vec![call("get_weather", r#"{"city": "Oslo"}"#)]
            )
        );
        assert_eq!(
            ToolFormat::detect("{{'<｜tool▁calls▁begin｜>'}}"),
            ToolFormat::DeepSeek
        );
    }

    #[test]
    fn detection_and_ids() {
        assert_eq!(
            ToolFormat::detect("{{ '<tool_call>' }}"),
            ToolFormat::Hermes
        );
        assert_eq!(ToolFormat::detect("[TOOL_CALLS] x"), ToolFormat::Mistral);
        assert_eq!(ToolFormat::detect("<|python_tag|>"), ToolFormat::Llama3Json);
        assert_eq!(ToolFormat::detect("plain"), ToolFormat::Json);
        let a = ToolFormat::Hermes.call_id();
        assert!(
            a.len() >= 9 && a.chars().all(|c| c.is_ascii_alphanumeric()),
            "{a}"
        );
        assert_ne!(a, ToolFormat::Hermes.call_id());
        assert_eq!(ToolFormat::Mistral.call_id().len(), 9);
    }

    #[test]
    fn forcing_grammars_name_every_function() {
        let fs = vec![
            FunctionSpec {
                name: "f".into(),
                parameters: json!({"type": "object", "properties": {"a": {"type": "integer"}}}),
            },
            FunctionSpec {
                name: "g".into(),
                parameters: Value::Null,
            },
        ];
        for format in [
            ToolFormat::Hermes,
            ToolFormat::Mistral,
            ToolFormat::Llama3Json,
            ToolFormat::Json,
        ] {
            for parallel in [false, true] {
                let g = forcing_grammar(format, &fs, parallel);
                assert!(g.starts_with("start:") && g.contains("%json"), "{g}");
                assert!(
                    g.contains(r#""const":"f""#) && g.contains(r#""const":"g""#),
                    "{g}"
                );
            }
        }
    }
}
