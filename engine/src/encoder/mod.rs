//! The sentence-embedding path: a BERT-family encoder (`bert`) on a thread
//! of its own (`worker`), reached through [`EmbedEngine`], the embedding
//! counterpart of the generative [`crate::Engine`]. A model server (or a
//! model registry entry) holds one of either.
//!
//! Requests from any number of clients queue on one channel; the worker
//! takes every input queued, sorts them by length and runs them in steps of
//! at most `max_batch_tokens` padded tokens, so concurrent requests share
//! forward passes (see `worker`).

mod bert;
pub mod config;
mod worker;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::oneshot;

pub use config::{EncoderConfig, Pooling, is_embedding_model};

use crate::{DeviceChoice, EngineError, progress};

/// Why an embedding request was refused or failed. `index` is the input's
/// position in the request.
#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    #[error("the request has no inputs")]
    NoInputs,
    #[error("input {index} is empty")]
    EmptyInput { index: usize },
    #[error("input {index} has {len} tokens; this model takes at most {max}")]
    TooLong { index: usize, len: usize, max: u32 },
    #[error("token id {id} in input {index} is out of the vocabulary (size {vocab})")]
    TokenOutOfVocab { index: usize, id: u32, vocab: u32 },
    #[error("{0}")]
    Dimensions(String),
    #[error("the embedding queue is full")]
    QueueFull,
    #[error("the embedding engine has stopped")]
    Stopped,
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// Settings of an embedding engine.
#[derive(Clone)]
pub struct EmbedOptions {
    pub model_dir: PathBuf,
    pub device: DeviceChoice,
    /// Most padded tokens (inputs times the longest input) one forward pass
    /// runs; a longer queue is run in several.
    pub max_batch_tokens: usize,
    /// Requests that may wait for the worker; more are refused (`QueueFull`).
    pub queue_capacity: usize,
    /// libtorch intra-op threads (CPU); None: libtorch's default.
    pub compute_threads: Option<usize>,
    /// Reports the weights' load progress (as `EngineOptions::load_progress`).
    pub load_progress: Option<Arc<dyn progress::LoadProgress>>,
}

impl EmbedOptions {
    pub fn new(model_dir: impl Into<PathBuf>) -> Self {
        Self {
            model_dir: model_dir.into(),
            device: DeviceChoice::Auto,
            max_batch_tokens: 8192,
            queue_capacity: 1024,
            compute_threads: None,
            load_progress: None,
        }
    }
}

/// Facts about a loaded embedding model.
#[derive(Debug, Clone)]
pub struct EmbedInfo {
    pub architecture: String,
    pub vocab_size: u32,
    /// Longest input in tokens (sentence-transformers' `max_seq_length`).
    pub max_seq_length: u32,
    /// Length of the full embedding.
    pub dimensions: u32,
    pub pooling: Pooling,
    pub normalize: bool,
    /// Matryoshka sizes the model declares (`Some(vec![])`: any size);
    /// None: `dimensions` is refused.
    pub matryoshka: Option<Vec<u32>>,
    pub device: String,
}

/// Counters of the embedding worker, for observing batching.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EmbedStats {
    /// Requests answered (with embeddings or an error).
    pub requests_total: u64,
    pub inputs_total: u64,
    pub tokens_total: u64,
    /// Forward passes run.
    pub steps_total: u64,
    /// Most requests one forward pass served inputs of.
    pub max_step_requests: u32,
    /// Most inputs one forward pass ran.
    pub max_step_inputs: u32,
    /// Requests waiting or running now.
    pub pending: u32,
}

/// Requests waiting or running, and a signal for when none are.
#[derive(Default)]
pub(crate) struct Pending {
    count: AtomicUsize,
    idle: tokio::sync::Notify,
}

impl Pending {
    /// Counts a new request unless `cap` are pending already.
    fn enter(&self, cap: usize) -> bool {
        self.count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < cap).then_some(n + 1)
            })
            .is_ok()
    }

    /// A request is done (answered or abandoned).
    pub(crate) fn leave(&self) {
        if self.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.idle.notify_waiters();
        }
    }

    fn get(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }
}

pub(crate) struct Job {
    pub inputs: Vec<Vec<u32>>,
    pub dimensions: Option<u32>,
    pub reply: oneshot::Sender<Result<Vec<Vec<f32>>, EmbedError>>,
}

