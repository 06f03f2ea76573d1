//! A fake in-process `gyre.v1.Responses` service on 127.0.0.1:0, for testing
//! the shim's `/v1/responses` and `/v1/conversations` routes without the
//! real service. Behaviour is picked by the request's `model` (Create) or
//! id (the other calls): "resp_known" / "conv_known" exist, any other id is
//! NOT_FOUND as the service answers it.
#![allow(dead_code)]

use gyre_api::v1 as pb;
use gyre_api::v1::response_event::Event;
use gyre_api::v1::responses_server::{Responses, ResponsesServer};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic::{Code, Request, Response, Status};
use tonic_types::{ErrorDetails, FieldViolation, StatusExt};

type Events = ReceiverStream<Result<pb::ResponseEvent, Status>>;

/// A running fake; dropping it stops the server.
pub struct FakeServer {
    pub endpoint: String,
    /// Every request the fake received, as its Debug text, in order.
    pub requests: mpsc::UnboundedReceiver<String>,
    /// Ids of responses whose `Create` call the client dropped.
    pub dropped: mpsc::UnboundedReceiver<String>,
    _shutdown: oneshot::Sender<()>,
}

struct Fake {
    requests: mpsc::UnboundedSender<String>,
    dropped: mpsc::UnboundedSender<String>,
}

/// Starts the fake on an OS-chosen loopback port.
pub async fn start() -> FakeServer {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("local addr");
    let (requests_tx, requests) = mpsc::unbounded_channel();
    let (dropped_tx, dropped) = mpsc::unbounded_channel();
    let fake = Fake {
        requests: requests_tx,
        dropped: dropped_tx,
    };
    let (shutdown, stop) = oneshot::channel::<()>();
    tokio::spawn(
        Server::builder()
            .add_service(ResponsesServer::new(fake))
            .serve_with_incoming_shutdown(TcpIncoming::from(listener), async {
                let _ = stop.await;
            }),
    );
    FakeServer {
        endpoint: format!("http://{addr}"),
        requests,
        dropped,
        _shutdown: shutdown,
    }
}

/// NOT_FOUND as the service sends it: reason "not_found", the field named.
pub fn not_found(field: &str) -> Status {
    let mut details = ErrorDetails::with_error_info(
        "not_found",
        "gyre",
        std::collections::HashMap::<String, String>::new(),
    );
    details.set_bad_request(vec![FieldViolation::new(field, "unknown id")]);
    Status::with_error_details(Code::NotFound, format!("No such {field}."), details)
}

/// INVALID_ARGUMENT naming `field`.
pub fn invalid(field: &str) -> Status {
    let details = ErrorDetails::with_bad_request(vec![FieldViolation::new(field, "bad")]);
    Status::with_error_details(Code::InvalidArgument, format!("{field} is bad."), details)
}

fn message(id: &str, status: &str, text: &str) -> pb::Item {
    pb::Item {
        id: id.into(),
        status: status.into(),
        item: Some(pb::item::Item::Message(pb::MessageItem {
            role: "assistant".into(),
            content: if status == "in_progress" {
                vec![]
            } else {
                vec![text_part(text)]
            },
        })),
    }
}

fn text_part(text: &str) -> pb::ContentPart {
    pb::ContentPart {
        part: Some(pb::content_part::Part::OutputText(pb::OutputText {
            text: text.into(),
            logprobs: vec![],
        })),
    }
}

/// A response in state `status`, with the message "Hello" once completed.
pub fn response(id: &str, status: &str, request: &pb::CreateResponseRequest) -> pb::Response {
    let done = status == "completed";
    pb::Response {
        id: id.into(),
        created_at: 1_700_000_000,
        completed_at: done.then_some(1_700_000_001),
        status: status.into(),
        model: "fake-model".into(),
        output: if done {
            vec![message("msg_1", "completed", "Hello")]
        } else {
            vec![]
        },
        incomplete_reason: None,
        error: None,
        usage: done.then_some(pb::ResponseUsage {
            input_tokens: 5,
            cached_tokens: 1,
            output_tokens: 2,
            reasoning_tokens: 0,
        }),
        request: Some(request.clone()),
    }
}

