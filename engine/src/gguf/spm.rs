//! SentencePiece-style GGUF vocabularies (`tokenizer.ggml.model = "llama"`):
//! the `tokenizer.json` pipeline transformers builds from such a file, so
//! that token ids, special tokens and decoding agree with it.
//!
//! transformers turns the vocabulary into a byte-fallback BPE whose merges
//! are recovered from the tokens themselves (every split of a token into
//! two tokens is a merge, ranked by the token's score), or taken from
//! `tokenizer.ggml.merges` when the file has them. Three flavours, picked by
//! `general.architecture` as transformers picks them:
//! - Gemma (`gemma`, `gemma2`, `gemma3`): spaces become `▁` in a normalizer,
//!   no prefix space; tokens of two or more real spaces are respelled with
//!   `▁`, and merges are ranked by position in the file, not by score.
//! - Phi-3 (`phi3`): a normalizer prepends `▁` and turns spaces into `▁`.
//! - anything else: Llama's `Metaspace` pre-tokenizer (prefix `▁` on the
//!   first piece only) and a decoder that strips that one leading space.
//!
//! Added tokens: control tokens (special), user-defined tokens whose text
//! is in the vocabulary (not special), and the BOS/EOS/UNK/PAD tokens the
//! file names (special). BOS and EOS are added to encodings as
//! `tokenizer.ggml.add_bos_token` (default true) and `add_eos_token`
//! (default false) say.

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap};

use serde_json::{Value as Json, json};

use super::tokenizer::{CONTROL, USER_DEFINED, Vocab};
use super::{GgufFile, Value};

/// Which of transformers' SentencePiece builders a file gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Flavour {
    Llama,
    Phi3,
    Gemma,
}

impl Flavour {
    /// The flavour transformers uses for architecture `arch`.
    pub(super) fn for_architecture(arch: &str) -> Self {
        match arch {
            "gemma" | "gemma2" | "gemma3" => Flavour::Gemma,
            "phi3" => Flavour::Phi3,
            _ => Flavour::Llama,
        }
    }
}

/// Python's `str.isspace` (Unicode White_Space plus the four ASCII
/// separators U+001C..U+001F), which decides Gemma's respelling.
fn py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Gemma files store tokens of whitespace that include a space with real
/// spaces; the tokenizer looks them up as one `▁` per character.
fn respell_gemma(token: &str) -> String {
    if token.contains(' ') && token.chars().all(py_space) {
        "\u{2581}".repeat(token.chars().count())
    } else {
        token.to_owned()
    }
}

/// Merges implied by a vocabulary: for each distinct token (first
/// occurrence order, last score), every split into two tokens of the
/// vocabulary, ordered by the parts' ids; then all of them by score, left
/// length and right length, highest first, ties kept in that order.
/// `vocab` maps each token to its last index, as a Python dict would.
fn merges_from_vocab<'a>(
    tokens: &[&'a str],
    scores: &[f64],
    vocab: &HashMap<&'a str, usize>,
) -> Vec<(&'a str, &'a str)> {
    let mut score_of: HashMap<&str, f64> = HashMap::with_capacity(tokens.len());
    let mut order: Vec<&str> = Vec::with_capacity(tokens.len());
    for (t, s) in tokens.iter().zip(scores) {
        if score_of.insert(t, *s).is_none() {
            order.push(t);
        }
    }
    let mut merges: Vec<(&str, &str, f64, usize, usize)> = Vec::new();
    for token in order {
        let score = score_of[token];
        let mut local: Vec<(&str, &str, usize, usize)> = token
            .char_indices()
            .skip(1)
            .filter_map(|(at, _)| {
                let (l, r) = token.split_at(at);
                Some((l, r, *vocab.get(l)?, *vocab.get(r)?))
            })
            .collect();
        local.sort_by_key(|&(_, _, a, b)| (a, b));
        merges.extend(
            local
                .into_iter()
                .map(|(l, r, _, _)| (l, r, score, l.chars().count(), r.chars().count())),
        );
    }
    merges.sort_by(|a, b| {
        b.2.partial_cmp(&a.2)
            .unwrap_or(Ordering::Equal)
            .then(b.3.cmp(&a.3))
            .then(b.4.cmp(&a.4))
    });
    merges.into_iter().map(|(l, r, ..)| (l, r)).collect()
}

