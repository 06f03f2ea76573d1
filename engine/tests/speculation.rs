//! Prompt-lookup decoding changes how many tokens a step computes, never
//! which tokens come out: for every fixture family, greedy decoding with
//! speculation gives transformers' greedy continuation of the golden prompt
//! token for token. Random-weight models never repeat themselves, so to
//! make lookups find proposals (and the model accept some), a second
//! request biases three tokens far above the rest (`logit_bias`): its
//! greedy output is a sequence over three tokens, full of repeated
//! n-grams, and must be the same tokens with speculation as without, run
//! whole, under a small token budget that cuts speculative runs short, and
//! in a pool small enough that sequences holding proposals are preempted.
//! Under sampling, a seeded request draws the same tokens with speculation
//! as without (so the same distribution).

mod common;

use std::path::PathBuf;

use common::{MODELS, golden, ids};
use gyre_engine::{
    DeviceChoice, Engine, EngineOptions, EngineStats, Event, GenerateRequest, Sampling, Speculation,
};

fn greedy(prompt: Vec<u32>, max_tokens: u32, spec: Option<Speculation>) -> GenerateRequest {
    biased(prompt, max_tokens, spec, &[])
}

/// Greedy decoding with `bias` added to those tokens' logits.
fn biased(
    prompt: Vec<u32>,
    max_tokens: u32,
    spec: Option<Speculation>,
    bias: &[u32],
) -> GenerateRequest {
    GenerateRequest {
        sampling: Sampling {
            temperature: 0.0,
            logit_bias: bias.iter().map(|&t| (t, 30.0)).collect(),
            ..Sampling::default()
        },
        ignore_eos: true,
        speculation: spec,
        ..GenerateRequest::new(prompt, max_tokens)
    }
}

/// Runs the requests concurrently; their tokens, and the engine's stats
/// once idle.
fn run(name: &str, engine: &Engine, reqs: Vec<GenerateRequest>) -> (Vec<Vec<u32>>, EngineStats) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let rxs: Vec<_> = reqs
        .into_iter()
        .map(|r| engine.submit(r).expect("submit"))
        .collect();
    rt.block_on(async {
        let mut outs = Vec::new();
        for mut rx in rxs {
            let mut toks = Vec::new();
            loop {
                match rx.recv().await {
                    Some(Event::Token(t)) => toks.push(t),
                    Some(Event::Finished { usage, .. }) => {
                        assert_eq!(usage.completion_tokens as usize, toks.len(), "{name}");
                        break;
                    }
                    Some(Event::Failed(e)) => panic!("{name}: {e}"),
                    Some(_) => {}
                    None => panic!("{name}: the stream ended without Finished"),
                }
            }
            outs.push(toks);
        }
        let stats = engine
            .wait_stats(|s| s.running == 0 && s.waiting == 0)
            .await;
        (outs, stats)
    })
}

fn engine(dir: &PathBuf, f: impl FnOnce(&mut EngineOptions)) -> Engine {
    let mut opts = EngineOptions::new(dir);
    opts.device = DeviceChoice::Cpu;
    f(&mut opts);
    Engine::start(opts).expect("engine starts")
}

