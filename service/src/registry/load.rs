//! From a [`ModelSpec`] to a registry [`Entry`]: resolve the source (as
//! `--model` does), name it, estimate its memory budget ([`plan`]), then
//! load its tokenizer, template and weights ([`load`]). The binary does this
//! for every model at start; the admin service for one at a time. A
//! sentence-transformers (or `BertModel`) directory becomes an embedding
//! model ([`ModelKind::Embed`]); anything else a generative one.

use std::path::PathBuf;
use std::sync::Arc;

use gyre_engine::progress::LoadProgress;
use gyre_engine::{DeviceChoice, EmbedOptions, EngineOptions};

use super::memory::{self, Budget};
use super::spec::ModelSpec;
use super::{Card, Entry, ModelKind, Registry};
use crate::embeddings::EmbeddingRuntime;
use crate::resolve;
use crate::runtime::{ModelRuntime, TextOptions};

/// What every model gets unless its spec says otherwise.
#[derive(Clone)]
pub struct LoadDefaults {
    pub device: DeviceChoice,
    /// KV cache per model, in MiB (a spec's `kv_cache_mib` overrides it).
    pub kv_cache_mib: u64,
    pub num_kv_blocks: Option<usize>,
    pub block_size: usize,
    pub max_running: usize,
    pub max_batch_tokens: usize,
    pub max_queue: usize,
    /// Embedding models: most padded tokens one forward pass runs.
    pub embed_batch_tokens: usize,
    pub compute_threads: Option<usize>,
    /// Dequantize GGUF weights to f32 at load (`--dequantize`) instead of
    /// keeping Q8_0/Q5_0/Q4_0/Q4_1/Q4_K/Q6_K matrices quantized on the CPU.
    pub dequantize: bool,
    /// The quantized kernels' activations (`--quant-activations`).
    pub quant_activations: gyre_engine::Activations,
    /// The KV cache's element type (`--kv-cache-dtype`).
    pub kv_cache_dtype: gyre_engine::KvCacheDtype,
    pub text: TextOptions,
    pub load_progress: Option<Arc<dyn LoadProgress>>,
    /// The HuggingFace cache that hub ids are looked up in.
    pub hub_cache: PathBuf,
    /// Device memory to check budgets against instead of the measured one
    /// (`--device-memory-mib`), in bytes.
    pub device_memory: Option<u64>,
}

impl LoadDefaults {
    /// How the engine holds the weights of every model.
    fn load_options(&self) -> gyre_engine::LoadOptions {
        gyre_engine::LoadOptions {
            dequantize: self.dequantize,
            activations: self.quant_activations,
        }
    }
}

/// A model resolved and named, not loaded yet.
pub struct Planned {
    pub spec: ModelSpec,
    pub path: PathBuf,
    pub id: String,
    pub version: String,
    pub budget: Budget,
    /// A sentence-embedding model (served by the embeddings routes).
    pub embedding: bool,
}

/// Why a model cannot be planned or loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Resolve(#[from] resolve::ResolveError),
    #[error("{0}")]
    Load(String),
    /// The model's draft model could not be loaded beside it (another
    /// vocabulary, a checkpoint that does not load).
    #[error("{0}")]
    Draft(String),
}

/// The id a model gets without a `name`: the hub id, else the directory's
/// name or the GGUF file's without `.gguf`.
fn default_id(path: &std::path::Path, hub: Option<&resolve::HubModel>) -> String {
    if let Some(h) = hub {
        return h.repo_id.clone();
    }
    let name = if gyre_engine::gguf::is_gguf(path) {
        path.file_stem()
    } else {
        path.file_name()
    };
    name.map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into())
}

/// Whether the engine will run on CUDA.
fn on_cuda(device: DeviceChoice) -> bool {
    match device {
        DeviceChoice::Cpu => false,
        DeviceChoice::Cuda => true,
        DeviceChoice::Auto => gyre_engine::cuda_available(),
    }
}

