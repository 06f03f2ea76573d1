//! L1's perplexity comparison (see `llamacpp.rs`): a fixed text's token ids
//! from `llama-tokenize`, llama.cpp's perplexity from `llama-perplexity`,
//! gyre's from `/v1/completions` with `echo` and `logprobs` over the same ids.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde_json::{Value, json};

use super::llamacpp::{LlamaCtx, model_id};
use crate::report::Row;

/// L1's perplexity comparison: `text` in chunks of `ctx` tokens, at most
/// `chunks` of them (0: none).
pub struct PplSpec {
    pub text: PathBuf,
    pub ctx: usize,
    pub chunks: usize,
}

/// The text's token ids as llama.cpp makes them, for one file.
pub(super) struct PplTokens {
    pub(super) ids: Vec<u32>,
    /// The BOS id when the vocabulary adds one (each chunk starts with it).
    pub(super) bos: Option<u32>,
    /// Chunks scored: min(spec.chunks, ids / ctx).
    pub(super) chunks: usize,
}

/// A llama.cpp tool beside `llama-server`.
pub(super) fn llama_tool(ctx: &LlamaCtx<'_>, name: &str) -> PathBuf {
    ctx.llama_server.with_file_name(name)
}

/// Runs a llama.cpp tool; its stdout and stderr together.
pub(super) async fn run_tool(bin: &Path, args: &[&std::ffi::OsStr]) -> anyhow::Result<String> {
    let out = tokio::process::Command::new(bin)
        .args(args)
        .kill_on_drop(true)
        .output()
        .await
        .with_context(|| format!("running {} (rebuild with `make llamacpp`)", bin.display()))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    anyhow::ensure!(
        out.status.success(),
        "{} failed ({}): {}",
        bin.display(),
        out.status,
        text.lines().rev().take(5).collect::<Vec<_>>().join(" | ")
    );
    Ok(text)
}

/// The last line of `out` that is a JSON list of token ids.
pub(super) fn ids_in(out: &str) -> anyhow::Result<Vec<u32>> {
    out.lines()
        .rev()
        .find(|l| l.trim_start().starts_with('['))
        .context("no token ids in llama-tokenize's output")
        .and_then(|l| Ok(serde_json::from_str(l.trim())?))
}

/// The text's token ids by `llama-tokenize` for `model`, with and without
/// BOS: the vocabulary adds one when the two differ by one leading id.
pub(super) async fn ppl_tokens(ctx: &LlamaCtx<'_>, model: &Path) -> anyhow::Result<PplTokens> {
    let bin = llama_tool(ctx, "llama-tokenize");
    let base: Vec<&std::ffi::OsStr> = vec![
        "-m".as_ref(),
        model.as_os_str(),
        "-f".as_ref(),
        ctx.ppl.text.as_os_str(),
        "--ids".as_ref(),
        "--log-disable".as_ref(),
    ];
    let ids = ids_in(&run_tool(&bin, &base).await?)?;
    let mut plain_args = base.clone();
    plain_args.push("--no-bos".as_ref());
    let plain = ids_in(&run_tool(&bin, &plain_args).await?)?;
    let bos = (ids.len() == plain.len() + 1 && ids[1..] == plain[..]).then(|| ids[0]);
    let chunks = ctx.ppl.chunks.min(ids.len() / ctx.ppl.ctx.max(1));
    anyhow::ensure!(
        chunks >= 1 && ids.len() >= 2 * ctx.ppl.ctx,
        "{} has {} tokens: too short for chunks of {}",
        ctx.ppl.text.display(),
        ids.len(),
        ctx.ppl.ctx
    );
    Ok(PplTokens { ids, bos, chunks })
}

/// llama.cpp's perplexity of the text on `model` (`llama-perplexity`'s
/// final estimate).
pub(super) async fn llama_perplexity(
    ctx: &LlamaCtx<'_>,
    model: &Path,
    chunks: usize,
) -> anyhow::Result<f64> {
    let (c, n, t) = (
        ctx.ppl.ctx.to_string(),
        chunks.to_string(),
        ctx.threads.to_string(),
    );
    let args: Vec<&std::ffi::OsStr> = vec![
        "-m".as_ref(),
        model.as_os_str(),
        "-f".as_ref(),
        ctx.ppl.text.as_os_str(),
        "-c".as_ref(),
        c.as_ref(),
        "-b".as_ref(),
        c.as_ref(),
        "--chunks".as_ref(),
        n.as_ref(),
        "-t".as_ref(),
        t.as_ref(),
    ];
    let out = run_tool(&llama_tool(ctx, "llama-perplexity"), &args).await?;
    parse_final_ppl(&out)
}

