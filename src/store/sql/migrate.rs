//! The migrations' bookkeeping every backend shares: a table
//! (`idem_migrations` unless the store names another) records which
//! versions of which records table are applied, so that `migrate()` is
//! safe to call at every start. Keeping migrators apart (a lock) is the
//! backend's.

use super::dialect::Refusal;
use super::exec::Value;
use super::Backend;
use idem_core::error::Error;
use idem_core::record::now_millis;

/// A backend's statements on `idem_migrations`.
#[derive(Debug)]
pub(crate) struct Bookkeeping {
    /// Creates the bookkeeping table `{migrations}` if missing.
    pub(crate) create: &'static str,
    /// Counts tables named `{table}` (a table dropped by hand is created
    /// again).
    pub(crate) exists: &'static str,
    /// The highest applied version of a table (bound: the table name).
    pub(crate) applied: &'static str,
    /// Records a version as applied, once (bound: table, version, time).
    pub(crate) record: &'static str,
}

/// Applies the versions of `migrations` (in order, version = index + 1)
/// not yet recorded for `table`, each followed by its record. The caller
/// holds the backend's migration lock, or a transaction that serializes.
/// In the migrations' text, `{table}` is the table; `rename` fills in the
/// backend's other names.
pub(crate) async fn apply<DB: Backend>(
    conn: &mut DB::Connection,
    table: &str,
    migrations_table: &str,
    bookkeeping: &Bookkeeping,
    migrations: &[&str],
    rename: impl Fn(String) -> String,
) -> Result<(), Error> {
    let named = |sql: &str| sql.replace("{migrations}", migrations_table);
    DB::execute_script(conn, &named(bookkeeping.create)).await?;
    let exists = bookkeeping.exists.replace("{table}", table);
    let exists = DB::fetch_int(conn, &exists, Vec::new()).await?.unwrap_or(0) > 0;
    let applied = if exists {
        DB::fetch_int(conn, &named(bookkeeping.applied), vec![Value::Text(table)])
            .await?
            .unwrap_or(0)
    } else {
        0
    };
    for (index, migration) in migrations.iter().enumerate() {
        let version = index as i64 + 1;
        if version <= applied {
            continue;
        }
        let sql = rename(migration.replace("{table}", table));
        if let Err(err) = DB::execute_script(conn, &sql).await {
            let err = Error::from(err);
            if DB::refusal(&err) != Some(Refusal::ColumnExists) {
                return Err(err);
            }
            tracing::info!(table, version, "the migration had run; recording it");
        }
        let values = vec![
            Value::Text(table),
            Value::Int(version),
            Value::Int(now_millis()),
        ];
        DB::execute(conn, &named(bookkeeping.record), values).await?;
    }
    Ok(())
}
