//! gyre.v1.Responses: OpenAI's Responses API over the same generation and
//! output pipeline as chat, with a durable store.
//!
//! - `validate`: the request checks the proto's types cannot make;
//! - `render`: items and settings to the chat path's `v1::Request`;
//! - `events`: the event builder (pipeline pieces to numbered events);
//! - `live`: responses running in this process and their subscribers;
//! - `run`: creating a response and the task that drives it;
//! - `store`: the SQLite store of responses and conversations.

mod events;
mod live;
mod render;
mod run;
pub mod store;
mod store_sql;
mod validate;

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use gyre_api::v1::{
    self, CancelResponseRequest, Conversation, CreateConversationRequest, CreateResponseRequest,
    DeleteConversationRequest, DeleteConversationResult, DeleteResponseRequest,
    DeleteResponseResult, GetConversationRequest, GetResponseRequest, InputTokenCount, ItemList,
    ListConversationItemsRequest, ListInputItemsRequest, ReplayResponseRequest, ResponseEvent,
    responses_server::Responses,
};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::error::ServiceError;
use crate::grpc::GenerationService;
use crate::observe::RequestObs;
use crate::tenant::Tenant;
use live::Registry;
pub use store::{Store, StoreConfig, StoreError};

/// Most items a conversation may be created with.
const MAX_CONVERSATION_ITEMS: usize = 20;

/// Fresh ids: `prefix_` and 32 hex digits.
pub(crate) mod ids {
    pub fn new(prefix: &str) -> String {
        format!("{prefix}_{:032x}", rand::random::<u128>())
    }
}

/// Runs a store call on a blocking thread.
pub(crate) async fn blocking<T: Send + 'static>(
    store: &Arc<Store>,
    f: impl FnOnce(&Store) -> Result<T, StoreError> + Send + 'static,
) -> Result<T, ServiceError> {
    let s = store.clone();
    tokio::task::spawn_blocking(move || f(&s))
        .await
        .map_err(|e| ServiceError::Internal(e.to_string()))?
        .map_err(|e| ServiceError::Internal(e.to_string()))
}

type EventStream = Pin<Box<dyn Stream<Item = Result<ResponseEvent, Status>> + Send>>;

/// The `Responses` service.
#[derive(Clone)]
pub struct ResponsesService {
    generation: GenerationService,
    store: Arc<Store>,
    registry: Arc<Registry>,
}

impl ResponsesService {
    pub fn new(generation: GenerationService, store: Arc<Store>) -> Self {
        Self {
            generation,
            store,
            registry: Arc::default(),
        }
    }

    fn not_found(field: &str, what: &str, id: &str) -> ServiceError {
        ServiceError::NotFound {
            field: field.into(),
            message: format!("no {what} with id `{}`", gyre_api::clip(id)),
        }
    }

    /// A stored response of `tenant` (unknown when another tenant's).
    async fn stored(&self, id: &str, tenant: &Tenant) -> Result<v1::Response, ServiceError> {
        let (key, who) = (id.to_string(), tenant.name.clone());
        blocking(&self.store, move |s| s.get_response(&key, &who))
            .await?
            .map(|s| s.response)
            .ok_or_else(|| Self::not_found("response_id", "stored response", id))
    }

    async fn page(
        &self,
        of: store::Owner,
        after: Option<String>,
        limit: Option<u32>,
        order: Option<String>,
    ) -> Result<ItemList, ServiceError> {
        let limit = limit.unwrap_or(20);
        if !(1..=100).contains(&limit) {
            return Err(ServiceError::invalid(
                "limit",
                "OUT_OF_RANGE",
                format!("limit must be in [1, 100], got {limit}"),
            ));
        }
        let desc = match order.as_deref() {
            None | Some("desc") => true,
            Some("asc") => false,
            Some(o) => {
                return Err(ServiceError::invalid(
                    "order",
                    "INVALID_VALUE",
                    format!("order must be asc or desc, got {:?}", gyre_api::clip(o)),
                ));
            }
        };
        let cursor = after.clone();
        let page = blocking(&self.store, move |s| {
            s.page(&of, cursor.as_deref(), limit, desc)
        })
        .await?;
        let Some((data, has_more)) = page else {
            return Err(ServiceError::invalid(
                "after",
                "UNKNOWN_CURSOR",
                format!(
                    "after names no item of this list: `{}`",
                    gyre_api::clip(after.as_deref().unwrap_or(""))
                ),
            ));
        };
        Ok(ItemList { data, has_more })
    }
}