fn flag(file: &GgufFile, key: &str, default: bool) -> bool {
    file.get(key).and_then(Value::as_bool).unwrap_or(default)
}

/// `TemplateProcessing` adding BOS and/or EOS around each sequence.
fn post_processor(bos: Option<(&str, usize)>, eos: Option<(&str, usize)>) -> Json {
    let special = |(text, _): (&str, usize), type_id: u32| json!({"SpecialToken": {"id": text, "type_id": type_id}});
    let seq = |id: &str, type_id: u32| json!({"Sequence": {"id": id, "type_id": type_id}});
    let mut single = Vec::new();
    let mut pair = Vec::new();
    for (name, type_id, out) in [("A", 0, &mut single), ("B", 1, &mut pair)] {
        out.extend(bos.map(|t| special(t, type_id)));
        out.push(seq(name, type_id));
        out.extend(eos.map(|t| special(t, type_id)));
    }
    let pair: Vec<Json> = single.iter().cloned().chain(pair).collect();
    let mut tokens = serde_json::Map::new();
    for (text, id) in bos.into_iter().chain(eos) {
        tokens.insert(
            text.to_owned(),
            json!({"id": text, "ids": [id], "tokens": [text]}),
        );
    }
    json!({"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": tokens})
}

/// The `tokenizer.json` document for a SentencePiece-style vocabulary.
pub(super) fn tokenizer_json(file: &GgufFile, vocab_in: &Vocab<'_>) -> Result<Json, String> {
    let arch = file
        .get("general.architecture")
        .and_then(Value::as_str)
        .unwrap_or("llama");
    let flavour = Flavour::for_architecture(arch);
    let original = &vocab_in.tokens;
    let respelled: Vec<String> = match flavour {
        Flavour::Gemma => original.iter().map(|t| respell_gemma(t)).collect(),
        _ => original.iter().map(|t| (*t).to_owned()).collect(),
    };
    let tokens: Vec<&str> = respelled.iter().map(String::as_str).collect();
    let mut vocab: HashMap<&str, usize> = HashMap::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        vocab.insert(t, i);
    }
    let merges: Vec<(&str, &str)> = match &vocab_in.merges {
        Some(m) => m
            .iter()
            .map(|m| {
                m.split_once(' ')
                    .ok_or_else(|| format!("merge {m:?} is not two tokens"))
            })
            .collect::<Result<_, _>>()?,
        None => {
            let scores: Vec<f64> = match flavour {
                // Gemma's scores do not follow its merge order; its file order does.
                Flavour::Gemma => (0..tokens.len()).map(|i| -(i as f64)).collect(),
                _ => vocab_in.scores.clone().ok_or(
                    "the GGUF has neither tokenizer.ggml.merges nor tokenizer.ggml.scores",
                )?,
            };
            merges_from_vocab(&tokens, &scores, &vocab)
        }
    };

    // Added tokens, by id: control and named special tokens are special;
    // user-defined tokens only when their (original) text is in the vocabulary.
    let mut added: BTreeMap<usize, (&str, bool)> = BTreeMap::new();
    for (id, (text, kind)) in original.iter().zip(&vocab_in.types).enumerate() {
        if *kind == CONTROL {
            added.insert(id, (text, true));
        }
    }
    for (id, (text, kind)) in original.iter().zip(&vocab_in.types).enumerate() {
        if *kind == USER_DEFINED && vocab.contains_key(text) && !added.contains_key(&id) {
            added.insert(id, (text, false));
        }
    }
    let named = |key: &str| -> Option<(&str, usize)> {
        let id = file
            .get(&format!("tokenizer.ggml.{key}_token_id"))?
            .as_u64()?;
        let text = *original.get(usize::try_from(id).ok()?)?;
        Some((text, id as usize))
    };
    for key in ["bos", "eos", "unknown", "padding"] {
        if let Some((text, id)) = named(key) {
            added.insert(id, (text, true));
        }
    }
    // The id an added or vocabulary token resolves to (an added token wins).
    let id_of = |text: &str, id: usize| -> usize {
        added
            .iter()
            .find(|(_, (t, _))| *t == text)
            .map(|(i, _)| *i)
            .or_else(|| vocab.get(text).copied())
            .unwrap_or(id)
    };
    let bos = named("bos")
        .filter(|_| flag(file, "tokenizer.ggml.add_bos_token", true))
        .map(|(t, id)| (t, id_of(t, id)));
    let eos = named("eos")
        .filter(|_| flag(file, "tokenizer.ggml.add_eos_token", false))
        .map(|(t, id)| (t, id_of(t, id)));
    let added: Vec<Json> = added
        .iter()
        .map(|(id, (content, special))| {
            json!({
                "id": id, "content": content, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": special,
            })
        })
        .collect();

    let replace = |from: &str, to: &str| json!({"type": "Replace", "pattern": {"String": from}, "content": to});
    let mut decoders = vec![
        replace("\u{2581}", " "),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    let (normalizer, pre_tokenizer, unk) = match flavour {
        Flavour::Gemma => (
            replace(" ", "\u{2581}"),
            json!({"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": false}),
            json!("<unk>"),
        ),
        Flavour::Phi3 => (
            json!({"type": "Sequence", "normalizers": [
                {"type": "Prepend", "prepend": "\u{2581}"},
                replace(" ", "\u{2581}"),
            ]}),
            Json::Null,
            Json::Null,
        ),
        Flavour::Llama => (
            Json::Null,
            json!({"type": "Metaspace", "replacement": "\u{2581}", "prepend_scheme": "first", "split": false}),
            Json::Null,
        ),
    };
    if flavour != Flavour::Gemma {
        decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
    }
    let vocab_json: serde_json::Map<String, Json> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| ((*t).to_owned(), json!(i)))
        .collect();
    let merges: Vec<Json> = merges.iter().map(|(a, b)| json!([a, b])).collect();
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor(bos, eos),
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": unk,
            "continuing_subword_prefix": null, "end_of_word_suffix": null,
            "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
            "vocab": vocab_json, "merges": merges,
        },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_follow_scores_then_lengths_with_ties_in_vocabulary_order() {
        let tokens = ["a", "b", "c", "ab", "bc", "abc", "ca"];
        let vocab: HashMap<&str, usize> = tokens.iter().enumerate().map(|(i, t)| (*t, i)).collect();
        let scores = [0.0, 0.0, 0.0, -1.0, -2.0, -1.0, -1.0];
        let got = merges_from_vocab(&tokens, &scores, &vocab);
        // Score -1 first: "abc" as ab+c (left 2) then a+bc (right 2), then
        // the tie a+b / c+a in vocabulary order; score -2 last.
        assert_eq!(
            got,
            vec![("ab", "c"), ("a", "bc"), ("a", "b"), ("c", "a"), ("b", "c")]
        );
    }

    #[test]
    fn gemma_respells_only_whitespace_tokens_with_a_space() {
        assert_eq!(respell_gemma("  "), "\u{2581}\u{2581}");
        assert_eq!(respell_gemma(" \t"), "\u{2581}\u{2581}");
        assert_eq!(respell_gemma("\n\n"), "\n\n");
        assert_eq!(respell_gemma(" a"), " a");
        assert_eq!(respell_gemma(" \u{1c}"), "\u{2581}\u{2581}");
    }
}
