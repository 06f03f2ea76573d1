//! Response objects: `chat.completion`, `chat.completion.chunk`,
//! `text_completion` (whole and streamed), usage, and models.
//!
//! `logprobs` is null unless the request asked for it (chat format or the
//! legacy completions listing). On chunks, `usage` is left
//! out unless the client asked for it with `stream_options.include_usage`;
//! then it is null on every chunk but the last, as in OpenAI's API.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

/// What every response object of one request shares.
#[derive(Debug, Clone, Serialize)]
pub struct Meta {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: &'static str,
}

/// Reported as `system_fingerprint`: the shim's build.
pub const SYSTEM_FINGERPRINT: &str = concat!("gyre-", env!("CARGO_PKG_VERSION"));

impl Meta {
    /// A fresh id `<prefix>-<uuid>` created now, for `model`.
    pub fn new(prefix: &str, model: &str) -> Self {
        Self {
            id: format!("{prefix}-{}", uuid::Uuid::new_v4().simple()),
            created: unix_now(),
            model: model.to_owned(),
            system_fingerprint: SYSTEM_FINGERPRINT,
        }
    }
}

/// Seconds since the Unix epoch (0 if the clock is before it).
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Token counts of a request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub total_tokens: u32,
    pub prompt_tokens_details: PromptTokensDetails,
    /// Present when the model's reasoning was parsed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_tokens_details: Option<CompletionTokensDetails>,
}

/// `usage.completion_tokens_details`: present when the model's reasoning
/// was parsed or the request speculated (prompt lookup). OpenAI's
/// prediction fields carry speculation's counts: tokens proposed that the
/// model's samples confirmed (kept), and those it did not (computed and
/// discarded; not part of `completion_tokens`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CompletionTokensDetails {
    pub reasoning_tokens: u32,
    pub accepted_prediction_tokens: u32,
    pub rejected_prediction_tokens: u32,
}

impl Usage {
    /// Adds another call's (or choice's) completion-token details.
    pub fn add_details(&mut self, other: Option<CompletionTokensDetails>) {
        if let Some(o) = other {
            let d = self
                .completion_tokens_details
                .get_or_insert_with(Default::default);
            d.reasoning_tokens += o.reasoning_tokens;
            d.accepted_prediction_tokens += o.accepted_prediction_tokens;
            d.rejected_prediction_tokens += o.rejected_prediction_tokens;
        }
    }
}

/// `usage.prompt_tokens_details`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PromptTokensDetails {
    pub cached_tokens: u32,
}

impl From<gyre_api::v1::Usage> for Usage {
    fn from(u: gyre_api::v1::Usage) -> Self {
        Self {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            total_tokens: u.prompt_tokens.saturating_add(u.completion_tokens),
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: u.cached_tokens,
            },
            completion_tokens_details: details(&u),
        }
    }
}

/// The completion-token details of a call's usage, if it has any.
fn details(u: &gyre_api::v1::Usage) -> Option<CompletionTokensDetails> {
    let spec = u.speculative_proposed_tokens.is_some();
    (u.reasoning_tokens.is_some() || spec).then(|| {
        let proposed = u.speculative_proposed_tokens.unwrap_or(0);
        let accepted = u.speculative_accepted_tokens.unwrap_or(0);
        CompletionTokensDetails {
            reasoning_tokens: u.reasoning_tokens.unwrap_or(0),
            accepted_prediction_tokens: accepted,
            rejected_prediction_tokens: proposed.saturating_sub(accepted),
        }
    })
}

/// `logprobs` of a choice: null, or the endpoint's format built by
/// [`chat_logprobs`] / [`TextLogprobs`].
type NoLogprobs = Option<serde_json::Value>;

/// A logprob's `bytes`: the server's `token_bytes` (the raw bytes of a
/// token that is part of a character), or the token's UTF-8 where they
/// are empty (a response stored before they were sent; an empty token).
pub(crate) fn bytes(token: &str, raw: &[u8]) -> Vec<u8> {
    match raw.is_empty() {
        true => token.as_bytes().to_vec(),
        false => raw.to_vec(),
    }
}

