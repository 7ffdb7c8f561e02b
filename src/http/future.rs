//! [`ResponseFuture`]: what the layer's service returns.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use ::http::Response;

use super::body::ResponseBody;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// The response future of [`Idempotency`](super::Idempotency): the inner
/// service's response (its own, or a replay of a stored one), one of the
/// layer's [problem](super::Problem) answers, or the inner service's error.
/// `B` is the inner service's body type, which the response's
/// [`ResponseBody`] streams or holds.
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub struct ResponseFuture<B, E> {
    inner: BoxFuture<Result<Response<ResponseBody<B>>, E>>,
}

impl<B, E> ResponseFuture<B, E> {
    pub(crate) fn new<F>(future: F) -> Self
    where
        F: Future<Output = Result<Response<ResponseBody<B>>, E>> + Send + 'static,
    {
        ResponseFuture {
            inner: Box::pin(future),
        }
    }
}

impl<B, E> Future for ResponseFuture<B, E> {
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<B, E> fmt::Debug for ResponseFuture<B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