/// A handle to the embedding worker; cheap to clone.
#[derive(Clone)]
pub struct EmbedEngine {
    tx: std::sync::mpsc::Sender<Job>,
    info: EmbedInfo,
    pending: Arc<Pending>,
    queue_capacity: usize,
    stats: Arc<std::sync::Mutex<EmbedStats>>,
}

impl EmbedEngine {
    /// Loads the model on a new worker thread. Blocks until it is loaded.
    pub fn start(opts: EmbedOptions) -> Result<Self, EngineError> {
        if opts.max_batch_tokens == 0 || opts.queue_capacity == 0 {
            return Err(EngineError::Unsupported(
                "the embedding batch and queue sizes must be at least 1".into(),
            ));
        }
        if let Some(p) = &opts.load_progress {
            progress::set_reporter(p.clone());
        }
        let stats = Arc::new(std::sync::Mutex::new(EmbedStats::default()));
        let pending = Arc::new(Pending::default());
        let queue_capacity = opts.queue_capacity;
        let (tx, info) = worker::spawn(opts, stats.clone(), pending.clone())?;
        Ok(Self {
            tx,
            info,
            pending,
            queue_capacity,
            stats,
        })
    }

    pub fn info(&self) -> &EmbedInfo {
        &self.info
    }

    pub fn stats(&self) -> EmbedStats {
        let mut s = self.stats.lock().map(|s| s.clone()).unwrap_or_default();
        s.pending = self.pending.get() as u32;
        s
    }

    /// Resolves once no request is waiting or running (for draining).
    pub async fn wait_idle(&self) {
        loop {
            let notified = self.pending.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.pending.get() == 0 {
                return;
            }
            notified.await;
        }
    }

    /// Checks `inputs` (token ids, special tokens included) and
    /// `dimensions` against the model.
    pub fn validate(&self, inputs: &[Vec<u32>], dimensions: Option<u32>) -> Result<(), EmbedError> {
        if inputs.is_empty() {
            return Err(EmbedError::NoInputs);
        }
        let info = &self.info;
        for (index, ids) in inputs.iter().enumerate() {
            if ids.is_empty() {
                return Err(EmbedError::EmptyInput { index });
            }
            if ids.len() > info.max_seq_length as usize {
                return Err(EmbedError::TooLong {
                    index,
                    len: ids.len(),
                    max: info.max_seq_length,
                });
            }
            if let Some(&id) = ids.iter().find(|&&t| t >= info.vocab_size) {
                return Err(EmbedError::TokenOutOfVocab {
                    index,
                    id,
                    vocab: info.vocab_size,
                });
            }
        }
        if let Some(d) = dimensions {
            let Some(sizes) = &info.matryoshka else {
                return Err(EmbedError::Dimensions(
                    "this model does not support `dimensions` (it declares no Matryoshka embeddings)"
                        .into(),
                ));
            };
            let ok = if sizes.is_empty() {
                (1..=info.dimensions).contains(&d)
            } else {
                sizes.contains(&d) || d == info.dimensions
            };
            if !ok {
                let allowed = if sizes.is_empty() {
                    format!("1 to {}", info.dimensions)
                } else {
                    format!("one of {sizes:?}")
                };
                return Err(EmbedError::Dimensions(format!(
                    "dimensions must be {allowed}, got {d}"
                )));
            }
        }
        Ok(())
    }

    /// Embeds `inputs` (token ids): one vector per input, in order,
    /// truncated to `dimensions` (and normalized again when the model
    /// normalizes). Dropping the future before it resolves cancels the
    /// inputs not yet computed.
    pub async fn embed(
        &self,
        inputs: Vec<Vec<u32>>,
        dimensions: Option<u32>,
    ) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.validate(&inputs, dimensions)?;
        if !self.pending.enter(self.queue_capacity) {
            return Err(EmbedError::QueueFull);
        }
        let (reply, rx) = oneshot::channel();
        let job = Job {
            inputs,
            dimensions,
            reply,
        };
        if self.tx.send(job).is_err() {
            self.pending.leave();
            return Err(EmbedError::Stopped);
        }
        rx.await.map_err(|_| EmbedError::Stopped)?
    }
}
