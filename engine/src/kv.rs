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

pub struct KvPool {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    block_size: i64,
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
        let mut k = Vec::with_capacity(layers as usize);
        let mut v = Vec::with_capacity(layers as usize);
        for _ in 0..layers {
            k.push(Tensor::f_zeros(
                [slots, kv_heads, head_dim],
                (kind, device),
            )?);
            v.push(Tensor::f_zeros(
                [slots, kv_heads, head_dim],
                (kind, device),
            )?);
        }
        Ok(Self { k, v, block_size })
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
        let _ = self.k[layer].f_index_copy_(0, slots, k)?;
        let _ = self.v[layer].f_index_copy_(0, slots, v)?;
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
