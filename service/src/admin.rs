//! `gyre.v1.Admin`: load and unload models while the server runs, and list
//! the catalogue with what only the operator sees. Behind its own key
//! ([`AdminKeyCheck`]): off (UNIMPLEMENTED) without one, and the ordinary
//! API key does not open it (PERMISSION_DENIED).

use std::sync::Arc;
use std::time::Duration;

use gyre_api::v1::{
    AdminListModelsRequest, AdminListModelsResponse, AdminModel, LoadModelRequest,
    LoadModelResponse, UnloadModelRequest, UnloadModelResponse, admin_server::Admin,
};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::error::ServiceError;
use crate::registry::load::{self, LoadDefaults, LoadError};
use crate::registry::spec::{ModelSpec, parse_date};
use crate::registry::{Registry, memory};

/// How long `UnloadModel` waits for running requests by default.
pub const DEFAULT_DRAIN: Duration = Duration::from_secs(30);

/// Checks `authorization: Bearer <admin key>`.
#[derive(Clone)]
pub struct AdminKeyCheck {
    admin: Option<Arc<str>>,
    api: Option<Arc<str>>,
}

impl AdminKeyCheck {
    /// `admin`: the admin key (None: the service is off); `api`: the
    /// ordinary key, told apart so that its holder hears PERMISSION_DENIED.
    pub fn new(admin: Option<String>, api: Option<String>) -> Self {
        Self {
            admin: admin.map(Arc::from),
            api: api.map(Arc::from),
        }
    }
}

impl tonic::service::Interceptor for AdminKeyCheck {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        let Some(admin) = &self.admin else {
            return Err(Status::unimplemented(
                "the admin service is off: start gyre with --admin-api-key (GYRE_ADMIN_API_KEY)",
            ));
        };
        let Some(got) = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
        else {
            return Err(Status::unauthenticated(
                "missing admin key: send metadata `authorization: Bearer <admin key>`",
            ));
        };
        if gyre_api::auth::bearer_matches(got, admin) {
            return Ok(req);
        }
        if self
            .api
            .as_deref()
            .is_some_and(|api| gyre_api::auth::bearer_matches(got, api))
        {
            return Err(Status::permission_denied(
                "the API key does not grant the admin service; send the admin key",
            ));
        }
        Err(Status::unauthenticated("invalid admin key"))
    }
}

/// The admin service over the server's registry.
pub struct AdminService {
    registry: Arc<Registry>,
    /// How models are loaded; None: LoadModel is FAILED_PRECONDITION.
    defaults: Option<LoadDefaults>,
    draining: watch::Receiver<bool>,
    /// One load at a time (memory checks and the load-progress reporter
    /// assume it).
    loading: tokio::sync::Mutex<()>,
}

impl AdminService {
    pub fn new(
        registry: Arc<Registry>,
        defaults: Option<LoadDefaults>,
        draining: watch::Receiver<bool>,
    ) -> Self {
        Self {
            registry,
            defaults,
            draining,
            loading: tokio::sync::Mutex::new(()),
        }
    }
}

fn load_failed(e: LoadError) -> ServiceError {
    ServiceError::invalid("source", "MODEL_LOAD_FAILED", e.to_string())
}

fn join_failed(e: tokio::task::JoinError) -> ServiceError {
    ServiceError::Internal(e.to_string())
}

