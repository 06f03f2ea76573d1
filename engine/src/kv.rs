//! A per-sequence KV cache: one key and one value tensor per layer, shaped
//! [capacity, kv_heads, head_dim], grown by doubling when full.
//!
//! Attention for a sequence's new tokens runs over its whole cache with
//! libtorch's scaled_dot_product_attention (grouped-query heads via
//! `enable_gqa`).

use tch::{Kind, Tensor};

use crate::EngineError;
use crate::llama::Llama;

pub struct KvCache {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    len: i64,
    cap: i64,
}

impl KvCache {
    /// An empty cache with room for `cap` tokens.
    pub fn new(model: &Llama, cap: i64) -> Result<Self, EngineError> {
        let (layers, nkv, hd) = model.kv_shape();
        let cap = cap.max(16);
        let opts = (model.kind, model.device);
        let mut k = Vec::with_capacity(layers as usize);
        let mut v = Vec::with_capacity(layers as usize);
        for _ in 0..layers {
            k.push(Tensor::f_zeros([cap, nkv, hd], opts)?);
            v.push(Tensor::f_zeros([cap, nkv, hd], opts)?);
        }
        Ok(Self { k, v, len: 0, cap })
    }

    /// Tokens cached so far.
    pub fn len(&self) -> i64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Makes room for `total` tokens.
    pub fn reserve(&mut self, total: i64) -> Result<(), EngineError> {
        if total <= self.cap {
            return Ok(());
        }
        let cap = total.max(self.cap * 2);
        for t in self.k.iter_mut().chain(self.v.iter_mut()) {
            let mut size = t.size();
            size[0] = cap;
            let bigger = Tensor::f_zeros(&size, (t.kind(), t.device()))?;
            bigger
                .f_narrow(0, 0, self.len)?
                .f_copy_(&t.f_narrow(0, 0, self.len)?)?;
            *t = bigger;
        }
        self.cap = cap;
        Ok(())
    }

    /// Writes the new tokens' keys and values ([len, kv_heads, head_dim]) of
    /// `layer` after the cached ones and attends the queries
    /// ([len, heads, head_dim]) over everything cached. Returns [len, heads, head_dim].
    pub fn attend(
        &mut self,
        layer: usize,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<Tensor, EngineError> {
        let len = q.size()[0];
        let past = self.len;
        let total = past + len;
        self.k[layer].f_narrow(0, past, len)?.f_copy_(k)?;
        self.v[layer].f_narrow(0, past, len)?.f_copy_(v)?;
        // [1, heads, len, hd] against [1, kv_heads, total, hd]
        let q = q.f_transpose(0, 1)?.f_unsqueeze(0)?;
        let keys = self.k[layer]
            .f_narrow(0, 0, total)?
            .f_transpose(0, 1)?
            .f_unsqueeze(0)?;
        let vals = self.v[layer]
            .f_narrow(0, 0, total)?
            .f_transpose(0, 1)?
            .f_unsqueeze(0)?;
        let out = if len == 1 {
            Tensor::f_scaled_dot_product_attention::<Tensor>(
                &q, &keys, &vals, None, 0.0, false, None, true,
            )?
        } else if past == 0 {
            Tensor::f_scaled_dot_product_attention::<Tensor>(
                &q, &keys, &vals, None, 0.0, true, None, true,
            )?
        } else {
            // Query i (at position past + i) sees keys 0..=past + i.
            let qi =
                Tensor::f_arange_start(past, total, (Kind::Int64, q.device()))?.f_unsqueeze(1)?;
            let kj = Tensor::f_arange(total, (Kind::Int64, q.device()))?.f_unsqueeze(0)?;
            let mask = kj.f_le_tensor(&qi)?;
            Tensor::f_scaled_dot_product_attention(
                &q,
                &keys,
                &vals,
                Some(&mask),
                0.0,
                false,
                None,
                true,
            )?
        };
        Ok(out.f_squeeze_dim(0)?.f_transpose(0, 1)?)
    }

    /// Marks `n` more tokens as cached (after every layer has written them).
    pub(crate) fn advance(&mut self, n: i64) {
        self.len += n;
    }
}
