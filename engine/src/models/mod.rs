//! Model families, one file each, and the loader that picks one.
//!
//! A family file holds its own config reading, attention, MLP, decoder
//! layer and model, built from the shared `layers`, and implements
//! [`Model`], which is all the worker knows of it. Adding a family is a new
//! file here plus one line in [`FAMILIES`].

mod gemma2;
mod gemma3;
mod llama;
mod mixtral;
mod phi3;
mod qwen2;
mod qwen3;
mod qwen3_moe;
mod stack;

use std::path::Path;

use serde_json::Value;
use tch::{Device, Kind, Tensor};

use crate::EngineError;
use crate::blocks::BlockId;
use crate::config::ModelConfig;
use crate::kv::KvPool;
use crate::layers::Backend;
use crate::layers::batch::{SeqInput, StepBatch};
use crate::layers::weights::{Weights, read_weights};
use crate::progress::Load;

/// Builds a family's model from its config and weights.
type LoadFn = fn(ModelConfig, &mut Weights, Backend) -> Result<Box<dyn Model>, EngineError>;

/// Every family: `architectures[0]` of config.json and its loader.
const FAMILIES: &[(&str, LoadFn)] = &[
    ("LlamaForCausalLM", llama::load),
    ("MistralForCausalLM", llama::load),
    ("Qwen2ForCausalLM", qwen2::load),
    ("Qwen3ForCausalLM", qwen3::load),
    ("Gemma2ForCausalLM", gemma2::load),
    ("Gemma3ForCausalLM", gemma3::load),
    ("Phi3ForCausalLM", phi3::load),
    ("MixtralForCausalLM", mixtral::load),
    ("Qwen3MoeForCausalLM", qwen3_moe::load),
];

/// Architectures this engine implements.
pub fn supported() -> Vec<&'static str> {
    FAMILIES.iter().map(|f| f.0).collect()
}

/// Fails, naming it, unless the engine implements `architecture`.
pub(crate) fn check_supported(
    architecture: &str,
    model_type: Option<&Value>,
) -> Result<(), EngineError> {
    if FAMILIES.iter().any(|f| f.0 == architecture) {
        return Ok(());
    }
    Err(EngineError::Unsupported(format!(
        "architecture {architecture:?} (model_type {}); supported: {}",
        model_type.unwrap_or(&Value::Null),
        supported().join(", ")
    )))
}

/// The shape of the paged KV cache a model needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvShape {
    pub layers: i64,
    pub kv_heads: i64,
    pub head_dim: i64,
}

/// A loaded model, as the worker drives it.
pub trait Model: Send {
    /// The hyperparameters shared by all families.
    fn config(&self) -> &ModelConfig;

    /// The compute backend the model runs on.
    #[doc(hidden)]
    fn backend(&self) -> &Backend;

    /// Runs one step's packed batch, storing the new keys and values in
    /// `pool`; returns the final-normed hidden states [N, hidden] of all N
    /// tokens in input order.
    #[doc(hidden)]
    fn forward_batch(&self, batch: &StepBatch, pool: &mut KvPool) -> Result<Tensor, EngineError>;

    /// Float32 logits [B, vocab] of hidden-state rows [B, hidden].
    fn logits(&self, hidden: &Tensor) -> Result<Tensor, EngineError>;

    /// The KV cache shape this model needs.
    fn kv_shape(&self) -> KvShape {
        let c = self.config();
        KvShape {
            layers: c.num_layers,
            kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
        }
    }

    /// The KV regime of a sequence of `seq_len` tokens: the cached keys and
    /// values of the same tokens differ between regimes (longrope rotates a
    /// sequence longer than its original maximum with its long factors, 1;
    /// else 0). The worker recomputes a sequence whose regime changes and
    /// keeps regimes apart in the prefix cache. Always 0 for most families.
    fn kv_regime(&self, seq_len: usize) -> u8 {
        let _ = seq_len;
        0
    }

    fn device(&self) -> Device {
        self.backend().device
    }

    fn kind(&self) -> Kind {
        self.backend().kind
    }