/// `Final estimate: PPL = 31.7582 +/- 4.13637` -> 31.7582.
pub(super) fn parse_final_ppl(out: &str) -> anyhow::Result<f64> {
    let line = out
        .lines()
        .rev()
        .find_map(|l| l.split("Final estimate: PPL = ").nth(1))
        .context("no final estimate in llama-perplexity's output")?;
    let value = line.split_whitespace().next().unwrap_or_default();
    value
        .parse()
        .with_context(|| format!("perplexity {value:?}"))
}

/// gyre's perplexity over the same chunks: each chunk's prompt
/// log-probabilities from `/v1/completions` (`echo`, `logprobs`), the
/// second half's tokens counted as llama-perplexity counts them (the
/// token after position `ctx / 2` to the chunk's last).
pub(super) async fn gyre_perplexity(
    addr: std::net::SocketAddr,
    tokens: &PplTokens,
    ctx_len: usize,
) -> anyhow::Result<f64> {
    let model = model_id(addr).await?;
    let first = ctx_len / 2;
    let (mut nll, mut count) = (0f64, 0usize);
    for c in 0..tokens.chunks {
        let mut chunk = tokens.ids[c * ctx_len..(c + 1) * ctx_len].to_vec();
        if let Some(bos) = tokens.bos {
            chunk[0] = bos;
        }
        let body = json!({
            "model": model,
            "prompt": chunk,
            "max_tokens": 1,
            "temperature": 0,
            "echo": true,
            "logprobs": 0,
        });
        let (status, reply) = crate::http::post_json(addr, "/v1/completions", &body).await?;
        anyhow::ensure!(
            status.is_success(),
            "perplexity chunk {c}: HTTP {status}: {}",
            String::from_utf8_lossy(&reply)
        );
        let reply: Value = serde_json::from_slice(&reply)?;
        let lps = reply
            .pointer("/choices/0/logprobs/token_logprobs")
            .and_then(Value::as_array)
            .context("no prompt log-probabilities in the reply")?;
        anyhow::ensure!(
            lps.len() >= ctx_len,
            "{} log-probabilities for a {ctx_len}-token chunk",
            lps.len()
        );
        for lp in &lps[first + 1..ctx_len] {
            nll -= lp
                .as_f64()
                .context("a prompt log-probability is not a number")?;
            count += 1;
        }
    }
    Ok((nll / count.max(1) as f64).exp())
}

/// The perplexity row: gyre's and llama.cpp's, target within 2%.
pub(super) fn ppl_row(spec: &PplSpec, chunks: usize, result: anyhow::Result<(f64, f64)>) -> Row {
    let name = spec
        .text
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let metric = format!(
        "  perplexity of {name} ({chunks} x {} tokens, second halves scored)",
        spec.ctx
    );
    match result {
        Ok((gyre, llama)) => {
            let ratio = gyre / llama;
            Row::new("L1", &metric)
                .gyre(format!("{gyre:.4}"))
                .reference(format!("{llama:.4} (llama.cpp)"))
                .compare(ratio, "within 2%", (ratio - 1.0).abs() <= 0.02)
        }
        Err(e) => {
            let e = format!("{e:#}");
            eprintln!("gyre-bench: L1: perplexity failed: {e}");
            Row::new("L1", &format!("{metric}: FAILED: {e:.160}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama-perplexity's final line and llama-tokenize's id list parse;
    /// output without them is an error.
    #[test]
    fn llama_tool_outputs_parse() {
        let out =
            "[1]33.0277,[2]33.9036,\n0.04.728.855 I Final estimate: PPL = 31.7582 +/- 4.13637\n";
        assert_eq!(parse_final_ppl(out).expect("ppl"), 31.7582);
        assert!(parse_final_ppl("[1]33.0,\n").is_err());
        assert_eq!(
            ids_in("load ...\n[19556, 905, 30]\n").expect("ids"),
            [19556, 905, 30]
        );
        assert!(ids_in("no ids here").is_err());
    }
}
