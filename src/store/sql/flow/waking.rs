//! The waits of duplicates on the SQL stores ([`Wake`](crate::store::Wake)):
//! woken in this process by its [`Waiters`](crate::store::Waiters), and
//! from other processes where the backend can (PostgreSQL's `LISTEN`).

use super::bound::Bound;
use super::{on_pool, Backend, SqlStore};
use crate::store::{wake_by_waiting, Look};
use idem_core::error::Error;
use idem_core::fingerprint::Fingerprint;
use idem_core::key::{Key, Scope};

impl<DB: Backend> SqlStore<DB> {
    /// Whether the record of `(scope, key)` is held by a live claim of the
    /// payload of `fingerprint` (of any payload: `None`) now, and by which.
    async fn look(
        &self,
        scope: &Scope,
        key: &Key,
        fingerprint: Option<&Fingerprint>,
    ) -> Result<Look, Error> {
        // Held here: its completion or release wakes this waiter itself
        // (with the outcome), and a failed one wakes it to read.
        if let Some((token, holder)) = self.waiters.held_here(scope, key) {
            return Ok(Look::held(Some(token), &holder, fingerprint));
        }
        let bound = Bound::key(scope, key);
        let read = on_pool!(self, |conn| self.read_on(&mut conn, &self.sql.look, &bound))?;
        Ok(match read {
            Some((record, now)) => Look::at(Some(&record), now, fingerprint),
            None => Look::Free,
        })
    }
}

// Waiters listen to other processes where the backend can.
wake_by_waiting!(
    SqlStore<DB> where DB: Backend,
    |store, scope, key, fingerprint, timeout| {
        DB::listen(store);
        let look = || store.look(scope, key, fingerprint);
        store.waiters.wait(scope, key, timeout, look).await
    },
    across: DB::wakes_across_processes,
);
