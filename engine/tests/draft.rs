//! Speculative decoding with a draft model changes how many tokens a
//! target step computes, never which tokens come out. For every fixture
//! family, two drafts: the same model (it proposes the target's own greedy
//! tokens, so nearly everything is accepted) and another family with the
//! same tokenizer and random weights of its own (it disagrees often).
//! Greedy output with either is transformers' greedy continuation of the
//! golden prompt, and a request biased towards three tokens (so that a
//! disagreeing draft is right some of the time) gives the same tokens
//! with the draft as without, batched beside requests that do not
//! speculate, under a token budget that cuts proposals short, and in
//! pools small enough to preempt sequences (the target's) or to leave
//! the draft without blocks. Under sampling, the draft's proposals are
//! drawn and checked by the speculative-sampling rule: the output's
//! distribution is compared with plain sampling's by a two-sample test.

mod common;

use std::path::{Path, PathBuf};

use common::{MODELS, golden, ids, models_dir};
use gyre_engine::{
    DeviceChoice, DraftSpeculation, Engine, EngineOptions, EngineStats, Event, GenerateRequest,
    Sampling,
};

/// Families sharing one tokenizer (and vocabulary size).
const GROUPS: [&[&str]; 2] = [
    &[
        "tiny-llama",
        "tiny-mistral",
        "tiny-mistral-sw",
        "tiny-gemma3",
        "tiny-gemma2",
        "tiny-phi3",
        "tiny-phi4",
        "tiny-mixtral",
    ],
    &["tiny-qwen2", "tiny-qwen3", "tiny-qwen3-moe"],
];

/// Another family with `name`'s vocabulary.
fn other(name: &str) -> &'static str {
    for g in GROUPS {
        if let Some(i) = g.iter().position(|&m| m == name) {
            return g[(i + 1) % g.len()];
        }
    }
    panic!("{name} is in no vocabulary group")
}

fn draft(num_tokens: u32) -> Option<DraftSpeculation> {
    Some(DraftSpeculation {
        num_tokens,
        confidence_threshold: None,
    })
}

