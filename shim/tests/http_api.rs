//! The shim's router end to end against a fake gRPC `Generation` service:
//! SSE framing, aggregation, error mapping, auth, models, and cancellation
//! when the HTTP client goes away. No sleeps: channels say when things happen.

mod fake;

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tonic::Code;
use tower::ServiceExt;

/// Guards against hangs only; nothing asserts on elapsed time.
const HANG_GUARD: Duration = Duration::from_secs(60);

struct Harness {
    router: Router,
    fake: fake::FakeServer,
}

async fn harness(api_key: Option<&str>) -> Harness {
    harness_with(|config| config.api_key = api_key.map(str::to_owned)).await
}

async fn harness_with(configure: impl FnOnce(&mut gyre_shim::ShimConfig)) -> Harness {
    let fake = fake::start().await;
    let mut config = gyre_shim::ShimConfig::new(fake.endpoint.clone());
    configure(&mut config);
    let state = gyre_shim::connect(config).await.expect("connect");
    Harness {
        router: gyre_shim::router(state),
        fake,
    }
}

impl Harness {
    async fn send(&self, request: Request<Body>) -> Response<Body> {
        self.router
            .clone()
            .oneshot(request)
            .await
            .expect("infallible")
    }

    async fn post(&self, path: &str, body: Value) -> Response<Body> {
        self.send(post_request(path, body.to_string())).await
    }

    async fn get(&self, path: &str) -> Response<Body> {
        let request = Request::get(path).body(Body::empty()).expect("request");
        self.send(request).await
    }
}

fn post_request(path: &str, body: impl Into<Body>) -> Request<Body> {
    Request::post(path)
        .header("content-type", "application/json")
        .body(body.into())
        .expect("request")
}

async fn text(response: Response<Body>) -> String {
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    String::from_utf8(bytes.to_vec()).expect("utf-8")
}

async fn json_of(response: Response<Body>) -> Value {
    serde_json::from_str(&text(response).await).expect("json body")
}

/// The `data:` payloads of an SSE body (keep-alive comments skipped).
fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|event| event.strip_prefix("data: "))
        .map(str::to_owned)
        .collect()
}

fn parse(data: &str) -> Value {
    serde_json::from_str(data).expect("json event")
}

/// Asserts the OpenAI error shape and returns `error`.
async fn error_of(response: Response<Body>, status: StatusCode) -> Value {
    assert_eq!(response.status(), status);
    let body = json_of(response).await;
    let error = body["error"].clone();
    let keys: Vec<_> = error
        .as_object()
        .expect("error object")
        .keys()
        .cloned()
        .collect();
    assert_eq!(keys.len(), 4, "{error}");
    for key in ["message", "type", "param", "code"] {
        assert!(error.get(key).is_some(), "missing {key}: {error}");
    }
    error
}

fn chat_body(model: &str, stream: bool) -> Value {
    json!({
        "model": model,
        "messages": [{"role": "user", "content": "Say hello"}],
        "stream": stream,
    })
}

#[tokio::test]
async fn chat_stream_framing() {
    let h = harness(None).await;
    let mut body = chat_body("echo-model", true);
    body["stream_options"] = json!({"include_usage": true});
    let response = h.post("/v1/chat/completions", body).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    assert_eq!(response.headers()["x-accel-buffering"], "no");
    let data = sse_data(&text(response).await);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = data[..data.len() - 1].iter().map(|d| parse(d)).collect();

    let id = chunks[0]["id"].as_str().expect("id");
    assert!(id.starts_with("chatcmpl-"));
    for chunk in &chunks {
        assert_eq!(chunk["id"], id);
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(chunk["model"], "echo-model");
        assert!(chunk["created"].is_u64() && chunk["system_fingerprint"].is_string());
    }
    assert_eq!(
        chunks[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    assert_eq!(chunks[0]["choices"][0]["logprobs"], Value::Null);
    let contents: Vec<&str> = chunks[1..4]
        .iter()
        .map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .expect("content")
        })
        .collect();
    assert_eq!(contents, ["Hel", "lo", " world"]);
    let finishing: Vec<&Value> = chunks
        .iter()
        .filter(|c| !c["choices"][0]["finish_reason"].is_null())
        .collect();
    assert_eq!(finishing.len(), 1, "exactly one finish chunk");
    assert_eq!(chunks[4]["choices"][0]["finish_reason"], "stop");
    assert_eq!(chunks[4]["choices"][0]["delta"], json!({}));
    assert!(chunks[..5].iter().all(|c| c["usage"].is_null()));
    assert_eq!(chunks[5]["choices"], json!([]));
    assert_eq!(
        chunks[5]["usage"],
        json!({"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8,
               "prompt_tokens_details": {"cached_tokens": 2}})
    );
    assert_eq!(chunks.len(), 6);
}

