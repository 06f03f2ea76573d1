//! Turning a proto `Request` into an engine request: model lookup, input
//! rendering and tokenizing, parameter validation and defaults.

use std::sync::Arc;

use gyre_api::v1::{self, request::Input};
use gyre_engine::{GenerateRequest, Sampling};

use crate::chat::render_chat_input;
use crate::error::ServiceError;
use crate::reasoning::{ReasoningParser, Splitter};
use crate::runtime::{ModelRuntime, SpeculationDefaults};
use crate::tools::{FunctionSpec, ToolFormat};

/// What a request's tools ask for (`request_tools.rs`).
#[path = "request_tools.rs"]
mod tools;
use tools::{ToolPlan, tool_plan, tool_schema_error};

/// Most stop strings one request may give.
pub const MAX_STOP_STRINGS: usize = 16;

/// A validated request, ready for the engine.
pub struct Prepared {
    pub model: Arc<ModelRuntime>,
    pub engine_req: GenerateRequest,
    pub stop: Vec<String>,
    /// Keep a matched stop string in the output.
    pub include_stop: bool,
    pub skip_special: bool,
    /// Choices to generate.
    pub n: u32,
    /// The prompt's text, when the request asked for it back (`echo` or
    /// `prompt_logprobs`).
    pub echo: Option<String>,
    /// Parse tool calls out of the output, in this format.
    pub tool_format: Option<ToolFormat>,
    /// The calls are forced (tool_choice required or a named function):
    /// the output is call syntax throughout.
    pub forced_tools: bool,
    /// `parallel_tool_calls: false`: at most one call (later ones the
    /// model writes are dropped).
    pub single_call: bool,
    /// How to split reasoning from the answer, when this request's is parsed.
    pub reasoning: Option<Reasoning>,
    /// The request's admission against its tenant's quotas (keys file
    /// only); settles when the last choice lets go of the request.
    pub admission: Option<crate::access::Admission>,
    /// When the service received the request (the start of its latency
    /// and time to first token).
    pub arrived: std::time::Instant,
}

/// A request's reasoning parser, and whether its prompt left the output
/// inside a reasoning section.
#[derive(Debug, Clone, Copy)]
pub struct Reasoning {
    pub parser: ReasoningParser,
    pub open: bool,
}

impl Reasoning {
    pub fn splitter(&self) -> Splitter {
        Splitter::new(&self.parser, self.open)
    }
}

/// The reasoning parsing of a request: chat input only (as vLLM), unless
/// `separate_reasoning` is false or `chat_template_kwargs.enable_thinking`
/// is false (no reasoning section is expected then).
fn reasoning_of(
    model: &ModelRuntime,
    req: &v1::Request,
    prompt: Option<&str>,
) -> Option<Reasoning> {
    let Some(Input::Chat(chat)) = &req.input else {
        return None;
    };
    if req.separate_reasoning == Some(false) {
        return None;
    }
    let thinking_off = chat
        .chat_template_kwargs
        .as_ref()
        .and_then(|k| k.fields.get("enable_thinking"))
        .and_then(|v| match v.kind {
            Some(prost_types::value::Kind::BoolValue(b)) => Some(!b),
            _ => None,
        })
        .unwrap_or(false);
    if thinking_off {
        return None;
    }
    let parser = match chat.chat_template.as_deref() {
        Some(own) => model.reasoning_choice.resolve(Some(own)),
        None => model.reasoning,
    }?;
    Some(Reasoning {
        parser,
        open: parser.opened_by(prompt.unwrap_or("")),
    })
}

/// Tokens prompt lookup proposes per step when a request sets only
/// `max_ngram_size` (transformers' `prompt_lookup_num_tokens` default).
pub const DEFAULT_LOOKUP_TOKENS: u32 = 10;

/// Longest n-gram matched unless a request or the model says
/// (transformers' `max_matching_ngram_size` default).
pub const DEFAULT_MAX_NGRAM: u32 = 2;

/// Tokens the draft model proposes per step when neither the request nor
/// the model's generation_config.json says (OpenVINO's default).
pub const DEFAULT_DRAFT_TOKENS: u32 = 5;

/// A request's speculation: prompt lookup or the draft model (see
/// `speculation`), never both.
type Speculate = (
    Option<gyre_engine::Speculation>,
    Option<gyre_engine::DraftSpeculation>,
);

