//! Whether the models fit the device: each model's budget (its weights as
//! the engine holds them, plus its KV cache budget) against the device's
//! free memory, checked before any weights are loaded.
//!
//! Weights are counted from the checkpoint's tensor index (a GGUF's tensor
//! table, each safetensors file's header): elements times the bytes of the
//! dtype the engine runs in (f32 on the CPU, bf16 on CUDA), but for a
//! GGUF's matrices the engine keeps quantized on the CPU (Q8_0/Q5_0/Q4_0/
//! Q4_1/Q4_K/Q6_K, unless `--dequantize`), counted at the size of the
//! blocks the engine holds them in (Q5_0 as Q8_0, Q4_K at 6 bits a value,
//! Q6_K at 10). The KV cache is its budget capped as the engine caps it
//! (at what `--max-running` sequences of full context need), from the
//! model's config. Free memory is `MemAvailable` from `/proc/meminfo` on the
//! CPU; CUDA's free memory is not queried (libtorch's binding has no
//! `cudaMemGetInfo`), so there only a configured `--device-memory-mib` is
//! checked. `--device-memory-mib` (env `GYRE_DEVICE_MEMORY_MIB`) replaces
//! the measured amount on any device: for tests, and for leaving headroom.

use std::path::Path;

const MIB: f64 = (1u64 << 20) as f64;

/// One model's share of device memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    /// The model's id.
    pub name: String,
    pub weights_bytes: u64,
    pub kv_bytes: u64,
}

impl Budget {
    pub fn total(&self) -> u64 {
        self.weights_bytes.saturating_add(self.kv_bytes)
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / MIB)
}

/// Checks `budgets`, in order, against `available` bytes (of which
/// `reserved` are already promised to models being served): the first
/// model that does not fit is named, with what it needs and by how much it
/// is short.
pub fn check(budgets: &[Budget], available: u64, reserved: u64) -> Result<(), String> {
    let mut used = reserved;
    for b in budgets {
        let left = available.saturating_sub(used);
        if b.total() > left {
            let before = if used == 0 {
                String::new()
            } else {
                format!(" after {} promised to the models before it", mib(used))
            };
            return Err(format!(
                "model `{}` does not fit in device memory: it needs {} (weights {} + KV cache {}), \
                 {} of {} is left{before}; short by {} (lower its kv_cache_mib / --kv-cache-mib, \
                 or serve fewer models)",
                b.name,
                mib(b.total()),
                mib(b.weights_bytes),
                mib(b.kv_bytes),
                mib(left),
                mib(available),
                mib(b.total() - left),
            ));
        }
        used = used.saturating_add(b.total());
    }
    Ok(())
}

/// Free memory of the host, from `/proc/meminfo`'s `MemAvailable`.
pub fn host_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_meminfo(&text)
}

fn parse_meminfo(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib.saturating_mul(1024))
}

/// Bytes the engine will hold for the weights at `path` (a GGUF file or a
/// directory of `*.safetensors`), at `bytes_per_element`, or a GGUF's
/// quantized matrices at their own size when `keep_quantized` (see
/// `gyre_engine::gguf::model::held_bytes`). Unreadable indexes count as 0:
/// loading reports them properly.
pub fn weights_bytes(path: &Path, bytes_per_element: u64, keep_quantized: bool) -> u64 {
    if gyre_engine::gguf::is_gguf(path) {
        return gyre_engine::gguf::GgufFile::open(path)
            .map(|f| gyre_engine::gguf::model::held_bytes(&f, bytes_per_element, keep_quantized))
            .unwrap_or(0);
    }
    safetensors_elements(path).saturating_mul(bytes_per_element)
}

/// The KV pool's geometry as the engine sizes it.
#[derive(Debug, Clone, Copy)]
pub struct KvGeometry {
    pub block_size: u64,
    pub max_running: u64,
    /// An exact number of blocks (`--num-kv-blocks`).
    pub num_blocks: Option<u64>,
    /// Bytes of one cached element (4 on the CPU, 2 on CUDA).
    pub element_bytes: u64,
}

/// The bytes of KV cache the engine will allocate for the model at `path`
/// under a budget of `budget` bytes: the budget, capped (as the engine caps
/// it) at what `max_running` sequences of full context need, or the exact
/// block count. Keys and values of every layer's KV heads; a config that
/// cannot be read leaves the budget as it is.
pub fn kv_bytes(path: &Path, budget: u64, g: KvGeometry) -> u64 {
    let Some((per_block, context)) = kv_block(path, g) else {
        return budget;
    };
    let bs = g.block_size.max(1);
    let blocks = match g.num_blocks {
        Some(n) => n,
        None => {
            let wanted = g.max_running.saturating_mul(context).div_ceil(bs) + 1;
            wanted.min(budget / per_block).max(1)
        }
    };
    blocks.saturating_mul(per_block)
}

/// The bytes of one KV block of the model at `path` (keys and values of
/// every layer's KV heads) and its context length; None when its config
/// cannot be read or gives no cache.
fn kv_block(path: &Path, g: KvGeometry) -> Option<(u64, u64)> {
    use gyre_engine::internals::ModelConfig;
    let c = if gyre_engine::gguf::is_gguf(path) {
        gyre_engine::gguf::GgufFile::open(path)
            .ok()
            .and_then(|f| gyre_engine::gguf::model::config(&f).ok())
    } else {
        ModelConfig::from_dir(path).ok()
    }?;
    let dims = [
        c.num_layers,
        c.num_kv_heads,
        c.head_dim,
        c.max_position_embeddings,
    ];
    let [layers, heads, head_dim, context] = dims.map(|v| u64::try_from(v).unwrap_or(0));
    let per_block = 2 * layers * heads * head_dim * g.block_size.max(1) * g.element_bytes;
    (per_block > 0).then_some((per_block, context))
}