#[tokio::test]
async fn chat_stream_without_usage_has_no_usage_key() {
    let h = harness(None).await;
    let response = h
        .post("/v1/chat/completions", chat_body("long", true))
        .await;
    let data = sse_data(&text(response).await);
    assert_eq!(data.len(), 4, "{data:?}"); // role, text, finish, [DONE]
    for chunk in &data[..3] {
        assert!(parse(chunk).get("usage").is_none());
    }
    assert_eq!(parse(&data[2])["choices"][0]["finish_reason"], "length");
}

#[tokio::test]
async fn chat_non_stream_aggregates() {
    let h = harness(None).await;
    let response = h
        .post("/v1/chat/completions", chat_body("echo-model", false))
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let body = json_of(response).await;
    assert_eq!(body["object"], "chat.completion");
    assert!(
        body["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("chatcmpl-"))
    );
    assert_eq!(
        body["choices"],
        json!([{"index": 0, "message": {"role": "assistant", "content": "Hello world", "refusal": null},
                "logprobs": null, "finish_reason": "stop"}])
    );
    assert_eq!(body["usage"]["total_tokens"], 8);
    assert_eq!(body["usage"]["prompt_tokens_details"]["cached_tokens"], 2);
}

#[tokio::test]
async fn request_fields_reach_the_service() {
    let mut h = harness(None).await;
    let body = json!({
        "model": "echo-model",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
        "stop": ["x", "y"], "temperature": 0.25, "max_tokens": 9, "seed": 4,
    });
    let request = Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .header("authorization", "Bearer client-key")
        .header(
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        )
        .body(Body::from(body.to_string()))
        .expect("request");
    assert_eq!(h.send(request).await.status(), StatusCode::OK);
    let (metadata, req) = h.fake.observed.requests.recv().await.expect("request seen");
    // Without a configured key the client's own header is passed through.
    assert_eq!(
        metadata.get("authorization").expect("auth"),
        "Bearer client-key"
    );
    assert!(metadata.get("traceparent").is_some());
    assert!(req.request_id.starts_with("chatcmpl-"));
    assert_eq!(req.stop, ["x", "y"]);
    assert_eq!(req.max_tokens, Some(9));
    let sampling = req.sampling.expect("sampling");
    assert_eq!((sampling.temperature, sampling.seed), (Some(0.25), Some(4)));
    let Some(gyre_api::v1::request::Input::Chat(chat)) = req.input else {
        panic!("chat input expected");
    };
    assert_eq!(chat.messages[0].content.as_deref(), Some("a\nb"));
}

#[tokio::test]
async fn completions_whole_and_streamed() {
    let h = harness(None).await;
    let body = json!({"model": "echo-model", "prompt": "Once"});
    let response = h.post("/v1/completions", body).await;
    assert_eq!(response.status(), StatusCode::OK);
    let whole = json_of(response).await;
    assert_eq!(whole["object"], "text_completion");
    assert!(
        whole["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("cmpl-"))
    );
    assert_eq!(
        whole["choices"],
        json!([{"index": 0, "text": "Hello world", "logprobs": null, "finish_reason": "stop"}])
    );
    assert_eq!(whole["usage"]["completion_tokens"], 3);

    let body = json!({"model": "long", "prompt": [1, 2, 3], "stream": true});
    let data = sse_data(&text(h.post("/v1/completions", body).await).await);
    assert_eq!(data.len(), 3, "{data:?}"); // text, finish, [DONE]
    let first = parse(&data[0]);
    assert_eq!(first["object"], "text_completion");
    assert_eq!(first["choices"][0]["text"], "abc");
    assert_eq!(first["choices"][0]["finish_reason"], Value::Null);
    assert_eq!(parse(&data[1])["choices"][0]["finish_reason"], "length");
    assert_eq!(data[2], "[DONE]");
}

#[tokio::test]
async fn service_errors_map_to_http() {
    let h = harness(None).await;
    let chat = |model: &str| chat_body(model, false);

    let e = error_of(
        h.post("/v1/chat/completions", chat("missing")).await,
        StatusCode::NOT_FOUND,
    )
    .await;
    assert_eq!(e["code"], "model_not_found");
    assert_eq!(e["type"], "invalid_request_error");

    let e = error_of(
        h.post("/v1/chat/completions", chat("bad-temp")).await,
        StatusCode::BAD_REQUEST,
    )
    .await;
    assert_eq!(e["param"], "temperature");

    let response = h.post("/v1/chat/completions", chat("busy")).await;
    assert_eq!(response.headers()["retry-after"], "1");
    let e = error_of(response, StatusCode::TOO_MANY_REQUESTS).await;
    assert_eq!(e["type"], "rate_limit_error");

    // An error as the stream's first item is still an HTTP error, even streamed.
    let response = h
        .post("/v1/chat/completions", chat_body("fail-first", true))
        .await;
    error_of(response, StatusCode::TOO_MANY_REQUESTS).await;

    let e = error_of(
        h.post("/v1/chat/completions", chat("draining")).await,
        StatusCode::SERVICE_UNAVAILABLE,
    )
    .await;
    assert!(!e["message"].as_str().unwrap_or_default().contains("secret"));

    let e = error_of(
        h.post("/v1/chat/completions", chat("fail-mid")).await,
        StatusCode::INTERNAL_SERVER_ERROR,
    )
    .await;
    assert_eq!(e["type"], "server_error");
    assert!(!e["message"].as_str().unwrap_or_default().contains("secret"));

    let e = error_of(
        h.post("/v1/chat/completions", chat("fail-finish")).await,
        StatusCode::BAD_REQUEST,
    )
    .await;
    assert_eq!(e["code"], "context_length_exceeded");
    assert_eq!(e["param"], "messages");
}

/// Every gRPC code the service may answer becomes one HTTP status and OpenAI
/// error type, streaming or not, with all four keys (see docs/ARCHITECTURE.md).
#[tokio::test]
async fn every_grpc_code_maps_through_the_router() {
    let h = harness(None).await;
    let table = [
        (
            Code::Cancelled,
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
        ),
        (
            Code::Unknown,
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
        ),
        (
            Code::InvalidArgument,
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
        ),
        (
            Code::DeadlineExceeded,
            StatusCode::GATEWAY_TIMEOUT,
            "timeout",
        ),
        (
            Code::NotFound,
            StatusCode::NOT_FOUND,
            "invalid_request_error",
        ),
        (
            Code::AlreadyExists,
            StatusCode::CONFLICT,
            "invalid_request_error",
        ),
        (
            Code::PermissionDenied,
            StatusCode::FORBIDDEN,
            "permission_error",
        ),
        (
            Code::ResourceExhausted,
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
        ),
        (
            Code::FailedPrecondition,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request_error",
        ),
        (Code::Aborted, StatusCode::CONFLICT, "invalid_request_error"),
        (
            Code::OutOfRange,
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
        ),
        (
            Code::Unimplemented,
            StatusCode::NOT_IMPLEMENTED,
            "server_error",
        ),
        (
            Code::Internal,
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
        ),
        (
            Code::Unavailable,
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
        ),
        (
            Code::DataLoss,
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
        ),
        (
            Code::Unauthenticated,
            StatusCode::UNAUTHORIZED,
            "authentication_error",
        ),
    ];
    for (code, status, kind) in table {
        for stream in [false, true] {
            let model = format!("code-{}", code as i32);
            let response = h
                .post("/v1/chat/completions", chat_body(&model, stream))
                .await;
            let e = error_of(response, status).await;
            assert_eq!(e["type"], kind, "{code:?}");
        }
    }
}

#[tokio::test]
async fn error_after_stream_start_is_one_error_event_without_done() {
    let h = harness(None).await;
    let response = h
        .post("/v1/chat/completions", chat_body("fail-mid", true))
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let data = sse_data(&text(response).await);
    assert_eq!(data.len(), 3, "{data:?}"); // role, "partial", error
    assert_eq!(parse(&data[1])["choices"][0]["delta"]["content"], "partial");
    let error = parse(&data[2]);
    assert_eq!(error["error"]["type"], "server_error");
    assert!(!data.iter().any(|d| d == "[DONE]"));
}

#[tokio::test]
async fn dropping_the_stream_body_cancels_generation() {
    let mut h = harness(None).await;
    let response = h
        .post("/v1/chat/completions", chat_body("hang", true))
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let mut seen = String::new();
    while !seen.contains("partial") {
        let frame = body.frame().await.expect("more frames").expect("frame");
        if let Ok(data) = frame.into_data() {
            seen.push_str(&String::from_utf8_lossy(&data));
        }
    }
    drop(body);
    let cancelled = tokio::time::timeout(HANG_GUARD, h.fake.observed.cancelled.recv())
        .await
        .expect("the service saw the cancellation");
    assert!(cancelled.is_some_and(|id| id.starts_with("chatcmpl-")));
}

#[tokio::test]
async fn abandoning_a_non_streaming_request_cancels_generation() {
    let mut h = harness(None).await;
    let router = h.router.clone();
    let request = post_request(
        "/v1/completions",
        json!({"model": "hang", "prompt": "x"}).to_string(),
    );
    let call = tokio::spawn(async move { router.oneshot(request).await });
    h.fake
        .observed
        .requests
        .recv()
        .await
        .expect("request reached the service");
    call.abort();
    let cancelled = tokio::time::timeout(HANG_GUARD, h.fake.observed.cancelled.recv())
        .await
        .expect("the service saw the cancellation");
    assert!(cancelled.is_some_and(|id| id.starts_with("cmpl-")));
}

#[tokio::test]
async fn models_list_and_retrieve() {
    let h = harness(None).await;
    let list = json_of(h.get("/v1/models").await).await;
    assert_eq!(list["object"], "list");
    assert_eq!(
        list["data"][0],
        json!({"id": "tiny/llama", "object": "model", "created": 1_700_000_000,
               "owned_by": "gyre", "max_model_len": 2048, "aliases": [], "version": "",
               "deprecation": null, "sunset": null, "kind": "generate", "chat": false})
    );
    let one = json_of(h.get("/v1/models/tiny/llama").await).await;
    assert_eq!(one["id"], "tiny/llama");
    let e = error_of(h.get("/v1/models/nope").await, StatusCode::NOT_FOUND).await;
    assert_eq!(e["code"], "model_not_found");
}

#[tokio::test]
async fn api_key_is_required_and_forwarded() {
    let mut h = harness(Some("sekret")).await;
    let e = error_of(h.get("/v1/models").await, StatusCode::UNAUTHORIZED).await;
    assert_eq!(e["type"], "authentication_error");

    let with_key = |key: &str| {
        Request::post("/v1/chat/completions")
            .header("content-type", "application/json")
            .header("authorization", format!("Bearer {key}"))
            .body(Body::from(chat_body("echo-model", false).to_string()))
            .expect("request")
    };
    error_of(h.send(with_key("wrong")).await, StatusCode::UNAUTHORIZED).await;
    assert_eq!(h.send(with_key("sekret")).await.status(), StatusCode::OK);
    let (metadata, _) = h.fake.observed.requests.recv().await.expect("request seen");
    assert_eq!(
        metadata.get("authorization").expect("auth"),
        "Bearer sekret"
    );
}

#[tokio::test]
async fn bad_requests_never_reach_the_service() {
    let mut h = harness(None).await;
    let e = error_of(
        h.send(post_request("/v1/chat/completions", "{nope")).await,
        StatusCode::BAD_REQUEST,
    )
    .await;
    assert_eq!(e["param"], Value::Null);
    let e = error_of(
        h.post("/v1/chat/completions", json!([1])).await,
        StatusCode::BAD_REQUEST,
    )
    .await;
    assert_eq!(e["type"], "invalid_request_error");
    let mut body = chat_body("echo-model", false);
    body["temperature"] = json!("hot");
    let e = error_of(
        h.post("/v1/chat/completions", body).await,
        StatusCode::BAD_REQUEST,
    )
    .await;
    assert_eq!(e["param"], "temperature");
    let e = error_of(
        h.post("/v1/completions", json!({"model": "m"})).await,
        StatusCode::BAD_REQUEST,
    )
    .await;
    assert_eq!(e["param"], "prompt");

    let huge = format!("{{\"model\":\"m\",\"prompt\":\"{}\"}}", "a".repeat(5 << 20));
    error_of(
        h.send(post_request("/v1/completions", huge)).await,
        StatusCode::PAYLOAD_TOO_LARGE,
    )
    .await;
    assert!(h.fake.observed.requests.try_recv().is_err());
}

#[tokio::test]
async fn unknown_routes_and_methods() {
    let h = harness(None).await;
    let e = error_of(h.get("/v1/nothing").await, StatusCode::NOT_FOUND).await;
    assert_eq!(e["type"], "invalid_request_error");
    error_of(
        h.get("/v1/chat/completions").await,
        StatusCode::METHOD_NOT_ALLOWED,
    )
    .await;
    error_of(
        h.post("/v1/models", json!({})).await,
        StatusCode::METHOD_NOT_ALLOWED,
    )
    .await;
}

#[tokio::test]
async fn request_timeout_is_a_504_and_cancels() {
    let mut h = harness_with(|c| c.request_timeout = Some(Duration::from_millis(200))).await;
    let body = json!({"model": "hang", "prompt": "x"});
    let e = error_of(
        h.post("/v1/completions", body).await,
        StatusCode::GATEWAY_TIMEOUT,
    )
    .await;
    assert_eq!(e["type"], "timeout");
    let cancelled = tokio::time::timeout(HANG_GUARD, h.fake.observed.cancelled.recv())
        .await
        .expect("the service saw the cancellation");
    assert!(cancelled.is_some());

    let response = h
        .post("/v1/chat/completions", chat_body("hang", true))
        .await;
    let data = sse_data(&text(response).await);
    assert_eq!(
        parse(data.last().expect("events"))["error"]["type"],
        "timeout"
    );
}
