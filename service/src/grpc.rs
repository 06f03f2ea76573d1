//! The `gyre.v1.Generation` service over the engine.
//!
//! Each choice of a request runs in its own task (`choice`): engine events
//! in, through the choice's output pipeline (`pipeline`), typed events out
//! through a bounded channel.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use gyre_api::v1::{
    self, DetokenizeRequest, DetokenizeResponse, FinishReason, GenerateRequest, GenerateResponse,
    ListModelsRequest, ListModelsResponse, TokenizeRequest, TokenizeResponse,
    generate_response::Event as Ev, generation_server::Generation, tokenize_request,
};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::access::Caller;
use crate::choice::{Choice, run};
use crate::error::ServiceError;
use crate::observe::RequestObs;
use crate::registry::{Entry, Registry};
use crate::request::{self, Prepared};
use crate::runtime::ModelRuntime;
use crate::tenant::Tenant;

pub(crate) type Out = mpsc::Sender<Result<GenerateResponse, Status>>;
pub(crate) type EventStream = Pin<Box<dyn Stream<Item = Result<GenerateResponse, Status>> + Send>>;

/// Events buffered per stream before the producer waits for the client.
pub(crate) const STREAM_BUFFER: usize = 64;

#[derive(Clone)]
pub struct GenerationService {
    pub(crate) models: Arc<Registry>,
    /// True once the server drains for shutdown: new requests get
    /// UNAVAILABLE, those already running finish.
    draining: tokio::sync::watch::Receiver<bool>,
    /// The caller of the request being served (keys file only): checks its
    /// model and admits it against its quotas.
    caller: Option<Caller>,
}

impl GenerationService {
    /// The service over a fixed list of models (no aliases, no catalogue
    /// beyond the runtimes' own ids).
    pub fn new(
        models: Vec<Arc<ModelRuntime>>,
        draining: tokio::sync::watch::Receiver<bool>,
    ) -> Self {
        let entries = models.into_iter().map(Entry::generative).collect();
        let registry = Registry::unchecked(entries);
        Self::with_registry(Arc::new(registry), draining)
    }

    /// The service over the models of `registry` (which may change while it
    /// serves).
    pub fn with_registry(
        models: Arc<Registry>,
        draining: tokio::sync::watch::Receiver<bool>,
    ) -> Self {
        Self {
            models,
            draining,
            caller: None,
        }
    }

    /// The service as it serves `req`'s caller (see [`Caller`]).
    pub fn for_request<T>(&self, req: &Request<T>) -> Self {
        Self {
            caller: Caller::of(req),
            ..self.clone()
        }
    }

    /// PERMISSION_DENIED unless the caller may use `entry` (named `asked`).
    pub(crate) fn check_allowed(&self, asked: &str, entry: &Entry) -> Result<(), ServiceError> {
        let asked = if asked.is_empty() {
            entry.card.id.as_str()
        } else {
            asked
        };
        match &self.caller {
            Some(c) => c.check_model(asked, entry.names()),
            None => Ok(()),
        }
    }

    /// Validates and submits a request of `tenant`; one event receiver per
    /// choice.
    pub(crate) async fn prepare(
        &self,
        req: v1::Request,
        tenant: &Tenant,
    ) -> Result<(Arc<Prepared>, Vec<Choice>), ServiceError> {
        self.prepare_entry(req, tenant)
            .await
            .map(|(p, c, _)| (p, c))
    }

    /// [`Self::prepare`], also returning the model's registry entry.
    pub(crate) async fn prepare_entry(
        &self,
        req: v1::Request,
        tenant: &Tenant,
    ) -> Result<(Arc<Prepared>, Vec<Choice>, Arc<Entry>), ServiceError> {
        let arrived = std::time::Instant::now();
        if *self.draining.borrow() {
            return Err(ServiceError::Draining);
        }
        let entry = self.models.resolve_kind(&req.model, "generate")?;
        self.check_allowed(&req.model, &entry)?;
        let model = entry.generative_runtime()?.clone();
        let mut prepared = tokio::task::spawn_blocking(move || request::prepare_for(model, &req))
            .await
            .map_err(|e| ServiceError::Internal(e.to_string()))??;
        prepared.arrived = arrived;
        if let Some(caller) = &self.caller {
            // The most the request may use: its prompt and every choice's
            // max_tokens.
            let prompt = prepared.engine_req.prompt.len() as u64;
            let most = u64::from(prepared.engine_req.max_tokens) * u64::from(prepared.n.max(1));
            prepared.admission = Some(caller.admit(prompt + most)?);
        }
        for_tenant(&mut prepared.engine_req, tenant);
        let rxs = prepared
            .model
            .engine
            .submit_n(prepared.engine_req.clone(), prepared.n)
            .map_err(|e| queue_position(e, &prepared.model.engine))?;
        if let Some(a) = &prepared.admission {
            a.submitted(prepared.engine_req.prompt.len() as u64);
        }
        Ok((Arc::new(prepared), rxs, entry))
    }

