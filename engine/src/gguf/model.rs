//! A GGUF checkpoint as the engine's model inputs: the [`ModelConfig`] read
//! from the architecture's metadata keys, and the weights, dequantized to
//! f32 and renamed to the HuggingFace names the model code loads.
//!
//! llama.cpp's converter permutes the rows of Llama's q and k projections
//! (to interleave each head's rotary halves); this undoes it, as
//! transformers' GGUF loader does, so the weights are the checkpoint's own.
//! For Gemma 3 it adds one to every norm weight (llama.cpp's RMSNorm has no
//! `1 + w`); this takes it off again, as transformers does.

use std::collections::HashMap;

use tch::Tensor;

use super::{GgmlType, GgufError, GgufFile, TensorInfo, Value};
use crate::EngineError;
use crate::config::ModelConfig;
use crate::progress::Load;
use crate::quant::{Format, QuantRows};

/// GGUF architectures (`general.architecture`) the engine can run.
pub const SUPPORTED: &[&str] = &["llama", "gemma3"];

fn load_err(file: &GgufFile, reason: impl Into<String>) -> EngineError {
    EngineError::Load {
        path: file.path().display().to_string(),
        reason: reason.into(),
    }
}

impl From<GgufError> for EngineError {
    fn from(e: GgufError) -> Self {
        EngineError::Load {
            path: "GGUF".into(),
            reason: e.to_string(),
        }
    }
}

/// The model configuration from `file`'s metadata.
pub fn config(file: &GgufFile) -> Result<ModelConfig, EngineError> {
    let arch = file
        .get("general.architecture")
        .and_then(Value::as_str)
        .ok_or_else(|| load_err(file, "no general.architecture"))?;
    if !SUPPORTED.contains(&arch) {
        return Err(EngineError::Unsupported(format!(
            "GGUF architecture `{arch}` ({}); supported GGUF architectures: {}",
            file.path().display(),
            SUPPORTED.join(", ")
        )));
    }
    let key = |k: &str| format!("{arch}.{k}");
    let int = |k: &str| -> Result<i64, EngineError> {
        file.get(&key(k))
            .and_then(Value::as_u64)
            .map(|v| v as i64)
            .ok_or_else(|| load_err(file, format!("missing or invalid {}", key(k))))
    };
    let float = |k: &str| file.get(&key(k)).and_then(Value::as_f64);
    if let Some(kind) = file.get(&key("rope.scaling.type")).and_then(Value::as_str)
        && kind != "none"
    {
        return Err(EngineError::Unsupported(format!(
            "GGUF rope scaling `{kind}` is not supported yet"
        )));
    }
    if file.tensor("rope_freqs.weight").is_ok() {
        return Err(EngineError::Unsupported(
            "GGUF with a rope_freqs tensor (Llama 3.1-style rope scaling) is not supported yet"
                .into(),
        ));
    }
    let hidden = int("embedding_length")?;
    let heads = int("attention.head_count")?;
    let kv_heads = int("attention.head_count_kv").unwrap_or(heads);
    if heads <= 0 || hidden % heads != 0 || kv_heads <= 0 || heads % kv_heads != 0 {
        return Err(load_err(file, "inconsistent head counts"));
    }
    let tokens = file
        .get("tokenizer.ggml.tokens")
        .and_then(Value::as_array)
        .map(<[Value]>::len);
    let vocab = int("vocab_size")
        .ok()
        .or(tokens.map(|n| n as i64))
        .ok_or_else(|| load_err(file, "no vocabulary size"))?;
    let token_id = |k: &str| {
        file.get(&format!("tokenizer.ggml.{k}"))
            .and_then(Value::as_u64)
            .map(|v| v as u32)
    };
    let gemma3 = arch == "gemma3";
    Ok(ModelConfig {
        architecture: if gemma3 {
            "Gemma3ForCausalLM"
        } else {
            "LlamaForCausalLM"
        }
        .into(),
        hidden_size: hidden,
        intermediate_size: int("feed_forward_length")?,
        num_layers: int("block_count")?,
        num_heads: heads,
        num_kv_heads: kv_heads,
        head_dim: int("attention.key_length").unwrap_or(hidden / heads),
        rms_norm_eps: float("attention.layer_norm_rms_epsilon").unwrap_or(1e-6),
        rope_theta: float("rope.freq_base").unwrap_or(10_000.0),
        rope_scaling: crate::config::RopeScaling::None,
        partial_rotary_factor: 1.0,
        max_position_embeddings: int("context_length").unwrap_or(2048),
        vocab_size: vocab,
        tie_word_embeddings: file.tensor("output.weight").is_err(),
        hidden_act: if gemma3 { "gelu_pytorch_tanh" } else { "silu" }.into(),
        raw: if gemma3 {
            gemma3_raw(file, float("rope.freq_base"))
        } else {
            serde_json::Value::Null
        },
        eos_token_ids: token_id("eos_token_id").into_iter().collect(),
        bos_token_id: token_id("bos_token_id"),
        default_temperature: None,
        default_top_p: None,
        default_top_k: None,
        default_min_p: None,
        default_repetition_penalty: None,
    })
}

