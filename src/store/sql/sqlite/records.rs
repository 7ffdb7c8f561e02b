//! SQLite's statements on the records table: the claim (which also takes
//! over a free record), the read, and the fenced writes, for the records
//! flow ([`flow`](crate::store::sql::flow)), with the order of their
//! values ([`Numbered`]).

use sqlx::Sqlite;

use super::NOW;
use crate::store::sql::statements::{ClaimReturns, JournalSql, Numbered, RecordsSql, Statements};

/// The claim: one upsert, which also takes over a free record (expired,
/// or in progress with a lapsed lease and the same payload), answering the
/// fence; no separate take-over. `WHERE true` tells SQLite's parser that
/// `ON CONFLICT` belongs to the upsert, not to the SELECT's join.
const CLAIM: &str = r#"INSERT INTO "{table}"
        (scope, key, fingerprint, state, fence, claim_token, lease_until,
         created_at, expires_at)
    SELECT ?1, ?2, ?3, 'in_progress', 1, ?4, c.now + ?5, c.now, c.now + max(?5, ?6)
    FROM (SELECT {now} AS now) AS c WHERE true
    ON CONFLICT (scope, key) DO UPDATE SET
        fingerprint = excluded.fingerprint,
        state = 'in_progress',
        fence = "{table}".fence + 1,
        claim_token = excluded.claim_token,
        lease_until = excluded.lease_until,
        outcome_kind = NULL,
        outcome = NULL,
        created_at = excluded.created_at,
        expires_at = excluded.expires_at
    WHERE "{table}".expires_at <= excluded.created_at
       OR ("{table}".state = 'in_progress'
           AND "{table}".lease_until <= excluded.created_at
           AND "{table}".fingerprint = excluded.fingerprint)
    RETURNING fence"#;

const SELECT: &str = r#"SELECT scope, key, fingerprint, state, fence, claim_token, lease_until,
        outcome_kind, outcome, created_at, expires_at, {now} AS db_now
    FROM "{table}" WHERE scope = ?1 AND key = ?2"#;

const RENEW: &str = r#"UPDATE "{table}"
    SET lease_until = {now} + ?4, expires_at = max(expires_at, {now} + ?4)
    WHERE scope = ?1 AND key = ?2 AND claim_token = ?3 AND state = 'in_progress'"#;

const COMPLETE: &str = r#"UPDATE "{table}"
    SET state = 'completed', outcome_kind = ?1, outcome = ?2,
        lease_until = NULL, expires_at = {now} + ?3
    WHERE scope = ?4 AND key = ?5 AND claim_token = ?6
      AND (state = 'in_progress'
           OR (state = 'completed' AND outcome_kind = ?1 AND outcome = ?2))"#;

const RELEASE: &str = r#"DELETE FROM "{table}"
    WHERE scope = ?1 AND key = ?2 AND claim_token = ?3 AND state = 'in_progress'"#;

const FORGET: &str = r#"DELETE FROM "{table}" WHERE scope = ?1 AND key = ?2"#;

const PURGE: &str = r#"DELETE FROM "{table}" WHERE rowid IN
    (SELECT rowid FROM "{table}" WHERE expires_at <= {now} LIMIT ?1)"#;

impl RecordsSql for Sqlite {
    /// The statements on the records table `table`, and the journal's beside
    /// it.
    fn statements(table: String) -> Statements {
        Numbered {
            claim: CLAIM,
            take_over: None,
            select: SELECT,
            look: None,
            renew: RENEW,
            complete: COMPLETE,
            release: RELEASE,
            forget: FORGET,
            purge: PURGE,
        }
        .on(
            table.clone(),
            NOW,
            ClaimReturns::Fence,
            Sqlite::journal(&table),
        )
    }
}
