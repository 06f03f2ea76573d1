//! The shim's HTTP edge against a fake gRPC service: JSON content types
//! (415), CORS closed unless configured, the nesting and list limits, and
//! clipped echoes of client input. The input decisions are in
//! `http_inputs.rs`.

mod edge_harness;
mod fake;

use axum::body::Body;
use edge_harness::*;
use gyre_api::v1 as pb;
use http::{Request, StatusCode};
use serde_json::{Value, json};

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
