//! One hosted model: the engine handle plus everything text-side that the
//! engine must not do (tokenizer, chat template, special tokens).

use std::path::Path;
use std::sync::Arc;

use gyre_engine::{Engine, EngineOptions};
use serde_json::Value;
use tokenizers::Tokenizer;

use crate::error::ServiceError;
use crate::reasoning::{ParserChoice, ReasoningParser};
use crate::template::{ChatTemplate, RenderArgs, TemplateError};

pub struct ModelRuntime {
    pub id: String,
    pub owned_by: String,
    pub created: i64,
    pub engine: Engine,
    pub tokenizer: Arc<Tokenizer>,
    pub template: Option<ChatTemplate>,
    /// Compiles structured-output requests; None when the tokenizer could
    /// not be mapped to bytes (then such requests are refused).
    pub grammars: Option<crate::structured::Grammars>,
    /// The tokenizer's BOS and EOS text, for templates a request brings.
    pub special_tokens: SpecialTokens,
    /// Whether requests may bring their own chat template.
    pub trust_request_chat_template: bool,
    /// --tool-call-parser: overrides the format the chat template implies.
    pub tool_call_parser: Option<crate::tools::ToolFormat>,
    /// `--reasoning-parser` (applied to a request's own template too).
    pub reasoning_choice: ParserChoice,
    /// The reasoning markers of the model's template, when it has any.
    pub reasoning: Option<ReasoningParser>,
    /// What a request that says nothing of speculation gets.
    pub speculation: SpeculationDefaults,
}

/// A model's speculation defaults, for requests that do not set them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpeculationDefaults {
    /// Tokens prompt lookup proposes per step by default (0: off).
    pub lookup_tokens: u32,
    /// Longest n-gram prompt lookup matches unless a request sends
    /// `max_ngram_size`.
    pub max_ngram: u32,
    /// Shortest n-gram prompt lookup matches (lowered to a request's
    /// `max_ngram_size` when that is shorter).
    pub min_ngram: u32,
    /// The draft model's defaults, when the model has one.
    pub draft: Option<DraftDefaults>,
}

impl Default for SpeculationDefaults {
    /// Prompt lookup off; transformers' n-grams (2 down to 1); no draft.
    fn default() -> Self {
        Self {
            lookup_tokens: 0,
            max_ngram: crate::request::DEFAULT_MAX_NGRAM,
            min_ngram: 1,
            draft: None,
        }
    }
}

/// Speculation defaults for a model served with a draft model: its
/// `generation_config.json`'s `num_assistant_tokens` and
/// `assistant_confidence_threshold` (a GGUF has neither).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DraftDefaults {
    pub num_tokens: Option<u32>,
    pub confidence_threshold: Option<f32>,
}

impl DraftDefaults {
    /// Reads them from the model directory `dir` (none for a file).
    pub fn read(dir: &Path) -> Self {
        let Some(cfg) = std::fs::read_to_string(dir.join("generation_config.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        else {
            return Self::default();
        };
        Self {
            num_tokens: cfg
                .get("num_assistant_tokens")
                .and_then(Value::as_u64)
                .map(|k| k.min(gyre_engine::MAX_SPECULATIVE_TOKENS as u64) as u32),
            confidence_threshold: cfg
                .get("assistant_confidence_threshold")
                .and_then(Value::as_f64)
                .map(|t| t.clamp(0.0, 1.0) as f32),
        }
    }
}

/// The text of the special tokens that templates refer to.
#[derive(Debug, Clone, Default)]
pub struct SpecialTokens {
    pub bos: String,
    pub eos: String,
}

/// Text-side options of a served model.
#[derive(Debug, Clone, Default)]
pub struct TextOptions {
    /// A chat template (the text itself) to use instead of the model's.
    pub chat_template: Option<String>,
    /// Let requests bring their own chat template (`ChatInput.chat_template`).
    pub trust_request_chat_template: bool,
    /// The tool-call format to parse, instead of the template's own.
    pub tool_call_parser: Option<crate::tools::ToolFormat>,
    /// `--reasoning-parser`.
    pub reasoning_parser: ParserChoice,
    /// `--prompt-lookup-tokens`: prompt-lookup decoding by default, with
    /// this many tokens proposed per step (0: off unless a request asks).
    pub prompt_lookup_tokens: u32,
    /// Longest n-gram prompt lookup matches by default (None: 2,
    /// transformers' default); from `--speculative-config`.
    pub prompt_lookup_max: Option<u32>,
    /// Shortest n-gram prompt lookup matches (None: 1, transformers'
    /// search); from `--speculative-config`.
    pub prompt_lookup_min: Option<u32>,
    /// Tokens the draft model proposes per step by default, instead of the
    /// model's generation_config.json `num_assistant_tokens` (None: that,
    /// else 5).
    pub draft_tokens: Option<u32>,
}

fn load_err(dir: &Path, what: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("cannot load model from {}: {what}", dir.display())
}

/// A special token from tokenizer_config.json: a string or `{"content": ...}`.
fn special(cfg: &Value, key: &str) -> String {
    match cfg.get(key) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Object(o)) => o
            .get("content")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        _ => String::new(),
    }
}

