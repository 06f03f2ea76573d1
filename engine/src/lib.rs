//! gyre's engine: the only crate that touches libtorch.
//!
//! It owns the model weights and KV caches on one dedicated OS thread
//! (`worker`), reached through a command channel; `admission` decides
//! which new requests may wait for it. Each request gets
//! its own channel of token events back; only plain data (token ids, counts)
//! crosses into async code. Dropping a request's event receiver cancels it
//! at the next step.
//!
//! The public API is the handle ([`Engine`]), its options, requests,
//! events, errors and stats. Model families live in `models` (one file
//! each) on the shared `layers`; tests, examples and tools that drive a
//! model directly reach it through [`internals`], which is not part of the
//! stable API.

mod admission;
mod attn;
mod beam;
mod blocks;
mod config;
mod constraint;
mod draft;
pub mod encoder;
mod fair;
mod flash;
mod fused;
mod gemm;
pub mod gguf;
mod graph;
mod kv;
mod layers;
mod models;
mod pages;
pub mod progress;
mod quant;
mod sampler;
mod sampler_device;
mod scheduler;
mod sequence;
mod simd;
mod speculate;
mod worker;
mod workers;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

pub use beam::{BeamSearch, EarlyStopping, MAX_BEAM_WIDTH};
pub use constraint::Constraint;
pub use draft::{DRAFT_THRESHOLD_MAX_TOKENS, DraftSpeculation};
pub use encoder::{EmbedEngine, EmbedError, EmbedInfo, EmbedOptions, EmbedStats};
pub use llguidance;
pub use models::LoadOptions;
pub use quant::Activations;
pub use sampler::{Sampler, Sampling, argmax};
pub use speculate::{MAX_NGRAM, MAX_SPECULATIVE_TOKENS, Speculation};

/// Everything that can go wrong in the engine.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("cannot load model from {path}: {reason}")]
    Load { path: String, reason: String },
    #[error("unsupported model: {0}")]
    Unsupported(String),
    #[error("checkpoint lacks weight {0}")]
    MissingWeight(String),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("token id {id} is out of the vocabulary (size {vocab})")]
    TokenOutOfVocab { id: u32, vocab: u32 },
    #[error(
        "this model's maximum context length is {max} tokens; the prompt has {prompt} tokens and max_tokens is {requested}"
    )]
    ContextTooLong {
        prompt: u32,
        requested: u32,
        max: u32,
    },
    #[error(
        "the prompt ({prompt} tokens) plus max_tokens ({requested}) needs more KV cache than the server has ({capacity} tokens)"
    )]
    ExceedsKvCapacity {
        prompt: u32,
        requested: u32,
        capacity: u32,
    },
    #[error("n must be between 1 and {max}, got {n}")]
    InvalidN { n: u32, max: u32 },
    /// A beam search the engine cannot run; `field` names the request
    /// field at fault (gyre.v1 names).
    #[error("{message}")]
    InvalidBeam {
        field: &'static str,
        message: String,
    },
    /// Speculation the engine cannot run; `field` names the request field
    /// at fault (gyre.v1 names).
    #[error("{message}")]
    InvalidSpeculation {
        field: &'static str,
        message: String,
    },
    /// The draft model (`EngineOptions::draft_model_dir`) could not be
    /// loaded beside the model: another vocabulary, a checkpoint that does
    /// not load, no memory for its pool.
    #[error("draft model: {0}")]
    Draft(Box<EngineError>),
    #[error("max_tokens must be at least 1")]
    ZeroMaxTokens,
    #[error("the engine is full and so is its queue")]
    QueueFull,
    #[error("the engine has stopped")]
    Stopped,
    #[error("model step failed: {0}")]
    Step(String),
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
}

/// Most choices one request may ask for.
pub const MAX_N: u32 = 128;

/// Which device to run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceChoice {
    /// CUDA when available, else CPU.
    Auto,
    Cpu,
    Cuda,
}

/// The element type of the KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvCacheDtype {
    /// The model's own dtype (float32 on the CPU, bfloat16 on CUDA).
    #[default]
    Auto,
    Float32,
    /// Half the bytes of float32: keys and values are rounded to float16
    /// when stored and widened back to float32 when read (llama.cpp's
    /// default cache type). CPU only.
    Float16,
}

