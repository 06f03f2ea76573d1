//! What a sentence-embedding model directory says about itself, read as
//! sentence-transformers reads it: `modules.json` (the module chain), the
//! pooling module's `config.json` (CLS, mean or last-token pooling),
//! `sentence_bert_config.json` (`max_seq_length`) and whether a `Normalize`
//! module ends the chain; plus the encoder's own `config.json`.

use std::path::Path;

use serde_json::Value;

use crate::EngineError;

/// How token states become one vector per input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The first token's state (`[CLS]`).
    Cls,
    /// The mean of every token's state.
    Mean,
    /// The last token's state.
    LastToken,
}

impl Pooling {
    pub fn name(self) -> &'static str {
        match self {
            Self::Cls => "cls",
            Self::Mean => "mean",
            Self::LastToken => "lasttoken",
        }
    }
}

/// The encoder's hyperparameters and the sentence-transformers settings.
#[derive(Debug, Clone)]
pub struct EncoderConfig {
    pub architecture: String,
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub num_layers: usize,
    pub num_heads: i64,
    pub intermediate_size: i64,
    pub max_position_embeddings: i64,
    pub type_vocab_size: i64,
    pub layer_norm_eps: f64,
    pub pooling: Pooling,
    pub normalize: bool,
    /// Longest input in tokens, special tokens included.
    pub max_seq_length: u32,
    /// The model was trained for truncated (Matryoshka) embeddings:
    /// config.json's `matryoshka_dimensions` or `is_matryoshka` (vLLM's
    /// names). Empty list with `true`: any size up to the full one.
    pub matryoshka: Option<Vec<u32>>,
}

/// The architectures the encoder runs.
pub const ENCODER_ARCHITECTURES: [&str; 1] = ["BertModel"];

fn load_err(path: &Path, reason: impl Into<String>) -> EngineError {
    EngineError::Load {
        path: path.display().to_string(),
        reason: reason.into(),
    }
}

fn read_json(path: &Path) -> Result<Option<Value>, EngineError> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| load_err(path, e.to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(load_err(path, e.to_string())),
    }
}

fn architecture(cfg: &Value) -> Option<&str> {
    cfg.get("architectures")?.as_array()?.first()?.as_str()
}

/// Whether `dir` holds a sentence-embedding model: a sentence-transformers
/// directory (`modules.json`) or a HuggingFace directory whose
/// `architectures[0]` is an encoder the engine runs.
pub fn is_embedding_model(dir: &Path) -> bool {
    if !dir.is_dir() {
        return false;
    }
    if dir.join("modules.json").is_file() {
        return true;
    }
    matches!(read_json(&dir.join("config.json")), Ok(Some(cfg))
        if architecture(&cfg).is_some_and(|a| ENCODER_ARCHITECTURES.contains(&a)))
}

fn int(cfg: &Value, key: &str, path: &Path) -> Result<i64, EngineError> {
    cfg.get(key)
        .and_then(Value::as_i64)
        .ok_or_else(|| load_err(path, format!("config.json lacks integer `{key}`")))
}

fn flag(cfg: &Value, key: &str) -> bool {
    cfg.get(key).and_then(Value::as_bool).unwrap_or(false)
}

/// The pooling of a sentence-transformers Pooling module's config.json:
/// exactly one of the CLS, mean and last-token modes (or the newer
/// `pooling_mode` string).
fn pooling(cfg: &Value, path: &Path) -> Result<Pooling, EngineError> {
    if let Some(mode) = cfg.get("pooling_mode").and_then(Value::as_str) {
        return match mode {
            "cls" => Ok(Pooling::Cls),
            "mean" => Ok(Pooling::Mean),
            "lasttoken" => Ok(Pooling::LastToken),
            other => Err(EngineError::Unsupported(format!("pooling mode `{other}`"))),
        };
    }
    let modes = [
        ("pooling_mode_cls_token", Some(Pooling::Cls)),
        ("pooling_mode_mean_tokens", Some(Pooling::Mean)),
        ("pooling_mode_lasttoken", Some(Pooling::LastToken)),
        ("pooling_mode_max_tokens", None),
        ("pooling_mode_mean_sqrt_len_tokens", None),
        ("pooling_mode_weightedmean_tokens", None),
    ];
    let on: Vec<_> = modes.iter().filter(|(k, _)| flag(cfg, k)).collect();
    match on.as_slice() {
        [(_, Some(p))] => Ok(*p),
        [(k, None)] => Err(EngineError::Unsupported(format!("pooling `{k}`"))),
        [] => Err(load_err(path, "no pooling mode is set")),
        _ => Err(EngineError::Unsupported(
            "several pooling modes at once".into(),
        )),
    }
}

