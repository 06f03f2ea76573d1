//! The BERT encoder against sentence-transformers: the real
//! all-MiniLM-L6-v2 (`make models` links it and writes the references,
//! tests/fixtures/make_embedding_refs.py) embeds each reference sentence's
//! token ids alone and all of them as one mixed-length batch, within 1e-5 of
//! sentence-transformers' `encode` (float32, CPU); concurrent requests are
//! computed together.

use std::path::PathBuf;

use gyre_engine::{DeviceChoice, EmbedEngine, EmbedError, EmbedOptions};
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn models_dir() -> PathBuf {
    std::env::var_os("GYRE_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".gyre/models"))
}

struct Case {
    ids: Vec<u32>,
    embedding: Vec<f32>,
}

fn cases() -> Vec<Case> {
    let path = root().join(".gyre/embed-ref/all-minilm-l6-v2.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run `make models`)", path.display()));
    let v: Value = serde_json::from_str(&text).expect("reference JSON");
    v["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| Case {
            ids: serde_json::from_value(c["token_ids"].clone()).expect("ids"),
            embedding: serde_json::from_value(c["embedding"].clone()).expect("embedding"),
        })
        .collect()
}

fn engine() -> EmbedEngine {
    let mut opts = EmbedOptions::new(models_dir().join("all-minilm-l6-v2"));
    opts.device = DeviceChoice::Cpu;
    EmbedEngine::start(opts).expect("load all-MiniLM-L6-v2")
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn embeddings_match_sentence_transformers_alone_and_batched() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let engine = engine();
    let info = engine.info();
    assert_eq!(
        (info.dimensions, info.max_seq_length, info.normalize),
        (384, 256, true)
    );
    let cases = cases();
    assert!(
        cases.iter().map(|c| c.ids.len()).max() > cases.iter().map(|c| c.ids.len()).min(),
        "the references must mix lengths"
    );
    for c in &cases {
        let got = rt
            .block_on(engine.embed(vec![c.ids.clone()], None))
            .expect("embed");
        let d = max_diff(&got[0], &c.embedding);
        assert!(d < 1e-5, "alone, {} tokens: off by {d}", c.ids.len());
    }
    let all: Vec<Vec<u32>> = cases.iter().map(|c| c.ids.clone()).collect();
    let got = rt.block_on(engine.embed(all, None)).expect("embed batch");
    for (g, c) in got.iter().zip(&cases) {
        let d = max_diff(g, &c.embedding);
        assert!(d < 1e-5, "batched, {} tokens: off by {d}", c.ids.len());
    }
}

#[test]
fn concurrent_requests_share_forward_passes() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .expect("runtime");
    let engine = engine();
    let cases = cases();
    // Each request is large enough that others queue while it runs.
    let jobs: Vec<_> = (0..12)
        .map(|i| {
            let e = engine.clone();
            let inputs: Vec<Vec<u32>> = (0..16)
                .map(|j| cases[(i + j) % cases.len()].ids.clone())
                .collect();
            rt.spawn(async move { e.embed(inputs, None).await })
        })
        .collect();
    for j in jobs {
        let out = rt.block_on(j).expect("join").expect("embed");
        assert_eq!(out.len(), 16);
    }
    let s = engine.stats();
    assert_eq!(s.requests_total, 12);
    assert_eq!(s.inputs_total, 12 * 16);
    assert!(
        s.max_step_requests >= 2,
        "no forward pass served two requests: {s:?}"
    );
    assert!(s.steps_total < 12, "one pass per request: {s:?}");
}

#[test]
fn bad_inputs_are_refused_before_running() {
    let engine = engine();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let too_long = vec![101u32; 257];
    for (inputs, dims, want) in [
        (vec![], None, "NoInputs"),
        (vec![vec![101, 102], vec![]], None, "EmptyInput"),
        (vec![too_long], None, "TooLong"),
        (vec![vec![101, 40_000]], None, "TokenOutOfVocab"),
        (vec![vec![101, 102]], Some(8), "Dimensions"),
    ] {
        let err = rt.block_on(engine.embed(inputs, dims)).expect_err(want);
        let name = match err {
            EmbedError::NoInputs => "NoInputs",
            EmbedError::EmptyInput { index: 1 } => "EmptyInput",
            EmbedError::TooLong {
                len: 257, max: 256, ..
            } => "TooLong",
            EmbedError::TokenOutOfVocab { id: 40_000, .. } => "TokenOutOfVocab",
            EmbedError::Dimensions(_) => "Dimensions",
            other => panic!("{want}: unexpected {other:?}"),
        };
        assert_eq!(name, want);
    }
    assert_eq!(engine.stats().requests_total, 0);
}