/// Chat format: `{"content": [{token, logprob, bytes, top_logprobs}], "refusal": null}`.
pub fn chat_logprobs(entries: &[gyre_api::v1::TokenLogprob]) -> serde_json::Value {
    let content: Vec<_> = entries
        .iter()
        .map(|e| {
            let top: Vec<_> = e
                .top_logprobs
                .iter()
                .map(|t| serde_json::json!({"token": t.token, "logprob": t.logprob, "bytes": bytes(&t.token, &t.token_bytes)}))
                .collect();
            serde_json::json!({"token": e.token, "logprob": e.logprob, "bytes": bytes(&e.token, &e.token_bytes), "top_logprobs": top})
        })
        .collect();
    serde_json::json!({"content": content, "refusal": null})
}

/// Legacy completions format, with `text_offset` counted (in characters)
/// from the start of the choice's text across chunks (an echoed prompt
/// included).
#[derive(Debug, Default)]
pub struct TextLogprobs {
    offset: usize,
}

impl TextLogprobs {
    /// The listing of generated tokens.
    pub fn build(&mut self, entries: &[gyre_api::v1::TokenLogprob]) -> serde_json::Value {
        self.listing(None, entries.iter())
    }

    /// The listing of `first` (a token without log-probability: the first
    /// of an echoed prompt, given null entries as OpenAI does) then `entries`.
    pub fn listing<'a>(
        &mut self,
        first: Option<&str>,
        entries: impl Iterator<Item = &'a gyre_api::v1::TokenLogprob>,
    ) -> serde_json::Value {
        use serde_json::Value;
        let mut tokens = Vec::new();
        let mut token_logprobs = Vec::new();
        let mut top = Vec::new();
        let mut text_offset = Vec::new();
        if let Some(first) = first {
            tokens.push(first.to_owned());
            token_logprobs.push(Value::Null);
            top.push(Value::Null);
            text_offset.push(self.offset);
            self.offset += first.chars().count();
        }
        for e in entries {
            tokens.push(e.token.clone());
            token_logprobs.push(e.logprob.into());
            let alternatives: serde_json::Map<String, Value> = e
                .top_logprobs
                .iter()
                .map(|t| (t.token.clone(), t.logprob.into()))
                .collect();
            top.push(Value::Object(alternatives));
            text_offset.push(self.offset);
            self.offset += e.token.chars().count();
        }
        serde_json::json!({"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": text_offset})
    }
}

/// A whole `chat.completion`.
#[derive(Debug, Clone, Serialize)]
pub struct ChatCompletion {
    #[serde(flatten)]
    pub meta: Meta,
    pub object: &'static str,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
}

/// The one choice of a `chat.completion`.
#[derive(Debug, Clone, Serialize)]
pub struct ChatChoice {
    pub index: u32,
    pub message: AssistantMessage,
    pub logprobs: NoLogprobs,
    pub finish_reason: &'static str,
}

/// The generated message.
#[derive(Debug, Clone, Serialize)]
pub struct AssistantMessage {
    pub role: &'static str,
    /// Null when the model only called tools.
    pub content: Option<String>,
    pub refusal: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallOut>,
    /// The reasoning section's text, under vLLM's older and newer names.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
}

/// A tool call in a response: `{"id", "type": "function", "function":
/// {"name", "arguments"}}`; in a stream chunk also `index`, and a call's
/// later fragments there carry only `index` and more `function.arguments`.
#[derive(Debug, Clone, Serialize)]
pub struct ToolCallOut {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub function: FunctionOut,
}

#[derive(Debug, Clone, Serialize)]
pub struct FunctionOut {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub arguments: String,
}

impl ToolCallOut {
    /// A whole call, or (`streamed`) a fragment of one: the first fragment
    /// of a call is the one with an id.
    pub fn from_delta(c: &gyre_api::v1::ToolCallDelta, streamed: bool) -> Self {
        let first = !streamed || !c.id.is_empty();
        Self {
            index: streamed.then_some(c.index),
            id: first.then(|| c.id.clone()),
            kind: first.then_some("function"),
            function: FunctionOut {
                name: first.then(|| c.name.clone()),
                arguments: c.arguments.clone(),
            },
        }
    }
}