    /// Runs the new tokens of every sequence (see [`SeqInput`]): builds the
    /// step batch once and hands it to the family's forward.
    fn forward(&self, seqs: &[SeqInput<'_>], pool: &mut KvPool) -> Result<Tensor, EngineError> {
        let batch = StepBatch::new(seqs, pool, self.backend())?;
        self.forward_batch(&batch, pool)
    }

    /// Full logits [T, vocab] of a prompt run from scratch in a private
    /// pool (for tests and scoring).
    fn score(&self, tokens: &[u32]) -> Result<Tensor, EngineError> {
        self.score_with_kv(tokens, self.kind())
    }

    /// [`Model::score`] with a pool of `kv_kind` elements (a float16 KV
    /// cache on the CPU).
    fn score_with_kv(&self, tokens: &[u32], kv_kind: Kind) -> Result<Tensor, EngineError> {
        let bs = 16;
        let blocks = (tokens.len() as i64 + bs - 1) / bs;
        let mut pool = self.new_pool(blocks.max(1), bs, kv_kind)?;
        let table: Vec<BlockId> = (0..blocks as BlockId).collect();
        let h = self.forward(
            &[SeqInput {
                tokens,
                start: 0,
                block_table: &table,
                seq_len: tokens.len(),
            }],
            &mut pool,
        )?;
        self.logits(&h)
    }

    /// A KV pool shaped for this model, of `kind` elements (the model's
    /// own, or float16 on a float32 CPU: see `KvCacheDtype`).
    fn new_pool(
        &self,
        num_blocks: i64,
        block_size: i64,
        kind: Kind,
    ) -> Result<KvPool, EngineError> {
        let s = self.kv_shape();
        KvPool::new(
            s.layers,
            s.kv_heads,
            s.head_dim,
            num_blocks,
            block_size,
            kind,
            self.device(),
        )
    }

    /// Bytes of KV cache one block of `block_size` tokens of `kind` takes.
    fn kv_bytes_per_block(&self, block_size: i64, kind: Kind) -> i64 {
        let s = self.kv_shape();
        crate::kv::bytes_per_block(s.layers, s.kv_heads, s.head_dim, block_size, kind)
    }

    /// Whether a decode step of this model can be captured in a CUDA graph
    /// (`crate::graph`): on CUDA, every layer on the flash path, and no
    /// host sync or host-built tensor inside the forward.
    fn cuda_graphs(&self) -> bool {
        false
    }

    /// Whether CUDA attention goes through flash attention over packed
    /// sequences (else SDPA per sequence). Always false on the CPU.
    fn flash_attention(&self) -> bool {
        self.backend().flash_attention()
    }

    /// Turns CUDA flash attention on or off (for comparisons).
    fn set_flash_attention(&self, on: bool) {
        self.backend().set_flash_attention(on);
    }
}

/// How a checkpoint's weights are held.
#[derive(Debug, Clone, Copy, Default)]
pub struct LoadOptions {
    /// Dequantize every GGUF tensor to the model's dtype at load (the path
    /// before quantized kernels), instead of keeping Q8_0/Q5_0/Q4_0/Q4_1/
    /// Q4_K matrices in blocks on the CPU (see `crate::quant`).
    pub dequantize: bool,
    /// The activations the quantized kernels use.
    pub activations: crate::quant::Activations,
}

impl LoadOptions {
    /// Whether a GGUF's quantized matrices (Q8_0, Q5_0, Q4_0, Q4_1, Q4_K, Q6_K)
    /// stay quantized on `device` in `kind`: on a float32 CPU with AVX-512
    /// VNNI or AVX2, unless `dequantize`.
    pub fn keeps_quantized(&self, device: Device, kind: Kind) -> bool {
        device == Device::Cpu && kind == Kind::Float && self.keeps_quantized_on_cpu()
    }

