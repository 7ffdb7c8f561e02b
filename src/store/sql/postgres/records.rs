//! PostgreSQL's statements on the records table: the claim and its
//! takeover, the reads, and the fenced writes, for the records flow
//! ([`flow`](crate::store::sql::flow)), with the order of their values
//! ([`Numbered`]). None of them locks a row it does not claim, so a
//! duplicate never holds a lock the owner needs.

use sqlx::Postgres;

use super::NOW;
use crate::store::sql::statements::{ClaimReturns, JournalSql, Numbered, RecordsSql, Statements};

/// Answers the record holding the key, or, when there is none, inserts a
/// new record, in one round trip: a replay is this one statement, and
/// costs one index lookup, as a plain read does (the insert runs only when
/// the lookup found nothing).
///
/// `ON CONFLICT DO NOTHING` locks nothing, so a duplicate (even inside a
/// caller's transaction) holds no lock the owner needs. The existing row
/// is read with the statement's snapshot: a row committed after it began
/// (the conflict waited for its inserter) is not in it, and the statement
/// answers no row; the record is then read again. A free record (expired,
/// or a lapsed lease) is taken over with [`TAKE_OVER`].
const CLAIM: &str = r#"WITH c AS (SELECT {now} AS now),
    held AS (
        SELECT scope, key, fingerprint, state, fence, claim_token, lease_until,
            outcome_kind, outcome, created_at, expires_at
        FROM "{table}" WHERE scope = $1 AND key = $2),
    ins AS (
        INSERT INTO "{table}"
            (scope, key, fingerprint, state, fence, claim_token, lease_until,
             created_at, expires_at)
        SELECT $1, $2, $3, 'in_progress', 1, $4, c.now + $5, c.now,
               c.now + GREATEST($5, $6)
        FROM c
        WHERE NOT EXISTS (SELECT 1 FROM held)
        ON CONFLICT (scope, key) DO NOTHING
        RETURNING scope, key, fingerprint, state, fence, claim_token, lease_until,
            outcome_kind, outcome, created_at, expires_at),
    kept AS (
        UPDATE "{table}_steps" AS j SET expires_at = c.now + GREATEST($5, $6)
        FROM c
        WHERE j.scope = $1 AND j.key = $2 AND EXISTS (SELECT 1 FROM ins)
          AND j.expires_at > c.now AND j.expires_at < c.now + GREATEST($5, $6))
    SELECT ins.*, c.now AS db_now FROM ins, c
    UNION ALL
    SELECT held.*, c.now AS db_now FROM held, c"#;

const TAKE_OVER: &str = r#"WITH c AS (SELECT {now} AS now),
    taken AS (
    UPDATE "{table}" AS t SET
        fingerprint = $3,
        state = 'in_progress',
        fence = t.fence + 1,
        claim_token = $4,
        lease_until = c.now + $5,
        outcome_kind = NULL,
        outcome = NULL,
        created_at = c.now,
        expires_at = c.now + GREATEST($5, $6)
    FROM c
    WHERE t.scope = $1 AND t.key = $2
      AND (t.expires_at <= c.now
           OR (t.state = 'in_progress'
               AND t.lease_until <= c.now
               AND t.fingerprint = $3))
    RETURNING t.fence),
    kept AS (
        UPDATE "{table}_steps" AS j SET expires_at = c.now + GREATEST($5, $6)
        FROM c
        WHERE j.scope = $1 AND j.key = $2 AND EXISTS (SELECT 1 FROM taken)
          AND j.expires_at > c.now AND j.expires_at < c.now + GREATEST($5, $6))
    SELECT fence FROM taken"#;

const SELECT: &str = r#"SELECT scope, key, fingerprint, state, fence, claim_token, lease_until,
        outcome_kind, outcome, created_at, expires_at, {now} AS db_now
    FROM "{table}" WHERE scope = $1 AND key = $2"#;

