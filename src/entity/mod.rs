//! Entity mode (the domain-model token pattern) and upserts.
//!
//! In entity mode there is no idempotency table: the business table itself
//! carries the token in a column with a UNIQUE constraint, and the row *is*
//! the stored result. Describe the table once with `#[derive(idem::Entity)]`
//! (or implement [`Entity`], [`TokenEntity`] and [`EntityBind`] by hand),
//! read rows with your own `#[derive(sqlx::FromRow)]`, and run operations
//! with `#[idempotent(key = ..., store = <pool>, entity)]` or [`run`].
//!
//! # The flow
//!
//! [`run`] takes a sqlx pool (SQLite, PostgreSQL or MySQL/MariaDB), a
//! [`Call`] (the key and the payload fingerprint) and the body, a future
//! that produces the entity. It is the engine's flow (the claim, its
//! renewal, waiting, cancellation), with the row as the outcome:
//!
//! 1. **find by token**: a row whose token is the key is returned as it is
//!    stored; the body does not run;
//! 2. otherwise the call **claims the token** in the records table
//!    `idem_entity_claims` of the same database (created on first use), as
//!    record mode claims a key: one atomic conditional write, a lease that
//!    is renewed while the body runs, a claim token that fences every
//!    later write, the database's clock. Concurrent first calls with one
//!    token wait (up to the policy's bound, then [`Error::InProgress`]; or
//!    fail at once under `fail_fast`) and then find the row, so the body
//!    runs once. The claim is a committed row, not a lock held by a
//!    connection: a connection killed while the body runs takes nothing
//!    with it, and a retry meanwhile is told the call is in progress;
//! 3. under the claim, the call looks for the row again (an owner before it
//!    may have inserted it, then stopped), then runs the body;
//! 4. the body's entity must carry the key as its token (otherwise
//!    [`Error::Config`]); it is **inserted, and the claim completed, in
//!    one transaction**: one commit, and no moment where the row is
//!    stored and its claim still in progress. The row as stored (with the
//!    columns the database filled in) is returned. The body has run, so
//!    the transaction is tried again while the database cannot be reached
//!    (a lost or killed connection, a deadlock), and the claim stays held
//!    and renewed meanwhile: nothing is handed back before the row lands.
//!    Should the insert find the token taken by a row written by code that
//!    did not claim it, that row is read and returned (or refused, as a
//!    replay would be): the UNIQUE constraint stays the last line of
//!    defense;
//! 5. waiting duplicates see the claim completed, and read the row;
//! 6. a body error is returned as it is and the claim handed back, so a
//!    retry runs the body again.
//!
//! | backend | insert |
//! |---|---|
//! | PostgreSQL, SQLite | `INSERT ... ON CONFLICT (token) DO NOTHING RETURNING *` |
//! | MySQL/MariaDB | `INSERT`, then `SELECT` by token; on a duplicate-key error (1062), the row holding the token |
//!
//! A claim holds no connection and no lock while the body runs, so first
//! calls with different tokens run at once on every backend, SQLite
//! included, and a body may use the same pool freely.
//!
//! A call dropped while its body runs (a client went away, a timeout
//! fired) hands its claim back at once, so a retry runs without waiting
//! for the lease; see [the engine](crate::engine#cancellation). The body's
//! own side effects are not undone: to make a body always run to
//! completion, call the operation from a task of its own.
//!
//! A scope that names a principal is refused with [`Error::Config`]: rows
//! are found by their token alone, so a principal could not separate them.
//! Put the tenant into the token, or use record mode.
//!
//! # Reused tokens
//!
//! With a request-hash column (`#[idem(request_hash)]`), the payload's
//! fingerprint is stored with the row, and a token reused with another
//! payload is refused with [`Error::KeyReused`]. **Without one, a reused
//! token returns the existing entity, whatever the new payload**: the token
//! alone identifies the operation. A row whose hash column is `NULL`
//! (written by other code) is returned without comparison.
//!
//! The token column holds the key's text (`TEXT`, `VARCHAR(255)`) and is
//! expected to compare it byte for byte, as keys compare. A row found under
//! a token other than the key (a case-insensitive collation matched it) is
//! refused with [`Error::Config`] rather than returned as another key's
//! entity. On MySQL/MariaDB this is the common case: sqlx cannot read a
//! binary-collation (`_bin`) column into a `String`, so the token column
//! keeps a case-insensitive collation, and keys that differ only in case
//! cannot both be stored.
//!
//! The policy's `ttl` does not apply: the row lives as long as the table
//! keeps it, and a claim is kept only as long as its lease after it
//! completed. The policy's `lease` is the claim's.
//!
//! # Upserts
//!
//! [`upsert`] is the PUT-style write on a natural key (a subscription per
//! user): create the row if absent, update it if present, in one statement
//! decided by the UNIQUE constraint on the conflict columns, so concurrent
//! repeats are safe and the same upsert applied N times leaves the same
//! state:
//!
//! | backend | statement |
//! |---|---|
//! | PostgreSQL, SQLite | `INSERT ... ON CONFLICT (<keys>) DO UPDATE SET c = excluded.c, ... RETURNING *` |
//! | MySQL/MariaDB | `INSERT ... ON DUPLICATE KEY UPDATE c = VALUES(c), ...`, then `SELECT` by the keys, in one transaction (retried on a deadlock) |
//!
//! On MySQL the update fires on a conflict with *any* unique key of the
//! table, so the conflict columns should be the only unique key a new row
//! can collide on.
//!
//! # Names and values
//!
//! Table and column names are formatted into SQL (a name cannot be bound),
//! so they are checked: 1 to 63 ASCII letters, digits and underscores, not
//! starting with a digit; they are quoted, hence case-sensitive. Every value
//! is bound.

