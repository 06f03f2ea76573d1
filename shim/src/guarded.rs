//! A response body that holds a guard until the body is done or dropped:
//! how a request is counted for its whole life (a long stream included), on
//! the ports the shim serves (`conn`) and on its connections to the service
//! (`pool`).

use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};

/// `inner`, forwarded unchanged, with `guard` dropped when it goes.
pub struct Guarded<B, G> {
    inner: Pin<Box<B>>,
    _guard: G,
}

impl<B, G> Guarded<B, G> {
    pub fn new(inner: B, guard: G) -> Self {
        Self {
            inner: Box::pin(inner),
            _guard: guard,
        }
    }
}

impl<B: Body, G: Unpin> Body for Guarded<B, G> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        self.get_mut().inner.as_mut().poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
