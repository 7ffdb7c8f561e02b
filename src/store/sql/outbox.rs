//! The transactional outbox on the SQL backends: a table beside the
//! records table (`<records table>_outbox`), created by the store's
//! migrations, and the statements every backend shares (see
//! [`crate::outbox`] for what they are for).
//!
//! A relay leases rows in one short transaction: it reads the oldest rows
//! that are neither relayed nor leased (PostgreSQL and MariaDB skip rows
//! that another relay is leasing right now: `FOR UPDATE SKIP LOCKED`;
//! SQLite's transaction holds the whole database), writes its lease on
//! them, and reads them back by its lease token. The lease is a column,
//! decided with the database's clock, so a relay that died holds its rows
//! only until its lease ends. A row is marked relayed by its sequence
//! number alone, whoever leases it now: the broker acknowledged it.
#![allow(unreachable_pub)] // named by the sealed `Dialect`, so `pub`; unnameable outside

use super::exec::Value;
use super::step_statements::numbered;
use super::{Backend, SqlStore};
use idem_core::error::Error;
use idem_core::record::{duration_millis, Claim, ClaimToken};

/// The outbox table of the records table `table`.
pub(crate) fn outbox_table(table: &str) -> String {
    format!("{table}_outbox")
}

/// The columns a relay reads.
const COLUMNS: &str = "seq, message_id, topic, message_key, payload, headers, attempts";

/// A backend's statements on one outbox table, with `?` placeholders
/// (numbered when run: some take a list of sequence numbers).
#[derive(Debug)]
pub struct OutboxStatements {
    /// The table's name.
    pub(crate) table: String,
    /// A message, written while the operation's record is in progress
    /// under its claim (read with a shared lock): message id, topic, key,
    /// payload, headers, ttl, then the record's scope, key, token.
    insert_fenced: String,
    /// A message, unfenced (entity mode, whose transaction completes the
    /// claim): message id, topic, key, payload, headers, ttl.
    insert: String,
    /// Whether a message id is in the table: message id.
    exists: String,
    /// The oldest rows a relay may lease: batch.
    free: String,
    /// Leases rows: lease, token, then the sequence numbers.
    lease: String,
    /// The rows a lease holds: token.
    leased: String,
    /// Marks rows relayed: the sequence numbers.
    mark: String,
    /// Gives leased rows back: token, then the sequence numbers.
    release: String,
    /// Deletes at most a batch of relayed rows past their time: batch.
    purge: String,
    /// How many rows wait to be relayed (parked rows do not).
    waiting: String,
    /// Parks a leased row: reason, token, sequence number.
    park: String,
    /// The oldest parked rows, with their reason: batch.
    parked: String,
    /// How many rows are parked.
    parked_count: String,
    /// Unparks rows: the sequence numbers.
    unpark: String,
}

