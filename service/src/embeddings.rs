//! One hosted embedding model, [`EmbeddingRuntime`]: the embedding engine
//! handle plus its tokenizer, the counterpart of `runtime::ModelRuntime` for
//! generative models. It turns a request's inputs (texts or token ids) into
//! checked token-id lists, truncating as `truncate_prompt_tokens` asks. The
//! gRPC service over it is `embeddings_grpc`.

use std::path::Path;
use std::sync::Arc;

use gyre_engine::{EmbedEngine, EmbedError, EmbedOptions};
use tokenizers::{PostProcessor as _, Tokenizer, TruncationDirection};

use crate::error::ServiceError;

/// Most inputs one request may embed (as OpenAI allows).
pub const MAX_INPUTS: usize = 2048;

pub struct EmbeddingRuntime {
    pub id: String,
    pub owned_by: String,
    pub created: i64,
    pub engine: EmbedEngine,
    /// The model's tokenizer with its file's padding and truncation
    /// settings removed (the service checks and truncates lengths itself).
    pub tokenizer: Arc<Tokenizer>,
}

/// A request's inputs, before tokenizing.
pub enum Inputs {
    Texts(Vec<String>),
    TokenIds(Vec<Vec<u32>>),
}

impl Inputs {
    pub fn len(&self) -> usize {
        match self {
            Self::Texts(t) => t.len(),
            Self::TokenIds(t) => t.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn invalid(field: &str, reason: &'static str, message: String) -> ServiceError {
    ServiceError::invalid(field, reason, message)
}

/// The service error for an engine refusal; inputs are the request's
/// `inputs` field.
pub fn embed_error(e: EmbedError) -> ServiceError {
    match e {
        EmbedError::NoInputs => invalid("inputs", "EMPTY_INPUT", "input must not be empty".into()),
        EmbedError::EmptyInput { index } => invalid(
            "inputs",
            "EMPTY_INPUT",
            format!("input {index} is empty; every input needs at least one token"),
        ),
        EmbedError::TooLong { index, len, max } => invalid(
            "inputs",
            "INPUT_TOO_LONG",
            format!(
                "input {index} has {len} tokens; this model's maximum is {max} (set truncate_prompt_tokens to truncate)"
            ),
        ),
        EmbedError::TokenOutOfVocab { index, id, vocab } => invalid(
            "inputs",
            "TOKEN_OUT_OF_VOCABULARY",
            format!("token id {id} in input {index} is out of the vocabulary (size {vocab})"),
        ),
        EmbedError::Dimensions(m) => invalid("dimensions", "INVALID_DIMENSIONS", m),
        EmbedError::QueueFull => ServiceError::Engine(gyre_engine::EngineError::QueueFull),
        EmbedError::Stopped => ServiceError::Engine(gyre_engine::EngineError::Stopped),
        EmbedError::Engine(e) => ServiceError::Engine(e),
    }
}

impl EmbeddingRuntime {
    /// Loads the tokenizer and the encoder (blocking).
    pub fn load(opts: EmbedOptions, served_name: Option<String>) -> anyhow::Result<Self> {
        let dir = opts.model_dir.clone();
        let load_err =
            |what: String| anyhow::anyhow!("cannot load model from {}: {what}", dir.display());
        let mut tokenizer = Tokenizer::from_file(dir.join("tokenizer.json"))
            .map_err(|e| load_err(format!("tokenizer.json: {e}")))?;
        tokenizer
            .with_truncation(None)
            .map_err(|e| load_err(format!("tokenizer.json: {e}")))?;
        tokenizer.with_padding(None);
        tracing::info!(model = %dir.display(), "loading embedding model");
        let engine = EmbedEngine::start(opts).map_err(|e| load_err(e.to_string()))?;
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        Ok(Self {
            id: served_name.unwrap_or_else(|| default_name(&dir)),
            owned_by: "gyre".into(),
            created,
            engine,
            tokenizer: Arc::new(tokenizer),
        })
    }

    /// The longest input the model takes, in tokens.
    pub fn max_len(&self) -> u32 {
        self.engine.info().max_seq_length
    }

    /// Token ids of every input, truncated as `truncate` asks (see
    /// `EmbedRequest.truncate_prompt_tokens`), and checked against the
    /// model. Blocking: tokenizes.
    pub fn prepare(
        &self,
        inputs: Inputs,
        truncate: Option<i32>,
        dimensions: Option<u32>,
    ) -> Result<Vec<Vec<u32>>, ServiceError> {
        if inputs.is_empty() {
            return Err(embed_error(EmbedError::NoInputs));
        }
        if inputs.len() > MAX_INPUTS {
            return Err(invalid(
                "inputs",
                "TOO_MANY_INPUTS",
                format!(
                    "at most {MAX_INPUTS} inputs may be embedded at once, got {}",
                    inputs.len()
                ),
            ));
        }
        let max = self.max_len();
        let limit = match truncate {
            None => None,
            Some(-1) => Some(max as usize),
            Some(k) if k >= 1 && k as u32 <= max => Some(k as usize),
            Some(k) => {
                return Err(invalid(
                    "truncate_prompt_tokens",
                    "OUT_OF_RANGE",
                    format!("truncate_prompt_tokens must be -1 or between 1 and {max}, got {k}"),
                ));
            }
        };
        let ids = match inputs {
            Inputs::TokenIds(lists) => lists
                .into_iter()
                .map(|mut ids| {
                    if let Some(k) = limit {
                        ids.truncate(k);
                    }
                    ids
                })
                .collect(),
            Inputs::Texts(texts) => {
                let added = self.special_tokens();
                if let Some(k) = limit.filter(|&k| k <= added) {
                    return Err(invalid(
                        "truncate_prompt_tokens",
                        "OUT_OF_RANGE",
                        format!(
                            "truncate_prompt_tokens {k} leaves no room for text beside the model's {added} special tokens"
                        ),
                    ));
                }
                texts
                    .iter()
                    .enumerate()
                    .map(|(i, t)| self.encode(i, t, limit))
                    .collect::<Result<Vec<_>, _>>()?
            }
        };
        self.engine
            .validate(&ids, dimensions)
            .map_err(embed_error)?;
        Ok(ids)
    }

    /// How many special tokens the tokenizer adds to one text.
    fn special_tokens(&self) -> usize {
        self.tokenizer
            .get_post_processor()
            .map_or(0, |p| p.added_tokens(false))
    }

    /// A text's ids with special tokens; over `limit` tokens, its content is
    /// cut so that the whole (special tokens included) is `limit` long, as
    /// the tokenizer's own right-side truncation does.
    fn encode(
        &self,
        index: usize,
        text: &str,
        limit: Option<usize>,
    ) -> Result<Vec<u32>, ServiceError> {
        if text.is_empty() {
            return Err(embed_error(EmbedError::EmptyInput { index }));
        }
        let tok_err = |e: tokenizers::Error| ServiceError::Internal(format!("tokenizer: {e}"));
        let full = self.tokenizer.encode(text, true).map_err(tok_err)?;
        let Some(k) = limit.filter(|&k| full.len() > k) else {
            return Ok(full.get_ids().to_vec());
        };
        let added = self.special_tokens();
        let mut content = self.tokenizer.encode(text, false).map_err(tok_err)?;
        content.truncate(k.saturating_sub(added), 0, TruncationDirection::Right);
        let cut = self
            .tokenizer
            .post_process(content, None, true)
            .map_err(tok_err)?;
        Ok(cut.get_ids().to_vec())
    }
}

/// The served name of a model directory: its name.
fn default_name(dir: &Path) -> String {
    dir.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "embedding-model".into())
}
