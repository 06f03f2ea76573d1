//! Greedy continuations of token-id prompts through the real engine (all
//! prompts submitted at once, so they share batched steps), for comparing
//! with transformers on a GPU machine (`tests/gpu/fidelity.py`).
//!
//!     greedy <model dir> <prompts.json> <new tokens> [cpu|cuda|auto] [score]
//!
//! With `score`, each prompt is scored instead (teacher forcing): the
//! output's `prompt_top2` holds the two most likely tokens after each
//! prompt position (from position 1 on, as `prompt_logprobs`).
//! `prompts.json` is a list of token-id lists. Prints one JSON object per
//! prompt, in order: `{"tokens": [...], "top2": [[id, logprob, id, logprob], ...]}`
//! where `top2` holds the two most likely tokens at each generated position
//! (the margin between them says how close a choice was).
use gyre_engine::{DeviceChoice, Engine, EngineOptions, Event, GenerateRequest, Sampling};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = args.get(1).expect("model dir");
    let prompts: Vec<Vec<u32>> = serde_json::from_str(
        &std::fs::read_to_string(args.get(2).expect("prompts.json")).expect("read prompts"),
    )
    .expect("prompts: a JSON list of token-id lists");
    let new_tokens: u32 = args
        .get(3)
        .and_then(|s| s.parse().ok())
        .expect("new tokens");
    let score = args.get(5).is_some_and(|a| a == "score");
    let mut o = EngineOptions::new(dir);
    o.device = match args.get(4).map(String::as_str) {
        Some("cpu") => DeviceChoice::Cpu,
        Some("cuda") => DeviceChoice::Cuda,
        _ => DeviceChoice::Auto,
    };
    o.max_running = prompts.len().max(1);
    let e = Engine::start(o).expect("engine");
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("rt");
    let rxs: Vec<_> = prompts
        .iter()
        .map(|p| {
            let req = GenerateRequest {
                sampling: Sampling {
                    temperature: 0.0,
                    ..Sampling::default()
                },
                ignore_eos: true,
                logprobs: Some(2),
                prompt_logprobs: score.then_some(2),
                ..GenerateRequest::new(p.clone(), if score { 1 } else { new_tokens })
            };
            e.submit(req).expect("submit")
        })
        .collect();
    rt.block_on(async {
        for mut rx in rxs {
            let (mut tokens, mut top2, mut prompt_top2) = (Vec::new(), Vec::new(), Vec::new());
            while let Some(ev) = rx.recv().await {
                match ev {
                    Event::Token(t) => tokens.push(t),
                    Event::Logprobs(lp) => top2.push(
                        lp.top
                            .iter()
                            .take(2)
                            .flat_map(|&(id, l)| [serde_json::json!(id), serde_json::json!(l)])
                            .collect::<Vec<_>>(),
                    ),
                    Event::PromptLogprobs(list) => prompt_top2.extend(list.iter().map(|lp| {
                        lp.top
                            .iter()
                            .take(2)
                            .flat_map(|&(id, l)| [serde_json::json!(id), serde_json::json!(l)])
                            .collect::<Vec<_>>()
                    })),
                    Event::Finished { .. } => break,
                    Event::Failed(err) => panic!("generation failed: {err}"),
                    _ => {}
                }
            }
            println!(
                "{}",
                serde_json::json!({"tokens": tokens, "top2": top2, "prompt_top2": prompt_top2})
            );
        }
    });
}
