//! One writer at a time per database file, in this process, where the
//! database itself lets only one write at a time (SQLite).
//!
//! SQLite has one write lock per database. A connection that finds it
//! taken does not queue for it: its busy handler sleeps and tries again,
//! 1, 2, 5, 10, 15, 20, 25 ms and on, so with a dozen writers at once a
//! write waits for the lock far longer than the writes before it took, and
//! a late one waits the longest. The store's writes (claims, completions,
//! releases, renewals, journal entries, entity mode's rows) therefore
//! queue in the process first, in order, on one gate per database file
//! shared by every store on it, and meet the busy handler only when
//! another process (or the application's own transaction) holds the lock.
//!
//! What keeps this safe:
//! - The gate is taken before a connection is, and held only while the
//!   writes of one statement or transaction run: its holder never waits
//!   for something a task that waits for the gate holds.
//! - A write that waited for the gate as long as the busy timeout goes on
//!   without it, to the busy handler as before: the gate can only reorder
//!   writes, never make one fail or wait longer than the database would.
//! - Reads do not take it (WAL readers do not wait for the writer), and
//!   neither do transactional mode's writes, made in the caller's
//!   transaction, which may hold the database's lock already.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use tokio::sync::OwnedMutexGuard;

/// How long a write waits for the gate before it goes on without it: the
/// busy timeout of the SQLite store's connections.
const PATIENCE: Duration = Duration::from_secs(10);

/// The gate of a store's database, or none where writes run in parallel.
#[derive(Clone, Default)]
pub(crate) struct Gate(Option<Arc<tokio::sync::Mutex<()>>>);

impl Gate {
    /// The gate shared by every store on the database file `file` in this
    /// process; no gate for `None`.
    pub(crate) fn of(file: Option<PathBuf>) -> Gate {
        static GATES: OnceLock<Mutex<HashMap<PathBuf, Weak<tokio::sync::Mutex<()>>>>> =
            OnceLock::new();
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
        let gate = Arc::new(tokio::sync::Mutex::new(()));
        gates.insert(file, Arc::downgrade(&gate));
        Gate(Some(gate))
    }

    /// Whether writes queue here.
    pub(crate) fn is_on(&self) -> bool {
        self.0.is_some()
    }

    /// Waits for this process's writes before this one (in order), up to
    /// [`PATIENCE`]; `None` where there is no gate, or the wait ran out.
    pub(crate) async fn enter(&self) -> Option<OwnedMutexGuard<()>> {
        self.enter_within(PATIENCE).await
    }

    async fn enter_within(&self, patience: Duration) -> Option<OwnedMutexGuard<()>> {
        let gate = self.0.clone()?;
        tokio::time::timeout(patience, gate.lock_owned()).await.ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn stores_on_one_file_share_a_gate_and_others_do_not() {
        let a = Gate::of(Some(PathBuf::from("/tmp/idem-gate-a.db")));
        let also_a = Gate::of(Some(PathBuf::from("/tmp/idem-gate-a.db")));
        let b = Gate::of(Some(PathBuf::from("/tmp/idem-gate-b.db")));
        let held = a.enter().await.expect("the gate");
        let blocked = tokio::time::timeout(Duration::from_millis(50), also_a.enter()).await;
        assert!(blocked.is_err(), "a second writer on the file went in");
        assert!(b.enter().await.is_some(), "another file's writer waited");
        drop(held);
        assert!(also_a.enter().await.is_some());
        assert!(Gate::of(None).enter().await.is_none());
    }

    #[tokio::test]
    async fn writers_go_in_in_the_order_they_came() {
        let gate = Gate::of(Some(PathBuf::from("/tmp/idem-gate-order.db")));
        let held = gate.enter().await;
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
        drop(held);
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), (0..8).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn a_writer_goes_on_without_the_gate_once_its_patience_ran_out() {
        let gate = Gate::of(Some(PathBuf::from("/tmp/idem-gate-patience.db")));
        let _held = gate.enter().await;
        let started = std::time::Instant::now();
        assert!(gate.enter_within(Duration::from_millis(50)).await.is_none());
        assert!(started.elapsed() >= Duration::from_millis(50));
    }
}
