//! S4: what the OpenAI HTTP shim adds on top of gRPC under the same load.
//!
//! Separate runs: `s4_rounds` rounds of `s4_streams` concurrent streams over
//! gRPC, then the same over HTTP (fresh prompts of the same length each run,
//! so no run profits from another's cached prefix). Added latency per
//! streamed token = mean TPOT(HTTP) - mean TPOT(gRPC) (TPOT: a request's
//! (last - first event) / (tokens - 1), which stays right when HTTP merges
//! tokens into one chunk), with its standard error; TTFT delta likewise.
//!
//! Mixed run: half the streams over gRPC, half over HTTP, at the same time.
//! Every engine step then emits a token to all of them together, so the gap
//! between an HTTP chunk and the nearest gRPC token arrival is the shim's
//! delivery lag for that token, free of run-to-run noise in step times.

use std::time::{Duration, Instant};

use serde_json::json;

use super::{Ctx, Outcome, median};
use crate::load::{self, Api, Arrival};
use crate::report::Row;
use crate::stats::{Dist, Record, Summary, ms};

pub async fn s4(ctx: &Ctx) -> Outcome {
    let sz = &ctx.sizes;
    let streams = sz.s4_streams.max(2);
    ctx.warm_up(41).await;
    let (mut grpc, mut http) = (Vec::new(), Vec::new());
    for round in 0..sz.s4_rounds.max(1) {
        for (api, out) in [(Api::Grpc, &mut grpc), (Api::Http, &mut http)] {
            let salt = 42 + 10 * round as u64 + u64::from(api == Api::Http);
            let specs = ctx.specs(&ctx.prompts(streams, sz.prompt_len, salt), sz.s4_output);
            out.extend(ctx.load(api, streams, 1, &specs).await);
        }
    }
    let (g, h) = (Summary::of(&grpc), Summary::of(&http));
    anyhow::ensure!(
        g.errors + h.errors == 0,
        "requests failed: {:?} {:?}",
        g.error_samples,
        h.error_samples
    );
    let tpots =
        |rs: &[Record]| -> Vec<f64> { rs.iter().filter_map(Record::tpot).map(ms).collect() };
    let ttfts =
        |rs: &[Record]| -> Vec<f64> { rs.iter().filter_map(Record::ttft).map(ms).collect() };
    let (tg, th) = (tpots(&grpc), tpots(&http));
    let itl_delta_us = (h.tpot_ms.mean - g.tpot_ms.mean) * 1e3;
    let itl_sem_us = (Dist::sem(&tg).powi(2) + Dist::sem(&th).powi(2)).sqrt() * 1e3;
    let ttft_delta_us = (h.ttft_ms.mean - g.ttft_ms.mean) * 1e3;
    let ttft_sem_us =
        (Dist::sem(&ttfts(&grpc)).powi(2) + Dist::sem(&ttfts(&http)).powi(2)).sqrt() * 1e3;

    let (lag, mixed) = mixed_run(ctx, streams).await?;
    let rows = vec![
        Row::new(
            "S4",
            &format!("added ITL, HTTP vs gRPC ({streams} streams), µs"),
        )
        .gyre(format!("HTTP {:.3} ms/token", h.tpot_ms.mean))
        .reference(format!("gRPC {:.3} ms/token", g.tpot_ms.mean))
        .at_most(itl_delta_us, itl_sem_us, 50.0, "<= 50 µs"),
        Row::new("S4", "  ± standard error of that delta, µs").value(itl_sem_us),
        Row::new("S4", "added TTFT, HTTP vs gRPC (mean), µs")
            .gyre(format!("HTTP {:.2} ms", h.ttft_ms.mean))
            .reference(format!("gRPC {:.2} ms", g.ttft_ms.mean))
            .value(ttft_delta_us),
        Row::new("S4", "  ± standard error of that delta, µs").value(ttft_sem_us),
        Row::new("S4", "per-token delivery lag, mixed load (p50), µs")
            .gyre(format!("mean {:.0} µs, p99 {:.0} µs", lag.mean, lag.p99))
            .reference("gRPC arrival of the same step")
            .compare(lag.p50, "<= 50 µs", lag.p50 <= 50.0),
    ];
    let details = json!({
        "streams": streams,
        "prompt_tokens": sz.prompt_len,
        "output_tokens": sz.s4_output,
        "rounds": sz.s4_rounds,
        "grpc": g,
        "http": h,
        "itl_delta_us": itl_delta_us,
        "itl_delta_sem_us": itl_sem_us,
        "ttft_delta_us": ttft_delta_us,
        "ttft_delta_sem_us": ttft_sem_us,
        "ttft_p50_delta_us": (h.ttft_ms.p50 - g.ttft_ms.p50) * 1e3,
        "itl_p50_delta_us": (h.itl_ms.p50 - g.itl_ms.p50) * 1e3,
        "mixed": mixed,
        "delivery_lag_us": lag,
    });
    Ok((rows, details))
}

