//! `--speculative-config`: vLLM's server flag for speculative decoding (a
//! JSON object with vLLM's key names), mapped onto what gyre runs:
//!
//! - `{"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max":
//!   N, "prompt_lookup_min": M}`: prompt-lookup decoding by default, K
//!   tokens a step (as `--prompt-lookup-tokens K`), n-grams from N down to
//!   M for requests that do not send `max_ngram_size`;
//! - `{"model": PATH, "num_speculative_tokens": K}` (`method` absent or
//!   `"draft_model"`): a draft model (as `--draft-model PATH`), K tokens a
//!   step by default instead of the model's generation_config.json.
//!
//! Anything else is refused with what gyre takes: another method (EAGLE,
//! Medusa, MTP, suffix decoding...), a key gyre does not read, a value out
//! of range. The result applies to the one model served, as
//! `--draft-model` does.

use serde_json::{Map, Value};

use super::spec::ModelSpec;

/// The keys gyre reads (vLLM's names).
const KEYS: [&str; 5] = [
    "method",
    "model",
    "num_speculative_tokens",
    "prompt_lookup_max",
    "prompt_lookup_min",
];

/// What gyre runs of a speculative config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpeculativeConfig {
    /// `method: ngram`: prompt lookup by default.
    Ngram {
        /// Tokens proposed per step.
        num_tokens: u32,
        /// Longest n-gram matched (`prompt_lookup_max`).
        max_ngram: u32,
        /// Shortest n-gram matched (`prompt_lookup_min`).
        min_ngram: u32,
    },
    /// A draft model (`model`).
    Draft {
        /// Its path (a GGUF file or HuggingFace directory).
        model: String,
        /// Tokens it proposes per step by default; None: the model's
        /// generation_config.json `num_assistant_tokens`, else 5.
        num_tokens: Option<u32>,
    },
}

/// A speculative config gyre cannot run, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--speculative-config: {0}")]
pub struct SpeculativeConfigError(pub String);

fn refuse<T>(message: impl Into<String>) -> Result<T, SpeculativeConfigError> {
    Err(SpeculativeConfigError(message.into()))
}

/// What gyre supports, for the errors.
const SUPPORTED: &str = "gyre runs `ngram` (prompt lookup: {\"method\": \"ngram\", \
     \"num_speculative_tokens\": K}) and `draft_model` (a draft model: {\"model\": PATH, \
     \"num_speculative_tokens\": K})";

/// A string value (null: absent).
fn string<'a>(
    obj: &'a Map<String, Value>,
    key: &str,
) -> Result<Option<&'a str>, SpeculativeConfigError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if !s.trim().is_empty() => Ok(Some(s.as_str())),
        Some(Value::String(_)) => refuse(format!("`{key}` must not be empty")),
        Some(other) => refuse(format!("`{key}` must be a string, got {other}")),
    }
}

/// A whole number from `lo` to `hi` (null: absent).
fn number(
    obj: &Map<String, Value>,
    key: &str,
    lo: u32,
    hi: u32,
) -> Result<Option<u32>, SpeculativeConfigError> {
    let Some(v) = obj.get(key).filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    match v.as_u64().and_then(|n| u32::try_from(n).ok()) {
        Some(n) if (lo..=hi).contains(&n) => Ok(Some(n)),
        _ => refuse(format!(
            "`{key}` must be a whole number from {lo} to {hi}, got {v}"
        )),
    }
}

