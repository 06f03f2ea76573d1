//! Tool calls: parsing them out of generated text, per model family, as it
//! streams (one file per format, each a [`ToolParser`]); and the grammar
//! that forces a call when `tool_choice` is `required` or names a function
//! (`grammar`).
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
//! - `json` (fallback): the whole output is one call object, a list of
//!   them, or several separated by `;`, with `arguments` or `parameters`.
//!
//! Every format streams a call's arguments as they are generated (see
//! [`ToolParser`]).

use rand::Rng;
use serde_json::Value;

mod args;
mod calls;
mod deepseek;
mod grammar;
mod hermes;
mod json;
mod llama3;
mod marked;
mod mistral;
mod object;
#[cfg(test)]
mod stream_tests;
#[cfg(test)]
mod tests;

pub use grammar::{FunctionSpec, forcing_grammar, parameters_are_an_object};

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
        } else if template.contains(deepseek::CALLS_BEGIN) {
            Self::DeepSeek
        } else if template.contains(llama3::PYTHON_TAG) || template.contains("\"parameters\"") {
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

impl ToolFormat {
    /// Whether the format's markers are special tokens that must stay in
    /// the decoded text for the parser to see them.
    pub fn needs_special_tokens(self) -> bool {
        matches!(self, Self::Mistral | Self::DeepSeek)
    }

    /// A fresh streaming parser for this format.
    pub fn parser(self) -> Box<dyn ToolParser> {
        match self {
            Self::Hermes => Box::new(hermes::Hermes::default()),
            Self::Mistral => Box::new(marked::Marked::new(
                mistral::MARK,
                mistral::MistralCalls::reader,
            )),
            Self::DeepSeek => Box::new(marked::Marked::new(
                deepseek::CALLS_BEGIN,
                deepseek::DeepSeekCalls::reader,
            )),
            Self::Llama3Json | Self::Json => Box::<json::WholeOutput>::default(),
        }
    }
}

/// A piece of a tool call, as a parser releases it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallPiece {
    /// A new call begins: the function's name.
    Begin(String),
    /// More of the arguments (JSON text) of the call begun last.
    Args(String),
}

/// Content and call pieces released by one step of a parser.
pub type Parsed = (String, Vec<CallPiece>);

/// Whole calls as pieces: each call's name, then all its arguments.
fn whole(calls: Vec<ParsedCall>) -> Vec<CallPiece> {
    calls
        .into_iter()
        .flat_map(|c| [CallPiece::Begin(c.name), CallPiece::Args(c.arguments)])
        .collect()
}

/// Calls rebuilt from their pieces (arguments joined).
pub fn join(pieces: &[CallPiece]) -> Vec<ParsedCall> {
    let mut calls: Vec<ParsedCall> = Vec::new();
    for p in pieces {
        match p {
            CallPiece::Begin(name) => calls.push(ParsedCall {
                name: name.clone(),
                arguments: String::new(),
            }),
            CallPiece::Args(a) => {
                if let Some(c) = calls.last_mut() {
                    c.arguments.push_str(a);
                }
            }
        }
    }
    calls
}

/// Splits one choice's streamed text into content and tool calls. Text that
/// may be the start of a call is held back (see `crate::holdback`) until it
/// is decided, so no markup reaches the content. Calls come as pieces, in
/// every format: a call begins (`Begin`, its name) as soon as its name and
/// the first bracket of its arguments are in, and the arguments' text then
/// follows as it is generated (`Args`, any number), up to the bracket that
/// closes them. A call's arguments are thus exactly the model's JSON text of
/// the arguments value, not re-serialized; a call the output breaks off
/// keeps the text it had. Calls in an unusual shape (arguments before the
/// name, arguments as a JSON string, a bare non-object value) are parsed
/// whole once complete and released as `Begin` and one `Args`.
pub trait ToolParser: Send {
    /// Takes new text; returns the content that is now certain and the
    /// call pieces it completes.
    fn push(&mut self, text: &str) -> Parsed;
    /// The end of the output: everything left, parsed or as content.
    fn finish(&mut self) -> Parsed;
}

/// A format's parser behind one type (what the fuzz target drives).
pub struct ToolStream(Box<dyn ToolParser>);

impl ToolStream {
    pub fn new(format: ToolFormat) -> Self {
        Self(format.parser())
    }

    pub fn push(&mut self, text: &str) -> Parsed {
        self.0.push(text)
    }

    pub fn finish(&mut self) -> Parsed {
        self.0.finish()
    }
}

/// Parses a whole output at once: (content, calls).
pub fn parse_all(format: ToolFormat, text: &str) -> (String, Vec<ParsedCall>) {
    let mut s = format.parser();
    let (mut content, mut calls) = s.push(text);
    let (c2, k2) = s.finish();
    content.push_str(&c2);
    calls.extend(k2);
    (content, join(&calls))
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
