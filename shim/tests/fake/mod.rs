//! A fake in-process `gyre.v1.Generation` service on 127.0.0.1:0 whose
//! behaviour is picked by the request's `model`, for testing the shim's
//! router end to end without an engine.
#![allow(dead_code)]

use gyre_api::v1 as pb;
use gyre_api::v1::generate_response::Event;
use gyre_api::v1::generation_server::{Generation, GenerationServer};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataMap;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic::{Code, Request, Response, Status};
use tonic_types::{ErrorDetails, FieldViolation, StatusExt};

type Events = ReceiverStream<Result<pb::GenerateResponse, Status>>;

/// What the fake saw and did.
pub struct Observed {
    /// Every GenerateStream request with its metadata, in arrival order.
    pub requests: mpsc::UnboundedReceiver<(MetadataMap, pb::Request)>,
    /// Ids of "hang" requests whose client went away.
    pub cancelled: mpsc::UnboundedReceiver<String>,
}

/// A running fake; dropping it stops the server.
pub struct FakeServer {
    pub endpoint: String,
    pub observed: Observed,
    _shutdown: oneshot::Sender<()>,
}

struct Fake {
    requests: mpsc::UnboundedSender<(MetadataMap, pb::Request)>,
    cancelled: mpsc::UnboundedSender<String>,
}

/// Starts the fake on an OS-chosen loopback port.
pub async fn start() -> FakeServer {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("local addr");
    let (requests_tx, requests) = mpsc::unbounded_channel();
    let (cancelled_tx, cancelled) = mpsc::unbounded_channel();
    let fake = Fake {
        requests: requests_tx,
        cancelled: cancelled_tx,
    };
    let (shutdown, stop) = oneshot::channel::<()>();
    tokio::spawn(
        Server::builder()
            .add_service(GenerationServer::new(fake))
            .serve_with_incoming_shutdown(TcpIncoming::from(listener), async {
                let _ = stop.await;
            }),
    );
    FakeServer {
        endpoint: format!("http://{addr}"),
        observed: Observed {
            requests,
            cancelled,
        },
        _shutdown: shutdown,
    }
}

fn delta(id: &str, text: &str) -> Result<pb::GenerateResponse, Status> {
    Ok(pb::GenerateResponse {
        index: 0,
        request_id: id.to_owned(),
        event: Some(Event::Delta(pb::Delta {
            text: text.to_owned(),
            token_ids: vec![7],
            ..Default::default()
        })),
    })
}

fn finish(
    id: &str,
    reason: pb::FinishReason,
    error: Option<pb::RequestError>,
) -> Result<pb::GenerateResponse, Status> {
    Ok(pb::GenerateResponse {
        index: 0,
        request_id: id.to_owned(),
        event: Some(Event::Finish(pb::Finish {
            reason: reason as i32,
            usage: Some(pb::Usage {
                prompt_tokens: 5,
                completion_tokens: 3,
                cached_tokens: 2,
                ..Default::default()
            }),
            error,
            ..Default::default()
        })),
    })
}

#[tonic::async_trait]
impl Generation for Fake {
    type GenerateStream = Events;
    type GenerateStreamStream = Events;

    async fn generate(
        &self,
        _request: Request<tonic::Streaming<pb::GenerateRequest>>,
    ) -> Result<Response<Events>, Status> {
        Err(Status::unimplemented("fake"))
    }

    async fn generate_stream(
        &self,
        request: Request<pb::Request>,
    ) -> Result<Response<Events>, Status> {
        let (metadata, _, req) = request.into_parts();
        let _ = self.requests.send((metadata, req.clone()));
        let id = req.request_id.clone();
        let events: Vec<Result<pb::GenerateResponse, Status>> = match req.model.as_str() {
            // Worded unlike the service: the shim restates every unknown
            // model in one format.
            m if m.starts_with("missing") => {
                return Err(Status::not_found("model is not served here"));
            }
            "bad-temp" => {
                let details = ErrorDetails::with_bad_request(vec![FieldViolation::new(
                    "sampling.temperature",
                    "must be in [0, 2]",
                )]);
                return Err(Status::with_error_details(
                    Code::InvalidArgument,
                    "temperature must be in [0, 2]",
                    details,
                ));
            }
            "busy" => return Err(Status::resource_exhausted("queue full")),
            // "code-N": the call fails with gRPC code N (see the status table test).
            m if m.starts_with("code-") => {
                let n: i32 = m["code-".len()..].parse().unwrap_or(2);
                return Err(Status::new(Code::from(n), "failed as asked"));
            }
            "draining" => return Err(Status::unavailable("draining: secret internals")),
            "long" => vec![
                delta(&id, "abc"),
                finish(&id, pb::FinishReason::Length, None),
            ],
            "fail-mid" => vec![
                delta(&id, "partial"),
                Err(Status::internal("kaboom: secret")),
            ],
            "fail-first" => vec![Err(Status::resource_exhausted("no KV blocks left"))],
            "fail-finish" => vec![finish(
                &id,
                pb::FinishReason::Error,
                Some(pb::RequestError {
                    code: Code::InvalidArgument as i32,
                    message: "prompt is too long".into(),
                    reason: "PROMPT_TOO_LONG".into(),
                    field: "chat".into(),
                }),
            )],
            "hang" => {
                let (tx, rx) = mpsc::channel(4);
                let cancelled = self.cancelled.clone();
                tokio::spawn(async move {
                    let _ = tx.send(delta(&id, "partial")).await;
                    tx.closed().await;
                    let _ = cancelled.send(id);
                });
                return Ok(Response::new(ReceiverStream::new(rx)));
            }
            _ => vec![
                delta(&id, "Hel"),
                delta(&id, ""),
                delta(&id, "lo"),
                delta(&id, " world"),
                finish(&id, pb::FinishReason::Stop, None),
            ],
        };
        let (tx, rx) = mpsc::channel(events.len().max(1));
        for event in events {
            tx.try_send(event).expect("channel sized for all events");
        }
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn tokenize(
        &self,
        request: Request<pb::TokenizeRequest>,
    ) -> Result<Response<pb::TokenizeResponse>, Status> {
        if request.get_ref().model.starts_with("missing") {
            return Err(Status::not_found("no such model here"));
        }
        Ok(Response::new(pb::TokenizeResponse {
            token_ids: vec![1, 2, 3],
            max_model_len: 2048,
            ..Default::default()
        }))
    }

    async fn detokenize(
        &self,
        _: Request<pb::DetokenizeRequest>,
    ) -> Result<Response<pb::DetokenizeResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }

    async fn get_stats(
        &self,
        _: Request<pb::GetStatsRequest>,
    ) -> Result<Response<pb::EngineStats>, Status> {
        Err(Status::unimplemented("fake"))
    }

    async fn list_models(
        &self,
        _: Request<pb::ListModelsRequest>,
    ) -> Result<Response<pb::ListModelsResponse>, Status> {
        let model = |id: &str| pb::Model {
            id: id.to_owned(),
            owned_by: "gyre".into(),
            created: 1_700_000_000,
            max_model_len: 2048,
            vocab_size: 32000,
            architecture: "LlamaForCausalLM".into(),
            ..Default::default()
        };
        Ok(Response::new(pb::ListModelsResponse {
            models: vec![model("tiny/llama"), model("echo-model")],
        }))
    }
}
