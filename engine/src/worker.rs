//! The engine thread: owns the model and every sequence's KV cache, and runs
//! the batching loop.
//!
//! Each step, new requests join the batch (their prompts prefilled, within a
//! token budget) beside the decode tokens of the running sequences; one packed
//! forward serves them all; then each sequence samples its next token and is
//! told about it. A sequence whose event receiver was dropped is removed
//! before the next step, freeing its cache.

use std::collections::VecDeque;

use tch::{Device, Kind, Tensor};
use tokio::sync::mpsc;

use crate::kv::KvCache;
use crate::llama::{Llama, SeqInput};
use crate::sampler::{Sampler, Sampling};
use crate::{
    Command, DeviceChoice, EngineError, EngineOptions, Event, FinishReason, GenerateRequest,
    ModelInfo, Usage,
};

/// The device and dtype: bf16 on CUDA, f32 on CPU.
pub(crate) fn pick_device(choice: DeviceChoice) -> Result<(Device, Kind), EngineError> {
    let cuda = tch::Cuda::is_available();
    match choice {
        DeviceChoice::Cpu => Ok((Device::Cpu, Kind::Float)),
        DeviceChoice::Auto if !cuda => Ok((Device::Cpu, Kind::Float)),
        DeviceChoice::Auto | DeviceChoice::Cuda if cuda => Ok((Device::Cuda(0), Kind::BFloat16)),
        _ => Err(EngineError::Unsupported(
            "CUDA was requested but libtorch sees no CUDA device".into(),
        )),
    }
}

struct Seq {
    req: GenerateRequest,
    events: mpsc::UnboundedSender<Event>,
    sampler: Sampler,
    cache: Option<KvCache>,
    /// Tokens to run at the next step: the prompt, then each sampled token.
    pending: Vec<u32>,
    generated: u32,
    /// The model's EOS ids.
    eos: Vec<u32>,
}

impl Seq {
    fn finish(&self, reason: FinishReason) {
        let usage = Usage {
            prompt_tokens: self.req.prompt.len() as u32,
            completion_tokens: self.generated,
            cached_tokens: 0,
        };
        // A closed receiver means the request was cancelled: nothing to tell.
        let _ = self.events.send(Event::Finished { reason, usage });
    }
}

