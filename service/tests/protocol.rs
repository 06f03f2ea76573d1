//! The gRPC protocol at its edges, over real loopback gRPC against the real
//! server (`serve_grpc` on 127.0.0.1:0):
//! - errors never echo unbounded input: huge model names and tool names get
//!   their NOT_FOUND / INVALID_ARGUMENT with the name clipped, and a
//!   generation running on the same connection completes normally;
//! - bytes that are not protobuf are INVALID_ARGUMENT, on `GenerateStream`
//!   and on the bidi `Generate` (whose call then ends with that status,
//!   never OK, and cancels its running request);
//! - a `start` whose id is running (or empty) is a `rejected` event, never a
//!   finish; the running request streams on and finishes once;
//! - the API key: `Bearer` in any case, wrong or missing key refused.

mod common;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use gyre_api::v1::generation_client::GenerationClient;
use gyre_api::v1::{
    self, ChatInput, ChatMessage, FunctionDefinition, GenerateRequest, GenerateResponse,
    GetStatsRequest, ListModelsRequest, Tool, ToolChoice, generate_request::Action,
    generate_response::Event, request::Input, tool_choice::Mode,
};
use gyre_engine::{DeviceChoice, EngineOptions};
use gyre_service::runtime::ModelRuntime;
use prost::Message;
use prost::bytes::BufMut;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};
use tonic_types::StatusExt;

fn model_dir() -> PathBuf {
    std::env::var_os("GYRE_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.gyre/models"))
        .join("tiny-qwen2")
}

struct Server {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Server {
    async fn start(api_key: Option<&str>) -> Self {
        let mut opts = EngineOptions::new(model_dir());
        opts.device = DeviceChoice::Cpu;
        let rt =
            tokio::task::spawn_blocking(move || ModelRuntime::load(opts, None, Default::default()))
                .await
                .expect("join")
                .expect("model loads (build fixtures with `make models`)");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(common::serve_grpc(
            listener,
            vec![Arc::new(rt)],
            api_key.map(str::to_string),
            tokio::sync::watch::channel(false).1,
            Default::default(),
            async {
                let _ = stop_rx.await;
            },
        ));
        Self {
            addr,
            stop: Some(stop_tx),
            task,
        }
    }

    /// One HTTP/2 connection, with limits far above what any status of
    /// gyre's should need (so an unbounded status would arrive, and fail
    /// the assertions, rather than break the connection).
    async fn channel(&self) -> Channel {
        Endpoint::from_shared(format!("http://{}", self.addr))
            .expect("uri")
            .http2_max_header_list_size(16 << 20)
            .connect()
            .await
            .expect("connect")
    }

    async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        self.task.await.expect("join").expect("server ran");
    }
}

fn client(ch: &Channel) -> GenerationClient<Channel> {
    GenerationClient::new(ch.clone())
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20)
}

fn text_request(id: &str, text: &str, max_tokens: u32) -> v1::Request {
    v1::Request {
        request_id: id.into(),
        input: Some(Input::Text(text.into())),
        max_tokens: Some(max_tokens),
        ignore_eos: true,
        ..Default::default()
    }
}

/// Generated token ids and the finish of a single-request stream.
async fn drain(mut s: tonic::Streaming<GenerateResponse>) -> (usize, v1::Finish) {
    let mut tokens = 0;
    while let Some(m) = s.message().await.expect("stream stays healthy") {
        match m.event {
            Some(Event::Delta(d)) => tokens += d.token_ids.len(),
            Some(Event::Finish(f)) => return (tokens, f),
            _ => {}
        }
    }
    panic!("stream ended without a finish");
}