/// Resolves `spec`'s source and names it; estimates its budget.
pub fn plan(spec: ModelSpec, d: &LoadDefaults) -> Result<Planned, LoadError> {
    let resolved = resolve::resolve(&spec.source, spec.revision.as_deref(), &d.hub_cache)?;
    if let Some(hub) = &resolved.hub {
        tracing::info!(
            model = %hub.repo_id,
            revision = %hub.revision,
            commit = %hub.commit,
            path = %resolved.path.display(),
            "model found in the HuggingFace cache"
        );
    }
    let id = spec
        .name
        .clone()
        .unwrap_or_else(|| default_id(&resolved.path, resolved.hub.as_ref()));
    let version = spec
        .version
        .clone()
        .or_else(|| resolved.hub.as_ref().map(|h| h.commit.clone()))
        .unwrap_or_default();
    let cuda = on_cuda(d.device);
    let bytes_per_element = if cuda { 2 } else { 4 };
    let keep_quantized = !cuda && d.load_options().keeps_quantized_on_cpu();
    let geometry = memory::KvGeometry {
        block_size: d.block_size as u64,
        max_running: d.max_running as u64,
        num_blocks: d.num_kv_blocks.map(|n| n as u64),
        element_bytes: d.kv_cache_dtype.element_bytes(bytes_per_element),
    };
    let kv_budget = spec.kv_cache_mib.unwrap_or(d.kv_cache_mib) << 20;
    let embedding = gyre_engine::encoder::is_embedding_model(&resolved.path);
    let mut budget = Budget {
        name: id.clone(),
        weights_bytes: memory::weights_bytes(&resolved.path, bytes_per_element, keep_quantized),
        // An encoder keeps no cache between requests.
        kv_bytes: if embedding {
            0
        } else {
            memory::kv_bytes(&resolved.path, kv_budget, geometry)
        },
    };
    // A draft model's weights and pool count with its model's.
    if let Some(draft) = spec.draft.as_deref().filter(|_| !embedding) {
        let draft = std::path::Path::new(draft);
        budget.weights_bytes = budget.weights_bytes.saturating_add(memory::weights_bytes(
            draft,
            bytes_per_element,
            keep_quantized,
        ));
        budget.kv_bytes = budget.kv_bytes.saturating_add(memory::draft_kv_bytes(
            &resolved.path,
            budget.kv_bytes,
            draft,
            geometry,
        ));
    }
    Ok(Planned {
        spec,
        path: resolved.path,
        id,
        version,
        budget,
        embedding,
    })
}

/// The device memory budgets are checked against: `--device-memory-mib`,
/// else the host's available memory on the CPU; None on CUDA (not queried).
pub fn device_memory(d: &LoadDefaults) -> Option<u64> {
    if d.device_memory.is_some() {
        return d.device_memory;
    }
    if on_cuda(d.device) {
        return None;
    }
    memory::host_available()
}

/// Loads a planned model (blocking: seconds to minutes).
pub fn load(p: Planned, d: &LoadDefaults) -> Result<Entry, LoadError> {
    if p.embedding {
        return load_embedding(p, d);
    }
    let mut opts = EngineOptions::new(p.path.clone());
    opts.device = d.device;
    opts.load_progress = d.load_progress.clone();
    opts.kv_cache_bytes = p.spec.kv_cache_mib.unwrap_or(d.kv_cache_mib) << 20;
    opts.num_blocks = d.num_kv_blocks;
    opts.block_size = d.block_size;
    opts.max_running = d.max_running;
    opts.token_budget = d.max_batch_tokens;
    opts.queue_capacity = d.max_queue;
    opts.compute_threads = d.compute_threads;
    opts.load_options = d.load_options();
    opts.kv_cache_dtype = d.kv_cache_dtype;
    opts.draft_model_dir = p.spec.draft.as_ref().map(std::path::PathBuf::from);
    let mut text = d.text.clone();
    if let Some(k) = p.spec.prompt_lookup {
        text.prompt_lookup_tokens = k;
    }
    text.prompt_lookup_max = p.spec.prompt_lookup_max.or(text.prompt_lookup_max);
    text.prompt_lookup_min = p.spec.prompt_lookup_min.or(text.prompt_lookup_min);
    text.draft_tokens = p.spec.draft_tokens.or(text.draft_tokens);
    let mut rt = ModelRuntime::load(opts, Some(p.id.clone()), text).map_err(|e| {
        let message = format!("{e:#}");
        let draft = e.chain().any(|c| {
            matches!(
                c.downcast_ref::<gyre_engine::EngineError>(),
                Some(gyre_engine::EngineError::Draft(_))
            )
        });
        if draft {
            LoadError::Draft(message)
        } else {
            LoadError::Load(message)
        }
    })?;
    if let Some(owner) = &p.spec.owned_by {
        rt.owned_by.clone_from(owner);
    }
    let (owned_by, created) = (rt.owned_by.clone(), rt.created);
    Ok(Entry {
        card: card(p, owned_by, created),
        kind: ModelKind::Generate(Arc::new(rt)),
    })
}