/// The chat template: `chat_template.jinja` beside the tokenizer (newer
/// checkpoints), else `chat_template` in tokenizer_config.json (a string, or
/// a list of named templates of which "default" is used).
fn chat_template_source(dir: &Path, cfg: &Value) -> Option<String> {
    if let Ok(s) = std::fs::read_to_string(dir.join("chat_template.jinja")) {
        return Some(s);
    }
    match cfg.get("chat_template")? {
        Value::String(s) => Some(s.clone()),
        Value::Array(list) => list
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|t| t.get("template")?.as_str().map(str::to_string)),
        _ => None,
    }
}

/// The text side of a model directory or GGUF file: its tokenizer and chat
/// template.
pub fn load_text(path: &Path) -> anyhow::Result<(Tokenizer, Option<ChatTemplate>)> {
    let (tok, template, _, _) = load_text_with(path, None)?;
    Ok((tok, template))
}

/// A model's tokenizer (as `tokenizer.json` text), special tokens and chat
/// template source: from a HuggingFace directory's files, or from a GGUF
/// file's `tokenizer.*` metadata.
struct TextFiles {
    tokenizer_json: String,
    special: SpecialTokens,
    template: Option<String>,
}

fn text_files(path: &Path) -> anyhow::Result<TextFiles> {
    if gyre_engine::gguf::is_gguf(path) {
        use gyre_engine::gguf::tokenizer as gt;
        let file = gyre_engine::gguf::GgufFile::open(path).map_err(|e| load_err(path, e))?;
        return Ok(TextFiles {
            tokenizer_json: gt::tokenizer_json(&file).map_err(|e| load_err(path, e))?,
            special: SpecialTokens {
                bos: gt::special_token(&file, "bos").unwrap_or_default(),
                eos: gt::special_token(&file, "eos").unwrap_or_default(),
            },
            template: gt::chat_template(&file),
        });
    }
    let tokenizer_json = std::fs::read_to_string(path.join("tokenizer.json"))
        .map_err(|e| load_err(path, format!("tokenizer.json: {e}")))?;
    let cfg: Value = match std::fs::read_to_string(path.join("tokenizer_config.json")) {
        Ok(t) => serde_json::from_str(&t)
            .map_err(|e| load_err(path, format!("tokenizer_config.json: {e}")))?,
        Err(_) => Value::Null,
    };
    Ok(TextFiles {
        tokenizer_json,
        special: SpecialTokens {
            bos: special(&cfg, "bos_token"),
            eos: special(&cfg, "eos_token"),
        },
        template: chat_template_source(path, &cfg),
    })
}

/// The text side of a model, with `template` (a template's text) replacing
/// the model's own chat template when given; also the `tokenizer.json` text
/// (for the structured-output token trie).
pub fn load_text_with(
    path: &Path,
    template: Option<&str>,
) -> anyhow::Result<(Tokenizer, Option<ChatTemplate>, SpecialTokens, String)> {
    let files = text_files(path)?;
    let tokenizer = files
        .tokenizer_json
        .parse::<Tokenizer>()
        .map_err(|e| load_err(path, format!("tokenizer.json: {e}")))?;
    let source = template.map(str::to_string).or(files.template);
    let special = files.special;
    let template = match source {
        Some(src) => Some(
            ChatTemplate::new(&src, &special.bos, &special.eos).map_err(|e| load_err(path, e))?,
        ),
        None => None,
    };
    Ok((tokenizer, template, special, files.tokenizer_json))
}

/// `--chat-template`: a file's path, or (as vLLM allows) the template text
/// itself when no such file exists and it looks like Jinja.
pub fn chat_template_arg(arg: &str) -> anyhow::Result<String> {
    match std::fs::read_to_string(arg) {
        Ok(text) => Ok(text),
        Err(_) if arg.contains("{{") || arg.contains("{%") => Ok(arg.to_string()),
        Err(e) => Err(anyhow::anyhow!("--chat-template {arg}: {e}")),
    }
}