impl ChatCompletion {
    /// One choice per (content, finish_reason, logprobs, tool calls),
    /// indexed in order.
    pub fn new(
        meta: Meta,
        choices: Vec<(String, &'static str, NoLogprobs, Vec<ToolCallOut>)>,
        usage: Usage,
    ) -> Self {
        let choices = choices
            .into_iter()
            .zip(0u32..)
            .map(
                |((content, finish_reason, logprobs, tool_calls), index)| ChatChoice {
                    index,
                    message: AssistantMessage {
                        role: "assistant",
                        content: (!content.is_empty() || tool_calls.is_empty()).then_some(content),
                        refusal: None,
                        tool_calls,
                        reasoning_content: None,
                        reasoning: None,
                    },
                    logprobs,
                    finish_reason,
                },
            )
            .collect();
        Self {
            meta,
            object: "chat.completion",
            choices,
            usage,
        }
    }
}

impl ChatCompletion {
    /// Sets each choice's reasoning text (by index), where it has any.
    pub fn with_reasoning(mut self, reasoning: Vec<String>) -> Self {
        for (choice, text) in self.choices.iter_mut().zip(reasoning) {
            if !text.is_empty() {
                choice.message.reasoning = Some(text.clone());
                choice.message.reasoning_content = Some(text);
            }
        }
        self
    }
}

/// One `chat.completion.chunk`.
#[derive(Debug, Clone, Serialize)]
pub struct ChatChunk<'a> {
    #[serde(flatten)]
    pub meta: &'a Meta,
    pub object: &'static str,
    pub choices: Vec<ChunkChoice<'a>>,
    /// Absent: usage not requested; `Some(None)`: null; `Some(Some(_))`: final.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
}

/// A choice of a chat chunk.
#[derive(Debug, Clone, Serialize)]
pub struct ChunkChoice<'a> {
    pub index: u32,
    pub delta: ChunkDelta<'a>,
    pub logprobs: NoLogprobs,
    pub finish_reason: Option<&'static str>,
}

/// The `delta` of a chat chunk; `{}` on the finishing chunk.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ChunkDelta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<&'a str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallOut>,
    /// Reasoning text, under vLLM's older and newer names (both or neither).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<&'a str>,
}

/// A `text_completion`, whole or one streamed chunk of it.
#[derive(Debug, Clone, Serialize)]
pub struct TextCompletion<'a> {
    #[serde(flatten)]
    pub meta: &'a Meta,
    pub object: &'static str,
    pub choices: Vec<TextChoice<'a>>,
    /// As on [`ChatChunk::usage`]; always `Some(Some(_))` when not streamed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
}

/// A choice of a `text_completion`; `finish_reason` is null until the end.
#[derive(Debug, Clone, Serialize)]
pub struct TextChoice<'a> {
    pub index: u32,
    pub text: &'a str,
    pub logprobs: NoLogprobs,
    pub finish_reason: Option<&'static str>,
}

/// `GET /v1/models`.
#[derive(Debug, Clone, Serialize)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelObject>,
}

/// One model: OpenAI's fields plus gyre's catalogue (extensions).
#[derive(Debug, Clone, Serialize)]
pub struct ModelObject {
    pub id: String,
    pub object: &'static str,
    pub created: i64,
    pub owned_by: String,
    /// Extension (vLLM): context length in tokens.
    pub max_model_len: u32,
    /// Extension: other names that resolve to this model.
    pub aliases: Vec<String>,
    /// Extension: the pinned version ("" when none is known).
    pub version: String,
    /// Extension: deprecation time in Unix seconds, or null.
    pub deprecation: Option<i64>,
    /// Extension: sunset time in Unix seconds, or null.
    pub sunset: Option<i64>,
    /// Extension: what the model serves ("generate").
    pub kind: String,
    /// Extension: whether chat requests are served (a chat template).
    pub chat: bool,
}

