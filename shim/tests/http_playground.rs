//! The playground's routes on the HTTP port (on, off, open under an API
//! key) and the gRPC port's CORS for it and for --cors-allow-origin
//! origins, without a model: the shim's router in front of the fake gRPC
//! service, and the CORS wrapper around a stand-in for the gRPC routes. The page itself, in a browser against a real
//! server, is tests/test_playground.py.

mod edge_harness;
mod fake;

use std::convert::Infallible;

use axum::body::Body;
use edge_harness::*;
use gyre_shim::grpc_cors::{GrpcCors, grpc_service};
use gyre_shim::playground::Settings;
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use serde_json::json;
use tower::ServiceExt;

const SETTINGS: Settings = Settings {
    grpc_scheme: "http",
    grpc_port: 50123,
    key_required: false,
};

fn get(path: &str) -> Request<Body> {
    Request::get(path).body(Body::empty()).expect("request")
}

async fn text_of(response: Response<Body>) -> String {
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    String::from_utf8(bytes.to_vec()).expect("utf-8")
}

/// The `"/playground/..."` paths a page file refers to (src, href, import).
fn referenced_paths(text: &str) -> Vec<String> {
    text.split('"')
        .filter(|s| s.starts_with("/playground/"))
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn the_page_and_every_file_it_refers_to_are_served() {
    let h = harness_with(|c| c.playground = Some(SETTINGS)).await;
    for path in ["/playground", "/playground/"] {
        let response = h.send(get(path)).await;
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        let headers = response.headers();
        assert_eq!(headers["content-type"], "text/html; charset=utf-8");
        assert_eq!(headers["x-content-type-options"], "nosniff");
        let csp = headers["content-security-policy"].to_str().expect("ascii");
        assert!(csp.contains("script-src 'self'"), "{csp}");
        let html = text_of(response).await;
        assert!(html.contains("<title>gyre playground</title>"), "{html}");
    }
    let html = text_of(h.send(get("/playground")).await).await;
    let mut paths = referenced_paths(&html);
    let app = text_of(h.send(get("/playground/app.js")).await).await;
    paths.extend(referenced_paths(&app));
    paths.sort();
    paths.dedup();
    assert_eq!(
        paths,
        [
            "/playground/app.js",
            "/playground/config.json",
            "/playground/grpcweb.js",
            "/playground/style.css"
        ]
    );
    for path in &paths {
        let response = h.send(get(path)).await;
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        let want = match path.rsplit('.').next() {
            Some("js") => "text/javascript; charset=utf-8",
            Some("css") => "text/css; charset=utf-8",
            _ => "application/json",
        };
        assert_eq!(response.headers()["content-type"], want, "{path}");
        assert!(!text_of(response).await.is_empty(), "{path}");
    }
    let config = json_of(h.send(get("/playground/config.json")).await).await;
    assert_eq!(
        config,
        json!({"grpc": {"scheme": "http", "port": 50123}, "key_required": false})
    );
}

#[tokio::test]
async fn the_page_needs_no_key_but_the_api_still_does() {
    let h = harness_with(|c| {
        c.api_key = Some("sekret".into());
        c.playground = Some(Settings {
            key_required: true,
            ..SETTINGS
        });
    })
    .await;
    for path in [
        "/playground",
        "/playground/app.js",
        "/playground/config.json",
    ] {
        assert_eq!(h.send(get(path)).await.status(), StatusCode::OK, "{path}");
    }
    let config = json_of(h.send(get("/playground/config.json")).await).await;
    assert_eq!(config["key_required"], true);
    error_of(h.send(get("/v1/models")).await, StatusCode::UNAUTHORIZED).await;
    // Only the playground's own paths are open.
    error_of(h.send(get("/playgroundx")).await, StatusCode::UNAUTHORIZED).await;
}

#[tokio::test]
async fn without_the_playground_its_paths_are_404() {
    let h = harness().await;
    for path in [
        "/playground",
        "/playground/app.js",
        "/playground/config.json",
    ] {
        let e = error_of(h.send(get(path)).await, StatusCode::NOT_FOUND).await;
        assert_eq!(e["code"], "not_found", "{path}");
    }
}

/// A stand-in for the gRPC routes: 200 with a marker header, for any request.
async fn routes(_req: Request<Body>) -> Result<Response<Body>, Infallible> {
    Ok(Response::builder()
        .header("x-reached", "routes")
        .body(Body::empty())
        .expect("response"))
}

fn preflight(origin: &str, host: &str) -> Request<Body> {
    Request::builder()
        .method(Method::OPTIONS)
        .uri("/gyre.v1.Generation/GenerateStream")
        .header("host", host)
        .header("origin", origin)
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "authorization,content-type,x-grpc-web,x-user-agent",
        )
        .body(Body::empty())
        .expect("request")
}