/// The Gemma 3 fields that are not in [`ModelConfig`], as transformers
/// reads them from the GGUF: `sliding_window` and the global rope base from
/// the metadata; `query_pre_attn_scalar` (256), the local rope base (10000)
/// and the layer pattern (every sixth layer global) are not in the file and
/// take transformers' defaults, which are Gemma 3's own (but for 27B's
/// `query_pre_attn_scalar`).
fn gemma3_raw(file: &GgufFile, rope_theta: Option<f64>) -> serde_json::Value {
    let mut raw = serde_json::json!({ "hidden_activation": "gelu_pytorch_tanh" });
    if let Some(w) = file
        .get("gemma3.attention.sliding_window")
        .and_then(Value::as_u64)
    {
        raw["sliding_window"] = w.into();
    }
    if let Some(t) = rope_theta {
        raw["rope_theta"] = t.into();
    }
    raw
}

/// The HuggingFace name of a GGUF tensor name of architecture `arch`, if
/// the model uses it.
fn hf_name(arch: &str, name: &str) -> Option<String> {
    if arch == "gemma3" {
        return gemma3_hf_name(name);
    }
    Some(match name {
        "token_embd.weight" => "model.embed_tokens.weight".into(),
        "output_norm.weight" => "model.norm.weight".into(),
        "output.weight" => "lm_head.weight".into(),
        _ => {
            let rest = name.strip_prefix("blk.")?;
            let (layer, part) = rest.split_once('.')?;
            let layer: u32 = layer.parse().ok()?;
            let hf = match part {
                "attn_q.weight" => "self_attn.q_proj.weight",
                "attn_k.weight" => "self_attn.k_proj.weight",
                "attn_v.weight" => "self_attn.v_proj.weight",
                "attn_output.weight" => "self_attn.o_proj.weight",
                "ffn_gate.weight" => "mlp.gate_proj.weight",
                "ffn_up.weight" => "mlp.up_proj.weight",
                "ffn_down.weight" => "mlp.down_proj.weight",
                "attn_norm.weight" => "input_layernorm.weight",
                "ffn_norm.weight" => "post_attention_layernorm.weight",
                _ => return None,
            };
            format!("model.layers.{layer}.{hf}")
        }
    })
}

/// Gemma 3's tensor names: Llama's, but `ffn_norm` is the norm before the
/// MLP, and the post-attention, post-MLP and q/k norms have names of their own.
fn gemma3_hf_name(name: &str) -> Option<String> {
    let Some(rest) = name.strip_prefix("blk.") else {
        return hf_name("llama", name);
    };
    let (layer, part) = rest.split_once('.')?;
    let layer: u32 = layer.parse().ok()?;
    let hf = match part {
        "attn_norm.weight" => "input_layernorm.weight",
        "attn_q_norm.weight" => "self_attn.q_norm.weight",
        "attn_k_norm.weight" => "self_attn.k_norm.weight",
        "post_attention_norm.weight" => "post_attention_layernorm.weight",
        "ffn_norm.weight" => "pre_feedforward_layernorm.weight",
        "post_ffw_norm.weight" => "post_feedforward_layernorm.weight",
        "attn_q.weight" | "attn_k.weight" | "attn_v.weight" | "attn_output.weight"
        | "ffn_gate.weight" | "ffn_up.weight" | "ffn_down.weight" => {
            return hf_name("llama", name);
        }
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf}"))
}

/// Undoes llama.cpp's row permutation of a q or k projection with `heads`
/// heads: rows `[h, 2, d/2]` were stored as `[h, d/2, 2]`.
fn unpermute(w: &Tensor, heads: i64) -> Result<Tensor, EngineError> {
    let shape = w.size();
    let rows = shape[0];
    let half = rows / heads / 2;
    Ok(w.f_reshape([heads, half, 2, shape[1]])?
        .f_transpose(1, 2)?
        .f_reshape([rows, shape[1]])?)
}

/// The tensor names a GGUF tensor is stacked with into one linear layer
/// (q, k and v; gate and up), itself included; empty for others.
fn stacked_with(name: &str) -> Vec<String> {
    let Some((layer, part)) = name
        .strip_prefix("blk.")
        .and_then(|rest| rest.split_once('.'))
    else {
        return Vec::new();
    };
    let group: &[&str] = match part {
        "attn_q.weight" | "attn_k.weight" | "attn_v.weight" => {
            &["attn_q.weight", "attn_k.weight", "attn_v.weight"]
        }
        "ffn_gate.weight" | "ffn_up.weight" => &["ffn_gate.weight", "ffn_up.weight"],
        _ => &[],
    };
    group.iter().map(|p| format!("blk.{layer}.{p}")).collect()
}