/// The bytes of a draft model's KV pool: as many blocks as its model's
/// pool (`model_kv_bytes` of the model at `model`), each of the draft's
/// size. 0 when either config cannot be read.
pub fn draft_kv_bytes(model: &Path, model_kv_bytes: u64, draft: &Path, g: KvGeometry) -> u64 {
    match (kv_block(model, g), kv_block(draft, g)) {
        (Some((model_block, _)), Some((draft_block, _))) => (model_kv_bytes / model_block)
            .max(1)
            .saturating_mul(draft_block),
        _ => 0,
    }
}

fn safetensors_elements(dir: &Path) -> u64 {
    let Ok(read) = std::fs::read_dir(dir) else {
        return 0;
    };
    read.filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .map(|p| header_elements(&p).unwrap_or(0))
        .sum()
}

/// Elements of every tensor in one safetensors file, from its JSON header
/// (an 8-byte little-endian length, then the header).
fn header_elements(path: &Path) -> Option<u64> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).ok()?;
    let mut len = [0u8; 8];
    f.read_exact(&mut len).ok()?;
    let len = u64::from_le_bytes(len);
    // A header is JSON of names and shapes: far below this.
    if len > 256 << 20 {
        return None;
    }
    let mut header = vec![0u8; usize::try_from(len).ok()?];
    f.read_exact(&mut header).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&header).ok()?;
    Some(
        v.as_object()?
            .iter()
            .filter(|(k, _)| *k != "__metadata__")
            .filter_map(|(_, t)| {
                t.get("shape")?
                    .as_array()?
                    .iter()
                    .map(serde_json::Value::as_u64)
                    .product::<Option<u64>>()
            })
            .sum(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(name: &str, weights: u64, kv: u64) -> Budget {
        Budget {
            name: name.into(),
            weights_bytes: weights << 20,
            kv_bytes: kv << 20,
        }
    }

    #[test]
    fn models_that_fit_pass_and_the_first_that_does_not_is_named() {
        let budgets = [b("a", 100, 64), b("b", 50, 64)];
        assert_eq!(check(&budgets, 300 << 20, 0), Ok(()));
        let e = check(&budgets, 200 << 20, 0).expect_err("an error");
        assert!(e.contains("model `b`"), "{e}");
        assert!(e.contains("needs 114.0 MiB"), "{e}");
        assert!(e.contains("36.0 MiB of 200.0 MiB is left"), "{e}");
        assert!(e.contains("short by 78.0 MiB"), "{e}");
        let e = check(&budgets, 100 << 20, 0).expect_err("an error");
        assert!(
            e.contains("model `a`") && e.contains("short by 64.0 MiB"),
            "{e}"
        );
        // Memory already promised to served models counts.
        let e = check(&[b("c", 10, 10)], 100 << 20, 90 << 20).expect_err("an error");
        assert!(e.contains("short by 10.0 MiB"), "{e}");
    }

    #[test]
    fn meminfo_available_is_read_in_bytes() {
        let text = "MemTotal:       16000000 kB\nMemFree:  100 kB\nMemAvailable:    8000000 kB\n";
        assert_eq!(parse_meminfo(text), Some(8_000_000 * 1024));
        assert_eq!(parse_meminfo("MemTotal: 1 kB\n"), None);
    }

    #[test]
    fn a_draft_pool_has_its_models_blocks_of_its_own_size() {
        let config = |layers: u32| {
            let dir = tempfile::tempdir().expect("ok");
            let cfg = serde_json::json!({
                "architectures": ["LlamaForCausalLM"], "model_type": "llama",
                "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
                "num_hidden_layers": layers, "intermediate_size": 172, "vocab_size": 100,
                "max_position_embeddings": 2048, "rms_norm_eps": 1e-6
            });
            std::fs::write(dir.path().join("config.json"), cfg.to_string()).expect("ok");
            dir
        };
        let (model, draft) = (config(2), config(1));
        let g = KvGeometry {
            block_size: 16,
            max_running: 1,
            num_blocks: None,
            element_bytes: 4,
        };
        // 2 layers x 2 KV heads x 16 dims x 16 tokens x (K, V) x 4 bytes:
        // 8 KiB a block, 128 blocks in 1 MiB; the 1-layer draft's blocks
        // are half as big.
        let kv = kv_bytes(model.path(), 1 << 20, g);
        assert_eq!(kv, 128 * 8192);
        assert_eq!(
            draft_kv_bytes(model.path(), kv, draft.path(), g),
            128 * 4096
        );
        // A config that cannot be read counts nothing.
        let none = tempfile::tempdir().expect("ok");
        assert_eq!(draft_kv_bytes(model.path(), kv, none.path(), g), 0);
    }

    #[test]
    fn safetensors_headers_count_elements() {
        let dir = tempfile::tempdir().expect("ok");
        let header = br#"{"__metadata__":{"format":"pt"},"a":{"dtype":"BF16","shape":[4,8],"data_offsets":[0,64]},"b":{"dtype":"F32","shape":[3],"data_offsets":[64,76]}}"#;
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header);
        bytes.extend(std::iter::repeat_n(0u8, 76));
        std::fs::write(dir.path().join("model.safetensors"), bytes).expect("ok");
        assert_eq!(weights_bytes(dir.path(), 4, true), (32 + 3) * 4);
        assert_eq!(weights_bytes(dir.path(), 2, false), (32 + 3) * 2);
    }
}