/// A `LoadModelRequest` as a spec (dates parsed, names checked).
fn spec_of(req: LoadModelRequest) -> Result<ModelSpec, ServiceError> {
    if req.source.trim().is_empty() {
        return Err(ServiceError::invalid(
            "source",
            "MISSING_SOURCE",
            "source is required",
        ));
    }
    let date = |field: &str, v: Option<String>| {
        v.map(|d| {
            parse_date(&d, field)
                .map_err(|e| ServiceError::invalid(field, "INVALID_DATE", e.to_string()))
        })
        .transpose()
    };
    if req.name.as_deref().is_some_and(|n| n.trim().is_empty()) {
        return Err(ServiceError::invalid(
            "name",
            "EMPTY_NAME",
            "name must not be empty",
        ));
    }
    if req.aliases.iter().any(|a| a.trim().is_empty()) {
        return Err(ServiceError::invalid(
            "aliases",
            "EMPTY_NAME",
            "aliases must not be empty",
        ));
    }
    let max = gyre_engine::MAX_SPECULATIVE_TOKENS;
    if let Some(k) = req.prompt_lookup.filter(|&k| k > max) {
        return Err(ServiceError::invalid(
            "prompt_lookup",
            "OUT_OF_RANGE",
            format!("prompt_lookup must be between 0 and {max}, got {k}"),
        ));
    }
    Ok(ModelSpec {
        prompt_lookup: req.prompt_lookup,
        deprecation: date("deprecated", req.deprecated)?,
        sunset: date("sunset", req.sunset)?,
        source: req.source,
        revision: req.revision,
        name: req.name,
        aliases: req.aliases,
        version: req.version,
        owned_by: req.owned_by,
        kv_cache_mib: req.kv_cache_mib,
        // Not loadable through the admin API yet.
        draft: None,
    })
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn load_model(
        &self,
        request: Request<LoadModelRequest>,
    ) -> Result<Response<LoadModelResponse>, Status> {
        if *self.draining.borrow() {
            return Err(ServiceError::Draining.into());
        }
        let Some(defaults) = self.defaults.clone() else {
            return Err(Status::failed_precondition(
                "this server cannot load models (it was built without load settings)",
            ));
        };
        let spec = spec_of(request.into_inner())?;
        let _one_at_a_time = self.loading.lock().await;
        let d = defaults.clone();
        let planned = tokio::task::spawn_blocking(move || load::plan(spec, &d))
            .await
            .map_err(join_failed)?
            .map_err(load_failed)?;
        let names = std::iter::once(planned.id.as_str())
            .chain(planned.spec.aliases.iter().map(String::as_str));
        self.registry.check_free(names)?;
        if let Some(available) = load::device_memory(&defaults) {
            // A configured amount is shared with the models served; the
            // measured one already lacks what they hold.
            let reserved = if defaults.device_memory.is_some() {
                self.registry.reserved_bytes()
            } else {
                0
            };
            memory::check(std::slice::from_ref(&planned.budget), available, reserved)
                .map_err(ServiceError::OutOfMemory)?;
        }
        let d = defaults;
        let entry = tokio::task::spawn_blocking(move || load::load(planned, &d))
            .await
            .map_err(join_failed)?
            .map_err(load_failed)?;
        let entry = self.registry.insert(entry).await?;
        tracing::info!(model = %entry.card.id, aliases = ?entry.card.aliases, "model loaded by the admin service");
        tracing::info!(target: crate::access::AUDIT, model = %entry.card.id, aliases = ?entry.card.aliases, source = %entry.card.source, "model loaded");
        Ok(Response::new(LoadModelResponse {
            model: Some(entry.to_proto()),
        }))
    }

    async fn unload_model(
        &self,
        request: Request<UnloadModelRequest>,
    ) -> Result<Response<UnloadModelResponse>, Status> {
        let req = request.into_inner();
        let timeout = match req.drain_timeout_seconds {
            None => DEFAULT_DRAIN,
            Some(s) if s.is_finite() && s >= 0.0 => Duration::from_secs_f64(s.min(86_400.0)),
            Some(_) => {
                return Err(ServiceError::invalid(
                    "drain_timeout_seconds",
                    "OUT_OF_RANGE",
                    "drain_timeout_seconds must be a number of seconds >= 0",
                )
                .into());
            }
        };
        let entry = self.registry.remove(&req.name).await?;
        tracing::info!(model = %entry.card.id, "unloading: draining its requests");
        let drained = tokio::time::timeout(timeout, entry.wait_idle())
            .await
            .is_ok();
        tracing::info!(model = %entry.card.id, drained, "model unloaded");
        tracing::info!(target: crate::access::AUDIT, model = %entry.card.id, drained, "model unloaded");
        Ok(Response::new(UnloadModelResponse {
            id: entry.card.id.clone(),
            drained,
        }))
    }

    async fn list_models(
        &self,
        _: Request<AdminListModelsRequest>,
    ) -> Result<Response<AdminListModelsResponse>, Status> {
        let models = self
            .registry
            .list()
            .iter()
            .map(|e| {
                let (running, waiting) = e.load();
                AdminModel {
                    model: Some(e.to_proto()),
                    source: e.card.source.clone(),
                    kv_cache_bytes: e.card.kv_bytes,
                    running,
                    waiting,
                }
            })
            .collect();
        Ok(Response::new(AdminListModelsResponse { models }))
    }
}