/// The record as a waiter sees it when it starts to wait (registered in
/// this process, listening), marking it `waited` while it is in progress,
/// so that its completion or release notifies. Only the first waiter
/// writes; the mark runs on the store's pool, never in a caller's
/// transaction, and holds the row for its own commit only.
///
/// The row is the mark's when it marked (the latest version), else the
/// statement's snapshot: marked already (every later completion
/// notifies), or not in progress any more. In that last case a completion
/// committed between the snapshot and the mark can show the record still
/// in progress though nothing will notify: the waiter then looks again
/// at its next poll (at most 500 ms later); waiters in the completing
/// process are woken in process all the same. A row locked by a write
/// still open (a transactional owner's takeover) is skipped, not waited
/// for: the waiter then polls, within its own wait bound.
const LOOK: &str = r#"WITH c AS (SELECT {now} AS now),
    mark AS (
        UPDATE "{table}" SET waited = true
        WHERE ctid = (
            SELECT ctid FROM "{table}"
            WHERE scope = $1 AND key = $2 AND state = 'in_progress' AND NOT waited
            FOR UPDATE SKIP LOCKED)
          AND state = 'in_progress' AND NOT waited
        RETURNING scope, key, fingerprint, state, fence, claim_token, lease_until,
            outcome_kind, outcome, created_at, expires_at)
    SELECT mark.*, c.now AS db_now FROM mark, c
    UNION ALL
    SELECT t.scope, t.key, t.fingerprint, t.state, t.fence, t.claim_token, t.lease_until,
        t.outcome_kind, t.outcome, t.created_at, t.expires_at, c.now AS db_now
    FROM "{table}" AS t, c
    WHERE t.scope = $1 AND t.key = $2 AND NOT EXISTS (SELECT 1 FROM mark)"#;

const RENEW: &str = r#"UPDATE "{table}" AS t
    SET lease_until = c.now + $4, expires_at = GREATEST(t.expires_at, c.now + $4)
    FROM (SELECT {now} AS now) AS c
    WHERE t.scope = $1 AND t.key = $2 AND t.claim_token = $3
      AND t.state = 'in_progress'"#;

/// Completes, and in the same round trip, when a duplicate marked the
/// record `waited`, tells the listeners of every process (`NOTIFY` on the
/// table's channel, delivered when the transaction commits) that the key
/// changed: the payload is the key, a space, then the scope (a key has no
/// spaces; both are short enough for `NOTIFY`, as checked below). The
/// statement answers one row per record written, notifying or not, so the
/// fenced check counts the same as the bare `UPDATE`.
const COMPLETE: &str = r#"WITH done AS (
        UPDATE "{table}"
        SET state = 'completed', outcome_kind = $1, outcome = $2,
            lease_until = NULL, expires_at = {now} + $3
        WHERE scope = $4 AND key = $5 AND claim_token = $6
          AND (state = 'in_progress'
               OR (state = 'completed' AND outcome_kind = $1 AND outcome = $2))
        RETURNING waited)
    SELECT CASE WHEN done.waited THEN pg_notify('{table}', $5 || ' ' || $4) END FROM done"#;

// `NOTIFY` refuses payloads of 8000 bytes or more: the longest key, a
// space and the longest stored scope stay far below.
const _: () = assert!(idem_core::key::MAX_KEY_LEN + 1 + idem_core::key::MAX_SCOPE_LEN < 8000);

/// Releases, and notifies as [`COMPLETE`] does.
const RELEASE: &str = r#"WITH done AS (
        DELETE FROM "{table}"
        WHERE scope = $1 AND key = $2 AND claim_token = $3 AND state = 'in_progress'
        RETURNING waited)
    SELECT CASE WHEN done.waited THEN pg_notify('{table}', $2 || ' ' || $1) END FROM done"#;

/// Forgets, and notifies as [`COMPLETE`] does.
const FORGET: &str = r#"WITH done AS (
        DELETE FROM "{table}" WHERE scope = $1 AND key = $2
        RETURNING 1)
    SELECT pg_notify('{table}', $2 || ' ' || $1) FROM done"#;

/// Rows a claim is taking over right now are skipped, not waited for: the
/// purge never queues behind, nor blocks, new claims.
const PURGE: &str = r#"DELETE FROM "{table}"
    WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM "{table}" WHERE expires_at <= {now}
        LIMIT $1 FOR UPDATE SKIP LOCKED))
      AND expires_at <= {now}"#;

impl RecordsSql for Postgres {
    /// The statements on the records table `table`, and the journal's beside
    /// it.
    fn statements(table: String) -> Statements {
        Numbered {
            claim: CLAIM,
            take_over: Some(TAKE_OVER),
            select: SELECT,
            look: Some(LOOK),
            renew: RENEW,
            complete: COMPLETE,
            release: RELEASE,
            forget: FORGET,
            purge: PURGE,
        }
        .on(
            table.clone(),
            NOW,
            ClaimReturns::Record,
            Postgres::journal(&table),
        )
    }
}
