//! The shim's HTTP edge against a fake gRPC service: JSON content types
//! (415), CORS closed unless configured, the nesting and list limits, clipped
//! echoes of client input, one 404 format for unknown models, and the input
//! decisions (whole-number floats, `prompt: null`, `top_p: 0`, `model: ""`).

mod fake;

use axum::Router;
use axum::body::Body;
use gyre_api::v1 as pb;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

const POST_ROUTES: [&str; 4] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/tokenize",
    "/detokenize",
];

struct Harness {
    router: Router,
    fake: fake::FakeServer,
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

async fn harness() -> Harness {
    harness_with(|_| {}).await
}

impl Harness {
    async fn send(&self, request: Request<Body>) -> Response<Body> {
        self.router
            .clone()
            .oneshot(request)
            .await
            .expect("infallible")
    }

    async fn post(&self, path: &str, body: &Value) -> Response<Body> {
        self.send(post(path, Some("application/json"), body.to_string()))
            .await
    }

    /// The proto request the fake saw last (of those sent since the last call).
    fn seen(&mut self) -> Option<pb::Request> {
        let mut last = None;
        while let Ok((_, req)) = self.fake.observed.requests.try_recv() {
            last = Some(req);
        }
        last
    }
}

fn post(path: &str, content_type: Option<&str>, body: impl Into<Body>) -> Request<Body> {
    let mut builder = Request::post(path);
    if let Some(t) = content_type {
        builder = builder.header("content-type", t);
    }
    builder.body(body.into()).expect("request")
}

async fn json_of(response: Response<Body>) -> Value {
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    serde_json::from_slice(&bytes).expect("json body")
}

/// Asserts `status` and the OpenAI error shape; returns `error`.
async fn error_of(response: Response<Body>, status: StatusCode) -> Value {
    assert_eq!(response.status(), status);
    let body = json_of(response).await;
    let error = body["error"].clone();
    let keys: Vec<&String> = error.as_object().expect("error object").keys().collect();
    assert_eq!(keys, ["message", "type", "param", "code"], "{error}");
    error
}

fn body_for(path: &str, model: &str) -> Value {
    match path {
        "/v1/chat/completions" => {
            json!({"model": model, "messages": [{"role": "user", "content": "hi"}]})
        }
        "/detokenize" => json!({"model": model, "tokens": [1, 2]}),
        _ => json!({"model": model, "prompt": "hi"}),
    }
}

fn chat(extra: Value) -> Value {
    let mut body = body_for("/v1/chat/completions", "echo-model");
    if let (Some(b), Value::Object(extra)) = (body.as_object_mut(), extra) {
        b.extend(extra);
    }
    body
}

fn completion(extra: Value) -> Value {
    let mut body = body_for("/v1/completions", "echo-model");
    if let (Some(b), Value::Object(extra)) = (body.as_object_mut(), extra) {
        b.extend(extra);
    }
    body
}

/// `{key: value}`.
fn map(key: &str, value: Value) -> Value {
    let mut m = serde_json::Map::new();
    m.insert(key.to_owned(), value);
    Value::Object(m)
}

/// `{"a": {"a": ... 1}}`: `levels` levels of objects.
fn nested(levels: usize) -> Value {
    (0..levels).fold(json!(1), |inner, _| json!({ "a": inner }))
}

#[tokio::test]
async fn post_routes_require_a_json_content_type() {
    let mut h = harness().await;
    for path in POST_ROUTES {
        let body = body_for(path, "echo-model").to_string();
        for content_type in [
            Some("text/plain"),
            Some("text/plain;charset=UTF-8"),
            Some("application/x-www-form-urlencoded"),
            Some("multipart/form-data; boundary=xyz"),
            None,
        ] {
            let response = h.send(post(path, content_type, body.clone())).await;
            let e = error_of(response, StatusCode::UNSUPPORTED_MEDIA_TYPE).await;
            assert_eq!(
                e["type"], "invalid_request_error",
                "{path} {content_type:?}"
            );
            assert_eq!(e["code"], "unsupported_media_type");
            let message = e["message"].as_str().unwrap_or_default();
            assert!(message.contains("application/json"), "{message}");
        }
    }
    assert!(h.seen().is_none(), "a 415 must not reach the service");
    for content_type in [
        "application/json",
        "Application/JSON; charset=utf-8",
        "application/vnd.example+json",
    ] {
        for path in ["/v1/chat/completions", "/v1/completions", "/tokenize"] {
            let body = body_for(path, "echo-model").to_string();
            let response = h.send(post(path, Some(content_type), body)).await;
            assert_eq!(response.status(), StatusCode::OK, "{path} {content_type}");
        }
    }
}

/// Authentication comes first: without the key, any content type is a 401.
#[tokio::test]
async fn the_key_is_checked_before_the_content_type() {
    let h = harness_with(|c| c.api_key = Some("sekret".into())).await;
    let body = body_for("/v1/completions", "echo-model").to_string();
    let response = h
        .send(post("/v1/completions", Some("text/plain"), body))
        .await;
    error_of(response, StatusCode::UNAUTHORIZED).await;
}

fn preflight(origin: &str) -> Request<Body> {
    Request::options("/v1/chat/completions")
        .header("origin", origin)
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "authorization, content-type",
        )
        .body(Body::empty())
        .expect("request")
}

