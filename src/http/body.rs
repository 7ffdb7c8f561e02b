//! [`ResponseBody`]: the body of every response that comes out of the
//! layer, whole or streamed.

use std::collections::VecDeque;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::unwind::panic_message;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

pin_project! {
    /// The body of a response of [`Idempotency`](super::Idempotency): the
    /// inner service's body as it streams, or a body the layer holds whole
    /// (a replay, one of its [problem](super::Problem) answers, a response
    /// it buffered to store).
    ///
    /// A response that the layer does not keep for a replay (see the
    /// [module documentation](super#bodies)) is streamed: the chunks the
    /// layer read before it knew (at most
    /// [`max_stored_body`](super::IdempotencyLayer::max_stored_body) and
    /// one chunk) come first, then the rest of the inner body as the
    /// client reads it. An error of the inner body is passed on, and so is
    /// a panic of it, as an error, past which the body ends.
    ///
    /// Its data is [`Bytes`], its error a boxed error: axum turns it into
    /// its own `Body`, and hyper serves it as it is.
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        // Held whole; `None` once sent.
        Whole { data: Option<Bytes> },
        // The inner service's body, untouched (a request the layer does not
        // cover).
        Inner { #[pin] body: B },
        // A claimed request's body, of which `prefix` was read already;
        // `rest` is `None` once it ended, failed or panicked.
        Streamed { prefix: VecDeque<Bytes>, rest: Option<Pin<Box<B>>> },
    }
}

impl<B> ResponseBody<B> {
    /// The inner service's body, untouched.
    pub(crate) fn inner(body: B) -> Self {
        ResponseBody {
            kind: Kind::Inner { body },
        }
    }

    /// The chunks of `prefix`, then what `rest` still yields.
    pub(crate) fn streamed(prefix: VecDeque<Bytes>, rest: Pin<Box<B>>) -> Self {
        ResponseBody {
            kind: Kind::Streamed {
                prefix,
                rest: Some(rest),
            },
        }
    }
}

impl<B> From<Bytes> for ResponseBody<B> {
    fn from(data: Bytes) -> Self {
        ResponseBody {
            kind: Kind::Whole { data: Some(data) },
        }
    }
}

fn into_bytes<D: Buf>(frame: Frame<D>) -> Frame<Bytes> {
    frame.map_data(|mut data| data.copy_to_bytes(data.remaining()))
}

impl<B> Body for ResponseBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project().kind.project() {
            KindProj::Whole { data } => Poll::Ready(
                data.take()
                    .filter(|d| !d.is_empty())
                    .map(Frame::data)
                    .map(Ok),
            ),
            KindProj::Inner { body } => match body.poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(into_bytes(frame)))),
                Poll::Ready(Some(Err(err))) => Poll::Ready(Some(Err(err.into()))),
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            },
            KindProj::Streamed { prefix, rest } => {
                if let Some(chunk) = prefix.pop_front() {
                    return Poll::Ready(Some(Ok(Frame::data(chunk))));
                }
                let Some(body) = rest.as_mut() else {
                    return Poll::Ready(None);
                };
                // A panic of the body ends it with an error, as an error
                // would: the head is sent, so the client sees the transfer
                // cut. The body is dropped and not polled again.
                let polled = catch_unwind(AssertUnwindSafe(|| body.as_mut().poll_frame(cx)));
                let failed = match polled {
                    Ok(Poll::Pending) => return Poll::Pending,
                    Ok(Poll::Ready(Some(Ok(frame)))) => {
                        return Poll::Ready(Some(Ok(into_bytes(frame))))
                    }
                    Ok(Poll::Ready(None)) => None,
                    Ok(Poll::Ready(Some(Err(err)))) => Some(err.into()),
                    Err(panic) => Some(BoxError::from(panic_message(&panic))),
                };
                *rest = None;
                if let Some(err) = &failed {
                    tracing::warn!(
                        error = %err,
                        "the response body failed after its head was sent: the client gets \
                         it cut short"
                    );
                }
                Poll::Ready(failed.map(Err))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Whole { data } => data.as_ref().is_none_or(Bytes::is_empty),
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Streamed { prefix, rest } => {
                prefix.is_empty() && rest.as_ref().is_none_or(|body| body.is_end_stream())
            }
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Whole { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Inner { body } => body.size_hint(),
            Kind::Streamed { prefix, rest } => {
                let read: u64 = prefix.iter().map(|chunk| chunk.len() as u64).sum();
                let Some(body) = rest else {
                    return SizeHint::with_exact(read);
                };
                let hint = body.size_hint();
                let mut sum = SizeHint::new();
                sum.set_lower(hint.lower().saturating_add(read));
                if let Some(upper) = hint.upper() {
                    sum.set_upper(upper.saturating_add(read));
                }
                sum
            }
        }
    }
}

impl<B> fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Whole { .. } => "whole",
            Kind::Inner { .. } => "inner",
            Kind::Streamed { .. } => "streamed",
        };
        f.debug_struct("ResponseBody")
            .field("kind", &kind)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use bytes::Bytes;
    use http_body::Body;
    use http_body_util::{BodyExt, StreamBody};

    use super::*;

    type Chunk = Result<Frame<Bytes>, std::io::Error>;

    /// A body whose first poll panics.
    struct Panicking;

    impl Body for Panicking {
        type Data = Bytes;
        type Error = std::io::Error;
        fn poll_frame(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Chunk>> {
            panic!("the body panics")
        }
    }

    /// The part read comes first, then the rest; the hints add up.
    #[tokio::test]
    async fn the_part_read_then_the_rest() {
        let rest: Vec<Chunk> = vec![Ok(Frame::data(Bytes::from_static(b"cd")))];
        let rest = StreamBody::new(futures::stream::iter(rest));
        let prefix = VecDeque::from([Bytes::from_static(b"a"), Bytes::from_static(b"b")]);
        let body = ResponseBody::streamed(prefix, Box::pin(rest));
        assert_eq!(body.size_hint().lower(), 2);
        assert!(!body.is_end_stream());
        assert_eq!(body.collect().await.unwrap().to_bytes(), "abcd");
    }

    /// A panic of the rest is an error, after which the body ends.
    #[tokio::test]
    async fn a_panic_of_the_rest_is_an_error() {
        let mut body = ResponseBody::streamed(VecDeque::new(), Box::pin(Panicking));
        let err = body.frame().await.unwrap().unwrap_err();
        assert_eq!(
            err.to_string(),
            "the response body panicked: the body panics"
        );
        assert!(body.frame().await.is_none());
        assert!(body.is_end_stream());
    }

    #[tokio::test]
    async fn whole() {
        let body = ResponseBody::<Panicking>::from(Bytes::from_static(b"ok"));
        assert_eq!(body.size_hint().exact(), Some(2));
        assert_eq!(body.collect().await.unwrap().to_bytes(), "ok");
        let empty = ResponseBody::<Panicking>::from(Bytes::new());
        assert!(empty.is_end_stream());
    }
}
