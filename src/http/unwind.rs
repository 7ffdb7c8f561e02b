//! Panics of the inner service and of a response body: caught, so that
//! the claim is released before the panic goes on, and put in words.

use std::any::Any;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll};

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