#[tonic::async_trait]
impl Responses for ResponsesService {
    type CreateStream = EventStream;
    type ReplayStream = EventStream;

    async fn create(
        &self,
        request: Request<CreateResponseRequest>,
    ) -> Result<Response<Self::CreateStream>, Status> {
        let tenant = Tenant::of(&request);
        let generation = self.generation.for_request(&request);
        // Logged (and traced) when the response's generation ends, or here
        // when it fails to start.
        let obs = Arc::new(RequestObs::start(&request, "gyre.v1.Responses/Create"));
        let r = request.into_inner();
        obs.describe("chat", &r.model, "");
        let started = run::start(&generation, &self.store, &self.registry, r, &tenant, &obs).await;
        let live = started.inspect_err(|e| obs.failed_with(e))?;
        let cancel_on_drop = !live.background;
        let rx = live.subscribe(None, cancel_on_drop);
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn get(
        &self,
        request: Request<GetResponseRequest>,
    ) -> Result<Response<v1::Response>, Status> {
        let tenant = Tenant::of(&request);
        let id = request.into_inner().response_id;
        if let Some(live) = self.registry.get(&id, &tenant.name) {
            return Ok(Response::new(live.snapshot()));
        }
        Ok(Response::new(self.stored(&id, &tenant).await?))
    }

    async fn replay(
        &self,
        request: Request<ReplayResponseRequest>,
    ) -> Result<Response<Self::ReplayStream>, Status> {
        let tenant = Tenant::of(&request);
        let r = request.into_inner();
        if let Some(live) = self.registry.get(&r.response_id, &tenant.name) {
            let rx = live.subscribe(r.starting_after, false);
            return Ok(Response::new(Box::pin(ReceiverStream::new(rx))));
        }
        self.stored(&r.response_id, &tenant).await?;
        let (id, after) = (r.response_id.clone(), r.starting_after);
        let events = blocking(&self.store, move |s| s.events_after(&id, after)).await?;
        let stream = futures::stream::iter(events.into_iter().map(Ok));
        Ok(Response::new(Box::pin(stream)))
    }

    async fn delete(
        &self,
        request: Request<DeleteResponseRequest>,
    ) -> Result<Response<DeleteResponseResult>, Status> {
        let tenant = Tenant::of(&request);
        let id = request.into_inner().response_id;
        if let Some(live) = self.registry.get(&id, &tenant.name) {
            live.cancel.send_replace(true);
            live.ended().await;
        }
        let (key, who) = (id.clone(), tenant.name.clone());
        if !blocking(&self.store, move |s| s.delete_response(&key, &who)).await? {
            return Err(Self::not_found("response_id", "stored response", &id).into());
        }
        Ok(Response::new(DeleteResponseResult { id, deleted: true }))
    }

    async fn cancel(
        &self,
        request: Request<CancelResponseRequest>,
    ) -> Result<Response<v1::Response>, Status> {
        let tenant = Tenant::of(&request);
        let id = request.into_inner().response_id;
        let not_background = || ServiceError::Unservable {
            field: "response_id".into(),
            reason: "NOT_BACKGROUND",
            message: "only background responses can be cancelled".into(),
        };
        if let Some(live) = self.registry.get(&id, &tenant.name) {
            if !live.background {
                return Err(not_background().into());
            }
            live.cancel.send_replace(true);
            return Ok(Response::new(live.ended().await));
        }
        let resp = self.stored(&id, &tenant).await?;
        if resp.request.as_ref().and_then(|r| r.background) != Some(true) {
            return Err(not_background().into());
        }
        Ok(Response::new(resp))
    }

    async fn list_input_items(
        &self,
        request: Request<ListInputItemsRequest>,
    ) -> Result<Response<ItemList>, Status> {
        let tenant = Tenant::of(&request);
        let r = request.into_inner();
        self.stored(&r.response_id, &tenant).await?;
        let of = store::Owner::Response(r.response_id);
        Ok(Response::new(
            self.page(of, r.after, r.limit, r.order).await?,
        ))
    }

    async fn count_input_tokens(
        &self,
        request: Request<CreateResponseRequest>,
    ) -> Result<Response<InputTokenCount>, Status> {
        let tenant = Tenant::of(&request);
        let r = request.into_inner();
        let resolved = run::resolve(&self.store, &r, &tenant).await?;
        let (p, _) = run::prepare(&self.generation, "count", &r, &resolved, None).await?;
        Ok(Response::new(InputTokenCount {
            input_tokens: p.engine_req.prompt.len() as u32,
        }))
    }

    async fn create_conversation(
        &self,
        request: Request<CreateConversationRequest>,
    ) -> Result<Response<Conversation>, Status> {
        let tenant = Tenant::of(&request);
        let r = request.into_inner();
        if r.items.len() > MAX_CONVERSATION_ITEMS {
            return Err(ServiceError::invalid(
                "items",
                "TOO_MANY_ITEMS",
                format!("a conversation starts with at most {MAX_CONVERSATION_ITEMS} items"),
            )
            .into());
        }
        validate::metadata(&r.metadata)?;
        let mut items = r.items;
        validate::unique_ids("items", &[], &items)?;
        for (i, it) in items.iter_mut().enumerate() {
            validate::item(&format!("items[{i}]"), it)?;
            if it.id.is_empty() {
                it.id = ids::new("in");
            }
            if it.status.is_empty() {
                it.status = "completed".into();
            }
        }
        let c = Conversation {
            id: ids::new("conv"),
            created_at: store::now(),
            metadata: r.metadata,
        };
        let (stored, who) = (c.clone(), tenant.name.clone());
        blocking(&self.store, move |s| {
            s.insert_conversation(&stored, &items, &who)
        })
        .await?;
        Ok(Response::new(c))
    }

    async fn get_conversation(
        &self,
        request: Request<GetConversationRequest>,
    ) -> Result<Response<Conversation>, Status> {
        let tenant = Tenant::of(&request);
        let id = request.into_inner().conversation_id;
        let (key, who) = (id.clone(), tenant.name.clone());
        let c = blocking(&self.store, move |s| s.get_conversation(&key, &who))
            .await?
            .ok_or_else(|| Self::not_found("conversation_id", "conversation", &id))?;
        Ok(Response::new(c))
    }

    async fn delete_conversation(
        &self,
        request: Request<DeleteConversationRequest>,
    ) -> Result<Response<DeleteConversationResult>, Status> {
        let tenant = Tenant::of(&request);
        let id = request.into_inner().conversation_id;
        let (key, who) = (id.clone(), tenant.name.clone());
        if !blocking(&self.store, move |s| s.delete_conversation(&key, &who)).await? {
            return Err(Self::not_found("conversation_id", "conversation", &id).into());
        }
        Ok(Response::new(DeleteConversationResult {
            id,
            deleted: true,
        }))
    }

    async fn list_conversation_items(
        &self,
        request: Request<ListConversationItemsRequest>,
    ) -> Result<Response<ItemList>, Status> {
        let tenant = Tenant::of(&request);
        let r = request.into_inner();
        let (key, who) = (r.conversation_id.clone(), tenant.name.clone());
        if blocking(&self.store, move |s| s.get_conversation(&key, &who))
            .await?
            .is_none()
        {
            return Err(
                Self::not_found("conversation_id", "conversation", &r.conversation_id).into(),
            );
        }
        let of = store::Owner::Conversation(r.conversation_id);
        Ok(Response::new(
            self.page(of, r.after, r.limit, r.order).await?,
        ))
    }
}
