//! Connections a store keeps between its own statements on the pool.
//!
//! sqlx tests a connection each time it goes back to the pool: a spawned
//! task sends a ping and waits for the answer before another caller may
//! have the connection (and, with `test_before_acquire`, pings again as it
//! lends it). A store's statement on the pool would therefore cost two
//! round trips or three. A store keeps a few connections after a
//! statement that succeeded and lends them to its next statements, so a
//! replay is one round trip and a first execution's claim and completion
//! one each (BENCHMARKS.md measures the difference).
//!
//! What keeps this safe:
//! - Only a connection whose statement finished without error is kept. One
//!   whose statement failed, or whose future was dropped mid-statement,
//!   goes back to sqlx as before, which tests it and closes it if broken.
//! - At most a quarter of the pool's connections are kept (none in a pool
//!   of fewer than four), and only while the pool has connections to
//!   spare: when it has lent them all, a finished statement's connection
//!   goes back to it at once, so the application's own queries on a shared
//!   pool (and other stores on it) are never starved. A store made for one
//!   call (entity mode's) keeps none.
//! - A kept connection unused for [`IDLE`] goes back to the pool, so an
//!   idle store holds none, and `Pool::close`, which waits for every
//!   connection lent, ends at most that much later. A connection is never
//!   lent from a closed pool.
//! - A kept connection the server closed meanwhile fails its next
//!   statement, and is not kept. A statement that failed on a kept
//!   connection runs again on the next one (a kept one, or one the pool
//!   tests), as sqlx's test would have replaced the connection before
//!   lending it: each of the store's statements on the pool may run twice
//!   (a claim with the same token finds its own record, a completion with
//!   the same outcome is accepted again, as after a lost reply).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::{Database, Pool};

/// How long a kept connection waits for the store's next statement before
/// it goes back to the pool.
pub(crate) const IDLE: Duration = Duration::from_millis(100);

/// The connections a store keeps out of its pool (shared by its clones).
pub(crate) struct Warm<DB: Database> {
    pool: Pool<DB>,
    /// The kept connections, each with when it was kept, newest last.
    kept: Mutex<Vec<(PoolConnection<DB>, Instant)>>,
    /// Whether a task gives idle connections back.
    reaping: AtomicBool,
    /// Whether this store keeps any (not a store made for one call).
    on: bool,
}

/// How many connections a store may keep out of a pool of `max`.
fn cap(max: u32) -> usize {
    (max / 4) as usize
}

impl<DB: Database> Warm<DB> {
    /// Keeps connections of `pool`.
    pub(crate) fn new(pool: Pool<DB>) -> Self {
        Warm {
            pool,
            kept: Mutex::new(Vec::new()),
            reaping: AtomicBool::new(false),
            on: true,
        }
    }