fn get_from(origin: &str) -> Request<Body> {
    Request::get("/v1/models")
        .header("origin", origin)
        .body(Body::empty())
        .expect("request")
}

const ALLOW_ORIGIN: &str = "access-control-allow-origin";

#[tokio::test]
async fn cors_is_closed_by_default() {
    let h = harness().await;
    let response = h.send(preflight("https://evil.example")).await;
    assert!(response.headers().get(ALLOW_ORIGIN).is_none());
    assert!(
        response
            .headers()
            .get("access-control-allow-methods")
            .is_none()
    );
    error_of(response, StatusCode::METHOD_NOT_ALLOWED).await;
    let response = h.send(get_from("https://evil.example")).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.headers().get(ALLOW_ORIGIN).is_none());
}

#[tokio::test]
async fn cors_opens_for_configured_origins_only() {
    let h = harness_with(|c| {
        c.api_key = Some("sekret".into());
        c.cors_allow_origins = vec!["https://app.example,https://other.example".into()];
    })
    .await;
    // A preflight carries no key and still gets its grant.
    let response = h.send(preflight("https://app.example")).await;
    assert!(response.status().is_success(), "{}", response.status());
    let headers = response.headers();
    assert_eq!(headers[ALLOW_ORIGIN], "https://app.example");
    let methods = headers["access-control-allow-methods"]
        .to_str()
        .unwrap_or_default();
    assert!(methods.contains("POST"), "{methods}");
    let allowed = headers["access-control-allow-headers"]
        .to_str()
        .unwrap_or_default()
        .to_ascii_lowercase();
    assert!(allowed.contains("authorization") && allowed.contains("content-type"));

    // Errors a page may read carry the grant too.
    let response = h.send(get_from("https://other.example")).await;
    assert_eq!(response.headers()[ALLOW_ORIGIN], "https://other.example");
    error_of(response, StatusCode::UNAUTHORIZED).await;

    for origin in ["https://evil.example", "https://app.example.evil.example"] {
        let response = h.send(preflight(origin)).await;
        assert!(response.headers().get(ALLOW_ORIGIN).is_none(), "{origin}");
        let response = h.send(get_from(origin)).await;
        assert!(response.headers().get(ALLOW_ORIGIN).is_none(), "{origin}");
    }

    let any = harness_with(|c| c.cors_allow_origins = vec!["*".into()]).await;
    let response = any.send(get_from("https://anyone.example")).await;
    assert_eq!(response.headers()[ALLOW_ORIGIN], "*");
}

#[tokio::test]
async fn a_bad_cors_origin_is_a_startup_error() {
    let fake = fake::start().await;
    let mut config = gyre_shim::ShimConfig::new(fake.endpoint.clone());
    config.cors_allow_origins = vec!["https://app.example/path".into()];
    assert!(gyre_shim::connect(config).await.is_err());
}

