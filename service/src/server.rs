//! The gRPC server's routes: gyre.v1.Generation and gyre.v1.Embeddings
//! (behind the API-key check),
//! grpc.health.v1 (overall and per model), server reflection v1 and v1alpha
//! (gyre's and health's descriptors), and gRPC-Web through tonic-web. The
//! `gyre` binary serves them with the same connection handling as the HTTP
//! API (`gyre_shim::conn`), so this library does not depend on the shim.

use std::sync::Arc;

use gyre_api::v1::embeddings_server::EmbeddingsServer;
use gyre_api::v1::generation_server::GenerationServer;
use tokio::sync::watch;
use tonic::service::Routes;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Status};
use tower::Layer as _;

use crate::embeddings::EmbeddingRuntime;
use crate::embeddings_grpc::EmbeddingsService;
use crate::grpc::GenerationService;
use crate::runtime::ModelRuntime;

/// Checks `authorization: Bearer <key>` when a key is configured: the
/// scheme in any case, the key compared in constant time (the same check as
/// the HTTP API's, `gyre_api::auth`).
#[derive(Clone)]
pub struct ApiKeyCheck {
    expected: Option<Arc<str>>,
}

impl ApiKeyCheck {
    pub fn new(key: Option<String>) -> Self {
        Self {
            expected: key.map(Arc::from),
        }
    }
}

impl tonic::service::Interceptor for ApiKeyCheck {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        let Some(expected) = &self.expected else {
            return Ok(req);
        };
        match req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
        {
            Some(got) if gyre_api::auth::bearer_matches(got, expected) => Ok(req),
            Some(_) => Err(Status::unauthenticated("invalid API key")),
            None => Err(Status::unauthenticated(
                "missing API key: send metadata `authorization: Bearer <key>`",
            )),
        }
    }
}

/// Every gRPC route, as one HTTP service (HTTP/2, and HTTP/1 for gRPC-Web).
pub type GrpcService = tonic_web::GrpcWebService<Routes>;

/// The gRPC service over `models`, ready to serve. Once `draining` turns
/// true, health reports NOT_SERVING (overall, the service and each model)
/// and new generation requests get UNAVAILABLE while running ones finish.
pub async fn grpc_service(
    models: Vec<Arc<ModelRuntime>>,
    api_key: Option<String>,
    draining: watch::Receiver<bool>,
) -> anyhow::Result<GrpcService> {
    grpc_service_with(models, Vec::new(), api_key, draining).await
}

/// [`grpc_service`] with embedding models too: gyre.v1.Embeddings serves
/// them (behind the same key check), `ListModels` and per-model health list
/// them beside the generative ones.
pub async fn grpc_service_with(
    models: Vec<Arc<ModelRuntime>>,
    embedders: Vec<Arc<EmbeddingRuntime>>,
    api_key: Option<String>,
    draining: watch::Receiver<bool>,
) -> anyhow::Result<GrpcService> {
    let (health, health_svc) = tonic_health::server::health_reporter();
    health
        .set_serving::<GenerationServer<GenerationService>>()
        .await;
    health
        .set_serving::<EmbeddingsServer<EmbeddingsService>>()
        .await;
    let ids: Vec<String> = models
        .iter()
        .map(|m| m.id.clone())
        .chain(embedders.iter().map(|e| e.id.clone()))
        .collect();
    for id in &ids {
        health
            .set_service_status(id, tonic_health::ServingStatus::Serving)
            .await;
    }
    {
        let mut draining = draining.clone();
        tokio::spawn(async move {
            if draining.wait_for(|d| *d).await.is_err() {
                return;
            }
            health
                .set_not_serving::<GenerationServer<GenerationService>>()
                .await;
            health
                .set_not_serving::<EmbeddingsServer<EmbeddingsService>>()
                .await;
            health
                .set_service_status("", tonic_health::ServingStatus::NotServing)
                .await;
            for id in ids {
                health
                    .set_service_status(&id, tonic_health::ServingStatus::NotServing)
                    .await;
            }
        });
    }
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(gyre_api::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(gyre_api::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;
    let generative: Vec<String> = models.iter().map(|m| m.id.clone()).collect();
    let embeddings = InterceptedService::new(
        EmbeddingsServer::new(EmbeddingsService::new(
            embedders.clone(),
            generative,
            draining.clone(),
        )),
        ApiKeyCheck::new(api_key.clone()),
    );
    let generation = InterceptedService::new(
        GenerationServer::new(GenerationService::new(models, draining).with_embedders(embedders)),
        ApiKeyCheck::new(api_key),
    );
    let routes = Routes::new(health_svc)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(generation)
        .add_service(embeddings)
        .prepare();
    // HTTP/1 is accepted too, for gRPC-Web.
    Ok(tonic_web::GrpcWebLayer::new().layer(routes))
}
