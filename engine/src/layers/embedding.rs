//! The token embedding: a tensor whose rows are looked up, or, for a GGUF
//! embedding kept quantized (Q8_0/Q5_0/Q4_0/Q4_1/Q4_K/Q6_K on the CPU), its blocks, each
//! looked-up row dequantized as ggml does (bit for bit the row the f32
//! path holds). Keeping the blocks lets a tied LM head share them: for
//! SmolLM2-135M the Q8_0 embedding is 30 MiB instead of 113 MiB of f32, held
//! once for both uses.

use std::sync::Arc;

use tch::{Kind, Tensor};

use super::Backend;
use super::linear::LinearWeight;
use super::weights::Weights;
use crate::EngineError;
use crate::quant::QuantMatrix;

pub(crate) enum Embedding {
    Dense(Tensor),
    Quant(Arc<QuantMatrix>),
}

impl Embedding {
    /// `model.embed_tokens.weight`.
    pub fn load(w: &mut Weights, be: &Backend) -> Result<Self, EngineError> {
        Self::load_named(w, "model.embed_tokens.weight", be)
    }

    pub fn load_named(w: &mut Weights, name: &str, be: &Backend) -> Result<Self, EngineError> {
        Ok(match w.take_linear(name)? {
            LinearWeight::Quant(rows) if be.quant.is_some() => {
                Self::Quant(Arc::new(QuantMatrix::new(&rows)))
            }
            LinearWeight::Quant(rows) => Self::Dense(be.place(rows.dequantize()?)?),
            LinearWeight::Dense(t) => Self::Dense(t),
        })
    }

    /// The rows of the token ids `ids` [N] -> [N, hidden].
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor, EngineError> {
        match self {
            Self::Dense(t) => Ok(t.f_index_select(0, ids)?),
            Self::Quant(q) => {
                let ids: Vec<i64> = Vec::try_from(&ids.f_to_kind(Kind::Int64)?)?;
                q.rows(&ids)
            }
        }
    }
}
