//! CORS of the gRPC port of `gyre serve`, for gRPC-Web from browsers.
//!
//! A web page calling the gRPC port over gRPC-Web (the playground, or a
//! user's own app built on the TypeScript client's `gyre-client/web`) is on
//! another origin than the port, so the browser asks the port for CORS.
//! [`GrpcCors`] grants it to two kinds of origin, and to no other:
//!
//! - The playground page (unless `--no-playground`): an origin whose scheme
//!   is the server's, whose port is the HTTP port, and whose host is the
//!   host the call itself was sent to (its `Host` / `:authority`). That is
//!   exactly the page served by this process's HTTP port under whatever
//!   name the browser reached it by (localhost, an IP, a DNS name).
//! - The origins of `--cors-allow-origin` (or any origin for `*`), the same
//!   ones the HTTP API grants ([`crate::cors`]).
//!
//! A granted origin may POST with whatever request headers it asks for and
//! read the headers a gRPC-Web client needs (a trailers-only answer's status
//! is in them); the answer names the caller's origin. Without the
//! playground and without origins the gRPC port has no CORS layer at all.

use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use http::header::{self, HeaderName, HeaderValue};
use http::{Method, request::Parts};
use tower_http::cors::{AllowHeaders, AllowOrigin, Cors, CorsLayer};

use crate::cors::{CorsError, Origins};

/// How long a browser may cache a preflight answer of the gRPC port.
const PREFLIGHT_MAX_AGE: Duration = Duration::from_secs(600);

/// The gRPC port's CORS rule (see the module docs).
#[derive(Debug, Clone)]
pub struct GrpcCors {
    https: bool,
    /// The HTTP port the playground is served on, when it is; 0 until that
    /// port is bound ([`GrpcCors::set_http_port`]), and then no page of the
    /// playground is granted yet.
    playground_port: Option<Arc<AtomicU16>>,
    /// `--cors-allow-origin`.
    origins: Option<Origins>,
}

impl GrpcCors {
    /// The rule of a server whose ports use TLS (`https`) or not, with the
    /// playground served or not, and `origins` as `--cors-allow-origin`
    /// gives them; `None` when it would grant nothing (no playground, no
    /// origins).
    pub fn new(
        https: bool,
        playground: bool,
        origins: &[String],
    ) -> Result<Option<Self>, CorsError> {
        let origins = crate::cors::parse(origins)?;
        if !playground && origins.is_none() {
            return Ok(None);
        }
        Ok(Some(Self {
            https,
            playground_port: playground.then(|| Arc::new(AtomicU16::new(0))),
            origins,
        }))
    }

    /// The port the HTTP API (and so the playground page) is served on.
    pub fn set_http_port(&self, port: u16) {
        if let Some(p) = &self.playground_port {
            p.store(port, Ordering::Relaxed);
        }
    }

    /// Whether a call carrying `origin`, sent to `host` (`Host` or
    /// `:authority`, with or without a port), is granted.
    pub fn allows(&self, origin: &HeaderValue, host: Option<&str>) -> bool {
        if self.origins.as_ref().is_some_and(|o| o.allows(origin)) {
            return true;
        }
        match (origin.to_str(), host) {
            (Ok(origin), Some(host)) => self.is_playground(origin, host),
            _ => false,
        }
    }

