//! The load generator: N concurrent streams (closed loop) or Poisson
//! arrivals (open loop) of fixed-length requests over gRPC or HTTP.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use gyre_api::v1::generation_client::GenerationClient;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tokio::task::JoinSet;
use tonic::transport::{Channel, Endpoint};

use crate::http::HttpTarget;
use crate::stats::Record;

/// A request's prompt.
#[derive(Debug, Clone)]
pub enum Prompt {
    Ids(Vec<u32>),
    Text(String),
}

/// One request: prompt, fixed output length (greedy, EOS ignored).
#[derive(Debug, Clone)]
pub struct RequestSpec {
    pub prompt: Prompt,
    /// Model id; empty for the server's default.
    pub model: String,
    pub max_tokens: u32,
    /// Drop the stream once this many output events arrived.
    pub cancel_after: Option<u32>,
    pub cache_salt: Option<String>,
    /// More fields of the HTTP request's JSON body (a server's own options,
    /// e.g. llama-server's `cache_prompt`); gRPC requests ignore them.
    pub extra_body: serde_json::Map<String, serde_json::Value>,
}

impl RequestSpec {
    pub fn new(prompt: Prompt, max_tokens: u32) -> Self {
        Self {
            prompt,
            model: String::new(),
            max_tokens,
            cancel_after: None,
            cache_salt: None,
            extra_body: serde_json::Map::new(),
        }
    }
}

/// Which API carries the requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Api {
    Grpc,
    Http,
}

/// When requests are sent.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Arrival {
    /// `streams` concurrent streams, each sending `per_stream` requests one
    /// after the other.
    Concurrent { streams: usize, per_stream: usize },
    /// Requests arriving as a Poisson process of `rate` per second: `requests`
    /// of them, or as many as arrive within `duration_s` when it is set.
    Poisson {
        rate: f64,
        requests: usize,
        duration_s: Option<f64>,
        seed: u64,
    },
}

/// Connections to the server under test.
#[derive(Clone)]
pub struct Clients {
    pub grpc_url: String,
    /// gRPC channels (HTTP/2 connections); requests go round-robin over them.
    pub grpc: Vec<GenerationClient<Channel>>,
    pub http: Option<HttpTarget>,
}

impl Clients {
    /// Opens `connections` gRPC channels to `grpc_url` (0: HTTP only).
    pub async fn connect(
        grpc_url: &str,
        connections: usize,
        http: Option<HttpTarget>,
    ) -> anyhow::Result<Self> {
        let mut grpc = Vec::new();
        for _ in 0..connections {
            let channel = Endpoint::from_shared(grpc_url.to_owned())?
                .tcp_nodelay(true)
                .connect()
                .await
                .with_context(|| format!("connecting to {grpc_url}"))?;
            grpc.push(GenerationClient::new(channel).max_decoding_message_size(64 << 20));
        }
        Ok(Self {
            grpc_url: grpc_url.to_owned(),
            grpc,
            http,
        })
    }

    /// Sends one request; `i` picks the gRPC channel.
    pub async fn send(&self, api: Api, i: usize, spec: &RequestSpec, t0: Instant) -> Record {
        match (api, &self.http) {
            (Api::Grpc, _) if self.grpc.is_empty() => {
                let mut record = Record::new(t0.elapsed());
                record.outcome = crate::stats::Outcome::Error("no gRPC connection".into());
                record
            }
            (Api::Grpc, _) => {
                let client = self.grpc[i % self.grpc.len()].clone();
                crate::grpc::generate(client, spec, t0).await
            }
            (Api::Http, Some(target)) => crate::http::generate(target, spec, t0).await,
            (Api::Http, None) => {
                let mut record = Record::new(t0.elapsed());
                record.outcome = crate::stats::Outcome::Error("no HTTP address".into());
                record
            }
        }
    }
}

/// Poisson arrival offsets: exponential gaps of mean 1/rate.
pub fn poisson_offsets(
    rate: f64,
    requests: usize,
    duration_s: Option<f64>,
    seed: u64,
) -> Vec<Duration> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut t = 0.0f64;
    let mut out = Vec::new();
    loop {
        let u: f64 = rng.random_range(f64::EPSILON..1.0);
        t += -u.ln() / rate.max(1e-9);
        match duration_s {
            Some(d) if t > d => break,
            None if out.len() >= requests => break,
            _ => out.push(Duration::from_secs_f64(t)),
        }
    }
    out
}

/// Runs the load: request `i` uses `specs[i % specs.len()]`. Records come
/// back in request order; `t0` is their time origin (pass the same instant
/// to runs that go on together).
pub async fn run(
    clients: &Clients,
    api: Api,
    arrival: &Arrival,
    specs: &[RequestSpec],
    t0: Instant,
) -> Vec<Record> {
    let mut tasks = JoinSet::new();
    match *arrival {
        Arrival::Concurrent {
            streams,
            per_stream,
        } => {
            for s in 0..streams {
                let (clients, specs) = (clients.clone(), specs.to_vec());
                tasks.spawn(async move {
                    let mut out = Vec::new();
                    for k in 0..per_stream.max(1) {
                        let i = s + k * streams;
                        let spec = &specs[i % specs.len()];
                        out.push((i, clients.send(api, i, spec, t0).await));
                    }
                    out
                });
            }
        }
        Arrival::Poisson {
            rate,
            requests,
            duration_s,
            seed,
        } => {
            for (i, at) in poisson_offsets(rate, requests, duration_s, seed)
                .into_iter()
                .enumerate()
            {
                let (clients, spec) = (clients.clone(), specs[i % specs.len()].clone());
                tasks.spawn(async move {
                    tokio::time::sleep_until((t0 + at).into()).await;
                    vec![(i, clients.send(api, i, &spec, t0).await)]
                });
            }
        }
    }
    let mut records = Vec::new();
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok(out) => records.extend(out),
            Err(e) => {
                let mut record = Record::new(t0.elapsed());
                record.outcome = crate::stats::Outcome::Error(format!("task: {e}"));
                records.push((usize::MAX, record));
            }
        }
    }
    records.sort_by_key(|(i, _)| *i);
    records.into_iter().map(|(_, r)| r).collect()
}

/// `n` prompts of `len` random token ids in `ids` (seeded), each distinct.
pub fn random_prompts(n: usize, len: usize, ids: std::ops::Range<u32>, seed: u64) -> Vec<Vec<u32>> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| (0..len).map(|_| rng.random_range(ids.clone())).collect())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poisson_arrivals_have_the_asked_rate() {
        let at = poisson_offsets(50.0, 5000, None, 7);
        assert_eq!(at.len(), 5000);
        assert!(at.windows(2).all(|w| w[0] <= w[1]));
        let rate = 5000.0 / at[4999].as_secs_f64();
        assert!((rate - 50.0).abs() < 3.0, "{rate}");
        let within = poisson_offsets(50.0, 0, Some(2.0), 7);
        assert!(within.iter().all(|t| t.as_secs_f64() <= 2.0));
        assert!((60..=140).contains(&within.len()), "{}", within.len());
    }
}