impl SpeculativeConfig {
    /// Parses and checks the flag's JSON.
    pub fn parse(text: &str) -> Result<Self, SpeculativeConfigError> {
        let value: Value = serde_json::from_str(text)
            .map_err(|e| SpeculativeConfigError(format!("not JSON ({e}); {SUPPORTED}")))?;
        let Value::Object(obj) = value else {
            return refuse(format!("must be a JSON object; {SUPPORTED}"));
        };
        if let Some(key) = obj.keys().find(|k| !KEYS.contains(&k.as_str())) {
            return refuse(format!(
                "unknown key `{key}`; gyre reads method, model, num_speculative_tokens, \
                 prompt_lookup_max and prompt_lookup_min"
            ));
        }
        let method = string(&obj, "method")?;
        let model = string(&obj, "model")?;
        let max_tokens = gyre_engine::MAX_SPECULATIVE_TOKENS;
        let max_ngram = gyre_engine::MAX_NGRAM;
        let num_tokens = number(&obj, "num_speculative_tokens", 1, max_tokens)?;
        let lookup_max = number(&obj, "prompt_lookup_max", 1, max_ngram)?;
        let lookup_min = number(&obj, "prompt_lookup_min", 1, max_ngram)?;
        // vLLM also takes `"model": "ngram"` (or "[ngram]") for the method.
        let is_ngram = |s: &str| s == "ngram" || s == "[ngram]";
        let ngram = match (method, model) {
            (Some(m), _) if is_ngram(m) => {
                if let Some(path) = model.filter(|p| !is_ngram(p)) {
                    return refuse(format!(
                        "method `ngram` takes no `model` (got `{path}`); a draft model is \
                         method `draft_model`"
                    ));
                }
                true
            }
            (None, Some(m)) if is_ngram(m) => true,
            (Some("draft_model") | None, Some(_)) => false,
            (Some("draft_model"), None) => {
                return refuse(
                    "method `draft_model` needs `model`, the draft model's path (a GGUF file \
                     or HuggingFace directory with the model's vocabulary)",
                );
            }
            (None, None) => {
                return refuse(format!(
                    "names neither a `method` nor a draft `model`; {SUPPORTED}"
                ));
            }
            (Some(other), _) => {
                return refuse(format!("method `{other}` is not supported; {SUPPORTED}"));
            }
        };
        if !ngram {
            if let Some(key) = ["prompt_lookup_max", "prompt_lookup_min"]
                .into_iter()
                .find(|k| obj.get(*k).is_some_and(|v| !v.is_null()))
            {
                return refuse(format!(
                    "`{key}` applies to method `ngram`, not to a draft model"
                ));
            }
            return Ok(Self::Draft {
                model: model.unwrap_or_default().to_string(),
                num_tokens,
            });
        }
        let Some(num_tokens) = num_tokens else {
            return refuse(format!(
                "method `ngram` needs `num_speculative_tokens` (tokens proposed per step, 1 \
                 to {max_tokens})"
            ));
        };
        // vLLM's defaults (its SpeculativeConfig): with neither bound given
        // both are 5; with one given, the other takes its value.
        let (max, min) = match (lookup_max, lookup_min) {
            (None, None) => (5, 5),
            (Some(n), None) => (n, n),
            (None, Some(m)) => (m, m),
            (Some(n), Some(m)) => (n, m),
        };
        if min > max {
            return refuse(format!(
                "prompt_lookup_min ({min}) must be at most prompt_lookup_max ({max})"
            ));
        }
        Ok(Self::Ngram {
            num_tokens,
            max_ngram: max,
            min_ngram: min,
        })
    }

    /// Sets the speculation of the one model served (`specs`): refused with
    /// several models, or when the model's own keys set speculation too.
    pub fn apply(&self, specs: &mut [ModelSpec]) -> Result<(), SpeculativeConfigError> {
        let served = specs.len();
        let [only] = specs else {
            return refuse(format!(
                "applies to a single model, and {served} are served (give each its own \
                 `draft=` or `prompt_lookup=`)"
            ));
        };
        if let Some(key) = [
            ("draft", only.draft.is_some()),
            ("draft_tokens", only.draft_tokens.is_some()),
            ("prompt_lookup", only.prompt_lookup.is_some()),
        ]
        .into_iter()
        .find_map(|(k, set)| set.then_some(k))
        {
            return refuse(format!(
                "the model's `{key}` sets speculation too; give one or the other"
            ));
        }
        match self {
            Self::Ngram {
                num_tokens,
                max_ngram,
                min_ngram,
            } => {
                only.prompt_lookup = Some(*num_tokens);
                only.prompt_lookup_max = Some(*max_ngram);
                only.prompt_lookup_min = Some(*min_ngram);
            }
            Self::Draft { model, num_tokens } => {
                only.draft = Some(model.clone());
                only.draft_tokens = *num_tokens;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "speculative_tests.rs"]
mod tests;