impl KvCacheDtype {
    /// The pool's tensor kind for a model of `kind` on `device`, or why
    /// this choice does not run there.
    pub(crate) fn kind(
        self,
        device: tch::Device,
        kind: tch::Kind,
    ) -> Result<tch::Kind, EngineError> {
        match self {
            Self::Auto => Ok(kind),
            Self::Float32 if kind == tch::Kind::Float => Ok(kind),
            Self::Float16 if device == tch::Device::Cpu && kind == tch::Kind::Float => {
                Ok(tch::Kind::Half)
            }
            _ => Err(EngineError::Unsupported(format!(
                "a {self:?} KV cache with a {kind:?} model on {device:?}: only the model's own dtype, or float16 for a float32 model on the CPU"
            ))),
        }
    }

    /// Bytes an element of the cache takes for a model whose own elements
    /// take `model_bytes` (for memory budgets before the model loads).
    pub fn element_bytes(self, model_bytes: u64) -> u64 {
        match self {
            Self::Auto => model_bytes,
            Self::Float32 => 4,
            Self::Float16 => 2,
        }
    }
}

impl std::str::FromStr for KvCacheDtype {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "f32" | "fp32" | "float32" => Ok(Self::Float32),
            "f16" | "fp16" | "float16" | "half" => Ok(Self::Float16),
            other => Err(format!(
                "unknown KV cache dtype {other:?}: expected auto, f32 or f16"
            )),
        }
    }
}

/// Engine settings.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    pub model_dir: PathBuf,
    pub device: DeviceChoice,
    /// Most sequences running (holding KV blocks) at once.
    pub max_running: usize,
    /// Most tokens one step runs (decodes plus prefill chunks); longer
    /// prompts are prefilled in chunks.
    pub token_budget: usize,
    /// Requests that may wait while the engine is full: a new request gets
    /// `QueueFull` when the requests submitted but not yet started already
    /// number `queue_capacity` plus the free running slots (`max_running`
    /// minus the sequences running). A burst the engine can start at its
    /// next step is never refused.
    pub queue_capacity: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Memory for the KV cache, in bytes (the pool is also capped at what
    /// `max_running` sequences of full context need).
    pub kv_cache_bytes: u64,
    /// Exact number of KV blocks, overriding `kv_cache_bytes`.
    pub num_blocks: Option<usize>,
    /// libtorch intra-op threads of the engine (CPU). None: libtorch's default
    /// (one per core).
    pub compute_threads: Option<usize>,
    /// Shows the weights' load progress ([`progress::LogLines`] or
    /// [`progress::TerminalBar`]). `Engine::start` makes it the process's
    /// load reporter (see [`progress::set_reporter`]); None keeps the one
    /// set before (log lines by default).
    pub load_progress: Option<Arc<dyn progress::LoadProgress>>,
    /// Where decode steps sample (see `sampler_device`): None, on the
    /// device when it is CUDA (else the host), unless `GYRE_DEVICE_SAMPLING`
    /// says `0` (never) or `1` (always, the CPU's tensors too: for tests);
    /// Some(on) overrides both.
    pub device_sampling: Option<bool>,
    /// A draft model (a HuggingFace directory or GGUF file with the
    /// target's vocabulary) for speculative decoding (see `draft`), loaded
    /// beside the target on the same device; requests use it with
    /// `GenerateRequest::draft`.
    pub draft_model_dir: Option<PathBuf>,
    /// KV blocks of the draft's own pool (of `block_size` tokens). None:
    /// as many as the target's pool has (the same token capacity; a draft
    /// with fewer layers takes fewer bytes).
    pub draft_num_blocks: Option<usize>,
    /// How GGUF weights are held: by default a GGUF's Q8_0/Q5_0/Q4_0/Q4_1/Q4_K/Q6_K
    /// matrices stay in their blocks on a float32 CPU with AVX-512 VNNI
    /// (`quant`'s kernels); `dequantize` turns every weight to f32 at load.
    pub load_options: LoadOptions,
    /// The KV cache's element type (the draft's pool takes the same).
    pub kv_cache_dtype: KvCacheDtype,
}

