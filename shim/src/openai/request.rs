//! Request bodies of `/v1/chat/completions` and `/v1/completions`.
//!
//! Each body is read in parts from one JSON object (see [`crate::extract`]):
//! [`CommonParams`] for what both endpoints share, then [`ChatParams`] or
//! [`CompletionParams`]. Unknown keys are ignored; keys gyre cannot honour yet
//! are kept so that [`crate::convert`] can refuse them instead of silently
//! answering something else. Integer fields take whole-number floats too
//! (see [`super::int`]).

use serde::Deserialize;
use serde::de::{Deserializer, Error as _};
use serde_json::Value;

use super::int;

/// Fields shared by both generation endpoints.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct CommonParams {
    /// Model id (required: checked before parsing).
    pub model: String,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    /// Number of choices (1 to 128).
    #[serde(default, deserialize_with = "int::opt")]
    pub n: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// Extension (vLLM): keep the top k tokens; 0 or -1 mean off.
    #[serde(default, deserialize_with = "int::opt")]
    pub top_k: Option<i64>,
    /// Seeds are i64 in OpenAI's API; they are reinterpreted as u64.
    #[serde(default, deserialize_with = "int::opt")]
    pub seed: Option<i64>,
    #[serde(default, deserialize_with = "int::opt")]
    pub max_tokens: Option<u32>,
    /// Chat's newer name for `max_tokens`; wins when both are set.
    #[serde(default, deserialize_with = "int::opt")]
    pub max_completion_tokens: Option<u32>,
    pub stop: Option<Stop>,
    /// Extension (vLLM): token ids that also end generation.
    pub stop_token_ids: Option<Vec<u32>>,
    /// Extension (vLLM): do not stop at EOS.
    pub ignore_eos: Option<bool>,
    /// Extension (vLLM): leave special tokens out of the text (default true).
    pub skip_special_tokens: Option<bool>,
    /// OpenAI: in [-2, 2].
    pub presence_penalty: Option<f32>,
    /// OpenAI: in [-2, 2].
    pub frequency_penalty: Option<f32>,
    /// OpenAI: token id (as a string) -> bias in [-100, 100].
    pub logit_bias: Option<std::collections::HashMap<String, f32>>,
    /// Extension (vLLM): relative probability floor.
    pub min_p: Option<f32>,
    /// Extension (vLLM / transformers): repetition penalty, 1 is off.
    pub repetition_penalty: Option<f32>,
    /// Extension (vLLM): no EOS / stop token before this many tokens.
    #[serde(default, deserialize_with = "int::opt")]
    pub min_tokens: Option<u32>,
    /// Extension (vLLM): keep the matched stop string in the output.
    pub include_stop_str_in_output: Option<bool>,
    /// Extension (gyre): lower max_tokens to what fits instead of a 400.
    pub clamp_max_tokens: Option<bool>,
    /// Extension (vLLM): scheduling priority, *lower* runs first (vLLM's
    /// convention; gyre.v1 uses higher-first, so the shim negates it).
    #[serde(default, deserialize_with = "int::opt")]
    pub priority: Option<i32>,
    /// Extension (vLLM): prefix-cache salt isolating this request's cache.
    pub cache_salt: Option<String>,
    /// Extension (OpenVINO Model Server): speculative decoding (prompt
    /// lookup, or the draft model when the model has one), tokens proposed
    /// per step (0 turns it off).
    #[serde(default, deserialize_with = "int::opt")]
    pub num_assistant_tokens: Option<u32>,
    /// Extension (OpenVINO Model Server): longest n-gram prompt lookup matches.
    #[serde(default, deserialize_with = "int::opt")]
    pub max_ngram_size: Option<u32>,
    /// Extension (OpenVINO Model Server): with a draft model, the draft
    /// proposes while its confidence is at least this (instead of
    /// `num_assistant_tokens`).
    pub assistant_confidence_threshold: Option<f32>,
    /// Extension (NVIDIA Dynamo): the `nvext` object.
    pub nvext: Option<NvExt>,
    /// Extension (vLLM): constrained decoding, `{"json" | "regex" |
    /// "choice" | "grammar": ...}`.
    pub structured_outputs: Option<StructuredOutputs>,
    /// Extension (vLLM's older names for the same).
    pub guided_json: Option<Value>,
    pub guided_regex: Option<String>,
    pub guided_choice: Option<Vec<String>>,
    pub guided_grammar: Option<String>,
}

