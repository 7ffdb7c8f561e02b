//! At most a few writers per database file at once, in this process,
//! where the database itself takes one write at a time (SQLite).
//!
//! SQLite has one write lock per database. A connection that finds it
//! taken does not queue for it: its busy handler sleeps and tries again,
//! 1, 2, 5, 10, 15, 20, 25 ms and on. With many writers at once, most of
//! them are soon in long sleeps, the lock sits free between their tries,
//! and a write waits far longer than the writes before it took.
//! The store's writes (claims, completions, releases, renewals, journal
//! entries, entity mode's rows) therefore pass a gate of [`WRITERS`]
//! places per database file, shared by every store on the pool, first
//! come first served: the rest wait in the process, and are let in as
//! soon as a place is free.
//!
//! Not one place: the application's own writes (the body's rows) do not
//! pass the gate, and a single writer of the store's, polling on its
//! busy handler's growing sleeps, would take the lock after them later
//! than several do (BENCHMARKS.md, the SQLite rows, measures both).
//!
//! What keeps this safe:
//! - The gate is passed before a connection is taken, and held only while
//!   the writes of one statement or transaction run: a holder never waits
//!   for something that a task waiting at the gate holds.
//! - A write that waited for the gate as long as the busy timeout goes on
//!   without it, to the busy handler as before: the gate can only reorder
//!   writes, never make one fail.
//! - Reads do not pass it (WAL readers do not wait for the writer), and
//!   neither do transactional mode's writes, made in the caller's
//!   transaction, which may hold the database's lock already.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How many of this process's writes to one database may wait for its
/// lock at once.
pub(crate) const WRITERS: usize = 4;

/// How long a write waits for the gate before it goes on without it: the
/// busy timeout of the SQLite store's connections.
const PATIENCE: Duration = Duration::from_secs(10);

/// The gate of a store's database, or none where writes run in parallel.
/// A place is held as long as the permit lives.
#[derive(Clone, Default)]
pub(crate) struct Gate(Option<Arc<Semaphore>>);

impl Gate {
    /// The gate shared by every store on the database file `file` in this
    /// process; no gate for `None`.
    pub(crate) fn of(file: Option<PathBuf>) -> Gate {
        static GATES: OnceLock<Mutex<HashMap<PathBuf, Weak<Semaphore>>>> = OnceLock::new();
        let Some(file) = file else {
            return Gate(None);
        };
        let mut gates = GATES
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(gate) = gates.get(&file).and_then(Weak::upgrade) {
            return Gate(Some(gate));
        }
        // The gates of databases no store uses any more go.
        gates.retain(|_, gate| gate.strong_count() > 0);
        let gate = Arc::new(Semaphore::new(WRITERS));
        gates.insert(file, Arc::downgrade(&gate));
        Gate(Some(gate))
    }

    /// Whether writes queue here.
    pub(crate) fn is_on(&self) -> bool {
        self.0.is_some()
    }

    /// Waits for a place behind this process's writes before this one (in
    /// order), up to [`PATIENCE`]; `None` where there is no gate, or the
    /// wait ran out.
    pub(crate) async fn enter(&self) -> Option<OwnedSemaphorePermit> {
        self.enter_within(PATIENCE).await
    }

    async fn enter_within(&self, patience: Duration) -> Option<OwnedSemaphorePermit> {
        let gate = self.0.clone()?;
        tokio::time::timeout(patience, gate.acquire_owned())
            .await
            .ok()?
            .ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Takes every place of `gate`.
    async fn fill(gate: &Gate) -> Vec<OwnedSemaphorePermit> {
        let mut held = Vec::new();
        for _ in 0..WRITERS {
            held.push(gate.enter().await.expect("a place"));
        }
        held
    }

    #[tokio::test]
    async fn stores_on_one_file_share_a_gate_and_others_do_not() {
        let a = Gate::of(Some(PathBuf::from("/tmp/idem-gate-a.db")));
        let also_a = Gate::of(Some(PathBuf::from("/tmp/idem-gate-a.db")));
        let b = Gate::of(Some(PathBuf::from("/tmp/idem-gate-b.db")));
        let mut held = fill(&a).await;
        let blocked = tokio::time::timeout(Duration::from_millis(50), also_a.enter()).await;
        assert!(blocked.is_err(), "a writer past the places went in");
        assert!(b.enter().await.is_some(), "another file's writer waited");
        held.pop();
        assert!(also_a.enter().await.is_some());
        assert!(Gate::of(None).enter().await.is_none());
    }

    #[tokio::test]
    async fn writers_go_in_in_the_order_they_came() {
        let gate = Gate::of(Some(PathBuf::from("/tmp/idem-gate-order.db")));
        let mut held = fill(&gate).await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..8 {
            let (gate, order) = (gate.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let _in = gate.enter().await;
                order.lock().unwrap().push(i);
            }));
            // Each is queued before the next comes.
            tokio::task::yield_now().await;
        }
        // One place at a time: each lets the next writer in.
        held.truncate(WRITERS - 1);
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), (0..8).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn a_writer_goes_on_without_the_gate_once_its_patience_ran_out() {
        let gate = Gate::of(Some(PathBuf::from("/tmp/idem-gate-patience.db")));
        let _held = fill(&gate).await;
        let started = std::time::Instant::now();
        assert!(gate.enter_within(Duration::from_millis(50)).await.is_none());
        assert!(started.elapsed() >= Duration::from_millis(50));
    }
}
