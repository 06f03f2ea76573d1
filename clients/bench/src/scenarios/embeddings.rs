//! E1: sentence embeddings, gyre against sentence-transformers' `encode` on
//! the same model directory (default all-MiniLM-L6-v2), the same batch of
//! mixed-length sentences and the same number of threads.
//!
//! gyre runs as its own `gyre serve` on the embedding model. One call embeds
//! the whole batch; after a warm-up call the median of `repeats` calls
//! counts, as sentences per second: over gRPC `Embed` and over HTTP
//! `/v1/embeddings` (JSON floats). The reference (`st_reference.py`) times
//! `encode` with its default batch size and with the whole batch at once,
//! and reports the faster.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context as _;
use gyre_api::v1::embeddings_client::EmbeddingsClient;
use gyre_api::v1::{EmbedRequest, Texts, embed_request};
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use serde_json::{Value, json};

use super::{Outcome, median};
use crate::reference::Python;
use crate::report::Row;
use crate::server::{Server, ServerOptions};

/// What E1 needs.
pub struct EmbedCtx<'a> {
    pub bin: &'a Path,
    pub model: PathBuf,
    pub python: &'a Python,
    pub threads: usize,
    pub device: &'a str,
    pub scratch: &'a Path,
    pub sentences: usize,
    pub repeats: usize,
    pub seed: u64,
    pub no_reference: bool,
    pub server_args: &'a [String],
}

const WORDS: &[&str] = &[
    "the",
    "model",
    "server",
    "answers",
    "every",
    "request",
    "with",
    "a",
    "vector",
    "that",
    "places",
    "similar",
    "sentences",
    "close",
    "together",
    "search",
    "engines",
    "cluster",
    "documents",
    "by",
    "meaning",
    "rather",
    "than",
    "words",
    "and",
    "users",
    "ask",
    "questions",
    "about",
    "weather",
    "music",
    "travel",
    "food",
    "history",
    "science",
    "sport",
    "in",
    "many",
    "languages",
    "quickly",
    "slowly",
    "today",
    "tomorrow",
    "because",
    "people",
    "like",
    "short",
    "long",
    "texts",
];

/// `n` sentences of 2 to 120 words (mixed lengths, all under the model's
/// 256-token limit), from `seed`.
pub fn sentences(n: usize, seed: u64) -> Vec<String> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            // A few long inputs among many short ones, as real traffic has.
            let words = if i % 8 == 0 {
                rng.random_range(60..=120)
            } else {
                rng.random_range(2..=30)
            };
            let mut s: Vec<&str> = (0..words)
                .map(|_| WORDS[rng.random_range(0..WORDS.len())])
                .collect();
            s.dedup();
            format!("{}.", s.join(" "))
        })
        .collect()
}

async fn reference(ctx: &EmbedCtx<'_>, batch: &[String]) -> anyhow::Result<Value> {
    let spec = json!({
        "sentences": batch,
        "threads": ctx.threads,
        "repeats": ctx.repeats,
        "device": ctx.device,
    });
    let file = ctx.scratch.join("st-e1.json");
    std::fs::write(&file, spec.to_string())?;
    let stdout = ctx
        .python
        .run(
            "st_reference.py",
            &[
                "--model".as_ref(),
                ctx.model.as_os_str(),
                "--input".as_ref(),
                file.as_os_str(),
            ],
        )
        .await?;
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .context("st_reference.py printed no JSON")?;
    Ok(serde_json::from_str(line)?)
}

/// Median seconds of `repeats` calls of `call` after one warm-up.
async fn timed<F, Fut>(repeats: usize, mut call: F) -> anyhow::Result<(f64, Vec<f64>)>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    call().await?;
    let mut runs = Vec::with_capacity(repeats);
    for _ in 0..repeats.max(1) {
        let t0 = Instant::now();
        call().await?;
        runs.push(t0.elapsed().as_secs_f64());
    }
    Ok((median(&runs), runs))
}

