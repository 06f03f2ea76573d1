//! OpenTelemetry traces, shared by `gyre` and `gyre-shim`: [`init`] installs
//! an OTLP (gRPC) exporter behind a batching tracer provider as the
//! process's global provider, for service name `gyre`. Without an endpoint
//! nothing is installed and [`enabled`] stays false, so the code that makes
//! spans (the shim's [`crate::observe`], the service's `observe`) skips all
//! of its work: tracing off costs one relaxed atomic load per request.
//!
//! W3C trace context (`traceparent`, `tracestate`) is read and written with
//! the SDK's `TraceContextPropagator` through [`extract`] and [`inject`].

use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context as _;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator as _};
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;

/// The `service.name` of every span.
pub const SERVICE_NAME: &str = "gyre";

/// The tracer's instrumentation scope.
pub const TRACER: &str = "gyre";

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Whether spans are exported (an OTLP endpoint was configured).
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// The installed exporter: flushes the spans still batched when
/// [`Telemetry::shutdown`] is called.
pub struct Telemetry {
    provider: SdkTracerProvider,
}

impl Telemetry {
    /// Exports what is still batched and stops the exporter (blocks: call
    /// it from `spawn_blocking` in async code).
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(error = %e, "could not flush the last spans");
        }
    }
}

/// Installs the OTLP exporter when `endpoint` (`--otlp-endpoint`, which
/// also reads `OTEL_EXPORTER_OTLP_ENDPOINT`) is set and not empty; `None`:
/// tracing stays off. Call inside the Tokio runtime (the exporter's channel
/// runs there).
pub fn init(endpoint: Option<&str>) -> anyhow::Result<Option<Telemetry>> {
    let Some(endpoint) = endpoint.map(str::trim).filter(|e| !e.is_empty()) else {
        return Ok(None);
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()
        .with_context(|| format!("--otlp-endpoint {endpoint:?}"))?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(SERVICE_NAME)
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build();
    opentelemetry::global::set_tracer_provider(provider.clone());
    ENABLED.store(true, Ordering::Relaxed);
    tracing::info!(endpoint, "exporting traces over OTLP");
    Ok(Some(Telemetry { provider }))
}

/// The parent context a caller sent in W3C `traceparent`/`tracestate`
/// (an empty context when absent or malformed).
pub fn extract(carrier: &dyn Extractor) -> opentelemetry::Context {
    TraceContextPropagator::new().extract(carrier)
}

/// Writes `cx`'s span as W3C `traceparent` (and `tracestate`) into `carrier`.
pub fn inject(cx: &opentelemetry::Context, carrier: &mut dyn Injector) {
    TraceContextPropagator::new().inject_context(cx, carrier);
}

/// Reads trace headers from an HTTP header map (also a tonic
/// `MetadataMap`'s headers).
pub struct HeaderCarrier<'a>(pub &'a http::HeaderMap);

impl Extractor for HeaderCarrier<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

/// Writes trace headers into an HTTP header map.
pub struct HeaderWriter<'a>(pub &'a mut http::HeaderMap);

impl Injector for HeaderWriter<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::try_from(key),
            http::HeaderValue::try_from(value),
        ) {
            self.0.insert(name, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::TraceContextExt as _;

    #[test]
    fn traceparent_round_trips() {
        let mut headers = http::HeaderMap::new();
        headers.insert(
            "traceparent",
            http::HeaderValue::from_static(
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            ),
        );
        let cx = extract(&HeaderCarrier(&headers));
        let sc = cx.span().span_context().clone();
        assert!(sc.is_remote());
        assert_eq!(
            sc.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(sc.span_id().to_string(), "00f067aa0ba902b7");
        let mut out = http::HeaderMap::new();
        inject(&cx, &mut HeaderWriter(&mut out));
        assert_eq!(out.get("traceparent"), headers.get("traceparent"));
    }

    #[test]
    fn a_malformed_traceparent_gives_no_parent() {
        let mut headers = http::HeaderMap::new();
        headers.insert("traceparent", http::HeaderValue::from_static("00-zz-yy-01"));
        let cx = extract(&HeaderCarrier(&headers));
        assert!(!cx.span().span_context().is_valid());
    }

    #[test]
    fn no_endpoint_leaves_tracing_off() -> anyhow::Result<()> {
        assert!(init(None)?.is_none());
        assert!(init(Some("  "))?.is_none());
        assert!(!enabled());
        Ok(())
    }
}