impl EngineOptions {
    pub fn new(model_dir: impl Into<PathBuf>) -> Self {
        Self {
            model_dir: model_dir.into(),
            device: DeviceChoice::Auto,
            max_running: 64,
            token_budget: 512,
            queue_capacity: 1024,
            block_size: 16,
            kv_cache_bytes: 1 << 30,
            num_blocks: None,
            compute_threads: None,
            load_progress: None,
            device_sampling: None,
            draft_model_dir: None,
            draft_num_blocks: None,
            load_options: LoadOptions::default(),
            kv_cache_dtype: KvCacheDtype::Auto,
        }
    }
}

/// A snapshot of the engine (see `gyre.v1.EngineStats`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineStats {
    pub waiting: u32,
    pub running: u32,
    pub block_size: u32,
    pub kv_blocks_total: u32,
    pub kv_blocks_used: u32,
    pub kv_blocks_cached: u32,
    pub prefix_query_tokens_total: u64,
    pub prefix_hit_tokens_total: u64,
    pub last_step_tokens: u32,
    pub steps_total: u64,
    pub preemptions_total: u64,
    pub generated_tokens_total: u64,
    /// Tokens proposed by speculation (prompt lookup) and computed.
    pub spec_proposed_tokens_total: u64,
    /// Of which the model agreed with (and so generated without a step of
    /// their own).
    pub spec_accepted_tokens_total: u64,
    /// Of the speculation counts above, those proposed by the draft model
    /// (the rest came from prompt lookup).
    pub draft_proposed_tokens_total: u64,
    pub draft_accepted_tokens_total: u64,
    /// Forward passes the draft model ran (each proposes one token for
    /// every sequence in it).
    pub draft_forwards_total: u64,
    /// The draft model's KV pool (0 without a draft model).
    pub draft_kv_blocks_total: u32,
    pub draft_kv_blocks_used: u32,
}

/// Facts about the loaded model that callers need.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    pub architecture: String,
    pub vocab_size: u32,
    pub max_model_len: u32,
    /// Tokens the whole KV pool holds.
    pub kv_capacity_tokens: u32,
    pub eos_token_ids: Vec<u32>,
    pub bos_token_id: Option<u32>,
    pub default_sampling: Sampling,
    /// "cpu" or "cuda:N".
    pub device: String,
    /// e.g. "Float" or "BFloat16".
    pub dtype: String,
    /// The draft model, when one is loaded: its architecture and layers.
    pub draft_model: Option<String>,
}

/// One generation request, in token ids.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: u32,
    pub sampling: Sampling,
    /// Ids that end generation besides EOS.
    pub stop_token_ids: Vec<u32>,
    /// When true, EOS does not end generation.
    pub ignore_eos: bool,
    /// EOS and stop token ids cannot be generated before this many tokens.
    pub min_tokens: u32,
    /// Report each token's log-probability and this many top alternatives
    /// (at most 20). None: no log-probabilities.
    pub logprobs: Option<u32>,
    /// Report the log-probability of every prompt token but the first, with
    /// this many top alternatives (at most 20), as [`Event::PromptLogprobs`].
    /// Such a request computes its whole prompt: it takes nothing from the
    /// shared prefix cache (and leaves nothing in it for others).
    pub prompt_logprobs: Option<u32>,
    /// Higher runs first and is preempted last, among the requests of its
    /// tenant (tenants share the engine by weighted fair queuing first).
    pub priority: i32,
    /// Who the request is for: the engine shares its capacity between
    /// tenants in proportion to their weights (start-time fair queuing over
    /// the tokens it runs for each), so one flooding the queue cannot starve
    /// another. Empty: the one shared tenant of a server without tenants.
    pub tenant: Arc<str>,
    /// The tenant's share relative to other tenants' (0 counts as 1).
    pub weight: u32,
    /// Prefix-cache namespace; empty is the shared cache.
    pub cache_salt: String,
    /// Constrained decoding: only tokens that keep the output within this
    /// structure are sampled (EOS and stop ids then count only where the
    /// structure allows them, so `min_tokens` does not apply).
    pub constraint: Option<Constraint>,
    /// Prompt-lookup decoding (see `speculate`); None decodes a token a
    /// step.
    pub speculation: Option<Speculation>,
    /// A predicted output's tokens, searched for proposals before the
    /// sequence itself (with `speculation` only).
    pub predicted: std::sync::Arc<[u32]>,
    /// Speculative decoding with the engine's draft model (see `draft`);
    /// not with `speculation` (prompt lookup) at once. None: no draft.
    pub draft: Option<DraftSpeculation>,
    /// Beam search (see `beam`): `n` (of `submit_n`) is how many of the
    /// best hypotheses come back, at most the width. Deterministic: the
    /// sampling parameters do not apply. None: sampling.
    pub beam: Option<BeamSearch>,
}