impl From<gyre_api::v1::Model> for ModelObject {
    fn from(m: gyre_api::v1::Model) -> Self {
        Self {
            id: m.id,
            object: "model",
            created: m.created,
            owned_by: if m.owned_by.is_empty() {
                "gyre".to_owned()
            } else {
                m.owned_by
            },
            max_model_len: m.max_model_len,
            aliases: m.aliases,
            version: m.version,
            deprecation: m.deprecation,
            sunset: m.sunset,
            kind: if m.kind.is_empty() {
                "generate".to_owned()
            } else {
                m.kind
            },
            chat: m.chat,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn meta() -> Meta {
        Meta {
            id: "chatcmpl-1".into(),
            created: 7,
            model: "m".into(),
            system_fingerprint: "fp",
        }
    }

    #[test]
    fn chat_completion_shape() {
        let usage = Usage::from(gyre_api::v1::Usage {
            prompt_tokens: 3,
            completion_tokens: 2,
            cached_tokens: 1,
            ..Default::default()
        });
        let value = serde_json::to_value(ChatCompletion::new(
            meta(),
            vec![("hi".into(), "stop", None, Vec::new())],
            usage,
        ))
        .expect("serializes");
        assert_eq!(
            value,
            json!({
                "id": "chatcmpl-1", "object": "chat.completion", "created": 7, "model": "m",
                "system_fingerprint": "fp",
                "choices": [{"index": 0,
                    "message": {"role": "assistant", "content": "hi", "refusal": null},
                    "logprobs": null, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
                    "prompt_tokens_details": {"cached_tokens": 1}},
            })
        );
    }

    #[test]
    fn chunk_usage_is_absent_null_or_set() {
        let meta = meta();
        let chunk = |usage| ChatChunk {
            meta: &meta,
            object: "chat.completion.chunk",
            choices: vec![],
            usage,
        };
        let absent = serde_json::to_value(chunk(None)).expect("serializes");
        assert!(absent.get("usage").is_none());
        let null = serde_json::to_value(chunk(Some(None))).expect("serializes");
        assert_eq!(null["usage"], serde_json::Value::Null);
        let set = serde_json::to_value(chunk(Some(Some(Usage::default())))).expect("serializes");
        assert_eq!(set["usage"]["total_tokens"], 0);
    }

    /// Chat's `bytes` are the server's `token_bytes` (a character's part),
    /// or the token's UTF-8 where none came.
    #[test]
    fn chat_logprob_bytes_are_the_token_bytes() {
        let entry = |token: &str, raw: &[u8]| gyre_api::v1::TokenLogprob {
            token: token.into(),
            token_bytes: raw.to_vec(),
            top_logprobs: vec![gyre_api::v1::TopLogprob {
                token: token.into(),
                token_bytes: raw.to_vec(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let out = chat_logprobs(&[entry("\u{FFFD}", &[0xF0, 0x9F]), entry("é", &[])]);
        let c = &out["content"];
        assert_eq!(c[0]["bytes"], json!([0xF0, 0x9F]));
        assert_eq!(c[0]["top_logprobs"][0]["bytes"], json!([0xF0, 0x9F]));
        assert_eq!(c[1]["bytes"], json!([195, 169]));
    }

    #[test]
    fn legacy_listing_with_an_echoed_first_token() {
        let entry = |token: &str, logprob| gyre_api::v1::TokenLogprob {
            token_id: 1,
            logprob,
            token: token.into(),
            ..Default::default()
        };
        let mut offsets = TextLogprobs::default();
        let prompt = offsets.listing(Some("Hé"), [entry("llo", -1.0)].iter());
        assert_eq!(
            prompt,
            json!({"tokens": ["Hé", "llo"], "token_logprobs": [null, -1.0],
                   "top_logprobs": [null, {}], "text_offset": [0, 2]})
        );
        let rest = offsets.build(&[entry("!", -0.5)]);
        assert_eq!(rest["text_offset"], json!([5]));
    }
}
