//! The engine thread: owns the model, the paged KV pool and every
//! sequence, and runs the scheduling loop.
//!
//! Each step: take new requests, drop sequences whose receiver is gone
//! (freeing their blocks), let the scheduler plan the step, run one packed
//! forward over the planned tokens, and sample for each sequence that has
//! caught up with its tokens. Stats are published after every step.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use tch::{Device, Kind};
use tokio::sync::{mpsc, watch};

use crate::admission::Admission;
use crate::kv::KvPool;
use crate::layers::batch::SeqInput;
use crate::models::Model;
use crate::sampler::{Sampler, Sampling};
use crate::scheduler::{Scheduler, SeqState};
use crate::sequence::{
    Gen, device_plan, sample_next, send_logprobs, take_device_pick, take_token, verify,
};
#[path = "worker_beam.rs"]
mod beam_ops;
#[path = "worker_logits.rs"]
mod logits_ops;
#[path = "worker_spec.rs"]
mod spec_ops;

use crate::{
    Command, DeviceChoice, EngineError, EngineOptions, EngineStats, Event, ModelInfo, Usage,
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

pub(crate) struct Spawned {
    pub info: ModelInfo,
    pub stats: watch::Receiver<EngineStats>,
}

pub(crate) fn spawn(
    opts: EngineOptions,
    rx: mpsc::Receiver<Command>,
    admission: Arc<Admission>,
) -> Result<Spawned, EngineError> {
    let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("gyre-engine".into())
        .spawn(move || {
            let _guard = tch::no_grad_guard();
            if let Some(n) = opts.compute_threads {
                tch::set_num_threads(n.max(1) as i32);
            }
            match Worker::load(opts, rx, admission) {
                Ok((worker, spawned)) => {
                    let _ = ready_tx.send(Ok(spawned));
                    worker.run();
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

fn info(model: &dyn Model, kv_tokens: u32, draft: Option<String>) -> ModelInfo {
    let c = model.config();
    let d = Sampling::default();
    ModelInfo {
        architecture: c.architecture.clone(),
        vocab_size: c.vocab_size as u32,
        max_model_len: c.max_position_embeddings as u32,
        kv_capacity_tokens: kv_tokens,
        eos_token_ids: c.eos_token_ids.clone(),
        bos_token_id: c.bos_token_id,
        default_sampling: Sampling {
            temperature: c.default_temperature.unwrap_or(d.temperature),
            top_p: c.default_top_p.unwrap_or(d.top_p),
            top_k: c.default_top_k.unwrap_or(d.top_k),
            min_p: c.default_min_p.unwrap_or(d.min_p),
            repetition_penalty: c.default_repetition_penalty.unwrap_or(d.repetition_penalty),
            ..d
        },
        device: match model.device() {
            Device::Cuda(i) => format!("cuda:{i}"),
            _ => "cpu".into(),
        },
        dtype: format!("{:?}", model.kind()),
        draft_model: draft,
    }
}

struct Worker {
    model: Box<dyn Model>,
    pool: KvPool,
    /// CUDA graphs of decode steps (None off CUDA or where unavailable).
    graphs: Option<crate::graph::DecodeGraphs>,
    sched: Scheduler,
    rx: mpsc::Receiver<Command>,
    waiting: Vec<SeqState>,
    running: Vec<SeqState>,
    gens: HashMap<u64, Gen>,
    /// Beam searches by their first sequence's id, and each beam's group.
    groups: HashMap<u64, beam_ops::Group>,
    beam_of: HashMap<u64, u64>,
    next_id: u64,
    stats_tx: watch::Sender<EngineStats>,
    stats: EngineStats,
    admission: Arc<Admission>,
    /// Sampling on the device: None, when the logits are on CUDA.
    device_sampling: Option<bool>,
    /// The draft model for speculative decoding, when loaded.
    draft: Option<crate::draft::Draft>,
}

impl Worker {
    fn load(
        opts: EngineOptions,
        rx: mpsc::Receiver<Command>,
        admission: Arc<Admission>,
    ) -> Result<(Self, Spawned), EngineError> {
        let (dev, kind) = pick_device(opts.device)?;
        let model = crate::models::load_with(&opts.model_dir, dev, kind, opts.load_options)?;
        let bs = opts.block_size as i64;
        let kv_kind = opts.kv_cache_dtype.kind(dev, kind)?;
        let per_block = model.kv_bytes_per_block(bs, kv_kind).max(1);
        // Enough for every running sequence at full context, within the memory budget.
        let wanted =
            (opts.max_running as i64 * model.config().max_position_embeddings + bs - 1) / bs + 1;
        let num_blocks = match opts.num_blocks {
            Some(n) => n as i64,
            None => wanted.min(opts.kv_cache_bytes as i64 / per_block).max(1),
        };
        // Decode graphs need one slot no sequence owns (padding rows write
        // there): a block past the scheduler's.
        let graphs_on = crate::graph::wanted(model.as_ref());
        let pool = model.new_pool(num_blocks + i64::from(graphs_on), bs, kv_kind)?;
        let graphs = if graphs_on {
            match crate::graph::DecodeGraphs::new(num_blocks * bs) {
                Ok(g) => Some(g),
                Err(e) => {
                    tracing::warn!(error = %e, "CUDA graphs unavailable; decode steps run eagerly");
                    None
                }
            }
        } else {
            None
        };
        tracing::info!(
            blocks = num_blocks,
            block_size = bs,
            dtype = ?kv_kind,
            mib = num_blocks * per_block / (1 << 20),
            "KV cache allocated"
        );
        let draft = match &opts.draft_model_dir {
            Some(path) => Some(
                crate::draft::Draft::load(
                    path,
                    &opts.model_dir,
                    model.as_ref(),
                    opts.draft_num_blocks.unwrap_or(num_blocks as usize),
                    opts.block_size,
                    opts.load_options,
                    kv_kind,
                )
                .map_err(|e| EngineError::Draft(Box::new(e)))?,
            ),
            None => None,
        };
        let info = info(
            model.as_ref(),
            (num_blocks * bs) as u32,
            draft.as_ref().map(|d| d.describe()),
        );
        let stats = EngineStats {
            block_size: bs as u32,
            kv_blocks_total: num_blocks as u32,
            draft_kv_blocks_total: draft.as_ref().map_or(0, |d| d.blocks_total()),
            ..EngineStats::default()
        };
        let (stats_tx, stats_rx) = watch::channel(stats.clone());
        let sched = Scheduler::new(
            num_blocks as u32,
            bs as usize,
            opts.max_running,
            opts.token_budget,
        );
        let worker = Self {
            model,
            pool,
            graphs,
            sched,
            rx,
            waiting: Vec::new(),
            running: Vec::new(),
            gens: HashMap::new(),
            groups: HashMap::new(),
            beam_of: HashMap::new(),
            next_id: 0,
            stats_tx,
            stats,
            admission,
            device_sampling: opts
                .device_sampling
                .or_else(crate::sampler_device::from_env),
            draft,
        };
        Ok((
            worker,
            Spawned {
                info,
                stats: stats_rx,
            },
        ))
    }

    fn run(mut self) {
        loop {
            if self.running.is_empty() && self.waiting.is_empty() {
                self.publish(Some(0));
                match self.rx.blocking_recv() {
                    Some(cmd) => self.accept(cmd),
                    None => return,
                }
            }
            while let Ok(cmd) = self.rx.try_recv() {
                self.accept(cmd);
            }
            self.reap_cancelled();
            self.switch_kv_regimes();
            if let Err(e) = self.propose_drafts() {
                // The draft failed: its sequences decode without it.
                tracing::error!(error = %e, "draft model step failed; decoding without it");
                for s in &mut self.running {
                    s.strip_drafts();
                }
                self.draft = None;
            }
            let mut plan = self.sched.schedule(&mut self.running, &mut self.waiting);
            if self.preempt_groups(&mut plan) && plan.runs.is_empty() {
                continue;
            }
            self.fit_drafts(&plan.runs);
            if plan.runs.is_empty() {
                // Cannot happen with validated requests; never spin on it.
                if let Some(mut s) = (!self.waiting.is_empty()).then(|| self.waiting.remove(0)) {
                    self.sched.free(&mut s);
                    self.fail(
                        s.id,
                        EngineError::Step("request cannot be scheduled".into()),
                    );
                }
                continue;
            }
            let step_tokens: usize = plan.runs.iter().map(|r| r.1).sum();
            // Requests starting now count as running before their first
            // token goes out, so a client holding a token never reads stats
            // without its request.
            self.publish(None);
            if let Err(e) = self.execute(&plan.copies, &plan.runs) {
                tracing::error!(error = %e, "engine step failed");
                for mut s in std::mem::take(&mut self.running) {
                    self.sched.free(&mut s);
                    self.fail(s.id, EngineError::Step(e.to_string()));
                }
            }
            self.publish(Some(step_tokens));
        }
    }

    fn accept(&mut self, cmd: Command) {
        match cmd {
            Command::Add {
                req,
                mut events,
                submitted,
            } => {
                let id = self.next_id;
                self.next_id += 1;
                // Prompt logprobs need every prompt position computed: a salt
                // of its own keeps the request off the shared prefix cache.
                let salt = match req.prompt_logprobs {
                    Some(_) => format!("\u{0}prompt-logprobs-{id}\u{0}{}", req.cache_salt),
                    None => req.cache_salt.clone(),
                };
                let mut seq = SeqState::new(id, req.priority, req.prompt.clone(), salt)
                    .for_tenant(req.tenant.clone(), req.weight);
                set_kv_regime(&mut seq, self.model.kv_regime(req.prompt.len()));
                self.waiting.push(seq);
                if let Some(params) = req.beam {
                    let eos = &self.model.config().eos_token_ids;
                    let group = beam_ops::Group::new(params, &req, eos, events, submitted, id);
                    self.groups.insert(id, group);
                    self.beam_of.insert(id, id);
                    return;
                }
                // Choice i samples with seed + i: choices differ, each reproducible.
                let sampler_for = |i: u64| {
                    let mut sampling = req.sampling.clone();
                    sampling.seed = sampling.seed.map(|x| x.wrapping_add(i));
                    Sampler::new(sampling).with_prompt(&req.prompt)
                };
                let first = events.remove(0);
                let forks = events
                    .into_iter()
                    .enumerate()
                    .map(|(i, ev)| (ev, sampler_for(i as u64 + 1)))
                    .collect();
                self.gens.insert(
                    id,
                    Gen {
                        sampler: sampler_for(0),
                        eos: self.model.config().eos_token_ids.clone(),
                        req,
                        events: first,
                        generated: 0,
                        forks,
                        prompt_lp_done: 0,
                        queued: true,
                        submitted,
                        scheduled: None,
                        first_token: None,
                        draft_q: Vec::new(),
                    },
                );
            }
        }
    }

    /// Frees the blocks of every sequence whose client went away.
    fn reap_cancelled(&mut self) {
        let beams: Vec<u64> = self
            .running
            .iter()
            .chain(self.waiting.iter())
            .map(|s| s.id)
            .filter(|id| self.beam_of.contains_key(id))
            .collect();
        let mut gone_beams = std::collections::HashSet::new();
        for id in beams {
            if self.beam_reap(id) == Some(true) {
                gone_beams.insert(id);
            }
        }
        let beam_of = &self.beam_of;
        let gens = &mut self.gens;
        let sched = &mut self.sched;
        let admission = &self.admission;
        for list in [&mut self.running, &mut self.waiting] {
            list.retain_mut(|s| {
                if beam_of.contains_key(&s.id) {
                    return true;
                }
                let gone = gone_beams.contains(&s.id)
                    || gens.get(&s.id).is_none_or(|g| {
                        g.events.is_closed() && g.forks.iter().all(|(e, _)| e.is_closed())
                    });
                if gone {
                    sched.free(s);
                    if gens.remove(&s.id).is_some_and(|g| g.queued) {
                        admission.leave(1);
                    }
                }
                !gone
            });
        }
    }

    /// Sends a running sequence whose KV regime changed with its length
    /// (longrope past its original maximum) back to wait, its cache
    /// released, to be recomputed in the new regime, as transformers drops
    /// its cache at that point.
    fn switch_kv_regimes(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            let regime = self.model.kv_regime(self.running[i].tokens.len());
            if regime == self.running[i].kv_regime {
                i += 1;
                continue;
            }
            let mut s = self.running.remove(i);
            tracing::debug!(seq = s.id, regime, "KV regime changed; recomputing");
            self.sched.free(&mut s);
            set_kv_regime(&mut s, regime);
            self.waiting.push(s);
        }
    }

    fn fail(&mut self, id: u64, e: EngineError) {
        if self.fail_beam(id, &e) {
            return;
        }
        if let Some(g) = self.gens.remove(&id) {
            if g.queued {
                self.admission.leave(1);
            }
            let _ = g.events.send(Event::Failed(e));
        }
    }

    fn execute(
        &mut self,
        copies: &[(crate::blocks::BlockId, crate::blocks::BlockId)],
        runs: &[(u64, usize)],
    ) -> Result<(), EngineError> {
        for &(src, dst) in copies {
            self.pool.copy_block(src, dst)?;
        }
        let pos: HashMap<u64, usize> = self
            .running
            .iter()
            .enumerate()
            .map(|(i, s)| (s.id, i))
            .collect();
        let now = Instant::now();
        for &(id, _) in runs {
            if let Some(g) = self.gens.get_mut(&id) {
                g.scheduled.get_or_insert(now);
            }
            if let Some(g) = self.beam_of.get(&id).and_then(|g| self.groups.get_mut(g)) {
                g.scheduled.get_or_insert(now);
            }
        }
        let mut inputs = Vec::with_capacity(runs.len());
        let mut rows = Vec::new();
        let mut sampled = Vec::new();
        // (sequence, hidden row, the prompt token that row predicts)
        let mut prompt_rows: Vec<(u64, i64, u32)> = Vec::new();
        let mut row = 0i64;
        for &(id, n) in runs {
            let s = &self.running[pos[&id]];
            if let Some(g) = self
                .gens
                .get(&id)
                .filter(|g| g.req.prompt_logprobs.is_some())
            {
                let prompt_len = g.req.prompt.len();
                for p in s.computed.max(g.prompt_lp_done)..(s.computed + n).min(prompt_len - 1) {
                    let r = row + (p - s.computed) as i64;
                    prompt_rows.push((id, r, g.req.prompt[p + 1]));
                }
            }
            inputs.push(SeqInput {
                tokens: &s.tokens[s.computed..s.computed + n],
                start: s.computed as i64,
                block_table: &s.blocks,
                seq_len: s.tokens.len(),
            });
            row += n as i64;
            if s.computed + n == s.tokens.len() {
                // The last token's row, after the rows of the positions
                // before each speculative token.
                let d = s.drafts as i64;
                rows.extend((0..=d).map(|j| row - 1 - d + j));
                sampled.push((id, s.drafts));
            }
        }
        // A sequence that decodes one plain token (no logprobs, beams,
        // speculation or forks to make) is sampled on the device when the
        // model runs on CUDA; the rest, and every row on the CPU, come to
        // the host. The device's picks are planned (and their data copied
        // over) before the forward pass, so the step's one sync after it is
        // the tokens coming back.
        let on_device = self
            .device_sampling
            .unwrap_or_else(|| self.model.device().is_cuda());
        let vocab = self.model.config().vocab_size as usize;
        let mut failed = Vec::new();
        let mut plans = Vec::new();
        let mut device_at = vec![None; sampled.len()];
        let mut host_at = vec![None; sampled.len()];
        let mut host_rows: Vec<i64> = Vec::new();
        let mut at = 0;
        for (k, &(id, drafts)) in sampled.iter().enumerate() {
            let first = at as i64;
            at += 1 + drafts;
            let plain = drafts == 0
                && !self.beam_of.contains_key(&id)
                && self
                    .gens
                    .get(&id)
                    .is_some_and(|g| g.forks.is_empty() && g.req.logprobs.is_none());
            match self.gens.get_mut(&id) {
                Some(g) if on_device && plain => match device_plan(g, first, vocab) {
                    Ok(p) => {
                        device_at[k] = Some(plans.len());
                        plans.push(p);
                    }
                    Err(e) => failed.push((id, e)),
                },
                _ => {
                    host_at[k] = Some(host_rows.len());
                    host_rows.extend(first..at as i64);
                }
            }
        }
        let prepared =
            crate::sampler_device::Prepared::new(&plans, vocab as i64, self.model.device())?;
        // A step of single-token decodes, each sampled once, replays a CUDA
        // graph where one is available (see `crate::graph`).
        let mut graphed = match self.graphs.as_mut() {
            Some(g) if prompt_rows.is_empty() && rows.len() == inputs.len() => {
                g.decode(self.model.as_ref(), &inputs, &mut self.pool)?
            }
            _ => None,
        };
        let hidden = match graphed {
            Some(_) => None,
            None => Some(self.model.forward(&inputs, &mut self.pool)?),
        };
        drop(inputs);
        for &(id, n) in runs {
            let s = &mut self.running[pos[&id]];
            s.computed += n;
            // Blocks holding speculative tokens are indexed once checked.
            if s.drafts == 0 {
                self.sched.register_full_blocks(s);
            }
        }
        if let (false, Some(hidden)) = (prompt_rows.is_empty(), &hidden) {
            self.send_prompt_logprobs(hidden, &prompt_rows)?;
        }
        if sampled.is_empty() {
            return Ok(());
        }
        let logits = match (graphed.take(), &hidden) {
            (Some(logits), _) => logits,
            (None, Some(hidden)) => self.device_logits(hidden, &rows)?,
            (None, None) => unreachable!("a step is either graphed or eager"),
        };
        let vocab = logits.size()[1] as usize;
        let max_len = self.model.config().max_position_embeddings as usize;
        let mut finished = Vec::new();
        let mut children = Vec::new();
        let mut beam_groups = Vec::new();
        let flat = self.host_rows(&logits, &host_rows, rows.len())?;
        let flat = flat.as_slice();
        let picks = match &prepared {
            Some(p) => p.pick(&logits)?,
            None => Vec::new(),
        };
        drop(logits);
        for (k, (id, drafts)) in sampled.into_iter().enumerate() {
            let host = host_at[k].map(|h| &flat[h * vocab..(h + 1 + drafts) * vocab]);
            if let Some(gid) = host.and_then(|rows| self.beam_row(id, rows)) {
                beam_groups.push(gid);
                continue;
            }
            let s = &mut self.running[pos[&id]];
            let Some(g) = self.gens.get_mut(&id) else {
                continue;
            };
            if let Some(j) = device_at[k] {
                let tok = picks[j];
                if let Err(e) = take_device_pick(g, tok) {
                    failed.push((id, e));
                } else if let Some(reason) = take_token(g, s, tok, max_len, &mut self.stats) {
                    finished.push((id, reason));
                }
                continue;
            }
            // Failed while planning its device pick.
            let Some(rows) = host else {
                continue;
            };
            if drafts > 0 {
                let before = (
                    self.stats.spec_proposed_tokens_total,
                    self.stats.spec_accepted_tokens_total,
                );
                let verified = verify(g, s, rows, vocab, max_len, &mut self.stats);
                if g.req.draft.is_some() && g.req.speculation.is_none() {
                    let st = &mut self.stats;
                    st.draft_proposed_tokens_total += st.spec_proposed_tokens_total - before.0;
                    st.draft_accepted_tokens_total += st.spec_accepted_tokens_total - before.1;
                }
                match verified {
                    Ok(Some(reason)) => finished.push((id, reason)),
                    Ok(None) => {
                        self.sched.trim_blocks(s);
                        self.sched.register_full_blocks(s);
                    }
                    Err(e) => failed.push((id, e)),
                }
                continue;
            }
            let row = rows;
            // Parallel sampling: once the prompt is in the cache, each extra
            // choice becomes a sequence sharing the prompt's blocks (the
            // partial last block is copied on its first write).
            for (events, sampler) in std::mem::take(&mut g.forks) {
                let cid = self.next_id;
                self.next_id += 1;
                for &b in &s.blocks {
                    self.sched.alloc.retain(b);
                }
                let mut cs = SeqState {
                    id: cid,
                    order: cid,
                    priority: s.priority,
                    tenant: s.tenant.clone(),
                    weight: s.weight,
                    tokens: s.tokens.clone(),
                    computed: s.computed,
                    blocks: s.blocks.clone(),
                    hashes: s.hashes.clone(),
                    salt: s.salt.clone(),
                    kv_regime: s.kv_regime,
                    cached_tokens: s.cached_tokens,
                    admitted_once: true,
                    drafts: 0,
                };
                let mut cg = Gen {
                    req: g.req.clone(),
                    events,
                    sampler,
                    generated: 0,
                    eos: g.eos.clone(),
                    forks: Vec::new(),
                    prompt_lp_done: g.prompt_lp_done,
                    queued: false,
                    submitted: g.submitted,
                    scheduled: g.scheduled,
                    first_token: None,
                    draft_q: Vec::new(),
                };
                let tok = match sample_next(&mut cg, row) {
                    Ok(t) => t,
                    Err(e) => {
                        let _ = cg.events.send(Event::Failed(e));
                        for &b in &cs.blocks {
                            self.sched.alloc.release(b);
                        }
                        continue;
                    }
                };
                send_logprobs(&cg, row, tok);
                if let Some(reason) = take_token(&mut cg, &mut cs, tok, max_len, &mut self.stats) {
                    finished.push((cid, reason));
                }
                children.push((cs, cg));
            }
            let tok = match sample_next(g, row) {
                Ok(t) => t,
                Err(e) => {
                    failed.push((id, e));
                    continue;
                }
            };
            send_logprobs(g, row, tok);
            if let Some(reason) = take_token(g, s, tok, max_len, &mut self.stats) {
                finished.push((id, reason));
            }
        }
        for (cs, cg) in children {
            self.gens.insert(cs.id, cg);
            self.running.push(cs);
        }
        self.beam_steps(beam_groups);
        for (id, e) in failed {
            if let Some(i) = self.running.iter().position(|s| s.id == id) {
                let mut s = self.running.swap_remove(i);
                self.sched.free(&mut s);
            }
            self.fail(id, e);
        }
        let end = Instant::now();
        for (id, reason) in finished {
            let Some(i) = self.running.iter().position(|s| s.id == id) else {
                continue;
            };
            let mut s = self.running.swap_remove(i);
            self.sched.free(&mut s);
            let g = self.gens.remove(&id);
            // Started and finished in one step: it never reached `publish`.
            if g.as_ref().is_some_and(|g| g.queued) {
                self.admission.leave(1);
            }
            if let (Some(g), Some(reason)) = (g, reason) {
                let usage = Usage {
                    prompt_tokens: g.req.prompt.len() as u32,
                    completion_tokens: g.generated,
                    cached_tokens: s.cached_tokens as u32,
                };
                let timings = g.timings(end);
                let _ = g.events.send(Event::Finished {
                    reason,
                    usage,
                    timings,
                });
            }
        }
        Ok(())
    }

    /// Publishes the engine's stats; `step_tokens`: the step just run.
    /// None: before a step, and only when requests start in it (the last
    /// step's figures left as they are).
    fn publish(&mut self, step_tokens: Option<usize>) {
        // Requests that started this step stop counting as waiting (after
        // the running count that now includes them is published).
        let mut started = 0;
        for s in &self.running {
            if let Some(g) = self.gens.get_mut(&s.id).filter(|g| g.queued) {
                g.queued = false;
                started += 1;
            }
            if let Some(g) = self.beam_of.get(&s.id).and_then(|g| self.groups.get_mut(g))
                && g.queued
            {
                g.queued = false;
                started += 1;
            }
        }
        if step_tokens.is_none() && started == 0 {
            return;
        }
        self.admission.set_running(self.running.len());
        self.admission.leave(started);
        let st = &mut self.stats;
        let a = &self.sched.alloc;
        st.waiting = self.waiting.len() as u32;
        st.running = self.running.len() as u32;
        st.kv_blocks_used = a.used();
        st.kv_blocks_cached = a.cached();
        st.prefix_query_tokens_total = self.sched.stats.prefix_query_tokens;
        st.prefix_hit_tokens_total = self.sched.stats.prefix_hit_tokens;
        st.preemptions_total = self.sched.stats.preemptions;
        if let Some(d) = self.draft.as_mut() {
            // Sequences that ended or were preempted give their draft
            // blocks back.
            let running: std::collections::HashSet<u64> =
                self.running.iter().map(|s| s.id).collect();
            d.retain(|id| running.contains(&id));
            st.draft_kv_blocks_used = d.blocks_used();
            st.draft_forwards_total = d.forwards;
        }
        if let Some(n) = step_tokens {
            st.last_step_tokens = n as u32;
            if n > 0 {
                st.steps_total += 1;
            }
        }
        let _ = self.stats_tx.send(st.clone());
    }
}

/// Puts `s` in KV regime `regime` (regimes only grow with the length):
/// its salt gains the regime, so keys and values computed in another
/// regime never match its blocks in the prefix cache.
fn set_kv_regime(s: &mut SeqState, regime: u8) {
    if regime != s.kv_regime {
        s.salt = format!("{}\u{0}kv-regime-{regime}", s.salt);
        s.kv_regime = regime;
    }
}
