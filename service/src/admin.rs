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
    match e {
        LoadError::Draft(message) => ServiceError::invalid("draft", "DRAFT_LOAD_FAILED", message),
        e => ServiceError::invalid("source", "MODEL_LOAD_FAILED", e.to_string()),
    }
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
    for (field, value) in [
        ("prompt_lookup", req.prompt_lookup),
        ("draft_tokens", req.draft_tokens),
    ] {
        if let Some(k) = value.filter(|&k| k > max) {
            return Err(ServiceError::invalid(
                field,
                "OUT_OF_RANGE",
                format!("{field} must be between 0 and {max}, got {k}"),
            ));
        }
    }
    if req.draft.as_deref().is_some_and(|d| d.trim().is_empty()) {
        return Err(ServiceError::invalid(
            "draft",
            "EMPTY_DRAFT",
            "draft must not be empty (a draft model's path; leave it unset for none)",
        ));
    }
    if req.draft_tokens.is_some() && req.draft.is_none() {
        return Err(ServiceError::invalid(
            "draft_tokens",
            "NO_DRAFT_MODEL",
            "draft_tokens needs a draft model (`draft`)",
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
        draft: req.draft,
        draft_tokens: req.draft_tokens,
        prompt_lookup_max: None,
        prompt_lookup_min: None,
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
        tracing::info!(model = %entry.card.id, aliases = ?entry.card.aliases, draft = ?entry.card.draft, "model loaded by the admin service");
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
                    draft: e.card.draft.clone(),
                }
            })
            .collect();
        Ok(Response::new(AdminListModelsResponse { models }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(req: LoadModelRequest) -> (String, &'static str, String) {
        match spec_of(req).expect_err("refused") {
            ServiceError::InvalidArgument {
                field,
                reason,
                message,
            } => (field, reason, message),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_draft_and_its_tokens_reach_the_spec() {
        let spec = spec_of(LoadModelRequest {
            source: "m".into(),
            draft: Some("d.gguf".into()),
            draft_tokens: Some(3),
            ..LoadModelRequest::default()
        })
        .expect("ok");
        assert_eq!(spec.draft.as_deref(), Some("d.gguf"));
        assert_eq!(spec.draft_tokens, Some(3));
        let plain = spec_of(LoadModelRequest {
            source: "m".into(),
            ..LoadModelRequest::default()
        })
        .expect("ok");
        assert_eq!((plain.draft, plain.draft_tokens), (None, None));
    }

    #[test]
    fn bad_draft_fields_are_named() {
        let (field, reason, message) = field_of(LoadModelRequest {
            source: "m".into(),
            draft_tokens: Some(3),
            ..LoadModelRequest::default()
        });
        assert_eq!((field.as_str(), reason), ("draft_tokens", "NO_DRAFT_MODEL"));
        assert!(message.contains("needs a draft model"), "{message}");
        let (field, reason, message) = field_of(LoadModelRequest {
            source: "m".into(),
            draft: Some("d".into()),
            draft_tokens: Some(65),
            ..LoadModelRequest::default()
        });
        assert_eq!((field.as_str(), reason), ("draft_tokens", "OUT_OF_RANGE"));
        assert!(message.contains("between 0 and 64, got 65"), "{message}");
        let (field, reason, _) = field_of(LoadModelRequest {
            source: "m".into(),
            draft: Some(" ".into()),
            ..LoadModelRequest::default()
        });
        assert_eq!((field.as_str(), reason), ("draft", "EMPTY_DRAFT"));
    }

    #[test]
    fn a_draft_that_fails_to_load_is_named_as_the_draft() {
        let (field, reason, message) = match load_failed(LoadError::Draft(
            "the draft model's vocabulary differs".into(),
        )) {
            ServiceError::InvalidArgument {
                field,
                reason,
                message,
            } => (field, reason, message),
            other => panic!("{other:?}"),
        };
        assert_eq!((field.as_str(), reason), ("draft", "DRAFT_LOAD_FAILED"));
        assert!(message.contains("vocabulary differs"));
        assert!(matches!(
            load_failed(LoadError::Load("x".into())),
            ServiceError::InvalidArgument { field, .. } if field == "source"
        ));
    }
}