impl GenerateRequest {
    /// A request with default settings: sampling from the defaults of
    /// [`Sampling`], no extra stop ids, EOS honoured, no logprobs, priority 0,
    /// the shared tenant at weight 1, the shared prefix cache.
    pub fn new(prompt: Vec<u32>, max_tokens: u32) -> Self {
        Self {
            prompt,
            max_tokens,
            sampling: Sampling::default(),
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            min_tokens: 0,
            logprobs: None,
            prompt_logprobs: None,
            priority: 0,
            tenant: Arc::from(""),
            weight: 1,
            cache_salt: String::new(),
            constraint: None,
            speculation: None,
            predicted: std::sync::Arc::from([]),
            draft: None,
            beam: None,
        }
    }
}

/// The model's log-probabilities (of its raw distribution, before sampling
/// parameters) for one generated token.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    pub token: u32,
    pub logprob: f32,
    /// The most likely tokens, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// Most top alternatives a request may ask for.
pub const MAX_TOP_LOGPROBS: u32 = 20;

/// Why a sequence ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// It produced this stop token (EOS or a requested stop id).
    Stop(u32),
    /// It reached max_tokens or the context length.
    Length,
}

/// Token counts of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub cached_tokens: u32,
}

/// How long a finished sequence spent in each phase, as the engine thread
/// measured it (what the metrics' queue, prefill and decode times report).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Timings {
    /// From `submit` to the first step that ran any of its tokens.
    pub queued: Duration,
    /// From that step to its first sampled token (prefill, in chunks when
    /// long, and any wait between chunks).
    pub prefill: Duration,
    /// From its first sampled token to its last.
    pub decode: Duration,
}

/// What the engine tells a request, in order: tokens, then one `Finished` or `Failed`.
#[derive(Debug)]
pub enum Event {
    /// The prompt is in the KV cache; `cached_tokens` of it came from the
    /// prefix cache. Sent once, before the first token. `started`: when
    /// the engine first scheduled the sequence (its prefill began; the time
    /// before it was queue wait).
    Prefilled {
        cached_tokens: u32,
        started: std::time::Instant,
    },
    /// Log-probabilities of the token that follows (when requested).
    Logprobs(TokenLogprobs),
    /// Log-probabilities of the next prompt tokens, in order (when
    /// `prompt_logprobs` was requested): the first batch starts at prompt
    /// token 1. Sent as the prompt is computed, all before `Prefilled`.
    PromptLogprobs(Vec<TokenLogprobs>),
    Token(u32),
    /// A verification step of speculative decoding (prompt lookup) ended:
    /// `proposed` tokens were checked and the first `accepted` of them
    /// matched what the model sampled. Sent after that step's tokens.
    Speculated {
        proposed: u32,
        accepted: u32,
    },
    /// Beam search: the choice's hypothesis scores, sent after its tokens
    /// and before `Finished`. `score` ranks the hypotheses:
    /// `cumulative_logprob / completion_tokens ** length_penalty`.
    Beam {
        score: f32,
        cumulative_logprob: f32,
    },
    Finished {
        reason: FinishReason,
        usage: Usage,
        timings: Timings,
    },
    Failed(EngineError),
}

pub(crate) enum Command {
    /// A request with one event channel per choice (n = events.len() >= 1).
    Add {
        req: GenerateRequest,
        events: Vec<mpsc::UnboundedSender<Event>>,
        /// When `submit` took it (the start of its queue time).
        submitted: Instant,
    },
}

/// Whether libtorch sees a CUDA device (what `DeviceChoice::Auto` picks).
pub fn cuda_available() -> bool {
    tch::Cuda::is_available()
}

