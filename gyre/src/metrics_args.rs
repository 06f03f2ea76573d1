//! The metrics flags of `gyre serve` and `gyre grpc`, and installing the
//! process's Prometheus recorder with the engines' stats read at each scrape
//! (`gyre_shim::metrics`, `gyre_service::metrics`).

use std::sync::Arc;

use clap::Args;
use gyre_service::registry::Registry;
use gyre_shim::metrics::Metrics;

/// Prometheus metrics (`/metrics`).
#[derive(Args)]
pub struct MetricsArgs {
    /// Record no metrics: `/metrics` answers 404 and nothing is measured.
    #[arg(long, env = "GYRE_DISABLE_METRICS")]
    pub disable_metrics: bool,
    /// Also serve `/metrics` (only it, without an API key) on this address,
    /// e.g. for a scraper on an internal network.
    #[arg(long, env = "GYRE_METRICS_ADDR")]
    pub metrics_addr: Option<String>,
    /// Render the metrics whose meaning is vLLM's as `vllm:<name>` instead
    /// of `gyre:<name>`, for dashboards made for vLLM.
    #[arg(long, env = "GYRE_METRICS_VLLM_NAMES")]
    pub metrics_vllm_names: bool,
}

impl MetricsArgs {
    /// Installs the recorder unless metrics are off (before anything records).
    pub fn install(&self) -> anyhow::Result<Option<Metrics>> {
        if self.disable_metrics {
            if self.metrics_addr.is_some() {
                anyhow::bail!("--metrics-addr needs metrics: drop --disable-metrics");
            }
            return Ok(None);
        }
        let metrics = gyre_shim::metrics::install(self.metrics_vllm_names)?;
        gyre_service::metrics::describe();
        metrics.publish_descriptions();
        Ok(Some(metrics))
    }
}

/// Reads each model's engine stats into the gauges before every render.
pub fn collect_engines(metrics: &Metrics, registry: &Arc<Registry>) {
    let registry = registry.clone();
    metrics.add_collector(Arc::new(move || {
        gyre_service::metrics::publish_engine_stats(&registry);
    }));
}