impl OutboxStatements {
    /// The statements on `<table>_outbox` for `DB`.
    pub(crate) fn new<DB: Backend>(table: &str) -> Self {
        let q = DB::QUOTE;
        let outbox = format!("{q}{}{q}", outbox_table(table));
        let fill = |sql: &str| {
            sql.replace("{columns}", COLUMNS)
                .replace("{records}", &format!("{q}{table}{q}"))
                .replace("{outbox}", &outbox)
                .replace("{key}", &format!("{q}key{q}"))
                .replace("{now}", DB::NOW)
                .replace("{share}", DB::LOCK_SHARE)
                .replace("{skip_locked}", DB::SKIP_LOCKED)
                .replace("{ignore}", DB::OUTBOX_IGNORE_DUPLICATE)
        };
        let insert_columns = "INSERT INTO {outbox} (message_id, topic, message_key, payload, \
                              headers, attempts, created_at, expires_at) ";
        OutboxStatements {
            table: outbox_table(table),
            insert_fenced: fill(&format!(
                "{insert_columns}SELECT ?, ?, ?, ?, ?, 0, {{now}}, {{now}} + ? \
                 FROM {{records}} AS r WHERE r.scope = ? AND r.{{key}} = ? \
                 AND r.claim_token = ? AND r.state = 'in_progress'{{share}} {{ignore}}"
            )),
            insert: fill(&format!(
                "{insert_columns}SELECT ?, ?, ?, ?, ?, 0, {{now}}, {{now}} + ? \
                 FROM (SELECT 1 AS one) AS r WHERE true {{ignore}}"
            )),
            exists: fill("SELECT COUNT(*) FROM {outbox} WHERE message_id = ?"),
            free: fill(
                "SELECT seq FROM {outbox} WHERE relayed_at IS NULL AND parked_at IS NULL \
                 AND (lease_until IS NULL OR lease_until <= {now}) \
                 ORDER BY relayed_at, seq LIMIT ?{skip_locked}",
            ),
            lease: fill(
                "UPDATE {outbox} SET lease_until = {now} + ?, lease_token = ?, \
                 attempts = attempts + 1 WHERE relayed_at IS NULL AND parked_at IS NULL \
                 AND (lease_until IS NULL OR lease_until <= {now}) AND seq IN ",
            ),
            leased: fill(
                "SELECT {columns} FROM {outbox} WHERE lease_token = ? AND relayed_at IS NULL \
                 ORDER BY seq",
            ),
            mark: fill(
                "UPDATE {outbox} SET relayed_at = {now}, lease_until = NULL, lease_token = NULL \
                 WHERE relayed_at IS NULL AND seq IN ",
            ),
            release: fill(
                "UPDATE {outbox} SET lease_until = NULL, lease_token = NULL \
                 WHERE relayed_at IS NULL AND lease_token = ? AND seq IN ",
            ),
            purge: fill(DB::OUTBOX_PURGE),
            waiting: fill(
                "SELECT COUNT(*) FROM {outbox} WHERE relayed_at IS NULL AND parked_at IS NULL",
            ),
            park: fill(
                "UPDATE {outbox} SET parked_at = {now}, parked_reason = ?, lease_until = NULL, \
                 lease_token = NULL WHERE relayed_at IS NULL AND lease_token = ? AND seq = ?",
            ),
            parked: fill(
                "SELECT {columns}, parked_reason FROM {outbox} WHERE relayed_at IS NULL \
                 AND parked_at IS NOT NULL ORDER BY seq LIMIT ?",
            ),
            parked_count: fill(
                "SELECT COUNT(*) FROM {outbox} WHERE relayed_at IS NULL AND parked_at IS NOT NULL",
            ),
            unpark: fill(
                "UPDATE {outbox} SET parked_at = NULL, parked_reason = NULL \
                 WHERE relayed_at IS NULL AND parked_at IS NOT NULL AND seq IN ",
            ),
        }
    }
}

#[cfg(test)]
impl OutboxStatements {
    /// Every statement as `DB` is sent it, by name: those that end with a
    /// list of sequence numbers with one, and with three.
    pub(super) fn sent<DB: Backend>(&self) -> Vec<(String, String)> {
        let one = |name: &str, sql: &str| (name.to_owned(), numbered::<DB>(sql));
        let mut sent = vec![
            one("insert_fenced", &self.insert_fenced),
            one("insert", &self.insert),
            one("exists", &self.exists),
            one("free", &self.free),
            one("leased", &self.leased),
            one("purge", &self.purge),
            one("waiting", &self.waiting),
            one("park", &self.park),
            one("parked", &self.parked),
            one("parked_count", &self.parked_count),
        ];
        for (name, prefix) in [
            ("lease", &self.lease),
            ("mark", &self.mark),
            ("release", &self.release),
            ("unpark", &self.unpark),
        ] {
            for n in [1, 3] {
                sent.push((format!("{name}({n})"), with_list::<DB>(prefix, n)));
            }
        }
        sent
    }
}