/// A handle to the engine thread; cheap to clone.
#[derive(Clone)]
pub struct Engine {
    tx: mpsc::Sender<Command>,
    admission: Arc<admission::Admission>,
    info: ModelInfo,
    stats: watch::Receiver<EngineStats>,
    /// Sequences that may run at once (a beam search needs its width).
    max_running: usize,
}

impl Engine {
    /// Starts the engine thread and loads the model there. Blocks until the
    /// model is loaded (call it from `spawn_blocking` in async code).
    pub fn start(opts: EngineOptions) -> Result<Self, EngineError> {
        for (name, v) in [
            ("block size", opts.block_size),
            ("max running sequences", opts.max_running),
            ("token budget per step", opts.token_budget),
            ("queue capacity", opts.queue_capacity),
        ] {
            if v == 0 {
                return Err(EngineError::Unsupported(format!(
                    "{name} must be at least 1"
                )));
            }
        }
        if let Some(p) = &opts.load_progress {
            progress::set_reporter(p.clone());
        }
        let admission = Arc::new(admission::Admission::new(
            opts.queue_capacity,
            opts.max_running,
        ));
        // Admission bounds what the channel holds; its capacity is a backstop.
        let (tx, rx) = mpsc::channel(opts.queue_capacity.saturating_add(opts.max_running));
        let max_running = opts.max_running;
        let spawned = worker::spawn(opts, rx, admission.clone())?;
        Ok(Self {
            tx,
            admission,
            info: spawned.info,
            stats: spawned.stats,
            max_running,
        })
    }

    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    /// Requests submitted and not yet started (in the queue or on their way
    /// to it), as admission counts them now.
    pub fn queued(&self) -> usize {
        self.admission.queued()
    }

    /// The engine's state as of its last step.
    pub fn stats(&self) -> EngineStats {
        self.stats.borrow().clone()
    }

    /// Waits until the engine publishes stats that satisfy `f` (for tests
    /// and tools; no polling).
    pub async fn wait_stats(&self, f: impl FnMut(&EngineStats) -> bool) -> EngineStats {
        let mut rx = self.stats.clone();
        match rx.wait_for(f).await {
            Ok(s) => s.clone(),
            Err(_) => self.stats(),
        }
    }

    /// Checks a request against the model and queues it. Returns the
    /// request's event stream; drop it to cancel.
    pub fn submit(
        &self,
        req: GenerateRequest,
    ) -> Result<mpsc::UnboundedReceiver<Event>, EngineError> {
        let mut rxs = self.submit_n(req, 1)?;
        rxs.pop().ok_or(EngineError::Stopped)
    }

    /// Parallel sampling: `n` choices of one prompt, each with its own event
    /// stream (choice i samples with seed + i). The prompt is prefilled once;
    /// the choices share its KV blocks. Dropping a stream cancels that choice.
    pub fn submit_n(
        &self,
        req: GenerateRequest,
        n: u32,
    ) -> Result<Vec<mpsc::UnboundedReceiver<Event>>, EngineError> {
        if n == 0 || n > MAX_N {
            return Err(EngineError::InvalidN { n, max: MAX_N });
        }
        self.validate(&req, n)?;
        let (events, rxs): (Vec<_>, Vec<_>) = (0..n).map(|_| mpsc::unbounded_channel()).unzip();
        if !self.admission.try_enter() {
            return Err(EngineError::QueueFull);
        }
        self.tx
            .try_send(Command::Add {
                req,
                events,
                submitted: Instant::now(),
            })
            .map_err(|e| {
                self.admission.leave(1);
                match e {
                    mpsc::error::TrySendError::Full(_) => EngineError::QueueFull,
                    mpsc::error::TrySendError::Closed(_) => EngineError::Stopped,
                }
            })?;
        Ok(rxs)
    }

