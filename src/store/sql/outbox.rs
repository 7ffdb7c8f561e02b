//! The transactional outbox on the SQL backends: a table beside the
//! records table (`<records table>_outbox`), created by the store's
//! migrations, and the flow every backend shares (see [`crate::outbox`]
//! for what it is for), on each backend's statements
//! ([`OutboxStatements`], in `<backend>/outbox.rs`).
//!
//! A relay leases rows in one short transaction: it reads the oldest rows
//! that are neither relayed nor leased (PostgreSQL and MariaDB skip rows
//! that another relay is leasing right now: `FOR UPDATE SKIP LOCKED`;
//! SQLite's transaction holds the whole database), writes its lease on
//! them, and reads them back by its lease token. The lease is a column,
//! decided with the database's clock, so a relay that died holds its rows
//! only until its lease ends. A row is marked relayed by its sequence
//! number alone, whoever leases it now: the broker acknowledged it.

use super::exec::Value;
pub(crate) use super::statements::OutboxStatements;
use super::{Backend, SqlStore};
use idem_core::error::Error;
use idem_core::record::{duration_millis, Claim, ClaimToken};

/// `prefix` (a statement that ends with `seq IN `, and names `leading`
/// placeholders of its own) followed by a list of `n` placeholders,
/// written as `DB` writes them.
fn with_list<DB: Backend>(prefix: &str, leading: usize, n: usize) -> String {
    let mut sql = String::with_capacity(prefix.len() + 4 * n + 2);
    sql.push_str(prefix);
    sql.push('(');
    for i in 1..=n {
        if i > 1 {
            sql.push_str(", ");
        }
        sql.push_str(&DB::param(leading + i));
    }
    sql.push(')');
    sql
}

/// Every statement of `sql` as `DB` is sent it, by name: those that end
/// with a list of sequence numbers with one, and with three.
#[cfg(test)]
pub(super) fn sent<DB: Backend>(sql: &OutboxStatements) -> Vec<(String, String)> {
    let one = |name: &str, sql: &str| (name.to_owned(), sql.to_owned());
    let mut sent = vec![
        one("insert_fenced", &sql.insert_fenced),
        one("insert", &sql.insert),
        one("exists", &sql.exists),
        one("free", &sql.free),
        one("leased", &sql.leased),
        one("purge", &sql.purge),
        one("waiting", &sql.waiting),
        one("park", &sql.park),
        one("parked", &sql.parked),
        one("parked_count", &sql.parked_count),
    ];
    for (name, prefix, leading) in [
        ("lease", &sql.lease, 2),
        ("mark", &sql.mark, 0),
        ("release", &sql.release, 1),
        ("unpark", &sql.unpark, 0),
    ] {
        for n in [1, 3] {
            sent.push((format!("{name}({n})"), with_list::<DB>(prefix, leading, n)));
        }
    }
    sent
}

/// A message as written to the outbox.
#[derive(Clone, Debug)]
pub(crate) struct Row<'a> {
    pub(crate) id: &'a str,
    pub(crate) topic: &'a str,
    pub(crate) key: Option<&'a [u8]>,
    pub(crate) payload: Option<&'a [u8]>,
    pub(crate) headers: &'a [u8],
    /// How long it is kept once written (and relayed), in milliseconds.
    pub(crate) ttl: i64,
}

impl<'a> Row<'a> {
    fn values(&self) -> Vec<Value<'a>> {
        vec![
            Value::Text(self.id),
            Value::Text(self.topic),
            self.key.map_or(Value::NullBytes, Value::Bytes),
            self.payload.map_or(Value::NullBytes, Value::Bytes),
            Value::Bytes(self.headers),
            Value::Int(self.ttl),
        ]
    }
}

/// A row a relay leased, as read.
#[derive(Clone, Debug)]
pub(crate) struct LeasedRow {
    pub(crate) seq: i64,
    pub(crate) id: String,
    pub(crate) topic: String,
    pub(crate) key: Option<Vec<u8>>,
    pub(crate) payload: Option<Vec<u8>>,
    pub(crate) headers: Vec<u8>,
    pub(crate) attempts: i64,
}