#[tokio::test]
async fn the_grpc_port_grants_the_page_of_its_own_http_port_only() {
    let cors = GrpcCors::new(false, true, &[])
        .expect("valid")
        .expect("a rule");
    cors.set_http_port(8000);
    let svc = grpc_service(tower::service_fn(routes), Some(&cors));

    let granted = svc
        .clone()
        .oneshot(preflight("http://localhost:8000", "localhost:50051"))
        .await
        .expect("infallible");
    assert!(granted.status().is_success());
    let h = granted.headers();
    assert_eq!(h["access-control-allow-origin"], "http://localhost:8000");
    assert!(
        h.get("x-reached").is_none(),
        "a preflight is answered by the layer"
    );
    assert!(
        h["access-control-allow-methods"]
            .to_str()
            .expect("ascii")
            .contains("POST")
    );
    let allowed = h["access-control-allow-headers"].to_str().expect("ascii");
    for name in ["authorization", "content-type", "x-grpc-web"] {
        assert!(allowed.contains(name), "{allowed}");
    }

    for (origin, host) in [
        ("http://evil.example:8000", "localhost:50051"),
        ("http://localhost:3000", "localhost:50051"),
    ] {
        let refused = svc
            .clone()
            .oneshot(preflight(origin, host))
            .await
            .expect("infallible");
        assert!(
            refused
                .headers()
                .get("access-control-allow-origin")
                .is_none(),
            "{origin}"
        );
    }

    // The call itself reaches the routes and carries the grant, with the
    // gRPC status headers readable by the page.
    let call = Request::post("/gyre.v1.Generation/GetStats")
        .header("host", "127.0.0.1:50051")
        .header("origin", "http://127.0.0.1:8000")
        .header("content-type", "application/grpc-web+proto")
        .body(Body::empty())
        .expect("request");
    let answer = svc.clone().oneshot(call).await.expect("infallible");
    let h = answer.headers();
    assert_eq!(h["x-reached"], "routes");
    assert_eq!(h["access-control-allow-origin"], "http://127.0.0.1:8000");
    let exposed = h["access-control-expose-headers"].to_str().expect("ascii");
    assert!(
        exposed.contains("grpc-status") && exposed.contains("grpc-message"),
        "{exposed}"
    );
}

#[tokio::test]
async fn without_the_playground_or_origins_the_grpc_port_has_no_cors() {
    let cors = GrpcCors::new(false, false, &[]).expect("valid");
    assert!(cors.is_none());
    let svc = grpc_service(tower::service_fn(routes), cors.as_ref());
    let answer = svc
        .oneshot(preflight("http://localhost:8000", "localhost:50051"))
        .await
        .expect("infallible");
    assert_eq!(answer.headers()["x-reached"], "routes");
    assert!(
        answer
            .headers()
            .get("access-control-allow-origin")
            .is_none()
    );
}

#[tokio::test]
async fn the_grpc_port_grants_the_configured_origins_too() {
    // --no-playground with --cors-allow-origin: those origins only.
    let origins = ["https://app.example,http://127.0.0.1:3000".to_owned()];
    let cors = GrpcCors::new(false, false, &origins)
        .expect("valid")
        .expect("a rule");
    cors.set_http_port(8000);
    let svc = grpc_service(tower::service_fn(routes), Some(&cors));
    for origin in ["https://app.example", "http://127.0.0.1:3000"] {
        let granted = svc
            .clone()
            .oneshot(preflight(origin, "127.0.0.1:50051"))
            .await
            .expect("infallible");
        assert!(granted.status().is_success(), "{origin}");
        assert_eq!(granted.headers()["access-control-allow-origin"], origin);
        let allowed = granted.headers()["access-control-allow-headers"]
            .to_str()
            .expect("ascii");
        assert!(allowed.contains("x-grpc-web"), "{allowed}");
    }
    for origin in ["http://127.0.0.1:8000", "https://evil.example"] {
        let refused = svc
            .clone()
            .oneshot(preflight(origin, "127.0.0.1:50051"))
            .await
            .expect("infallible");
        assert!(
            refused
                .headers()
                .get("access-control-allow-origin")
                .is_none(),
            "{origin}"
        );
    }
    let call = Request::post("/gyre.v1.Generation/GetStats")
        .header("host", "127.0.0.1:50051")
        .header("origin", "https://app.example")
        .header("content-type", "application/grpc-web+proto")
        .body(Body::empty())
        .expect("request");
    let answer = svc.oneshot(call).await.expect("infallible");
    let h = answer.headers();
    assert_eq!(h["x-reached"], "routes");
    assert_eq!(h["access-control-allow-origin"], "https://app.example");
    let exposed = h["access-control-expose-headers"].to_str().expect("ascii");
    assert!(
        exposed.contains("grpc-status") && exposed.contains("grpc-message"),
        "{exposed}"
    );
}