/// How a request speculates. On a model with a draft model: with the
/// draft, unless it sends `max_ngram_size` or a prediction (prompt lookup);
/// its `num_assistant_tokens` or `assistant_confidence_threshold` (not
/// both), else the model's generation_config.json, else 5 tokens. On a
/// model without one: prompt lookup, as `lookup` says.
fn speculation(model: &SpeculationDefaults, req: &v1::Request) -> Result<Speculate, ServiceError> {
    let lookup_asked =
        req.max_ngram_size.is_some() || req.prediction.as_deref().is_some_and(|p| !p.is_empty());
    if let Some(t) = req.assistant_confidence_threshold {
        let field = "assistant_confidence_threshold";
        if req.num_assistant_tokens.is_some() {
            return Err(ServiceError::invalid(
                field,
                "MUTUALLY_EXCLUSIVE",
                "num_assistant_tokens and assistant_confidence_threshold are mutually exclusive",
            ));
        }
        if !(0.0..=1.0).contains(&t) {
            return Err(ServiceError::invalid(
                field,
                "OUT_OF_RANGE",
                format!("assistant_confidence_threshold must be between 0 and 1, got {t}"),
            ));
        }
        if model.draft.is_none() {
            return Err(ServiceError::invalid(
                field,
                "NO_DRAFT_MODEL",
                "assistant_confidence_threshold needs a model served with a draft model (--draft-model)",
            ));
        }
        if lookup_asked {
            return Err(ServiceError::invalid(
                field,
                "NO_DRAFT_MODEL",
                "assistant_confidence_threshold applies to the draft model; this request uses prompt lookup (max_ngram_size or prediction)",
            ));
        }
    }
    let Some(defaults) = model.draft.filter(|_| !lookup_asked) else {
        return Ok((lookup(model, req)?, None));
    };
    let max = gyre_engine::MAX_SPECULATIVE_TOKENS;
    if let Some(k) = req.num_assistant_tokens.filter(|&k| k > max) {
        return Err(ServiceError::invalid(
            "num_assistant_tokens",
            "OUT_OF_RANGE",
            format!("num_assistant_tokens must be between 0 and {max}, got {k}"),
        ));
    }
    let cap = gyre_engine::DRAFT_THRESHOLD_MAX_TOKENS;
    let (num_tokens, confidence_threshold) =
        match (req.num_assistant_tokens, req.assistant_confidence_threshold) {
            (Some(k), _) => (k, None),
            (None, Some(t)) => (cap, Some(t)),
            (None, None) => match (defaults.num_tokens, defaults.confidence_threshold) {
                (Some(k), t) => (k, t),
                (None, Some(t)) => (cap, Some(t)),
                (None, None) => (DEFAULT_DRAFT_TOKENS, None),
            },
        };
    let draft = (num_tokens > 0).then_some(gyre_engine::DraftSpeculation {
        num_tokens,
        confidence_threshold,
    });
    Ok((None, draft))
}

/// A request's prompt-lookup settings: its own, else the model's default.
fn lookup(
    model: &SpeculationDefaults,
    req: &v1::Request,
) -> Result<Option<gyre_engine::Speculation>, ServiceError> {
    use gyre_engine::{MAX_NGRAM, MAX_SPECULATIVE_TOKENS};
    if let Some(k) = req
        .num_assistant_tokens
        .filter(|&k| k > MAX_SPECULATIVE_TOKENS)
    {
        return Err(ServiceError::invalid(
            "num_assistant_tokens",
            "OUT_OF_RANGE",
            format!("num_assistant_tokens must be between 0 and {MAX_SPECULATIVE_TOKENS}, got {k}"),
        ));
    }
    if let Some(n) = req.max_ngram_size.filter(|&n| n == 0 || n > MAX_NGRAM) {
        return Err(ServiceError::invalid(
            "max_ngram_size",
            "OUT_OF_RANGE",
            format!("max_ngram_size must be between 1 and {MAX_NGRAM}, got {n}"),
        ));
    }
    // `max_ngram_size` or a prediction alone asks for speculation.
    let asked =
        req.max_ngram_size.is_some() || req.prediction.as_deref().is_some_and(|p| !p.is_empty());
    let num_tokens = match req.num_assistant_tokens {
        Some(k) => k,
        None if asked && model.lookup_tokens == 0 => DEFAULT_LOOKUP_TOKENS,
        None => model.lookup_tokens,
    };
    // The model's longest n-gram unless the request sends its own; the
    // model's shortest, lowered to that when the request's is shorter.
    let max_ngram = req.max_ngram_size.unwrap_or(model.max_ngram);
    Ok((num_tokens > 0).then(|| gyre_engine::Speculation {
        num_tokens,
        max_ngram,
        min_ngram: model.min_ngram.min(max_ngram),
    }))
}

