//! P1: prompt-lookup decoding against plain decoding, at one stream, on a
//! real model (SmolLM2-135M-Instruct, the default model) and edit-style
//! prompts: "rewrite this paragraph, changing one word", whose answers copy
//! long runs of their prompt.
//!
//! gyre runs as its own `gyre serve` on that model. For each paragraph,
//! rounds of one plain request (`num_assistant_tokens: 0`) and one with
//! prompt lookup alternate which goes first; every request is greedy over
//! gRPC `GenerateStream`, alone, and the two answers must be the same text
//! (prompt lookup never changes the output). Tokens per second is the
//! request's completion tokens over its wall time from sending to `Finish`.
//! The figure is the median of the rounds' ratios (lookup / plain), beside
//! the medians of each side, the share of proposals the model accepted and
//! the tokens each engine step produced.
//!
//! D1: the same rounds with a draft model instead (`gyre serve
//! --draft-model`, by default SmolLM2's first 6 of 30 layers, made by
//! `tests/fixtures/make_draft.py`): plain requests against requests that
//! speculate with the draft, on one server. No target: the figure is
//! reported as measured (a layer-truncated draft agrees with the model
//! rarely, so it is expected to be slower than plain decoding). With
//! `--draft-temperature T` (above 0) the requests are sampled, both sides
//! of a round with one seed; the answers then differ and are not compared
//! (the draft's proposals are drawn and checked by speculative sampling).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context as _;
use gyre_api::v1::generation_client::GenerationClient;
use gyre_api::v1::{self, generate_response::Event, request::Input};
use serde_json::json;
use tonic::transport::Channel;

use super::{Outcome, median};
use crate::report::Row;
use crate::server::{Server, ServerOptions};

/// What P1 needs.
pub struct LookupCtx<'a> {
    pub bin: &'a Path,
    /// A chat model (default: the SmolLM2 GGUF that `make models` fetches).
    pub model: PathBuf,
    pub threads: usize,
    pub device: &'a str,
    pub scratch: &'a Path,
    /// Rounds per paragraph (each one plain and one lookup request).
    pub rounds: usize,
    /// Tokens proposed per step.
    pub num_tokens: u32,
    pub server_args: &'a [String],
    /// D1's draft model (a GGUF file or model directory).
    pub draft: PathBuf,
    /// D1's tokens proposed per step.
    pub draft_tokens: u32,
    /// D1's temperature (0: greedy).
    pub draft_temperature: f32,
}

/// The edit-style tasks: a paragraph and the one change asked for.
const TASKS: [(&str, &str, &str); 4] = [
    (
        "The old lighthouse stood at the edge of the cliff, its white paint peeling in the salt wind. Every evening the keeper climbed the spiral stairs, lit the great lamp, and watched the ships pass safely through the narrow channel below. In winter the storms came often, and some nights the waves reached the lowest windows.",
        "white",
        "red",
    ),
    (
        "Our team meets every Monday morning to plan the week. Each person describes what they finished, what they are working on, and anything that is blocking them. The meeting lasts thirty minutes, and notes are shared with everyone in the project channel afterwards.",
        "Monday",
        "Tuesday",
    ),
    (
        "To install the package, download the archive, unpack it into a new folder, and run the setup script from a terminal. The script checks your system, installs the libraries it needs, and prints a short summary when it is done. Restart your computer before using the program for the first time.",
        "archive",
        "installer",
    ),
    (
        "The village market opens at seven in the morning and closes at noon. Farmers bring fresh vegetables, cheese, bread and flowers from the nearby hills. Visitors come from the city on weekends, and the small cafe next to the fountain is always full of people drinking coffee in the sun.",
        "seven",
        "eight",
    ),
];

/// One request's result.
struct Run {
    text: String,
    tokens: u32,
    seconds: f64,
    proposed: u32,
    accepted: u32,
}

/// The chat request for one task, greedy (`temperature` 0) or sampled
/// with `seed`.
fn request(
    (paragraph, from, to): (&str, &str, &str),
    num_tokens: u32,
    max_tokens: u32,
    temperature: f32,
    seed: u64,
) -> v1::Request {
    let prompt = format!(
        "Rewrite the following paragraph exactly as it is, changing only the word '{from}' to '{to}'. Reply with the rewritten paragraph only.\n\n{paragraph}"
    );
    v1::Request {
        input: Some(Input::Chat(v1::ChatInput {
            messages: vec![v1::ChatMessage {
                role: "user".into(),
                content: Some(prompt),
                ..Default::default()
            }],
            ..Default::default()
        })),
        sampling: Some(v1::SamplingParams {
            temperature: Some(temperature),
            seed: (temperature > 0.0).then_some(seed),
            ..Default::default()
        }),
        max_tokens: Some(max_tokens),
        num_assistant_tokens: Some(num_tokens),
        // The prompt cache would serve the second side's prompt: salt each
        // request so both prefill the same way.
        cache_salt: Some(format!("p1-{}-{num_tokens}", rand_salt())),
        ..Default::default()
    }
}

fn rand_salt() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

async fn one(client: &mut GenerationClient<Channel>, req: v1::Request) -> anyhow::Result<Run> {
    let sent = Instant::now();
    let mut stream = client.generate_stream(req).await?.into_inner();
    let mut text = String::new();
    while let Some(msg) = stream.message().await? {
        match msg.event {
            Some(Event::Delta(d)) => text.push_str(&d.text),
            Some(Event::Finish(f)) => {
                if let Some(e) = f.error {
                    anyhow::bail!("request failed: {}", e.message);
                }
                let u = f.usage.context("Finish without usage")?;
                return Ok(Run {
                    text,
                    tokens: u.completion_tokens,
                    seconds: sent.elapsed().as_secs_f64(),
                    proposed: u.speculative_proposed_tokens.unwrap_or(0),
                    accepted: u.speculative_accepted_tokens.unwrap_or(0),
                });
            }
            _ => {}
        }
    }
    anyhow::bail!("stream ended without a Finish")
}

