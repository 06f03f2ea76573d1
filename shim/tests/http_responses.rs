//! The shim's `/v1/responses` and `/v1/conversations` routes end to end
//! against a fake gRPC `Responses` service: the final object drained from
//! the stream, SSE framing (`event:` names, sequence numbers, no `[DONE]`),
//! errors before and after the stream started, NOT_FOUND mapping, query
//! parameters, background and the paths without `/v1`. No sleeps: channels
//! say when things happen.

mod fake_responses;

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

/// Guards against hangs only; nothing asserts on elapsed time.
const HANG_GUARD: Duration = Duration::from_secs(60);

struct Harness {
    router: Router,
    fake: fake_responses::FakeServer,
}

async fn harness() -> Harness {
    harness_with(None).await
}

async fn harness_with(api_key: Option<&str>) -> Harness {
    let fake = fake_responses::start().await;
    let mut config = gyre_shim::ShimConfig::new(fake.endpoint.clone());
    config.api_key = api_key.map(str::to_owned);
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
        let request = Request::post(path)
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .expect("request");
        self.send(request).await
    }

    async fn call(&self, method: &str, path: &str) -> Response<Body> {
        let request = Request::builder()
            .method(method)
            .uri(path)
            .body(Body::empty())
            .expect("request");
        self.send(request).await
    }

    /// The Debug text of the next request the fake received.
    async fn seen(&mut self) -> String {
        tokio::time::timeout(HANG_GUARD, self.fake.requests.recv())
            .await
            .expect("in time")
            .expect("a request")
    }
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

async fn json_ok(response: Response<Body>) -> Value {
    assert_eq!(response.status(), StatusCode::OK);
    serde_json::from_str(&text(response).await).expect("json body")
}

/// Asserts the OpenAI error shape and `status`, and returns `error`.
async fn error_of(response: Response<Body>, status: StatusCode) -> Value {
    assert_eq!(response.status(), status);
    let body: Value = serde_json::from_str(&text(response).await).expect("json body");
    let error = body["error"].clone();
    assert_eq!(error.as_object().map(|o| o.len()), Some(4), "{error}");
    error
}

/// The (event name, data JSON) pairs of an SSE body; keep-alives skipped.
fn sse_events(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter(|block| !block.trim().is_empty() && !block.starts_with(':'))
        .map(|block| {
            let mut name = String::new();
            let mut data = String::new();
            for line in block.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = n.to_owned();
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data.push_str(d);
                }
            }
            (name, serde_json::from_str(&data).expect("json data"))
        })
        .collect()
}

fn body(model: &str, stream: bool) -> Value {
    json!({"model": model, "input": "Say hello", "stream": stream, "temperature": 0.2})
}

#[tokio::test]
async fn create_answers_the_final_response() {
    let mut h = harness().await;
    let v = json_ok(h.post("/v1/responses", body("m", false)).await).await;
    assert_eq!(v["object"], "response");
    assert_eq!(v["status"], "completed");
    assert_eq!(v["output_text"], "Hello");
    assert_eq!(v["output"][0]["id"], "msg_1");
    assert_eq!(v["temperature"], json!(0.2));
    assert_eq!(v["usage"]["total_tokens"], 7);
    let seen = h.seen().await;
    assert!(seen.contains("Text(\"Say hello\")"), "{seen}");
}

#[tokio::test]
async fn stream_is_named_events_without_done() {
    let h = harness().await;
    let response = h.post("/v1/responses", body("m", true)).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let raw = text(response).await;
    assert!(!raw.contains("[DONE]"));
    let events = sse_events(&raw);
    let types: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        types,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    for (n, (name, data)) in events.iter().enumerate() {
        assert_eq!(data["type"], name.as_str());
        assert_eq!(data["sequence_number"], n);
    }
    assert_eq!(events[4].1["delta"], "Hel");
    assert_eq!(events[9].1["response"]["output_text"], "Hello");
}

#[tokio::test]
async fn errors_before_the_stream_are_http_errors() {
    let h = harness().await;
    for stream in [false, true] {
        let e = error_of(
            h.post("/v1/responses", body("bad", stream)).await,
            StatusCode::BAD_REQUEST,
        )
        .await;
        assert_eq!(e["param"], "max_output_tokens");
        // Wrong types never reach the service.
        let mut wrong = body("m", stream);
        wrong["input"] = json!([{"role": "user", "content": [{"type": "input_text", "text": 1}]}]);
        let e = error_of(
            h.post("/v1/responses", wrong).await,
            StatusCode::BAD_REQUEST,
        )
        .await;
        assert_eq!(e["param"], "input[0].content[0].text");
    }
    // The edge bounds the number of input items.
    let mut many = body("m", false);
    many["input"] = json!(vec![json!({"role": "user", "content": "x"}); 4097]);
    let e = error_of(h.post("/v1/responses", many).await, StatusCode::BAD_REQUEST).await;
    assert_eq!(e["param"], "input");
    assert_eq!(e["code"], "too_many_items");
}

