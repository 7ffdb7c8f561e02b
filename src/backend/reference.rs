//! The statements a store sends, for the benchmark's reference clients
//! (pgbench, a bare sqlx loop), so that they never drift from the store.

use super::read_first::ReadFirst;
use super::records::SqlStore;
use super::Backend;

impl<DB: Backend> SqlStore<DB> {
    /// The store's statements as `(name, SQL, parameters in order)`:
    /// `"claim"`, `"read"` (the record read after a claim that returned no
    /// row), `"complete"`, `"select"` (the record by scope and key), and
    /// `"read first"` where a claim on the pool always reads the record
    /// first (not where it does only while duplicates are common, as a
    /// run of first executions does not).
    /// The parameter names are those of the store's `Param`
    /// (`"Scope"`, `"Key"`, `"Fingerprint"`, ...).
    #[doc(hidden)]
    pub fn __reference_statements(&self) -> Vec<(&'static str, String, Vec<String>)> {
        let sql = &self.sql;
        let read_first =
            (DB::READ_FIRST == ReadFirst::Always).then_some(("read first", &sql.select));
        [
            ("claim", &sql.claim),
            ("read", &sql.claimed),
            ("complete", &sql.complete),
            ("select", &sql.select),
        ]
        .into_iter()
        .chain(read_first)
        .map(|(name, s)| {
            let params = s.params.iter().map(|p| format!("{p:?}")).collect();
            (name, s.sql.clone(), params)
        })
        .collect()
    }
}
