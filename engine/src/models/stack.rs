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
use crate::layers::rows::{self, RowParts, RowScratch, RowStep};

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

    /// The layer's parts for the row path (`layers::rows`), where it has
    /// the Llama shape; None takes the tensor path.
    fn row_parts(&self) -> Option<RowParts<'_>> {
        None
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
    /// The row path's buffers (`layers::rows`).
    pub(super) rows: std::sync::Mutex<RowScratch>,
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
        if let Some(h) = self.forward_rows(batch, pool, &rope)? {
            return Ok(h);
        }
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

impl<L: Layer> Decoder<L> {
    /// A step of decodes through the row path (`layers::rows`): None where
    /// the step, the backend or a layer needs the tensor path.
    fn forward_rows(
        &self,
        batch: &StepBatch,
        pool: &mut KvPool,
        rope: &RopeAt,
    ) -> Result<Option<Tensor>, EngineError> {
        let usable = |parts: Option<RowParts<'_>>| {
            parts.is_some_and(|p| p.usable() && rope.rotates_all(p.p.head_dim))
        };
        if !rows::step_fits(batch, &self.be) || !self.layers.iter().all(|l| usable(l.row_parts())) {
            return Ok(None);
        }
        let (cos, sin) = rope.tables(tch::Kind::Float)?;
        let new_slots = rows::new_slots(batch);
        let step = RowStep::new(&cos, &sin, &new_slots)?;
        let x = self.embed_tokens.forward(&batch.ids)?;
        let (be, layers) = (&self.be, self.layers.len());
        let h = rows::run(
            &self.rows,
            &x,
            batch,
            pool,
            be,
            layers,
            self.norm.parts(),
            |i, s, sc| {
                let parts = self.layers[i].row_parts().ok_or_else(|| {
                    EngineError::Step("row path: a layer without its parts".into())
                })?;
                rows::layer(&parts, &step, s, sc)
            },
        )?;
        Ok(Some(h))
    }
}
