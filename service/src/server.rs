//! The gRPC server's routes: gyre.v1.Generation, gyre.v1.Responses and
//! gyre.v1.Embeddings (behind the API-key check), gyre.v1.Admin (behind
//! the admin key), grpc.health.v1 (overall and per model name and alias,
//! following the registry), server reflection v1 and v1alpha
//! (gyre's and health's descriptors), and gRPC-Web through tonic-web. The
//! `gyre` binary serves them with the same connection handling as the HTTP
//! API (`gyre_shim::conn`), so this library does not depend on the shim.

use std::sync::Arc;

use gyre_api::v1::admin_server::AdminServer;
use gyre_api::v1::embeddings_server::EmbeddingsServer;
use gyre_api::v1::generation_server::GenerationServer;
use gyre_api::v1::responses_server::ResponsesServer;
use tokio::sync::watch;
use tonic::service::Routes;
use tonic::service::interceptor::InterceptedService;
use tower::Layer as _;

use crate::access::{Auth, Authenticate, KeyStore};
use crate::admin::{AdminKeyCheck, AdminService};
use crate::deep_health::DeepHealth;
use crate::embeddings_grpc::EmbeddingsService;
use crate::grpc::GenerationService;
use crate::limit_headers::RateLimitHeaders;
use crate::registry::load::LoadDefaults;
use crate::registry::{Entry, Registry};
use crate::responses::{ResponsesService, Store, StoreConfig};
use crate::runtime::ModelRuntime;

/// Every gRPC route, as one HTTP service (HTTP/2, and HTTP/1 for gRPC-Web).
pub type GrpcService = tonic_web::GrpcWebService<Routes>;

/// What the gRPC routes need besides the models.
#[derive(Default)]
pub struct ServerOptions {
    /// `--api-key`: guards gyre.v1.Generation, Responses and Embeddings
    /// (one key, no tenants).
    pub api_key: Option<String>,
    /// `--keys-file`: keys mapped to tenants with quotas (instead of
    /// `api_key`).
    pub keys: Option<Arc<KeyStore>>,
    /// `--open-endpoints`: health and reflection take no key even with a
    /// keys file (with `api_key` alone they never do).
    pub open_endpoints: bool,
    /// `--admin-api-key`: guards gyre.v1.Admin; None: the admin service is
    /// off (UNIMPLEMENTED).
    pub admin_api_key: Option<String>,
    /// How the admin service loads models.
    pub load_defaults: Option<LoadDefaults>,
    /// Where gyre.v1.Responses keeps responses; None: an in-memory store.
    pub store: Option<Arc<Store>>,
    /// `--deep-health-interval-secs`: probe each generative model through
    /// its engine and report it in health (see `deep_health`); None: off.
    pub deep_health: Option<DeepHealth>,
}

/// The gRPC service over `models`, ready to serve. Once `draining` turns
/// true, health reports NOT_SERVING (overall, the service and each model)
/// and new generation requests get UNAVAILABLE while running ones finish.
pub async fn grpc_service(
    models: Vec<Arc<ModelRuntime>>,
    api_key: Option<String>,
    draining: watch::Receiver<bool>,
) -> anyhow::Result<GrpcService> {
    let entries = models.into_iter().map(Entry::generative).collect();
    let opts = ServerOptions {
        api_key,
        ..ServerOptions::default()
    };
    grpc_service_for(Arc::new(Registry::unchecked(entries)), opts, draining).await
}

/// [`grpc_service`] keeping responses in `store`.
pub async fn grpc_service_with_store(
    models: Vec<Arc<ModelRuntime>>,
    api_key: Option<String>,
    draining: watch::Receiver<bool>,
    store: Arc<Store>,
) -> anyhow::Result<GrpcService> {
    let entries = models.into_iter().map(Entry::generative).collect();
    let opts = ServerOptions {
        api_key,
        store: Some(store),
        ..ServerOptions::default()
    };
    grpc_service_for(Arc::new(Registry::unchecked(entries)), opts, draining).await
}

/// The gRPC service over the models of `registry` (which the admin service
/// may change while it serves), with per-model health that follows it.
pub async fn grpc_service_for(
    registry: Arc<Registry>,
    opts: ServerOptions,
    draining: watch::Receiver<bool>,
) -> anyhow::Result<GrpcService> {
    let health = tonic_health::server::HealthReporter::new();
    let health_svc = crate::health::server(&health);
    health
        .set_serving::<GenerationServer<GenerationService>>()
        .await;
    health
        .set_serving::<ResponsesServer<ResponsesService>>()
        .await;
    health
        .set_serving::<EmbeddingsServer<EmbeddingsService>>()
        .await;
    registry.attach_health(health.clone()).await;
    if let Some(cfg) = opts.deep_health {
        crate::deep_health::spawn(registry.clone(), health.clone(), cfg, draining.clone());
    }
    {
        let mut draining = draining.clone();
        let registry = registry.clone();
        tokio::spawn(async move {
            if draining.wait_for(|d| *d).await.is_err() {
                return;
            }
            health
                .set_not_serving::<GenerationServer<GenerationService>>()
                .await;
            health
                .set_not_serving::<ResponsesServer<ResponsesService>>()
                .await;
            health
                .set_not_serving::<EmbeddingsServer<EmbeddingsService>>()
                .await;
            health
                .set_service_status("", tonic_health::ServingStatus::NotServing)
                .await;
            registry.all_not_serving().await;
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
    let store = match opts.store {
        Some(store) => store,
        None => Arc::new(Store::open(StoreConfig::default())?),
    };
    let auth = match (&opts.keys, &opts.api_key) {
        (Some(store), _) => Auth::Keys(store.clone()),
        (None, Some(key)) => Auth::Key(Arc::from(key.as_str())),
        (None, None) => Auth::Open,
    };
    // Probes and reflection: behind the keys file's keys unless left open.
    let probe_auth = match &auth {
        Auth::Keys(_) if !opts.open_endpoints => auth.clone(),
        _ => Auth::Open,
    };
    // The tenant's routes: the key check, then the rate-limit headers on
    // every answer (`limit_headers`).
    let embeddings = InterceptedService::new(
        RateLimitHeaders::new(EmbeddingsServer::new(EmbeddingsService::new(
            registry.clone(),
            draining.clone(),
        ))),
        Authenticate::new(auth.clone()),
    );
    let gen_service = GenerationService::with_registry(registry.clone(), draining.clone());
    let responses = InterceptedService::new(
        RateLimitHeaders::new(ResponsesServer::new(ResponsesService::new(
            gen_service.clone(),
            store,
        ))),
        Authenticate::new(auth.clone()),
    );
    let generation = InterceptedService::new(
        RateLimitHeaders::new(GenerationServer::new(gen_service)),
        Authenticate::new(auth.clone()),
    );
    let admin = InterceptedService::new(
        AdminServer::new(AdminService::new(registry, opts.load_defaults, draining)),
        AdminKeyCheck::new(opts.admin_api_key, opts.api_key),
    );
    let routes = Routes::new(InterceptedService::new(
        health_svc,
        Authenticate::new(probe_auth.clone()),
    ))
    .add_service(InterceptedService::new(
        reflection_v1,
        Authenticate::new(probe_auth.clone()),
    ))
    .add_service(InterceptedService::new(
        reflection_v1alpha,
        Authenticate::new(probe_auth),
    ))
    .add_service(generation)
    .add_service(responses)
    .add_service(embeddings)
    .add_service(admin)
    .prepare();
    // HTTP/1 is accepted too, for gRPC-Web.
    Ok(tonic_web::GrpcWebLayer::new().layer(routes))
}