use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;

use sqlx::{FromRow, Pool};
use tracing::Instrument;

use crate::engine::{self, Call, Codec};
use crate::metrics;
use crate::policy::Policy;
use crate::steps::{self, StepsAs};
use crate::store::sql::entity::check_token_names;
use crate::store::sql::entity::Claims;
pub use crate::store::sql::entity::{
    is_unique_violation, Entity, EntityBind, EntityDatabase, RequestHash, TokenEntity,
};
use crate::store::sql::tx::TxConn;
use crate::store::sql::SqlStore;
use idem_core::error::Error;
use idem_core::fingerprint::Fingerprint;
use idem_core::key::{Key, Scope};
use idem_core::record::{Claim, Outcome, OutcomeKind};
/// The sqlx this crate is built with: the version whose types an entity's
/// code and the SQL stores' pools are of, which `#[derive(Entity)]`'s code
/// names.
pub use sqlx;

/// Entity mode: returns the row whose token is the call's key, or runs
/// `body` once per token and saves the entity it produces. See the
/// [module documentation](self).
pub async fn run<DB, T, E, Fut>(pool: &Pool<DB>, call: Call, body: Fut) -> Result<T, E>
where
    DB: EntityDatabase,
    T: TokenEntity + EntityBind<DB> + for<'r> FromRow<'r, DB::Row> + Send + Unpin,
    E: From<Error>,
    Fut: Future<Output = Result<T, E>>,
{
    let prepared = Prepared::new(&call)?;
    check_token_names::<T>()?;
    let span = prepared.span();
    async move {
        if let Some(found) = DB::find_entity::<T>(pool, &prepared.key).await? {
            return Ok(prepared.replay(found)?);
        }
        let claims = DB::claims(pool).await?;
        let entry = engine::run(
            &claims,
            prepared.claim::<T>(call.policy()).with_codec(Marker),
            claimed::<DB, T, E, Fut>(pool, &claims, &prepared, body),
        )
        .await?;
        match entry {
            Entry::Saved(row) => Ok(row),
            Entry::Found(found) => Ok(prepared.replay(found)?),
            // The claim was completed: its row is stored.
            Entry::Stored => match DB::find_entity::<T>(pool, &prepared.key).await? {
                Some(found) => Ok(prepared.check_found(&found).map(|()| found)?),
                None => Err(Error::store(format!(
                    "the claim on token {:?} was completed, but no row of table {:?} holds it \
                     (was it deleted?)",
                    prepared.key,
                    T::TABLE
                ))
                .into()),
            },
        }
    }
    .instrument(span)
    .await
}

