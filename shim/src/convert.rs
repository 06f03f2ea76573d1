//! OpenAI request bodies -> proto `Request`: the one place where the HTTP
//! API's fields become gyre.v1 fields.
//!
//! Range checks of sampling values are the service's (it answers
//! INVALID_ARGUMENT with the field, mapped back to `param`); the shim refuses
//! only what gyre does not offer: suffix. Tools and structured
//! outputs are converted in `structured.rs`.

use gyre_api::v1 as pb;
use serde_json::Value;

use crate::error::ApiError;
use crate::extract::{fields, require};
use crate::openai::request::{ChatParams, CommonParams, CompletionParams, Prompt};
use crate::sse::Annotation;
use crate::structured::{response_format, structured_extension, tool_choice, tool_spec};

/// How to answer: one JSON object, or SSE chunks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamMode {
    pub stream: bool,
    /// Send a usage chunk before `[DONE]` (only when streaming).
    pub include_usage: bool,
    /// Completions `echo`: each choice's text starts with the prompt.
    pub echo: bool,
    /// `nvext.annotations` gyre knows, to send as SSE events (only when
    /// streaming).
    pub annotations: Vec<Annotation>,
}

/// A parsed `/v1/chat/completions` body.
#[derive(Debug, Clone)]
pub struct ChatRequest {
    pub common: CommonParams,
    pub chat: ChatParams,
}

impl ChatRequest {
    /// Parses and type-checks a body; errors name the field as `param`.
    pub fn from_body(body: &Value) -> Result<Self, ApiError> {
        require(body, &["model", "messages"])?;
        Ok(Self {
            common: fields(body)?,
            chat: fields(body)?,
        })
    }

    /// The proto request with id `request_id`, and how to answer.
    pub fn into_proto(self, request_id: &str) -> Result<(pb::Request, StreamMode), ApiError> {
        let chat = self.chat;
        let logprobs = match (chat.logprobs.unwrap_or(false), chat.top_logprobs) {
            (true, k) => Some(k.unwrap_or(0)),
            (false, None) => None,
            (false, Some(_)) => {
                return Err(ApiError::invalid_request(
                    "top_logprobs requires logprobs to be true.",
                    Some("top_logprobs"),
                ));
            }
        };
        let tools = chat
            .tools
            .unwrap_or_default()
            .into_iter()
            .enumerate()
            .map(|(i, t)| tool_spec(t, i))
            .collect::<Result<Vec<_>, _>>()?;
        let tool_choice = chat.tool_choice.as_ref().map(tool_choice).transpose()?;
        let format = response_format(chat.response_format.as_ref())?;
        let mut messages = chat_messages(chat.messages)?;
        let logprobs_k = logprobs;
        let raw = self
            .common
            .nvext
            .as_ref()
            .and_then(|x| x.use_raw_prompt)
            .unwrap_or(false);
        let input = match messages.pop() {
            // nvext.use_raw_prompt: the last message's content, untemplated.
            Some(last) if raw => pb::request::Input::Text(last.content.unwrap_or_default()),
            last => {
                messages.extend(last);
                pb::request::Input::Chat(pb::ChatInput {
                    messages,
                    add_generation_prompt: chat.add_generation_prompt,
                    continue_final_message: chat.continue_final_message,
                    chat_template_kwargs: chat.chat_template_kwargs.map(json_to_struct),
                    tools,
                    chat_template: chat.chat_template,
                    tool_choice,
                    parallel_tool_calls: chat.parallel_tool_calls,
                })
            }
        };
        let (mut request, mode) = common_to_proto(self.common, request_id, input)?;
        request.logprobs = logprobs_k;
        if let Some(p) = chat.prediction {
            if p.kind != "content" {
                return Err(ApiError::invalid_request(
                    format!(
                        "prediction.type must be 'content', got '{}'.",
                        gyre_api::clip(&p.kind)
                    ),
                    Some("prediction.type"),
                ));
            }
            request.prediction = Some(p.content.0);
        }
        if let Some(f) = format {
            if request.structured.is_some() {
                return Err(ApiError::invalid_request(
                    "Give either response_format or a structured-outputs extension, not both.",
                    Some("response_format"),
                ));
            }
            request.structured = Some(f);
        }
        Ok((request, mode))
    }
}

