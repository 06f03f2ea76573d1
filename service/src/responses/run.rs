//! Creating a response: resolving its history, submitting it to the same
//! generation path as chat (`GenerationService::prepare` and its choice
//! task with the output pipeline), and the task that turns the choice's
//! events into response events, publishes them (`live`) and stores them.
//!
//! The response's `RequestObs` goes with its choice task, so its log line
//! and span are made when the generation ends.
//!
//! The task runs detached from the call: a background response goes on
//! when its client leaves; one without `background` is cancelled by its
//! subscriber when the client leaves (`Live::subscribe`), and ends
//! "cancelled".

use std::sync::Arc;

use gyre_api::v1::{
    self, CreateResponseRequest, Item, Response, create_response_request::Input,
    generate_response::Event as GenEv, item::Item as It,
};
use tokio::sync::mpsc;

use super::events::{Builder, Options};
use super::live::{Live, Registry};
use super::store::{Store, now};
use super::{blocking, ids, render, validate};
use crate::error::ServiceError;
use crate::grpc::{GenerationService, Mode, STREAM_BUFFER};
use crate::observe::RequestObs;
use crate::request::Prepared;
use crate::tenant::Tenant;

/// A request resolved against the store: its history and input items.
pub struct Resolved {
    /// Items before the input (from `previous_response_id` or the
    /// conversation).
    pub history: Vec<Item>,
    /// The request's own input items, with ids.
    pub input: Vec<Item>,
}

/// The input as items with ids (a string is one user message).
fn input_items(r: &CreateResponseRequest) -> Vec<Item> {
    let mut items = match &r.input {
        None => Vec::new(),
        Some(Input::Text(t)) => vec![Item {
            id: String::new(),
            status: "completed".into(),
            item: Some(It::Message(v1::MessageItem {
                role: "user".into(),
                content: vec![v1::ContentPart {
                    part: Some(v1::content_part::Part::InputText(t.clone())),
                }],
            })),
        }],
        Some(Input::Items(i)) => i.items.clone(),
    };
    for it in &mut items {
        if it.id.is_empty() {
            it.id = ids::new("in");
        }
        if it.status.is_empty() {
            it.status = "completed".into();
        }
    }
    items
}

/// Validates `r` and reads its history from the store.
pub async fn resolve(
    store: &Arc<Store>,
    r: &CreateResponseRequest,
    tenant: &Tenant,
) -> Result<Resolved, ServiceError> {
    validate::request(r)?;
    let who = tenant.name.clone();
    let history = match (&r.previous_response_id, &r.conversation) {
        (Some(prev), _) => {
            let prev = prev.clone();
            blocking(store, move |s| {
                Ok(match s.get_response(&prev, &who)? {
                    None => None,
                    Some(_) => Some(s.history(&prev, &who)?),
                })
            })
            .await?
            .ok_or_else(|| ServiceError::NotFound {
                field: "previous_response_id".into(),
                message: format!(
                    "no stored response with id `{}`",
                    gyre_api::clip(r.previous_response_id.as_deref().unwrap_or(""))
                ),
            })?
        }
        (None, Some(conv)) => {
            let c = conv.clone();
            blocking(store, move |s| {
                Ok(match s.get_conversation(&c, &who)? {
                    None => None,
                    Some(_) => Some(s.conversation_items(&c)?),
                })
            })
            .await?
            .ok_or_else(|| ServiceError::NotFound {
                field: "conversation".into(),
                message: format!("no conversation with id `{}`", gyre_api::clip(conv)),
            })?
        }
        (None, None) => Vec::new(),
    };
    let input = input_items(r);
    validate::unique_ids("input", &history, &input)?;
    Ok(Resolved { history, input })
}

/// The generation request of `r`, with `truncation: "auto"` dropping the
/// oldest turns while the prompt does not fit; validated and tokenized.
/// `submit`: also submit it to the engine, for this tenant.
pub async fn prepare(
    generation: &GenerationService,
    id: &str,
    r: &CreateResponseRequest,
    resolved: &Resolved,
    submit: Option<&Tenant>,
) -> Result<(Arc<Prepared>, Vec<crate::choice::Choice>), ServiceError> {
    let mut items: Vec<Item> = resolved.history.clone();
    items.extend(resolved.input.iter().cloned());
    let auto = r.truncation.as_deref() == Some("auto");
    loop {
        let req =
            render::generation_request(id, r, render::messages(r.instructions.as_deref(), &items));
        let result = if let Some(tenant) = submit {
            generation.prepare(req, tenant).await
        } else {
            let model = generation.models.runtime(&req.model)?;
            tokio::task::spawn_blocking(move || crate::request::prepare_for(model, &req))
                .await
                .map_err(|e| ServiceError::Internal(e.to_string()))?
                .map(|p| (Arc::new(p), Vec::new()))
        };
        let too_long = matches!(
            &result,
            Err(ServiceError::Engine(
                gyre_engine::EngineError::ContextTooLong { .. }
                    | gyre_engine::EngineError::ExceedsKvCapacity { .. }
            ))
        );
        if auto && too_long && items.len() > 1 {
            items.remove(0);
            continue;
        }
        if submit.is_none()
            && let Ok((p, _)) = &result
        {
            // Counting only: the same limit the engine would apply.
            let max = p.model.engine.info().max_model_len as usize;
            if auto && p.engine_req.prompt.len() >= max && items.len() > 1 {
                items.remove(0);
                continue;
            }
        }
        return result.map_err(render::remap);
    }
}

