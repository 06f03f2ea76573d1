//! What the fixture tests share: the fixture families `make models` builds
//! and their transformers goldens (`golden.json`).

use std::path::PathBuf;

use serde_json::Value;

pub const MODELS: [&str; 11] = [
    "tiny-llama",
    "tiny-mistral",
    "tiny-qwen2",
    "tiny-qwen3",
    "tiny-mistral-sw",
    "tiny-gemma3",
    "tiny-gemma2",
    // Phi-3 (sliding window), Phi-4-mini style (longrope, partial rotary),
    // and the mixture-of-experts families.
    "tiny-phi3",
    "tiny-phi4",
    "tiny-mixtral",
    "tiny-qwen3-moe",
];

pub fn models_dir() -> PathBuf {
    std::env::var_os("GYRE_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.gyre/models"))
}

pub fn golden(model: &str) -> (PathBuf, Value) {
    let dir = models_dir().join(model);
    let text = std::fs::read_to_string(dir.join("golden.json")).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; build the fixtures first: `make models`",
            dir.join("golden.json").display()
        )
    });
    (
        dir,
        serde_json::from_str(&text).expect("golden.json parses"),
    )
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id list")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}