#[tokio::test]
async fn nesting_over_the_limit_is_a_400_naming_the_field() {
    let mut h = harness().await;
    let limit = gyre_shim::limits::MAX_JSON_DEPTH;
    // 49 levels inside chat_template_kwargs: the 500.
    let body = chat(json!({"chat_template_kwargs": {"deep": nested(48)}}));
    let e = error_of(
        h.post("/v1/chat/completions", &body).await,
        StatusCode::BAD_REQUEST,
    )
    .await;
    assert_eq!(e["param"], "chat_template_kwargs");
    assert_eq!(e["code"], "nesting_too_deep");
    let message = e["message"].as_str().unwrap_or_default();
    assert!(message.contains(&limit.to_string()), "{message}");
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
                      "chat_template_kwargs": nested(limit)});
    let e = error_of(h.post("/tokenize", &body).await, StatusCode::BAD_REQUEST).await;
    assert_eq!(e["param"], "chat_template_kwargs");
    // Anywhere in the body, e.g. a tool's JSON schema.
    let tool = json!({"type": "function", "function": {"name": "f", "parameters": nested(limit)}});
    let e = error_of(
        h.post("/v1/chat/completions", &chat(json!({"tools": [tool]})))
            .await,
        StatusCode::BAD_REQUEST,
    )
    .await;
    assert_eq!(e["param"], "tools");
    assert!(
        h.seen().is_none(),
        "too-deep bodies must not reach the service"
    );

    // Exactly at the limit: the body (level 1) holds the kwargs object
    // (level 2) which holds `limit - 2` more levels.
    let body = chat(json!({"chat_template_kwargs": {"deep": nested(limit - 2)}}));
    let response = h.post("/v1/chat/completions", &body).await;
    assert_eq!(response.status(), StatusCode::OK);
    let seen = h.seen().expect("request reached the service");
    let Some(pb::request::Input::Chat(input)) = seen.input else {
        panic!("chat input expected");
    };
    assert!(
        input
            .chat_template_kwargs
            .is_some_and(|k| k.fields.contains_key("deep"))
    );
}

#[tokio::test]
async fn list_sizes_are_limited_at_the_edge() {
    use gyre_shim::limits::{MAX_LOGIT_BIAS, MAX_MESSAGES, MAX_STOP_TOKEN_IDS, MAX_TOOLS};
    let mut h = harness().await;
    let tool = json!({"type": "function", "function": {"name": "f"}});
    let message = json!({"role": "user", "content": "x"});
    let bias: serde_json::Map<String, Value> = (0..=MAX_LOGIT_BIAS)
        .map(|i| (i.to_string(), json!(1)))
        .collect();
    let cases = [
        (
            chat(json!({"tools": vec![tool.clone(); MAX_TOOLS + 1]})),
            "tools",
            MAX_TOOLS,
        ),
        (
            chat(json!({"messages": vec![message.clone(); MAX_MESSAGES + 1]})),
            "messages",
            MAX_MESSAGES,
        ),
        (
            completion(json!({"logit_bias": bias})),
            "logit_bias",
            MAX_LOGIT_BIAS,
        ),
        (
            completion(json!({"stop_token_ids": vec![1; MAX_STOP_TOKEN_IDS + 1]})),
            "stop_token_ids",
            MAX_STOP_TOKEN_IDS,
        ),
    ];
    for (body, param, limit) in cases {
        let path = if body.get("messages").is_some() {
            "/v1/chat/completions"
        } else {
            "/v1/completions"
        };
        let e = error_of(h.post(path, &body).await, StatusCode::BAD_REQUEST).await;
        assert_eq!(
            (e["param"].as_str(), e["code"].as_str()),
            (Some(param), Some("too_many_items"))
        );
        let message = e["message"].as_str().unwrap_or_default();
        assert!(message.contains(&limit.to_string()), "{message}");
    }
    assert!(h.seen().is_none());
    // At the limits: served.
    let body = chat(json!({"tools": vec![tool; MAX_TOOLS], "messages": vec![message; 8]}));
    assert_eq!(
        h.post("/v1/chat/completions", &body).await.status(),
        StatusCode::OK
    );
}

