//! The playground: a small web page on the HTTP port of `gyre serve`
//! (`/playground`) that talks gRPC-Web straight to the gRPC port.
//!
//! The page's files (`assets/`) are compiled into the binary with
//! `include_str!`: nothing is read from disk or fetched from elsewhere at
//! run time. They are plain HTML, CSS and ES modules, written by hand with
//! no build step; `assets/grpcweb.js` is the gRPC-Web transport (fetch,
//! length-prefixed frames, trailers) and the protobuf wire format of the
//! few `gyre.v1` messages the page sends and reads.
//!
//! Routes (all `GET`, open even under `--api-key`: they hold no data, and
//! the page sends the key the user types to the gRPC port itself):
//! `/playground` (and `/playground/`), `/playground/app.js`,
//! `/playground/grpcweb.js`, `/playground/style.css`, and
//! `/playground/config.json`, which tells the page the gRPC port's scheme
//! and port and whether a key is needed. `gyre serve --no-playground`
//! leaves them out (404 like any unknown path).
//!
//! The page's origin differs from the gRPC port's (another port), so the
//! gRPC port needs CORS for it: [`GrpcCors`] grants gRPC-Web calls to an
//! origin whose scheme is the server's, whose port is the HTTP port, and
//! whose host is the host the call itself was sent to (its `Host` /
//! `:authority`). That is exactly the page served by this process's HTTP
//! port under whatever name the browser reached it by (localhost, an IP,
//! a DNS name), and no other web page. Without the playground the gRPC
//! port has no CORS layer at all, as before.

use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use axum::Router;
use axum::response::Response;
use axum::routing::get;
use http::header::{self, HeaderName, HeaderValue};
use http::{Method, request::Parts};
use tower_http::cors::{AllowHeaders, AllowOrigin, Cors, CorsLayer};

use crate::AppState;

/// The page's path on the HTTP port.
pub const PATH: &str = "/playground";

const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const GRPC_WEB_JS: &str = include_str!("assets/grpcweb.js");
const STYLE_CSS: &str = include_str!("assets/style.css");

/// How long a browser may cache a preflight answer of the gRPC port.
const PREFLIGHT_MAX_AGE: Duration = Duration::from_secs(600);

/// The page may run only its own scripts and styles, load nothing else, and
/// connect anywhere (the gRPC port is another origin, and its URL can be
/// edited in the page).
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src *; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

/// `--no-playground` (`gyre serve`).
#[derive(Debug, Clone, clap::Args)]
pub struct PlaygroundArgs {
    /// Do not serve the playground page (`/playground` on the HTTP port,
    /// a gRPC-Web client of the gRPC port), and keep the gRPC port without
    /// CORS.
    #[arg(long, env = "GYRE_NO_PLAYGROUND")]
    pub no_playground: bool,
}

/// What the page is told about the server, at `/playground/config.json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// `http` or `https` (the gRPC port's, which is the HTTP port's).
    pub grpc_scheme: &'static str,
    /// The gRPC port; the page reaches it on the host it was loaded from.
    pub grpc_port: u16,
    /// Whether calls need `authorization: Bearer <key>` (`--api-key` or
    /// `--keys-file`); the page then asks for the key.
    pub key_required: bool,
}

