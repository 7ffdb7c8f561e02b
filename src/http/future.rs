//! [`ResponseFuture`], and the panic catcher around the inner service.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
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

/// A panic payload, as `std::panic::catch_unwind` returns it.
pub(crate) type Panic = Box<dyn Any + Send + 'static>;

/// What a panic of a response body said, when it said it with a string.
pub(crate) fn panic_message(panic: &Panic) -> String {
    let said = panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str));
    match said {
        Some(said) => format!("the response body panicked: {said}"),
        None => "the response body panicked".to_owned(),
    }
}

/// Polls `F`, turning a panic during a poll into `Err(payload)`, so that the
/// claim can be released before the panic goes on.
pub(crate) struct CatchUnwind<F> {
    inner: Pin<Box<F>>,
}

impl<F: Future> CatchUnwind<F> {
    pub(crate) fn new(future: F) -> Self {
        CatchUnwind {
            inner: Box::pin(future),
        }
    }
}

impl<F: Future> Future for CatchUnwind<F> {
    type Output = Result<F::Output, Panic>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = self.inner.as_mut();
        // The future is not polled again after a panic: it is dropped with
        // this wrapper, so no broken invariant is observed.
        match catch_unwind(AssertUnwindSafe(|| inner.poll(cx))) {
            Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(payload) => Poll::Ready(Err(payload)),
        }
    }
}