impl<DB: Backend> SqlStore<DB> {
    /// Writes `row` on `conn` while `claim` holds its record in this
    /// store's table, unless a row holds its id already (an earlier
    /// attempt of the operation wrote it); [`Error::LeaseLost`] when the
    /// claim does not hold the record.
    pub(crate) async fn outbox_insert_fenced(
        sql: &OutboxStatements,
        conn: &mut DB::Connection,
        claim: &Claim,
        row: &Row<'_>,
    ) -> Result<(), Error> {
        let mut values = row.values();
        values.extend([
            Value::Text(claim.scope.as_str()),
            Value::Text(claim.key.as_str()),
            Value::Bytes(claim.token.as_bytes()),
        ]);
        let done = DB::execute(conn, &sql.insert_fenced, values).await?;
        // Written, or (MySQL, which counts matched rows) a duplicate.
        if DB::rows_affected(&done) > 0 {
            return Ok(());
        }
        // Nothing written: the id was there, or the claim is gone.
        if Self::outbox_has(sql, conn, row.id).await? {
            return Ok(());
        }
        Err(Error::LeaseLost)
    }

    /// Writes `row` on `conn`, unfenced, unless a row holds its id.
    pub(crate) async fn outbox_insert(
        sql: &OutboxStatements,
        conn: &mut DB::Connection,
        row: &Row<'_>,
    ) -> Result<(), Error> {
        DB::execute(conn, &sql.insert, row.values()).await?;
        Ok(())
    }

    async fn outbox_has(
        sql: &OutboxStatements,
        conn: &mut DB::Connection,
        id: &str,
    ) -> Result<bool, Error> {
        let n = DB::fetch_int(conn, &sql.exists, vec![Value::Text(id)]).await?;
        Ok(n.unwrap_or(0) > 0)
    }

    /// Leases at most `batch` of the oldest free rows for `lease_ms`
    /// under `token`, and reads them, in order.
    pub(crate) async fn outbox_lease(
        &self,
        sql: &OutboxStatements,
        batch: usize,
        lease_ms: i64,
        token: &ClaimToken,
    ) -> Result<Vec<LeasedRow>, Error> {
        let batch = i64::try_from(batch.max(1)).unwrap_or(i64::MAX);
        let _turn = self.gate.enter().await;
        let mut pooled = super::tx::TxConn::acquire(&self.pool).await?;
        let rows = {
            let mut tx = pooled.begin(Some(DB::BEGIN_WRITE)).await?;
            let conn: &mut DB::Connection = &mut tx;
            let seqs: Vec<i64> = DB::fetch_all(conn, &sql.free, vec![Value::Int(batch)])
                .await?
                .iter()
                .map(|row| DB::int(row, "seq").map(|seq| seq.unwrap_or(-1)))
                .collect::<Result<_, _>>()?;
            if seqs.is_empty() {
                tx.rollback().await?;
                pooled.ended();
                return Ok(Vec::new());
            }
            let mut values = vec![Value::Int(lease_ms), Value::Bytes(token.as_bytes())];
            let lease = with_list::<DB>(&sql.lease, values.len(), seqs.len());
            values.extend(seqs.iter().map(|seq| Value::Int(*seq)));
            DB::execute(conn, &lease, values).await?;
            let values = vec![Value::Bytes(token.as_bytes())];
            let rows = DB::fetch_all(conn, &sql.leased, values).await?;
            let rows = rows
                .iter()
                .map(|row| self.outbox_row(row))
                .collect::<Result<Vec<_>, _>>()?;
            tx.commit().await?;
            rows
        };
        pooled.ended();
        Ok(rows)
    }

    /// A text column of an outbox row (bytes on MySQL).
    fn outbox_text(row: &DB::Row, column: &str) -> Result<String, Error> {
        if DB::TEXT_AS_BYTES {
            let bytes = DB::bytes(row, column)?.unwrap_or_default();
            String::from_utf8(bytes)
                .map_err(|_| Error::store(format!("outbox row: {column} is not UTF-8")))
        } else {
            Ok(DB::text(row, column)?)
        }
    }

    fn outbox_row(&self, row: &DB::Row) -> Result<LeasedRow, Error> {
        let text = |column: &str| Self::outbox_text(row, column);
        Ok(LeasedRow {
            seq: DB::int(row, "seq")?.unwrap_or(-1),
            id: text("message_id")?,
            topic: text("topic")?,
            key: DB::bytes(row, "message_key")?,
            payload: DB::bytes(row, "payload")?,
            headers: DB::bytes(row, "headers")?.unwrap_or_default(),
            attempts: DB::int(row, "attempts")?.unwrap_or(0),
        })
    }