    /// Lends connections of `pool` and keeps none: for a store that lives
    /// for one call, whose kept connections nobody would reuse.
    pub(crate) fn off(pool: Pool<DB>) -> Self {
        let mut warm = Warm::new(pool);
        warm.on = false;
        warm
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Vec<(PoolConnection<DB>, Instant)>> {
        // Every change is one push, pop or retain: a panic elsewhere
        // cannot leave the list half-changed.
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A connection for one of the store's statements: the one kept last,
    /// else one from the pool.
    #[cfg(test)]
    pub(crate) async fn take(&self) -> Result<PoolConnection<DB>, sqlx::Error> {
        Ok(self.lend().await?.0)
    }

    /// [`take`](Self::take), and whether the connection was a kept one
    /// (which sqlx did not test: the server may have closed it since).
    pub(crate) async fn lend(&self) -> Result<(PoolConnection<DB>, bool), sqlx::Error> {
        let pool = &self.pool;
        if !pool.is_closed() {
            let kept = self.kept().pop();
            if let Some((conn, _)) = kept {
                return Ok((conn, true));
            }
        }
        Ok((pool.acquire().await?, false))
    }

    /// Keeps `conn`, whose statement succeeded, for the next statement, or
    /// gives it back to the pool when enough are kept.
    pub(crate) fn keep(self: &Arc<Self>, conn: PoolConnection<DB>) {
        let pool = &self.pool;
        let max = pool.options().get_max_connections();
        let cap = cap(max);
        // Kept only while the pool has connections to spare (idle ones, or
        // room to open more): when it has none, someone may be waiting
        // for one, and this one goes back now.
        let spare = pool.num_idle() > 0 || pool.size() < max;
        if !self.on || cap == 0 || !spare || pool.is_closed() {
            return;
        }
        // The task that gives idle connections back needs a runtime.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let surplus = {
            let mut kept = self.kept();
            if kept.len() >= cap {
                Some(conn)
            } else {
                kept.push((conn, Instant::now()));
                None
            }
        };
        // Given back outside the lock: sqlx spawns its test as it drops.
        drop(surplus);
        if !self.reaping.swap(true, Ordering::AcqRel) {
            runtime.spawn(reap(Arc::downgrade(self)));
        }
    }
}

impl<DB: Database> Drop for Warm<DB> {
    /// Gives the kept connections back. sqlx gives a connection back to
    /// its pool through a task, which needs a runtime: a store dropped
    /// outside one (after its runtime ended) closes them instead, rather
    /// than panic in sqlx.
    fn drop(&mut self) {
        let kept = std::mem::take(&mut *self.kept());
        if kept.is_empty() || tokio::runtime::Handle::try_current().is_ok() {
            return;
        }
        let detachable = self.pool.options().get_min_connections() == 0;
        for (conn, _) in kept {
            // `detach` frees the connection's place in the pool, and
            // spawns a replacement only for a pool with a minimum size;
            // `leak` spawns nothing, and keeps the place taken.
            drop(if detachable {
                conn.detach()
            } else {
                conn.leak()
            });
        }
    }
}

/// Gives back the connections kept longer than [`IDLE`] unused, until none
/// is kept or the store is gone.
async fn reap<DB: Database>(warm: Weak<Warm<DB>>) {
    loop {
        tokio::time::sleep(IDLE).await;
        let Some(warm) = warm.upgrade() else {
            return;
        };
        let idle: Vec<_> = {
            let mut kept = warm.kept();
            let now = Instant::now();
            let (idle, fresh) = std::mem::take(&mut *kept)
                .into_iter()
                .partition(|(_, since)| now.duration_since(*since) >= IDLE);
            *kept = fresh;
            idle
        };
        drop(idle);
        if !warm.kept().is_empty() {
            continue;
        }
        warm.reaping.store(false, Ordering::Release);
        // A connection kept between the check and the flag found the flag
        // still set and started no task: this one goes on for it.
        if warm.kept().is_empty() || warm.reaping.swap(true, Ordering::AcqRel) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quarter_of_the_pool_is_kept_and_none_of_a_small_one() {
        assert_eq!(cap(1), 0);
        assert_eq!(cap(3), 0);
        assert_eq!(cap(4), 1);
        assert_eq!(cap(10), 2);
        assert_eq!(cap(8), 2);
    }

    #[cfg(feature = "sqlite")]
    async fn pool(max: u32) -> Pool<sqlx::Sqlite> {
        sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(max)
            .connect("sqlite::memory:")
            .await
            .unwrap()
    }

    /// Three connections, lent one after the other by `lend`, and held.
    #[cfg(feature = "sqlite")]
    async fn three<C, E, F>(lend: impl Fn() -> F) -> Vec<C>
    where
        E: std::fmt::Debug,
        F: std::future::Future<Output = Result<C, E>>,
    {
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(lend().await.unwrap());
        }
        held
    }

    /// A pool of `max` connections, and the store's kept ones of it.
    #[cfg(feature = "sqlite")]
    async fn warm(max: u32) -> (Pool<sqlx::Sqlite>, Arc<Warm<sqlx::Sqlite>>) {
        let pool = pool(max).await;
        let warm = Arc::new(Warm::new(pool.clone()));
        (pool, warm)
    }

    /// A finished statement's connection is kept while the pool has some
    /// to spare, up to a quarter of it, and lent to the next statement.
    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn connections_are_kept_up_to_a_quarter_of_the_pool() {
        let (pool, warm) = warm(8).await;
        for conn in three(|| warm.take()).await {
            warm.keep(conn);
        }
        assert_eq!(warm.kept().len(), 2, "at most a quarter of 8");
        // The next statement gets a kept one, not one from the pool.
        let size = pool.size();
        let conn = warm.take().await.unwrap();
        assert_eq!(warm.kept().len(), 1);
        assert_eq!(pool.size(), size);
        warm.keep(conn);
        assert_eq!(warm.kept().len(), 2);
    }

    /// When every connection of the pool is lent, someone may be waiting
    /// for one: a finished statement's connection goes back at once.
    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn nothing_is_kept_from_a_pool_with_none_to_spare() {
        let (pool, warm) = warm(4).await;
        let held = three(|| pool.acquire()).await;
        let last = warm.take().await.unwrap();
        assert_eq!(pool.size(), 4);
        warm.keep(last);
        assert!(warm.kept().is_empty());
        // And the application, waiting for it, gets it.
        let fourth = tokio::time::timeout(Duration::from_secs(10), pool.acquire()).await;
        assert!(
            matches!(fourth, Ok(Ok(_))),
            "the pool's last connection was held back"
        );
        drop(held);
    }

    /// An idle store gives its kept connections back, so closing the pool,
    /// which waits for every connection lent, ends while the store lives.
    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn idle_connections_go_back_and_the_pool_closes() {
        let (pool, warm) = warm(8).await;
        let conn = warm.take().await.unwrap();
        warm.keep(conn);
        assert_eq!(warm.kept().len(), 1);
        let closed = tokio::time::timeout(Duration::from_secs(10), pool.close()).await;
        assert!(
            closed.is_ok(),
            "the pool did not close while a store kept a connection"
        );
        assert!(warm.kept().is_empty());
        // A closed pool lends nothing, kept or not.
        assert!(warm.take().await.is_err());
    }

    /// A store dropped after its runtime ended closes its kept
    /// connections rather than panic (sqlx gives a connection back
    /// through a task, which needs a runtime).
    #[cfg(feature = "sqlite")]
    #[test]
    fn a_store_dropped_without_a_runtime_closes_what_it_kept() {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let (pool, warm) = runtime.block_on(async {
            let (pool, warm) = warm(8).await;
            let conn = warm.take().await.unwrap();
            warm.keep(conn);
            (pool, warm)
        });
        drop(runtime);
        assert_eq!(warm.kept().len(), 1);
        drop(warm);
        assert_eq!(pool.size(), 0, "the closed connection still counts");
    }

    /// A store made for one call keeps nothing.
    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn a_store_for_one_call_keeps_nothing() {
        let pool = pool(8).await;
        let warm = Arc::new(Warm::off(pool.clone()));
        let conn = warm.take().await.unwrap();
        warm.keep(conn);
        assert!(warm.kept().is_empty());
    }
}
