//! Correctness under batching: greedy outputs of requests that run together
//! (mixed lengths, arriving at different times, chunked prefill, prefix-cache
//! hits, preempted and resumed) are token-identical to each request run
//! alone; priorities order admission; cancelled requests free their blocks.

use std::path::PathBuf;

use gyre_engine::{
    DeviceChoice, Engine, EngineOptions, Event, FinishReason, GenerateRequest, Sampling,
};
use tokio::sync::mpsc::UnboundedReceiver;

fn model_dir() -> PathBuf {
    std::env::var_os("GYRE_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.gyre/models"))
        .join("tiny-llama")
}

fn engine(f: impl FnOnce(&mut EngineOptions)) -> Engine {
    let mut o = EngineOptions::new(model_dir());
    o.device = DeviceChoice::Cpu;
    f(&mut o);
    Engine::start(o).expect("engine starts (build fixtures with `make models`)")
}

/// A deterministic prompt of `len` ids from `seed`, within the vocabulary.
fn prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| 100 + (seed * 7919 + i * 104_729) % 31_000)
        .collect()
}

fn greedy(p: Vec<u32>, max_tokens: u32) -> GenerateRequest {
    GenerateRequest {
        sampling: Sampling {
            temperature: 0.0,
            ..Sampling::default()
        },
        ignore_eos: true,
        ..GenerateRequest::new(p, max_tokens)
    }
}

struct Outcome {
    tokens: Vec<u32>,
    cached: u32,
    reason: FinishReason,
}

async fn collect(rx: UnboundedReceiver<Event>) -> Outcome {
    collect_after(rx, Vec::new()).await
}

/// Collects the rest of a request whose first `tokens` were already read.
async fn collect_after(mut rx: UnboundedReceiver<Event>, mut tokens: Vec<u32>) -> Outcome {
    let mut cached = 0;
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Prefilled { cached_tokens, .. } => cached = cached_tokens,
            Event::Logprobs(_)
            | Event::PromptLogprobs(_)
            | Event::Speculated { .. }
            | Event::Beam { .. } => {}
            Event::Token(t) => tokens.push(t),
            Event::Finished { reason, usage, .. } => {
                assert_eq!(usage.completion_tokens as usize, tokens.len());
                assert_eq!(usage.cached_tokens, cached);
                return Outcome {
                    tokens,
                    cached,
                    reason,
                };
            }
            Event::Failed(e) => panic!("request failed: {e}"),
        }
    }
    panic!("event stream ended without Finished");
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Each request alone, on a fresh engine with nothing cached.
fn alone(reqs: &[GenerateRequest]) -> Vec<Vec<u32>> {
    let rt = rt();
    reqs.iter()
        .map(|r| {
            let e = engine(|_| {});
            rt.block_on(collect(e.submit(r.clone()).expect("submit")))
                .tokens
        })
        .collect()
}

#[test]
fn staggered_mixed_length_requests_with_chunked_prefill_match_alone() {
    let reqs: Vec<_> = [
        (1, 5, 20),
        (2, 70, 12),
        (3, 33, 25),
        (4, 1, 8),
        (5, 120, 16),
    ]
    .into_iter()
    .map(|(seed, len, max)| greedy(prompt(seed, len), max))
    .collect();
    let want = alone(&reqs);
    // A small step budget forces chunked prefill beside running decodes.
    let e = engine(|o| o.token_budget = 24);
    let rt = rt();
    let got: Vec<Vec<u32>> = rt.block_on(async {
        let mut first = e.submit(reqs[0].clone()).expect("submit");
        // Later requests arrive while the first is already decoding.
        let mut head = Vec::new();
        while head.len() < 3 {
            if let Some(Event::Token(t)) = first.recv().await {
                head.push(t);
            }
        }
        let rest: Vec<_> = reqs[1..]
            .iter()
            .map(|r| e.submit(r.clone()).expect("submit"))
            .collect();
        let mut out = vec![collect_after(first, head).await.tokens];
        for rx in rest {
            out.push(collect(rx).await.tokens);
        }
        out
    });
    assert_eq!(got, want);
    let s = rt.block_on(e.wait_stats(|s| s.running == 0 && s.waiting == 0));
    assert_eq!(s.kv_blocks_used, 0);
}