/// What OpenAI echoes of a request: its settings, without the input.
fn echo(r: &CreateResponseRequest, p: &Prepared) -> CreateResponseRequest {
    let d = &p.model.engine.info().default_sampling;
    let mut e = r.clone();
    e.input = None;
    e.model = p.model.id.clone();
    e.temperature = Some(r.temperature.unwrap_or(d.temperature));
    e.top_p = Some(r.top_p.unwrap_or(d.top_p));
    e.parallel_tool_calls = Some(r.parallel_tool_calls.unwrap_or(true));
    e.store = Some(r.store.unwrap_or(true));
    e.background = Some(r.background.unwrap_or(false));
    e.truncation = Some(r.truncation.clone().unwrap_or_else(|| "disabled".into()));
    e.service_tier = Some(match r.service_tier.as_deref() {
        None | Some("auto") => "default".into(),
        Some(t) => t.to_string(),
    });
    e
}

/// Starts a response; its live state, to subscribe to.
pub async fn start(
    generation: &GenerationService,
    store: &Arc<Store>,
    registry: &Arc<Registry>,
    r: CreateResponseRequest,
    tenant: &Tenant,
    obs: &Arc<RequestObs>,
) -> Result<Arc<Live>, ServiceError> {
    let resolved = resolve(store, &r, tenant).await?;
    let id = ids::new("resp");
    obs.describe("chat", &r.model, &id);
    let (p, mut choices) = prepare(generation, &id, &r, &resolved, Some(tenant)).await?;
    obs.prepared(&p.model.id, &p);
    let background = r.background.unwrap_or(false);
    let stored = r.store.unwrap_or(true);
    let resp = Response {
        id: id.clone(),
        created_at: now(),
        status: if background { "queued" } else { "in_progress" }.into(),
        model: p.model.id.clone(),
        request: Some(echo(&r, &p)),
        ..Default::default()
    };
    let opts = Options {
        logprobs: r.include.iter().any(|i| i == validate::INCLUDE_LOGPROBS),
        max_tool_calls: render::call_limit(&r),
    };
    let mut b = Builder::new(resp, opts);
    let first = b.created();
    if stored {
        let (resp, input, events) = (b.response().clone(), resolved.input.clone(), first.clone());
        let prev = r.previous_response_id.clone();
        let who = tenant.name.clone();
        blocking(store, move |s| {
            s.insert_response(&resp, prev.as_deref(), &input, &events, &who)
        })
        .await?;
    }
    let live = Live::new(
        first.clone(),
        b.response().clone(),
        background,
        tenant.name.clone(),
    );
    if stored {
        registry.insert(&id, live.clone());
    }
    let (out, rx) = mpsc::channel(STREAM_BUFFER);
    let cancel = live.cancel.subscribe();
    let choice = choices.pop().into_iter().collect();
    GenerationService::spawn_choices(
        &id,
        p,
        choice,
        &out,
        &cancel,
        Mode::Single,
        None,
        Some(obs.clone()),
    );
    drop(out);
    let conversation = match (&r.conversation, stored) {
        (Some(c), true) => Some((c.clone(), resolved.input)),
        _ => None,
    };
    let task = Task {
        live: live.clone(),
        builder: b,
        store: stored.then(|| store.clone()),
        registry: registry.clone(),
        conversation,
    };
    tokio::spawn(task.run(rx));
    Ok(live)
}

/// The task of one response.
struct Task {
    live: Arc<Live>,
    builder: Builder,
    store: Option<Arc<Store>>,
    registry: Arc<Registry>,
    /// The conversation to append the input (and then the output) to.
    conversation: Option<(String, Vec<Item>)>,
}

impl Task {
    async fn run(mut self, mut rx: mpsc::Receiver<Result<v1::GenerateResponse, tonic::Status>>) {
        let mut all: Vec<v1::ResponseEvent> = Vec::new();
        let evs = self.builder.in_progress();
        self.publish(&mut all, evs);
        loop {
            let evs = match rx.recv().await {
                Some(Ok(m)) => match m.event {
                    Some(GenEv::Delta(d)) => self.builder.delta(&d),
                    Some(GenEv::Finish(f)) => self.builder.finish(&f, now()),
                    _ => continue,
                },
                Some(Err(status)) => self.builder.fail("server_error", status.message()),
                None if *self.live.cancel.borrow() => {
                    self.builder.cancel();
                    Vec::new()
                }
                None => self
                    .builder
                    .fail("server_error", "the generation ended without finishing"),
            };
            self.publish(&mut all, evs);
            if self.builder.ended() {
                break;
            }
        }
        self.save(all).await;
        self.live.finish();
        self.registry.remove(&self.builder.response().id);
    }

    fn publish(&mut self, all: &mut Vec<v1::ResponseEvent>, evs: Vec<v1::ResponseEvent>) {
        all.extend(evs.iter().cloned());
        self.live.push(evs, self.builder.response());
    }

    /// Stores the final response and its events (and extends the
    /// conversation) in one transaction.
    async fn save(&mut self, events: Vec<v1::ResponseEvent>) {
        let Some(store) = self.store.clone() else {
            return;
        };
        let resp = self.builder.response().clone();
        let conversation = self.conversation.take().map(|(c, mut items)| {
            items.extend(resp.output.iter().cloned());
            (c, items)
        });
        let id = resp.id.clone();
        let r = blocking(&store, move |s| {
            s.update_response(
                &resp,
                &events,
                conversation
                    .as_ref()
                    .map(|(c, i)| (c.as_str(), i.as_slice())),
            )
        })
        .await;
        if let Err(e) = r {
            tracing::error!(response_id = %id, error = %e, "could not store the response");
        }
    }
}
