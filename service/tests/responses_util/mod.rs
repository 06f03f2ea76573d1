//! What the Responses tests share: a real server on loopback (the routes of
//! `gyre_service::server`, a tiny fixture model, a store), a client, and
//! helpers over event streams.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use gyre_api::v1::responses_client::ResponsesClient;
use gyre_api::v1::{
    self, CreateResponseRequest, ResponseEvent, create_response_request::Input,
    response_event::Event as Ev,
};
use gyre_engine::{DeviceChoice, EngineOptions};
use gyre_service::responses::{Store, StoreConfig};
use gyre_service::runtime::ModelRuntime;
use tokio::net::TcpListener;
use tonic::transport::Channel;

#[path = "../common/mod.rs"]
mod common;

pub fn model_dir() -> PathBuf {
    std::env::var_os("GYRE_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.gyre/models"))
        .join("tiny-qwen2")
}

pub struct Server {
    pub addr: SocketAddr,
    pub store: Arc<Store>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Server {
    pub async fn start(cfg: StoreConfig) -> Self {
        let mut opts = EngineOptions::new(model_dir());
        opts.device = DeviceChoice::Cpu;
        let rt =
            tokio::task::spawn_blocking(move || ModelRuntime::load(opts, None, Default::default()))
                .await
                .expect("join")
                .expect("model loads (build fixtures with `make models`)");
        let store = Arc::new(Store::open(cfg).expect("store opens"));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(common::serve_grpc_with_store(
            listener,
            vec![Arc::new(rt)],
            store.clone(),
            async {
                let _ = stop_rx.await;
            },
        ));
        Self {
            addr,
            store,
            stop: Some(stop_tx),
            task,
        }
    }

    pub async fn client(&self) -> ResponsesClient<Channel> {
        ResponsesClient::connect(format!("http://{}", self.addr))
            .await
            .expect("connect")
    }

    pub async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.addr))
            .expect("uri")
            .connect()
            .await
            .expect("connect")
    }

    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        self.task.await.expect("join").expect("server ran");
    }
}

/// A text request, greedy, at most `max` tokens.
pub fn text(t: &str, max: u32) -> CreateResponseRequest {
    CreateResponseRequest {
        input: Some(Input::Text(t.into())),
        max_output_tokens: Some(max),
        temperature: Some(0.0),
        ..Default::default()
    }
}

/// Every event of a stream, to its end.
pub async fn collect(mut s: tonic::Streaming<ResponseEvent>) -> Vec<ResponseEvent> {
    let mut out = Vec::new();
    while let Some(e) = s.message().await.expect("stream stays healthy") {
        out.push(e);
    }
    out
}

pub fn kind(e: &ResponseEvent) -> &'static str {
    match e.event.as_ref().expect("event") {
        Ev::Created(_) => "created",
        Ev::Queued(_) => "queued",
        Ev::InProgress(_) => "in_progress",
        Ev::OutputItemAdded(_) => "output_item.added",
        Ev::OutputItemDone(_) => "output_item.done",
        Ev::ContentPartAdded(_) => "content_part.added",
        Ev::ContentPartDone(_) => "content_part.done",
        Ev::OutputTextDelta(_) => "output_text.delta",
        Ev::OutputTextDone(_) => "output_text.done",
        Ev::ReasoningTextDelta(_) => "reasoning_text.delta",
        Ev::ReasoningTextDone(_) => "reasoning_text.done",
        Ev::FunctionCallArgumentsDelta(_) => "function_call_arguments.delta",
        Ev::FunctionCallArgumentsDone(_) => "function_call_arguments.done",
        Ev::Completed(_) => "completed",
        Ev::Incomplete(_) => "incomplete",
        Ev::Failed(_) => "failed",
        Ev::Error(_) => "error",
    }
}

/// The response a terminal event carries.
pub fn terminal(e: &ResponseEvent) -> Option<&v1::Response> {
    match e.event.as_ref()? {
        Ev::Completed(r) | Ev::Incomplete(r) | Ev::Failed(r) => Some(r),
        _ => None,
    }
}

/// The response of the first event (`created`).
pub fn created(events: &[ResponseEvent]) -> &v1::Response {
    match events.first().and_then(|e| e.event.as_ref()) {
        Some(Ev::Created(r)) => r,
        e => panic!("first event is not created: {e:?}"),
    }
}

/// Polls `Get` until `done` holds for the response (at most ~15 s).
pub async fn wait_for(
    c: &mut ResponsesClient<Channel>,
    id: &str,
    done: impl Fn(&v1::Response) -> bool,
) -> v1::Response {
    for _ in 0..1500 {
        let r = c
            .get(v1::GetResponseRequest {
                response_id: id.into(),
            })
            .await
            .expect("get")
            .into_inner();
        if done(&r) {
            return r;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("response {id} never reached the awaited state");
}
