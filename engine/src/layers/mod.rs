//! Building blocks every model family shares: the compute backend, linear
//! layers (with the packed CPU GEMM), norms, rotary embeddings, the gated
//! MLP, weight loading, and the step batch with its one paged-attention
//! entry point. A family file composes these; it never reaches the KV pool,
//! flash attention or the GEMM kernel directly.

pub(crate) mod attention;
pub(crate) mod batch;
pub(crate) mod embedding;
pub(crate) mod linear;
pub(crate) mod mlp;
pub(crate) mod moe;
pub(crate) mod norm;
pub(crate) mod rope;
pub(crate) mod rows;
pub(crate) mod weights;

use std::sync::atomic::{AtomicBool, Ordering};

use tch::{Device, Kind, Tensor};

use crate::EngineError;
use crate::gemm;

/// Where and how a model computes: device, dtype, whether linear layers use
/// the packed GEMM, its thread pool, and whether flash attention (CUDA) is
/// still in use.
pub struct Backend {
    pub(crate) device: Device,
    pub(crate) kind: Kind,
    /// Linear layers run on `gemm`'s packed kernel (float32 CPU with AVX-512).
    pub(crate) packed: bool,
    /// Linear layers given quantized rows keep them quantized and run
    /// `quant`'s kernels with these activations (set by the loader on a
    /// float32 CPU with AVX-512 VNNI, unless told to dequantize); None:
    /// quantized rows are dequantized at load.
    pub(crate) quant: Option<crate::quant::Activations>,
    /// Threads for the packed and quantized linear layers (as many as
    /// libtorch's, the calling thread included).
    pub(crate) pool: gemm::Workers,
    /// On CUDA: flash attention over packed sequences works (cleared, with
    /// a warning, the first time it fails).
    flash: AtomicBool,
}

impl Backend {
    pub(crate) fn new(device: Device, kind: Kind) -> Result<Self, EngineError> {
        let pool = gemm::Workers::new(tch::get_num_threads().max(1) as usize)?;
        if device.is_cuda() && kind == Kind::BFloat16 {
            // Before any step: loading a module inside a graph capture fails.
            crate::fused::prepare();
        }
        Ok(Self {
            device,
            kind,
            packed: device == Device::Cpu && kind == Kind::Float && gemm::available(),
            quant: None,
            pool,
            flash: AtomicBool::new(true),
        })
    }

    /// A CPU float32 tensor (a dequantized weight) on this backend's
    /// device and dtype.
    pub(crate) fn place(&self, t: Tensor) -> Result<Tensor, EngineError> {
        Ok(t.f_to_device(self.device)?.f_to_kind(self.kind)?)
    }

    /// Whether CUDA attention goes through flash attention over packed
    /// sequences (else SDPA per sequence). Always false on the CPU.
    pub fn flash_attention(&self) -> bool {
        self.device.is_cuda() && self.flash.load(Ordering::Relaxed)
    }

    pub fn set_flash_attention(&self, on: bool) {
        self.flash.store(on, Ordering::Relaxed);
    }
}