/// Most tokens a predicted output may have.
pub const MAX_PREDICTION_TOKENS: usize = 32_768;

/// A request's predicted output as tokens (empty without one, or when it
/// does not speculate).
fn predicted(
    model: &ModelRuntime,
    req: &v1::Request,
    speculation: Option<gyre_engine::Speculation>,
) -> Result<Arc<[u32]>, ServiceError> {
    let Some(text) = req.prediction.as_deref().filter(|p| !p.is_empty()) else {
        return Ok(Arc::from([]));
    };
    let ids = model.encode(text, false)?;
    if ids.len() > MAX_PREDICTION_TOKENS {
        return Err(ServiceError::invalid(
            "prediction",
            "TOO_LONG",
            format!(
                "prediction has {} tokens; at most {MAX_PREDICTION_TOKENS} are allowed",
                ids.len()
            ),
        ));
    }
    Ok(if speculation.is_some() {
        Arc::from(ids)
    } else {
        Arc::from([])
    })
}

/// The model a request names; empty means the first one.
pub fn resolve(
    models: &[Arc<ModelRuntime>],
    name: &str,
) -> Result<Arc<ModelRuntime>, ServiceError> {
    if name.is_empty() {
        return models
            .first()
            .cloned()
            .ok_or_else(|| ServiceError::ModelNotFound(String::new()));
    }
    models
        .iter()
        .find(|m| m.id == name)
        .cloned()
        .ok_or_else(|| ServiceError::ModelNotFound(name.to_string()))
}

/// Prompt token ids of a request's input (blocking: tokenizes).
pub fn prompt_ids(model: &ModelRuntime, input: Option<&Input>) -> Result<Vec<u32>, ServiceError> {
    prompt_with_text(model, input).map(|(ids, _)| ids)
}

/// Prompt token ids and, for text and chat input, the text that was
/// tokenized (for chat: the rendered template).
fn prompt_with_text(
    model: &ModelRuntime,
    input: Option<&Input>,
) -> Result<(Vec<u32>, Option<String>), ServiceError> {
    if let Some(Input::Chat(chat)) = input {
        let text = render_chat_input(model, chat)?;
        return Ok((model.encode(&text, false)?, Some(text)));
    }
    let text = match input {
        Some(Input::Text(t)) => Some(t.clone()),
        _ => None,
    };
    Ok((prompt_ids_of_raw(model, input)?, text))
}

fn prompt_ids_of_raw(
    model: &ModelRuntime,
    input: Option<&Input>,
) -> Result<Vec<u32>, ServiceError> {
    match input {
        None => Err(ServiceError::invalid(
            "input",
            "MISSING_INPUT",
            "one of text, token_ids or chat is required",
        )),
        Some(Input::Text(t)) => {
            if t.is_empty() {
                return Err(ServiceError::invalid(
                    "input.text",
                    "EMPTY_PROMPT",
                    "the prompt is empty",
                ));
            }
            model.encode(t, true)
        }
        Some(Input::TokenIds(ids)) => Ok(ids.ids.clone()),
        Some(Input::Chat(chat)) => model.encode(&render_chat_input(model, chat)?, false),
    }
}