/// What runs under the claim: look again, run the body, insert its row
/// (completing the claim in the same transaction).
async fn claimed<DB, T, E, Fut>(
    pool: &Pool<DB>,
    claims: &Claims<SqlStore<DB>>,
    prepared: &Prepared,
    body: Fut,
) -> Result<Entry<T>, E>
where
    DB: EntityDatabase,
    T: TokenEntity + EntityBind<DB> + for<'r> FromRow<'r, DB::Row> + Send + Unpin,
    E: From<Error>,
    Fut: Future<Output = Result<T, E>>,
{
    // An owner before this one may have inserted its row, then stopped
    // before its claim was completed.
    if let Some(found) = DB::find_entity::<T>(pool, &prepared.key).await? {
        return Ok(Entry::Found(found));
    }
    // The body's outbox messages wait for the entity's transaction.
    steps::hold_messages();
    let mut entity = body.await?;
    prepared.produced(&mut entity)?;
    Ok(Entry::Saved(
        save::<DB, T>(pool, claims, &entity, prepared).await?,
    ))
}

/// What the claimed flow ends with.
enum Entry<T> {
    /// The row this call inserted.
    Saved(T),
    /// A row found under the token once claimed.
    Found(T),
    /// The claim was completed by another call: read its row.
    Stored,
}

/// The outcome stored with a completed claim: nothing but the fact (the
/// row is the result).
struct Marker;

impl Marker {
    /// The outcome the engine stores with a completed claim.
    fn outcome() -> Outcome {
        Outcome {
            kind: OutcomeKind::Ok,
            body: Vec::new(),
        }
    }
}

impl<T> Codec<Entry<T>> for Marker {
    fn encode(&self, _: &Entry<T>) -> Result<Vec<u8>, Error> {
        Ok(Marker::outcome().body)
    }

    fn decode(&self, _: &[u8]) -> Result<Entry<T>, Error> {
        Ok(Entry::Stored)
    }
}