/// A JSON object as a protobuf Struct (`chat_template_kwargs`).
pub fn json_to_struct(map: serde_json::Map<String, Value>) -> prost_types::Struct {
    prost_types::Struct {
        fields: map
            .into_iter()
            .map(|(k, v)| (k, json_to_value(v)))
            .collect(),
    }
}

fn json_to_value(v: Value) -> prost_types::Value {
    use prost_types::value::Kind;
    let kind = match v {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(b),
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        Value::String(s) => Kind::StringValue(s),
        Value::Array(a) => Kind::ListValue(prost_types::ListValue {
            values: a.into_iter().map(json_to_value).collect(),
        }),
        Value::Object(o) => Kind::StructValue(json_to_struct(o)),
    };
    prost_types::Value { kind: Some(kind) }
}

/// OpenAI chat messages -> proto messages (content parts joined). Roles and
/// an empty list are checked by the service (see docs/ARCHITECTURE.md).
pub fn chat_messages(
    list: Vec<crate::openai::request::ChatMessage>,
) -> Result<Vec<pb::ChatMessage>, ApiError> {
    let mut messages = Vec::with_capacity(list.len());
    for (i, m) in list.into_iter().enumerate() {
        let tool_calls = m
            .tool_calls
            .unwrap_or_default()
            .into_iter()
            .enumerate()
            .map(|(j, c)| tool_call(c, &format!("messages[{i}].tool_calls[{j}]")))
            .collect::<Result<_, _>>()?;
        // OpenAI's legacy `function` role is a function's result: `tool`.
        let role = if m.role == "function" {
            "tool".to_string()
        } else {
            m.role
        };
        messages.push(pb::ChatMessage {
            role,
            content: m.content.map(|c| c.0),
            name: m.name,
            tool_calls,
            tool_call_id: m.tool_call_id,
            reasoning_content: m.reasoning_content,
        });
    }
    Ok(messages)
}

/// A wire tool call -> proto: arguments stay JSON text (an object sent
/// instead of text is written as JSON text; the service parses it).
fn tool_call(c: crate::openai::request::ToolCall, at: &str) -> Result<pb::ToolCall, ApiError> {
    let arguments = match c.function.arguments {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s,
        Some(v @ Value::Object(_)) => v.to_string(),
        Some(_) => {
            return Err(ApiError::invalid_request(
                "function.arguments must be a JSON string.",
                Some(&format!("{at}.function.arguments")),
            ));
        }
    };
    Ok(pb::ToolCall {
        id: c.id.unwrap_or_default(),
        r#type: c.kind.unwrap_or_default(),
        function: Some(pb::FunctionCall {
            name: c.function.name,
            arguments,
        }),
    })
}

/// A parsed `/v1/completions` body.
#[derive(Debug, Clone)]
pub struct CompletionRequest {
    pub common: CommonParams,
    pub completion: CompletionParams,
}

impl CompletionRequest {
    /// Parses and type-checks a body; errors name the field as `param`.
    /// `"prompt": null` is refused: OpenAI's schema allows it, meaning its
    /// own tokenizer's `<|endoftext|>`, which gyre's models need not have.
    pub fn from_body(body: &Value) -> Result<Self, ApiError> {
        if body.get("prompt").is_some_and(Value::is_null) {
            return Err(ApiError::invalid_request(
                "'prompt' must not be null: gyre has no model-independent default prompt \
                 (OpenAI's default, '<|endoftext|>', is a token of OpenAI's own tokenizers). \
                 Send a string, a list of token ids, or a list of those.",
                Some("prompt"),
            ));
        }
        require(body, &["model", "prompt"])?;
        Ok(Self {
            common: fields(body)?,
            completion: fields(body)?,
        })
    }