impl EncoderConfig {
    /// Reads `dir`'s config.json and sentence-transformers files. Without
    /// `modules.json` the model pools the `[CLS]` state and normalizes it
    /// (vLLM's default for BERT embedding models).
    pub fn from_dir(dir: &Path) -> Result<Self, EngineError> {
        let cfg_path = dir.join("config.json");
        let cfg = read_json(&cfg_path)?.ok_or_else(|| load_err(&cfg_path, "missing"))?;
        let arch = architecture(&cfg).unwrap_or("").to_string();
        if !ENCODER_ARCHITECTURES.contains(&arch.as_str()) {
            return Err(EngineError::Unsupported(format!(
                "embedding model architecture `{arch}` (the encoder runs {})",
                ENCODER_ARCHITECTURES.join(", ")
            )));
        }
        let act = cfg
            .get("hidden_act")
            .and_then(Value::as_str)
            .unwrap_or("gelu");
        if act != "gelu" {
            return Err(EngineError::Unsupported(format!(
                "{arch} with hidden_act `{act}`"
            )));
        }
        let pos = cfg
            .get("position_embedding_type")
            .and_then(Value::as_str)
            .unwrap_or("absolute");
        if pos != "absolute" {
            return Err(EngineError::Unsupported(format!(
                "{arch} with position_embedding_type `{pos}`"
            )));
        }
        let (pooling, normalize) = modules(dir)?;
        let max_pos = int(&cfg, "max_position_embeddings", &cfg_path)?;
        let st_path = dir.join("sentence_bert_config.json");
        let max_seq = read_json(&st_path)?
            .and_then(|c| c.get("max_seq_length").and_then(Value::as_i64))
            .unwrap_or(max_pos)
            .clamp(1, max_pos);
        let matryoshka = match cfg.get("matryoshka_dimensions").and_then(Value::as_array) {
            Some(dims) => Some(
                dims.iter()
                    .filter_map(Value::as_u64)
                    .map(|d| d as u32)
                    .collect(),
            ),
            None if flag(&cfg, "is_matryoshka") => Some(Vec::new()),
            None => None,
        };
        Ok(Self {
            architecture: arch,
            vocab_size: int(&cfg, "vocab_size", &cfg_path)?,
            hidden_size: int(&cfg, "hidden_size", &cfg_path)?,
            num_layers: int(&cfg, "num_hidden_layers", &cfg_path)? as usize,
            num_heads: int(&cfg, "num_attention_heads", &cfg_path)?,
            intermediate_size: int(&cfg, "intermediate_size", &cfg_path)?,
            max_position_embeddings: max_pos,
            type_vocab_size: int(&cfg, "type_vocab_size", &cfg_path)?,
            layer_norm_eps: cfg
                .get("layer_norm_eps")
                .and_then(Value::as_f64)
                .unwrap_or(1e-12),
            pooling,
            normalize,
            max_seq_length: max_seq as u32,
            matryoshka,
        })
    }
}

/// Pooling and normalization from `modules.json`: a Transformer module at
/// the root, then a Pooling module, then optionally Normalize. Other modules
/// (Dense, ...) are refused rather than skipped.
fn modules(dir: &Path) -> Result<(Pooling, bool), EngineError> {
    let path = dir.join("modules.json");
    let Some(list) = read_json(&path)? else {
        return Ok((Pooling::Cls, true));
    };
    let list = list
        .as_array()
        .ok_or_else(|| load_err(&path, "not a list of modules"))?;
    let mut pool = None;
    let mut normalize = false;
    for m in list {
        let kind = m.get("type").and_then(Value::as_str).unwrap_or("");
        let sub = m.get("path").and_then(Value::as_str).unwrap_or("");
        match kind.rsplit('.').next().unwrap_or("") {
            "Transformer" if sub.is_empty() => {}
            "Pooling" => {
                let p = dir.join(sub).join("config.json");
                let cfg = read_json(&p)?.ok_or_else(|| load_err(&p, "missing"))?;
                pool = Some(pooling(&cfg, &p)?);
            }
            "Normalize" => normalize = true,
            _ => {
                return Err(EngineError::Unsupported(format!(
                    "sentence-transformers module `{kind}` (path `{sub}`)"
                )));
            }
        }
    }
    let pool = pool.ok_or_else(|| load_err(&path, "no Pooling module"))?;
    Ok((pool, normalize))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pooling_reads_each_mode_and_refuses_the_rest() {
        let p = Path::new("x");
        let one = |k: &str| json!({ k: true, "word_embedding_dimension": 8 });
        assert_eq!(
            pooling(&one("pooling_mode_cls_token"), p).ok(),
            Some(Pooling::Cls)
        );
        assert_eq!(
            pooling(&one("pooling_mode_mean_tokens"), p).ok(),
            Some(Pooling::Mean)
        );
        assert_eq!(
            pooling(&one("pooling_mode_lasttoken"), p).ok(),
            Some(Pooling::LastToken)
        );
        assert_eq!(
            pooling(&json!({"pooling_mode": "mean"}), p).ok(),
            Some(Pooling::Mean)
        );
        assert!(pooling(&one("pooling_mode_max_tokens"), p).is_err());
        assert!(pooling(&json!({}), p).is_err());
        assert!(
            pooling(
                &json!({"pooling_mode_cls_token": true, "pooling_mode_mean_tokens": true}),
                p
            )
            .is_err()
        );
    }
}
