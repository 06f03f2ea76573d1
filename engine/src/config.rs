//! The model's `config.json` and `generation_config.json`, read into the
//! numbers every decoder family shares (sizes, rope, ids, sampling
//! defaults). A family reads its own extra fields from [`ModelConfig::raw`]
//! and refuses the ones it does not implement.
//!
//! Both the transformers 4.x layout (`rope_theta`, `rope_scaling`) and the 5.x
//! layout (`rope_parameters`) are accepted.

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use crate::EngineError;

/// Rope scaling as in Llama 3.1 (`rope_type: "llama3"`).
#[derive(Debug, Clone, PartialEq)]
pub struct Llama3Scaling {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position_embeddings: f64,
}

/// Rope scaling as in Phi-3 (`rope_type: "longrope"`, formerly `su`): one
/// rescaling factor per rotary frequency, `short_factor` for sequences up
/// to `original_max_position_embeddings` and `long_factor` beyond, and
/// cos/sin multiplied by `attention_factor`.
#[derive(Debug, Clone, PartialEq)]
pub struct LongRopeScaling {
    pub short_factor: Vec<f64>,
    pub long_factor: Vec<f64>,
    pub original_max_position_embeddings: i64,
    /// `attention_factor`, or as transformers derives it from `factor`
    /// (else `max_position_embeddings / original_max_position_embeddings`).
    pub attention_factor: f64,
}

/// How rotary frequencies are scaled (`rope_scaling.rope_type`).
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// `default` (or no `rope_scaling`).
    None,
    /// `linear`: positions divided by `factor`.
    Linear { factor: f64 },
    /// `llama3`: Llama 3.1's frequency-dependent scaling.
    Llama3(Llama3Scaling),
    /// `longrope`: Phi-3's short and long per-frequency factors.
    LongRope(LongRopeScaling),
}

/// The hyperparameters of a decoder-only model, as far as they are common
/// to the families.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    /// e.g. "LlamaForCausalLM".
    pub architecture: String,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_layers: i64,
    pub num_heads: i64,
    pub num_kv_heads: i64,
    pub head_dim: i64,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: RopeScaling,
    /// Fraction of each head's dimensions that rotary embeddings rotate
    /// (`partial_rotary_factor`; 1.0 when absent).
    pub partial_rotary_factor: f64,
    pub max_position_embeddings: i64,
    pub vocab_size: i64,
    pub tie_word_embeddings: bool,
    /// `hidden_act` (e.g. "silu").
    pub hidden_act: String,
    /// The whole `config.json`, for the fields only one family reads
    /// (empty for a GGUF checkpoint).
    pub raw: Value,
    /// EOS ids from generation_config.json (or config.json as a fallback).
    pub eos_token_ids: Vec<u32>,
    pub bos_token_id: Option<u32>,
    /// Sampling defaults from generation_config.json.
    pub default_temperature: Option<f32>,
    pub default_top_p: Option<f32>,
    pub default_top_k: Option<u32>,
    pub default_min_p: Option<f32>,
    pub default_repetition_penalty: Option<f32>,
}

#[derive(Deserialize)]
struct RawConfig {
    hidden_size: i64,
    intermediate_size: i64,
    num_hidden_layers: i64,
    num_attention_heads: i64,
    num_key_value_heads: Option<i64>,
    head_dim: Option<i64>,
    #[serde(default = "default_eps")]
    rms_norm_eps: f64,
    rope_theta: Option<f64>,
    rope_scaling: Option<Value>,
    rope_parameters: Option<Value>,
    #[serde(default = "default_max_pos")]
    max_position_embeddings: i64,
    vocab_size: i64,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default = "default_act")]
    hidden_act: String,
    partial_rotary_factor: Option<f64>,
    bos_token_id: Option<Value>,
    eos_token_id: Option<Value>,
}

fn default_eps() -> f64 {
    1e-6
}
fn default_max_pos() -> i64 {
    2048
}
fn default_act() -> String {
    "silu".into()
}

#[derive(Deserialize, Default)]
struct RawGenerationConfig {
    bos_token_id: Option<Value>,
    eos_token_id: Option<Value>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<u32>,
    min_p: Option<f32>,
    repetition_penalty: Option<f32>,
    do_sample: Option<bool>,
}

fn ids(v: &Option<Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_u64())
            .map(|x| x as u32)
            .collect(),
        _ => vec![],
    }
}

fn load_err(dir: &Path, reason: impl Into<String>) -> EngineError {
    EngineError::Load {
        path: dir.display().to_string(),
        reason: reason.into(),
    }
}

