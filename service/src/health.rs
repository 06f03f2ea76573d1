//! `grpc.health.v1.Health` as the health-checking protocol describes it.
//! `Check` is tonic-health's: a service the server does not know is
//! NOT_FOUND. Its `Watch`, though, refuses a service it does not know with
//! NOT_FOUND and ends the stream when a status is cleared (a model the
//! admin service unloaded), where the protocol wants SERVICE_UNKNOWN sent
//! and the call kept open, so that a client-side health checker keeps
//! watching a backend whose model comes and goes. [`SpecHealth`] wraps
//! tonic-health's service and does that: while the service is unknown it
//! sends SERVICE_UNKNOWN once and looks again every [`RECHECK`]; once known
//! it forwards tonic-health's updates (each status once, as they change).

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use tonic_health::server::{HealthReporter, HealthService};

/// How often a watch of an unknown service looks whether it is known now.
pub const RECHECK: Duration = Duration::from_millis(500);

/// The Health service over `reporter`'s statuses.
pub fn server(reporter: &HealthReporter) -> HealthServer<SpecHealth> {
    HealthServer::new(SpecHealth {
        inner: Arc::new(HealthService::from_health_reporter(reporter.clone())),
    })
}

/// tonic-health's service with the protocol's `Watch` (see the module).
pub struct SpecHealth {
    inner: Arc<HealthService>,
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Health for SpecHealth {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        self.inner.check(request).await
    }

    type WatchStream = WatchStream;

    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let service = request.into_inner().service;
        let inner = self.inner.clone();
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            let mut last: Option<i32> = None;
            // Sends `status` unless it was the last one sent; false once
            // the client has gone.
            async fn send(
                tx: &mpsc::Sender<Result<HealthCheckResponse, Status>>,
                last: &mut Option<i32>,
                status: i32,
            ) -> bool {
                if *last == Some(status) {
                    return true;
                }
                *last = Some(status);
                tx.send(Ok(HealthCheckResponse { status })).await.is_ok()
            }
            loop {
                let ask = Request::new(HealthCheckRequest {
                    service: service.clone(),
                });
                if let Ok(known) = inner.watch(ask).await {
                    let mut updates = Box::pin(known.into_inner());
                    while let Some(Ok(update)) = updates.next().await {
                        if !send(&tx, &mut last, update.status).await {
                            return;
                        }
                    }
                }
                // Not registered, or no longer: unknown until it is again.
                if !send(&tx, &mut last, ServingStatus::ServiceUnknown as i32).await {
                    return;
                }
                tokio::select! {
                    () = tx.closed() => return,
                    () = tokio::time::sleep(RECHECK) => {}
                }
            }
        });
        let stream: WatchStream = Box::pin(ReceiverStream::new(rx));
        Ok(Response::new(stream))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watch_of(reporter: &HealthReporter, service: &str) -> impl Future<Output = WatchStream> {
        let health = SpecHealth {
            inner: Arc::new(HealthService::from_health_reporter(reporter.clone())),
        };
        let service = service.to_string();
        async move {
            health
                .watch(Request::new(HealthCheckRequest { service }))
                .await
                .expect("a watch is never refused")
                .into_inner()
        }
    }

    async fn next(stream: &mut WatchStream) -> i32 {
        tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("an update within 10 s")
            .expect("the stream stays open")
            .expect("no error")
            .status
    }

    /// An unknown service is SERVICE_UNKNOWN on a call that stays open; it
    /// is followed once it is registered, and is unknown again once its
    /// status is cleared (a model unloaded), the call still open.
    #[tokio::test]
    async fn watch_follows_a_service_that_comes_and_goes() {
        let mut reporter = HealthReporter::new();
        let mut w = watch_of(&reporter, "gyre.model.m").await;
        assert_eq!(next(&mut w).await, ServingStatus::ServiceUnknown as i32);
        reporter
            .set_service_status("gyre.model.m", tonic_health::ServingStatus::Serving)
            .await;
        assert_eq!(next(&mut w).await, ServingStatus::Serving as i32);
        reporter
            .set_service_status("gyre.model.m", tonic_health::ServingStatus::NotServing)
            .await;
        assert_eq!(next(&mut w).await, ServingStatus::NotServing as i32);
        reporter.clear_service_status("gyre.model.m").await;
        assert_eq!(next(&mut w).await, ServingStatus::ServiceUnknown as i32);
        reporter
            .set_service_status("gyre.model.m", tonic_health::ServingStatus::Serving)
            .await;
        assert_eq!(next(&mut w).await, ServingStatus::Serving as i32);
    }

    /// A known service's watch starts with its status; Check is
    /// tonic-health's (an unknown service is NOT_FOUND).
    #[tokio::test]
    async fn known_services_and_check() {
        let reporter = HealthReporter::new();
        let mut w = watch_of(&reporter, "").await;
        assert_eq!(next(&mut w).await, ServingStatus::Serving as i32);
        let health = SpecHealth {
            inner: Arc::new(HealthService::from_health_reporter(reporter.clone())),
        };
        let err = health
            .check(Request::new(HealthCheckRequest {
                service: "nope".into(),
            }))
            .await
            .expect_err("unknown");
        assert_eq!(err.code(), tonic::Code::NotFound);
    }
}
