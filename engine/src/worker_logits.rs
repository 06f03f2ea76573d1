//! Logits that come to the host: rows sampled there (logprobs,
//! speculation, forks, beams, and every row on the CPU) and prompt
//! log-probabilities.

use tch::{Device, Tensor};

use super::Worker;
use crate::sequence::PROMPT_LP_ROWS;
use crate::{EngineError, Event};

impl Worker {
    /// Float32 logits of the given rows of `hidden`, where they are computed.
    pub(super) fn device_logits(
        &self,
        hidden: &Tensor,
        rows: &[i64],
    ) -> Result<Tensor, EngineError> {
        let idx = Tensor::from_slice(rows).f_to_device(self.model.device())?;
        self.model.logits(&hidden.f_index_select(0, &idx)?)
    }

    /// Rows `rows` of `logits` (which has `total` rows) on the host, row
    /// after row. All the rows of float32 CPU logits are read in place (a
    /// 16-row step's copy of 2 MB, zeroed first, was a serial 2-3% of it).
    pub(super) fn host_rows(
        &self,
        logits: &Tensor,
        rows: &[i64],
        total: usize,
    ) -> Result<HostRows, EngineError> {
        if rows.is_empty() {
            return Ok(HostRows::Owned(Vec::new()));
        }
        let picked = if rows.len() == total {
            logits.shallow_clone()
        } else {
            logits.f_index_select(0, &Tensor::from_slice(rows).f_to_device(logits.device())?)?
        };
        let host = picked.f_to_device(Device::Cpu)?;
        if crate::attn::f32_view(&host).is_ok() {
            return Ok(HostRows::InPlace(host));
        }
        let numel = host.numel();
        let mut flat = vec![0f32; numel];
        host.f_copy_data(&mut flat, numel)?;
        Ok(HostRows::Owned(flat))
    }

    /// Float32 logits of the given rows of `hidden`, on the host, row after
    /// row; and the vocabulary size (the row length).
    pub(super) fn logits_rows(
        &self,
        hidden: &Tensor,
        rows: &[i64],
    ) -> Result<(HostRows, usize), EngineError> {
        let logits = self.device_logits(hidden, rows)?;
        let vocab = logits.size()[1] as usize;
        let flat = self.host_rows(&logits, rows, rows.len())?;
        Ok((flat, vocab))
    }

    /// Log-probabilities of prompt tokens computed this step (see
    /// `GenerateRequest::prompt_logprobs`), sent to every choice.
    pub(super) fn send_prompt_logprobs(
        &mut self,
        hidden: &Tensor,
        rows: &[(u64, i64, u32)],
    ) -> Result<(), EngineError> {
        let mut per_seq: Vec<(u64, Vec<crate::TokenLogprobs>)> = Vec::new();
        for part in rows.chunks(PROMPT_LP_ROWS) {
            let idx: Vec<i64> = part.iter().map(|r| r.1).collect();
            let (flat, vocab) = self.logits_rows(hidden, &idx)?;
            let flat = flat.as_slice();
            for (i, &(id, _, target)) in part.iter().enumerate() {
                let Some(g) = self.gens.get(&id) else {
                    continue;
                };
                let k = g
                    .req
                    .prompt_logprobs
                    .unwrap_or(0)
                    .min(crate::MAX_TOP_LOGPROBS) as usize;
                let lp = crate::sampler::logprobs(&flat[i * vocab..(i + 1) * vocab], target, k);
                match per_seq.last_mut() {
                    Some((last, list)) if *last == id => list.push(lp),
                    _ => per_seq.push((id, vec![lp])),
                }
            }
        }
        for (id, list) in per_seq {
            let Some(g) = self.gens.get_mut(&id) else {
                continue;
            };
            g.prompt_lp_done += list.len();
            for (events, _) in &g.forks {
                let _ = events.send(Event::PromptLogprobs(list.clone()));
            }
            let _ = g.events.send(Event::PromptLogprobs(list));
        }
        Ok(())
    }
}

/// Logits rows on the host: a contiguous float32 CPU tensor read in place,
/// or a copy.
pub(super) enum HostRows {
    InPlace(Tensor),
    Owned(Vec<f32>),
}

impl HostRows {
    /// The rows, row after row.
    pub(super) fn as_slice(&self) -> &[f32] {
        match self {
            // A contiguous float32 CPU tensor (checked when made).
            Self::InPlace(t) => crate::attn::f32_view(t).unwrap_or(&[]),
            Self::Owned(v) => v,
        }
    }
}