pub(crate) fn spawn(
    opts: EngineOptions,
    rx: mpsc::Receiver<Command>,
) -> Result<ModelInfo, EngineError> {
    let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("gyre-engine".into())
        .spawn(move || {
            let _guard = tch::no_grad_guard();
            let loaded = pick_device(opts.device)
                .and_then(|(dev, kind)| Llama::load(&opts.model_dir, dev, kind));
            match loaded {
                Ok(model) => {
                    let _ = ready_tx.send(Ok(info(&model)));
                    Worker::new(model, opts, rx).run();
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            }
        })
        .map_err(|e| EngineError::Load {
            path: "engine thread".into(),
            reason: e.to_string(),
        })?;
    ready_rx.recv().map_err(|_| EngineError::Stopped)?
}

fn info(model: &Llama) -> ModelInfo {
    let c = &model.cfg;
    let d = Sampling::default();
    ModelInfo {
        architecture: c.architecture.clone(),
        vocab_size: c.vocab_size as u32,
        max_model_len: c.max_position_embeddings as u32,
        eos_token_ids: c.eos_token_ids.clone(),
        bos_token_id: c.bos_token_id,
        default_sampling: Sampling {
            temperature: c.default_temperature.unwrap_or(d.temperature),
            top_p: c.default_top_p.unwrap_or(d.top_p),
            top_k: c.default_top_k.unwrap_or(d.top_k),
            seed: None,
        },
        device: match model.device {
            Device::Cuda(i) => format!("cuda:{i}"),
            _ => "cpu".into(),
        },
        dtype: format!("{:?}", model.kind),
    }
}

struct Worker {
    model: Llama,
    opts: EngineOptions,
    rx: mpsc::Receiver<Command>,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
}

impl Worker {
    fn new(model: Llama, opts: EngineOptions, rx: mpsc::Receiver<Command>) -> Self {
        Self {
            model,
            opts,
            rx,
            waiting: VecDeque::new(),
            running: Vec::new(),
        }
    }

    fn run(mut self) {
        loop {
            if self.running.is_empty() && self.waiting.is_empty() {
                match self.rx.blocking_recv() {
                    Some(cmd) => self.accept(cmd),
                    None => return,
                }
            }
            while let Ok(cmd) = self.rx.try_recv() {
                self.accept(cmd);
            }
            self.running.retain(|s| !s.events.is_closed());
            self.waiting.retain(|s| !s.events.is_closed());
            self.admit();
            if self.running.is_empty() {
                continue;
            }
            if let Err(e) = self.step() {
                tracing::error!(error = %e, "engine step failed");
                for s in self.running.drain(..) {
                    let _ = s
                        .events
                        .send(Event::Failed(EngineError::Step(e.to_string())));
                }
            }
        }
    }

    fn accept(&mut self, cmd: Command) {
        match cmd {
            Command::Add { req, events } => {
                let sampler = Sampler::new(req.sampling.clone());
                self.waiting.push_back(Seq {
                    pending: req.prompt.clone(),
                    req,
                    events,
                    sampler,
                    cache: None,
                    generated: 0,
                    eos: self.model.cfg.eos_token_ids.clone(),
                });
            }
        }
    }

    /// Moves waiting requests into the batch while the prefill budget and the
    /// running limit allow (always at least one when nothing runs).
    fn admit(&mut self) {
        let mut budget = self.opts.prefill_budget;
        while let Some(next) = self.waiting.front() {
            let need = next.pending.len();
            let full = self.running.len() >= self.opts.max_running;
            let fits = need <= budget || self.running.is_empty();
            if full || !fits {
                break;
            }
            budget = budget.saturating_sub(need);
            if let Some(s) = self.waiting.pop_front() {
                self.running.push(s);
            }
        }
    }

    fn step(&mut self) -> Result<(), EngineError> {
        for s in self.running.iter_mut() {
            if s.cache.is_none() {
                let cap = s.req.prompt.len() as i64 + (s.req.max_tokens as i64).min(256);
                s.cache = Some(KvCache::new(&self.model, cap)?);
            }
        }
        let pending: Vec<Vec<u32>> = self
            .running
            .iter_mut()
            .map(|s| std::mem::take(&mut s.pending))
            .collect();
        let mut inputs = Vec::with_capacity(self.running.len());
        let mut last_rows = Vec::with_capacity(self.running.len());
        let mut row = 0i64;
        for (s, toks) in self.running.iter_mut().zip(&pending) {
            row += toks.len() as i64;
            last_rows.push(row - 1);
            if let Some(cache) = s.cache.as_mut() {
                inputs.push(SeqInput {
                    tokens: toks,
                    cache,
                });
            }
        }
        let hidden = self.model.forward(&mut inputs)?;
        drop(inputs);
        let idx = Tensor::from_slice(&last_rows).f_to_device(self.model.device)?;
        let logits = self
            .model
            .logits(&hidden.f_index_select(0, &idx)?)?
            .f_to_device(Device::Cpu)?;
        let vocab = logits.size()[1] as usize;
        let numel = logits.numel();
        let mut flat = vec![0f32; numel];
        logits.f_copy_data(&mut flat, numel)?;
        let max_len = self.model.cfg.max_position_embeddings as usize;
        let mut done = Vec::new();
        for (i, s) in self.running.iter_mut().enumerate() {
            let tok = s.sampler.sample(&flat[i * vocab..(i + 1) * vocab]);
            s.generated += 1;
            if s.events.send(Event::Token(tok)).is_err() {
                done.push(i);
                continue;
            }
            let is_stop =
                (!s.req.ignore_eos && s.eos.contains(&tok)) || s.req.stop_token_ids.contains(&tok);
            let total = s.req.prompt.len() + s.generated as usize;
            if is_stop {
                s.finish(FinishReason::Stop(tok));
                done.push(i);
            } else if s.generated >= s.req.max_tokens || total >= max_len {
                s.finish(FinishReason::Length);
                done.push(i);
            } else {
                s.pending.push(tok);
            }
        }
        for i in done.into_iter().rev() {
            self.running.swap_remove(i);
        }
        Ok(())
    }
}
