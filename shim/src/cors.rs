//! Cross-origin resource sharing: closed unless configured.
//!
//! Without `--cors-allow-origin` (alias `--cors-origin`) the shim has no CORS layer at all: no
//! response carries `Access-Control-Allow-Origin`, and a browser's preflight
//! `OPTIONS` gets no grant (405), so web pages on other origins cannot read
//! answers or send JSON requests. Configured origins (or `*`, any origin)
//! get GET and POST with whatever request headers they ask for (the OpenAI
//! SDKs send their own), without credentials (browsers send the key as an
//! `Authorization` header, which needs none).
//!
//! The same origins get gRPC-Web CORS on the gRPC port of `gyre serve`
//! (see [`crate::grpc_cors`]).

use std::time::Duration;

use http::{HeaderValue, Method};
use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};

/// How long a browser may cache a preflight answer.
const PREFLIGHT_MAX_AGE: Duration = Duration::from_secs(600);

/// Why a `--cors-allow-origin` value was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CorsError {
    #[error(
        "CORS origin {0:?} is not an origin: give scheme://host[:port] without a path, or * for any"
    )]
    NotAnOrigin(String),
    #[error("CORS origin * (any) cannot be combined with other origins")]
    WildcardWithOthers,
}

/// The origins `--cors-allow-origin` grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origins {
    /// `*`: any origin.
    Any,
    /// Exactly these origins, as browsers send them.
    List(Vec<HeaderValue>),
}

impl Origins {
    /// Whether a request carrying `origin` is granted.
    pub fn allows(&self, origin: &HeaderValue) -> bool {
        match self {
            Origins::Any => true,
            Origins::List(list) => list.contains(origin),
        }
    }
}

/// The origins of `origins` (each entry may hold several, comma-separated;
/// blanks are ignored), or `None` when there are none: then CORS stays
/// closed.
pub fn parse(origins: &[String]) -> Result<Option<Origins>, CorsError> {
    let origins: Vec<&str> = origins
        .iter()
        .flat_map(|o| o.split(','))
        .map(str::trim)
        .filter(|o| !o.is_empty())
        .collect();
    if origins.is_empty() {
        return Ok(None);
    }
    if origins.contains(&"*") {
        if origins.len() > 1 {
            return Err(CorsError::WildcardWithOthers);
        }
        return Ok(Some(Origins::Any));
    }
    let values = origins
        .iter()
        .map(|o| origin_value(o))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(Origins::List(values)))
}

/// The CORS layer of the HTTP API for `origins` (see [`parse`]), or `None`
/// when there are none: then CORS stays closed.
pub fn layer(origins: &[String]) -> Result<Option<CorsLayer>, CorsError> {
    let Some(origins) = parse(origins)? else {
        return Ok(None);
    };
    let allow = match origins {
        Origins::Any => AllowOrigin::any(),
        Origins::List(values) => AllowOrigin::list(values),
    };
    Ok(Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST])
            .allow_headers(AllowHeaders::mirror_request())
            .expose_headers([
                http::header::RETRY_AFTER,
                http::HeaderName::from_static("deprecation"),
                http::HeaderName::from_static("sunset"),
                http::HeaderName::from_static(crate::idempotency::REPLAYED),
            ])
            .max_age(PREFLIGHT_MAX_AGE),
    ))
}

/// An origin as browsers send it: `scheme://host[:port]`, no path.
fn origin_value(origin: &str) -> Result<HeaderValue, CorsError> {
    let bad = || CorsError::NotAnOrigin(origin.to_owned());
    let (scheme, rest) = origin.split_once("://").ok_or_else(bad)?;
    if scheme.is_empty() || rest.is_empty() || rest.contains('/') {
        return Err(bad());
    }
    HeaderValue::from_str(origin).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn no_origins_is_no_layer() {
        assert!(layer(&[]).expect("valid").is_none());
        assert!(layer(&strings(&["", " , "])).expect("valid").is_none());
    }

    #[test]
    fn parsed_origins_grant_exactly_themselves() {
        let list = parse(&strings(&["https://a.example, http://b.example:8080"]))
            .expect("valid")
            .expect("some");
        let value = |s: &str| HeaderValue::from_str(s).expect("header value");
        assert!(list.allows(&value("https://a.example")));
        assert!(list.allows(&value("http://b.example:8080")));
        for other in [
            "http://a.example",
            "https://a.example:443",
            "http://b.example",
            "https://c.example",
            "null",
        ] {
            assert!(!list.allows(&value(other)), "{other}");
        }
        let any = parse(&strings(&["*"])).expect("valid").expect("some");
        assert_eq!(any, Origins::Any);
        assert!(any.allows(&value("https://c.example")));
        assert_eq!(parse(&strings(&[" "])), Ok(None));
    }

    #[test]
    fn origins_and_wildcard() {
        let list = strings(&[
            "https://a.example",
            "http://b.example:8080,https://c.example",
        ]);
        assert!(layer(&list).expect("valid").is_some());
        assert!(layer(&strings(&["*"])).expect("valid").is_some());
        assert_eq!(
            layer(&strings(&["*", "https://a.example"])).err(),
            Some(CorsError::WildcardWithOthers)
        );
        for bad in [
            "a.example",
            "https://a.example/",
            "https://a.example/x",
            "://x",
        ] {
            assert_eq!(
                layer(&strings(&[bad])).err(),
                Some(CorsError::NotAnOrigin(bad.to_owned())),
                "{bad}"
            );
        }
    }
}
