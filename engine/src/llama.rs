//! The Llama decoder family (Llama 2/3/3.1, Mistral, Qwen2) in libtorch.
//!
//! Reference implementation: transformers' `modeling_llama.py` (and
//! `modeling_qwen2.py`, which adds q/k/v biases). Weight names are the
//! checkpoint's own (`model.layers.N.self_attn.q_proj.weight`, ...).
//!
//! `forward` takes a packed batch: the new tokens of several sequences laid
//! end to end, each with its block table into the shared paged KV pool.
//! Linear layers run once over all tokens of all sequences; attention runs
//! per sequence over its own blocks (decodes on the CPU in `attn`'s kernel,
//! reading the pool in place). That lets one step mix prompt prefill
//! chunks and decodes of many sequences.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use tch::{Device, Kind, Tensor};

use crate::EngineError;
use crate::attn;
use crate::blocks::BlockId;
use crate::config::ModelConfig;
use crate::flash;
use crate::gemm;
use crate::kv::KvPool;
use crate::progress::Load;

/// One decoder layer. The q, k and v projections are stacked into one
/// weight (and gate with up), so each runs as one wider GEMM.
struct Layer {
    input_norm: Tensor,
    post_norm: Tensor,
    qkv: Lin,
    qkv_bias: Option<Tensor>,
    o: Lin,
    o_bias: Option<Tensor>,
    gate_up: Lin,
    down: Lin,
}

/// A linear layer's weight [out, in]: packed for `gemm`'s kernel (float32 on
/// a CPU with AVX-512), else a libtorch tensor. `Transposed` keeps [in, out]
/// contiguous: MKL's GEMM is 1.5-2x faster on that layout for the wide
/// vocabulary projection.
enum Lin {
    Packed(gemm::Packed),
    Torch(Tensor),
    Transposed(Tensor),
}

impl Lin {
    fn forward(
        &self,
        x: &Tensor,
        bias: Option<&Tensor>,
        pool: &rayon::ThreadPool,
    ) -> Result<Tensor, EngineError> {
        let y = match self {
            Lin::Packed(p) => p.forward(x, pool)?,
            Lin::Torch(w) => return Ok(x.f_linear(w, bias)?),
            Lin::Transposed(wt) => x.f_matmul(wt)?,
        };
        Ok(match bias {
            Some(b) => y.f_add(b)?,
            None => y,
        })
    }
}

/// A loaded model of the Llama family.
pub struct Llama {
    pub cfg: ModelConfig,
    pub device: Device,
    pub kind: Kind,
    embed: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    lm_head: Lin,
    /// Threads for the packed linear layers (as many as libtorch's).
    pool: rayon::ThreadPool,
    /// On CUDA: flash attention over packed sequences works (cleared,
    /// with a warning, the first time it fails).
    flash: AtomicBool,
    /// RoPE tables [max_positions, head_dim], float32.
    cos: Tensor,
    sin: Tensor,
}

/// One sequence's part of a packed batch.
pub struct SeqInput<'a> {
    /// The new tokens to run (a prompt, a chunk of it, or one decode token).
    pub tokens: &'a [u32],
    /// Position of `tokens[0]`: how many of the sequence's tokens are
    /// already in the KV pool.
    pub start: i64,
    /// The sequence's blocks, covering at least `start + tokens.len()` positions.
    pub block_table: &'a [BlockId],
}

struct Weights {
    map: HashMap<String, Tensor>,
    device: Device,
    kind: Kind,
}

impl Weights {
    fn take(&mut self, name: &str) -> Result<Tensor, EngineError> {
        let t = self
            .map
            .remove(name)
            .ok_or_else(|| EngineError::MissingWeight(name.to_string()))?;
        Ok(t.f_to_device(self.device)?.f_to_kind(self.kind)?)
    }
    fn maybe(&mut self, name: &str, want: bool) -> Result<Option<Tensor>, EngineError> {
        if want {
            self.take(name).map(Some)
        } else {
            Ok(None)
        }
    }
}

