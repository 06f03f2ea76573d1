//! Beam search against transformers' `generate(num_beams=…,
//! num_return_sequences=…, length_penalty=…, early_stopping=…,
//! do_sample=False)` on every fixture family: `make models` records the
//! references (`tests/fixtures/make_beam_refs.py`, in `.gyre/beam-ref`).
//! The returned hypotheses must be the same token sequences, in the same
//! order, with the same finish, and scores within a tolerance; also when
//! the KV cache is too small for two searches at once (beams preempted
//! and resumed as groups) and with a token budget smaller than the width.

mod common;

use common::{MODELS, golden, ids, models_dir};
use gyre_engine::{
    BeamSearch, DeviceChoice, EarlyStopping, Engine, EngineError, EngineOptions, Event,
    FinishReason, GenerateRequest,
};
use serde_json::Value;

fn reference(model: &str) -> Value {
    let path = models_dir()
        .join("../beam-ref")
        .join(format!("{model}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; build the references first: `make models`",
            path.display()
        )
    });
    serde_json::from_str(&text).expect("reference parses")
}

fn request(prompt: &[u32], case: &Value) -> (GenerateRequest, u32) {
    let early = match &case["early_stopping"] {
        Value::Bool(true) => EarlyStopping::Always,
        Value::String(s) if s == "never" => EarlyStopping::Never,
        _ => EarlyStopping::Heuristic,
    };
    let req = GenerateRequest {
        stop_token_ids: case["extra_stop_token_id"]
            .as_u64()
            .map(|t| vec![t as u32])
            .unwrap_or_default(),
        beam: Some(BeamSearch {
            width: case["num_beams"].as_u64().expect("num_beams") as u32,
            length_penalty: case["length_penalty"].as_f64().expect("lp") as f32,
            early_stopping: early,
        }),
        ..GenerateRequest::new(
            prompt.to_vec(),
            case["max_new_tokens"].as_u64().expect("max") as u32,
        )
    };
    (req, case["n"].as_u64().expect("n") as u32)
}

/// One choice: its tokens, score and finish reason.
async fn outcome(
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Event>,
) -> (Vec<u32>, f32, FinishReason) {
    let (mut toks, mut score) = (Vec::new(), f32::NAN);
    loop {
        match rx.recv().await.expect("event") {
            Event::Token(t) => toks.push(t),
            Event::Beam { score: s, .. } => score = s,
            Event::Finished { reason, usage, .. } => {
                assert_eq!(usage.completion_tokens as usize, toks.len());
                return (toks, score, reason);
            }
            Event::Failed(e) => panic!("beam search failed: {e}"),
            _ => {}
        }
    }
}

fn check(name: &str, i: usize, case: &Value, got: &[(Vec<u32>, f32, FinishReason)]) {
    let hyps = case["hypotheses"].as_array().expect("hypotheses");
    assert_eq!(got.len(), hyps.len(), "{name} case {i}: choices");
    for (j, (h, (toks, score, reason))) in hyps.iter().zip(got).enumerate() {
        assert_eq!(
            toks,
            &ids(&h["ids"]),
            "{name} case {i} hypothesis {j}: tokens"
        );
        let want = h["score"].as_f64().expect("score");
        let tol = 1e-3 + 1e-4 * want.abs();
        assert!(
            (*score as f64 - want).abs() <= tol,
            "{name} case {i} hypothesis {j}: score {score} vs transformers' {want}"
        );
        let stop = h["finish"] == "stop";
        assert_eq!(
            matches!(reason, FinishReason::Stop(_)),
            stop,
            "{name} case {i} hypothesis {j}: finish {reason:?}"
        );
    }
}