/// Inserts the body's entity, trying again while the database cannot be
/// reached (the claim stays renewed meanwhile): the body has run, so its
/// row must land before anything is handed back.
///
/// The claim is completed in the transaction that inserts the row: one
/// commit for both, and no moment where the row is stored and the claim
/// still in progress. The body's journal writes land first, as they do
/// before the engine completes a claim. A claim found taken over meanwhile
/// is not completed, and the row is committed all the same: the token's
/// UNIQUE constraint decides which row stands, and the engine's own
/// completion then finds the lease lost, as it would have.
async fn save<DB, T>(
    pool: &Pool<DB>,
    claims: &Claims<SqlStore<DB>>,
    entity: &T,
    prepared: &Prepared,
) -> Result<T, Error>
where
    DB: EntityDatabase,
    T: TokenEntity + EntityBind<DB> + for<'r> FromRow<'r, DB::Row> + Send + Unpin,
{
    steps::flush_journal().await;
    let claim = steps::running_claim();
    let messages = steps::held_messages();
    let mut pause = Duration::from_millis(20);
    loop {
        match insert_completing(pool, claims, claim.as_ref(), entity, &messages).await {
            Ok(Some(row)) => return Ok(row),
            // A row holds the token: written by code that did not claim, or
            // by this very insert whose answer was lost.
            Ok(None) => {
                let winner = DB::find_entity(pool, &prepared.key).await?;
                return prepared.lost_race(winner);
            }
            Err(err) if is_transient(&err) => {
                tracing::warn!(error = %err, "inserting the entity failed; trying again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            Err(err) => {
                tracing::error!(
                    error = %err,
                    "the entity cannot be inserted; the operation ran, and a retry runs it again"
                );
                return Err(err);
            }
        }
    }
}

/// Inserts the entity and, when it stored a row, completes `claim` in the
/// same transaction; notes the completion in `claims` once committed.
///
/// The insert comes first: while it waits (for a lock on the table, say),
/// the claim's record is not locked, so the lease goes on being renewed.
async fn insert_completing<DB, T>(
    pool: &Pool<DB>,
    claims: &Claims<SqlStore<DB>>,
    claim: Option<&Claim>,
    entity: &T,
    messages: &[Box<dyn std::any::Any + Send + Sync>],
) -> Result<Option<T>, Error>
where
    DB: EntityDatabase,
    T: TokenEntity + EntityBind<DB> + for<'r> FromRow<'r, DB::Row> + Send + Unpin,
{
    // This process's writes to the database queue here first (SQLite).
    let _turn = claims.store.gate.enter().await;
    // Closed rather than pooled if this call is dropped before its
    // transaction ends (see `TxConn`).
    let mut conn = TxConn::acquire(pool).await?;
    let mut tx = conn.begin(Some(DB::BEGIN_WRITE)).await?;
    let Some(row) = DB::insert_entity(&mut *tx, entity).await? else {
        // The engine completes the claim once the row holding the token
        // is read.
        if tx.rollback().await.is_ok() {
            conn.ended();
        }
        return Ok(None);
    };
    // The body's outbox messages, with the row: committed exactly when it is.
    for message in messages {
        let Some(message) = message.downcast_ref::<crate::outbox::Held<DB>>() else {
            return Err(Error::Config(
                "a message was enqueued on an outbox of another kind of database than the \
                 entity's: enqueue on an outbox of the entity's database"
                    .to_owned(),
            ));
        };
        message.write(&mut *tx).await?;
    }
    let completed = match claim {
        Some(claim) => match claims
            .store
            .complete_on(&mut *tx, claim, &Marker::outcome())
            .await
        {
            Ok(()) => {
                claims.completing(claim);
                Some(claim)
            }
            // Taken over: the row is committed all the same.
            Err(Error::LeaseLost) => None,
            Err(err) => return Err(err),
        },
        None => None,
    };
    if let Err(err) = tx.commit().await {
        claims.not_completing();
        return Err(err.into());
    }
    conn.ended();
    if let Some(claim) = completed {
        claims.completed(claim);
    }
    Ok(Some(row))
}

/// Whether a store error may pass by itself: the connection, not the
/// statement, failed (lost, killed, refused, timed out), or the database
/// asked for the statement to be tried again (deadlock, serialization).
fn is_transient(err: &Error) -> bool {
    let Error::Store(source) = err else {
        return false;
    };
    let Some(err) = source.downcast_ref::<sqlx::Error>() else {
        return false;
    };
    match err {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => {
            #[cfg(feature = "mysql")]
            if let Some(mysql) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
                // Deadlock, lock wait timeout, connection killed, server
                // gone; and, under MariaDB's snapshot isolation, a record
                // changed since the transaction's read (the claim renewed
                // between the row read back and the claim's completion).
                return matches!(mysql.number(), 1213 | 1205 | 1927 | 2006 | 2013 | 1020);
            }
            // PostgreSQL: connection exceptions, operator intervention
            // (a terminated backend), serialization failure, deadlock.
            // SQLite: SQLITE_BUSY and its extended codes.
            db.code().is_some_and(|code| {
                code.starts_with("08")
                    || code.starts_with("57P")
                    || matches!(&*code, "40001" | "40P01" | "5" | "261" | "517")
            })
        }
        _ => false,
    }
}

/// The row whose token is `token`, if any.
pub async fn find<DB, T>(pool: &Pool<DB>, token: &Key) -> Result<Option<T>, Error>
where
    DB: EntityDatabase,
    T: TokenEntity + for<'r> FromRow<'r, DB::Row> + Send + Unpin,
{
    DB::find_entity(pool, token).await
}