/// vLLM's `structured_outputs` object (one of its fields).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StructuredOutputs {
    pub json: Option<Value>,
    pub regex: Option<String>,
    pub choice: Option<Vec<String>>,
    pub grammar: Option<String>,
    pub json_object: Option<bool>,
}

/// `nvext`: NVIDIA Dynamo's request extensions that gyre honours. A field
/// also given at the top level must have the same value (else 400).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct NvExt {
    pub ignore_eos: Option<bool>,
    #[serde(default, deserialize_with = "int::opt")]
    pub top_k: Option<i64>,
    pub repetition_penalty: Option<f32>,
    /// True: greedy (temperature 0). Dynamo spells it `greed_sampling`.
    #[serde(alias = "greed_sampling")]
    pub greedy_sampling: Option<bool>,
    /// Chat: the last message's content is the prompt, tokenized as is,
    /// without the chat template.
    pub use_raw_prompt: Option<bool>,
    /// Out-of-band SSE events to send (see `crate::annotations`).
    pub annotations: Option<Vec<String>>,
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a final chunk with `usage` and no choices before `[DONE]`.
    pub include_usage: Option<bool>,
}

/// `stop`: a string or a list of strings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stop(pub Vec<String>);

impl<'de> Deserialize<'de> for Stop {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::String(s) => Ok(Stop(vec![s])),
            Value::Array(items) => items
                .into_iter()
                .map(|item| match item {
                    Value::String(s) => Ok(s),
                    _ => Err(D::Error::custom("expected a string or a list of strings")),
                })
                .collect::<Result<_, _>>()
                .map(Stop),
            _ => Err(D::Error::custom("expected a string or a list of strings")),
        }
    }
}

/// Fields of `/v1/chat/completions` beyond [`CommonParams`].
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ChatParams {
    pub messages: Vec<ChatMessage>,
    /// Return each token's log-probability.
    pub logprobs: Option<bool>,
    /// With `logprobs`: how many most likely alternatives (0 to 20).
    #[serde(default, deserialize_with = "int::opt")]
    pub top_logprobs: Option<u32>,
    /// Functions the model may call (OpenAI's function tools).
    pub tools: Option<Vec<Value>>,
    /// "none", "auto", "required" or `{"type": "function", "function":
    /// {"name": ...}}`.
    pub tool_choice: Option<Value>,
    /// With forced calls: false allows exactly one.
    pub parallel_tool_calls: Option<bool>,
    /// `text`, `json_object`, or `json_schema` (enforced by constrained
    /// decoding).
    pub response_format: Option<ResponseFormat>,
    /// Extension (vLLM): end the prompt with the assistant header (default true).
    pub add_generation_prompt: Option<bool>,
    /// Extension (vLLM): continue the last message instead of a new one.
    pub continue_final_message: Option<bool>,
    /// Extension (vLLM): extra chat-template variables (e.g. enable_thinking).
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    /// Extension (vLLM): a chat template for this request (the server must
    /// trust request templates).
    pub chat_template: Option<String>,
    /// OpenAI's Predicted Outputs: text the answer will largely repeat,
    /// used for speculative proposals.
    pub prediction: Option<Prediction>,
}

/// `prediction`: `{"type": "content", "content": string | text parts}`.
#[derive(Debug, Clone, Deserialize)]
pub struct Prediction {
    #[serde(rename = "type")]
    pub kind: String,
    pub content: MessageContent,
}

/// `response_format`.
#[derive(Debug, Clone, Deserialize)]
pub struct ResponseFormat {
    #[serde(rename = "type")]
    pub kind: String,
    /// With `json_schema`: `{"name", "schema", "strict", "description"}`.
    pub json_schema: Option<Value>,
}

