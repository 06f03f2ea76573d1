//! An OTLP trace receiver in the bench's own process, for O1's "on" server
//! to export its spans to (`--otlp-endpoint`): a tonic server of
//! OpenTelemetry's `TraceService` (the generated server of
//! `opentelemetry-proto`) on a free loopback port that only counts what it
//! receives, so the report can show that tracing really exported spans.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context as _;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;

/// What the receiver has counted so far.
#[derive(Debug, Default)]
pub struct Counts {
    spans: AtomicU64,
    exports: AtomicU64,
}

impl Counts {
    /// Spans received.
    pub fn spans(&self) -> u64 {
        self.spans.load(Ordering::Relaxed)
    }

    /// Export calls received (the exporter's batches).
    pub fn exports(&self) -> u64 {
        self.exports.load(Ordering::Relaxed)
    }

    /// Counts one export request's spans.
    fn add(&self, request: &ExportTraceServiceRequest) {
        let spans: usize = request
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .map(|s| s.spans.len())
            .sum();
        self.spans.fetch_add(spans as u64, Ordering::Relaxed);
        self.exports.fetch_add(1, Ordering::Relaxed);
    }
}

struct Counter(Arc<Counts>);

#[tonic::async_trait]
impl TraceService for Counter {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.0.add(request.get_ref());
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// A running receiver; stops when dropped.
pub struct Receiver {
    pub addr: SocketAddr,
    pub counts: Arc<Counts>,
    task: tokio::task::JoinHandle<()>,
}

impl Receiver {
    /// Listens on a free loopback port.
    pub async fn start() -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the OTLP receiver")?;
        let addr = listener.local_addr()?;
        let counts = Arc::new(Counts::default());
        let service = TraceServiceServer::new(Counter(counts.clone()));
        let task = tokio::spawn(async move {
            let served = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(TcpListenerStream::new(listener))
                .await;
            if let Err(e) = served {
                eprintln!("gyre-bench: the OTLP receiver stopped: {e}");
            }
        });
        Ok(Self { addr, counts, task })
    }

    /// The endpoint to give `--otlp-endpoint`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};

    fn spans(n: usize) -> ScopeSpans {
        ScopeSpans {
            spans: vec![Span::default(); n],
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn counts_the_spans_of_each_export() -> anyhow::Result<()> {
        let receiver = Receiver::start().await?;
        let mut client = TraceServiceClient::connect(receiver.endpoint()).await?;
        let request = ExportTraceServiceRequest {
            resource_spans: vec![
                ResourceSpans {
                    scope_spans: vec![spans(2), spans(3)],
                    ..Default::default()
                },
                ResourceSpans {
                    scope_spans: vec![spans(1)],
                    ..Default::default()
                },
            ],
        };
        client.export(request.clone()).await?;
        client.export(request).await?;
        assert_eq!(receiver.counts.spans(), 12);
        assert_eq!(receiver.counts.exports(), 2);
        Ok(())
    }
}
