//! The bidirectional `Generate` call: many requests multiplexed on one
//! stream.
//!
//! - Ids: a request's id is taken from its `start` until its last `finish`
//!   is handed to the transport (so a client that has seen the finish may
//!   reuse the id at once). A `start` with an empty or taken id starts
//!   nothing and is answered by a `rejected` event, never a finish, so the
//!   running request of that id keeps its one finish per choice.
//! - `cancel` sets the request's switch; the id stays taken until the
//!   request's CANCELLED finishes are out.
//! - When the client's side breaks (a message that does not decode, one
//!   over the size limit, or the client gone), the call ends at once with
//!   that status (INVALID_ARGUMENT for malformed protobuf; never OK) and
//!   every request still running is cancelled, without further events.
//! - Each started request has its own record (`observe`): a
//!   `gyre::request` log line under its own id and, traced, a span under
//!   the call's `traceparent`.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use futures::Stream;
use gyre_api::v1::{
    self, Cancel, GenerateRequest, GenerateResponse, generate_request::Action,
    generate_response::Event as Ev,
};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tonic::{Status, Streaming};

use crate::error::ServiceError;
use crate::grpc::{
    EventStream, GenerationService, Mode, Out, STREAM_BUFFER, Tag, fail, request_error,
};
use crate::observe::RequestObs;
use crate::tenant::Tenant;

/// Serves one `Generate` call: reads the client's messages in a task of its
/// own and returns the call's response stream.
pub(crate) fn serve(
    svc: GenerationService,
    inbound: Streaming<GenerateRequest>,
    deadline: Option<Instant>,
    tenant: Tenant,
    parent: Option<opentelemetry::Context>,
) -> EventStream {
    let (out, rx) = mpsc::channel(STREAM_BUFFER);
    let (abort_tx, abort_rx) = oneshot::channel();
    let ids = Arc::new(Ids::default());
    let call = Call {
        deadline,
        tenant,
        parent,
    };
    tokio::spawn(read_client(svc, inbound, out, abort_tx, ids.clone(), call));
    Box::pin(Outbound {
        rx,
        abort: Some(abort_rx),
        ids,
        done: false,
    })
}

/// What every request of one call shares.
struct Call {
    /// From the call's `grpc-timeout`.
    deadline: Option<Instant>,
    tenant: Tenant,
    /// The call's trace context (tracing on).
    parent: Option<opentelemetry::Context>,
}

const METHOD: &str = "gyre.v1.Generation/Generate";

/// The client's messages, until it half-closes or its side breaks.
async fn read_client(
    svc: GenerationService,
    mut inbound: Streaming<GenerateRequest>,
    out: Out,
    abort: oneshot::Sender<Status>,
    ids: Arc<Ids>,
    call: Call,
) {
    loop {
        let msg = match inbound.message().await {
            Ok(Some(m)) => m,
            // Half-close: started requests run to their end, and the
            // response stream ends when the last of them drops `out`.
            Ok(None) => return,
            Err(status) => {
                tracing::info!(status = %status, "Generate call ended by its client's side");
                let _ = abort.send(status);
                ids.cancel_all();
                return;
            }
        };
        match msg.action {
            Some(Action::Start(req)) => start(&svc, req, &out, &ids, &call).await,
            Some(Action::Cancel(Cancel { request_id })) => ids.cancel(&request_id),
            None => {}
        }
    }
}

