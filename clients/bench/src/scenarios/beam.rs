//! B1: beam search of width 4 on SmolLM2-135M-Instruct (the default model's
//! GGUF, `GYRE_MODELS` or `.gyre/models`), gyre against transformers'
//! `generate(num_beams=4)` on the same file (`hf_beam_reference.py`), side
//! by side: the same chat prompts (rendered and tokenized by transformers,
//! sent to gyre as token ids), one request at a time over gRPC
//! (`Request.beam`, n = 1). Both return the same best hypothesis (checked);
//! tokens/s = its tokens (EOS included) / wall time, summed over the prompts.
//! gyre runs a server of its own on the GGUF.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use gyre_api::v1::{self, generate_response::Event, request::Input};
use serde_json::{Value, json};

use super::Ctx;
use super::Outcome;
use crate::report::Row;
use crate::server::{Server, ServerOptions};

const WIDTH: u32 = 4;
const PROMPTS: [&str; 3] = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in one sentence what a beam search is.",
];

fn gguf() -> PathBuf {
    std::env::var_os("GYRE_MODELS")
        .map_or_else(|| PathBuf::from(".gyre/models"), PathBuf::from)
        .join("smollm2-135m-instruct.gguf")
}

pub async fn b1(ctx: &Ctx) -> Outcome {
    anyhow::ensure!(
        !ctx.no_reference,
        "B1 needs transformers (it tokenizes the prompts)"
    );
    let model = gguf();
    anyhow::ensure!(
        model.exists(),
        "{} is missing (make models)",
        model.display()
    );
    let new_tokens = ctx.sizes.output_len.min(48);
    let spec = json!({"prompts": PROMPTS, "num_beams": WIDTH, "new_tokens": new_tokens,
                      "threads": ctx.threads, "repeats": ctx.sizes.hf_repeats});
    let file = ctx.scratch.join("hf-beam.json");
    std::fs::write(&file, spec.to_string())?;
    let out = ctx
        .python
        .run(
            "hf_beam_reference.py",
            &[
                "--gguf".as_ref(),
                model.as_os_str(),
                "--input".as_ref(),
                file.as_os_str(),
            ],
        )
        .await?;
    let hf: Value = serde_json::from_str(
        out.lines()
            .rev()
            .find(|l| l.starts_with('{'))
            .context("hf_beam_reference.py printed no JSON")?,
    )?;
    let prompts: Vec<Vec<u32>> = serde_json::from_value(hf["prompt_ids"].clone())?;
    let theirs: Vec<Vec<u32>> = serde_json::from_value(hf["output_ids"].clone())?;
    let server = Server::start(ServerOptions {
        bin: &ctx.gyre_bin,
        model: &model,
        device: &ctx.device,
        threads: ctx.threads,
        log: ctx.scratch.join("gyre-beam.log"),
        extra_args: &[],
    })
    .await?;
    let result = run_gyre(&server.grpc_url, &prompts, new_tokens).await;
    server.stop().await;
    let (ours, seconds) = result?;
    let tokens: usize = ours.iter().map(Vec::len).sum();
    let gyre = tokens as f64 / seconds;
    let hf_rate = hf["tok_per_s"].as_f64().unwrap_or(0.0);
    let same = ours == theirs;
    let ratio = gyre / hf_rate.max(f64::MIN_POSITIVE);
    let rows = vec![
        Row::new("B1", &format!("beam search width {WIDTH}, tok/s (gRPC)"))
            .gyre(format!("{gyre:.1} tok/s"))
            .reference(format!("{hf_rate:.1} tok/s"))
            .compare(ratio, ">= 1.0", ratio >= 1.0),
        Row::new("B1", "  same best hypotheses as transformers")
            .gyre(if same { "yes" } else { "NO" })
            .reference(format!("{tokens} tokens, {} prompts", prompts.len())),
    ];
    let details = json!({"width": WIDTH, "new_tokens": new_tokens, "gyre_tok_per_s": gyre,
                         "gyre_seconds": seconds, "hf": hf, "ratio": ratio,
                         "identical": same, "gyre_output_ids": ours});
    Ok((rows, details))
}

/// Each prompt's best hypothesis (its stop token included), and the summed
/// wall time of the requests.
async fn run_gyre(
    url: &str,
    prompts: &[Vec<u32>],
    max: u32,
) -> anyhow::Result<(Vec<Vec<u32>>, f64)> {
    let mut client = v1::generation_client::GenerationClient::connect(url.to_owned()).await?;
    let request = |ids: &[u32]| v1::Request {
        input: Some(Input::TokenIds(v1::TokenIds { ids: ids.to_vec() })),
        max_tokens: Some(max),
        beam: Some(v1::BeamSearch {
            width: WIDTH,
            ..Default::default()
        }),
        ..Default::default()
    };
    // Warm-up, as transformers gets one.
    let mut s = client
        .generate_stream(request(&prompts[0]))
        .await?
        .into_inner();
    while s.message().await?.is_some() {}
    let (mut outputs, mut seconds) = (Vec::new(), 0.0);
    for p in prompts {
        let t0 = Instant::now();
        let mut stream = client.generate_stream(request(p)).await?.into_inner();
        let mut ids = Vec::new();
        while let Some(m) = stream.message().await? {
            match m.event {
                Some(Event::Delta(d)) => ids.extend(d.token_ids),
                Some(Event::Finish(f)) => {
                    if let Some(e) = f.error {
                        anyhow::bail!("beam search failed: {}", e.message);
                    }
                    ids.extend(f.matched_stop_token_id);
                }
                _ => {}
            }
        }
        seconds += t0.elapsed().as_secs_f64();
        outputs.push(ids);
    }
    Ok((outputs, seconds))
}