#[test]
fn prefix_cache_hits_are_reported_and_change_nothing() {
    let shared = prompt(9, 80);
    let mut second = shared.clone();
    second.extend(prompt(10, 7));
    let reqs = [greedy(shared.clone(), 10), greedy(second, 10)];
    let want = alone(&reqs);
    let e = engine(|_| {});
    let rt = rt();
    let a = rt.block_on(collect(e.submit(reqs[0].clone()).expect("submit")));
    let b = rt.block_on(collect(e.submit(reqs[1].clone()).expect("submit")));
    assert_eq!(a.cached, 0);
    // 80 shared tokens = 5 full blocks of 16.
    assert_eq!(b.cached, 80, "the shared prefix must come from the cache");
    assert_eq!(vec![a.tokens, b.tokens], want);
    // A salted request does not see the shared cache.
    let mut salted = reqs[1].clone();
    salted.cache_salt = "tenant-b".into();
    let c = rt.block_on(collect(e.submit(salted).expect("submit")));
    assert_eq!(c.cached, 0);
    assert_eq!(c.tokens, want[1]);
    let s = rt.block_on(e.wait_stats(|s| s.running == 0 && s.waiting == 0));
    assert_eq!(s.prefix_hit_tokens_total, 80);
    assert!(
        s.kv_blocks_cached > 0,
        "finished requests leave reusable blocks"
    );
}

#[test]
fn preempted_requests_resume_and_match_alone() {
    // 12 blocks of 16 = 192 tokens for four requests that need 60-76 each.
    let reqs: Vec<_> = (0..4)
        .map(|i| greedy(prompt(20 + i, 30 + 8 * i as usize), 30))
        .collect();
    let want = alone(&reqs);
    let e = engine(|o| o.num_blocks = Some(12));
    let rt = rt();
    let got: Vec<Vec<u32>> = rt.block_on(async {
        let rxs: Vec<_> = reqs
            .iter()
            .map(|r| e.submit(r.clone()).expect("submit"))
            .collect();
        let mut out = vec![];
        for rx in rxs {
            let o = collect(rx).await;
            assert_eq!(o.reason, FinishReason::Length);
            out.push(o.tokens);
        }
        out
    });
    let s = rt.block_on(e.wait_stats(|s| s.running == 0 && s.waiting == 0));
    assert!(
        s.preemptions_total > 0,
        "the pool is too small: something must be preempted"
    );
    assert_eq!(got, want);
    assert_eq!(s.kv_blocks_used, 0);
}

#[test]
fn a_request_that_can_never_fit_is_refused_at_admission() {
    let e = engine(|o| o.num_blocks = Some(4));
    let err = e
        .submit(greedy(prompt(1, 60), 10))
        .expect_err("70 tokens cannot fit in 64");
    assert!(err.to_string().contains("KV cache"), "{err}");
}

#[test]
fn higher_priority_is_admitted_first() {
    let e = engine(|o| o.max_running = 1);
    let rt = rt();
    let order = rt.block_on(async {
        let mut busy = e.submit(greedy(prompt(1, 10), 20)).expect("submit");
        // Wait until it runs, so the next two queue behind it.
        while !matches!(busy.recv().await, Some(Event::Token(_))) {}
        let low = e.submit(greedy(prompt(2, 10), 3)).expect("submit");
        let mut high_req = greedy(prompt(3, 10), 3);
        high_req.priority = 5;
        let high = e.submit(high_req).expect("submit");
        let (tx, mut done) = tokio::sync::mpsc::unbounded_channel();
        for (name, rx) in [("low", low), ("high", high)] {
            let tx = tx.clone();
            tokio::spawn(async move {
                collect(rx).await;
                let _ = tx.send(name);
            });
        }
        drop(busy);
        vec![done.recv().await, done.recv().await]
    });
    assert_eq!(order, vec![Some("high"), Some("low")]);
}

#[test]
fn cancelled_requests_free_every_block() {
    let e = engine(|_| {});
    let rt = rt();
    rt.block_on(async {
        let mut rxs: Vec<_> = (0..24)
            .map(|i| e.submit(greedy(prompt(i, 40), 500)).expect("submit"))
            .collect();
        // Read a token or two from each, then hang up.
        for rx in rxs.iter_mut() {
            while !matches!(rx.recv().await, Some(Event::Token(_))) {}
        }
        assert!(e.stats().kv_blocks_used > 0);
        drop(rxs);
        let s = e.wait_stats(|s| s.running == 0 && s.waiting == 0).await;
        assert_eq!(
            s.kv_blocks_used, 0,
            "cancelled sequences still hold blocks: {s:?}"
        );
    });
}

