//! The tokenizer a GGUF carries in its `tokenizer.ggml.*` metadata, written
//! out as a HuggingFace `tokenizer.json` document, the same pipeline that
//! transformers builds from the file (`AutoTokenizer.from_pretrained(dir,
//! gguf_file=...)`), so token ids agree with it. Also the special tokens and
//! the chat template (`tokenizer.chat_template`).
//!
//! GPT-2 style byte-level BPE (`tokenizer.ggml.model = "gpt2"`) is built
//! here; SentencePiece-style vocabularies (`"llama"`) in [`super::spm`].
//! Any other tokenizer model is refused by name.

use serde_json::{Value as Json, json};

use super::{GgufFile, Value};

/// llama.cpp's token types (`tokenizer.ggml.token_type`).
pub(super) const CONTROL: i64 = 3;
pub(super) const USER_DEFINED: i64 = 4;

/// The vocabulary arrays of a GGUF's tokenizer.
pub(super) struct Vocab<'a> {
    pub tokens: Vec<&'a str>,
    /// One llama.cpp token type per token (1, normal, where the file has none).
    pub types: Vec<i64>,
    /// `tokenizer.ggml.scores`, if present.
    pub scores: Option<Vec<f64>>,
    /// `tokenizer.ggml.merges`, if present.
    pub merges: Option<Vec<&'a str>>,
}

impl<'a> Vocab<'a> {
    fn read(file: &'a GgufFile) -> Result<Self, String> {
        let tokens = strings(file, "tokenizer.ggml.tokens")?;
        let types: Vec<i64> = match file
            .get("tokenizer.ggml.token_type")
            .and_then(Value::as_array)
        {
            Some(a) => a
                .iter()
                .map(|v| match v {
                    Value::I32(t) => *t as i64,
                    other => other.as_u64().map_or(1, |t| t as i64),
                })
                .collect(),
            None => vec![1; tokens.len()],
        };
        if types.len() != tokens.len() {
            return Err(format!(
                "tokenizer.ggml.token_type has {} entries for {} tokens",
                types.len(),
                tokens.len()
            ));
        }
        let scores = match file.get("tokenizer.ggml.scores").and_then(Value::as_array) {
            Some(a) => {
                let s: Vec<f64> = a
                    .iter()
                    .map(|v| v.as_f64().ok_or("tokenizer.ggml.scores holds a non-number"))
                    .collect::<Result<_, _>>()?;
                if s.len() != tokens.len() {
                    return Err(format!(
                        "tokenizer.ggml.scores has {} entries for {} tokens",
                        s.len(),
                        tokens.len()
                    ));
                }
                Some(s)
            }
            None => None,
        };
        let merges = match file.get("tokenizer.ggml.merges") {
            Some(_) => Some(strings(file, "tokenizer.ggml.merges")?),
            None => None,
        };
        Ok(Self {
            tokens,
            types,
            scores,
            merges,
        })
    }
}

fn strings<'a>(file: &'a GgufFile, key: &str) -> Result<Vec<&'a str>, String> {
    file.get(key)
        .and_then(Value::as_array)
        .ok_or_else(|| format!("the GGUF has no {key}"))?
        .iter()
        .map(|v| {
            v.as_str()
                .ok_or_else(|| format!("{key} holds a non-string"))
        })
        .collect()
}

/// The tokenizer as `tokenizer.json` text.
pub fn tokenizer_json(file: &GgufFile) -> Result<String, String> {
    let model = file
        .get("tokenizer.ggml.model")
        .and_then(Value::as_str)
        .ok_or("the GGUF has no tokenizer.ggml.model")?;
    let doc = match model {
        "gpt2" => byte_level_bpe(&Vocab::read(file)?)?,
        "llama" => super::spm::tokenizer_json(file, &Vocab::read(file)?)?,
        other => {
            return Err(format!(
                "GGUF tokenizer model `{other}` is not supported (supported: gpt2, byte-level BPE; llama, SentencePiece-style)"
            ));
        }
    };
    serde_json::to_string(&doc).map_err(|e| e.to_string())
}

/// GPT-2 style byte-level BPE with the file's merges.
fn byte_level_bpe(v: &Vocab<'_>) -> Result<Json, String> {
    let tokens = &v.tokens;
    let types = &v.types;
    let merges = v
        .merges
        .as_ref()
        .ok_or("the GGUF has no tokenizer.ggml.merges")?;
    let vocab: serde_json::Map<String, Json> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| ((*t).to_owned(), json!(i)))
        .collect();
    let merges: Vec<Json> = merges
        .iter()
        .map(|m| {
            m.split_once(' ')
                .map(|(a, b)| json!([a, b]))
                .ok_or_else(|| format!("merge {m:?} is not two tokens"))
        })
        .collect::<Result<_, _>>()?;
    let added: Vec<Json> = tokens
        .iter()
        .zip(types)
        .enumerate()
        .filter(|(_, (_, t))| **t == CONTROL || **t == USER_DEFINED)
        .map(|(id, (content, t))| {
            json!({
                "id": id, "content": content, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": *t == CONTROL,
            })
        })
        .collect();
    let byte_level = |prefix: bool| json!({"type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": true, "use_regex": true});
    let doc = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": byte_level(false),
        "post_processor": byte_level(true),
        "decoder": byte_level(true),
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null,
            "continuing_subword_prefix": "", "end_of_word_suffix": "",
            "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": merges,
        },
    });
    Ok(doc)
}

/// The text of special token `key` (`bos`, `eos`, ...), if the file names one.
pub fn special_token(file: &GgufFile, key: &str) -> Option<String> {
    let id = file
        .get(&format!("tokenizer.ggml.{key}_token_id"))?
        .as_u64()?;
    let tokens = file.get("tokenizer.ggml.tokens")?.as_array()?;
    tokens.get(id as usize)?.as_str().map(str::to_owned)
}

/// The chat template the file carries.
pub fn chat_template(file: &GgufFile) -> Option<String> {
    file.get("tokenizer.chat_template")
        .and_then(Value::as_str)
        .map(str::to_owned)
}
