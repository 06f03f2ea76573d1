//! Numerical fidelity against HuggingFace transformers on the same weights.
//!
//! `tests/fixtures/make_models.py` builds tiny random-weight Llama, Mistral,
//! Qwen2, Qwen3, sliding-window Mistral, Gemma 3, Gemma 2, Phi-3,
//! Phi-4-mini-style, Mixtral and Qwen3-MoE models and records transformers'
//! float32 logits for a prompt and its greedy 32-token continuation
//! (`golden.json`). Here gyre must match: every logit within 1e-4, and the
//! greedy continuation token for token, run directly, through the batching
//! engine thread, and with the prompt prefilled in small chunks and then
//! again from the prefix cache.

mod common;

use common::{MODELS, golden, ids};
use gyre_engine::internals::load_model;
use gyre_engine::{DeviceChoice, Engine, EngineOptions, Event, GenerateRequest, Sampling};

const TOLERANCE: f64 = 1e-4;

#[test]
fn logits_match_transformers() {
    let _guard = tch::no_grad_guard();
    for name in MODELS {
        let (dir, g) = golden(name);
        let model = load_model(&dir, DeviceChoice::Cpu).expect("model loads");
        let prompt = ids(&g["prompt_ids"]);
        let ours = model.score(&prompt).expect("forward");
        let ours: Vec<Vec<f32>> = Vec::<Vec<f32>>::try_from(&ours).expect("to vec");
        let theirs = g["logits"].as_array().expect("logits");
        assert_eq!(ours.len(), theirs.len(), "{name}: positions");
        let mut max_diff = 0f64;
        for (row, trow) in ours.iter().zip(theirs) {
            let trow = trow.as_array().expect("row");
            assert_eq!(row.len(), trow.len(), "{name}: vocab");
            for (a, b) in row.iter().zip(trow) {
                max_diff = max_diff.max((*a as f64 - b.as_f64().expect("f")).abs());
            }
        }
        println!(
            "{name}: max |logit diff| vs transformers = {max_diff:.3e} over {} positions",
            ours.len()
        );
        assert!(
            max_diff <= TOLERANCE,
            "{name}: max abs logit diff {max_diff} > {TOLERANCE}"
        );
    }
}

/// Greedy generation through the engine thread, several requests at once
/// (so they share batched steps), each compared with transformers.
#[test]
fn greedy_continuations_match_transformers_under_batching() {
    for name in MODELS {
        let (dir, g) = golden(name);
        let want = ids(&g["greedy_ids"]);
        let prompt = ids(&g["prompt_ids"]);
        let mut opts = EngineOptions::new(&dir);
        opts.device = DeviceChoice::Cpu;
        let engine = Engine::start(opts).expect("engine starts");
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        // The golden prompt three times, plus a shorter and a longer prompt
        // interleaved, all running concurrently.
        let mut reqs = Vec::new();
        for extra in [0usize, 3, 0, 7, 0] {
            let mut p = prompt.clone();
            p.extend(prompt.iter().take(extra));
            reqs.push(p);
        }
        let rxs: Vec<_> = reqs
            .iter()
            .map(|p| {
                engine
                    .submit(GenerateRequest {
                        sampling: Sampling {
                            temperature: 0.0,
                            ..Sampling::default()
                        },
                        ignore_eos: true,
                        ..GenerateRequest::new(p.clone(), want.len() as u32)
                    })
                    .expect("submit")
            })
            .collect();
        let outs: Vec<Vec<u32>> = rt.block_on(async {
            let mut outs = Vec::new();
            for mut rx in rxs {
                let mut toks = Vec::new();
                while let Some(ev) = rx.recv().await {
                    match ev {
                        Event::Token(t) => toks.push(t),
                        Event::Prefilled { .. }
                        | Event::Logprobs(_)
                        | Event::PromptLogprobs(_)
                        | Event::Speculated { .. }
                        | Event::Beam { .. } => {}
                        Event::Finished { usage, .. } => {
                            assert_eq!(usage.completion_tokens as usize, toks.len());
                            break;
                        }
                        Event::Failed(e) => panic!("{name}: {e}"),
                    }
                }
                outs.push(toks);
            }
            outs
        });
        for i in [0, 2, 4] {
            assert_eq!(
                outs[i], want,
                "{name}: request {i} differs from transformers' greedy ids"
            );
        }
        // The other prompts, run alone, give what they gave in the batch.
        let model = load_model(&dir, DeviceChoice::Cpu).expect("model loads");
        for i in [1, 3] {
            let mut seq = reqs[i].clone();
            let mut alone = Vec::new();
            let _guard = tch::no_grad_guard();
            for _ in 0..want.len() {
                let logits = model.score(&seq).expect("score");
                let last: Vec<f32> =
                    Vec::<f32>::try_from(logits.get(logits.size()[0] - 1)).expect("row");
                let t = gyre_engine::argmax(&last);
                alone.push(t);
                seq.push(t);
            }
            assert_eq!(outs[i], alone, "{name}: request {i} batched != alone");
        }
        println!(
            "{name}: greedy 32-token continuation identical to transformers (5 concurrent requests)"
        );
    }
}

