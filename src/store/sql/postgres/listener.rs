//! PostgreSQL's `LISTEN`: wakes the waiters of this process when another
//! process completes or releases a key (`NOTIFY` on a channel named after
//! the records table).
#![allow(unreachable_pub)] // the sealed `Dialect`'s `Wake`, so `pub`; unnameable outside

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use tokio::task::JoinHandle;

use crate::store::Waiters;
use idem_core::key::{Key, Scope};

/// The task relaying `NOTIFY`s of the store's channel to its [`Waiters`],
/// started on the first wait and stopped with the last clone of the store.
#[derive(Debug, Default)]
pub struct Listener {
    task: Mutex<Option<JoinHandle<()>>>,
    /// Whether the connection is listening right now.
    live: Arc<AtomicBool>,
}

impl Listener {
    pub(crate) fn is_listening(&self) -> bool {
        self.live.load(Ordering::Acquire)
    }

    pub(crate) fn ensure_running(&self, pool: &PgPool, channel: &str, waiters: &Arc<Waiters>) {
        let mut task = self.task.lock().unwrap_or_else(|e| e.into_inner());
        if task.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        // Outside a runtime there is nothing to run it on: waiters poll.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        *task = Some(runtime.spawn(listen(
            pool.connect_options(),
            channel.to_owned(),
            waiters.clone(),
            self.live.clone(),
        )));
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let task = self.task.get_mut().unwrap_or_else(|e| e.into_inner());
        if let Some(task) = task.take() {
            task.abort();
        }
    }
}

/// Listens on `channel` for as long as the task lives, reconnecting after a
/// pause when the connection fails. Notifications sent while it is down are
/// lost; the waiters' polling covers them.
async fn listen(
    options: Arc<PgConnectOptions>,
    channel: String,
    waiters: Arc<Waiters>,
    live: Arc<AtomicBool>,
) {
    // A pool of one, of its own, only for reconnecting: the store's pool
    // keeps all its connections for statements.
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .idle_timeout(None)
        .max_lifetime(None)
        .connect_lazy_with((*options).clone());
    let mut pause = Duration::from_millis(100);
    loop {
        let Err(err) = relay(&pool, &channel, &waiters, &mut pause, &live).await;
        live.store(false, Ordering::Release);
        tracing::warn!(
            error = %err,
            channel = %channel,
            "listening for idempotency notifications failed; waiters poll until it is back"
        );
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(5));
    }
}

async fn relay(
    pool: &PgPool,
    channel: &str,
    waiters: &Waiters,
    pause: &mut Duration,
    live: &AtomicBool,
) -> Result<Infallible, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.ignore_pool_close_event(true);
    listener.listen(channel).await?;
    *pause = Duration::from_millis(100);
    live.store(true, Ordering::Release);
    loop {
        // `None`: the connection was lost and has been re-established;
        // notifications sent meanwhile are lost, so wake every waiter.
        let notification = listener.try_recv().await?;
        if notification.is_none() {
            waiters.wake_all();
        }
        if let Some(notification) = notification {
            let woken = notification
                .payload()
                .split_once(' ')
                .and_then(|(key, scope)| Some((Key::new(key).ok()?, Scope::from_stored(scope))));
            if let Some((key, scope)) = woken {
                waiters.wake_from_store(&scope, &key);
            }
        }
    }
}
