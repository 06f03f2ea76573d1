//! S3: time to first token of a request whose long prefix is in the prefix
//! cache vs one whose prefix is not.
//!
//! For each API (gRPC, then HTTP) and repetition, two fresh random prefixes
//! A and B (`s3_prefix` tokens) and two suffixes are drawn. A + s1 runs
//! first and warms the cache; then A + s2 (cached) and B + s2 (uncached) run
//! one at a time, in alternating order, on the shared (unsalted) cache. The
//! ratio is median cached TTFT / median uncached TTFT; `cached_tokens` from
//! the final usage of the cached requests is reported beside it.
//! transformers' TTFT on a prompt of the same length is shown for context.

use serde_json::{Value, json};

use super::throughput::reference_ttft;
use super::{Ctx, Outcome, median};
use crate::load::Api;
use crate::report::Row;
use crate::stats::{Record, ms};

pub async fn s3(ctx: &Ctx) -> Outcome {
    let sz = &ctx.sizes;
    ctx.warm_up(31).await;
    let prompt_tokens = sz.s3_prefix + sz.s3_suffix;
    let mut rows = Vec::new();
    let mut details = serde_json::Map::new();
    let mut uncached_grpc = f64::NAN;
    let mut long_prompt = Vec::new();
    for (api, salt) in [(Api::Grpc, 32), (Api::Http, 132)] {
        let m = measure(ctx, api, salt, &mut long_prompt).await?;
        let name = format!("{api:?}").to_lowercase();
        if api == Api::Grpc {
            uncached_grpc = m.miss;
        }
        rows.push(
            Row::new(
                "S3",
                &format!("TTFT, {}-token prefix cached vs not ({name})", sz.s3_prefix),
            )
            .gyre(format!("{:.1} ms", m.hit))
            .reference(format!("{:.1} ms uncached", m.miss))
            .compare(m.hit / m.miss, "<= 0.2", m.hit / m.miss <= 0.2),
        );
        rows.push(
            Row::new("S3", &format!("  cached_tokens reported ({name}, median)")).gyre(format!(
                "{} of {prompt_tokens}",
                median(
                    &m.cached_tokens
                        .iter()
                        .map(|&c| f64::from(c))
                        .collect::<Vec<_>>()
                )
            )),
        );
        details.insert(name, m.details);
    }
    let hf = reference_ttft(ctx, std::slice::from_ref(&long_prompt)).await?;
    if let Some(hf) = &hf {
        rows.push(
            Row::new(
                "S3",
                &format!("uncached TTFT vs transformers ({prompt_tokens} tokens)"),
            )
            .gyre(format!("{uncached_grpc:.1} ms"))
            .reference(format!("{:.1} ms", hf.seconds * 1e3))
            .value(uncached_grpc / (hf.seconds * 1e3)),
        );
    }
    details.insert("prefix_tokens".into(), json!(sz.s3_prefix));
    details.insert("suffix_tokens".into(), json!(sz.s3_suffix));
    details.insert("output_tokens".into(), json!(sz.s3_output));
    details.insert("hf_ttft".into(), json!(hf));
    Ok((rows, Value::Object(details)))
}

struct Measured {
    hit: f64,
    miss: f64,
    cached_tokens: Vec<u32>,
    details: Value,
}

async fn measure(ctx: &Ctx, api: Api, salt: u64, last: &mut Vec<u32>) -> anyhow::Result<Measured> {
    let sz = &ctx.sizes;
    let (mut cached, mut uncached, mut warm) = (Vec::new(), Vec::new(), Vec::new());
    for rep in 0..sz.s3_repeats.max(1) {
        let salt = salt + 10 * rep as u64;
        let prefixes = ctx.prompts(2, sz.s3_prefix, salt);
        let suffixes = ctx.prompts(2, sz.s3_suffix, salt + 1);
        let join = |p: &Vec<u32>, s: &Vec<u32>| [p.as_slice(), s.as_slice()].concat();
        let hit_prompt = join(&prefixes[0], &suffixes[1]);
        let miss_prompt = join(&prefixes[1], &suffixes[1]);
        warm.push(one(ctx, api, &join(&prefixes[0], &suffixes[0])).await?);
        if rep % 2 == 0 {
            cached.push(one(ctx, api, &hit_prompt).await?);
            uncached.push(one(ctx, api, &miss_prompt).await?);
        } else {
            uncached.push(one(ctx, api, &miss_prompt).await?);
            cached.push(one(ctx, api, &hit_prompt).await?);
        }
        *last = hit_prompt;
    }
    let ttfts =
        |rs: &[Record]| -> Vec<f64> { rs.iter().filter_map(Record::ttft).map(ms).collect() };
    let (hit, miss) = (median(&ttfts(&cached)), median(&ttfts(&uncached)));
    let cached_tokens: Vec<u32> = cached.iter().map(|r| r.cached_tokens).collect();
    let details = json!({
        "ttft_cached_ms": ttfts(&cached),
        "ttft_uncached_ms": ttfts(&uncached),
        "ttft_warmup_ms": ttfts(&warm),
        "ttft_cached_ms_median": hit,
        "ttft_uncached_ms_median": miss,
        "ratio": hit / miss,
        "cached_tokens": cached_tokens,
        "uncached_cached_tokens": uncached.iter().map(|r| r.cached_tokens).collect::<Vec<_>>(),
        "prompt_tokens_reported": cached.iter().map(|r| r.prompt_tokens).collect::<Vec<_>>(),
    });
    Ok(Measured {
        hit,
        miss,
        cached_tokens,
        details,
    })
}

/// One request, alone; fails on an error.
async fn one(ctx: &Ctx, api: Api, prompt: &[u32]) -> anyhow::Result<Record> {
    let specs = ctx.specs(&[prompt.to_vec()], ctx.sizes.s3_output);
    let record = ctx.load(api, 1, 1, &specs).await.remove(0);
    if let crate::stats::Outcome::Error(e) = &record.outcome {
        anyhow::bail!("request failed: {e}");
    }
    Ok(record)
}
