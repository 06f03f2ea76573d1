//! The embedding worker thread: it owns the encoder and batches every
//! queued request's inputs together.
//!
//! Each round takes all requests waiting on the channel (blocking for the
//! first), drops those whose caller has gone, and sorts their inputs by
//! length (length bucketing). It then runs them in steps, shortest first:
//! a step takes inputs while their count times the longest one stays within
//! `max_batch_tokens`. Projections and norms run on the step's tokens
//! packed without padding; attention runs padded to the step's longest
//! input, which the sorting keeps close to every input's own length. A
//! request is answered as soon as its last input is computed; requests that
//! arrive meanwhile form the next round.

use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex};

use tch::Kind;

use super::bert::Bert;
use super::config::EncoderConfig;
use super::{EmbedError, EmbedInfo, EmbedOptions, EmbedStats, Job, Pending};
use crate::EngineError;
use crate::layers::Backend;
use crate::layers::weights::{Weights, read_weights};
use crate::progress::{Load, device_name};

struct Worker {
    model: Bert,
    cfg: EncoderConfig,
    max_batch_tokens: usize,
    stats: Arc<Mutex<EmbedStats>>,
    pending: Arc<Pending>,
}

/// A request being computed: its vectors so far.
struct Open {
    job: Job,
    out: Vec<Option<Vec<f32>>>,
    left: usize,
}

type Spawned = (Sender<Job>, EmbedInfo);