fn sampling(
    model: &ModelRuntime,
    p: Option<&v1::SamplingParams>,
) -> Result<Sampling, ServiceError> {
    let d = &model.engine.info().default_sampling;
    let p = p.cloned().unwrap_or_default();
    let temperature = p.temperature.unwrap_or(d.temperature);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ServiceError::invalid(
            "sampling.temperature",
            "OUT_OF_RANGE",
            format!("temperature must be in [0, 2], got {temperature}"),
        ));
    }
    let top_p = p.top_p.unwrap_or(d.top_p);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ServiceError::invalid(
            "sampling.top_p",
            "OUT_OF_RANGE",
            format!("top_p must be in (0, 1], got {top_p}"),
        ));
    }
    let in_range = |field: &'static str, v: f32, lo: f32, hi: f32| {
        if v.is_finite() && (lo..=hi).contains(&v) {
            Ok(v)
        } else {
            Err(ServiceError::invalid(
                format!("sampling.{field}"),
                "OUT_OF_RANGE",
                format!("{field} must be in [{lo}, {hi}], got {v}"),
            ))
        }
    };
    let min_p = in_range("min_p", p.min_p.unwrap_or(d.min_p), 0.0, 1.0)?;
    let presence_penalty = in_range(
        "presence_penalty",
        p.presence_penalty.unwrap_or(0.0),
        -2.0,
        2.0,
    )?;
    let frequency_penalty = in_range(
        "frequency_penalty",
        p.frequency_penalty.unwrap_or(0.0),
        -2.0,
        2.0,
    )?;
    let repetition_penalty = p.repetition_penalty.unwrap_or(d.repetition_penalty);
    if !(repetition_penalty > 0.0 && repetition_penalty <= 10.0) {
        return Err(ServiceError::invalid(
            "sampling.repetition_penalty",
            "OUT_OF_RANGE",
            format!("repetition_penalty must be in (0, 10], got {repetition_penalty}"),
        ));
    }
    let vocab = model.engine.info().vocab_size;
    let mut logit_bias: Vec<(u32, f32)> = Vec::with_capacity(p.logit_bias.len());
    for (&id, &bias) in &p.logit_bias {
        if id >= vocab {
            return Err(ServiceError::invalid(
                "sampling.logit_bias",
                "TOKEN_OUT_OF_VOCABULARY",
                format!("logit_bias names token id {id}, outside the vocabulary (size {vocab})"),
            ));
        }
        logit_bias.push((id, in_range("logit_bias", bias, -100.0, 100.0)?));
    }
    logit_bias.sort_by_key(|&(id, _)| id);
    Ok(Sampling {
        temperature,
        top_p,
        top_k: p.top_k.unwrap_or(d.top_k),
        seed: p.seed,
        min_p,
        presence_penalty,
        frequency_penalty,
        repetition_penalty,
        logit_bias,
    })
}

/// Validates a request and builds the engine request (blocking: tokenizes).
pub fn prepare(models: &[Arc<ModelRuntime>], req: &v1::Request) -> Result<Prepared, ServiceError> {
    prepare_for(resolve(models, &req.model)?, req)
}

