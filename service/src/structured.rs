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
