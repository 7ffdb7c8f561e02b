//! The statements a store sends, for the benchmark's reference clients
//! (pgbench, a bare sqlx loop), so that they never drift from the store.

use super::flow::SqlStore;
use super::statements::{Param, Statement};
use super::Backend;

impl<DB: Backend> SqlStore<DB> {
    /// The store's statements as `(name, SQL, parameters in order)`:
    /// `"claim"`, `"read"` (the record read after a claim that returned no
    /// row), `"keep"` (the journal kept after a granted claim, where the
    /// claim does not keep it itself), `"complete"` and `"select"` (the
    /// record by scope and key: the
    /// read before a claim, where a store reads first while duplicates are
    /// common, which a run of first executions is not).
    /// The parameter names are those of the store's `Param`
    /// (`"Scope"`, `"Key"`, `"Fingerprint"`, ...).
    #[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
    pub fn reference_statements(&self) -> Vec<(&'static str, String, Vec<String>)> {
        let sql = &self.sql;
        let keep = Statement {
            sql: sql.steps.keep.clone(),
            params: &[Param::Ttl, Param::Scope, Param::Key, Param::Ttl],
        };
        let keep = (!DB::CLAIM_KEEPS_JOURNAL).then_some(("keep", &keep));
        [
            Some(("claim", &sql.claim)),
            Some(("read", &sql.claimed)),
            keep,
            Some(("complete", &sql.complete)),
            Some(("select", &sql.select)),
        ]
        .into_iter()
        .flatten()
        .map(|(name, s)| {
            let params = s.params.iter().map(|p| format!("{p:?}")).collect();
            (name, s.sql.clone(), params)
        })
        .collect()
    }

    /// Where transactional mode reads the record before its claim, as
    /// [`TransactionalStore`](crate::store::TransactionalStore)'s `begin`
    /// does: `None` where it claims at once (its claim locks only what it
    /// claims), `Some(true)` beside the caller's transaction (the
    /// `"select"` statement on a connection of the store's pool),
    /// `Some(false)` on the caller's connection.
    #[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
    pub fn transactional_read(&self) -> Option<bool> {
        if DB::CLAIM_LOCKS_ONLY_ITS_OWN {
            None
        } else {
            Some(!DB::PEEK_IN_CALLER)
        }
    }
}