pub async fn e1(ctx: &EmbedCtx<'_>) -> Outcome {
    anyhow::ensure!(
        ctx.model.join("config.json").is_file(),
        "{} is not a model directory (run `make models`, or pass --embed-model)",
        ctx.model.display()
    );
    let batch = sentences(ctx.sentences, ctx.seed);
    let server = Server::start(ServerOptions {
        bin: ctx.bin,
        model: &ctx.model,
        device: ctx.device,
        threads: ctx.threads,
        log: ctx.scratch.join("gyre-embed.log"),
        extra_args: ctx.server_args,
    })
    .await?;
    let client = EmbeddingsClient::connect(server.grpc_url.clone())
        .await?
        .max_decoding_message_size(64 << 20);
    let request = EmbedRequest {
        model: String::new(),
        inputs: Some(embed_request::Inputs::Texts(Texts {
            texts: batch.clone(),
        })),
        truncate_prompt_tokens: None,
        dimensions: None,
    };
    let tokens = std::cell::Cell::new(0u32);
    let want = batch.len();
    let (grpc_s, grpc_runs) = timed(ctx.repeats, || {
        let (mut c, r) = (client.clone(), request.clone());
        let tokens = &tokens;
        async move {
            let out = c.embed(r).await?.into_inner();
            anyhow::ensure!(out.embeddings.len() == want, "wrong count");
            tokens.set(out.usage.map_or(0, |u| u.prompt_tokens));
            Ok(())
        }
    })
    .await?;
    let body = json!({"model": "", "input": batch, "encoding_format": "float"});
    let addr = server.http_addr;
    let (http_s, http_runs) = timed(ctx.repeats, || {
        let body = &body;
        async move {
            let (status, bytes) = crate::http::post_json(addr, "/v1/embeddings", body).await?;
            anyhow::ensure!(
                status.is_success(),
                "HTTP {status}: {:.300}",
                String::from_utf8_lossy(&bytes)
            );
            Ok(())
        }
    })
    .await?;
    drop(client);
    server.stop().await;

    let n = batch.len() as f64;
    let (grpc_rate, http_rate) = (n / grpc_s, n / http_s);
    let st = if ctx.no_reference {
        None
    } else {
        Some(reference(ctx, &batch).await?)
    };
    let st_rate = st
        .as_ref()
        .and_then(|v| v["sentences_per_s"].as_f64())
        .unwrap_or(f64::NAN);
    let reference_text = st.as_ref().map_or("-".to_owned(), |v| {
        format!(
            "{st_rate:.0} sent/s (encode, batch_size {})",
            v["batch_size"]
        )
    });
    let mut rows = Vec::new();
    for (metric, rate) in [
        ("sentences/s, gRPC Embed", grpc_rate),
        ("sentences/s, HTTP /v1/embeddings", http_rate),
    ] {
        let mut row = Row::new("E1", metric)
            .gyre(format!("{rate:.0} sent/s"))
            .target(">= 1.5");
        if st.is_some() {
            row = row.reference(reference_text.clone()).compare(
                rate / st_rate,
                ">= 1.5",
                rate >= 1.5 * st_rate,
            );
        }
        rows.push(row);
    }
    let details = json!({
        "model": ctx.model,
        "sentences": batch.len(),
        "tokens": tokens.get(),
        "threads": ctx.threads,
        "gyre_grpc_seconds": grpc_s,
        "gyre_grpc_runs": grpc_runs,
        "gyre_http_seconds": http_s,
        "gyre_http_runs": http_runs,
        "sentence_transformers": st,
    });
    Ok((rows, details))
}

#[cfg(test)]
mod tests {
    use super::sentences;

    #[test]
    fn the_batch_is_seeded_and_mixes_lengths() {
        let a = sentences(256, 7);
        assert_eq!(a, sentences(256, 7));
        assert_ne!(a, sentences(256, 8));
        let words: Vec<usize> = a.iter().map(|s| s.split(' ').count()).collect();
        let (min, max) = (words.iter().min(), words.iter().max());
        assert!(min <= Some(&30) && max >= Some(&60), "{min:?}..{max:?}");
        // Every sentence stays under all-MiniLM-L6-v2's 256 tokens (one
        // token a word, plus the period and two special tokens).
        assert!(words.iter().all(|&w| w + 3 <= 256));
    }
}