/// [`prepare`] for a model already resolved (by the registry, which also
/// knows aliases).
pub fn prepare_for(model: Arc<ModelRuntime>, req: &v1::Request) -> Result<Prepared, ServiceError> {
    let tools = tool_plan(&model, req)?;
    // tool_choice NONE: the template does not see the tools.
    let cleared;
    let input = match (&req.input, &tools) {
        (Some(Input::Chat(chat)), ToolPlan::Off) if !chat.tools.is_empty() => {
            let mut c = chat.clone();
            c.tools.clear();
            cleared = Input::Chat(c);
            Some(&cleared)
        }
        (input, _) => input.as_ref(),
    };
    let (prompt, prompt_text) = prompt_with_text(&model, input)?;
    let reasoning = reasoning_of(&model, req, prompt_text.as_deref());
    let sampling = sampling(&model, req.sampling.as_ref())?;
    if req.stop.len() > MAX_STOP_STRINGS {
        return Err(ServiceError::invalid(
            "stop",
            "TOO_MANY_STOP_STRINGS",
            format!(
                "at most {MAX_STOP_STRINGS} stop strings are allowed, got {}",
                req.stop.len()
            ),
        ));
    }
    if req.stop.iter().any(String::is_empty) {
        return Err(ServiceError::invalid(
            "stop",
            "EMPTY_STOP_STRING",
            "stop strings must not be empty",
        ));
    }
    let info = model.engine.info();
    let beam = crate::beam::beam(req)?;
    // Unset: whatever room the context and the KV cache leave for all n
    // choices, or all the beams (the engine refuses the request when there
    // is none).
    let n = beam.map_or(req.n.unwrap_or(1).max(1), |b| b.width.max(1));
    let prompt_len = prompt.len() as u32;
    let room_ctx = info.max_model_len.saturating_sub(prompt_len);
    let room_kv = match beam {
        // Each beam must fit unshared, in whole blocks (as the engine checks).
        Some(_) => {
            let block = model.engine.stats().block_size.max(1);
            (info.kv_capacity_tokens / n / block * block).saturating_sub(prompt_len)
        }
        None => info.kv_capacity_tokens.saturating_sub(prompt_len) / n,
    };
    if req.max_tokens.is_none() && room_ctx.min(room_kv) == 0 {
        // Nothing was asked of max_tokens: the prompt alone is at fault.
        let (reason, message) = if room_ctx == 0 {
            (
                "CONTEXT_LENGTH_EXCEEDED",
                format!(
                    "this model's maximum context length is {} tokens; the prompt has {prompt_len} \
                     tokens, which leaves none to generate",
                    info.max_model_len
                ),
            )
        } else {
            (
                "EXCEEDS_KV_CAPACITY",
                format!(
                    "the prompt ({prompt_len} tokens) leaves no room to generate in the server's \
                     KV cache ({} tokens)",
                    info.kv_capacity_tokens
                ),
            )
        };
        return Err(ServiceError::invalid("input", reason, message));
    }
    let room = room_ctx.min(room_kv).max(1);
    let max_tokens = match req.max_tokens {
        Some(n) if req.clamp_max_tokens => n.min(room),
        Some(n) => n,
        None => room,
    };
    let logprobs = req.logprobs;
    if logprobs.is_some_and(|k| k > gyre_engine::MAX_TOP_LOGPROBS) {
        return Err(ServiceError::invalid(
            "logprobs",
            "OUT_OF_RANGE",
            format!(
                "at most {} top logprobs, got {}",
                gyre_engine::MAX_TOP_LOGPROBS,
                logprobs.unwrap_or(0)
            ),
        ));
    }
    if let Some(k) = req
        .prompt_logprobs
        .filter(|&k| k > gyre_engine::MAX_TOP_LOGPROBS)
    {
        return Err(ServiceError::invalid(
            "prompt_logprobs",
            "OUT_OF_RANGE",
            format!(
                "at most {} top prompt logprobs, got {k}",
                gyre_engine::MAX_TOP_LOGPROBS
            ),
        ));
    }
    let skip_special = req.skip_special_tokens.unwrap_or(true);
    let echo = if req.echo || req.prompt_logprobs.is_some() {
        Some(match prompt_text {
            Some(text) => text,
            None => model.decode(&prompt, skip_special)?,
        })
    } else {
        None
    };
    let min_tokens = req.min_tokens.unwrap_or(0);
    if min_tokens > max_tokens {
        return Err(ServiceError::invalid(
            "min_tokens",
            "OUT_OF_RANGE",
            format!("min_tokens ({min_tokens}) must not exceed max_tokens ({max_tokens})"),
        ));
    }
    let constraint = match &req.structured {
        None => None,
        Some(s) => match &model.grammars {
            Some(g) => g.compile(s)?,
            None => {
                return Err(ServiceError::invalid(
                    "structured",
                    "UNSUPPORTED_STRUCTURE",
                    "structured outputs are not available for this model's tokenizer",
                ));
            }
        },
    };
    let forced_tools = matches!(tools, ToolPlan::Force(..));
    let single_call =
        matches!(&req.input, Some(Input::Chat(c)) if c.parallel_tool_calls == Some(false));
    let (tool_format, constraint) = match tools {
        ToolPlan::Off => (None, constraint),
        ToolPlan::Parse(f) => (Some(f), constraint),
        ToolPlan::Force(f, functions, parallel) => {
            if constraint.is_some() {
                return Err(ServiceError::invalid(
                    "chat.tool_choice",
                    "CONFLICTING_CONSTRAINTS",
                    "a required or named tool_choice cannot be combined with a structured output",
                ));
            }
            let Some(g) = &model.grammars else {
                return Err(ServiceError::invalid(
                    "chat.tool_choice",
                    "UNSUPPORTED_STRUCTURE",
                    "forcing tool calls is not available for this model's tokenizer",
                ));
            };
            let specs: Vec<FunctionSpec> = functions
                .iter()
                .map(|(_, f)| FunctionSpec {
                    name: f.name.clone(),
                    parameters: f.parameters.clone(),
                })
                .collect();
            let lark = crate::tools::forcing_grammar(f, &specs, parallel);
            let forced = v1::StructuredOutput {
                kind: Some(v1::structured_output::Kind::Grammar(lark)),
            };
            match g.compile(&forced) {
                Ok(c) => (Some(f), c),
                Err(e) => return Err(tool_schema_error(g, &functions).unwrap_or(e)),
            }
        }
    };
    // With reasoning, the structure applies to the answer only: the engine
    // leaves the output free until the end marker's tokens (and, unless the
    // prompt opened the section, lets it begin with the start marker).
    let constraint = match (constraint, reasoning) {
        (Some(c), Some(r)) => {
            let start = if r.open {
                None
            } else {
                Some(model.encode(r.parser.start, false)?)
            };
            Some(c.after_section(start, model.encode(r.parser.end, false)?))
        }
        (c, _) => c,
    };
    let (speculation, draft) = speculation(&model.speculation, req)?;
    // Beam search does not speculate: the model's draft applies only when
    // the request asks for it (and the engine then refuses the mix).
    let asked = req.num_assistant_tokens.is_some() || req.assistant_confidence_threshold.is_some();
    let draft = draft.filter(|_| beam.is_none() || asked);
    let predicted = predicted(&model, req, speculation)?;
    let engine_req = GenerateRequest {
        prompt,
        max_tokens,
        sampling,
        stop_token_ids: req.stop_token_ids.clone(),
        ignore_eos: req.ignore_eos,
        min_tokens,
        logprobs,
        prompt_logprobs: req.prompt_logprobs,
        priority: req.priority.unwrap_or(0),
        // The service sets the caller's tenant (`grpc::for_tenant`).
        tenant: std::sync::Arc::from(""),
        weight: 1,
        cache_salt: req.cache_salt.clone().unwrap_or_default(),
        constraint,
        speculation,
        predicted,
        draft,
        beam,
    };
    Ok(Prepared {
        model,
        engine_req,
        stop: req.stop.clone(),
        include_stop: req.include_stop_str_in_output,
        // Formats whose markers are special tokens need them in the text.
        skip_special: skip_special && !tool_format.is_some_and(ToolFormat::needs_special_tokens),
        n: req.n.unwrap_or(1),
        tool_format,
        forced_tools,
        single_call,
        echo,
        reasoning,
        admission: None,
        arrived: std::time::Instant::now(),
    })
}