    /// Whether they stay quantized on a float32 CPU (this one).
    pub fn keeps_quantized_on_cpu(&self) -> bool {
        !self.dequantize && crate::quant::available()
    }
}

/// Loads config and weights from a HuggingFace model directory or a GGUF
/// file (dequantized to `kind` on load) into the family its architecture
/// names.
pub fn load(path: &Path, device: Device, kind: Kind) -> Result<Box<dyn Model>, EngineError> {
    load_with(path, device, kind, LoadOptions::default())
}

/// [`load`], with a GGUF's Q8_0/Q5_0/Q4_0/Q4_1/Q4_K/Q6_K matrices kept quantized where
/// `opts` allows (see [`LoadOptions::keeps_quantized`]).
pub fn load_with(
    path: &Path,
    device: Device,
    kind: Kind,
    opts: LoadOptions,
) -> Result<Box<dyn Model>, EngineError> {
    let mut progress = Load::begin();
    let keep = opts.keeps_quantized(device, kind);
    // A GGUF's weights as held (quantized matrices at their size).
    let mut held_bytes = None;
    let (cfg, map, quant) = if crate::gguf::is_gguf(path) {
        let file = crate::gguf::GgufFile::open(path)?;
        let cfg = crate::gguf::model::config(&file)?;
        let (map, quant) = crate::gguf::model::weights(&file, &cfg, keep, &mut progress)?;
        let element = kind.elt_size_in_bytes() as u64;
        held_bytes = Some(crate::gguf::model::held_bytes(&file, element, keep));
        (cfg, map, quant)
    } else {
        (
            ModelConfig::from_dir(path)?,
            read_weights(path, &mut progress)?,
            Default::default(),
        )
    };
    check_supported(&cfg.architecture, None)?;
    let Some(&(arch, load)) = FAMILIES.iter().find(|f| f.0 == cfg.architecture) else {
        return Err(EngineError::Unsupported(cfg.architecture.clone()));
    };
    let mut backend = Backend::new(device, kind)?;
    let quantized = !quant.is_empty();
    if keep {
        backend.quant = Some(opts.activations);
    }
    let packed = backend.packed;
    let mut w = Weights::new(map, device, kind).with_quantized(quant);
    let model = load(cfg, &mut w, backend)?;
    w.finish(arch)?;
    progress.finish(device);
    let c = model.config();
    tracing::info!(
        architecture = %c.architecture,
        layers = c.num_layers,
        hidden = c.hidden_size,
        vocab = c.vocab_size,
        ?device,
        ?kind,
        packed_linears = packed,
        quantized_linears = quantized,
        weights_mib = held_bytes.map(|b| b >> 20),
        "model loaded"
    );
    Ok(model)
}

/// Reads an optional field of config.json.
pub(crate) fn field<'a>(cfg: &'a ModelConfig, key: &str) -> Option<&'a Value> {
    cfg.raw.get(key).filter(|v| !v.is_null())
}

/// A boolean field of config.json (false when absent).
pub(crate) fn flag(cfg: &ModelConfig, key: &str) -> bool {
    field(cfg, key).and_then(Value::as_bool).unwrap_or(false)
}

/// Fails naming `what` when a config asks for it: the family does not
/// implement it and must not run with it silently ignored.
pub(crate) fn refuse(cfg: &ModelConfig, what: &str) -> EngineError {
    EngineError::Unsupported(format!("{} with {what}", cfg.architecture))
}

/// Fails unless rotary embeddings cover whole heads and every layer is a
/// plain full-attention layer (`layer_types`), the common case.
pub(crate) fn require_full_rotary(cfg: &ModelConfig) -> Result<(), EngineError> {
    if cfg.partial_rotary_factor != 1.0 {
        return Err(refuse(
            cfg,
            &format!("partial_rotary_factor {}", cfg.partial_rotary_factor),
        ));
    }
    Ok(())
}

/// Fails unless every entry of `layer_types` (when present) is `allowed`.
pub(crate) fn require_layer_types(cfg: &ModelConfig, allowed: &[&str]) -> Result<(), EngineError> {
    let Some(types) = field(cfg, "layer_types").and_then(Value::as_array) else {
        return Ok(());
    };
    match types
        .iter()
        .find(|t| !t.as_str().is_some_and(|t| allowed.contains(&t)))
    {
        Some(t) => Err(refuse(cfg, &format!("layer type {t}"))),
        None => Ok(()),
    }
}