/// Greedy decoding with `bias` added to those tokens' logits.
fn biased(
    prompt: Vec<u32>,
    max_tokens: u32,
    d: Option<DraftSpeculation>,
    bias: &[u32],
) -> GenerateRequest {
    GenerateRequest {
        sampling: Sampling {
            temperature: 0.0,
            logit_bias: bias.iter().map(|&t| (t, 30.0)).collect(),
            ..Sampling::default()
        },
        ignore_eos: true,
        draft: d,
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

fn engine(dir: &Path, draft: Option<PathBuf>, f: impl FnOnce(&mut EngineOptions)) -> Engine {
    let mut opts = EngineOptions::new(dir);
    opts.device = DeviceChoice::Cpu;
    opts.draft_model_dir = draft;
    f(&mut opts);
    Engine::start(opts).expect("engine starts")
}

#[test]
fn greedy_with_a_draft_model_is_greedy_for_every_family() {
    let (mut preempted, mut disagreed) = (0, 0);
    for name in MODELS {
        let (dir, g) = golden(name);
        let want = ids(&g["greedy_ids"]);
        let prompt = ids(&g["prompt_ids"]);
        let n = want.len() as u32;
        let bias = &want[..3];
        let plain = engine(&dir, None, |_| {});
        let (base, _) = run(name, &plain, vec![biased(prompt.clone(), 40, None, bias)]);
        drop(plain);

        for draft_name in [name, other(name)] {
            let label = format!("{name} drafted by {draft_name}");
            let e = engine(&dir, Some(models_dir().join(draft_name)), |_| {});
            let (outs, stats) = run(
                &label,
                &e,
                vec![
                    biased(prompt.clone(), n, draft(4), &[]),
                    biased(prompt.clone(), 40, draft(5), bias),
                    biased(prompt.clone(), 40, None, bias),
                ],
            );
            assert_eq!(
                outs[0], want,
                "{label}: differs from transformers' greedy ids"
            );
            assert_eq!(outs[1], base[0], "{label}: the draft changed the tokens");
            assert_eq!(outs[2], base[0], "{label}: batched beside the draft");
            let (p, a) = (
                stats.draft_proposed_tokens_total,
                stats.draft_accepted_tokens_total,
            );
            assert!(p > 0, "{label}: nothing was proposed");
            assert_eq!(p, stats.spec_proposed_tokens_total, "{label}");
            assert!(stats.draft_forwards_total > 0, "{label}");
            assert_eq!(stats.draft_kv_blocks_used, 0, "{label}: draft blocks left");
            if draft_name == name {
                assert!(a * 10 >= p * 9, "{label}: itself accepted only {a} of {p}");
            } else {
                disagreed += p - a;
            }
            println!("{label}: identical ({a} of {p} proposals accepted)");
        }

        // A token budget of 8 cuts proposals short, and a target pool too
        // small for three requests preempts sequences holding proposals
        // (the draft's blocks are freed and recomputed on resumption); a
        // draft pool of 3 blocks leaves some sequences without proposals.
        let per_request = (prompt.len() + 40).div_ceil(16);
        let tight = engine(&dir, Some(models_dir().join(other(name))), |o| {
            o.token_budget = 8;
            o.num_blocks = Some(per_request + per_request / 2 + 1);
            o.draft_num_blocks = Some(per_request + 1);
        });
        let (outs, stats) = run(
            name,
            &tight,
            (0..3)
                .map(|_| biased(prompt.clone(), 40, draft(5), bias))
                .collect(),
        );
        for (i, out) in outs.iter().enumerate() {
            assert_eq!(out, &base[0], "{name}: request {i} under pressure");
        }
        assert_eq!(stats.draft_kv_blocks_used, 0, "{name}: draft blocks left");
        preempted += stats.preemptions_total;
        println!(
            "{name}: under pressure identical ({} preemptions, {} of {} accepted)",
            stats.preemptions_total,
            stats.draft_accepted_tokens_total,
            stats.draft_proposed_tokens_total
        );
    }
    assert!(
        preempted > 0,
        "nothing was preempted: the pressure runs tested nothing"
    );
    assert!(
        disagreed > 0,
        "no draft ever disagreed: rejection was never tested"
    );
}

fn sampled(
    prompt: Vec<u32>,
    seed: u64,
    d: Option<DraftSpeculation>,
    bias: &[u32],
) -> GenerateRequest {
    GenerateRequest {
        sampling: Sampling {
            temperature: 1.0,
            top_k: 3,
            frequency_penalty: 0.05,
            seed: Some(seed),
            // Far above the rest, close to each other: the draws are
            // random among the three (top_k keeps just them), and the
            // draft's distribution over them differs from the target's.
            logit_bias: bias.iter().map(|&t| (t, 30.0)).collect(),
            ..Sampling::default()
        },
        ignore_eos: true,
        draft: d,
        ..GenerateRequest::new(prompt, SAMPLED_TOKENS)
    }
}

/// Tokens per sampled request: the first is sampled in the prefill step
/// (never speculated); the draft proposes for the rest.
const SAMPLED_TOKENS: u32 = 5;

/// Pearson's two-sample statistic of homogeneity for two samples of the
/// same size, over the cells either has.
fn chi2(
    a: &std::collections::HashMap<Vec<u32>, u64>,
    b: &std::collections::HashMap<Vec<u32>, u64>,
) -> (f64, usize) {
    let cells: std::collections::BTreeSet<&Vec<u32>> = a.keys().chain(b.keys()).collect();
    let stat = cells
        .iter()
        .map(|c| {
            let (x, y) = (
                *a.get(*c).unwrap_or(&0) as f64,
                *b.get(*c).unwrap_or(&0) as f64,
            );
            (x - y).powi(2) / (x + y)
        })
        .sum();
    (stat, cells.len())
}

/// The chi-square distribution's quantile at 1 - 1e-4 for `df` degrees
/// of freedom (scipy.stats.chi2.ppf), for the cell counts these tests
/// produce.
fn critical(df: usize) -> f64 {
    match df {
        1 => 15.137,
        2 => 18.421,
        3 => 21.108,
        4 => 23.513,
        5 => 25.745,
        6 => 27.856,
        7 => 29.878,
        8 => 31.828,
        _ => panic!("no critical value for {df} degrees of freedom"),
    }
}

/// The first three distinct tokens of a greedy continuation.
fn three_tokens(greedy: &[u32]) -> Vec<u32> {
    let mut out: Vec<u32> = Vec::new();
    for &t in greedy {
        if !out.contains(&t) {
            out.push(t);
        }
    }
    assert!(out.len() >= 3, "fewer than three distinct greedy tokens");
    out.truncate(3);
    out
}

/// Counts of each position's token (the three biased tokens, anything
/// else as one cell) and of each pair of neighbouring positions' tokens.
fn tallies(outs: &[Vec<u32>], bias: &[u32]) -> Vec<std::collections::HashMap<Vec<u32>, u64>> {
    let cell = |t: u32| bias.iter().position(|&b| b == t).unwrap_or(bias.len()) as u32;
    let n = SAMPLED_TOKENS as usize;
    let mut t = vec![std::collections::HashMap::new(); 2 * n - 1];
    for o in outs {
        assert_eq!(o.len(), n);
        for j in 0..n {
            *t[j].entry(vec![cell(o[j])]).or_default() += 1;
            if j + 1 < n {
                *t[n + j]
                    .entry(vec![cell(o[j]), cell(o[j + 1])])
                    .or_default() += 1;
            }
        }
    }
    t
}

/// Under sampling the draft's proposals are drawn from its distribution
/// (the request's sampling rules over the draft's logits) and checked by
/// the speculative-sampling rule, so which tokens come out for a seed
/// changes, their distribution must not. For three families, each drafted
/// by another family: the same prompt sampled with SEEDS seeds with the
/// draft and SEEDS other seeds without it, and the two samples compared
/// by Pearson's two-sample chi-square test at every position and every
/// pair of neighbouring positions, at a false-alarm rate of 1e-4 per
/// comparison. The test's power is checked on the same data: the draft
/// model sampled as the target (what the output would follow if
/// proposals were kept blindly) must differ from the target by the same
/// test, and the draft must be rejected often (else the residual draw was
/// never exercised).
#[test]
fn sampling_with_a_draft_model_keeps_the_targets_distribution() {
    const SEEDS: u64 = 400;
    for name in ["tiny-llama", "tiny-qwen2", "tiny-gemma3"] {
        let (dir, g) = golden(name);
        let prompt = ids(&g["prompt_ids"]);
        let bias = &three_tokens(&ids(&g["greedy_ids"]));
        let draft_dir = models_dir().join(other(name));
        let e = engine(&dir, Some(draft_dir.clone()), |o| o.max_running = 64);
        let with: Vec<_> = (0..SEEDS)
            .map(|seed| sampled(prompt.clone(), seed, draft(4), bias))
            .collect();
        let without: Vec<_> = (0..SEEDS)
            .map(|seed| sampled(prompt.clone(), SEEDS + seed, None, bias))
            .collect();
        let (outs_with, stats) = run(name, &e, with);
        let (outs_without, _) = run(name, &e, without);
        drop(e);
        let d = engine(&draft_dir, None, |o| o.max_running = 64);
        let draft_reqs: Vec<_> = (0..SEEDS)
            .map(|seed| sampled(prompt.clone(), 2 * SEEDS + seed, None, bias))
            .collect();
        let (outs_draft, _) = run(name, &d, draft_reqs);
        drop(d);
        let (a, b, q) = (
            tallies(&outs_with, bias),
            tallies(&outs_without, bias),
            tallies(&outs_draft, bias),
        );
        let mut power = 0f64;
        for (j, ((a, b), q)) in a.iter().zip(&b).zip(&q).enumerate() {
            let (stat, cells) = chi2(a, b);
            let crit = critical(cells.max(2) - 1);
            println!(
                "{name}: comparison {j}: chi2 {stat:.2} over {cells} cells (critical {crit:.2})"
            );
            assert!(
                stat < crit,
                "{name}: comparison {j}: the draft changed the distribution (chi2 {stat:.2} >= {crit:.2}): {a:?} vs {b:?}"
            );
            let (qs, qc) = chi2(q, b);
            power = power.max(qs / critical(qc.max(2) - 1));
        }
        let (proposed, accepted) = (
            stats.draft_proposed_tokens_total,
            stats.draft_accepted_tokens_total,
        );
        println!(
            "{name}: {accepted} of {proposed} proposals accepted; the draft's own distribution at {power:.1}x the critical value"
        );
        assert!(
            power > 1.0,
            "{name}: the draft's own distribution is not told apart from the target's: the test has no power here"
        );
        assert!(
            proposed > 0 && accepted > 0 && accepted < proposed * 9 / 10,
            "{name}: {accepted} of {proposed} accepted: the rejection path was hardly tested"
        );
    }
}

/// The draft model drafting for itself under sampling: its proposals are
/// drawn from the distribution the target then samples from (q = p up to
/// the last bits of a batched forward and the penalties of the tokens
/// proposed before), so nearly all are kept, unlike greedy proposals,
/// which are kept only when the target draws its most likely token.
#[test]
fn a_draft_that_is_the_target_is_accepted_under_sampling() {
    let name = "tiny-llama";
    let (dir, g) = golden(name);
    let bias = three_tokens(&ids(&g["greedy_ids"]));
    let prompt = ids(&g["prompt_ids"]);
    let e = engine(&dir, Some(dir.clone()), |_| {});
    let reqs: Vec<_> = (0..32)
        .map(|seed| sampled(prompt.clone(), seed, draft(4), &bias))
        .collect();
    let (_, stats) = run(name, &e, reqs);
    let (proposed, accepted) = (
        stats.draft_proposed_tokens_total,
        stats.draft_accepted_tokens_total,
    );
    println!("{name} drafting itself: {accepted} of {proposed} accepted");
    assert!(proposed > 0);
    assert!(
        accepted * 100 >= proposed * 95,
        "{name} drafting itself under sampling: only {accepted} of {proposed} accepted"
    );
}

/// A threshold of 1 stops the draft at its first token (no probability
/// reaches 1 here); a threshold of 0 proposes the full count.
#[test]
fn the_confidence_threshold_stops_the_draft() {
    let name = "tiny-llama";
    let (dir, g) = golden(name);
    let want = ids(&g["greedy_ids"]);
    let prompt = ids(&g["prompt_ids"]);
    let bias = &want[..3];
    let with = |t: f32| {
        Some(DraftSpeculation {
            num_tokens: 4,
            confidence_threshold: Some(t),
        })
    };
    let e = engine(&dir, Some(models_dir().join(other(name))), |_| {});
    let (base, _) = run(name, &e, vec![biased(prompt.clone(), 24, None, bias)]);
    let (outs, stats) = run(name, &e, vec![biased(prompt.clone(), 24, with(1.0), bias)]);
    assert_eq!(outs[0], base[0]);
    assert_eq!(stats.draft_proposed_tokens_total, 0, "threshold 1 proposed");
    let (outs, after) = run(name, &e, vec![biased(prompt.clone(), 24, with(0.0), bias)]);
    assert_eq!(outs[0], base[0]);
    assert!(
        after.draft_proposed_tokens_total >= 4,
        "threshold 0 proposed nothing"
    );
}

#[test]
fn a_draft_with_another_vocabulary_is_refused() {
    let dir = models_dir().join("tiny-llama");
    let mut opts = EngineOptions::new(&dir);
    opts.device = DeviceChoice::Cpu;
    opts.draft_model_dir = Some(models_dir().join("tiny-qwen2"));
    let err = Engine::start(opts).err().expect("refused").to_string();
    assert!(
        err.contains("vocabulary differs") && err.contains("vocab_size"),
        "{err}"
    );
}

#[test]
fn draft_requests_are_checked() {
    let dir = models_dir().join("tiny-llama");
    let plain = engine(&dir, None, |_| {});
    let req = biased(vec![1, 2, 3], 4, draft(3), &[]);
    let err = plain.submit(req.clone()).expect_err("no draft model");
    assert!(err.to_string().contains("no draft model"), "{err}");
    drop(plain);
    let e = engine(&dir, Some(dir.clone()), |_| {});
    assert!(e.info().draft_model.is_some());
    let mut both = req.clone();
    both.speculation = Some(gyre_engine::Speculation {
        num_tokens: 3,
        max_ngram: 2,
        min_ngram: 1,
    });
    assert!(e.submit(both).is_err());
    let mut wide = req.clone();
    wide.draft = draft(gyre_engine::MAX_SPECULATIVE_TOKENS + 1);
    assert!(e.submit(wide).is_err());
    let mut th = req;
    th.draft = Some(DraftSpeculation {
        num_tokens: 3,
        confidence_threshold: Some(1.5),
    });
    let err = e.submit(th).expect_err("out of range");
    assert!(err.to_string().contains("assistant_confidence_threshold"));
}