impl ModelRuntime {
    /// Loads tokenizer, template and weights (blocking; seconds to minutes).
    pub fn load(
        opts: EngineOptions,
        served_name: Option<String>,
        text: TextOptions,
    ) -> anyhow::Result<Self> {
        let dir = opts.model_dir.clone();
        let dir = dir.as_path();
        let gguf = gyre_engine::gguf::is_gguf(dir);
        if !gguf && !dir.join("config.json").exists() {
            return Err(load_err(
                dir,
                "neither a GGUF file nor a directory with config.json (run `make setup` for the default model, or pass --model <file.gguf | HF dir>)",
            ));
        }
        let (tokenizer, template, special_tokens, tokenizer_json) =
            load_text_with(dir, text.chat_template.as_deref())?;
        tracing::info!(model = %dir.display(), "loading model");
        let started = std::time::Instant::now();
        // The engine's error stays in the chain, so that the registry can
        // tell a draft model's failure from the model's.
        let engine = Engine::start(opts).map_err(|e| {
            anyhow::Error::new(e).context(format!("cannot load model from {}", dir.display()))
        })?;
        let info = engine.info();
        let draft = info.draft_model.is_some();
        let grammars = match crate::structured::Grammars::load(&tokenizer_json, info) {
            Ok(g) => Some(g),
            Err(e) => {
                tracing::warn!(error = %e, "structured outputs unavailable for this tokenizer");
                None
            }
        };
        tracing::info!(
            secs = format!("{:.1}", started.elapsed().as_secs_f64()),
            device = %info.device,
            dtype = %info.dtype,
            context = info.max_model_len,
            "model ready"
        );
        let reasoning = text
            .reasoning_parser
            .resolve(template.as_ref().map(ChatTemplate::source));
        tracing::info!(
            parser = reasoning.map_or("none", |p| p.name),
            "reasoning parser"
        );
        let id = served_name.unwrap_or_else(|| {
            let name = if gguf {
                dir.file_stem()
            } else {
                dir.file_name()
            };
            name.map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "model".into())
        });
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        Ok(Self {
            id,
            owned_by: "gyre".into(),
            created,
            engine,
            tokenizer: Arc::new(tokenizer),
            template,
            grammars,
            special_tokens,
            trust_request_chat_template: text.trust_request_chat_template,
            tool_call_parser: text.tool_call_parser,
            reasoning_choice: text.reasoning_parser,
            reasoning,
            speculation: SpeculationDefaults {
                lookup_tokens: text.prompt_lookup_tokens,
                max_ngram: text
                    .prompt_lookup_max
                    .unwrap_or(crate::request::DEFAULT_MAX_NGRAM),
                min_ngram: text.prompt_lookup_min.unwrap_or(1),
                draft: draft.then(|| {
                    let mut d = DraftDefaults::read(dir);
                    if let Some(k) = text.draft_tokens {
                        d.num_tokens = Some(k);
                    }
                    d
                }),
            },
        })
    }

    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, ServiceError> {
        let enc = self
            .tokenizer
            .encode(text, add_special_tokens)
            .map_err(|e| ServiceError::Internal(format!("tokenizer: {e}")))?;
        Ok(enc.get_ids().to_vec())
    }

    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, ServiceError> {
        let vocab = self.engine.info().vocab_size;
        if let Some(&bad) = ids.iter().find(|&&t| t >= vocab) {
            return Err(ServiceError::invalid(
                "token_ids",
                "TOKEN_OUT_OF_VOCABULARY",
                format!("token id {bad} is out of the vocabulary (size {vocab})"),
            ));
        }
        self.tokenizer
            .decode(ids, skip_special)
            .map_err(|e| ServiceError::Internal(format!("tokenizer: {e}")))
    }

    /// Renders chat messages with the model's template, or with `own` (a
    /// request's template, when the server trusts them).
    pub fn render_chat_with(
        &self,
        own: Option<&str>,
        args: RenderArgs<'_>,
    ) -> Result<String, ServiceError> {
        let compiled;
        let template = match own {
            Some(src) => {
                if !self.trust_request_chat_template {
                    return Err(ServiceError::invalid(
                        "chat.chat_template",
                        "REQUEST_CHAT_TEMPLATE_NOT_ALLOWED",
                        "this server does not accept chat templates in requests (start it with --trust-request-chat-template)",
                    ));
                }
                compiled =
                    ChatTemplate::new(src, &self.special_tokens.bos, &self.special_tokens.eos)
                        .map_err(|m| {
                            ServiceError::invalid(
                                "chat.chat_template",
                                "CHAT_TEMPLATE_ERROR",
                                gyre_api::clip(&m),
                            )
                        })?;
                &compiled
            }
            None => self
                .template
                .as_ref()
                .ok_or_else(|| ServiceError::Unservable {
                    field: "chat".into(),
                    reason: "NO_CHAT_TEMPLATE",
                    message: format!(
                        "the model `{}` has no chat template; send text input instead",
                        self.id
                    ),
                })?,
        };
        if args.messages.is_empty() {
            return Err(ServiceError::invalid(
                "chat.messages",
                "EMPTY_MESSAGES",
                "messages must not be empty",
            ));
        }
        template.render_with(args).map_err(|e| match e {
            TemplateError::Raised(m) | TemplateError::Render(m) => {
                ServiceError::invalid("chat.messages", "CHAT_TEMPLATE_ERROR", gyre_api::clip(&m))
            }
        })
    }
}