/// Takes the request's id and runs it, or answers `rejected`.
async fn start(svc: &GenerationService, req: v1::Request, out: &Out, ids: &Arc<Ids>, call: &Call) {
    let tag = Tag {
        obs: None,
        id: req.request_id.clone(),
        index: 0,
    };
    let claimed = if tag.id.is_empty() {
        Err(ServiceError::invalid(
            "start.request_id",
            "EMPTY_REQUEST_ID",
            "request_id must not be empty on the Generate stream",
        ))
    } else {
        ids.claim(&tag.id)
            .ok_or_else(|| ServiceError::DuplicateRequestId(tag.id.clone()))
    };
    let cancel = match claimed {
        Ok(c) => c,
        Err(e) => {
            let rejected = GenerateResponse {
                request_id: tag.id,
                index: 0,
                event: Some(Ev::Rejected(v1::Rejected {
                    error: Some(request_error(&e)),
                })),
            };
            let _ = out.send(Ok(rejected)).await;
            return;
        }
    };
    let (svc, out, ids, tenant) = (svc.clone(), out.clone(), ids.clone(), call.tenant.clone());
    let deadline = call.deadline;
    let obs = RequestObs::child(
        tag.id.clone(),
        tenant.name.clone(),
        call.parent.clone(),
        METHOD,
    );
    obs.request(&req);
    tokio::spawn(async move {
        match svc.prepare_entry(req, &tenant).await {
            Ok((p, choices, entry)) => {
                obs.prepared(&entry.card.id, &p);
                ids.expect_finishes(&tag.id, choices.len());
                GenerationService::spawn_choices(
                    &tag.id,
                    p,
                    choices,
                    &out,
                    &cancel,
                    Mode::Multiplexed,
                    deadline,
                    Some(Arc::new(obs)),
                )
            }
            Err(e) => {
                obs.failed_with(&e);
                drop(obs);
                fail(&tag, &out, Mode::Multiplexed, e).await
            }
        }
    });
}

/// A running request of the call.
struct Running {
    /// Set to cancel; every choice's task watches it.
    cancel: watch::Sender<bool>,
    /// Finishes still to send: None until the request is prepared (then a
    /// failure's single finish would end it), then one per choice.
    open: Option<usize>,
}

/// The running requests of one call, by id.
#[derive(Default)]
struct Ids(Mutex<HashMap<String, Running>>);

impl Ids {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Running>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes `id` for a new request: its cancel switch, or None when a
    /// running request has it.
    fn claim(&self, id: &str) -> Option<watch::Receiver<bool>> {
        let mut map = self.lock();
        if map.contains_key(id) {
            return None;
        }
        let (cancel, rx) = watch::channel(false);
        map.insert(id.to_string(), Running { cancel, open: None });
        Some(rx)
    }

    fn expect_finishes(&self, id: &str, n: usize) {
        if let Some(r) = self.lock().get_mut(id) {
            r.open = Some(n);
        }
    }

    /// A finish of `id` is going out: the last one frees the id.
    fn finished(&self, id: &str) {
        let mut map = self.lock();
        if let Some(r) = map.get_mut(id) {
            match r.open {
                Some(k) if k > 1 => r.open = Some(k - 1),
                _ => {
                    map.remove(id);
                }
            }
        }
    }

    /// Unknown or finished ids are ignored.
    fn cancel(&self, id: &str) {
        if let Some(r) = self.lock().get(id) {
            r.cancel.send_replace(true);
        }
    }

    fn cancel_all(&self) {
        for r in self.lock().values() {
            r.cancel.send_replace(true);
        }
    }
}

/// The call's response stream: the requests' events in order, each finish
/// freeing its id as it goes out; or, once the client's side broke, that
/// status and the end.
struct Outbound {
    rx: mpsc::Receiver<Result<GenerateResponse, Status>>,
    abort: Option<oneshot::Receiver<Status>>,
    ids: Arc<Ids>,
    done: bool,
}

impl Stream for Outbound {
    type Item = Result<GenerateResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        if let Some(abort) = this.abort.as_mut() {
            match Pin::new(abort).poll(cx) {
                Poll::Ready(Ok(status)) => {
                    this.done = true;
                    return Poll::Ready(Some(Err(status)));
                }
                // The reader ended normally (half-close).
                Poll::Ready(Err(_)) => this.abort = None,
                Poll::Pending => {}
            }
        }
        let item = std::task::ready!(this.rx.poll_recv(cx));
        if let Some(Ok(GenerateResponse {
            request_id,
            event: Some(Ev::Finish(_)),
            ..
        })) = &item
        {
            this.ids.finished(request_id);
        }
        Poll::Ready(item)
    }
}