/// The events of a completed text response ("Hel" + "lo").
pub fn text_events(request: &pb::CreateResponseRequest) -> Vec<pb::ResponseEvent> {
    let part = |p: &str| pb::PartEvent {
        item_id: "msg_1".into(),
        output_index: 0,
        content_index: 0,
        part: Some(text_part(p)),
    };
    let delta = |d: &str| {
        Event::OutputTextDelta(pb::TextDelta {
            item_id: "msg_1".into(),
            output_index: 0,
            content_index: 0,
            delta: d.into(),
            logprobs: vec![],
        })
    };
    let item = |status: &str, text: &str| pb::ItemEvent {
        output_index: 0,
        item: Some(message("msg_1", status, text)),
    };
    let events = vec![
        Event::Created(response("resp_known", "in_progress", request)),
        Event::InProgress(response("resp_known", "in_progress", request)),
        Event::OutputItemAdded(item("in_progress", "")),
        Event::ContentPartAdded(part("")),
        delta("Hel"),
        delta("lo"),
        Event::OutputTextDone(pb::TextDone {
            item_id: "msg_1".into(),
            output_index: 0,
            content_index: 0,
            text: "Hello".into(),
            logprobs: vec![],
        }),
        Event::ContentPartDone(part("Hello")),
        Event::OutputItemDone(item("completed", "Hello")),
        Event::Completed(response("resp_known", "completed", request)),
    ];
    events
        .into_iter()
        .zip(0u64..)
        .map(|(event, n)| pb::ResponseEvent {
            sequence_number: n,
            event: Some(event),
        })
        .collect()
}

fn stream_of(events: Vec<Result<pb::ResponseEvent, Status>>) -> Response<Events> {
    let (tx, rx) = mpsc::channel(events.len().max(1));
    for event in events {
        tx.try_send(event).expect("channel sized for all events");
    }
    Response::new(ReceiverStream::new(rx))
}

fn list(n: usize) -> pb::ItemList {
    pb::ItemList {
        data: (0..n)
            .map(|i| message(&format!("in_{i}"), "completed", "x"))
            .collect(),
        has_more: false,
    }
}

#[tonic::async_trait]
impl Responses for Fake {
    type CreateStream = Events;
    type ReplayStream = Events;

    async fn create(
        &self,
        request: Request<pb::CreateResponseRequest>,
    ) -> Result<Response<Events>, Status> {
        let req = request.into_inner();
        let _ = self.requests.send(format!("{req:?}"));
        let ok = |e: Vec<pb::ResponseEvent>| e.into_iter().map(Ok).collect::<Vec<_>>();
        match req.model.as_str() {
            "bad" => Err(invalid("max_output_tokens")),
            "fail-mid" => {
                let mut events = ok(text_events(&req));
                events.truncate(5);
                events.push(Err(Status::internal("kaboom: secret")));
                Ok(stream_of(events))
            }
            "error-event" => {
                let mut events = ok(text_events(&req));
                events.truncate(2);
                events.push(Ok(pb::ResponseEvent {
                    sequence_number: 2,
                    event: Some(Event::Error(pb::StreamError {
                        code: "server_error".into(),
                        message: "the response could not be built".into(),
                        param: None,
                    })),
                }));
                Ok(stream_of(events))
            }
            // Background: queued, then nothing until the client goes away.
            "hang" => {
                let (tx, rx) = mpsc::channel(4);
                let dropped = self.dropped.clone();
                let queued = response("resp_bg", "queued", &req);
                tokio::spawn(async move {
                    for (n, event) in [Event::Created(queued.clone()), Event::Queued(queued)]
                        .into_iter()
                        .enumerate()
                    {
                        let event = pb::ResponseEvent {
                            sequence_number: n as u64,
                            event: Some(event),
                        };
                        let _ = tx.send(Ok(event)).await;
                    }
                    tx.closed().await;
                    let _ = dropped.send("resp_bg".to_owned());
                });
                Ok(Response::new(ReceiverStream::new(rx)))
            }
            _ => Ok(stream_of(ok(text_events(&req)))),
        }
    }