pub(super) fn spawn(
    opts: EmbedOptions,
    stats: Arc<Mutex<EmbedStats>>,
    pending: Arc<Pending>,
) -> Result<Spawned, EngineError> {
    let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
    let (tx, rx) = std::sync::mpsc::channel::<Job>();
    let path = opts.model_dir.display().to_string();
    std::thread::Builder::new()
        .name("gyre-embed".into())
        .spawn(move || {
            let _guard = tch::no_grad_guard();
            if let Some(n) = opts.compute_threads {
                tch::set_num_threads(n.max(1) as i32);
            }
            match load(&opts, stats, pending) {
                Ok((worker, info)) => {
                    let _ = ready_tx.send(Ok(info));
                    worker.run(rx);
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            }
        })
        .map_err(|e| EngineError::Load {
            path,
            reason: format!("cannot start the embedding thread: {e}"),
        })?;
    let info = ready_rx.recv().map_err(|_| EngineError::Stopped)??;
    Ok((tx, info))
}

fn load(
    opts: &EmbedOptions,
    stats: Arc<Mutex<EmbedStats>>,
    pending: Arc<Pending>,
) -> Result<(Worker, EmbedInfo), EngineError> {
    let dir = &opts.model_dir;
    let cfg = EncoderConfig::from_dir(dir)?;
    // Embeddings are computed in float32 on every device.
    let (device, _) = crate::worker::pick_device(opts.device)?;
    let kind = Kind::Float;
    let mut progress = Load::begin();
    let mut map = read_weights(dir, &mut progress)?;
    // Checkpoints saved from a task model carry a `bert.` prefix.
    if map.keys().any(|k| k.starts_with("bert.")) {
        map = map
            .into_iter()
            .map(|(k, v)| (k.strip_prefix("bert.").map(str::to_string).unwrap_or(k), v))
            .collect();
    }
    let backend = Backend::new(device, kind)?;
    let mut w = Weights::new(map, device, kind);
    let model = Bert::load(&cfg, &mut w, backend)?;
    w.finish(&cfg.architecture)?;
    progress.finish(device);
    let info = EmbedInfo {
        architecture: cfg.architecture.clone(),
        vocab_size: cfg.vocab_size as u32,
        max_seq_length: cfg.max_seq_length,
        dimensions: cfg.hidden_size as u32,
        pooling: cfg.pooling,
        normalize: cfg.normalize,
        matryoshka: cfg.matryoshka.clone(),
        device: device_name(device),
    };
    tracing::info!(
        architecture = %cfg.architecture,
        layers = cfg.num_layers,
        hidden = cfg.hidden_size,
        pooling = cfg.pooling.name(),
        normalize = cfg.normalize,
        max_seq_length = cfg.max_seq_length,
        "embedding model loaded"
    );
    Ok((
        Worker {
            model,
            cfg,
            max_batch_tokens: opts.max_batch_tokens,
            stats,
            pending,
        },
        info,
    ))
}

/// `v` cut to `dims` and scaled to unit length (as
/// `torch.nn.functional.normalize`, eps 1e-12) when `normalize`.
fn finish_vector(mut v: Vec<f32>, dims: Option<u32>, normalize: bool) -> Vec<f32> {
    if let Some(d) = dims {
        v.truncate(d as usize);
    }
    if normalize {
        let norm = v
            .iter()
            .map(|&x| f64::from(x) * f64::from(x))
            .sum::<f64>()
            .sqrt();
        let scale = 1.0 / norm.max(1e-12);
        for x in &mut v {
            *x = (f64::from(*x) * scale) as f32;
        }
    }
    v
}

impl Worker {
    fn run(self, rx: Receiver<Job>) {
        loop {
            let Ok(first) = rx.recv() else {
                return;
            };
            let mut jobs = vec![first];
            loop {
                match rx.try_recv() {
                    Ok(job) => jobs.push(job),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => break,
                }
            }
            self.round(jobs);
        }
    }

    fn answer(&self, job: Job, result: Result<Vec<Vec<f32>>, EmbedError>) {
        let inputs = job.inputs.len() as u64;
        let tokens: u64 = job.inputs.iter().map(|i| i.len() as u64).sum();
        // Counted before the caller hears back, so that what it reads next
        // includes its own request.
        if let Ok(mut s) = self.stats.lock() {
            s.requests_total += 1;
            s.inputs_total += inputs;
            s.tokens_total += tokens;
        }
        let _ = job.reply.send(result);
        self.pending.leave();
    }

    /// Answers a request whose every input is computed.
    fn complete(&self, done: Open) {
        let dims = done.job.dimensions;
        let normalize = self.cfg.normalize;
        let out = done
            .out
            .into_iter()
            .map(|v| finish_vector(v.unwrap_or_default(), dims, normalize))
            .collect();
        self.answer(done.job, Ok(out));
    }

    fn round(&self, jobs: Vec<Job>) {
        let mut open: Vec<Option<Open>> = Vec::with_capacity(jobs.len());
        for job in jobs {
            if job.reply.is_closed() {
                // The caller is gone: nothing to compute.
                self.pending.leave();
                continue;
            }
            let n = job.inputs.len();
            open.push(Some(Open {
                job,
                out: vec![None; n],
                left: n,
            }));
        }
        // (request, input, length), shortest first.
        let mut items: Vec<(usize, usize, usize)> = open
            .iter()
            .enumerate()
            .filter_map(|(r, o)| o.as_ref().map(|o| (r, o)))
            .flat_map(|(r, o)| {
                o.job
                    .inputs
                    .iter()
                    .enumerate()
                    .map(move |(i, s)| (r, i, s.len()))
            })
            .collect();
        items.sort_by_key(|&(_, _, len)| len);
        let mut start = 0;
        while start < items.len() {
            let mut end = start + 1;
            while end < items.len() && (end + 1 - start) * items[end].2 <= self.max_batch_tokens {
                end += 1;
            }
            let step = &items[start..end];
            start = end;
            // Skip inputs of requests already answered (failed) or abandoned.
            let live: Vec<&(usize, usize, usize)> = step
                .iter()
                .filter(|(r, ..)| open[*r].as_ref().is_some_and(|o| !o.job.reply.is_closed()))
                .collect();
            if live.is_empty() {
                continue;
            }
            let result = {
                let seqs: Vec<&[u32]> = live
                    .iter()
                    .filter_map(|(r, i, _)| open[*r].as_ref().map(|o| o.job.inputs[*i].as_slice()))
                    .collect();
                self.step(&seqs)
            };
            let mut requests: Vec<usize> = live.iter().map(|(r, ..)| *r).collect();
            requests.sort_unstable();
            requests.dedup();
            if let Ok(mut s) = self.stats.lock() {
                s.steps_total += 1;
                s.max_step_requests = s.max_step_requests.max(requests.len() as u32);
                s.max_step_inputs = s.max_step_inputs.max(live.len() as u32);
            }
            tracing::debug!(
                inputs = live.len(),
                requests = requests.len(),
                longest = live.last().map_or(0, |x| x.2),
                "embedding step"
            );
            match result {
                Ok(vectors) => {
                    for ((r, i, _), v) in live.iter().zip(vectors) {
                        let Some(o) = open[*r].as_mut() else { continue };
                        o.out[*i] = Some(v);
                        o.left -= 1;
                        if o.left == 0
                            && let Some(done) = open[*r].take()
                        {
                            self.complete(done);
                        }
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "embedding step failed");
                    for r in requests {
                        if let Some(done) = open[r].take() {
                            self.answer(
                                done.job,
                                Err(EmbedError::Engine(EngineError::Step(e.to_string()))),
                            );
                        }
                    }
                }
            }
        }
        // Requests whose caller left before their inputs ran.
        for o in open.into_iter().flatten() {
            self.pending.leave();
            drop(o);
        }
    }

    /// One forward pass: pooled vectors, in order.
    fn step(&self, seqs: &[&[u32]]) -> Result<Vec<Vec<f32>>, EngineError> {
        let pooled = self.model.embed(seqs, self.cfg.pooling)?;
        let flat: Vec<f32> = Vec::<f32>::try_from(pooled.f_flatten(0, -1)?)?;
        let dim = self.cfg.hidden_size as usize;
        Ok(flat.chunks(dim).map(<[f32]>::to_vec).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::finish_vector;

    #[test]
    fn vectors_are_cut_then_normalized() {
        let v = finish_vector(vec![3.0, 4.0, 12.0], Some(2), true);
        assert_eq!(v.len(), 2);
        assert!(
            (v[0] - 0.6).abs() < 1e-7 && (v[1] - 0.8).abs() < 1e-7,
            "{v:?}"
        );
        let raw = finish_vector(vec![3.0, 4.0, 12.0], None, false);
        assert_eq!(raw, vec![3.0, 4.0, 12.0]);
        // A zero vector stays zero rather than becoming NaN.
        assert_eq!(finish_vector(vec![0.0, 0.0], None, true), vec![0.0, 0.0]);
    }
}
