//! The deep health check (`--deep-health-interval-secs`, off by default).
//!
//! At every interval each generative model gets a probe through its engine:
//! a one-token prompt generating two tokens (one prefill step, one decode
//! step). A probe that fails, or gives no answer within the timeout
//! (`--deep-health-timeout-secs`), reports the model NOT_SERVING in
//! grpc.health.v1 under each of its names; when every model's probe fails
//! the overall status ("") is NOT_SERVING too (HTTP `/health` answers 503).
//! The next probe that succeeds reports the model, and the server, SERVING
//! again.
//!
//! A probe queues like any request, as a tenant of its own
//! ([`PROBE_TENANT`]), so fair queuing admits it at the engine's next free
//! running slot whatever other tenants have waiting: it stalls only when no
//! running request finishes within the timeout (or the engine itself
//! stalls). A probe refused because the queue is full counts as neither
//! success nor failure: the model is busy, not broken. Once the server
//! drains for shutdown the check stops, leaving the drain's NOT_SERVING.

use std::sync::Arc;
use std::time::Duration;

use gyre_engine::{Engine, EngineError, Event, GenerateRequest};
use tokio::sync::watch;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::registry::{Entry, Registry};

/// The tenant the probes run as.
pub const PROBE_TENANT: &str = "gyre:deep-health";

/// Settings of the deep health check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeepHealth {
    /// Time between probes (at least 1 ms).
    pub interval: Duration,
    /// How long a probe may take before it counts as failed.
    pub timeout: Duration,
}

/// What a probe found.
#[derive(Debug, PartialEq, Eq)]
enum Probe {
    Passed,
    /// The queue was full: no verdict.
    Busy,
    Failed(String),
}

/// Runs the check until the server drains.
pub(crate) fn spawn(
    registry: Arc<Registry>,
    health: HealthReporter,
    cfg: DeepHealth,
    draining: watch::Receiver<bool>,
) {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(cfg.interval.max(Duration::from_millis(1)));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut overall_down = false;
        loop {
            ticker.tick().await;
            if *draining.borrow() {
                return;
            }
            let models: Vec<(Arc<Entry>, Engine)> = registry
                .list()
                .into_iter()
                .filter_map(|e| {
                    let engine = e.generative_runtime().ok()?.engine.clone();
                    Some((e, engine))
                })
                .collect();
            let probes = models.iter().map(|(_, engine)| probe(engine, cfg.timeout));
            let results = futures::future::join_all(probes).await;
            if *draining.borrow() {
                return;
            }
            let mut all_failed = !models.is_empty();
            for ((entry, _), result) in models.iter().zip(results) {
                let status = match result {
                    Probe::Passed => ServingStatus::Serving,
                    Probe::Busy => {
                        all_failed = false;
                        continue;
                    }
                    Probe::Failed(why) => {
                        tracing::warn!(model = %entry.card.id, reason = %why, "deep health probe failed");
                        ServingStatus::NotServing
                    }
                };
                if status == ServingStatus::Serving {
                    all_failed = false;
                }
                // A model unloaded meanwhile keeps no status.
                if registry.list().iter().any(|e| Arc::ptr_eq(e, entry)) {
                    for name in entry.names() {
                        health.set_service_status(name, status).await;
                    }
                }
            }
            if all_failed != overall_down {
                overall_down = all_failed;
                let status = if all_failed {
                    tracing::warn!("deep health: every model failed its probe");
                    ServingStatus::NotServing
                } else {
                    ServingStatus::Serving
                };
                health.set_service_status("", status).await;
            }
        }
    });
}

/// One probe of `engine`: a one-token prompt, two tokens generated.
async fn probe(engine: &Engine, timeout: Duration) -> Probe {
    let info = engine.info();
    let token = info
        .bos_token_id
        .unwrap_or(0)
        .min(info.vocab_size.saturating_sub(1));
    let req = GenerateRequest {
        ignore_eos: true,
        tenant: Arc::from(PROBE_TENANT),
        ..GenerateRequest::new(vec![token], 2)
    };
    let mut events = match engine.submit(req) {
        Ok(rx) => rx,
        Err(EngineError::QueueFull) => return Probe::Busy,
        Err(e) => return Probe::Failed(e.to_string()),
    };
    let run = async {
        while let Some(ev) = events.recv().await {
            match ev {
                Event::Finished { .. } => return Ok(()),
                Event::Failed(e) => return Err(e.to_string()),
                _ => {}
            }
        }
        Err("the engine stopped".to_string())
    };
    match tokio::time::timeout(timeout, run).await {
        Ok(Ok(())) => Probe::Passed,
        Ok(Err(why)) => Probe::Failed(why),
        Err(_) => Probe::Failed(format!("no answer within {timeout:?}")),
    }
}
