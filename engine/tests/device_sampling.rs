//! Sampling on the device (the default on CUDA) gives the tokens the host
//! sampler gives, request for request: every fixture family, seeded
//! requests with every sampling parameter batched together (temperature,
//! top-k, top-p, min-p, the three penalties, logit bias, min_tokens with
//! stop ids), some asking for logprobs or several choices (which stay on
//! the host) beside them. Without a GPU the device path runs on the CPU's
//! tensors (`EngineOptions::device_sampling`), the same operations.
//! Requests run one at a time (see `engine`: batches follow arrival times,
//! and a row's last bits follow its batch).

mod common;

use common::{MODELS, golden, ids};
use gyre_engine::{DeviceChoice, Engine, EngineOptions, Event, GenerateRequest, Sampling};

fn requests(prompt: &[u32], eos_like: u32) -> Vec<(GenerateRequest, u32)> {
    let s = |temperature: f32, top_p: f32, top_k: u32, min_p: f32| Sampling {
        temperature,
        top_p,
        top_k,
        min_p,
        ..Sampling::default()
    };
    let settings = vec![
        s(0.0, 1.0, 0, 0.0),
        s(1.0, 1.0, 0, 0.0),
        s(0.7, 0.9, 0, 0.0),
        s(1.2, 1.0, 8, 0.0),
        s(1.0, 1.0, 0, 0.05),
        Sampling {
            repetition_penalty: 1.4,
            ..s(1.0, 0.95, 0, 0.0)
        },
        Sampling {
            presence_penalty: 0.7,
            frequency_penalty: 0.9,
            ..s(0.0, 1.0, 0, 0.0)
        },
        Sampling {
            logit_bias: vec![(prompt[0], 4.0), (prompt[1], -100.0)],
            frequency_penalty: 0.3,
            ..s(0.9, 0.9, 30, 0.02)
        },
    ];
    let mut out = Vec::new();
    for (i, cfg) in settings.into_iter().enumerate() {
        for seed in 0..3u64 {
            let mut req = GenerateRequest {
                sampling: Sampling {
                    seed: Some(seed * 31 + i as u64),
                    ..cfg.clone()
                },
                ignore_eos: true,
                ..GenerateRequest::new(prompt.to_vec(), 24)
            };
            match (i + seed as usize) % 4 {
                // Stops at a token, but never within the first 10.
                1 => {
                    req.stop_token_ids = vec![eos_like];
                    req.min_tokens = 10;
                }
                // Logprobs: on the host, beside the device's rows.
                2 => req.logprobs = Some(2),
                _ => {}
            }
            let n = if (i + seed as usize) % 5 == 3 { 2 } else { 1 };
            out.push((req, n));
        }
    }
    out
}

fn run(engine: &Engine, reqs: &[(GenerateRequest, u32)]) -> Vec<Vec<u32>> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let rxs: Vec<_> = reqs
        .iter()
        .flat_map(|(r, n)| engine.submit_n(r.clone(), *n).expect("submit"))
        .collect();
    rt.block_on(async {
        let mut outs = Vec::new();
        for mut rx in rxs {
            let mut toks = Vec::new();
            loop {
                match rx.recv().await {
                    Some(Event::Token(t)) => toks.push(t),
                    Some(Event::Finished { .. }) => break,
                    Some(Event::Failed(e)) => panic!("{e}"),
                    Some(_) => {}
                    None => panic!("the stream ended without Finished"),
                }
            }
            outs.push(toks);
        }
        outs
    })
}

#[test]
fn device_sampling_draws_the_host_samplers_tokens() {
    let mut device_rows = 0;
    for name in MODELS {
        let (dir, g) = golden(name);
        let prompt = ids(&g["prompt_ids"]);
        let greedy = ids(&g["greedy_ids"]);
        // A token the model does produce, as a stop id.
        let reqs = requests(&prompt, greedy[2]);
        let engine = |on: bool| {
            let mut o = EngineOptions::new(&dir);
            o.device = DeviceChoice::Cpu;
            o.device_sampling = Some(on);
            // A row's logits differ in their last bits with the batch it
            // is computed in (the matrix products' blocking follows the
            // row count, and an expert's follows how many tokens it gets),
            // and batches follow arrival times: one request at a time keeps
            // both runs' steps the same (the choices of n = 2 still share
            // steps, so picks of several rows are made together).
            o.max_running = 1;
            Engine::start(o).expect("engine starts")
        };
        let host = run(&engine(false), &reqs);
        let device = run(&engine(true), &reqs);
        assert_eq!(host.len(), device.len());
        for (i, (h, d)) in host.iter().zip(&device).enumerate() {
            assert_eq!(h, d, "{name}: stream {i} differs on the device path");
        }
        let distinct: std::collections::HashSet<_> = host.iter().collect();
        assert!(
            distinct.len() > host.len() / 2,
            "{name}: only {} distinct outputs of {}",
            distinct.len(),
            host.len()
        );
        let stopped = host.iter().filter(|t| t.len() < 24).count();
        device_rows += host.iter().map(Vec::len).sum::<usize>();
        println!(
            "{name}: {} streams identical on both paths ({stopped} stopped early)",
            host.len()
        );
    }
    assert!(device_rows > 0);
}