#[cfg(test)]
mod speculation_tests {
    use super::*;
    use crate::runtime::DraftDefaults;
    use gyre_engine::{DraftSpeculation, Speculation};

    fn lookup_of(model: &SpeculationDefaults, req: &v1::Request) -> Option<Speculation> {
        let (lookup, draft) = speculation(model, req).expect("ok");
        assert_eq!(draft, None);
        lookup
    }

    #[test]
    fn the_models_ngram_bounds_are_the_default() {
        let model = SpeculationDefaults {
            lookup_tokens: 6,
            max_ngram: 4,
            min_ngram: 2,
            draft: None,
        };
        let spec = |num_tokens, max_ngram, min_ngram| {
            Some(Speculation {
                num_tokens,
                max_ngram,
                min_ngram,
            })
        };
        assert_eq!(lookup_of(&model, &v1::Request::default()), spec(6, 4, 2));
        // A request's longest n-gram replaces the model's; the shortest is
        // lowered to it when it is shorter.
        let req = |max_ngram_size, num_assistant_tokens| v1::Request {
            max_ngram_size,
            num_assistant_tokens,
            ..v1::Request::default()
        };
        assert_eq!(lookup_of(&model, &req(Some(7), None)), spec(6, 7, 2));
        assert_eq!(lookup_of(&model, &req(Some(1), Some(3))), spec(3, 1, 1));
        assert_eq!(lookup_of(&model, &req(None, Some(0))), None);
        // Without a server or model setting: off, and a request that asks
        // gets transformers' n-grams (2 down to 1).
        let plain = SpeculationDefaults::default();
        assert_eq!(lookup_of(&plain, &v1::Request::default()), None);
        assert_eq!(
            lookup_of(&plain, &req(None, Some(5))),
            spec(5, DEFAULT_MAX_NGRAM, 1)
        );
        assert_eq!(
            lookup_of(&plain, &req(Some(3), None)),
            spec(DEFAULT_LOOKUP_TOKENS, 3, 1)
        );
    }

    #[test]
    fn the_models_draft_tokens_are_the_default_and_a_request_overrides_them() {
        let model = SpeculationDefaults {
            draft: Some(DraftDefaults {
                num_tokens: Some(3),
                confidence_threshold: None,
            }),
            ..SpeculationDefaults::default()
        };
        let draft = |req: &v1::Request| speculation(&model, req).expect("ok");
        let d = |num_tokens| {
            Some(DraftSpeculation {
                num_tokens,
                confidence_threshold: None,
            })
        };
        assert_eq!(draft(&v1::Request::default()), (None, d(3)));
        let own = v1::Request {
            num_assistant_tokens: Some(7),
            ..v1::Request::default()
        };
        assert_eq!(draft(&own), (None, d(7)));
        // Without any setting: 5.
        let unset = SpeculationDefaults {
            draft: Some(DraftDefaults::default()),
            ..SpeculationDefaults::default()
        };
        assert_eq!(
            speculation(&unset, &v1::Request::default()).expect("ok"),
            (None, d(DEFAULT_DRAFT_TOKENS))
        );
    }
}
