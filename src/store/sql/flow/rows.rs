//! Reads and purges on the SQL stores, and the records and columns
//! decoded from their rows (the step journal's rows share [`Columns`]).

use super::bound::Bound;
use super::{on_pool, Backend, SqlStore};
use crate::store::sql::exec::Value;
use crate::store::sql::statements::Statement;
use idem_core::error::Error;
use idem_core::fingerprint::Fingerprint;
use idem_core::key::{Key, Scope};
use idem_core::record::{ClaimToken, Millis, Outcome, OutcomeKind, Record, State};

impl<DB: Backend> SqlStore<DB> {
    /// [`Store::get`](crate::store::Store::get) on a given connection.
    pub async fn get_on(
        &self,
        conn: &mut DB::Connection,
        scope: &Scope,
        key: &Key,
    ) -> Result<Option<Record>, Error> {
        let bound = Bound::key(scope, key);
        Ok(self
            .read_on(conn, &self.sql.select, &bound)
            .await?
            .map(|(record, _)| record))
    }

    /// [`Store::purge_expired`](crate::store::Store::purge_expired), telling `progress` how many records and
    /// journal entries each batch deleted.
    pub(crate) async fn purge_reporting(
        &self,
        batch: usize,
        progress: &(dyn Fn(u64) + Send + Sync),
    ) -> Result<u64, Error> {
        let batch = i64::try_from(batch.max(1)).unwrap_or(i64::MAX);
        let records = Bound::batch(batch).values(&self.sql.purge)?;
        let steps = vec![Value::Int(batch)];
        let mut total = 0;
        for (sql, values) in [
            (&self.sql.purge.sql, records),
            (&self.sql.steps.purge, steps),
        ] {
            loop {
                let _turn = self.gate.enter().await;
                let done = on_pool!(self, |conn| async {
                    Ok::<_, Error>(DB::execute(&mut conn, sql, values.clone()).await?)
                })?;
                let deleted = DB::rows_affected(&done);
                progress(deleted);
                total += deleted;
                if deleted < batch as u64 {
                    break;
                }
            }
        }
        Ok(total)
    }

    /// The record and the database's time of the read.
    pub(super) async fn read_on(
        &self,
        conn: &mut DB::Connection,
        statement: &Statement,
        bound: &Bound<'_>,
    ) -> Result<Option<(Record, Millis)>, Error> {
        let row = DB::fetch_row(conn, &statement.sql, bound.values(statement)?).await?;
        row.map(|row| decode_read::<DB>(&row)).transpose()
    }
}

/// A record's row and the database's time of the read (`db_now`).
pub(super) fn decode_read<DB: Backend>(row: &DB::Row) -> Result<(Record, Millis), Error> {
    let now =
        DB::int(row, "db_now")?.ok_or_else(|| Error::store("the database's clock read NULL"))?;
    Ok((record_from_row::<DB>(row)?, now))
}

/// The columns of a row this library wrote, read by name; a value it could
/// not have written is a store error naming `what` the row is and what is
/// wrong. Shared by the records and the step journal.
pub(crate) struct Columns<'r, DB: Backend> {
    row: &'r DB::Row,
    what: &'static str,
}

impl<'r, DB: Backend> Columns<'r, DB> {
    pub(crate) fn new(row: &'r DB::Row, what: &'static str) -> Self {
        Columns { row, what }
    }

    pub(crate) fn corrupt(&self, wrong: &str) -> Error {
        Error::store(format!("corrupt {}: {wrong}", self.what))
    }

    /// A text column (read as bytes and checked as UTF-8 where text
    /// columns are binary).
    pub(crate) fn text(&self, column: &str) -> Result<String, Error> {
        if DB::TEXT_AS_BYTES {
            let bytes = DB::bytes(self.row, column)?.unwrap_or_default();
            String::from_utf8(bytes).map_err(|_| self.corrupt(&format!("{column} is not UTF-8")))
        } else {
            Ok(DB::text(self.row, column)?)
        }
    }

    /// An integer column that is never NULL.
    pub(crate) fn int(&self, column: &str) -> Result<i64, Error> {
        DB::int(self.row, column)?.ok_or_else(|| self.corrupt(&format!("{column} is NULL")))
    }

    pub(crate) fn bytes(&self, column: &str) -> Result<Option<Vec<u8>>, Error> {
        Ok(DB::bytes(self.row, column)?)
    }

    pub(crate) fn scope(&self) -> Result<Scope, Error> {
        Ok(Scope::from_stored(&self.text("scope")?))
    }

    pub(crate) fn key(&self) -> Result<Key, Error> {
        Key::new(self.text("key")?).map_err(|_| self.corrupt("invalid key"))
    }

    pub(crate) fn fingerprint(&self) -> Result<Fingerprint, Error> {
        let fingerprint = self.bytes("fingerprint")?.unwrap_or_default();
        <[u8; 32]>::try_from(fingerprint.as_slice())
            .map(Fingerprint::from_digest)
            .map_err(|_| self.corrupt("fingerprint is not 32 bytes"))
    }

    /// The claim token, `None` when NULL.
    pub(crate) fn token(&self) -> Result<Option<ClaimToken>, Error> {
        self.bytes("claim_token")?
            .map(|t| <[u8; 16]>::try_from(t.as_slice()).map(ClaimToken::from_bytes))
            .transpose()
            .map_err(|_| self.corrupt("claim token is not 16 bytes"))
    }
}

/// Decodes a record's row; a row this library could not have written is a
/// store error naming what is wrong.
pub(crate) fn record_from_row<DB: Backend>(row: &DB::Row) -> Result<Record, Error> {
    let columns = Columns::<DB>::new(row, "idempotency record");
    let kind = if DB::SMALL_OUTCOME_KIND {
        DB::small(row, "outcome_kind")?.map(i64::from)
    } else {
        DB::int(row, "outcome_kind")?
    };
    let state =
        State::parse(&columns.text("state")?).ok_or_else(|| columns.corrupt("unknown state"))?;
    let outcome = match (kind, columns.bytes("outcome")?) {
        (Some(kind), Some(body)) => Some(Outcome {
            kind: OutcomeKind::from_code(kind)
                .ok_or_else(|| columns.corrupt("unknown outcome kind"))?,
            body,
        }),
        _ => None,
    };
    Ok(Record {
        scope: columns.scope()?,
        key: columns.key()?,
        fingerprint: columns.fingerprint()?,
        state,
        fence: columns.int("fence")?,
        token: columns.token()?,
        lease_until: DB::int(row, "lease_until")?,
        outcome,
        created_at: columns.int("created_at")?,
        expires_at: columns.int("expires_at")?,
    })
}
