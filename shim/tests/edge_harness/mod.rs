//! Shared by the HTTP edge tests (`http_edge.rs`, `http_inputs.rs`): the
//! shim's router in front of the fake gRPC service, requests, and the
//! OpenAI error-shape check.
#![allow(dead_code)]

use axum::Router;
use axum::body::Body;
use gyre_api::v1 as pb;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::fake;

pub const POST_ROUTES: [&str; 4] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/tokenize",
    "/detokenize",
];

pub struct Harness {
    pub router: Router,
    pub fake: fake::FakeServer,
}

pub async fn harness_with(configure: impl FnOnce(&mut gyre_shim::ShimConfig)) -> Harness {
    let fake = fake::start().await;
    let mut config = gyre_shim::ShimConfig::new(fake.endpoint.clone());
    configure(&mut config);
    let state = gyre_shim::connect(config).await.expect("connect");
    Harness {
        router: gyre_shim::router(state),
        fake,
    }
}

pub async fn harness() -> Harness {
    harness_with(|_| {}).await
}

impl Harness {
    pub async fn send(&self, request: Request<Body>) -> Response<Body> {
        self.router
            .clone()
            .oneshot(request)
            .await
            .expect("infallible")
    }

    pub async fn post(&self, path: &str, body: &Value) -> Response<Body> {
        self.send(post(path, Some("application/json"), body.to_string()))
            .await
    }

    /// The proto request the fake saw last (of those sent since the last call).
    pub fn seen(&mut self) -> Option<pb::Request> {
        let mut last = None;
        while let Ok((_, req)) = self.fake.observed.requests.try_recv() {
            last = Some(req);
        }
        last
    }
}

pub fn post(path: &str, content_type: Option<&str>, body: impl Into<Body>) -> Request<Body> {
    let mut builder = Request::post(path);
    if let Some(t) = content_type {
        builder = builder.header("content-type", t);
    }
    builder.body(body.into()).expect("request")
}

pub async fn json_of(response: Response<Body>) -> Value {
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    serde_json::from_slice(&bytes).expect("json body")
}

/// Asserts `status` and the OpenAI error shape; returns `error`.
pub async fn error_of(response: Response<Body>, status: StatusCode) -> Value {
    assert_eq!(response.status(), status);
    let body = json_of(response).await;
    let error = body["error"].clone();
    let keys: Vec<&String> = error.as_object().expect("error object").keys().collect();
    assert_eq!(keys, ["message", "type", "param", "code"], "{error}");
    error
}

pub fn body_for(path: &str, model: &str) -> Value {
    match path {
        "/v1/chat/completions" => {
            json!({"model": model, "messages": [{"role": "user", "content": "hi"}]})
        }
        "/detokenize" => json!({"model": model, "tokens": [1, 2]}),
        _ => json!({"model": model, "prompt": "hi"}),
    }
}

pub fn chat(extra: Value) -> Value {
    let mut body = body_for("/v1/chat/completions", "echo-model");
    if let (Some(b), Value::Object(extra)) = (body.as_object_mut(), extra) {
        b.extend(extra);
    }
    body
}

pub fn completion(extra: Value) -> Value {
    let mut body = body_for("/v1/completions", "echo-model");
    if let (Some(b), Value::Object(extra)) = (body.as_object_mut(), extra) {
        b.extend(extra);
    }
    body
}

/// `{key: value}`.
pub fn map(key: &str, value: Value) -> Value {
    let mut m = serde_json::Map::new();
    m.insert(key.to_owned(), value);
    Value::Object(m)
}

/// `{"a": {"a": ... 1}}`: `levels` levels of objects.
pub fn nested(levels: usize) -> Value {
    (0..levels).fold(json!(1), |inner, _| json!({ "a": inner }))
}