    /// Runs every choice of a prepared request in its own task (each
    /// reporting to `obs` when given).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn spawn_choices(
        id: &str,
        p: Arc<Prepared>,
        choices: Vec<Choice>,
        out: &Out,
        cancel: &watch::Receiver<bool>,
        mode: Mode,
        deadline: Option<Instant>,
        obs: Option<Arc<RequestObs>>,
    ) {
        for (index, events) in choices.into_iter().enumerate() {
            let tag = Tag {
                id: id.to_string(),
                index: index as u32,
                obs: obs.clone(),
            };
            tokio::spawn(run(
                tag,
                p.clone(),
                events,
                out.clone(),
                cancel.clone(),
                mode,
                deadline,
            ));
        }
    }
}

/// Puts `req` in `tenant`'s share of the engine; the tenant's priority adds
/// to the request's own.
pub(crate) fn for_tenant(req: &mut gyre_engine::GenerateRequest, tenant: &Tenant) {
    req.tenant = tenant.name.clone();
    req.weight = tenant.weight.max(1);
    req.priority = req.priority.saturating_add(tenant.priority);
}

/// A refusal of the engine, with the queue's length when it is full (see
/// [`ServiceError::QueueFull`]).
pub(crate) fn queue_position(
    e: gyre_engine::EngineError,
    engine: &gyre_engine::Engine,
) -> ServiceError {
    match e {
        gyre_engine::EngineError::QueueFull => ServiceError::QueueFull {
            position: engine.queued().saturating_add(1),
        },
        e => ServiceError::Engine(e),
    }
}

/// Which request and choice an event belongs to.
pub(crate) struct Tag {
    pub(crate) id: String,
    pub(crate) index: u32,
    /// The call's record (single-request calls).
    pub(crate) obs: Option<Arc<RequestObs>>,
}

pub(crate) fn event(tag: &Tag, ev: Ev) -> GenerateResponse {
    GenerateResponse {
        request_id: tag.id.clone(),
        index: tag.index,
        event: Some(ev),
    }
}

/// A request's failure on the multiplexed stream (counted as an error, as
/// a status is).
pub(crate) fn request_error(e: &ServiceError) -> v1::RequestError {
    let (code, reason, field, message) = e.parts();
    crate::metrics::error(reason);
    v1::RequestError {
        code: code as i32,
        message: crate::error::bounded(message, crate::error::MAX_MESSAGE_BYTES),
        reason: reason.to_string(),
        field: field.unwrap_or_default(),
    }
}

/// How a request's failure is reported: a `Finish` with an error on the
/// multiplexed stream, or the call's status on a single-request stream.
#[derive(Clone, Copy)]
pub(crate) enum Mode {
    Multiplexed,
    Single,
}

pub(crate) async fn fail(tag: &Tag, out: &Out, mode: Mode, e: ServiceError) {
    let id = &tag.id;
    let _ = match mode {
        Mode::Single => out.send(Err(e.into())).await,
        Mode::Multiplexed => {
            if let (tonic::Code::Internal, ..) = e.parts() {
                tracing::error!(request_id = id, error = %e, "request failed");
            }
            let f = v1::Finish {
                reason: FinishReason::Error as i32,
                usage: None,
                matched_stop: None,
                matched_stop_token_id: None,
                error: Some(request_error(&e)),
                ..Default::default()
            };
            out.send(Ok(event(tag, Ev::Finish(f)))).await
        }
    };
}