/// Collects a request's tokens and how many prompt tokens came from the
/// prefix cache.
async fn tokens_of(
    name: &str,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Event>,
) -> (Vec<u32>, u32) {
    let mut toks = Vec::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Token(t) => toks.push(t),
            Event::Finished { usage, .. } => return (toks, usage.cached_tokens),
            Event::Failed(e) => panic!("{name}: {e}"),
            _ => {}
        }
    }
    panic!("{name}: the stream ended without Finished")
}

/// The paths around the KV cache keep every family exact: prompts prefilled
/// in chunks of at most 10 tokens (so sliding-window layers see chunks
/// after cached tokens, with the window's start inside the cache), a pool
/// too small for three requests at once (so one is preempted and resumes),
/// and the same prompt again afterwards from the prefix cache.
#[test]
fn chunked_preempted_and_prefix_cached_runs_match_transformers() {
    for name in MODELS {
        let (dir, g) = golden(name);
        let want = ids(&g["greedy_ids"]);
        let prompt = ids(&g["prompt_ids"]);
        let per_request = (prompt.len() + want.len()).div_ceil(16);
        let mut opts = EngineOptions::new(&dir);
        opts.device = DeviceChoice::Cpu;
        opts.token_budget = 10;
        opts.num_blocks = Some(per_request + per_request / 2 + 1);
        let engine = Engine::start(opts).expect("engine starts");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let req = GenerateRequest {
            sampling: Sampling {
                temperature: 0.0,
                ..Sampling::default()
            },
            ignore_eos: true,
            ..GenerateRequest::new(prompt.clone(), want.len() as u32)
        };
        let rxs: Vec<_> = (0..3)
            .map(|_| engine.submit(req.clone()).expect("submit"))
            .collect();
        rt.block_on(async {
            for rx in rxs {
                assert_eq!(tokens_of(name, rx).await.0, want, "{name}: under pressure");
            }
            let stats = engine.wait_stats(|s| s.running == 0).await;
            assert!(stats.preemptions_total > 0, "{name}: nothing was preempted");
            let (again, cached) = tokens_of(name, engine.submit(req).expect("submit")).await;
            assert!(cached > 0, "{name}: the prompt did not come from the cache");
            assert_eq!(again, want, "{name}: from the prefix cache");
        });
        println!("{name}: chunked, preempted and prefix-cached runs identical to transformers");
    }
}