    /// Deletes at most `batch` relayed rows kept past their time.
    pub(crate) async fn outbox_purge(
        &self,
        sql: &OutboxStatements,
        batch: usize,
    ) -> Result<u64, Error> {
        let batch = i64::try_from(batch.max(1)).unwrap_or(i64::MAX);
        let _turn = self.gate.enter().await;
        let mut conn = self.pool.acquire().await?;
        let done = DB::execute(&mut conn, &sql.purge, vec![Value::Int(batch)]).await?;
        Ok(DB::rows_affected(&done))
    }

    /// How many rows wait to be relayed.
    pub(crate) async fn outbox_waiting(&self, sql: &OutboxStatements) -> Result<u64, Error> {
        self.outbox_count(&sql.waiting).await
    }

    /// How many rows are parked.
    pub(crate) async fn outbox_parked_count(&self, sql: &OutboxStatements) -> Result<u64, Error> {
        self.outbox_count(&sql.parked_count).await
    }

    async fn outbox_count(&self, statement: &str) -> Result<u64, Error> {
        let mut conn = self.pool.acquire().await?;
        let n = DB::fetch_int(&mut conn, statement, Vec::new()).await?;
        Ok(u64::try_from(n.unwrap_or(0)).unwrap_or(0))
    }

    /// Parks the row `seq` leased under `token`, with `reason`; whether
    /// it was (a row relayed, or leased by another relay since, is not).
    pub(crate) async fn outbox_park(
        &self,
        sql: &OutboxStatements,
        token: &ClaimToken,
        seq: i64,
        reason: &str,
    ) -> Result<bool, Error> {
        let reason = if DB::TEXT_AS_BYTES {
            Value::Bytes(reason.as_bytes())
        } else {
            Value::Text(reason)
        };
        let values = vec![reason, Value::Bytes(token.as_bytes()), Value::Int(seq)];
        let _turn = self.gate.enter().await;
        let mut conn = self.pool.acquire().await?;
        let done = DB::execute(&mut conn, &sql.park, values).await?;
        Ok(DB::rows_affected(&done) > 0)
    }

    /// The oldest `batch` parked rows, with their reasons.
    pub(crate) async fn outbox_parked(
        &self,
        sql: &OutboxStatements,
        batch: usize,
    ) -> Result<Vec<(LeasedRow, String)>, Error> {
        let batch = i64::try_from(batch.max(1)).unwrap_or(i64::MAX);
        let mut conn = self.pool.acquire().await?;
        let rows = DB::fetch_all(&mut conn, &sql.parked, vec![Value::Int(batch)]).await?;
        rows.iter()
            .map(|row| {
                Ok((
                    self.outbox_row(row)?,
                    Self::outbox_text(row, "parked_reason")?,
                ))
            })
            .collect()
    }

    /// Runs the write `prefix` (ended by `seq IN `) on the rows `seqs`, a
    /// statement for each `batch` of them, after the lease's `token` where
    /// the statement takes one (a give-back); returns how many rows it
    /// changed. The outbox marks, gives back and unparks rows this way.
    pub(crate) async fn outbox_on_seqs(
        &self,
        prefix: &str,
        token: Option<&ClaimToken>,
        seqs: &[i64],
        batch: usize,
    ) -> Result<u64, Error> {
        let mut changed = 0;
        for seqs in seqs.chunks(batch.max(1)) {
            let mut values: Vec<Value<'_>> = token
                .map(|token| Value::Bytes(token.as_bytes()))
                .into_iter()
                .collect();
            let statement = with_list::<DB>(prefix, values.len(), seqs.len());
            values.extend(seqs.iter().map(|seq| Value::Int(*seq)));
            let _turn = self.gate.enter().await;
            let mut conn = self.pool.acquire().await?;
            let done = DB::execute(&mut conn, &statement, values).await?;
            changed += DB::rows_affected(&done);
        }
        Ok(changed)
    }
}

/// A lease's length in milliseconds, as bound.
pub(crate) fn lease_millis(lease: std::time::Duration) -> i64 {
    duration_millis(lease)
}