    /// The proto requests (one per prompt) and how to answer.
    pub fn into_protos(self, request_id: &str) -> Result<(Vec<pb::Request>, StreamMode), ApiError> {
        let c = self.completion;
        let echo = c.echo.unwrap_or(false);
        let logprobs_k = c.logprobs;
        if c.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::unsupported("suffix", "suffix"));
        }
        let beam = BeamFields {
            best_of: c.best_of,
            use_beam_search: c.use_beam_search,
            length_penalty: c.length_penalty,
            early_stopping: c.early_stopping,
        };
        let prompts = match c.prompt {
            Prompt::Batch(list) => list,
            single => vec![single],
        };
        let input = |p: Prompt| match p {
            Prompt::TokenIds(ids) => pb::request::Input::TokenIds(pb::TokenIds { ids }),
            Prompt::Text(text) => pb::request::Input::Text(text),
            Prompt::Batch(_) => pb::request::Input::Text(String::new()),
        };
        let mut prompts = prompts.into_iter();
        let first = prompts
            .next()
            .map(input)
            .unwrap_or(pb::request::Input::Text(String::new()));
        let n = self.common.n;
        let (mut request, mut mode) = common_to_proto(self.common, request_id, first)?;
        request.beam = beam_search(&beam, n, mode.stream)?;
        request.logprobs = logprobs_k;
        // echo with logprobs lists the prompt's tokens too, as OpenAI does.
        request.echo |= echo;
        mode.echo = echo;
        request.prompt_logprobs = logprobs_k.filter(|_| echo);
        // One gRPC request per prompt, the same but for input and id.
        let mut requests = vec![request.clone()];
        for (i, p) in prompts.enumerate() {
            let mut r = request.clone();
            r.request_id = format!("{request_id}-{}", i + 1);
            r.input = Some(input(p));
            requests.push(r);
        }
        Ok((requests, mode))
    }
}

/// Completions' beam-search fields.
struct BeamFields {
    best_of: Option<u32>,
    use_beam_search: Option<bool>,
    length_penalty: Option<f32>,
    early_stopping: Option<Value>,
}

/// Completions' beam-search fields (see [`CompletionParams`]) -> the
/// proto's: `best_of` above 1, or `use_beam_search`, asks for it.
fn beam_search(
    b: &BeamFields,
    n: Option<u32>,
    stream: bool,
) -> Result<Option<pb::BeamSearch>, ApiError> {
    let on = b.use_beam_search.unwrap_or(false) || b.best_of.is_some_and(|w| w > 1);
    if !on {
        for (set, name) in [
            (b.length_penalty.is_some(), "length_penalty"),
            (b.early_stopping.is_some(), "early_stopping"),
        ] {
            if set {
                return Err(ApiError::invalid_request(
                    format!("{name} applies to beam search only: set best_of above 1."),
                    Some(name),
                ));
            }
        }
        return Ok(None);
    }
    if stream {
        return Err(ApiError::invalid_request(
            "Beam search (best_of > 1) cannot stream: the beams are only known when the search ends. Send stream=false.",
            Some("stream"),
        ));
    }
    use pb::EarlyStopping as E;
    let early = match &b.early_stopping {
        None | Some(Value::Bool(false)) => E::Heuristic,
        Some(Value::Bool(true)) => E::Always,
        Some(Value::String(s)) if s == "never" => E::Never,
        Some(_) => {
            return Err(ApiError::invalid_request(
                "early_stopping must be true, false or \"never\".",
                Some("early_stopping"),
            ));
        }
    };
    Ok(Some(pb::BeamSearch {
        width: b.best_of.unwrap_or(n.unwrap_or(1)),
        length_penalty: b.length_penalty,
        early_stopping: early as i32,
    }))
}

/// Folds `nvext` into the top-level fields: a field given in both places
/// must have the same value (else 400 naming `nvext.<field>`). Returns the
/// annotations gyre knows (unknown names are ignored, as Dynamo does).
fn apply_nvext(common: &mut CommonParams) -> Result<Vec<Annotation>, ApiError> {
    let Some(ext) = common.nvext.take() else {
        return Ok(Vec::new());
    };
    merge(&mut common.ignore_eos, ext.ignore_eos, "ignore_eos")?;
    merge(&mut common.top_k, ext.top_k, "top_k")?;
    merge(
        &mut common.repetition_penalty,
        ext.repetition_penalty,
        "repetition_penalty",
    )?;
    if ext.greedy_sampling == Some(true) {
        if common.temperature.is_some_and(|t| t != 0.0) {
            return Err(ApiError::invalid_request(
                "nvext.greedy_sampling asks for greedy sampling, which conflicts with a non-zero temperature.",
                Some("nvext.greedy_sampling"),
            ));
        }
        common.temperature = Some(0.0);
    }
    let mut annotations = Vec::new();
    for a in ext
        .annotations
        .iter()
        .flatten()
        .filter_map(|a| Annotation::parse(a))
    {
        if !annotations.contains(&a) {
            annotations.push(a);
        }
    }
    Ok(annotations)
}

