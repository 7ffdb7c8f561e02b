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

#[cfg(test)]
mod tests {
    use std::time::Duration;
    use tokio::time::Instant;

    use super::within;

    #[test]
    fn an_answer_at_once_needs_no_timer() {
        // A runtime without a time driver: arming a timer would panic.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let answer = runtime.block_on(within(Duration::from_secs(1), async { 7 }));
        assert_eq!(answer, Some(7));
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_answer_is_given_up_at_the_limit() {
        let started = Instant::now();
        let limit = Duration::from_millis(50);
        assert_eq!(within(limit, std::future::pending::<()>()).await, None);
        assert!(started.elapsed() >= limit);
        let late = async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            8
        };
        assert_eq!(within(limit, late).await, Some(8));
    }
}