#[test]
fn greedy_with_prompt_lookup_is_greedy_for_every_family() {
    let spec = Some(Speculation {
        num_tokens: 5,
        max_ngram: 3,
        min_ngram: 1,
    });
    let (mut accepted_everywhere, mut preempted_everywhere) = (0, 0);
    for name in MODELS {
        let (dir, g) = golden(name);
        let want = ids(&g["greedy_ids"]);
        let prompt = ids(&g["prompt_ids"]);
        let n = want.len() as u32;
        let bias = &want[..3];
        let echo = prompt.clone();
        let plain = engine(&dir, |_| {});
        let (base, _) = run(name, &plain, vec![biased(echo.clone(), 48, None, bias)]);
        drop(plain);

        let e = engine(&dir, |_| {});
        let (outs, stats) = run(
            name,
            &e,
            vec![
                greedy(prompt.clone(), n, spec),
                biased(echo.clone(), 48, spec, bias),
                biased(echo.clone(), 48, None, bias),
            ],
        );
        assert_eq!(
            outs[0], want,
            "{name}: differs from transformers' greedy ids"
        );
        assert_eq!(
            outs[1], base[0],
            "{name}: speculation changed the echo's tokens"
        );
        assert_eq!(outs[2], base[0], "{name}: batched beside speculation");
        assert!(
            stats.spec_proposed_tokens_total > 0,
            "{name}: nothing was proposed for an output over three tokens: {:?}",
            base[0]
        );
        let (accepted, proposed) = (
            stats.spec_accepted_tokens_total,
            stats.spec_proposed_tokens_total,
        );
        accepted_everywhere += accepted;
        drop(e);

        // A token budget of 8 (three sequences with 5 proposals each) cuts speculative runs short, and a pool too
        // small for three such requests preempts sequences holding
        // proposals (they resume by recomputing, proposals dropped).
        let per_request = (echo.len() + 48).div_ceil(16);
        let tight = engine(&dir, |o| {
            o.token_budget = 8;
            o.num_blocks = Some(per_request + per_request / 2 + 1);
        });
        let (outs, stats) = run(
            name,
            &tight,
            (0..3)
                .map(|_| biased(echo.clone(), 48, spec, bias))
                .collect(),
        );
        for (i, out) in outs.iter().enumerate() {
            assert_eq!(out, &base[0], "{name}: request {i} under pressure");
        }
        preempted_everywhere += stats.preemptions_total;
        println!(
            "{name}: greedy with prompt lookup identical ({accepted} of {proposed} proposals accepted; {} preemptions under pressure)",
            stats.preemptions_total
        );
    }
    assert!(
        accepted_everywhere > 0,
        "no family ever accepted a proposal: the test exercised no speculation"
    );
    assert!(
        preempted_everywhere > 0,
        "no sequence was ever preempted: the pressure runs tested nothing"
    );
}

/// Sampling (temperature 1 with top-p and a frequency penalty) over the
/// same three biased tokens, one request per seed.
fn sampled(
    prompt: Vec<u32>,
    seed: u64,
    spec: Option<Speculation>,
    bias: &[u32],
) -> GenerateRequest {
    GenerateRequest {
        sampling: Sampling {
            temperature: 1.0,
            top_p: 0.95,
            frequency_penalty: 0.05,
            seed: Some(seed),
            // Far above the rest, but close enough to each other that the
            // three compete: the draws are random among them.
            logit_bias: bias.iter().map(|&t| (t, 30.0)).collect(),
            ..Sampling::default()
        },
        ignore_eos: true,
        speculation: spec,
        ..GenerateRequest::new(prompt, 32)
    }
}

/// Under sampling, a proposal is kept exactly when the model's own draw at
/// that position (with the sampler's state after the tokens before it)
/// is the proposed token; otherwise the draw is kept. So a seeded request
/// draws the same tokens with speculation as without, which makes the
/// distribution the same: checked per seed, for every family, with
/// speculative and plain requests batched together.
#[test]
fn sampling_with_prompt_lookup_draws_the_same_tokens_per_seed() {
    const SEEDS: u64 = 16;
    let spec = Some(Speculation {
        num_tokens: 6,
        max_ngram: 2,
        min_ngram: 1,
    });
    let mut accepted_everywhere = 0;
    for name in MODELS {
        let (dir, g) = golden(name);
        let want = ids(&g["greedy_ids"]);
        let prompt = ids(&g["prompt_ids"]);
        let bias = &want[..3];
        let e = engine(&dir, |_| {});
        let reqs: Vec<_> = (0..SEEDS)
            .flat_map(|seed| {
                [
                    sampled(prompt.clone(), seed, spec, bias),
                    sampled(prompt.clone(), seed, None, bias),
                ]
            })
            .collect();
        let (outs, stats) = run(name, &e, reqs);
        let mut distinct = std::collections::HashSet::new();
        for (seed, pair) in outs.chunks_exact(2).enumerate() {
            assert_eq!(
                pair[0], pair[1],
                "{name}: seed {seed} drew other tokens with speculation"
            );
            distinct.insert(pair[1].clone());
        }
        // The draws are random: seeds disagree (else nothing was sampled).
        assert!(
            distinct.len() as u64 > SEEDS / 2,
            "{name}: only {} distinct outputs over {SEEDS} seeds",
            distinct.len()
        );
        accepted_everywhere += stats.spec_accepted_tokens_total;
        println!(
            "{name}: {SEEDS} seeds drew the same tokens with and without speculation ({} of {} proposals accepted)",
            stats.spec_accepted_tokens_total, stats.spec_proposed_tokens_total
        );
    }
    assert!(
        accepted_everywhere > 0,
        "no proposal was ever accepted under sampling: nothing was tested"
    );
}