impl ModelConfig {
    /// Reads `config.json` (required) and `generation_config.json` (optional).
    pub fn from_dir(dir: &Path) -> Result<Self, EngineError> {
        let text = std::fs::read_to_string(dir.join("config.json"))
            .map_err(|e| load_err(dir, format!("config.json: {e}")))?;
        let value: Value =
            serde_json::from_str(&text).map_err(|e| load_err(dir, format!("config.json: {e}")))?;
        // The architecture first: a family the engine lacks is named as
        // such, not as a missing field of its config.
        let architecture = value
            .get("architectures")
            .and_then(|a| a.get(0))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        crate::models::check_supported(&architecture, value.get("model_type"))?;
        let raw: RawConfig = serde_json::from_value(value.clone())
            .map_err(|e| load_err(dir, format!("config.json: {e}")))?;
        let gen_cfg: RawGenerationConfig =
            match std::fs::read_to_string(dir.join("generation_config.json")) {
                Ok(t) => serde_json::from_str(&t)
                    .map_err(|e| load_err(dir, format!("generation_config.json: {e}")))?,
                Err(_) => RawGenerationConfig::default(),
            };
        if raw.num_attention_heads <= 0 || raw.hidden_size % raw.num_attention_heads != 0 {
            return Err(load_err(
                dir,
                "hidden_size must be a multiple of num_attention_heads",
            ));
        }
        let num_kv_heads = raw.num_key_value_heads.unwrap_or(raw.num_attention_heads);
        if num_kv_heads <= 0 || raw.num_attention_heads % num_kv_heads != 0 {
            return Err(load_err(
                dir,
                "num_attention_heads must be a multiple of num_key_value_heads",
            ));
        }
        // transformers 5 moved rope settings into `rope_parameters`.
        let rope = raw.rope_parameters.as_ref().or(raw.rope_scaling.as_ref());
        let rope_theta = raw
            .rope_theta
            .or_else(|| raw.rope_parameters.as_ref()?.get("rope_theta")?.as_f64())
            .unwrap_or(10_000.0);
        let rope_scaling = parse_scaling(dir, rope, &value, raw.max_position_embeddings)?;
        let mut eos = ids(&gen_cfg.eos_token_id);
        if eos.is_empty() {
            eos = ids(&raw.eos_token_id);
        }
        let bos = ids(&gen_cfg.bos_token_id)
            .first()
            .copied()
            .or_else(|| ids(&raw.bos_token_id).first().copied());
        let sampling = gen_cfg.do_sample.unwrap_or(true);
        Ok(Self {
            architecture,
            hidden_size: raw.hidden_size,
            intermediate_size: raw.intermediate_size,
            num_layers: raw.num_hidden_layers,
            num_heads: raw.num_attention_heads,
            num_kv_heads,
            head_dim: raw
                .head_dim
                .unwrap_or(raw.hidden_size / raw.num_attention_heads),
            rms_norm_eps: raw.rms_norm_eps,
            rope_theta,
            rope_scaling,
            partial_rotary_factor: raw.partial_rotary_factor.unwrap_or(1.0),
            max_position_embeddings: raw.max_position_embeddings,
            vocab_size: raw.vocab_size,
            tie_word_embeddings: raw.tie_word_embeddings,
            hidden_act: raw.hidden_act,
            raw: value,
            eos_token_ids: eos,
            bos_token_id: bos,
            // A generation config that says do_sample=false means greedy.
            default_temperature: if sampling {
                gen_cfg.temperature
            } else {
                Some(0.0)
            },
            default_top_p: gen_cfg.top_p,
            default_top_k: gen_cfg.top_k,
            default_min_p: gen_cfg.min_p,
            default_repetition_penalty: gen_cfg.repetition_penalty,
        })
    }
}

fn parse_scaling(
    dir: &Path,
    v: Option<&Value>,
    config: &Value,
    max_positions: i64,
) -> Result<RopeScaling, EngineError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(RopeScaling::None);
    };
    let kind = v
        .get("rope_type")
        .or_else(|| v.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    match kind {
        "default" => Ok(RopeScaling::None),
        "linear" => Ok(RopeScaling::Linear {
            factor: v
                .get("factor")
                .and_then(Value::as_f64)
                .ok_or_else(|| load_err(dir, "rope scaling linear needs factor"))?,
        }),
        "llama3" => {
            let f = |k: &str| {
                v.get(k)
                    .and_then(Value::as_f64)
                    .ok_or_else(|| load_err(dir, format!("rope scaling llama3 needs {k}")))
            };
            Ok(RopeScaling::Llama3(Llama3Scaling {
                factor: f("factor")?,
                low_freq_factor: f("low_freq_factor")?,
                high_freq_factor: f("high_freq_factor")?,
                original_max_position_embeddings: f("original_max_position_embeddings")?,
            }))
        }
        "longrope" | "su" => parse_longrope(dir, v, config, max_positions),
        other => Err(EngineError::Unsupported(format!(
            "rope scaling type {other:?} (supported: default, linear, llama3, longrope)"
        ))),
    }
}

/// Reads `longrope` scaling as transformers' `_compute_longrope_parameters`
/// does: `original_max_position_embeddings` from the rope settings or the
/// top level of config.json, the attention factor given or derived from
/// `factor` (or the ratio of the two maximum lengths).
fn parse_longrope(
    dir: &Path,
    v: &Value,
    config: &Value,
    max_positions: i64,
) -> Result<RopeScaling, EngineError> {
    let factors = |k: &str| -> Result<Vec<f64>, EngineError> {
        v.get(k)
            .and_then(Value::as_array)
            .and_then(|a| a.iter().map(Value::as_f64).collect::<Option<Vec<_>>>())
            .ok_or_else(|| load_err(dir, format!("rope scaling longrope needs {k} (numbers)")))
    };
    let original = v
        .get("original_max_position_embeddings")
        .or_else(|| config.get("original_max_position_embeddings"))
        .and_then(Value::as_i64)
        .filter(|&n| n > 0)
        .ok_or_else(|| {
            load_err(
                dir,
                "rope scaling longrope needs original_max_position_embeddings",
            )
        })?;
    let factor = v
        .get("factor")
        .and_then(Value::as_f64)
        .unwrap_or(max_positions as f64 / original as f64);
    let attention_factor = match v.get("attention_factor").and_then(Value::as_f64) {
        Some(a) => a,
        None if factor <= 1.0 => 1.0,
        None => (1.0 + factor.ln() / (original as f64).ln()).sqrt(),
    };
    Ok(RopeScaling::LongRope(LongRopeScaling {
        short_factor: factors("short_factor")?,
        long_factor: factors("long_factor")?,
        original_max_position_embeddings: original,
        attention_factor,
    }))
}