/// Whether `path` is one of the playground's routes (served without a key).
pub(crate) fn is_playground_path(path: &str) -> bool {
    path == PATH
        || path
            .strip_prefix(PATH)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// `router` with the playground's routes.
pub(crate) fn add_routes(router: Router<AppState>, settings: &Settings) -> Router<AppState> {
    let config = serde_json::json!({
        "grpc": { "scheme": settings.grpc_scheme, "port": settings.grpc_port },
        "key_required": settings.key_required,
    })
    .to_string();
    let index = || async { asset(INDEX_HTML, "text/html; charset=utf-8") };
    router
        .route(PATH, get(index))
        .route(&format!("{PATH}/"), get(index))
        .route(
            &format!("{PATH}/app.js"),
            get(|| async { asset(APP_JS, "text/javascript; charset=utf-8") }),
        )
        .route(
            &format!("{PATH}/grpcweb.js"),
            get(|| async { asset(GRPC_WEB_JS, "text/javascript; charset=utf-8") }),
        )
        .route(
            &format!("{PATH}/style.css"),
            get(|| async { asset(STYLE_CSS, "text/css; charset=utf-8") }),
        )
        .route(
            &format!("{PATH}/config.json"),
            get(move || {
                let config = config.clone();
                async move { asset(config, "application/json") }
            }),
        )
}

/// A file of the page, revalidated on every load (a new binary may serve
/// new files under the same names).
fn asset(body: impl Into<axum::body::Body>, content_type: &'static str) -> Response {
    let mut response = Response::new(body.into());
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

/// CORS of the gRPC port for the playground page (see the module docs).
/// The HTTP port is set once it is bound ([`GrpcCors::set_http_port`]);
/// until then no origin is granted.
#[derive(Debug, Clone)]
pub struct GrpcCors {
    https: bool,
    http_port: Arc<AtomicU16>,
}

impl GrpcCors {
    /// For a server whose ports use TLS (`https`) or not.
    pub fn new(https: bool) -> Self {
        Self {
            https,
            http_port: Arc::new(AtomicU16::new(0)),
        }
    }

    /// The port the HTTP API (and so the page) is served on.
    pub fn set_http_port(&self, port: u16) {
        self.http_port.store(port, Ordering::Relaxed);
    }

    /// Whether a call carrying `origin`, sent to `host` (`Host` or
    /// `:authority`, with or without a port), comes from the playground.
    pub fn allows(&self, origin: &str, host: &str) -> bool {
        let http_port = self.http_port.load(Ordering::Relaxed);
        if http_port == 0 {
            return false;
        }
        let scheme = if self.https { "https" } else { "http" };
        let Some(rest) = origin
            .strip_prefix(scheme)
            .and_then(|r| r.strip_prefix("://"))
        else {
            return false;
        };
        let Some((origin_host, origin_port)) = split_host_port(rest) else {
            return false;
        };
        let origin_port = match origin_port {
            Some(p) => p,
            None if self.https => 443,
            None => 80,
        };
        let Some((called_host, _)) = split_host_port(host) else {
            return false;
        };
        origin_port == http_port && origin_host.eq_ignore_ascii_case(called_host)
    }

    /// The CORS layer: gRPC-Web's POST, whatever request headers the
    /// browser asks for (content-type, x-grpc-web, authorization, ...), and
    /// the response headers a gRPC-Web client reads (a trailers-only
    /// answer's status is in them).
    pub fn layer(&self) -> CorsLayer {
        let this = self.clone();
        CorsLayer::new()
            .allow_origin(AllowOrigin::predicate(
                move |origin: &HeaderValue, parts: &Parts| {
                    let Ok(origin) = origin.to_str() else {
                        return false;
                    };
                    called_host(parts).is_some_and(|host| this.allows(origin, host))
                },
            ))
            .allow_methods([Method::POST])
            .allow_headers(AllowHeaders::mirror_request())
            .expose_headers([
                HeaderName::from_static("grpc-status"),
                HeaderName::from_static("grpc-message"),
                HeaderName::from_static("grpc-status-details-bin"),
                HeaderName::from_static("gyre-model"),
                HeaderName::from_static("deprecation"),
                HeaderName::from_static("sunset"),
            ])
            .max_age(PREFLIGHT_MAX_AGE)
    }
}

/// The host a request was sent to: HTTP/2's `:authority` (in the URI),
/// else HTTP/1's `Host`.
fn called_host(parts: &Parts) -> Option<&str> {
    parts
        .uri
        .authority()
        .map(|a| a.as_str())
        .or_else(|| parts.headers.get(header::HOST)?.to_str().ok())
}

/// `host[:port]` or `[v6]:port` into the host (brackets kept) and the port;
/// None when it is not that shape.
fn split_host_port(s: &str) -> Option<(&str, Option<u16>)> {
    let (host, port) = if s.starts_with('[') {
        let end = s.find(']')?;
        let (host, rest) = s.split_at(end + 1);
        match rest {
            "" => (host, None),
            _ => (host, Some(rest.strip_prefix(':')?)),
        }
    } else {
        match s.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (s, None),
        }
    };
    if host.is_empty() || host.contains(['/', '@', '?', '#']) {
        return None;
    }
    let port = match port {
        Some(p) => Some(p.parse().ok()?),
        None => None,
    };
    Some((host, port))
}

/// The gRPC routes `inner`, behind the playground's CORS when `cors` is
/// set (the playground is on), as they were otherwise.
pub fn grpc_service<S>(inner: S, cors: Option<&GrpcCors>) -> tower::util::Either<Cors<S>, S> {
    match cors {
        Some(c) => tower::util::Either::Left(tower::Layer::layer(&c.layer(), inner)),
        None => tower::util::Either::Right(inner),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cors(port: u16, https: bool) -> GrpcCors {
        let c = GrpcCors::new(https);
        c.set_http_port(port);
        c
    }

    #[test]
    fn the_page_of_this_http_port_is_allowed_under_any_host_name() {
        let c = cors(8000, false);
        for (origin, host) in [
            ("http://127.0.0.1:8000", "127.0.0.1:50051"),
            ("http://localhost:8000", "localhost:50051"),
            ("http://LocalHost:8000", "localhost:50051"),
            ("http://gpu-box.example:8000", "gpu-box.example:50051"),
            ("http://[::1]:8000", "[::1]:50051"),
            ("http://10.1.2.3:8000", "10.1.2.3"),
        ] {
            assert!(c.allows(origin, host), "{origin} -> {host}");
        }
    }

    #[test]
    fn other_pages_are_refused() {
        let c = cors(8000, false);
        for (origin, host) in [
            // Another host: a page elsewhere calling this server.
            ("http://evil.example:8000", "127.0.0.1:50051"),
            ("http://localhost:8000", "127.0.0.1:50051"),
            // Another port of the same host: some other local web app.
            ("http://127.0.0.1:3000", "127.0.0.1:50051"),
            ("http://127.0.0.1", "127.0.0.1:50051"),
            // Another scheme.
            ("https://127.0.0.1:8000", "127.0.0.1:50051"),
            // Not origins.
            ("null", "127.0.0.1:50051"),
            ("http://127.0.0.1:8000/x", "127.0.0.1:50051"),
            ("http://user@127.0.0.1:8000", "127.0.0.1:50051"),
            ("http://127.0.0.1:80000", "127.0.0.1:50051"),
            ("http://[::1:8000", "[::1]:50051"),
            ("http://:8000", ":50051"),
        ] {
            assert!(!c.allows(origin, host), "{origin} -> {host}");
        }
    }

    #[test]
    fn default_ports_and_tls() {
        assert!(cors(80, false).allows("http://box.example", "box.example:50051"));
        assert!(cors(443, true).allows("https://box.example", "box.example:50051"));
        assert!(!cors(443, true).allows("http://box.example:443", "box.example:50051"));
        assert!(cors(8443, true).allows("https://box.example:8443", "box.example"));
    }

    #[test]
    fn nothing_is_allowed_before_the_http_port_is_known() {
        let c = GrpcCors::new(false);
        assert!(!c.allows("http://127.0.0.1:0", "127.0.0.1:50051"));
        assert!(!c.allows("http://127.0.0.1", "127.0.0.1:50051"));
    }

    #[test]
    fn playground_paths() {
        for p in ["/playground", "/playground/", "/playground/app.js"] {
            assert!(is_playground_path(p), "{p}");
        }
        for p in ["/playgroundx", "/play", "/v1/models", "/"] {
            assert!(!is_playground_path(p), "{p}");
        }
    }
}