/// Inserts `entity`, or updates the row it collides with on the UNIQUE
/// `conflict` columns, in one statement; answers the row as stored. See
/// the [module documentation](self#upserts).
///
/// The conflict columns must be among the entity's
/// [`COLUMNS`](Entity::COLUMNS) and carry a UNIQUE constraint (or be the
/// primary key) together; every other column is overwritten.
pub async fn upsert<DB, T>(pool: &Pool<DB>, entity: &T, conflict: &[&str]) -> Result<T, Error>
where
    DB: EntityDatabase,
    T: EntityBind<DB> + for<'r> FromRow<'r, DB::Row> + Send + Unpin,
{
    DB::upsert_entity(pool, entity, conflict).await
}

/// An entity-mode call whose key and fingerprint are valid.
pub(crate) struct Prepared {
    pub(crate) scope: Scope,
    pub(crate) key: Key,
    pub(crate) fingerprint: Fingerprint,
    started: Instant,
}

impl Prepared {
    pub(crate) fn new(call: &Call) -> Result<Self, Error> {
        let scope = call.scope().clone();
        if let Some(principal) = scope.principal() {
            return Err(Error::Config(format!(
                "entity mode finds rows by their token alone, so the principal {principal:?} \
                 of scope {:?} would not separate them: put the principal into the token, \
                 or use record mode",
                scope.operation()
            )));
        }
        Ok(Prepared {
            key: call.key()?,
            fingerprint: call.fingerprint()?,
            scope,
            started: Instant::now(),
        })
    }

    /// The claim's call: per table and token, whatever the operation, so
    /// that two operations writing one table exclude each other as the
    /// token's UNIQUE constraint does. Every payload claims alike: whether
    /// a reused token is refused is the row's request hash to say.
    ///
    /// The body's durable steps are the operation's own: their keys derive
    /// from its scope, a journal of another payload is refused, and their
    /// entries are kept for the policy's ttl, not the claim's.
    fn claim<T: Entity>(&self, policy: Policy) -> Call {
        Call::from_parts(
            crate::admin::entity_claims_scope(T::TABLE),
            Ok(self.key.clone()),
            Ok(Fingerprint::of_bytes(b"idem.entity")),
            // A completed claim is only needed until the row is visible.
            policy.ttl(policy.lease),
        )
        .with_steps_as(StepsAs {
            scope: self.scope.clone(),
            fingerprint: self.fingerprint,
            ttl: policy.ttl.max(policy.lease),
        })
    }

    pub(crate) fn span(&self) -> tracing::Span {
        tracing::info_span!("idem", scope = %self.scope, key = %self.key, mode = "entity")
    }

    /// A row found under the key: it is the answer, unless its stored
    /// fingerprint says another payload made it.
    pub(crate) fn replay<T: TokenEntity>(&self, found: T) -> Result<T, Error> {
        self.check_found(&found)?;
        tracing::debug!(decision = "replayed", "returning the stored entity");
        metrics::replayed(&self.scope, self.started);
        Ok(found)
    }

    pub(crate) fn check_found<T: TokenEntity>(&self, found: &T) -> Result<(), Error> {
        match found.token() {
            Ok(token) if token == self.key => {}
            token => {
                return Err(Error::Config(format!(
                    "the row found for the key {:?} holds the token {:?}: the `{}` column \
                     compares tokens otherwise than byte for byte (a case-insensitive \
                     collation?), so the two keys share one row",
                    self.key,
                    token.map(|t| t.to_string()),
                    T::TOKEN_COLUMN
                )))
            }
        }
        match found.request_hash()? {
            Some(stored) if stored != self.fingerprint => {
                tracing::info!(
                    decision = "key reused",
                    "the token was used with another payload"
                );
                metrics::key_reused(&self.scope);
                Err(Error::KeyReused)
            }
            _ => Ok(()),
        }
    }

    /// Checks the body's entity carries the key, and fills in its request
    /// hash.
    pub(crate) fn produced<T: TokenEntity>(&self, entity: &mut T) -> Result<(), Error> {
        match entity.token() {
            Ok(token) if token == self.key => {}
            Ok(token) => {
                return Err(Error::Config(format!(
                    "the entity's token {token:?} is not the call's key {:?}: the body must \
                     set the `{}` field to the key",
                    self.key,
                    T::TOKEN_COLUMN
                )))
            }
            Err(err) => {
                return Err(Error::Config(format!(
                    "the entity's token is not the call's key {:?} ({err}): the body must \
                     set the `{}` field to the key",
                    self.key,
                    T::TOKEN_COLUMN
                )))
            }
        }
        entity.set_request_hash(&self.fingerprint);
        Ok(())
    }