pub async fn p1(ctx: &LookupCtx<'_>) -> Outcome {
    compare(ctx, "P1", ctx.num_tokens, 0.0, ctx.server_args.to_vec()).await
}

pub async fn d1(ctx: &LookupCtx<'_>) -> Outcome {
    anyhow::ensure!(
        ctx.draft.exists(),
        "{} is missing (run `make models`, or pass --draft-model)",
        ctx.draft.display()
    );
    let mut args = ctx.server_args.to_vec();
    args.push("--draft-model".into());
    args.push(ctx.draft.display().to_string());
    compare(ctx, "D1", ctx.draft_tokens, ctx.draft_temperature, args).await
}

/// Speculative (`num_tokens` per step) against plain requests on a server
/// started with `server_args`: P1 (prompt lookup) or D1 (draft model).
async fn compare(
    ctx: &LookupCtx<'_>,
    id: &str,
    num_tokens: u32,
    temperature: f32,
    server_args: Vec<String>,
) -> Outcome {
    anyhow::ensure!(
        ctx.model.exists(),
        "{} is missing (run `make models`, or pass --lookup-model)",
        ctx.model.display()
    );
    let draft = id == "D1";
    let server = Server::start(ServerOptions {
        bin: ctx.bin,
        model: &ctx.model,
        device: ctx.device,
        threads: ctx.threads,
        log: ctx.scratch.join(if draft {
            "gyre-draft.log"
        } else {
            "gyre-lookup.log"
        }),
        extra_args: &server_args,
    })
    .await?;
    let mut client = GenerationClient::connect(server.grpc_url.clone()).await?;
    let max_tokens = 160;
    // Warm-up: first-use costs on both paths.
    one(&mut client, request(TASKS[0], 0, 8, temperature, 0)).await?;
    one(
        &mut client,
        request(TASKS[0], num_tokens, 8, temperature, 0),
    )
    .await?;

    let (mut ratios, mut plain_rates, mut lookup_rates) = (Vec::new(), Vec::new(), Vec::new());
    let (mut proposed, mut accepted, mut lookup_tokens) = (0u64, 0u64, 0u64);
    let mut per_task = Vec::new();
    for (i, &task) in TASKS.iter().enumerate() {
        for round in 0..ctx.rounds.max(1) {
            let seed = (i * 1000 + round) as u64;
            let plain_req = request(task, 0, max_tokens, temperature, seed);
            let lookup_req = request(task, num_tokens, max_tokens, temperature, seed);
            let (plain, fast) = if (i + round) % 2 == 0 {
                let a = one(&mut client, plain_req).await?;
                (a, one(&mut client, lookup_req).await?)
            } else {
                let b = one(&mut client, lookup_req).await?;
                (one(&mut client, plain_req).await?, b)
            };
            anyhow::ensure!(
                temperature > 0.0 || plain.text == fast.text,
                "{id} task {i}: speculation changed the answer:\n{:?}\nvs\n{:?}",
                plain.text,
                fast.text
            );
            let (pr, lr) = (
                f64::from(plain.tokens) / plain.seconds,
                f64::from(fast.tokens) / fast.seconds,
            );
            ratios.push(lr / pr);
            plain_rates.push(pr);
            lookup_rates.push(lr);
            proposed += u64::from(fast.proposed);
            accepted += u64::from(fast.accepted);
            lookup_tokens += u64::from(fast.tokens);
            if round == 0 {
                per_task.push(json!({
                    "task": i,
                    "tokens": fast.tokens,
                    "proposed": fast.proposed,
                    "accepted": fast.accepted,
                    "answer": fast.text,
                }));
            }
        }
    }
    drop(client);
    server.stop().await;

    let ratio = median(&ratios);
    let acceptance = accepted as f64 / proposed.max(1) as f64;
    // Each step yields its accepted proposals plus one sampled token.
    let steps = lookup_tokens.saturating_sub(accepted).max(1);
    let speculative = format!("{:.1} tok/s", median(&lookup_rates));
    let plain = format!("{:.1} tok/s plain", median(&plain_rates));
    let head = if draft {
        Row::new(
            id,
            &format!(
                "1 stream, edit-style chat, draft model ({num_tokens} tokens) vs plain, {}, tok/s",
                if temperature > 0.0 {
                    format!("temperature {temperature}")
                } else {
                    "greedy".to_string()
                }
            ),
        )
        .gyre(speculative)
        .reference(plain)
        .value(ratio)
    } else {
        Row::new(
            id,
            &format!(
                "1 stream, edit-style chat, prompt lookup ({num_tokens} tokens) vs plain, tok/s"
            ),
        )
        .gyre(speculative)
        .reference(plain)
        .compare(ratio, ">= 1.5", ratio >= 1.5)
    };
    let rows = vec![
        head,
        Row::new(id, "  proposals accepted, tokens per step").gyre(format!(
            "{:.0}% of {proposed}, {:.2} tokens/step",
            100.0 * acceptance,
            lookup_tokens as f64 / steps as f64
        )),
    ];
    let details = json!({
        "model": ctx.model,
        "draft_model": draft.then_some(&ctx.draft),
        "threads": ctx.threads,
        "num_assistant_tokens": num_tokens,
        "temperature": temperature,
        "max_tokens": max_tokens,
        "ratios": ratios,
        "ratio_median": ratio,
        "plain_tok_s": plain_rates,
        "lookup_tok_s": lookup_rates,
        "proposed": proposed,
        "accepted": accepted,
        "tasks": per_task,
    });
    Ok((rows, details))
}