/// Reads every `*.safetensors` file of the model directory.
fn read_weights(dir: &Path, load: &mut Load) -> Result<HashMap<String, Tensor>, EngineError> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| EngineError::Load {
            path: dir.display().to_string(),
            reason: e.to_string(),
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(EngineError::Load {
            path: dir.display().to_string(),
            reason: "no *.safetensors files".into(),
        });
    }
    let mut map = HashMap::new();
    let sizes: Vec<u64> = files
        .iter()
        .map(|f| f.metadata().map_or(0, |m| m.len()))
        .collect();
    load.plan(files.len(), sizes.iter().sum());
    for (i, (f, &size)) in files.iter().zip(&sizes).enumerate() {
        load.start_file(f, i + 1, size);
        let tensors = Tensor::read_safetensors(f)?;
        load.advance(size, tensors.len());
        map.extend(tensors);
        load.finish_file();
    }
    Ok(map)
}

impl Llama {
    /// Loads config and weights from a HuggingFace model directory or a
    /// GGUF file (dequantized to `kind` on load).
    pub fn load(path: &Path, device: Device, kind: Kind) -> Result<Self, EngineError> {
        let mut load = Load::begin();
        let (cfg, map) = if crate::gguf::is_gguf(path) {
            let file = crate::gguf::GgufFile::open(path)?;
            let cfg = crate::gguf::model::config(&file)?;
            let map = crate::gguf::model::weights(&file, &cfg, &mut load)?;
            (cfg, map)
        } else {
            (ModelConfig::from_dir(path)?, read_weights(path, &mut load)?)
        };
        let mut w = Weights { map, device, kind };
        let packed = device == Device::Cpu && kind == Kind::Float && gemm::available();
        let lin = |w: Tensor| -> Result<Lin, EngineError> {
            Ok(if packed {
                Lin::Packed(gemm::Packed::new(&w)?)
            } else {
                Lin::Torch(w)
            })
        };
        let mut layers = Vec::with_capacity(cfg.num_layers as usize);
        for i in 0..cfg.num_layers {
            let p = format!("model.layers.{i}.");
            let a = format!("{p}self_attn.");
            let qkv = [
                w.take(&format!("{a}q_proj.weight"))?,
                w.take(&format!("{a}k_proj.weight"))?,
                w.take(&format!("{a}v_proj.weight"))?,
            ];
            let qkv_bias = if cfg.qkv_bias {
                let b = [
                    w.take(&format!("{a}q_proj.bias"))?,
                    w.take(&format!("{a}k_proj.bias"))?,
                    w.take(&format!("{a}v_proj.bias"))?,
                ];
                Some(Tensor::f_cat(&b, 0)?)
            } else {
                None
            };
            let gate_up = [
                w.take(&format!("{p}mlp.gate_proj.weight"))?,
                w.take(&format!("{p}mlp.up_proj.weight"))?,
            ];
            layers.push(Layer {
                input_norm: w.take(&format!("{p}input_layernorm.weight"))?,
                post_norm: w.take(&format!("{p}post_attention_layernorm.weight"))?,
                qkv: lin(Tensor::f_cat(&qkv, 0)?)?,
                qkv_bias,
                o: lin(w.take(&format!("{a}o_proj.weight"))?)?,
                o_bias: w.maybe(&format!("{a}o_proj.bias"), cfg.o_bias)?,
                gate_up: lin(Tensor::f_cat(&gate_up, 0)?)?,
                down: lin(w.take(&format!("{p}mlp.down_proj.weight"))?)?,
            });
            tracing::debug!(layer = i, "layer loaded");
        }
        let embed = w.take("model.embed_tokens.weight")?;
        let norm = w.take("model.norm.weight")?;
        let lm_head = if cfg.tie_word_embeddings && !w.map.contains_key("lm_head.weight") {
            embed.shallow_clone()
        } else {
            w.take("lm_head.weight")?
        };
        let lm_head = match device {
            _ if packed => lin(lm_head)?,
            Device::Cpu => Lin::Transposed(lm_head.f_transpose(0, 1)?.f_contiguous()?),
            _ => Lin::Torch(lm_head),
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(tch::get_num_threads().max(1) as usize)
            .thread_name(|i| format!("gyre-gemm-{i}"))
            .build()
            .map_err(|e| EngineError::Step(format!("cannot start compute threads: {e}")))?;
        let (cos, sin) = rope_tables(&cfg, device)?;
        load.finish(device);
        tracing::info!(
            architecture = %cfg.architecture,
            layers = cfg.num_layers,
            hidden = cfg.hidden_size,
            vocab = cfg.vocab_size,
            ?device,
            ?kind,
            packed_linears = packed,
            "model loaded"
        );
        Ok(Self {
            cfg,
            device,
            kind,
            embed,
            layers,
            norm,
            lm_head,
            pool,
            flash: AtomicBool::new(true),
            cos,
            sin,
        })
    }

    /// Runs the new tokens of every sequence, stores their keys and values in
    /// the pool, and returns the final-normed hidden states [N, hidden] of
    /// all N tokens in input order.
    pub fn forward(&self, seqs: &[SeqInput<'_>], pool: &mut KvPool) -> Result<Tensor, EngineError> {
        let cfg = &self.cfg;
        let (nh, nkv, hd) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
        let dev = self.device;
        let mut ids = Vec::new();
        let mut pos = Vec::new();
        let mut new_slots = Vec::new();
        // Slots of all positions of each sequence; decodes on the CPU use
        // the Rust kernel (`attn`), everything else SDPA over gathered slots.
        let mut all_slots = Vec::with_capacity(seqs.len());
        let cpu_decode = dev == Device::Cpu && self.kind == Kind::Float;
        for s in seqs {
            let end = s.start + s.tokens.len() as i64;
            if (s.block_table.len() as i64) * pool.block_size() < end {
                return Err(EngineError::Step(format!(
                    "block table of {} blocks cannot hold {end} tokens",
                    s.block_table.len()
                )));
            }
            ids.extend(s.tokens.iter().map(|&t| t as i64));
            pos.extend(s.start..end);
            new_slots.extend(pool.slots(s.block_table, s.start, end));
            all_slots.push(pool.slots(s.block_table, 0, end));
        }
        let mut decodes = Vec::new();
        let mut row = 0usize;
        for (s, slots) in seqs.iter().zip(&all_slots) {
            if cpu_decode && s.tokens.len() == 1 {
                decodes.push(attn::DecodeSeq { row, slots });
            }
            row += s.tokens.len();
        }
        // On CUDA: one flash-attention call per layer over the step's keys
        // and values, gathered from the pool into one packed tensor.
        let flash_plan = if dev.is_cuda() && self.flash.load(Ordering::Relaxed) {
            let lens: Vec<(i64, i64)> = seqs
                .iter()
                .zip(&all_slots)
                .map(|(s, slots)| (s.tokens.len() as i64, slots.len() as i64))
                .collect();
            let gather: Vec<i64> = all_slots.iter().flatten().copied().collect();
            Some((
                flash::Varlen::new(&lens, dev)?,
                Tensor::from_slice(&gather).f_to_device(dev)?,
            ))
        } else {
            None
        };
        let heads = attn::Heads {
            heads: nh as usize,
            kv_heads: nkv as usize,
            head_dim: hd as usize,
        };
        let threads = tch::get_num_threads().max(1) as usize;
        let n = ids.len() as i64;
        let ids = Tensor::from_slice(&ids).f_to_device(dev)?;
        let pos = Tensor::from_slice(&pos).f_to_device(dev)?;
        let new_slots = Tensor::from_slice(&new_slots).f_to_device(dev)?;
        let cos = self.cos.f_index_select(0, &pos)?.f_unsqueeze(1)?;
        let sin = self.sin.f_index_select(0, &pos)?.f_unsqueeze(1)?;
        let mut x = self.embed.f_index_select(0, &ids)?;
        for (li, l) in self.layers.iter().enumerate() {
            let _span = tracing::trace_span!("layer", li).entered();
            let h = rms_norm(&x, &l.input_norm, cfg.rms_norm_eps)?;
            let qkv = l.qkv.forward(&h, l.qkv_bias.as_ref(), &self.pool)?;
            let q = qkv.f_narrow(1, 0, nh * hd)?.f_view([n, nh, hd])?;
            let k = qkv.f_narrow(1, nh * hd, nkv * hd)?.f_view([n, nkv, hd])?;
            let v = qkv
                .f_narrow(1, (nh + nkv) * hd, nkv * hd)?
                .f_view([n, nkv, hd])?;
            let q = apply_rope(&q, &cos, &sin)?;
            let k = apply_rope(&k, &cos, &sin)?;
            pool.write(li, &new_slots, &k, &v)?;
            // Attention runs per sequence, over exactly its own positions: a
            // sequence's result never depends on what it is batched with
            // (padded batched attention changes reduction order and rounding).
            // CPU decodes go through the Rust kernel in one call; prefill
            // chunks (and everything on CUDA) through SDPA.
            let mut flashed = None;
            if let Some((varlen, gather)) = &flash_plan {
                let (kc, vc) = pool.layer(li);
                let (keys, vals) = (kc.f_index_select(0, gather)?, vc.f_index_select(0, gather)?);
                match varlen.attend(&q, &keys, &vals) {
                    Ok(out) => flashed = Some(out.f_view([n, nh * hd])?),
                    Err(e) => {
                        // E.g. a GPU flash attention does not support: SDPA
                        // per sequence from now on.
                        tracing::warn!(error = %e, "flash attention unavailable; using SDPA per sequence");
                        self.flash.store(false, Ordering::Relaxed);
                    }
                }
            }
            let decoded = if flashed.is_some() || decodes.is_empty() {
                None
            } else {
                let qc = q.f_contiguous()?;
                let (kc, vc) = pool.layer(li);
                let out = attn::decode(
                    attn::f32_view(&qc)?,
                    attn::f32_view(kc)?,
                    attn::f32_view(vc)?,
                    &decodes,
                    heads,
                    threads,
                );
                Some(Tensor::from_slice(&out).f_view([decodes.len() as i64, nh, hd])?)
            };
            let attn = match (flashed, decoded) {
                (Some(f), _) => f,
                // Only decodes (the common step): the kernel's output is it.
                (None, Some(d)) if decodes.len() == seqs.len() => d.f_view([n, nh * hd])?,
                (None, d) => self.mixed_attention(seqs, &all_slots, d.as_ref(), &q, li, pool)?,
            };
            x = x.f_add(&l.o.forward(&attn, l.o_bias.as_ref(), &self.pool)?)?;
            let h = rms_norm(&x, &l.post_norm, cfg.rms_norm_eps)?;
            let gu = l.gate_up.forward(&h, None, &self.pool)?;
            let inter = cfg.intermediate_size;
            let g = gu.f_narrow(1, 0, inter)?.f_silu()?;
            let u = gu.f_narrow(1, inter, inter)?;
            x = x.f_add(&l.down.forward(&g.f_mul(&u)?, None, &self.pool)?)?;
        }
        rms_norm(&x, &self.norm, cfg.rms_norm_eps)
    }

    /// Attention of a step that has prefill chunks (or runs on CUDA without
    /// flash attention): SDPA per sequence over its gathered slots, CPU
    /// decodes taken from the kernel's output `decoded`.
    fn mixed_attention(
        &self,
        seqs: &[SeqInput<'_>],
        all_slots: &[Vec<i64>],
        decoded: Option<&Tensor>,
        q: &Tensor,
        li: usize,
        pool: &KvPool,
    ) -> Result<Tensor, EngineError> {
        let (nh, hd) = (self.cfg.num_heads, self.cfg.head_dim);
        let mut outs = Vec::with_capacity(seqs.len());
        let mut off = 0i64;
        let mut di = 0i64;
        for (s, slots) in seqs.iter().zip(all_slots) {
            let len = s.tokens.len() as i64;
            match decoded {
                Some(d) if len == 1 => {
                    outs.push(d.f_narrow(0, di, 1)?);
                    di += 1;
                }
                _ => {
                    let slots = Tensor::from_slice(slots).f_to_device(self.device)?;
                    outs.push(pool.attend(li, &q.f_narrow(0, off, len)?, &slots, s.start)?)
                }
            }
            off += len;
        }
        Ok(Tensor::f_cat(&outs, 0)?.f_view([off, nh * hd])?)
    }

    /// Whether CUDA attention goes through flash attention over packed
    /// sequences (else SDPA per sequence). Always false on the CPU.
    pub fn flash_attention(&self) -> bool {
        self.device.is_cuda() && self.flash.load(Ordering::Relaxed)
    }

    /// Turns CUDA flash attention on or off (for comparisons).
    pub fn set_flash_attention(&self, on: bool) {
        self.flash.store(on, Ordering::Relaxed);
    }

    /// Logits (float32) for the given hidden-state rows [B, hidden] -> [B, vocab].
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor, EngineError> {
        let logits = self.lm_head.forward(hidden, None, &self.pool)?;
        Ok(logits.f_to_kind(Kind::Float)?)
    }

    /// Full logits [T, vocab] of a prompt run from scratch in a private
    /// pool (for tests and scoring).
    pub fn score(&self, tokens: &[u32]) -> Result<Tensor, EngineError> {
        let bs = 16;
        let blocks = (tokens.len() as i64 + bs - 1) / bs;
        let mut pool = self.new_pool(blocks.max(1), bs)?;
        let table: Vec<BlockId> = (0..blocks as BlockId).collect();
        let h = self.forward(
            &[SeqInput {
                tokens,
                start: 0,
                block_table: &table,
            }],
            &mut pool,
        )?;
        self.logits(&h)
    }

    /// A KV pool shaped for this model.
    pub fn new_pool(&self, num_blocks: i64, block_size: i64) -> Result<KvPool, EngineError> {
        let c = &self.cfg;
        KvPool::new(
            c.num_layers,
            c.num_kv_heads,
            c.head_dim,
            num_blocks,
            block_size,
            self.kind,
            self.device,
        )
    }

    /// Bytes of KV cache one block of `block_size` tokens takes.
    pub fn kv_bytes_per_block(&self, block_size: i64) -> i64 {
        let c = &self.cfg;
        crate::kv::bytes_per_block(
            c.num_layers,
            c.num_kv_heads,
            c.head_dim,
            block_size,
            self.kind,
        )
    }
}

/// RMSNorm as transformers computes it: in float32, then back to the input kind.
fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor, EngineError> {
    let kind = x.kind();
    let h = x.f_to_kind(Kind::Float)?;
    let var = h
        .f_pow_tensor_scalar(2)?
        .f_mean_dim(-1, true, Kind::Float)?;
    let h = h.f_mul(&var.f_add_scalar(eps)?.f_rsqrt()?)?;
    Ok(w.f_mul(&h.f_to_kind(kind)?)?)
}

/// q * cos + rotate_half(q) * sin, with cos/sin [N, 1, head_dim].
fn apply_rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor, EngineError> {
    let half = x.size()[2] / 2;
    let x1 = x.f_narrow(2, 0, half)?;
    let x2 = x.f_narrow(2, half, half)?;
    let rot = Tensor::f_cat(&[x2.f_neg()?, x1], 2)?;
    let kind = x.kind();
    Ok(x.f_mul(&cos.f_to_kind(kind)?)?
        .f_add(&rot.f_mul(&sin.f_to_kind(kind)?)?)?)
}

/// Inverse frequencies exactly as transformers computes them (float32 tensor
/// ops), including Llama 3.1's frequency-dependent scaling.
fn inv_freq(cfg: &ModelConfig) -> Result<Tensor, EngineError> {
    let dim = cfg.head_dim;
    let exponent = Tensor::f_arange_start_step(0, dim, 2, (Kind::Int64, Device::Cpu))?
        .f_to_kind(Kind::Float)?
        .f_div_scalar(dim as f64)?;
    let base = Tensor::from(cfg.rope_theta as f32);
    let inv = base.f_pow(&exponent)?.f_reciprocal()?;
    let Some(s) = &cfg.rope_scaling else {
        return Ok(inv);
    };
    let low_wavelen = s.original_max_position_embeddings / s.low_freq_factor;
    let high_wavelen = s.original_max_position_embeddings / s.high_freq_factor;
    let wavelen = inv
        .f_reciprocal()?
        .f_mul_scalar(2.0 * std::f64::consts::PI)?;
    let scaled = inv
        .f_div_scalar(s.factor)?
        .f_where_self(&wavelen.f_gt(low_wavelen)?, &inv)?;
    let smooth = wavelen
        .f_reciprocal()?
        .f_mul_scalar(s.original_max_position_embeddings)?
        .f_sub_scalar(s.low_freq_factor)?
        .f_div_scalar(s.high_freq_factor - s.low_freq_factor)?;
    let one_minus = smooth.f_neg()?.f_add_scalar(1.0)?;
    let smoothed = one_minus
        .f_mul(&scaled.f_div_scalar(s.factor)?)?
        .f_add(&smooth.f_mul(&scaled)?)?;
    let medium = wavelen
        .f_lt(high_wavelen)?
        .f_logical_not()?
        .f_logical_and(&wavelen.f_gt(low_wavelen)?.f_logical_not()?)?;
    Ok(smoothed.f_where_self(&medium, &scaled)?)
}

fn rope_tables(cfg: &ModelConfig, device: Device) -> Result<(Tensor, Tensor), EngineError> {
    let inv = inv_freq(cfg)?;
    let t = Tensor::f_arange(cfg.max_position_embeddings, (Kind::Float, Device::Cpu))?;
    let freqs = t.f_unsqueeze(1)?.f_mul(&inv.f_unsqueeze(0)?)?;
    let emb = Tensor::f_cat(&[&freqs, &freqs], 1)?;
    Ok((
        emb.f_cos()?.f_to_device(device)?,
        emb.f_sin()?.f_to_device(device)?,
    ))
}