#[tokio::test]
async fn a_failure_after_the_stream_started_is_an_error_event() {
    let h = harness().await;
    let response = h.post("/v1/responses", body("fail-mid", true)).await;
    assert_eq!(response.status(), StatusCode::OK);
    let events = sse_events(&text(response).await);
    let (name, last) = events.last().expect("events");
    assert_eq!(name, "error");
    assert_eq!(last["sequence_number"], events.len() - 1);
    assert_eq!(last["code"], "server_error");
    // A 5xx's details stay in the log.
    assert!(
        !last["message"]
            .as_str()
            .unwrap_or_default()
            .contains("secret")
    );
    // Not streamed, the same failure is a 500.
    let e = error_of(
        h.post("/v1/responses", body("fail-mid", false)).await,
        StatusCode::INTERNAL_SERVER_ERROR,
    )
    .await;
    assert_eq!(e["type"], "server_error");
    // The service's own error event passes through, and ends the stream.
    let events = sse_events(&text(h.post("/v1/responses", body("error-event", true)).await).await);
    assert_eq!(events.len(), 3);
    assert_eq!(events[2].0, "error");
    assert_eq!(events[2].1["code"], "server_error");
    assert_eq!(events[2].1["sequence_number"], 2);
}

#[tokio::test]
async fn background_answers_queued_and_keeps_running() {
    let mut h = harness().await;
    let mut req = body("hang", false);
    req["background"] = json!(true);
    let v = json_ok(h.post("/v1/responses", req).await).await;
    assert_eq!(v["status"], "queued");
    assert_eq!(v["background"], true);
    // The shim dropped its call after the queued response.
    let dropped = tokio::time::timeout(HANG_GUARD, h.fake.dropped.recv()).await;
    assert_eq!(dropped.ok().flatten().as_deref(), Some("resp_bg"));
}

#[tokio::test]
async fn unknown_ids_are_404_naming_the_param() {
    let h = harness().await;
    for (method, path, param) in [
        ("GET", "/v1/responses/resp_nope", "response_id"),
        ("GET", "/v1/responses/resp_nope?stream=true", "response_id"),
        ("DELETE", "/v1/responses/resp_nope", "response_id"),
        ("GET", "/v1/conversations/conv_nope", "conversation_id"),
        ("DELETE", "/v1/conversations/conv_nope", "conversation_id"),
        (
            "GET",
            "/v1/conversations/conv_nope/items",
            "conversation_id",
        ),
    ] {
        let e = error_of(h.call(method, path).await, StatusCode::NOT_FOUND).await;
        assert_eq!(e["param"], param, "{method} {path}");
        assert_eq!(e["code"], "not_found", "{method} {path}");
    }
}

#[tokio::test]
async fn retrieve_replay_delete_cancel() {
    let mut h = harness().await;
    let v = json_ok(h.call("GET", "/v1/responses/resp_known").await).await;
    assert_eq!(
        (v["id"].as_str(), v["status"].as_str()),
        (Some("resp_known"), Some("completed"))
    );

    let response = h
        .call(
            "GET",
            "/v1/responses/resp_known?stream=true&starting_after=6",
        )
        .await;
    let events = sse_events(&text(response).await);
    let numbers: Vec<u64> = events
        .iter()
        .filter_map(|(_, d)| d["sequence_number"].as_u64())
        .collect();
    assert_eq!(numbers, [7, 8, 9]);
    assert!(h.seen().await.contains("starting_after: Some(6)"));

    let e = error_of(
        h.call("GET", "/v1/responses/resp_known?stream=maybe").await,
        StatusCode::BAD_REQUEST,
    )
    .await;
    assert_eq!(e["param"], "stream");
    let e = error_of(
        h.call(
            "GET",
            "/v1/responses/resp_known?stream=true&starting_after=-1",
        )
        .await,
        StatusCode::BAD_REQUEST,
    )
    .await;
    assert_eq!(e["param"], "starting_after");

    let v = json_ok(h.call("DELETE", "/v1/responses/resp_known").await).await;
    assert_eq!(
        v,
        json!({"id": "resp_known", "object": "response", "deleted": true})
    );
    let v = json_ok(h.call("POST", "/v1/responses/resp_known/cancel").await).await;
    assert_eq!(v["status"], "cancelled");
    // Cancelling a response that is not in the background.
    let e = error_of(
        h.call("POST", "/v1/responses/resp_other/cancel").await,
        StatusCode::UNPROCESSABLE_ENTITY,
    )
    .await;
    assert_eq!(e["type"], "invalid_request_error");
}