fn start(name: &str, tweak: impl FnOnce(&mut EngineOptions)) -> Engine {
    let mut opts = EngineOptions::new(models_dir().join(name));
    opts.device = DeviceChoice::Cpu;
    tweak(&mut opts);
    Engine::start(opts).expect("engine starts")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn beam_search_matches_transformers_on_every_family() {
    let rt = runtime();
    let (mut stops, mut lengths) = (0, 0);
    for name in MODELS {
        let r = reference(name);
        let prompt = ids(&r["prompt_ids"]);
        // References recorded from the fixtures as they are now.
        assert_eq!(
            prompt,
            ids(&golden(name).1["prompt_ids"]),
            "{name}: stale reference"
        );
        let engine = start(name, |_| {});
        for (i, case) in r["cases"].as_array().expect("cases").iter().enumerate() {
            // The EOS ids transformers used are the model's plus the stop id.
            let mut ours = engine.info().eos_token_ids.clone();
            ours.extend(case["extra_stop_token_id"].as_u64().map(|t| t as u32));
            ours.sort_unstable();
            ours.dedup();
            let mut theirs = ids(&case["eos_token_ids"]);
            theirs.sort_unstable();
            assert_eq!(ours, theirs, "{name} case {i}: EOS ids");
            let (req, n) = request(&prompt, case);
            let rxs = engine.submit_n(req, n).expect("submit");
            let got: Vec<_> = rt.block_on(async {
                let mut v = Vec::new();
                for rx in rxs {
                    v.push(outcome(rx).await);
                }
                v
            });
            for (_, _, r) in &got {
                match r {
                    FinishReason::Stop(_) => stops += 1,
                    FinishReason::Length => lengths += 1,
                }
            }
            check(name, i, case, &got);
        }
        let stats = rt.block_on(engine.wait_stats(|s| s.running == 0 && s.kv_blocks_used == 0));
        assert_eq!(stats.kv_blocks_used, 0, "{name}: every beam's blocks freed");
        println!("{name}: every beam-search case identical to transformers");
    }
    assert!(
        stops > 0 && lengths > 0,
        "both finishes covered: {stops} / {lengths}"
    );
}

/// Four searches at once in a KV cache that holds just one of them
/// without sharing, with a token budget below the width: beams are batched across
/// steps, groups preempted whole and resumed, and the results stay
/// transformers'.
#[test]
fn beam_search_survives_preemption_and_a_small_token_budget() {
    let rt = runtime();
    let mut preempted = 0;
    for name in ["tiny-llama", "tiny-qwen3", "tiny-gemma2"] {
        let r = reference(name);
        let prompt = ids(&r["prompt_ids"]);
        let case = &r["cases"][0];
        let width = case["num_beams"].as_u64().expect("width") as usize;
        let max = case["max_new_tokens"].as_u64().expect("max") as usize;
        let per_group = width * (prompt.len() + max).div_ceil(16);
        let engine = start(name, |o| {
            o.num_blocks = Some(per_group);
            o.token_budget = 3;
        });
        let (req, n) = request(&prompt, case);
        let groups: Vec<_> = (0..4)
            .map(|_| engine.submit_n(req.clone(), n).expect("submit"))
            .collect();
        for rxs in groups {
            let got: Vec<_> = rt.block_on(async {
                let mut v = Vec::new();
                for rx in rxs {
                    v.push(outcome(rx).await);
                }
                v
            });
            check(name, 0, case, &got);
        }
        let stats = engine.stats();
        println!("{name}: {} preemptions", stats.preemptions_total);
        preempted += stats.preemptions_total;
    }
    assert!(preempted > 0, "nothing was preempted");
}

#[test]
fn beam_requests_out_of_bounds_are_refused() {
    let engine = start("tiny-llama", |o| o.max_running = 4);
    let beam = |width| {
        Some(BeamSearch {
            width,
            length_penalty: 1.0,
            early_stopping: EarlyStopping::Heuristic,
        })
    };
    let base = GenerateRequest {
        beam: beam(3),
        ..GenerateRequest::new(vec![1, 2, 3], 4)
    };
    let refused = |req: GenerateRequest, n: u32, what: &str| match engine.submit_n(req, n) {
        Err(EngineError::InvalidBeam { message: m, .. }) => assert!(m.contains(what), "{m}"),
        Err(e) => panic!("{what}: wrong error {e}"),
        Ok(_) => panic!("{what}: accepted"),
    };
    refused(base.clone(), 4, "n (4)");
    refused(
        GenerateRequest {
            beam: beam(1),
            ..base.clone()
        },
        1,
        "between 2",
    );
    refused(
        GenerateRequest {
            beam: beam(17),
            ..base.clone()
        },
        1,
        "between 2",
    );
    refused(
        GenerateRequest {
            beam: beam(5),
            ..base.clone()
        },
        1,
        "at once (4)",
    );
    refused(
        GenerateRequest {
            logprobs: Some(1),
            ..base.clone()
        },
        1,
        "logprobs",
    );
    refused(
        GenerateRequest {
            min_tokens: 1,
            ..base.clone()
        },
        1,
        "min_tokens",
    );
    refused(
        GenerateRequest {
            speculation: Some(gyre_engine::Speculation {
                num_tokens: 3,
                max_ngram: 2,
                min_ngram: 1,
            }),
            ..base.clone()
        },
        1,
        "prompt-lookup",
    );
    assert!(engine.submit_n(base, 3).is_ok());
}
