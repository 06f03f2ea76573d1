//! What the service records for Prometheus, through the `metrics` facade
//! (the binary installs the recorder; the shim renders it at `/metrics`).
//!
//! Per request (per choice, each being one engine sequence): when it ends,
//! its finish reason, generated tokens, end-to-end latency, and the queue,
//! prefill and decode times the engine measured (`gyre_engine::Timings`);
//! at its first token the time to it, and the prompt and cached tokens
//! (first choice only). Per token only the gap since the previous one goes
//! into a histogram handle the choice registered once (no allocation). The
//! engines' state (running, waiting, KV blocks, prefix-cache and preemption
//! totals) is read from their stats when scraped ([`publish_engine_stats`]).
//! Every metric carries the model's id as `model_name`.

use std::time::{Duration, Instant};

use gyre_engine::{Timings, Usage};
use metrics::{Histogram, counter, gauge, histogram};

use crate::registry::Registry;

/// The labels of a model's metrics.
fn labels(model: &str) -> [(&'static str, String); 1] {
    [("model_name", model.to_owned())]
}

/// Help texts of the service's metrics (shown once a metric has a value).
pub fn describe() {
    use metrics::{describe_counter as c, describe_gauge as g, describe_histogram as h};
    c!(
        "gyre:request_success_total",
        "Finished requests (choices) by model and finish reason (stop, length, tool_calls, abort)"
    );
    c!("gyre:prompt_tokens_total", "Prompt tokens prefilled");
    c!(
        "gyre:prompt_tokens_cached_total",
        "Prompt tokens taken from the prefix cache"
    );
    c!("gyre:generation_tokens_total", "Tokens generated");
    c!(
        "gyre:request_errors_total",
        "Requests the service refused or failed, by error code (the OpenAI `code`)"
    );
    h!(
        "gyre:e2e_request_latency_seconds",
        "From the service receiving a request to its last token"
    );
    h!(
        "gyre:time_to_first_token_seconds",
        "From the service receiving a request to its first token"
    );
    h!(
        "gyre:inter_token_latency_seconds",
        "Between consecutive tokens of a choice"
    );
    h!(
        "gyre:request_queue_time_seconds",
        "Engine: waiting for a running slot"
    );
    h!(
        "gyre:request_prefill_time_seconds",
        "Engine: first scheduled step to first token"
    );
    h!(
        "gyre:request_decode_time_seconds",
        "Engine: first token to last"
    );
    h!(
        "gyre:request_inference_time_seconds",
        "Engine: prefill plus decode"
    );
    g!("gyre:num_requests_running", "Sequences the engine runs");
    g!("gyre:num_requests_waiting", "Sequences waiting to start");
    g!(
        "gyre:kv_cache_usage_perc",
        "Fraction of KV blocks in use (1 = all)"
    );
    g!("gyre:kv_blocks_used", "KV blocks in use");
    g!("gyre:kv_blocks_total", "KV blocks of the pool");
    c!(
        "gyre:prefix_cache_queries_total",
        "Prompt tokens looked up in the prefix cache"
    );
    c!(
        "gyre:prefix_cache_hits_total",
        "Prompt tokens found in the prefix cache"
    );
    c!(
        "gyre:num_preemptions_total",
        "Sequences preempted to free KV blocks"
    );
}

/// Counts an error the service answered with, by its OpenAI `code` (the
/// ErrorInfo reason as the HTTP API names it).
pub(crate) fn error(reason: &str) {
    let code = match reason {
        "PROMPT_TOO_LONG" | "CONTEXT_LENGTH_EXCEEDED" => "context_length_exceeded".to_owned(),
        other => other.to_ascii_lowercase(),
    };
    counter!("gyre:request_errors_total", "code" => code).increment(1);
}

/// One choice's measurements, from its request's arrival to its end.
pub(crate) struct ChoiceMetrics {
    model: String,
    arrived: Instant,
    /// The first choice of a request counts its prompt.
    counts_prompt: bool,
    last_token: Option<Instant>,
    /// Registered at the first token; each later one records its gap.
    itl: Option<Histogram>,
    done: bool,
}

impl ChoiceMetrics {
    pub(crate) fn new(model: &str, arrived: Instant, counts_prompt: bool) -> Self {
        Self {
            model: model.to_owned(),
            arrived,
            counts_prompt,
            last_token: None,
            itl: None,
            done: false,
        }
    }

    /// The prompt is in the KV cache.
    pub(crate) fn prefilled(&self, prompt_tokens: u32, cached_tokens: u32) {
        if self.counts_prompt {
            let l = labels(&self.model);
            counter!("gyre:prompt_tokens_total", &l).increment(u64::from(prompt_tokens));
            counter!("gyre:prompt_tokens_cached_total", &l).increment(u64::from(cached_tokens));
        }
    }

    /// A token arrived from the engine.
    pub(crate) fn token(&mut self) {
        let now = Instant::now();
        match (self.last_token, &self.itl) {
            (Some(last), Some(itl)) => itl.record(now.saturating_duration_since(last)),
            _ => {
                let l = labels(&self.model);
                histogram!("gyre:time_to_first_token_seconds", &l)
                    .record(now.saturating_duration_since(self.arrived));
                self.itl = Some(histogram!("gyre:inter_token_latency_seconds", &l));
            }
        }
        self.last_token = Some(now);
    }

    /// The engine finished the sequence (`reason`: the API's finish reason).
    pub(crate) fn finished(&mut self, reason: &'static str, usage: Usage, t: Timings) {
        self.done = true;
        let l = labels(&self.model);
        let secs = |d: Duration| d.as_secs_f64();
        histogram!("gyre:e2e_request_latency_seconds", &l).record(secs(self.arrived.elapsed()));
        histogram!("gyre:request_queue_time_seconds", &l).record(secs(t.queued));
        histogram!("gyre:request_prefill_time_seconds", &l).record(secs(t.prefill));
        histogram!("gyre:request_decode_time_seconds", &l).record(secs(t.decode));
        histogram!("gyre:request_inference_time_seconds", &l).record(secs(t.prefill + t.decode));
        counter!("gyre:generation_tokens_total", &l).increment(u64::from(usage.completion_tokens));
        counter!("gyre:request_success_total", "model_name" => self.model.clone(), "finished_reason" => reason)
            .increment(1);
    }

    /// The choice ended otherwise: `generated` tokens, then `reason`
    /// (`stop` for a stop string the service matched, `abort` for a cancel,
    /// an expired deadline or a client gone; None for an error, which is
    /// counted by its code).
    pub(crate) fn ended(&mut self, reason: Option<&'static str>, generated: u32) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        let l = labels(&self.model);
        counter!("gyre:generation_tokens_total", &l).increment(u64::from(generated));
        if let Some(reason) = reason {
            if reason != "abort" {
                histogram!("gyre:e2e_request_latency_seconds", &l)
                    .record(self.arrived.elapsed().as_secs_f64());
            }
            counter!("gyre:request_success_total", "model_name" => self.model.clone(), "finished_reason" => reason)
                .increment(1);
        }
    }
}

/// Sets each generative model's engine figures from its stats (call it
/// when scraped).
pub fn publish_engine_stats(registry: &Registry) {
    for entry in registry.list() {
        let Ok(rt) = entry.generative_runtime() else {
            continue;
        };
        let s = rt.engine.stats();
        let l = labels(&rt.id);
        gauge!("gyre:num_requests_running", &l).set(f64::from(s.running));
        gauge!("gyre:num_requests_waiting", &l).set(f64::from(s.waiting));
        gauge!("gyre:kv_blocks_used", &l).set(f64::from(s.kv_blocks_used));
        gauge!("gyre:kv_blocks_total", &l).set(f64::from(s.kv_blocks_total));
        let usage = match s.kv_blocks_total {
            0 => 0.0,
            total => f64::from(s.kv_blocks_used) / f64::from(total),
        };
        gauge!("gyre:kv_cache_usage_perc", &l).set(usage);
        counter!("gyre:prefix_cache_queries_total", &l).absolute(s.prefix_query_tokens_total);
        counter!("gyre:prefix_cache_hits_total", &l).absolute(s.prefix_hit_tokens_total);
        counter!("gyre:num_preemptions_total", &l).absolute(s.preemptions_total);
    }
}