/// One chat message. Keys other than these are ignored.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    /// A string or a list of text parts; null or absent (an assistant turn
    /// that only calls tools) is left unset (the service renders it empty).
    #[serde(default)]
    pub content: Option<MessageContent>,
    pub name: Option<String>,
    /// The calls an assistant turn made.
    pub tool_calls: Option<Vec<ToolCall>>,
    /// For role "tool": the call this message answers.
    pub tool_call_id: Option<String>,
    /// An earlier assistant turn's reasoning (also accepted as `reasoning`).
    #[serde(alias = "reasoning")]
    pub reasoning_content: Option<String>,
}

/// A tool call in an assistant message.
#[derive(Debug, Clone, Deserialize)]
pub struct ToolCall {
    pub id: Option<String>,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub function: FunctionCall,
}

/// The function of a tool call.
#[derive(Debug, Clone, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    /// JSON text as OpenAI sends it; an object is accepted too (and written
    /// back as JSON text).
    pub arguments: Option<Value>,
}

/// Message content flattened to text: a string, or a list of
/// `{"type": "text", "text": ..}` parts joined with newlines (as vLLM does).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MessageContent(pub String);

impl<'de> Deserialize<'de> for MessageContent {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::String(s) => Ok(MessageContent(s)),
            Value::Array(parts) => {
                let texts = parts
                    .iter()
                    .map(text_part)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(D::Error::custom)?;
                Ok(MessageContent(texts.join("\n")))
            }
            _ => Err(D::Error::custom(
                "expected a string or a list of content parts",
            )),
        }
    }
}

/// The text of one content part.
fn text_part(part: &Value) -> Result<&str, String> {
    match part.get("type").and_then(Value::as_str) {
        Some("text") => part
            .get("text")
            .and_then(Value::as_str)
            .ok_or_else(|| "a text content part needs a string 'text'".to_owned()),
        Some(other) => Err(format!(
            "content parts of type '{}' are not supported yet",
            gyre_api::clip(other)
        )),
        None => Err("each content part needs a string 'type'".to_owned()),
    }
}

/// Fields of `/v1/completions` beyond [`CommonParams`].
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionParams {
    pub prompt: Prompt,
    /// Start each choice's text (and logprobs listing) with the prompt.
    pub echo: Option<bool>,
    /// Return each token's log-probability and this many alternatives (0 to 20).
    #[serde(default, deserialize_with = "int::opt")]
    pub logprobs: Option<u32>,
    /// Not supported yet: refused when non-empty.
    pub suffix: Option<String>,
    /// Beam width (OpenVINO Model Server's and OpenAI's legacy meaning):
    /// above 1, beam search returning the `n` best of `best_of` beams.
    #[serde(default, deserialize_with = "int::opt")]
    pub best_of: Option<u32>,
    /// Extension (vLLM's former name): beam search, `best_of` (default
    /// `n`) beams wide.
    pub use_beam_search: Option<bool>,
    /// Extension (OpenVINO Model Server, vLLM): beam search's length
    /// penalty (default 1.0).
    pub length_penalty: Option<f32>,
    /// Extension (vLLM): beam search's stopping rule, `true`, `false`
    /// (default) or `"never"` (transformers' `early_stopping`).
    pub early_stopping: Option<Value>,
}

/// `prompt`: a string, a list of token ids, or a batch (a list of strings or
/// of token-id lists; a batch of one is that prompt).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    Text(String),
    TokenIds(Vec<u32>),
    /// Several prompts: one set of choices each.
    Batch(Vec<Prompt>),
}

/// Most prompts in one completions request.
pub const MAX_PROMPTS: usize = 64;

impl<'de> Deserialize<'de> for Prompt {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::String(s) => Ok(Prompt::Text(s)),
            Value::Array(items) => prompt_list(items).map_err(D::Error::custom),
            _ => Err(D::Error::custom(
                "expected a string, a list of token ids, or a list of those",
            )),
        }
    }
}