/// Longrope past the original maximum length: a prompt longer than
/// `original_max_position_embeddings`, run in one forward as transformers
/// runs it, is rotated with the long factors; its last logits match
/// transformers' (the golden prompt, shorter, tests the short factors).
#[test]
fn longrope_long_factors_match_transformers() {
    let _guard = tch::no_grad_guard();
    let (dir, g) = golden("tiny-phi4");
    let model = load_model(&dir, DeviceChoice::Cpu).expect("model loads");
    let prompt = ids(&g["long_prompt_ids"]);
    let ours = model.score(&prompt).expect("forward");
    let tail = g["long_logits_tail"].as_array().expect("tail rows");
    let mut max_diff = 0f64;
    for (i, trow) in tail.iter().enumerate() {
        let row = ours.get(ours.size()[0] - tail.len() as i64 + i as i64);
        let row: Vec<f32> = Vec::<f32>::try_from(&row).expect("row");
        let trow = trow.as_array().expect("row");
        assert_eq!(row.len(), trow.len());
        for (a, b) in row.iter().zip(trow) {
            max_diff = max_diff.max((*a as f64 - b.as_f64().expect("f")).abs());
        }
    }
    println!("tiny-phi4 long prompt: max |logit diff| = {max_diff:.3e}");
    assert!(
        max_diff <= TOLERANCE,
        "long factors: {max_diff} > {TOLERANCE}"
    );
}

/// Longrope across the original maximum length, through the engine: a
/// prompt longer than it (long factors throughout) and a shorter one whose
/// continuation grows past it (transformers then recomputes the whole
/// sequence with the long factors) give transformers' greedy tokens run
/// plainly, prefilled in chunks of 10 under a pool too small for three at
/// once (so some are preempted and recomputed), and again from the prefix
/// cache. The shorter prompt is the longer one's start, so the prefix
/// cache holds its tokens in the other regime: it must not reuse them.
#[test]
fn longrope_continuations_match_transformers_through_the_engine() {
    let name = "tiny-phi4";
    let (dir, g) = golden(name);
    let cases: Vec<(&str, Vec<u32>, Vec<u32>)> = ["long", "cross"]
        .into_iter()
        .map(|k| {
            (
                k,
                ids(&g[format!("{k}_greedy_prompt_ids")]),
                ids(&g[format!("{k}_greedy_ids")]),
            )
        })
        .collect();
    let request = |prompt: &[u32], n: usize| GenerateRequest {
        sampling: Sampling {
            temperature: 0.0,
            ..Sampling::default()
        },
        ignore_eos: true,
        ..GenerateRequest::new(prompt.to_vec(), n as u32)
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut opts = EngineOptions::new(&dir);
    opts.device = DeviceChoice::Cpu;
    let plain = Engine::start(opts).expect("engine starts");
    rt.block_on(async {
        for (key, prompt, want) in &cases {
            let rx = plain.submit(request(prompt, want.len())).expect("submit");
            assert_eq!(&tokens_of(name, rx).await.0, want, "{key}: plain run");
        }
    });
    drop(plain);
    let most = cases
        .iter()
        .map(|c| c.1.len() + c.2.len())
        .max()
        .unwrap_or(0);
    let per_request = most.div_ceil(16);
    let mut opts = EngineOptions::new(&dir);
    opts.device = DeviceChoice::Cpu;
    opts.token_budget = 10;
    opts.num_blocks = Some(per_request + per_request / 2 + 1);
    let engine = Engine::start(opts).expect("engine starts");
    rt.block_on(async {
        for (key, prompt, want) in &cases {
            let rxs: Vec<_> = (0..3)
                .map(|_| engine.submit(request(prompt, want.len())).expect("submit"))
                .collect();
            for rx in rxs {
                assert_eq!(&tokens_of(name, rx).await.0, want, "{key}: under pressure");
            }
        }
        let stats = engine.wait_stats(|s| s.running == 0).await;
        assert!(stats.preemptions_total > 0, "nothing was preempted");
        for (key, prompt, want) in &cases {
            let rx = engine.submit(request(prompt, want.len())).expect("submit");
            let (again, cached) = tokens_of(name, rx).await;
            assert!(cached > 0, "{key}: the prompt did not come from the cache");
            assert_eq!(&again, want, "{key}: from the prefix cache");
        }
    });
    println!(
        "{name}: longrope continuations past the original length identical to transformers \
         (plain, chunked, preempted, prefix-cached)"
    );
}