/// `prefix` followed by a list of `n` placeholders, numbered as `DB`
/// numbers them.
fn with_list<DB: Backend>(prefix: &str, n: usize) -> String {
    let mut sql = String::with_capacity(prefix.len() + 3 * n + 2);
    sql.push_str(prefix);
    sql.push('(');
    for i in 0..n {
        if i > 0 {
            sql.push_str(", ");
        }
        sql.push('?');
    }
    sql.push(')');
    numbered::<DB>(&sql)
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
        let statement = numbered::<DB>(&sql.insert_fenced);
        let done = DB::execute(conn, &statement, values).await?;
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
        let statement = numbered::<DB>(&sql.insert);
        DB::execute(conn, &statement, row.values()).await?;
        Ok(())
    }

    async fn outbox_has(
        sql: &OutboxStatements,
        conn: &mut DB::Connection,
        id: &str,
    ) -> Result<bool, Error> {
        let statement = numbered::<DB>(&sql.exists);
        let n = DB::fetch_int(conn, &statement, vec![Value::Text(id)]).await?;
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
            let free = numbered::<DB>(&sql.free);
            let seqs: Vec<i64> = DB::fetch_all(conn, &free, vec![Value::Int(batch)])
                .await?
                .iter()
                .map(|row| DB::int(row, "seq").map(|seq| seq.unwrap_or(-1)))
                .collect::<Result<_, _>>()?;
            if seqs.is_empty() {
                tx.rollback().await?;
                pooled.ended();
                return Ok(Vec::new());
            }
            let lease = with_list::<DB>(&sql.lease, seqs.len());
            let mut values = vec![Value::Int(lease_ms), Value::Bytes(token.as_bytes())];
            values.extend(seqs.iter().map(|seq| Value::Int(*seq)));
            DB::execute(conn, &lease, values).await?;
            let leased = numbered::<DB>(&sql.leased);
            let rows = DB::fetch_all(conn, &leased, vec![Value::Bytes(token.as_bytes())]).await?;
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

    /// Marks the rows `seqs` relayed; returns how many were not yet.
    pub(crate) async fn outbox_mark(
        &self,
        sql: &OutboxStatements,
        seqs: &[i64],
    ) -> Result<u64, Error> {
        self.outbox_on_seqs(&sql.mark, Vec::new(), seqs).await
    }

    /// Gives the rows `seqs` leased under `token` back, for the next lease.
    pub(crate) async fn outbox_release(
        &self,
        sql: &OutboxStatements,
        token: &ClaimToken,
        seqs: &[i64],
    ) -> Result<u64, Error> {
        self.outbox_on_seqs(&sql.release, vec![Value::Bytes(token.as_bytes())], seqs)
            .await
    }

    /// Deletes at most `batch` relayed rows kept past their time.
    pub(crate) async fn outbox_purge(
        &self,
        sql: &OutboxStatements,
        batch: usize,
    ) -> Result<u64, Error> {
        let batch = i64::try_from(batch.max(1)).unwrap_or(i64::MAX);
        let purge = numbered::<DB>(&sql.purge);
        let _turn = self.gate.enter().await;
        let mut conn = self.pool.acquire().await?;
        let done = DB::execute(&mut conn, &purge, vec![Value::Int(batch)]).await?;
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
        let n = DB::fetch_int(&mut conn, &numbered::<DB>(statement), Vec::new()).await?;
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
        let done = DB::execute(&mut conn, &numbered::<DB>(&sql.park), values).await?;
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
        let rows = DB::fetch_all(
            &mut conn,
            &numbered::<DB>(&sql.parked),
            vec![Value::Int(batch)],
        )
        .await?;
        rows.iter()
            .map(|row| {
                Ok((
                    self.outbox_row(row)?,
                    Self::outbox_text(row, "parked_reason")?,
                ))
            })
            .collect()
    }

    /// Unparks the rows `seqs`: they wait to be relayed again.
    pub(crate) async fn outbox_unpark(
        &self,
        sql: &OutboxStatements,
        seqs: &[i64],
    ) -> Result<u64, Error> {
        self.outbox_on_seqs(&sql.unpark, Vec::new(), seqs).await
    }

    /// Runs the write `prefix` (ended by `seq IN `) on the rows `seqs`,
    /// after the values `leading`; returns how many rows it changed.
    async fn outbox_on_seqs(
        &self,
        prefix: &str,
        mut leading: Vec<Value<'_>>,
        seqs: &[i64],
    ) -> Result<u64, Error> {
        if seqs.is_empty() {
            return Ok(0);
        }
        let statement = with_list::<DB>(prefix, seqs.len());
        leading.extend(seqs.iter().map(|seq| Value::Int(*seq)));
        let _turn = self.gate.enter().await;
        let mut conn = self.pool.acquire().await?;
        let done = DB::execute(&mut conn, &statement, leading).await?;
        Ok(DB::rows_affected(&done))
    }
}

/// A lease's length in milliseconds, as bound.
pub(crate) fn lease_millis(lease: std::time::Duration) -> i64 {
    duration_millis(lease)
}