/// Each place an error message quotes client input quotes at most
/// `gyre_api::MAX_ECHO_CHARS` characters of it.
#[tokio::test]
async fn echoed_input_is_clipped() {
    let h = harness().await;
    let long = "y".repeat(20_000);
    let requests = [
        (
            "/v1/chat/completions",
            chat(json!({"messages": [{"role": long, "content": "x"}]})),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"messages": [{"role": "user", "content": [{"type": long}]}]})),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"tools": [{"type": long}]})),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"response_format": {"type": long}})),
        ),
        ("/v1/chat/completions", chat(json!({"temperature": long}))),
        (
            "/v1/chat/completions",
            chat(json!({"model": format!("missing{long}")})),
        ),
        (
            "/v1/completions",
            completion(json!({ "logit_bias": map(&long, json!(1)) })),
        ),
        (
            "/v1/completions",
            completion(json!({ "logit_bias": map(&long, json!("x")) })),
        ),
        ("/v1/completions", completion(json!({"prompt": [1, long]}))),
        ("/v1/completions", completion(json!({"stop": [long, 1]}))),
        (
            "/tokenize",
            json!({"model": format!("missing{long}"), "prompt": "x"}),
        ),
    ];
    let limit = gyre_api::MAX_ECHO_CHARS + 200;
    for (path, body) in requests {
        let response = h.post(path, &body).await;
        assert!(
            response.status().is_client_error(),
            "{path}: {}",
            response.status()
        );
        let error = json_of(response).await["error"].clone();
        let message = error["message"].as_str().unwrap_or_default();
        assert!(message.chars().count() < limit, "{path}: {message}");
        let param = error["param"].as_str().unwrap_or_default();
        assert!(param.chars().count() < limit, "{path}: {param}");
    }
    let gets = [format!("/v1/models/{long}"), format!("/v1/{long}")];
    for path in gets {
        let response = h
            .send(Request::get(&path).body(Body::empty()).expect("request"))
            .await;
        let e = error_of(response, StatusCode::NOT_FOUND).await;
        let message = e["message"].as_str().unwrap_or_default();
        assert!(message.chars().count() < limit, "{message}");
    }
    let response = h
        .send(post("/v1/completions", Some(&format!("text/{long}")), "{}"))
        .await;
    let e = error_of(response, StatusCode::UNSUPPORTED_MEDIA_TYPE).await;
    assert!(e["message"].as_str().unwrap_or_default().chars().count() < limit);
}

#[tokio::test]
async fn unknown_models_get_one_404_format_on_every_route() {
    let h = harness().await;
    let model = "missing-model";
    let expected = json!({
        "message": "the model `missing-model` does not exist",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    });
    for path in ["/v1/chat/completions", "/v1/completions", "/tokenize"] {
        for stream in [false, true] {
            let mut body = body_for(path, model);
            if path != "/tokenize" {
                body["stream"] = json!(stream);
            }
            let e = error_of(h.post(path, &body).await, StatusCode::NOT_FOUND).await;
            assert_eq!(e, expected, "{path} stream={stream}");
        }
    }
    let response = h
        .send(
            Request::get(format!("/v1/models/{model}"))
                .body(Body::empty())
                .expect("request"),
        )
        .await;
    assert_eq!(error_of(response, StatusCode::NOT_FOUND).await, expected);

    let long = format!("missing{}", "é".repeat(1000));
    let e = error_of(
        h.post("/v1/completions", &body_for("/v1/completions", &long))
            .await,
        StatusCode::NOT_FOUND,
    )
    .await;
    let clipped = gyre_api::clip(&long);
    assert_eq!(
        e["message"],
        format!("the model `{clipped}` does not exist")
    );
}

