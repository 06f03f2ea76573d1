//! Structured outputs: compiles a request's `StructuredOutput` into an
//! llguidance matcher for the engine to apply, against a token trie built
//! once per model from its tokenizer.json.

use std::sync::Arc;

use gyre_api::v1::{self, structured_output::Kind};
use gyre_engine::llguidance::api::TopLevelGrammar;
use gyre_engine::llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use gyre_engine::llguidance::{Matcher, ParserFactory};
use gyre_engine::{Constraint, ModelInfo};
use serde_json::{Value, json};

use crate::compact::compact;
use crate::error::ServiceError;

/// A model's grammar compiler.
pub struct Grammars {
    factory: ParserFactory,
}

impl Grammars {
    /// Builds the token trie from the model directory's tokenizer.json; the
    /// vocabulary is the model's (ids past the tokenizer's are never allowed).
    pub fn load(tokenizer_json: &str, info: &ModelInfo) -> anyhow::Result<Self> {
        let tj: Value = serde_json::from_str(tokenizer_json)?;
        check_byte_tokens(&tj)?;
        let mut words = gyre_engine::llguidance::token_bytes_from_tokenizer_json(&tj)?;
        let vocab = (info.vocab_size as usize).max(words.len());
        words.resize(vocab, Vec::new());
        let eos = info.eos_token_ids.first().copied().unwrap_or(0);
        let mut rx = TokRxInfo::new(vocab as u32, eos);
        rx.tok_bos = info.bos_token_id;
        let trie = TokTrie::from(&rx, &words);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env)?;
        factory.quiet();
        Ok(Self { factory })
    }

    /// The constraint for a request's structure; 400 naming `structured`
    /// when it is invalid or unsupported.
    pub fn compile(&self, s: &v1::StructuredOutput) -> Result<Option<Constraint>, ServiceError> {
        let invalid = |msg: String| ServiceError::invalid("structured", "INVALID_STRUCTURE", msg);
        let grammar = match &s.kind {
            None => return Ok(None),
            Some(Kind::JsonObject(false)) => return Ok(None),
            Some(Kind::JsonObject(true)) => {
                TopLevelGrammar::from_json_schema(compact(json!({"type": "object"})))
            }
            Some(Kind::JsonSchema(text)) => {
                let schema: Value = serde_json::from_str(text).map_err(|e| {
                    invalid(format!(
                        "the JSON schema is not valid JSON: {}",
                        gyre_api::clip(&e.to_string())
                    ))
                })?;
                if !schema.is_object() && !schema.is_boolean() {
                    return Err(invalid("the JSON schema must be an object".into()));
                }
                TopLevelGrammar::from_json_schema(compact(schema))
            }
            Some(Kind::Regex(rx)) => TopLevelGrammar::from_regex(rx),
            Some(Kind::Grammar(lark)) => TopLevelGrammar::from_lark(lark.clone()),
            Some(Kind::Choice(c)) => {
                if c.options.is_empty() {
                    return Err(invalid("a choice needs at least one option".into()));
                }
                let alts: Vec<String> = c
                    .options
                    .iter()
                    .map(|o| serde_json::to_string(o).unwrap_or_default())
                    .collect();
                TopLevelGrammar::from_lark(format!("start: {}", alts.join(" | ")))
            }
        };
        let parser = self.factory.create_parser(grammar).map_err(|e| {
            invalid(format!(
                "unsupported or invalid structure: {}",
                gyre_api::clip(&e.to_string())
            ))
        })?;
        Ok(Some(Constraint::new(Matcher::new(Ok(parser)))))
    }
}

/// Refuses a byte-fallback vocabulary with a token that looks like a byte
/// token (`<0x..>`) but is not exactly `<0xHH>`: llguidance's reader
/// asserts on such tokens, which would abort the server at load.
fn check_byte_tokens(tj: &Value) -> anyhow::Result<()> {
    let decoders = tj["decoder"]["decoders"].as_array();
    let byte_fallback = tj["decoder"]["type"].as_str() == Some("Sequence")
        && decoders.is_some_and(|d| d.iter().any(|d| d["type"] == "ByteFallback"));
    let Some(vocab) = tj["model"]["vocab"].as_object().filter(|_| byte_fallback) else {
        return Ok(());
    };
    let is_byte = |t: &str| {
        t.len() == 6 && t.ends_with('>') && t[3..5].bytes().all(|b| b.is_ascii_hexdigit())
    };
    match vocab.keys().find(|t| t.starts_with("<0x") && !is_byte(t)) {
        Some(t) => anyhow::bail!(
            "token {:?} looks like a byte token but is not one (<0xHH>)",
            gyre_api::clip(t)
        ),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn byte_fallback_tokenizer(extra: &str) -> Value {
        json!({
            "added_tokens": [],
            "decoder": {"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
                {"type": "ByteFallback"}
            ]},
            "model": {"type": "BPE", "vocab": {"<0x41>": 0, "a": 1, (extra): 2}}
        })
    }

    /// A token such as `<0x1234>` or `<0xZZ>` in a byte-fallback vocabulary
    /// is an error (structured outputs off), not a panic at load.
    #[test]
    fn malformed_byte_tokens_are_an_error() {
        let info = ModelInfo {
            architecture: String::new(),
            vocab_size: 3,
            max_model_len: 16,
            kv_capacity_tokens: 16,
            eos_token_ids: vec![1],
            bos_token_id: None,
            default_sampling: Default::default(),
            device: "cpu".into(),
            dtype: "Float".into(),
            draft_model: None,
        };
        for bad in ["<0x1234>", "<0xZZ>", "<0x4"] {
            let tj = byte_fallback_tokenizer(bad).to_string();
            let err = Grammars::load(&tj, &info).err().expect("refused");
            assert!(err.to_string().contains("byte token"), "{bad}: {err}");
        }
        let ok = byte_fallback_tokenizer("b").to_string();
        assert!(Grammars::load(&ok, &info).is_ok());
    }
}
