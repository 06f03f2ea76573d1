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
//! gRPC port needs CORS for it: [`crate::grpc_cors::GrpcCors`] grants it.

use axum::Router;
use axum::response::Response;
use axum::routing::get;
use http::header::{self, HeaderValue};

use crate::AppState;

/// The page's path on the HTTP port.
pub const PATH: &str = "/playground";

const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const GRPC_WEB_JS: &str = include_str!("assets/grpcweb.js");
const STYLE_CSS: &str = include_str!("assets/style.css");

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
    /// a gRPC-Web client of the gRPC port), and grant that page no CORS on
    /// the gRPC port (the --cors-allow-origin origins keep theirs).
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

#[cfg(test)]
mod tests {
    use super::*;

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