    /// The insert found the token taken by a row written without a claim:
    /// that row is the answer, under the same payload rule as a replay.
    pub(crate) fn lost_race<T: TokenEntity>(&self, winner: Option<T>) -> Result<T, Error> {
        let winner = winner.ok_or_else(|| {
            Error::store(
                "the entity was not stored, and no row holds its token: \
                 it collides with another row on a unique key other than the token",
            )
        })?;
        tracing::warn!(
            decision = "lost race",
            "the token was stored meanwhile by a writer that did not claim it; \
             returning its row"
        );
        self.check_found(&winner)?;
        Ok(winner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sql::entity::{check_conflict, check_names, is_unique_code};

    struct Payment;
    impl Entity for Payment {
        const TABLE: &'static str = "payments";
        const COLUMNS: &'static [&'static str] = &["token", "amount", "request_hash"];
    }

    struct Bad;
    impl Entity for Bad {
        const TABLE: &'static str = "payments";
        const COLUMNS: &'static [&'static str] = &["token", "amount; DROP TABLE x"];
    }

    #[test]
    fn names_and_conflict_columns() {
        check_names::<Payment>().unwrap();
        let err = check_names::<Bad>().unwrap_err().to_string();
        assert!(err.contains("invalid column name"), "{err}");
        check_conflict::<Payment>(&["token"]).unwrap();
        check_conflict::<Payment>(&["token", "amount"]).unwrap();
        for bad in [&[][..], &["user_id"], &["token", "token"]] {
            assert!(check_conflict::<Payment>(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn unique_codes() {
        assert!(is_unique_code(Some("23505")));
        assert!(is_unique_code(Some("2067")));
        assert!(is_unique_code(Some("1555")));
        // Foreign key, not null, the generic integrity class.
        for other in ["23503", "787", "1299", "23000"] {
            assert!(!is_unique_code(Some(other)), "{other}");
        }
        assert!(!is_unique_code(None));
        assert!(!is_unique_violation(&sqlx::Error::RowNotFound));
    }

    #[test]
    fn request_hash_forms() {
        let f = Fingerprint::of_bytes(b"payload");
        assert_eq!(
            String::from_fingerprint(&f).to_fingerprint().unwrap(),
            Some(f)
        );
        assert_eq!(
            Vec::<u8>::from_fingerprint(&f).to_fingerprint().unwrap(),
            Some(f)
        );
        assert_eq!(None::<String>.to_fingerprint().unwrap(), None);
        assert!("zz".to_owned().to_fingerprint().is_err());
        assert!(vec![1u8, 2].to_fingerprint().is_err());
    }

    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn sqlite_duplicates_are_unique_violations() {
        let pool = sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap();
        sqlx::query(
            "CREATE TABLE t (id INTEGER PRIMARY KEY, token TEXT UNIQUE, n INTEGER NOT NULL)",
        )
        .execute(&pool)
        .await
        .unwrap();
        sqlx::query("INSERT INTO t (id, token, n) VALUES (1, 'a', 0)")
            .execute(&pool)
            .await
            .unwrap();
        let unique = sqlx::query("INSERT INTO t (id, token, n) VALUES (2, 'a', 0)")
            .execute(&pool)
            .await
            .unwrap_err();
        assert!(is_unique_violation(&unique), "{unique}");
        let primary = sqlx::query("INSERT INTO t (id, token, n) VALUES (1, 'b', 0)")
            .execute(&pool)
            .await
            .unwrap_err();
        assert!(is_unique_violation(&primary), "{primary}");
        let not_null = sqlx::query("INSERT INTO t (id, token, n) VALUES (3, 'c', NULL)")
            .execute(&pool)
            .await
            .unwrap_err();
        assert!(!is_unique_violation(&not_null), "{not_null}");
    }
}