/// Half gRPC, half HTTP streams at once; the lag of each HTTP chunk after
/// its first behind the nearest gRPC token arrival, in µs.
async fn mixed_run(ctx: &Ctx, streams: usize) -> anyhow::Result<(Dist, serde_json::Value)> {
    let sz = &ctx.sizes;
    let half = streams / 2;
    let arrival = Arrival::Concurrent {
        streams: half,
        per_stream: 1,
    };
    let grpc_specs = ctx.specs(&ctx.prompts(half, sz.prompt_len, 48), sz.s4_output);
    let http_specs = ctx.specs(&ctx.prompts(half, sz.prompt_len, 49), sz.s4_output);
    let t0 = Instant::now();
    let (grpc, http) = tokio::join!(
        load::run(&ctx.clients, Api::Grpc, &arrival, &grpc_specs, t0),
        load::run(&ctx.clients, Api::Http, &arrival, &http_specs, t0),
    );
    let (g, h) = (Summary::of(&grpc), Summary::of(&http));
    anyhow::ensure!(
        g.errors + h.errors == 0,
        "mixed run failed: {:?} {:?}",
        g.error_samples,
        h.error_samples
    );
    let lags = delivery_lags(&grpc, &http);
    let dist = Dist::of(lags.iter().map(|d| d * 1e6).collect());
    let details = json!({
        "grpc": g,
        "http": h,
        "lag_samples": dist.n,
        "lag_median_us": median(&lags.iter().map(|d| d * 1e6).collect::<Vec<_>>()),
    });
    Ok((dist, details))
}

/// For each HTTP event but each request's first, its arrival minus the
/// nearest gRPC event arrival (seconds, signed).
pub fn delivery_lags(grpc: &[Record], http: &[Record]) -> Vec<f64> {
    let absolute = |r: &Record, skip: usize| -> Vec<Duration> {
        r.events
            .iter()
            .skip(skip)
            .map(|e| r.sent_at + e.0)
            .collect()
    };
    let mut reference: Vec<Duration> = grpc.iter().flat_map(|r| absolute(r, 1)).collect();
    reference.sort();
    if reference.is_empty() {
        return Vec::new();
    }
    http.iter()
        .flat_map(|r| absolute(r, 1))
        .map(|t| {
            let i = reference.partition_point(|&x| x <= t);
            let before = i.checked_sub(1).map(|j| reference[j]);
            let after = reference.get(i).copied();
            let nearest = match (before, after) {
                (Some(b), Some(a)) if a - t < t - b => a,
                (Some(b), _) => b,
                (None, Some(a)) => a,
                (None, None) => t,
            };
            t.as_secs_f64() - nearest.as_secs_f64()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lags_are_measured_against_the_nearest_grpc_arrival() {
        let at = Duration::from_millis;
        let record = |sent: u64, events: &[u64]| {
            let mut r = Record::new(at(sent));
            r.events = events.iter().map(|&e| (at(e), 1)).collect();
            r
        };
        // gRPC tokens at 100, 110, 120 ms; HTTP ones 1 ms later (the first skipped).
        let grpc = [record(0, &[100, 110, 120])];
        let http = [record(5, &[96, 106, 116])];
        let lags = delivery_lags(&grpc, &http);
        assert_eq!(lags.len(), 2);
        assert!(lags.iter().all(|l| (l - 0.001).abs() < 1e-9), "{lags:?}");
        // An HTTP token ahead of the gRPC one gives a negative lag.
        let early = [record(0, &[0, 109])];
        assert!((delivery_lags(&grpc, &early)[0] + 0.001).abs() < 1e-9);
    }
}
