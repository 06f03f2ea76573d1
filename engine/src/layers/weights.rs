//! Reading a checkpoint's tensors and handing them to the model code by
//! name, on the model's device and dtype. A GGUF's Q8_0/Q5_0/Q4_0/Q4_1/Q4_K/Q6_K matrices
//! may come as quantized rows ([`QuantRows`]): linear layers and the
//! embedding take them as they are (`take_linear`), anything else gets
//! them dequantized.

use std::collections::HashMap;
use std::path::Path;

use tch::{Device, Kind, Tensor};

use super::linear::LinearWeight;
use crate::EngineError;
use crate::progress::Load;
use crate::quant::QuantRows;

/// A checkpoint's tensors by HuggingFace name; each is taken once.
pub(crate) struct Weights {
    map: HashMap<String, Tensor>,
    quant: HashMap<String, QuantRows>,
    device: Device,
    kind: Kind,
}

impl Weights {
    pub fn new(map: HashMap<String, Tensor>, device: Device, kind: Kind) -> Self {
        Self {
            map,
            quant: HashMap::new(),
            device,
            kind,
        }
    }

    /// Adds matrices kept in their quantized blocks.
    pub fn with_quantized(mut self, quant: HashMap<String, QuantRows>) -> Self {
        self.quant = quant;
        self
    }

    /// The tensor `name`, moved to the model's device and dtype
    /// (dequantized if it came quantized).
    pub fn take(&mut self, name: &str) -> Result<Tensor, EngineError> {
        let t = match self.quant.remove(name) {
            Some(rows) => rows.dequantize()?,
            None => self
                .map
                .remove(name)
                .ok_or_else(|| EngineError::MissingWeight(name.to_string()))?,
        };
        Ok(t.f_to_device(self.device)?.f_to_kind(self.kind)?)
    }

    /// The weight of a linear layer (or embedding): its quantized rows if
    /// it came quantized, else the tensor as `take` gives it.
    pub fn take_linear(&mut self, name: &str) -> Result<LinearWeight, EngineError> {
        match self.quant.remove(name) {
            Some(rows) => Ok(LinearWeight::Quant(rows)),
            None => self.take(name).map(LinearWeight::Dense),
        }
    }

    /// The named linear weights stacked along their outputs: quantized if
    /// all of them are, in one format (else dequantized, as `take_cat`).
    pub fn take_cat_linear(&mut self, names: &[&str]) -> Result<LinearWeight, EngineError> {
        let parts: Option<Vec<&QuantRows>> = names.iter().map(|n| self.quant.get(*n)).collect();
        if let Some(rows) = parts.and_then(|p| QuantRows::cat(&p)) {
            for n in names {
                self.quant.remove(*n);
            }
            return Ok(LinearWeight::Quant(rows));
        }
        self.take_cat(names).map(LinearWeight::Dense)
    }

    /// `take(name)` when `want`, else nothing.
    pub fn maybe(&mut self, name: &str, want: bool) -> Result<Option<Tensor>, EngineError> {
        if want {
            self.take(name).map(Some)
        } else {
            Ok(None)
        }
    }

    /// The named tensors stacked along their first dimension (e.g. q, k and
    /// v projections as one weight).
    pub fn take_cat(&mut self, names: &[&str]) -> Result<Tensor, EngineError> {
        let parts = names
            .iter()
            .map(|n| self.take(n))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Tensor::f_cat(&parts, 0)?)
    }

    /// Drops the tensor `name` unused (a head or buffer the model does
    /// not compute with), so that `finish` does not count it.
    pub fn discard(&mut self, name: &str) {
        self.map.remove(name);
        self.quant.remove(name);
    }

    pub fn contains(&self, name: &str) -> bool {
        self.map.contains_key(name) || self.quant.contains_key(name)
    }

    /// Fails if the checkpoint holds weights the model did not use: a
    /// weight left over means the family would compute something else
    /// than the checkpoint's architecture (rotary `inv_freq` buffers that
    /// old checkpoints carry are recomputed, so they are allowed).
    pub fn finish(self, architecture: &str) -> Result<(), EngineError> {
        let mut left: Vec<&String> = self
            .map
            .keys()
            .chain(self.quant.keys())
            .filter(|k| !k.ends_with("rotary_emb.inv_freq"))
            .collect();
        if left.is_empty() {
            return Ok(());
        }
        left.sort();
        Err(EngineError::Unsupported(format!(
            "{architecture} checkpoint has {} weights the model does not use, e.g. {}",
            left.len(),
            left.iter()
                .take(3)
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )))
    }
}

/// Reads every `*.safetensors` file of the model directory.
pub fn read_weights(dir: &Path, load: &mut Load) -> Result<HashMap<String, Tensor>, EngineError> {
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