/// The message is bounded and quotes `input` clipped to its first
/// `gyre_api::MAX_ECHO_CHARS` characters, marked with "…".
fn assert_clipped(status: &Status, input: &str) {
    let quoted: String = input.chars().take(gyre_api::MAX_ECHO_CHARS).collect();
    assert!(
        status.message().len() < 1024,
        "message of {} bytes",
        status.message().len()
    );
    assert!(
        status.message().contains(&format!("{quoted}…")),
        "{}",
        status.message()
    );
    assert!(
        status.details().len() < 2048,
        "{} bytes of details",
        status.details().len()
    );
    let info = status.get_details_error_info().expect("ErrorInfo");
    assert!(!info.reason.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_names_get_clipped_errors_and_other_streams_on_the_connection_finish() {
    let server = Server::start(None).await;
    let ch = server.channel().await;
    let mut c = client(&ch);
    // A normal generation, running on the same connection throughout.
    let mut normal = c
        .generate_stream(text_request("normal", "Once upon a time", 300))
        .await
        .expect("normal call starts")
        .into_inner();
    let first = normal
        .message()
        .await
        .expect("first event")
        .expect("an event");
    assert_eq!(first.request_id, "normal");

    for len in [6_000, 100_000] {
        let name = "é".repeat(len);
        let mut req = text_request("", "Hello", 4);
        req.model = name.clone();
        let status = c
            .generate_stream(req)
            .await
            .expect_err("unknown model fails");
        assert_eq!(status.code(), Code::NotFound, "{status:?}");
        assert_clipped(&status, &name);
        let status = c
            .tokenize(v1::TokenizeRequest {
                model: name.clone(),
                input: Some(v1::tokenize_request::Input::Text("hi".into())),
                ..Default::default()
            })
            .await
            .expect_err("unknown model fails");
        assert_eq!(status.code(), Code::NotFound, "{status:?}");
        assert_clipped(&status, &name);
    }

    let tool = "f".repeat(100_000);
    let req = v1::Request {
        input: Some(Input::Chat(ChatInput {
            messages: vec![ChatMessage {
                role: "user".into(),
                content: Some("What is the weather?".into()),
                ..Default::default()
            }],
            tools: vec![Tool {
                r#type: "function".into(),
                function: Some(FunctionDefinition {
                    name: "get_weather".into(),
                    parameters: Some(r#"{"type": "object"}"#.into()),
                    ..Default::default()
                }),
            }],
            tool_choice: Some(ToolChoice {
                mode: Mode::Function as i32,
                function: tool.clone(),
            }),
            ..Default::default()
        })),
        max_tokens: Some(4),
        ..Default::default()
    };
    let status = c
        .generate_stream(req)
        .await
        .expect_err("unknown tool fails");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert_clipped(&status, &tool);
    let br = status.get_details_bad_request().expect("BadRequest");
    assert_eq!(br.field_violations[0].field, "chat.tool_choice");

    let first_tokens = match first.event {
        Some(Event::Delta(d)) => d.token_ids.len(),
        _ => 0,
    };
    let (tokens, finish) = drain(normal).await;
    assert_eq!(finish.reason, v1::FinishReason::Length as i32, "{finish:?}");
    assert_eq!(first_tokens + tokens, 300, "the normal stream lost events");
    drop(c);
    server.stop().await;
}

/// Encodes raw bytes as one gRPC message (the frame is valid, its payload
/// need not be protobuf); decodes responses as `D`.
struct RawCodec<D>(PhantomData<D>);

impl<D> Default for RawCodec<D> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

struct RawEncoder;
struct MessageDecoder<D>(PhantomData<D>);

impl Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = Status;
    fn encode(&mut self, item: Vec<u8>, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.put_slice(&item);
        Ok(())
    }
}

impl<D: Message + Default> Decoder for MessageDecoder<D> {
    type Item = D;
    type Error = Status;
    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<D>, Status> {
        D::decode(buf)
            .map(Some)
            .map_err(|e| Status::internal(e.to_string()))
    }
}

impl<D: Message + Default + Send + 'static> Codec for RawCodec<D> {
    type Encode = Vec<u8>;
    type Decode = D;
    type Encoder = RawEncoder;
    type Decoder = MessageDecoder<D>;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> MessageDecoder<D> {
        MessageDecoder(PhantomData)
    }
}

/// Not protobuf: a field key with wire type 7, which does not exist.
const GARBAGE: &[u8] = &[0x0f, 0xde, 0xad, 0xbe, 0xef];

fn path(method: &str) -> http::uri::PathAndQuery {
    format!("/gyre.v1.Generation/{method}")
        .parse()
        .expect("path")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_bytes_are_invalid_argument() {
    let server = Server::start(None).await;
    let ch = server.channel().await;
    let mut grpc = tonic::client::Grpc::new(ch.clone());

    grpc.ready().await.expect("ready");
    let status = grpc
        .server_streaming(
            tonic::Request::new(GARBAGE.to_vec()),
            path("GenerateStream"),
            RawCodec::<GenerateResponse>::default(),
        )
        .await
        .expect_err("garbage is refused");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("malformed"), "{status:?}");

    grpc.ready().await.expect("ready");
    let status = grpc
        .unary(
            tonic::Request::new(GARBAGE.to_vec()),
            path("Tokenize"),
            RawCodec::<v1::TokenizeResponse>::default(),
        )
        .await
        .expect_err("garbage is refused");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");

    // On the bidi call: a request runs, then a garbage message arrives.
    let (tx, rx) = mpsc::channel::<Vec<u8>>(4);
    let start = GenerateRequest {
        action: Some(Action::Start(text_request("a", "Once upon a time", 1500))),
    };
    tx.send(start.encode_to_vec()).await.expect("send start");
    grpc.ready().await.expect("ready");
    let mut events = grpc
        .streaming(
            tonic::Request::new(ReceiverStream::new(rx)),
            path("Generate"),
            RawCodec::<GenerateResponse>::default(),
        )
        .await
        .expect("call starts")
        .into_inner();
    let first = events.message().await.expect("event").expect("an event");
    assert_eq!(first.request_id, "a");
    tx.send(GARBAGE.to_vec()).await.expect("send garbage");
    let status = loop {
        match events.message().await {
            Ok(Some(m)) => assert!(
                !matches!(m.event, Some(Event::Finish(_))),
                "request `a` finished ({m:?}) instead of the call failing"
            ),
            Ok(None) => panic!("the call ended with OK after a malformed message"),
            Err(s) => break s,
        }
    };
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("malformed"), "{status:?}");
    // Request `a` was cancelled: the engine runs nothing.
    let mut c = client(&ch);
    let mut stats = v1::EngineStats::default();
    for _ in 0..10_000 {
        stats = c
            .get_stats(GetStatsRequest::default())
            .await
            .expect("stats")
            .into_inner();
        if stats.running == 0 && stats.waiting == 0 {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!((stats.running, stats.waiting), (0, 0), "{stats:?}");
    drop((c, grpc, tx));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_or_empty_request_id_is_rejected_without_touching_the_running_request() {
    let server = Server::start(None).await;
    let ch = server.channel().await;
    let mut c = client(&ch);
    let (tx, rx) = mpsc::channel::<GenerateRequest>(8);
    let start = |r: v1::Request| GenerateRequest {
        action: Some(Action::Start(r)),
    };
    tx.send(start(text_request("a", "Once upon a time", 1000)))
        .await
        .expect("send");
    let mut events = c
        .generate(ReceiverStream::new(rx))
        .await
        .expect("call starts")
        .into_inner();
    let mut seen: Vec<GenerateResponse> = Vec::new();
    let mut sent_duplicates = false;
    let mut tx = Some(tx);
    while let Some(m) = events.message().await.expect("the call stays healthy") {
        let delta_of_a = m.request_id == "a" && matches!(m.event, Some(Event::Delta(_)));
        let finish_of_a = m.request_id == "a" && matches!(m.event, Some(Event::Finish(_)));
        seen.push(m);
        if let Some(tx) = tx.as_ref().filter(|_| delta_of_a && !sent_duplicates) {
            sent_duplicates = true;
            tx.send(start(text_request("a", "Another story", 5)))
                .await
                .expect("send");
            tx.send(start(text_request("", "No id", 5)))
                .await
                .expect("send");
        }
        if let Some(tx) = tx.take_if(|_| finish_of_a) {
            // The id is free as soon as its finish is out: reuse it at once,
            // then half-close (the call ends after the reused request).
            tx.send(start(text_request("a", "Reused", 3)))
                .await
                .expect("send");
        }
    }

    let rejected: Vec<(usize, &GenerateResponse, &v1::RequestError)> = seen
        .iter()
        .enumerate()
        .filter_map(|(i, m)| match &m.event {
            Some(Event::Rejected(r)) => Some((i, m, r.error.as_ref().expect("error"))),
            _ => None,
        })
        .collect();
    assert_eq!(rejected.len(), 2, "{rejected:?}");
    let (dup_at, _, e) = rejected
        .iter()
        .find(|(_, m, _)| m.request_id == "a")
        .expect("the duplicate is rejected");
    assert_eq!(e.code, Code::AlreadyExists as i32, "{e:?}");
    assert_eq!(e.reason, "DUPLICATE_REQUEST_ID");
    assert_eq!(e.field, "start.request_id");
    assert!(e.message.contains("`a`"), "{e:?}");
    let (_, _, e) = rejected
        .iter()
        .find(|(_, m, _)| m.request_id.is_empty())
        .expect("the empty id is rejected");
    assert_eq!(e.code, Code::InvalidArgument as i32, "{e:?}");
    assert_eq!(e.reason, "EMPTY_REQUEST_ID");

    // `a` streamed on after the rejection and finished exactly once with
    // all its tokens; then the reused id ran as a request of its own.
    let finishes: Vec<(usize, &v1::Finish)> = seen
        .iter()
        .enumerate()
        .filter(|(_, m)| m.request_id == "a")
        .filter_map(|(i, m)| match &m.event {
            Some(Event::Finish(f)) => Some((i, f)),
            _ => None,
        })
        .collect();
    assert_eq!(finishes.len(), 2, "{finishes:?}");
    let (first_end, first) = finishes[0];
    assert_eq!(first.reason, v1::FinishReason::Length as i32, "{first:?}");
    assert_eq!(
        first.usage.as_ref().map(|u| u.completion_tokens),
        Some(1000)
    );
    assert!(
        seen[*dup_at..first_end]
            .iter()
            .any(|m| m.request_id == "a" && matches!(m.event, Some(Event::Delta(_)))),
        "`a` sent no delta after the rejection"
    );
    let tokens_before_finish: usize = seen[..first_end]
        .iter()
        .filter(|m| m.request_id == "a")
        .filter_map(|m| match &m.event {
            Some(Event::Delta(d)) => Some(d.token_ids.len()),
            _ => None,
        })
        .sum();
    assert_eq!(tokens_before_finish, 1000, "`a` lost tokens");
    let (_, second) = finishes[1];
    assert_eq!(second.usage.as_ref().map(|u| u.completion_tokens), Some(3));
    drop(c);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_key_takes_bearer_in_any_case_and_refuses_wrong_or_missing_keys() {
    let server = Server::start(Some("sekret")).await;
    let ch = server.channel().await;
    let mut c = client(&ch);
    let call = |auth: Option<&str>| {
        let mut req = tonic::Request::new(ListModelsRequest {});
        if let Some(a) = auth {
            req.metadata_mut()
                .insert("authorization", a.parse().expect("ascii"));
        }
        req
    };
    for ok in ["Bearer sekret", "bearer sekret", "BEARER  sekret"] {
        let models = c.list_models(call(Some(ok))).await;
        assert!(models.is_ok(), "{ok:?}: {models:?}");
    }
    for bad in [
        Some("Bearer wrong"),
        Some("Bearer sekre"),
        Some("sekret"),
        Some("Basic sekret"),
        None,
    ] {
        let status = c.list_models(call(bad)).await.expect_err("refused");
        assert_eq!(status.code(), Code::Unauthenticated, "{bad:?}: {status:?}");
    }
    drop(c);
    server.stop().await;
}