/// Whether tensor `t` stays in its quantized blocks when the loader keeps
/// quantized weights: a 2-d Q8_0, Q5_0, Q4_0, Q4_1, Q4_K or Q6_K matrix whose
/// stacking partners (q, k, v; gate, up), if any, are held in the same
/// format (Q5_0 and Q8_0 both as Q8_0; a stack of other mixed formats is
/// dequantized).
pub fn stays_quantized(file: &GgufFile, t: &TensorInfo) -> bool {
    let Some(fmt) = GgmlType::from_id(t.kind).and_then(Format::of) else {
        return false;
    };
    t.dims.len() == 2
        && stacked_with(&t.name).iter().all(|p| {
            file.tensor(p).map_or(true, |o| {
                GgmlType::from_id(o.kind).and_then(Format::of) == Some(fmt)
            })
        })
}

/// Bytes the engine holds for `file`'s weights: tensors that stay
/// quantized (when `keep_quantized`, see [`stays_quantized`]) at the size
/// of the blocks they are held in (their size in the file, but Q5_0's held
/// as Q8_0, Q4_K's at 6 bits a value and Q6_K's at 10), the others at
/// `element_bytes` per element.
pub fn held_bytes(file: &GgufFile, element_bytes: u64, keep_quantized: bool) -> u64 {
    file.tensors
        .iter()
        .map(|t| {
            if keep_quantized && stays_quantized(file, t) {
                GgmlType::from_id(t.kind)
                    .and_then(Format::of)
                    .map_or(0, |f| {
                        t.elements() / crate::quant::QK as u64 * f.block_bytes() as u64
                    })
            } else {
                t.elements().saturating_mul(element_bytes)
            }
        })
        .sum()
}

/// A GGUF's weights as the model code takes them, under their HuggingFace
/// names: f32 CPU tensors, and (when `keep_quantized`) the matrices that
/// [`stays_quantized`] picks as quantized rows.
pub(crate) type GgufWeights = (HashMap<String, Tensor>, HashMap<String, QuantRows>);

/// Every tensor the model uses, dequantized to f32 CPU tensors (or kept
/// quantized, see [`GgufWeights`]) under its HuggingFace name. An unknown
/// tensor name is an error, so nothing is silently dropped.
pub(crate) fn weights(
    file: &GgufFile,
    cfg: &ModelConfig,
    keep_quantized: bool,
    load: &mut Load,
) -> Result<GgufWeights, EngineError> {
    let arch = file
        .get("general.architecture")
        .and_then(Value::as_str)
        .unwrap_or("llama");
    let gemma3 = arch == "gemma3";
    let mut map = HashMap::with_capacity(file.tensors.len());
    let mut quant = HashMap::new();
    let size = file.path().metadata().map_or(0, |m| m.len());
    load.plan(1, size);
    load.start_file(file.path(), 1, size);
    for t in &file.tensors {
        let name = hf_name(arch, &t.name).ok_or_else(|| {
            EngineError::Unsupported(format!(
                "GGUF tensor `{}` has no place in a {arch} model",
                t.name
            ))
        })?;
        let heads = match () {
            _ if gemma3 => None,
            _ if t.name.ends_with("attn_q.weight") => Some(cfg.num_heads),
            _ if t.name.ends_with("attn_k.weight") => Some(cfg.num_kv_heads),
            _ => None,
        };
        if keep_quantized && stays_quantized(file, t) {
            let kind = GgmlType::from_id(t.kind)
                .ok_or_else(|| load_err(file, "not a quantized format"))?;
            let [k, n] = [t.dims[0] as usize, t.dims[1] as usize];
            let rows = QuantRows::from_ggml(kind, n, k, file.raw(t)?)
                .map_err(|e| load_err(file, format!("{}: {e}", t.name)))?;
            let rows = match heads {
                Some(h) => rows.permute_rows(&unpermuted_order(n, h as usize)),
                None => rows,
            };
            quant.insert(name, rows);
            load.advance(file.raw(t)?.len() as u64, 1);
            continue;
        }
        let values = file.dequantize(t)?;
        let tensor = Tensor::f_from_slice(&values)?.f_reshape(t.shape())?;
        let tensor = if gemma3 && t.name.ends_with("norm.weight") {
            tensor.f_sub_scalar(1.0)?
        } else if let Some(h) = heads {
            unpermute(&tensor, h)?
        } else {
            tensor
        };
        map.insert(name, tensor);
        load.advance(file.raw(t)?.len() as u64, 1);
    }
    load.finish_file();
    Ok((map, quant))
}

/// The order of rows `unpermute` produces, as source rows: row `i` of the
/// result is row `order[i]` of a q or k projection of `rows` rows.
fn unpermuted_order(rows: usize, heads: usize) -> Vec<usize> {
    let half = rows / heads / 2;
    // unpermute views rows as [h, half, 2] and transposes to [h, 2, half].
    let mut order = Vec::with_capacity(rows);
    for h in 0..heads {
        for two in 0..2 {
            for j in 0..half {
                order.push(h * half * 2 + j * 2 + two);
            }
        }
    }
    order
}