    fn validate(&self, req: &GenerateRequest, n: u32) -> Result<(), EngineError> {
        if req.prompt.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        if req.max_tokens == 0 {
            return Err(EngineError::ZeroMaxTokens);
        }
        let vocab = self.info.vocab_size;
        if let Some(&id) = req
            .prompt
            .iter()
            .chain(&req.stop_token_ids)
            .find(|&&t| t >= vocab)
        {
            return Err(EngineError::TokenOutOfVocab { id, vocab });
        }
        let prompt = req.prompt.len() as u64;
        if prompt + req.max_tokens as u64 > self.info.max_model_len as u64 {
            return Err(EngineError::ContextTooLong {
                prompt: req.prompt.len() as u32,
                requested: req.max_tokens,
                max: self.info.max_model_len,
            });
        }
        if let Some(d) = &req.draft {
            self.validate_draft(req, d)?;
        }
        if let Some(b) = &req.beam {
            let block = self.stats.borrow().block_size;
            return beam::validate(req, b, n, &self.info, block, self.max_running);
        }
        if prompt + n as u64 * req.max_tokens as u64 > self.info.kv_capacity_tokens as u64 {
            return Err(EngineError::ExceedsKvCapacity {
                prompt: req.prompt.len() as u32,
                requested: req.max_tokens,
                capacity: self.info.kv_capacity_tokens,
            });
        }
        Ok(())
    }

    fn validate_draft(
        &self,
        req: &GenerateRequest,
        d: &DraftSpeculation,
    ) -> Result<(), EngineError> {
        let invalid =
            |field, message: String| Err(EngineError::InvalidSpeculation { field, message });
        if self.info.draft_model.is_none() {
            return invalid(
                "num_assistant_tokens",
                "this model has no draft model to speculate with".into(),
            );
        }
        if req.speculation.is_some() {
            return invalid(
                "num_assistant_tokens",
                "a request speculates with prompt lookup or with the draft model, not both".into(),
            );
        }
        if d.num_tokens > MAX_SPECULATIVE_TOKENS {
            return invalid(
                "num_assistant_tokens",
                format!(
                    "num_assistant_tokens must be at most {MAX_SPECULATIVE_TOKENS}, got {}",
                    d.num_tokens
                ),
            );
        }
        if let Some(t) = d.confidence_threshold
            && !(0.0..=1.0).contains(&t)
        {
            return invalid(
                "assistant_confidence_threshold",
                format!("assistant_confidence_threshold must be between 0 and 1, got {t}"),
            );
        }
        Ok(())
    }
}

/// The engine's internals, for tests, examples and tools that drive a model
/// directly (scoring a prompt, stepping packed batches against a KV pool).
/// Not part of the stable API: it changes with the engine.
pub mod internals {
    use std::path::Path;

    pub use crate::attn::{
        set_attn_avx2, set_attn_prefetch_l1, time_decode as time_decode_attention,
    };
    pub use crate::config::{Llama3Scaling, LongRopeScaling, ModelConfig, RopeScaling};
    pub use crate::fused::{
        check_against_libtorch as check_fused_kernels, set_enabled as set_fused_kernels, time_gemv,
    };
    pub use crate::gemm::set_f32_avx2;
    pub use crate::gemm::set_one_row_panels;
    pub use crate::gemm::set_tile_chunks;
    pub use crate::gemm::time_matmul as time_f32_matmul;
    pub use crate::kv::KvPool;
    pub use crate::layers::Backend;
    pub use crate::layers::batch::{SeqInput, StepBatch};
    pub use crate::layers::rows::{set_enabled as set_row_path, steps as row_path_steps};
    pub use crate::models::{KvShape, Model, load, load_with, supported};
    pub use crate::pages::set_enabled as set_huge_pages;
    pub use crate::quant::set_one_row_prefetch as set_one_row_quant_prefetch;
    pub use crate::quant::{Kernel as QuantKernel, time_matmul as time_quant_matmul};
    pub use crate::workers::{set_balanced_stealing, set_gap_prefetch, set_row_units};
    use crate::{DeviceChoice, EngineError, worker};

    /// Loads a model on the calling thread with the device (and dtype) the
    /// engine would pick.
    pub fn load_model(path: &Path, device: DeviceChoice) -> Result<Box<dyn Model>, EngineError> {
        load_model_with(path, device, crate::LoadOptions::default())
    }

    /// [`load_model`], with the weights held as `opts` says (e.g.
    /// dequantized, or quantized with f32 activations).
    pub fn load_model_with(
        path: &Path,
        device: DeviceChoice,
        opts: crate::LoadOptions,
    ) -> Result<Box<dyn Model>, EngineError> {
        let (device, kind) = worker::pick_device(device)?;
        load_with(path, device, kind, opts)
    }
}
