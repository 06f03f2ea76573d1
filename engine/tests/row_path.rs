//! The row path (`engine/src/layers/rows.rs`) computes what the tensor path
//! computes, to the bit: the same greedy requests, decoded together on one
//! engine with the row path and on another without it, give the same
//! tokens and the same log-probabilities (every top-5 value, compared as
//! float32 bits), on the random-weight tiny Llama, Mistral with a sliding
//! window, Qwen2 (q/k/v biases) and Gemma 3 (packed float32 weights) and
//! on SmolLM2-135M-Instruct's Q4_1 and Gemma 3 270M's Q4_K_M GGUFs
//! (quantized weights, where the CPU keeps them so), with float32 and
//! float16 KV caches.
//!
//! One test in its own binary: the switch is process-wide.

use std::path::PathBuf;

use gyre_engine::internals::{row_path_steps, set_row_path};
use gyre_engine::{
    DeviceChoice, Engine, EngineOptions, Event, GenerateRequest, KvCacheDtype, Sampling,
};

fn tiny(name: &str) -> PathBuf {
    std::env::var_os("GYRE_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.gyre/models"))
        .join(name)
}

/// A GGUF named by a reference manifest (`sub` of `.gyre/gguf-ref`).
fn gguf(sub: &str) -> PathBuf {
    let refs = std::env::var_os("GYRE_GGUF_REF")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.gyre/gguf-ref"));
    let p = refs.join(sub).join("manifest.json");
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; make the references first: `make models`",
            p.display()
        )
    });
    let m: serde_json::Value = serde_json::from_str(&text).expect("manifest parses");
    PathBuf::from(m["gguf"].as_str().expect("gguf path"))
}

/// What a request gave: its tokens and, per token, the log-probability
/// bits of the chosen token and of the top 5.
type Run = Vec<(Vec<u32>, Vec<Vec<(u32, u32)>>)>;

/// Greedy requests of different prompt lengths, submitted together so
/// that their decodes share steps (and, once the shortest is done, run in
/// smaller batches), on a fresh engine with the row path on or off.
fn run(model: &PathBuf, kv: KvCacheDtype, rows: bool, vocab: u32) -> Run {
    set_row_path(rows);
    let mut o = EngineOptions::new(model);
    o.device = DeviceChoice::Cpu;
    o.kv_cache_dtype = kv;
    let engine = Engine::start(o).expect("engine starts (build fixtures with `make models`)");
    let rxs: Vec<_> = [
        (3u32, 5usize, 24u32),
        (11, 17, 20),
        (29, 40, 12),
        (7, 1, 28),
    ]
    .into_iter()
    .map(|(seed, len, max_tokens)| {
        let prompt = (0..len as u32)
            .map(|i| 10 + (seed * 7919 + i * 104_729) % (vocab - 20))
            .collect();
        engine
            .submit(GenerateRequest {
                sampling: Sampling {
                    temperature: 0.0,
                    ..Sampling::default()
                },
                ignore_eos: true,
                logprobs: Some(5),
                ..GenerateRequest::new(prompt, max_tokens)
            })
            .expect("submit")
    })
    .collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    rxs.into_iter()
        .map(|mut rx| {
            rt.block_on(async {
                let (mut tokens, mut lps) = (Vec::new(), Vec::new());
                while let Some(ev) = rx.recv().await {
                    match ev {
                        Event::Token(t) => tokens.push(t),
                        Event::Logprobs(l) => {
                            let mut row = vec![(l.token, l.logprob.to_bits())];
                            row.extend(l.top.iter().map(|&(t, p)| (t, p.to_bits())));
                            lps.push(row);
                        }
                        Event::Finished { .. } => break,
                        Event::Failed(e) => panic!("request failed: {e}"),
                        _ => {}
                    }
                }
                assert_eq!(tokens.len(), lps.len(), "a log-probability per token");
                (tokens, lps)
            })
        })
        .collect()
}

#[test]
fn the_row_path_decodes_exactly_as_the_tensor_path() {
    for (name, model, vocab) in [
        ("tiny Llama", tiny("tiny-llama"), 32_000),
        // A 24-token sliding window: the longer requests outgrow it.
        (
            "tiny Mistral (sliding window)",
            tiny("tiny-mistral-sw"),
            32_000,
        ),
        // q/k/v biases.
        ("tiny Qwen2", tiny("tiny-qwen2"), 151_000),
        ("SmolLM2 Q4_1", gguf(""), 49_152),
        // Gemma 3: four norms a layer, q/k head norms, GeGLU, sliding
        // layers with their own rotary tables; random f32 weights, then
        // the real 270M's Q4_K_M blocks.
        ("tiny Gemma 3", tiny("tiny-gemma3"), 32_000),
        ("Gemma 3 Q4_K_M", gguf("gemma3"), 262_000),
    ] {
        for kv in [KvCacheDtype::Auto, KvCacheDtype::Float16] {
            let before = row_path_steps();
            let tensors = run(&model, kv, false, vocab);
            assert_eq!(
                row_path_steps(),
                before,
                "{name}: the row path ran while off"
            );
            let rows = run(&model, kv, true, vocab);
            assert!(
                row_path_steps() >= before + 12,
                "{name}, {kv:?} KV: the row path did not take the decode steps"
            );
            assert!(
                tensors.iter().all(|(t, _)| t.len() >= 12),
                "{name}: short runs"
            );
            for (i, (a, b)) in tensors.iter().zip(&rows).enumerate() {
                assert_eq!(a.0, b.0, "{name}, {kv:?} KV, request {i}: tokens differ");
                assert_eq!(
                    a.1, b.1,
                    "{name}, {kv:?} KV, request {i}: log-probabilities differ"
                );
            }
        }
    }
}