#[test]
fn parallel_choices_share_the_prompt_without_corrupting_each_other() {
    // 40 prompt tokens: two full blocks and a partial one that each choice
    // must copy before writing its own tokens. With top_k = 2, every token a
    // choice samples must be among the top 2 of a from-scratch forward over
    // that choice's own prefix: a choice reading another's keys and values
    // (a copy-on-write bug) would fall outside almost surely, while rounding
    // differences between batch shapes cannot move a token that far.
    let p = prompt(77, 40);
    let mut req = greedy(p.clone(), 12);
    req.sampling = Sampling {
        temperature: 1.0,
        top_k: 2,
        seed: Some(1234),
        ..Sampling::default()
    };
    let e = engine(|_| {});
    let rt = rt();
    let choices: Vec<Vec<u32>> = rt.block_on(async {
        let rxs = e.submit_n(req.clone(), 4).expect("submit");
        let mut out = vec![];
        for rx in rxs {
            out.push(collect(rx).await.tokens);
        }
        out
    });
    assert!(
        choices.iter().any(|c| c != &choices[0]),
        "seeded choices should differ"
    );
    let model = gyre_engine::internals::load_model(&model_dir(), DeviceChoice::Cpu).expect("model");
    let _guard = tch::no_grad_guard();
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c.len(), 12);
        for j in 0..c.len() {
            let mut seq = p.clone();
            seq.extend(&c[..j]);
            let logits = model.score(&seq).expect("score");
            let last: Vec<f32> =
                Vec::<f32>::try_from(logits.get(logits.size()[0] - 1)).expect("row");
            let mut order: Vec<usize> = (0..last.len()).collect();
            order.sort_by(|&a, &b| last[b].total_cmp(&last[a]));
            assert!(
                order[..2].contains(&(c[j] as usize)),
                "choice {i}, token {j}: {} is not in the true top 2 {:?}",
                c[j],
                &order[..2]
            );
        }
    }
    let s = rt.block_on(e.wait_stats(|s| s.running == 0 && s.waiting == 0));
    assert_eq!(s.kv_blocks_used, 0);
    assert_eq!(s.generated_tokens_total, 4 * 12);
    // Only one sequence was admitted with the prompt; the others were forked.
    assert_eq!(s.prefix_query_tokens_total, 40);
    assert!(e.submit_n(req, 0).is_err());
}

/// Every prompt log-probability event of a request, in order, and its cached count.
async fn prompt_logprobs_of(mut rx: UnboundedReceiver<Event>) -> (Vec<(u32, f32)>, u32) {
    let mut out = Vec::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::PromptLogprobs(list) => out.extend(list.iter().map(|l| (l.token, l.logprob))),
            Event::Finished { usage, .. } => return (out, usage.cached_tokens),
            Event::Failed(e) => panic!("request failed: {e}"),
            _ => {}
        }
    }
    panic!("event stream ended without Finished");
}

#[test]
fn prompt_logprobs_cover_every_prompt_token_chunked_cached_or_not() {
    let p = prompt(11, 45);
    let with_lp = |p: Vec<u32>| GenerateRequest {
        prompt_logprobs: Some(2),
        ..greedy(p, 2)
    };
    let rt = rt();
    let whole = engine(|_| {});
    let (reference, cached) = rt.block_on(prompt_logprobs_of(
        whole.submit(with_lp(p.clone())).expect("submit"),
    ));
    assert_eq!(cached, 0);
    let ids: Vec<u32> = reference.iter().map(|r| r.0).collect();
    assert_eq!(ids, p[1..], "one entry per prompt token but the first");
    // Chunked prefill (7 tokens a step) beside another request, after the
    // same prompt was cached by a request without prompt logprobs.
    let chunked = engine(|o| o.token_budget = 7);
    let warm = rt.block_on(collect(
        chunked.submit(greedy(p.clone(), 2)).expect("submit"),
    ));
    assert_eq!(warm.cached, 0);
    let other = chunked.submit(greedy(prompt(12, 30), 4)).expect("submit");
    let (got, cached) = rt.block_on(prompt_logprobs_of(
        chunked.submit(with_lp(p.clone())).expect("submit"),
    ));
    rt.block_on(collect(other));
    assert_eq!(cached, 0, "prompt logprobs skip the prefix cache");
    assert_eq!(got.len(), reference.len());
    for (i, (a, b)) in got.iter().zip(&reference).enumerate() {
        assert_eq!(a.0, b.0, "position {i}");
        assert!((a.1 - b.1).abs() < 1e-4, "position {i}: {} vs {}", a.1, b.1);
    }
}
