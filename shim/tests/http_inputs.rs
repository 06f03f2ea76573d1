//! The shim's input decisions against a fake gRPC service: one 404 format
//! for unknown models on every route, whole-number floats as integers,
//! `prompt: null` refused with the reason, `top_p: 0` as greedy, and
//! `model: ""` served and named as the default model.

mod edge_harness;
mod fake;

use axum::body::Body;
use edge_harness::*;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};

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
