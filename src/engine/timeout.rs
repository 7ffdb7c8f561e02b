//! A bound on how long an answer may take, which costs no timer when the
//! answer comes at once (a store in memory).

use std::future::Future;
use std::time::Duration;

/// `op`'s output, or `None` once `limit` has passed. The timer is armed
/// only when `op` does not finish at once, so an in-memory store costs no
/// timer, and works on a runtime built without one.
pub(super) async fn within<F: Future>(limit: Duration, op: F) -> Option<F::Output> {
    let mut op = std::pin::pin!(op);
    let at_once = std::future::poll_fn(|cx| {
        std::task::Poll::Ready(match op.as_mut().poll(cx) {
            std::task::Poll::Ready(output) => Some(output),
            std::task::Poll::Pending => None,
        })
    })
    .await;
    match at_once {
        Some(output) => Some(output),
        None => tokio::time::timeout(limit, op).await.ok(),
    }
}
