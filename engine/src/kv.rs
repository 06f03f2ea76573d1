//! The paged KV cache: per layer, one preallocated key tensor and one value
//! tensor of `num_blocks * block_size` token slots ([slots, kv_heads, head_dim]).
//! A sequence's tokens live in the blocks of its block table; token at
//! position `p` is in slot `table[p / block_size] * block_size + p % block_size`.
//!
//! Attention gathers a sequence's slots (index_select) and runs libtorch's
//! scaled_dot_product_attention over them (grouped-query heads via
//! `enable_gqa`). On CUDA the same path runs on the GPU. Decodes on the CPU
//! skip the gather: `attn::decode` reads `layer()`'s tensors in place.

use tch::{Device, Kind, Tensor};

use crate::EngineError;
use crate::blocks::BlockId;
use crate::pages::Pages;

/// A zeroed CPU tensor of `shape` over memory of its own, on huge pages
/// where the system allows (see `crate::pages`): decode attention reads
/// each sequence's blocks wherever they lie in the pool, and on 4 KiB
/// pages nearly every block is a page-table walk. The tensor views the
/// memory, which must outlive it.
fn cpu_zeros(shape: [i64; 3], kind: Kind) -> Result<(Tensor, Pages<u8>), EngineError> {
    let elems: i64 = shape.iter().product();
    let bytes = usize::try_from(elems)
        .ok()
        .and_then(|n| n.checked_mul(kind.elt_size_in_bytes()))
        .ok_or_else(|| EngineError::Step(format!("KV pool of {shape:?} is too large")))?;
    let mut mem = Pages::<u8>::zeroed(bytes);
    // Fault the whole pool in now, as libtorch's zeros did: faulting huge
    // pages during decode steps (each zeroed on the spot) cost more than
    // the huge pages saved. One write a page does it; the pages are
    // already zero.
    mem.fault_in();
    #[allow(unsafe_code)]
    // SAFETY: `mem` holds `bytes` zeroed bytes (zero is 0.0 in every float
    // kind), 64-byte aligned, exactly `shape` contiguous elements of
    // `kind`; the pool keeps `mem` alive as long as the tensor (and the
    // tensor is never resized: libtorch refuses to resize borrowed memory).
    let t = unsafe { Tensor::f_from_blob(mem.as_ptr(), &shape, &[], kind, Device::Cpu)? };
    Ok((t, mem))
}

pub struct KvPool {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    block_size: i64,
    /// On the CPU, the memory `k` and `v` view (declared after them, so
    /// dropped after them).
    _memory: Vec<Pages<u8>>,
}

/// Bytes one block takes across all layers (keys and values).
pub fn bytes_per_block(
    layers: i64,
    kv_heads: i64,
    head_dim: i64,
    block_size: i64,
    kind: Kind,
) -> i64 {
    2 * layers * block_size * kv_heads * head_dim * kind.elt_size_in_bytes() as i64
}

impl KvPool {
    pub fn new(
        layers: i64,
        kv_heads: i64,
        head_dim: i64,
        num_blocks: i64,
        block_size: i64,
        kind: Kind,
        device: Device,
    ) -> Result<Self, EngineError> {
        let slots = num_blocks * block_size;
        let shape = [slots, kv_heads, head_dim];
        let mut k = Vec::with_capacity(layers as usize);
        let mut v = Vec::with_capacity(layers as usize);
        let mut memory = Vec::new();
        for _ in 0..layers {
            for t in [&mut k, &mut v] {
                if device == Device::Cpu {
                    let (tensor, mem) = cpu_zeros(shape, kind)?;
                    t.push(tensor);
                    memory.push(mem);
                } else {
                    t.push(Tensor::f_zeros(shape, (kind, device))?);
                }
            }
        }
        Ok(Self {
            k,
            v,
            block_size,
            _memory: memory,
        })
    }

    pub fn block_size(&self) -> i64 {
        self.block_size
    }

    /// Keys and values of `layer`, [slots, kv_heads, head_dim].
    pub(crate) fn layer(&self, layer: usize) -> (&Tensor, &Tensor) {
        (&self.k[layer], &self.v[layer])
    }

    /// Slot indices of positions `from..to` of a sequence with this block table.
    pub fn slots(&self, table: &[BlockId], from: i64, to: i64) -> Vec<i64> {
        (from..to)
            .map(|p| {
                table[(p / self.block_size) as usize] as i64 * self.block_size + p % self.block_size
            })
            .collect()
    }

    /// Stores keys and values ([n, kv_heads, head_dim]) of `layer` at `slots` ([n]).
    pub fn write(
        &mut self,
        layer: usize,
        slots: &Tensor,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<(), EngineError> {
        // A pool of another dtype than the model's (a float16 cache on
        // the CPU) stores the values rounded to its own.
        let kind = self.k[layer].kind();
        let _ = self.k[layer].f_index_copy_(0, slots, &k.f_to_kind(kind)?)?;
        let _ = self.v[layer].f_index_copy_(0, slots, &v.f_to_kind(kind)?)?;
        Ok(())
    }

    /// Copies block `src`'s contents into block `dst` in every layer (copy-on-write).
    pub fn copy_block(&mut self, src: BlockId, dst: BlockId) -> Result<(), EngineError> {
        let bs = self.block_size;
        for t in self.k.iter_mut().chain(self.v.iter_mut()) {
            let from = t.f_narrow(0, src as i64 * bs, bs)?;
            t.f_narrow(0, dst as i64 * bs, bs)?.f_copy_(&from)?;
        }
        Ok(())
    }
}
