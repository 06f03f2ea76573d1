//! The rate-limit headers on every answer of a tenant's call.
//!
//! [`RateLimitHeaders`] wraps each gRPC service behind the API-key check
//! (between the [`Authenticate`](crate::access::Authenticate) interceptor,
//! which puts the [`Caller`] in the request's extensions, and the
//! generated server): when the call's response head is ready, it adds the
//! tenant's `x-ratelimit-*` figures as they stand then
//! ([`Caller::headers`]) to the response metadata, unless the handler set
//! them already (a RESOURCE_EXHAUSTED refusal carries the refusal's own).
//! A request the route admitted is counted by then, so the figures include
//! it. This is the one place success answers get them: unary and streamed,
//! `Generate` (its head goes out as the call opens, before any request on
//! it is admitted), `GenerateStream`, the Responses service, embeddings,
//! tokenize. Without a keys file (no [`Caller`]) or for a tenant without
//! limits nothing is added.

use std::task::{Context, Poll};

use futures::future::BoxFuture;
use http::{HeaderName, HeaderValue};

use crate::access::Caller;

/// The wrapper (see the module's comment).
#[derive(Clone, Debug)]
pub struct RateLimitHeaders<S> {
    inner: S,
}

impl<S> RateLimitHeaders<S> {
    pub fn new(inner: S) -> Self {
        Self { inner }
    }
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for RateLimitHeaders<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B, R> tower::Service<http::Request<B>> for RateLimitHeaders<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let caller = req.extensions().get::<Caller>().cloned();
        let answer = self.inner.call(req);
        Box::pin(async move {
            let mut response = answer.await?;
            if let Some(caller) = caller {
                put_missing(response.headers_mut(), &caller.headers());
            }
            Ok(response)
        })
    }
}

/// Adds each of `headers` that `to` does not have yet.
fn put_missing(to: &mut http::HeaderMap, headers: &[(&'static str, String)]) {
    for (name, value) in headers {
        let name = HeaderName::from_static(name);
        if to.contains_key(&name) {
            continue;
        }
        if let Ok(v) = HeaderValue::from_str(value) {
            to.insert(name, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::put_missing;

    #[test]
    fn headers_the_handler_set_are_kept_and_the_rest_added() {
        let mut to = http::HeaderMap::new();
        to.insert(
            "x-ratelimit-remaining-requests",
            http::HeaderValue::from_static("0"),
        );
        put_missing(
            &mut to,
            &[
                ("x-ratelimit-remaining-requests", "5".to_string()),
                ("x-ratelimit-limit-requests", "6".to_string()),
            ],
        );
        assert_eq!(to["x-ratelimit-remaining-requests"], "0");
        assert_eq!(to["x-ratelimit-limit-requests"], "6");
    }
}