/// Sets `top` from the `nvext` value `ext` unless they conflict.
fn merge<T: PartialEq + Copy + std::fmt::Debug>(
    top: &mut Option<T>,
    ext: Option<T>,
    name: &str,
) -> Result<(), ApiError> {
    match (*top, ext) {
        (Some(a), Some(b)) if a != b => Err(ApiError::invalid_request(
            format!(
                "nvext.{name} ({b:?}) conflicts with {name} ({a:?}): give one, or the same value."
            ),
            Some(&format!("nvext.{name}")),
        )),
        (_, Some(b)) => {
            *top = Some(b);
            Ok(())
        }
        _ => Ok(()),
    }
}

fn common_to_proto(
    mut common: CommonParams,
    request_id: &str,
    input: pb::request::Input,
) -> Result<(pb::Request, StreamMode), ApiError> {
    let annotations = apply_nvext(&mut common)?;
    let structured = structured_extension(&common)?;
    // `top_p: 0` (allowed by OpenAI) keeps only the most likely token: top_k 1.
    let greedy_top_p = common.top_p == Some(0.0);
    if greedy_top_p {
        common.top_p = None;
    }
    let top_k = match common.top_k {
        _ if greedy_top_p => Some(1),
        None => None,
        Some(-1 | 0) => Some(0),
        Some(k) => Some(u32::try_from(k).map_err(|_| {
            ApiError::invalid_request(
                "top_k must be a positive integer, or 0 or -1 for off.",
                Some("top_k"),
            )
        })?),
    };
    let stream = common.stream.unwrap_or(false);
    if common.stream_options.is_some() && !stream {
        return Err(ApiError::invalid_request(
            "stream_options can only be given when stream is true.",
            Some("stream_options"),
        ));
    }
    let mode = StreamMode {
        stream,
        include_usage: stream
            && common
                .stream_options
                .as_ref()
                .and_then(|o| o.include_usage)
                .unwrap_or(false),
        echo: false,
        annotations: if stream { annotations } else { Vec::new() },
    };
    let mut logit_bias = std::collections::HashMap::new();
    for (key, bias) in common.logit_bias.unwrap_or_default() {
        let id: u32 = key.trim().parse().map_err(|_| {
            ApiError::invalid_request(
                format!(
                    "logit_bias keys must be token ids, got {:?}.",
                    gyre_api::clip(&key)
                ),
                Some("logit_bias"),
            )
        })?;
        logit_bias.insert(id, bias);
    }
    let request = pb::Request {
        separate_reasoning: None,
        request_id: request_id.to_owned(),
        model: common.model,
        input: Some(input),
        sampling: Some(pb::SamplingParams {
            temperature: common.temperature,
            top_p: common.top_p,
            top_k,
            seed: common.seed.map(|s| u64::from_ne_bytes(s.to_ne_bytes())),
            min_p: common.min_p,
            presence_penalty: common.presence_penalty,
            frequency_penalty: common.frequency_penalty,
            repetition_penalty: common.repetition_penalty,
            logit_bias,
        }),
        min_tokens: common.min_tokens,
        logprobs: None,
        // The prompt annotations are read from the service's prompt echo.
        echo: !mode.annotations.is_empty(),
        prompt_logprobs: None,
        include_stop_str_in_output: common.include_stop_str_in_output.unwrap_or(false),
        clamp_max_tokens: common.clamp_max_tokens.unwrap_or(false),
        max_tokens: common.max_completion_tokens.or(common.max_tokens),
        stop: common.stop.map(|s| s.0).unwrap_or_default(),
        stop_token_ids: common.stop_token_ids.unwrap_or_default(),
        ignore_eos: common.ignore_eos.unwrap_or(false),
        skip_special_tokens: common.skip_special_tokens,
        priority: common.priority.map(i32::saturating_neg),
        n: common.n,
        cache_salt: common.cache_salt,
        structured,
        num_assistant_tokens: common.num_assistant_tokens,
        max_ngram_size: common.max_ngram_size,
        assistant_confidence_threshold: common.assistant_confidence_threshold,
        // Chat only: set by the chat conversion.
        prediction: None,
        beam: None,
    };
    Ok((request, mode))
}

#[cfg(test)]
#[path = "convert_tests.rs"]
mod tests;