fn prompt_list(items: Vec<Value>) -> Result<Prompt, String> {
    match items.as_slice() {
        [] => Err("the prompt must not be an empty list".to_owned()),
        [Value::String(_) | Value::Array(_), ..] => {
            if items.len() > MAX_PROMPTS {
                return Err(format!("at most {MAX_PROMPTS} prompts per request"));
            }
            let mut batch = items
                .into_iter()
                .map(|item| match item {
                    Value::String(s) => Ok(Prompt::Text(s)),
                    Value::Array(ids) if !ids.is_empty() && ids.iter().all(Value::is_u64) => {
                        match prompt_list(ids)? {
                            p @ Prompt::TokenIds(_) => Ok(p),
                            _ => Err("expected a list of token ids".to_owned()),
                        }
                    }
                    _ => Err("a batch holds strings or non-empty lists of token ids".to_owned()),
                })
                .collect::<Result<Vec<_>, _>>()?;
            if batch.len() == 1 {
                return batch.pop().ok_or_else(|| "empty batch".to_owned());
            }
            Ok(Prompt::Batch(batch))
        }
        _ => items
            .iter()
            .map(|v| {
                v.as_u64()
                    .and_then(|id| u32::try_from(id).ok())
                    .ok_or_else(|| {
                        let v = v.to_string();
                        format!(
                            "token ids must be integers in [0, 2^32), got {}",
                            gyre_api::clip(&v)
                        )
                    })
            })
            .collect::<Result<_, _>>()
            .map(Prompt::TokenIds),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse<T: for<'de> Deserialize<'de>>(v: Value) -> Result<T, String> {
        serde_json::from_value(v).map_err(|e| e.to_string())
    }

    #[test]
    fn stop_as_string_or_list() {
        assert_eq!(parse::<Stop>(json!("END")), Ok(Stop(vec!["END".into()])));
        assert_eq!(
            parse::<Stop>(json!(["a", "b"])),
            Ok(Stop(vec!["a".into(), "b".into()]))
        );
        assert!(parse::<Stop>(json!([1])).is_err());
        assert!(parse::<Stop>(json!(5)).is_err());
    }

    #[test]
    fn content_parts_are_flattened() {
        assert_eq!(
            parse::<MessageContent>(json!("hi")),
            Ok(MessageContent("hi".into()))
        );
        let parts = json!([
            {"type": "text", "text": "first"},
            {"type": "text", "text": "second", "extra": true},
        ]);
        assert_eq!(
            parse::<MessageContent>(parts),
            Ok(MessageContent("first\nsecond".into()))
        );
        assert_eq!(
            parse::<MessageContent>(json!([])),
            Ok(MessageContent::default())
        );
        let image = json!([{"type": "image_url", "image_url": {"url": "x"}}]);
        let err = parse::<MessageContent>(image).expect_err("images unsupported");
        assert!(err.contains("image_url"), "{err}");
        assert!(parse::<MessageContent>(json!([{"text": "no type"}])).is_err());
        assert!(parse::<MessageContent>(json!(3)).is_err());
    }

    #[test]
    fn message_keys_beyond_role_content_name_are_ignored() {
        let msg: ChatMessage = parse(json!({
            "role": "assistant", "content": null, "tool_calls": [], "name": "bot"
        }))
        .expect("parses");
        assert_eq!(msg.content, None);
        assert_eq!(msg.name.as_deref(), Some("bot"));
    }

    #[test]
    fn prompt_forms() {
        assert_eq!(parse::<Prompt>(json!("x")), Ok(Prompt::Text("x".into())));
        assert_eq!(parse::<Prompt>(json!(["x"])), Ok(Prompt::Text("x".into())));
        assert_eq!(
            parse::<Prompt>(json!([1, 2])),
            Ok(Prompt::TokenIds(vec![1, 2]))
        );
        assert_eq!(
            parse::<Prompt>(json!(["a", "b"])),
            Ok(Prompt::Batch(vec![
                Prompt::Text("a".into()),
                Prompt::Text("b".into())
            ]))
        );
        assert_eq!(parse::<Prompt>(json!([[1]])), Ok(Prompt::TokenIds(vec![1])));
        let too_many: Vec<&str> = vec!["x"; MAX_PROMPTS + 1];
        for bad in [
            json!([]),
            json!(["a", 1]),
            json!([[1], []]),
            json!([[1], ["a"]]),
            json!(too_many),
            json!([-1]),
            json!([1.5]),
            json!(3),
        ] {
            assert!(parse::<Prompt>(bad.clone()).is_err(), "{bad}");
        }
    }
}