#[tokio::test]
async fn lists_take_their_cursor() {
    let mut h = harness().await;
    let v = json_ok(
        h.call(
            "GET",
            "/v1/responses/resp_known/input_items?after=in_0&limit=5&order=asc",
        )
        .await,
    )
    .await;
    assert_eq!(v["object"], "list");
    assert_eq!(
        (v["first_id"].as_str(), v["last_id"].as_str()),
        (Some("in_0"), Some("in_1"))
    );
    let seen = h.seen().await;
    for want in [
        "after: Some(\"in_0\")",
        "limit: Some(5)",
        "order: Some(\"asc\")",
    ] {
        assert!(seen.contains(want), "{seen}");
    }
    for (query, status) in [
        ("limit=many", StatusCode::BAD_REQUEST),
        ("limit=0", StatusCode::BAD_REQUEST),
    ] {
        let path = format!("/v1/responses/resp_known/input_items?{query}");
        let e = error_of(h.call("GET", &path).await, status).await;
        assert_eq!(e["param"], "limit");
    }
}

#[tokio::test]
async fn input_tokens_and_conversations() {
    let mut h = harness().await;
    let v = json_ok(h.post("/v1/responses/input_tokens", body("m", false)).await).await;
    assert_eq!(
        v,
        json!({"object": "response.input_tokens", "input_tokens": 42})
    );
    h.seen().await;

    let v = json_ok(
        h.post(
            "/v1/conversations",
            json!({"items": [{"role": "user", "content": "hi"}], "metadata": {"topic": "x"}}),
        )
        .await,
    )
    .await;
    assert_eq!(
        v,
        json!({"id": "conv_known", "object": "conversation", "created_at": 1_700_000_000,
               "metadata": {"topic": "x"}})
    );
    assert!(h.seen().await.contains("InputText(\"hi\")"));
    let e = error_of(
        h.post("/v1/conversations", json!({"items": [{"role": "user"}]}))
            .await,
        StatusCode::BAD_REQUEST,
    )
    .await;
    assert_eq!(e["param"], "items[0].content");

    let v = json_ok(h.call("GET", "/v1/conversations/conv_known").await).await;
    assert_eq!(v["object"], "conversation");
    let v = json_ok(
        h.call("GET", "/v1/conversations/conv_known/items?limit=2")
            .await,
    )
    .await;
    assert_eq!(v["data"].as_array().map(Vec::len), Some(3));
    let v = json_ok(h.call("DELETE", "/v1/conversations/conv_known").await).await;
    assert_eq!(
        v,
        json!({"id": "conv_known", "object": "conversation.deleted", "deleted": true})
    );
}

#[tokio::test]
async fn paths_without_v1() {
    let h = harness().await;
    let v = json_ok(h.post("/responses", body("m", false)).await).await;
    assert_eq!(v["status"], "completed");
    let v = json_ok(h.call("GET", "/responses/resp_known").await).await;
    assert_eq!(v["id"], "resp_known");
    let v = json_ok(h.call("GET", "/conversations/conv_known").await).await;
    assert_eq!(v["id"], "conv_known");
    // Wrong method on a known path is the usual 405.
    let e = error_of(
        h.call("PUT", "/v1/responses/resp_known").await,
        StatusCode::METHOD_NOT_ALLOWED,
    )
    .await;
    assert_eq!(e["code"], "method_not_allowed");
}

#[tokio::test]
async fn the_api_key_guards_every_route() {
    let h = harness_with(Some("sekret")).await;
    let e = error_of(
        h.post("/v1/responses", body("m", false)).await,
        StatusCode::UNAUTHORIZED,
    )
    .await;
    assert_eq!(e["code"], "invalid_api_key");
    for (method, path) in [
        ("GET", "/v1/responses/resp_known"),
        ("DELETE", "/v1/conversations/conv_known"),
        ("GET", "/responses/resp_known/input_items"),
    ] {
        error_of(h.call(method, path).await, StatusCode::UNAUTHORIZED).await;
    }
    let request = Request::get("/v1/responses/resp_known")
        .header("authorization", "Bearer sekret")
        .body(Body::empty())
        .expect("request");
    assert_eq!(h.send(request).await.status(), StatusCode::OK);
}