#[tokio::test]
async fn whole_number_floats_are_integers() {
    let mut h = harness().await;
    // (The fake answers one choice: `n: 2.0` is served end to end in
    // tests/test_http_hardening.py.)
    let body = chat(
        json!({"n": 1.0, "max_tokens": 16.0, "seed": 3.0, "logprobs": true,
                          "top_logprobs": 2.0, "top_k": 5.0, "min_tokens": 1.0}),
    );
    assert_eq!(
        h.post("/v1/chat/completions", &body).await.status(),
        StatusCode::OK
    );
    let req = h.seen().expect("request seen");
    let sampling = req.sampling.clone().unwrap_or_default();
    assert_eq!(
        (req.n, req.max_tokens, req.logprobs, req.min_tokens),
        (Some(1), Some(16), Some(2), Some(1))
    );
    assert_eq!((sampling.seed, sampling.top_k), (Some(3), Some(5)));

    // (The fake sends no logprobs, so completions' `logprobs` is checked end
    // to end in tests/test_http_hardening.py.)
    let body = completion(json!({"max_tokens": 4e0, "best_of": 1.0, "priority": 2.0}));
    assert_eq!(
        h.post("/v1/completions", &body).await.status(),
        StatusCode::OK
    );
    let req = h.seen().expect("request seen");
    assert_eq!((req.max_tokens, req.priority), (Some(4), Some(-2)));

    for (field, value) in [
        ("n", json!(2.5)),
        ("max_tokens", json!(16.25)),
        ("seed", json!(0.5)),
    ] {
        let mut body = completion(json!({}));
        body[field] = value;
        let e = error_of(
            h.post("/v1/completions", &body).await,
            StatusCode::BAD_REQUEST,
        )
        .await;
        assert_eq!(e["param"], field);
    }
    assert!(h.seen().is_none());
}

#[tokio::test]
async fn a_null_prompt_is_a_400_saying_why() {
    let mut h = harness().await;
    let e = error_of(
        h.post("/v1/completions", &completion(json!({"prompt": null})))
            .await,
        StatusCode::BAD_REQUEST,
    )
    .await;
    assert_eq!(e["param"], "prompt");
    let message = e["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("null") && message.contains("default"),
        "{message}"
    );
    assert!(h.seen().is_none());
}

#[tokio::test]
async fn top_p_zero_keeps_only_the_most_likely_token() {
    let mut h = harness().await;
    for body in [
        chat(json!({"top_p": 0})),
        completion(json!({"top_p": 0.0, "top_k": 40})),
    ] {
        let path = if body.get("messages").is_some() {
            "/v1/chat/completions"
        } else {
            "/v1/completions"
        };
        assert_eq!(h.post(path, &body).await.status(), StatusCode::OK);
        let sampling = h.seen().and_then(|r| r.sampling).expect("sampling");
        assert_eq!((sampling.top_p, sampling.top_k), (None, Some(1)));
    }
    let body = chat(json!({"top_p": 0.5}));
    assert_eq!(
        h.post("/v1/chat/completions", &body).await.status(),
        StatusCode::OK
    );
    let sampling = h.seen().and_then(|r| r.sampling).expect("sampling");
    assert_eq!((sampling.top_p, sampling.top_k), (Some(0.5), None));
}

#[tokio::test]
async fn an_empty_model_is_served_and_named_as_the_default_model() {
    let mut h = harness().await;
    // The fake lists "tiny/llama" first.
    for path in ["/v1/chat/completions", "/v1/completions"] {
        let body = body_for(path, "");
        let response = h.post(path, &body).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(json_of(response).await["model"], "tiny/llama", "{path}");
        assert_eq!(h.seen().map(|r| r.model).as_deref(), Some("tiny/llama"));

        let mut body = body_for(path, "");
        body["stream"] = json!(true);
        let response = h.post(path, &body).await;
        let bytes = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let chunks: Vec<Value> = text
            .split("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str(d).expect("chunk"))
            .collect();
        assert!(!chunks.is_empty());
        assert!(chunks.iter().all(|c| c["model"] == "tiny/llama"), "{text}");
    }
}
