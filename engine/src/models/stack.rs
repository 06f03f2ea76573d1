//! The decoder stack most families share: embed the step's tokens, run each
//! decoder layer with the step's rotary tables, apply the final norm, and
//! project chosen rows to logits. A family supplies only its layer (`Layer`)
//! and builds a `Decoder` from its weights; families whose model level
//! differs (Gemma's scaled embeddings and logit soft-capping) keep their own.

use tch::Tensor;

use super::Model;
use crate::EngineError;
use crate::config::ModelConfig;
use crate::kv::KvPool;
use crate::layers::Backend;
use crate::layers::attention::LayerStep;
use crate::layers::batch::StepBatch;
use crate::layers::embedding::Embedding;
use crate::layers::linear::Linear;
use crate::layers::norm::RmsNorm;
use crate::layers::rope::{Rope, RopeAt};

/// One decoder layer of a family.
pub(super) trait Layer: Send {
    fn forward(
        &self,
        x: &Tensor,
        rope: &RopeAt,
        s: &mut LayerStep<'_>,
    ) -> Result<Tensor, EngineError>;

    /// Whether the layer reads device values on the host (a mixture of
    /// experts' routing): such a forward cannot be captured in a CUDA graph.
    fn host_sync(&self) -> bool {
        false
    }
}

/// Embedding, layers, final RMSNorm and LM head.
pub(super) struct Decoder<L> {
    pub(super) cfg: ModelConfig,
    pub(super) be: Backend,
    pub(super) embed_tokens: Embedding,
    pub(super) layers: Vec<L>,
    pub(super) norm: RmsNorm,
    pub(super) lm_head: Linear,
    pub(super) rope: Rope,
}

impl<L: Layer> Model for Decoder<L> {
    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn backend(&self) -> &Backend {
        &self.be
    }

    fn forward_batch(&self, batch: &StepBatch, pool: &mut KvPool) -> Result<Tensor, EngineError> {
        // The step's tables: by position, or (longrope) per sequence.
        let rope = self.rope.at_step(batch)?;
        let mut x = self.embed_tokens.forward(&batch.ids)?;
        for (layer, l) in self.layers.iter().enumerate() {
            let _span = tracing::trace_span!("layer", layer).entered();
            let mut s = LayerStep {
                batch,
                be: &self.be,
                pool: &mut *pool,
                layer,
            };
            x = l.forward(&x, &rope, &mut s)?;
        }
        self.norm.forward(&x)
    }

    fn cuda_graphs(&self) -> bool {
        self.be.device.is_cuda()
            && !self.rope.is_longrope()
            && !self.layers.iter().any(Layer::host_sync)
    }

    fn kv_regime(&self, seq_len: usize) -> u8 {
        self.rope.regime(seq_len)
    }

    fn logits(&self, hidden: &Tensor) -> Result<Tensor, EngineError> {
        Ok(self
            .lm_head
            .forward(hidden, &self.be)?
            .f_to_kind(tch::Kind::Float)?)
    }
}