/// When the call must end, from its `grpc-timeout` header (gRPC's wire
/// format: up to 8 digits and a unit, H M S m u n). None without one.
fn deadline_of(meta: &tonic::metadata::MetadataMap) -> Option<Instant> {
    let v = meta.get("grpc-timeout")?.to_str().ok()?;
    let timeout = parse_grpc_timeout(v)?;
    Some(Instant::now() + timeout)
}

fn parse_grpc_timeout(v: &str) -> Option<std::time::Duration> {
    use std::time::Duration;
    let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[tonic::async_trait]
impl Generation for GenerationService {
    type GenerateStream = EventStream;
    type GenerateStreamStream = EventStream;

    async fn generate(
        &self,
        request: Request<Streaming<GenerateRequest>>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        // The call's deadline bounds every request on the stream.
        let deadline = deadline_of(request.metadata());
        let tenant = Tenant::of(&request);
        let parent = crate::observe::parent_for(request.metadata());
        Ok(Response::new(crate::multiplex::serve(
            self.for_request(&request),
            request.into_inner(),
            deadline,
            tenant,
            parent,
        )))
    }

    async fn generate_stream(
        &self,
        request: Request<v1::Request>,
    ) -> Result<Response<Self::GenerateStreamStream>, Status> {
        let deadline = deadline_of(request.metadata());
        let svc = self.for_request(&request);
        let obs = RequestObs::start(&request, "gyre.v1.Generation/GenerateStream");
        let request_id = obs.id.clone();
        let tenant = Tenant::of(&request);
        let mut req = request.into_inner();
        if req.request_id.is_empty() {
            req.request_id = format!("req-{:016x}", rand_id());
        }
        obs.request(&req);
        let id = req.request_id.clone();
        let (p, choices, entry) = match svc.prepare_entry(req, &tenant).await {
            Ok(prepared) => prepared,
            Err(e) => {
                let mut status = Status::from(e);
                obs.failed(&status);
                request_id_metadata(status.metadata_mut(), &request_id);
                return Err(status);
            }
        };
        obs.prepared(&entry.card.id, &p);
        let (out, rx) = mpsc::channel(STREAM_BUFFER);
        let (cancel_tx, cancel_rx) = watch::channel(false);
        GenerationService::spawn_choices(
            &id,
            p,
            choices,
            &out,
            &cancel_rx,
            Mode::Single,
            deadline,
            Some(Arc::new(obs)),
        );
        // Nothing cancels a single-request stream but the client leaving
        // (noticed by each choice through its output channel); keep the
        // switch alive until every choice is done.
        tokio::spawn(async move { cancel_tx.closed().await });
        let mut response = Response::new(Box::pin(ReceiverStream::new(rx)) as EventStream);
        model_metadata(response.metadata_mut(), &entry);
        request_id_metadata(response.metadata_mut(), &request_id);
        Ok(response)
    }

    async fn tokenize(
        &self,
        request: Request<TokenizeRequest>,
    ) -> Result<Response<TokenizeResponse>, Status> {
        let svc = self.for_request(&request);
        let req = request.into_inner();
        let entry = self.models.resolve_kind(&req.model, "generate")?;
        svc.check_allowed(&req.model, &entry)?;
        let model = entry.generative_runtime()?.clone();
        let resp =
            tokio::task::spawn_blocking(move || -> Result<TokenizeResponse, ServiceError> {
                let (prompt, ids) = match &req.input {
                    Some(tokenize_request::Input::Text(t)) => (
                        t.clone(),
                        model.encode(t, req.add_special_tokens.unwrap_or(true))?,
                    ),
                    Some(tokenize_request::Input::Chat(c)) => {
                        let text = crate::chat::render_chat_input(&model, c)?;
                        let ids = model.encode(&text, false)?;
                        (text, ids)
                    }
                    None => {
                        return Err(ServiceError::invalid(
                            "input",
                            "MISSING_INPUT",
                            "text or chat is required",
                        ));
                    }
                };
                Ok(TokenizeResponse {
                    token_ids: ids,
                    max_model_len: model.engine.info().max_model_len,
                    prompt,
                })
            })
            .await
            .map_err(|e| Status::from(ServiceError::Internal(e.to_string())))??;
        let mut response = Response::new(resp);
        model_metadata(response.metadata_mut(), &entry);
        Ok(response)
    }

    async fn detokenize(
        &self,
        request: Request<DetokenizeRequest>,
    ) -> Result<Response<DetokenizeResponse>, Status> {
        let svc = self.for_request(&request);
        let req = request.into_inner();
        let entry = self.models.resolve_kind(&req.model, "generate")?;
        svc.check_allowed(&req.model, &entry)?;
        let text = entry
            .generative_runtime()?
            .decode(&req.token_ids, req.skip_special_tokens.unwrap_or(true))?;
        let mut response = Response::new(DetokenizeResponse { text });
        model_metadata(response.metadata_mut(), &entry);
        Ok(response)
    }

    async fn get_stats(
        &self,
        request: Request<v1::GetStatsRequest>,
    ) -> Result<Response<v1::EngineStats>, Status> {
        let name = request.into_inner().model;
        let model = self.models.runtime(&name)?;
        let s = model.engine.stats();
        Ok(Response::new(v1::EngineStats {
            model: model.id.clone(),
            waiting: s.waiting,
            running: s.running,
            block_size: s.block_size,
            kv_blocks_total: s.kv_blocks_total,
            kv_blocks_used: s.kv_blocks_used,
            kv_blocks_cached: s.kv_blocks_cached,
            prefix_query_tokens_total: s.prefix_query_tokens_total,
            prefix_hit_tokens_total: s.prefix_hit_tokens_total,
            last_step_tokens: s.last_step_tokens,
            steps_total: s.steps_total,
            preemptions_total: s.preemptions_total,
            generated_tokens_total: s.generated_tokens_total,
            speculative_proposed_tokens_total: s.spec_proposed_tokens_total,
            speculative_accepted_tokens_total: s.spec_accepted_tokens_total,
            draft_proposed_tokens_total: s.draft_proposed_tokens_total,
            draft_accepted_tokens_total: s.draft_accepted_tokens_total,
            draft_forwards_total: s.draft_forwards_total,
            draft_kv_blocks_total: s.draft_kv_blocks_total,
            draft_kv_blocks_used: s.draft_kv_blocks_used,
        }))
    }

    async fn list_models(
        &self,
        _: Request<ListModelsRequest>,
    ) -> Result<Response<ListModelsResponse>, Status> {
        let models = self.models.list().iter().map(|e| e.to_proto()).collect();
        Ok(Response::new(ListModelsResponse { models }))
    }
}

/// The response metadata naming the model that serves a call (`gyre-model`,
/// its id, whatever name the request used) and, for a deprecated model, its
/// `deprecation` and `sunset` notices.
pub(crate) fn model_metadata(meta: &mut tonic::metadata::MetadataMap, entry: &Entry) {
    use tonic::metadata::MetadataValue;
    if let Ok(v) = MetadataValue::try_from(entry.card.id.as_str()) {
        meta.insert("gyre-model", v);
    }
    for (name, value) in entry.notice() {
        if let Ok(v) = MetadataValue::try_from(value.as_str()) {
            meta.insert(name, v);
        }
    }
}

/// The call's request id, returned as `x-request-id` metadata.
fn request_id_metadata(meta: &mut tonic::metadata::MetadataMap, id: &str) {
    if let Ok(v) = tonic::metadata::MetadataValue::try_from(id) {
        meta.insert(crate::observe::REQUEST_ID, v);
    }
}

fn rand_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::parse_grpc_timeout;
    use std::time::Duration;

    #[test]
    fn grpc_timeout_header_parses_every_unit() {
        assert_eq!(parse_grpc_timeout("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(parse_grpc_timeout("3M"), Some(Duration::from_secs(180)));
        assert_eq!(parse_grpc_timeout("10S"), Some(Duration::from_secs(10)));
        assert_eq!(parse_grpc_timeout("250m"), Some(Duration::from_millis(250)));
        assert_eq!(parse_grpc_timeout("7u"), Some(Duration::from_micros(7)));
        assert_eq!(
            parse_grpc_timeout("99999999n"),
            Some(Duration::from_nanos(99_999_999))
        );
        for bad in ["", "S", "123456789S", "5x", "-1S", "1.5S"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
        }
    }
}