    async fn get(
        &self,
        request: Request<pb::GetResponseRequest>,
    ) -> Result<Response<pb::Response>, Status> {
        let req = request.into_inner();
        match req.response_id.as_str() {
            "resp_known" => Ok(Response::new(response(
                "resp_known",
                "completed",
                &Default::default(),
            ))),
            _ => Err(not_found("response_id")),
        }
    }

    async fn replay(
        &self,
        request: Request<pb::ReplayResponseRequest>,
    ) -> Result<Response<Events>, Status> {
        let req = request.into_inner();
        let _ = self.requests.send(format!("{req:?}"));
        if req.response_id != "resp_known" {
            return Err(not_found("response_id"));
        }
        let events = text_events(&Default::default())
            .into_iter()
            .filter(|e| req.starting_after.is_none_or(|n| e.sequence_number > n))
            .map(Ok)
            .collect();
        Ok(stream_of(events))
    }

    async fn delete(
        &self,
        request: Request<pb::DeleteResponseRequest>,
    ) -> Result<Response<pb::DeleteResponseResult>, Status> {
        let req = request.into_inner();
        match req.response_id.as_str() {
            "resp_known" => Ok(Response::new(pb::DeleteResponseResult {
                id: req.response_id,
                deleted: true,
            })),
            _ => Err(not_found("response_id")),
        }
    }

    async fn cancel(
        &self,
        request: Request<pb::CancelResponseRequest>,
    ) -> Result<Response<pb::Response>, Status> {
        let req = request.into_inner();
        match req.response_id.as_str() {
            "resp_known" => Ok(Response::new(response(
                "resp_known",
                "cancelled",
                &Default::default(),
            ))),
            _ => Err(Status::failed_precondition(
                "Only background responses can be cancelled.",
            )),
        }
    }

    async fn list_input_items(
        &self,
        request: Request<pb::ListInputItemsRequest>,
    ) -> Result<Response<pb::ItemList>, Status> {
        let req = request.into_inner();
        let _ = self.requests.send(format!("{req:?}"));
        if req.limit == Some(0) {
            return Err(invalid("limit"));
        }
        Ok(Response::new(list(2)))
    }

    async fn count_input_tokens(
        &self,
        request: Request<pb::CreateResponseRequest>,
    ) -> Result<Response<pb::InputTokenCount>, Status> {
        let _ = self.requests.send(format!("{:?}", request.get_ref()));
        Ok(Response::new(pb::InputTokenCount { input_tokens: 42 }))
    }

    async fn create_conversation(
        &self,
        request: Request<pb::CreateConversationRequest>,
    ) -> Result<Response<pb::Conversation>, Status> {
        let req = request.into_inner();
        let _ = self.requests.send(format!("{req:?}"));
        Ok(Response::new(pb::Conversation {
            id: "conv_known".into(),
            created_at: 1_700_000_000,
            metadata: req.metadata,
        }))
    }

    async fn get_conversation(
        &self,
        request: Request<pb::GetConversationRequest>,
    ) -> Result<Response<pb::Conversation>, Status> {
        match request.into_inner().conversation_id.as_str() {
            "conv_known" => Ok(Response::new(pb::Conversation {
                id: "conv_known".into(),
                created_at: 1_700_000_000,
                metadata: Default::default(),
            })),
            _ => Err(not_found("conversation_id")),
        }
    }

    async fn delete_conversation(
        &self,
        request: Request<pb::DeleteConversationRequest>,
    ) -> Result<Response<pb::DeleteConversationResult>, Status> {
        let id = request.into_inner().conversation_id;
        match id.as_str() {
            "conv_known" => Ok(Response::new(pb::DeleteConversationResult {
                id,
                deleted: true,
            })),
            _ => Err(not_found("conversation_id")),
        }
    }

    async fn list_conversation_items(
        &self,
        request: Request<pb::ListConversationItemsRequest>,
    ) -> Result<Response<pb::ItemList>, Status> {
        let req = request.into_inner();
        let _ = self.requests.send(format!("{req:?}"));
        match req.conversation_id.as_str() {
            "conv_known" => Ok(Response::new(list(3))),
            _ => Err(not_found("conversation_id")),
        }
    }
}