    /// Whether `origin`, calling `host`, is this server's playground page.
    fn is_playground(&self, origin: &str, host: &str) -> bool {
        let http_port = match &self.playground_port {
            Some(p) => p.load(Ordering::Relaxed),
            None => return false,
        };
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
    /// the response headers a gRPC-Web client reads.
    pub fn layer(&self) -> CorsLayer {
        let this = self.clone();
        CorsLayer::new()
            .allow_origin(AllowOrigin::predicate(
                move |origin: &HeaderValue, parts: &Parts| this.allows(origin, called_host(parts)),
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

/// The gRPC routes `inner`, behind the CORS layer of `cors` when there is
/// one, as they were otherwise.
pub fn grpc_service<S>(inner: S, cors: Option<&GrpcCors>) -> tower::util::Either<Cors<S>, S> {
    match cors {
        Some(c) => tower::util::Either::Left(tower::Layer::layer(&c.layer(), inner)),
        None => tower::util::Either::Right(inner),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rule of a server with the playground on `port`, and `origins`.
    fn with_origins(port: u16, https: bool, origins: &[&str]) -> GrpcCors {
        let origins: Vec<String> = origins.iter().map(|o| (*o).to_owned()).collect();
        let c = GrpcCors::new(https, true, &origins)
            .expect("valid origins")
            .expect("a rule");
        c.set_http_port(port);
        c
    }

    fn cors(port: u16, https: bool) -> GrpcCors {
        with_origins(port, https, &[])
    }

    /// `allows` for string arguments.
    trait Allows {
        fn allows_str(&self, origin: &str, host: &str) -> bool;
    }

    impl Allows for GrpcCors {
        fn allows_str(&self, origin: &str, host: &str) -> bool {
            self.allows(
                &HeaderValue::from_str(origin).expect("header value"),
                Some(host),
            )
        }
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
            assert!(c.allows_str(origin, host), "{origin} -> {host}");
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
            assert!(!c.allows_str(origin, host), "{origin} -> {host}");
        }
    }

    #[test]
    fn default_ports_and_tls() {
        assert!(cors(80, false).allows_str("http://box.example", "box.example:50051"));
        assert!(cors(443, true).allows_str("https://box.example", "box.example:50051"));
        assert!(!cors(443, true).allows_str("http://box.example:443", "box.example:50051"));
        assert!(cors(8443, true).allows_str("https://box.example:8443", "box.example"));
    }

    #[test]
    fn nothing_is_allowed_before_the_http_port_is_known() {
        let c = GrpcCors::new(false, true, &[])
            .expect("valid")
            .expect("a rule");
        assert!(!c.allows_str("http://127.0.0.1:0", "127.0.0.1:50051"));
        assert!(!c.allows_str("http://127.0.0.1", "127.0.0.1:50051"));
    }

    #[test]
    fn configured_origins_are_granted_whatever_the_host() {
        let c = with_origins(
            8000,
            false,
            &["https://app.example", "http://127.0.0.1:3000"],
        );
        for (origin, host) in [
            ("https://app.example", "gpu-box.example:50051"),
            ("https://app.example", "127.0.0.1:50051"),
            ("http://127.0.0.1:3000", "127.0.0.1:50051"),
            // The playground's own rule still holds beside them.
            ("http://127.0.0.1:8000", "127.0.0.1:50051"),
        ] {
            assert!(c.allows_str(origin, host), "{origin} -> {host}");
        }
        for (origin, host) in [
            ("http://app.example", "127.0.0.1:50051"),
            ("https://app.example:8443", "127.0.0.1:50051"),
            ("https://evil.example", "127.0.0.1:50051"),
            ("http://127.0.0.1:3001", "127.0.0.1:50051"),
        ] {
            assert!(!c.allows_str(origin, host), "{origin} -> {host}");
        }
        // A configured origin needs no host to be granted; the playground's does.
        let value = |s: &str| HeaderValue::from_str(s).expect("header value");
        assert!(c.allows(&value("https://app.example"), None));
        assert!(!c.allows(&value("http://127.0.0.1:8000"), None));
    }

    #[test]
    fn without_the_playground_only_the_configured_origins() {
        let origins = ["https://app.example".to_owned()];
        let c = GrpcCors::new(false, false, &origins)
            .expect("valid")
            .expect("a rule");
        c.set_http_port(8000);
        assert!(c.allows_str("https://app.example", "127.0.0.1:50051"));
        assert!(!c.allows_str("http://127.0.0.1:8000", "127.0.0.1:50051"));
    }

    #[test]
    fn a_wildcard_grants_any_origin() {
        let c = GrpcCors::new(false, false, &["*".to_owned()])
            .expect("valid")
            .expect("a rule");
        for origin in ["https://app.example", "http://127.0.0.1:1", "null"] {
            assert!(c.allows_str(origin, "127.0.0.1:50051"), "{origin}");
        }
    }

    #[test]
    fn no_playground_and_no_origins_is_no_rule_and_bad_origins_are_errors() {
        assert!(GrpcCors::new(false, false, &[]).expect("valid").is_none());
        assert!(
            GrpcCors::new(true, false, &[" , ".to_owned()])
                .expect("valid")
                .is_none()
        );
        assert_eq!(
            GrpcCors::new(false, true, &["app.example".to_owned()]).err(),
            Some(CorsError::NotAnOrigin("app.example".to_owned()))
        );
        assert_eq!(
            GrpcCors::new(false, false, &["*,https://a.example".to_owned()]).err(),
            Some(CorsError::WildcardWithOthers)
        );
    }
}