/// Loads a planned embedding model (blocking).
fn load_embedding(p: Planned, d: &LoadDefaults) -> Result<Entry, LoadError> {
    if let Some(draft) = &p.spec.draft {
        return Err(LoadError::Draft(format!(
            "{}: an embedding model takes no draft model (got {draft})",
            p.path.display()
        )));
    }
    let mut opts = EmbedOptions::new(p.path.clone());
    opts.device = d.device;
    opts.load_progress = d.load_progress.clone();
    opts.max_batch_tokens = d.embed_batch_tokens;
    opts.queue_capacity = d.max_queue.max(1);
    opts.compute_threads = d.compute_threads;
    let mut rt = EmbeddingRuntime::load(opts, Some(p.id.clone()))
        .map_err(|e| LoadError::Load(format!("{e:#}")))?;
    if let Some(owner) = &p.spec.owned_by {
        rt.owned_by.clone_from(owner);
    }
    let (owned_by, created) = (rt.owned_by.clone(), rt.created);
    Ok(Entry {
        card: card(p, owned_by, created),
        kind: ModelKind::Embed(Arc::new(rt)),
    })
}

/// The catalogue card of a loaded model.
fn card(p: Planned, owned_by: String, created: i64) -> Card {
    Card {
        id: p.id,
        aliases: p.spec.aliases,
        version: p.version,
        owned_by,
        created,
        deprecation: p.spec.deprecation,
        sunset: p.spec.sunset,
        source: p.path.display().to_string(),
        reserved_bytes: p.budget.total(),
        kv_bytes: p.budget.kv_bytes,
        draft: p.spec.draft,
    }
}

/// Resolves every model, checks their names and that they fit the device
/// together, then loads them in order.
pub async fn load_all(specs: Vec<ModelSpec>, defaults: &LoadDefaults) -> anyhow::Result<Registry> {
    let d = defaults.clone();
    let plans = tokio::task::spawn_blocking(move || {
        specs
            .into_iter()
            .map(|s| plan(s, &d))
            .collect::<Result<Vec<_>, _>>()
    })
    .await??;
    let mut names = std::collections::HashSet::new();
    for p in &plans {
        for n in std::iter::once(&p.id).chain(&p.spec.aliases) {
            if !names.insert(n.as_str()) {
                anyhow::bail!(
                    "the model name `{n}` is given twice (served names and aliases must be unique; set `name=` to tell models apart)"
                );
            }
        }
    }
    for p in &plans {
        tracing::info!(
            model = %p.id,
            weights_mib = p.budget.weights_bytes >> 20,
            kv_cache_mib = p.budget.kv_bytes >> 20,
            "memory budget"
        );
    }
    let budgets: Vec<_> = plans.iter().map(|p| p.budget.clone()).collect();
    match device_memory(defaults) {
        Some(available) => {
            memory::check(&budgets, available, 0).map_err(anyhow::Error::msg)?;
        }
        None => tracing::warn!(
            "device memory not checked: CUDA's free memory is not measured (set --device-memory-mib)"
        ),
    }
    let mut entries = Vec::with_capacity(plans.len());
    for p in plans {
        let d = defaults.clone();
        entries.push(tokio::task::spawn_blocking(move || load(p, &d)).await??);
    }
    Ok(Registry::new(entries)?)
}
