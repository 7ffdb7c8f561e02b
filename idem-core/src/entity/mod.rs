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
//! that produces the entity:
//!
//! 1. **find by token**: a row whose token is the key is returned as it is
//!    stored; the body does not run;
//! 2. otherwise the call takes a **per-token lock**, looks again, and only
//!    then runs the body; concurrent first calls with one token wait (up to
//!    the policy's bound, then [`Error::InProgress`]; or fail at once under
//!    `fail_fast`) and then find the row, so the body runs once;
//! 3. the body's entity must carry the key as its token (otherwise
//!    [`Error::Config`]); it is **inserted**, and the row as stored (with
//!    the columns the database filled in) is returned. Should the insert
//!    find the token taken by a row written by code that did not take the
//!    lock, that row is read and returned (or refused, as a replay would
//!    be): the UNIQUE constraint stays the last line of defense;
//! 4. a body error is returned as it is and nothing is stored, so a retry
//!    runs the body again.
//!
//! | backend | per-token lock | save |
//! |---|---|---|
//! | PostgreSQL | `pg_try_advisory_xact_lock(<hash of table and token>)` in a `READ COMMITTED` transaction; the body runs inside it, the commit releases the lock | `INSERT ... ON CONFLICT (token) DO NOTHING RETURNING *`, in that transaction |
//! | MySQL/MariaDB | `GET_LOCK('idem-entity:<hash of database, table, token>', 0)` on one pooled connection, `RELEASE_LOCK` on every way out | `INSERT`, then `SELECT` by token; on a duplicate-key error (1062), the row holding the token |
//! | SQLite | `BEGIN IMMEDIATE`: SQLite has one writer, so **first executions are serialized database-wide**, not per token | `INSERT ... ON CONFLICT (token) DO NOTHING RETURNING *`, in that transaction |
//!
//! Waiting callers poll (every 1 to 25 ms) rather than block in the
//! database, so they give their connection back to the pool between looks.
//! The call that holds the lock holds one pooled connection while its body
//! runs: a body that takes another connection from the same pool needs a
//! pool larger than the number of first calls running at once, and on
//! SQLite a body must not write to the same database through another
//! connection (it would wait for the very lock its call holds).
//!
//! A call dropped while it holds the lock (a client went away, a timeout
//! fired) rolls back, and its connection is closed rather than returned to
//! the pool, so no pooled connection ever keeps a lock or a transaction.
//! The body's own side effects are not undone: to make a body always run to
//! completion, call the operation from a task of its own.
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
//! The policy's `ttl` and `lease` do not apply: the row lives as long as
//! the table keeps it, and the lock lives as long as the call.
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
use std::time::{Duration, Instant};

#[cfg(feature = "postgres")]
use sha2::{Digest, Sha256};
use sqlx::error::BoxDynError;
use sqlx::pool::PoolConnection;
use sqlx::{Database, FromRow, Pool};

use crate::metrics;
use crate::store::sql::validate_table_name;
use crate::{Call, Error, Fingerprint, Key, KeyError, Policy, Scope};

#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

/// The sqlx version this crate is built with, for the derive's generated
/// code.
#[doc(hidden)]
pub use sqlx;

/// The longest pause between two looks at a token another call holds.
const MAX_POLL: Duration = Duration::from_millis(25);
const FIRST_POLL: Duration = Duration::from_millis(1);
/// The `Retry-After` hint given with [`Error::InProgress`].
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// A business table, as `#[derive(idem::Entity)]` describes it.
pub trait Entity: Sized {
    /// The table's name.
    const TABLE: &'static str;
    /// The columns an insert writes, in order: every field except those the
    /// database fills in (`#[idem(generated)]`).
    const COLUMNS: &'static [&'static str];
}

/// An [`Entity`] whose table has a UNIQUE idempotency token column: what
/// entity mode needs.
#[diagnostic::on_unimplemented(
    message = "`{Self}` has no idempotency token column",
    label = "entity mode needs a token column",
    note = "derive `idem::Entity` and mark the token field with `#[idem(token)]`"
)]
pub trait TokenEntity: Entity {
    /// The column holding the token (UNIQUE in the table).
    const TOKEN_COLUMN: &'static str;
    /// The column holding the payload's fingerprint, if the table has one.
    const REQUEST_HASH_COLUMN: Option<&'static str>;

    /// The token this entity carries.
    fn token(&self) -> Result<Key, KeyError>;

    /// The payload fingerprint stored with this entity: `Ok(None)` when the
    /// table has no request-hash column or the value is `NULL`.
    fn request_hash(&self) -> Result<Option<Fingerprint>, Error>;

    /// Stores `fingerprint` in the request-hash field, if there is one.
    fn set_request_hash(&mut self, fingerprint: &Fingerprint);
}

/// How an [`Entity`]'s fields are bound as parameters for database `DB`.
///
/// The derive implements it for every `DB` whose driver can encode all the
/// fields' types.
pub trait EntityBind<DB: Database>: Entity {
    /// Adds the value of `column` (one of [`Entity::COLUMNS`]) to
    /// `arguments`.
    fn bind_column<'q>(
        &'q self,
        column: &str,
        arguments: &mut <DB as Database>::Arguments<'q>,
    ) -> Result<(), BoxDynError>;
}

/// The types a request-hash field may have: `String` (64 lowercase hex
/// digits), `Vec<u8>` (the 32 digest bytes), or an `Option` of either.
pub trait RequestHash {
    /// The value that stores `fingerprint`.
    fn from_fingerprint(fingerprint: &Fingerprint) -> Self;
    /// The fingerprint this value holds; `Ok(None)` for `None`.
    fn to_fingerprint(&self) -> Result<Option<Fingerprint>, Error>;
}

impl RequestHash for String {
    fn from_fingerprint(fingerprint: &Fingerprint) -> Self {
        fingerprint.to_hex()
    }

    fn to_fingerprint(&self) -> Result<Option<Fingerprint>, Error> {
        Fingerprint::from_hex(self)
            .map(Some)
            .ok_or_else(|| Error::store("the stored request hash is not 64 hex digits"))
    }
}

impl RequestHash for Vec<u8> {
    fn from_fingerprint(fingerprint: &Fingerprint) -> Self {
        fingerprint.as_bytes().to_vec()
    }

    fn to_fingerprint(&self) -> Result<Option<Fingerprint>, Error> {
        <[u8; 32]>::try_from(self.as_slice())
            .map(|digest| Some(Fingerprint::from_digest(digest)))
            .map_err(|_| Error::store("the stored request hash is not 32 bytes"))
    }
}

impl<T: RequestHash> RequestHash for Option<T> {
    fn from_fingerprint(fingerprint: &Fingerprint) -> Self {
        Some(T::from_fingerprint(fingerprint))
    }

    fn to_fingerprint(&self) -> Result<Option<Fingerprint>, Error> {
        match self {
            Some(value) => value.to_fingerprint(),
            None => Ok(None),
        }
    }
}

mod sealed {
    pub trait Sealed {}
}

/// The databases entity mode and upserts run on: `Sqlite`, `Postgres` and
/// `MySql`, each with its backend's feature.
pub trait EntityDatabase: Database + sealed::Sealed {
    #[doc(hidden)]
    fn run_entity<T, E, Fut>(
        pool: &Pool<Self>,
        call: Call,
        body: Fut,
    ) -> impl Future<Output = Result<T, E>>
    where
        T: TokenEntity + EntityBind<Self> + for<'r> FromRow<'r, Self::Row> + Send + Unpin,
        E: From<Error>,
        Fut: Future<Output = Result<T, E>>;

    #[doc(hidden)]
    fn find_entity<T>(
        pool: &Pool<Self>,
        token: &Key,
    ) -> impl Future<Output = Result<Option<T>, Error>>
    where
        T: TokenEntity + for<'r> FromRow<'r, Self::Row> + Send + Unpin;

    #[doc(hidden)]
    fn upsert_entity<T>(
        pool: &Pool<Self>,
        entity: &T,
        conflict: &[&str],
    ) -> impl Future<Output = Result<T, Error>>
    where
        T: EntityBind<Self> + for<'r> FromRow<'r, Self::Row> + Send + Unpin;
}

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
    DB::run_entity(pool, call, body).await
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

/// Whether `err` is a unique-constraint violation: SQLSTATE `23505` on
/// PostgreSQL, extended result code 2067 (`SQLITE_CONSTRAINT_UNIQUE`) or
/// 1555 (`SQLITE_CONSTRAINT_PRIMARYKEY`) on SQLite, error 1062
/// (`ER_DUP_ENTRY`) on MySQL/MariaDB.
pub fn is_unique_violation(err: &sqlx::Error) -> bool {
    let Some(db) = err.as_database_error() else {
        return false;
    };
    #[cfg(feature = "mysql")]
    if let Some(mysql) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        return mysql.number() == 1062;
    }
    is_unique_code(db.code().as_deref())
}

/// The codes of [`is_unique_violation`] other than MySQL's, whose
/// `code()` is the generic SQLSTATE `23000`.
fn is_unique_code(code: Option<&str>) -> bool {
    matches!(code, Some("23505" | "2067" | "1555"))
}

/// How a backend writes names and parameters.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Dialect {
    #[cfg(feature = "sqlite")]
    Sqlite,
    #[cfg(feature = "postgres")]
    Postgres,
    #[cfg(feature = "mysql")]
    MySql,
}

impl Dialect {
    /// `name` quoted as an identifier.
    pub(crate) fn quote(self, name: &str) -> String {
        match self {
            #[cfg(feature = "mysql")]
            Dialect::MySql => format!("`{name}`"),
            #[allow(unreachable_patterns)]
            _ => format!("\"{name}\""),
        }
    }

    /// The `n`th parameter (from 1).
    pub(crate) fn param(self, n: usize) -> String {
        match self {
            #[cfg(feature = "sqlite")]
            Dialect::Sqlite => format!("?{n}"),
            #[cfg(feature = "postgres")]
            Dialect::Postgres => format!("${n}"),
            #[cfg(feature = "mysql")]
            Dialect::MySql => {
                let _ = n;
                "?".to_owned()
            }
        }
    }

    /// `SELECT * FROM <table> WHERE <c1> = <p1> AND ...`.
    pub(crate) fn select_where(self, table: &str, columns: &[&str]) -> String {
        let conditions: Vec<String> = columns
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{} = {}", self.quote(c), self.param(i + 1)))
            .collect();
        format!(
            "SELECT * FROM {} WHERE {}",
            self.quote(table),
            conditions.join(" AND ")
        )
    }

    /// `INSERT INTO <table> (<columns>) VALUES (<params>)`.
    pub(crate) fn insert(self, table: &str, columns: &[&str]) -> String {
        let names: Vec<String> = columns.iter().map(|c| self.quote(c)).collect();
        let params: Vec<String> = (1..=columns.len()).map(|n| self.param(n)).collect();
        format!(
            "INSERT INTO {} ({}) VALUES ({})",
            self.quote(table),
            names.join(", "),
            params.join(", ")
        )
    }

    /// `ON CONFLICT (<keys>) DO UPDATE SET <c> = excluded.<c>, ...` over the
    /// columns other than the keys (PostgreSQL and SQLite). With no other
    /// column, the first key is set to itself, so that `RETURNING` still
    /// answers the row.
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    pub(crate) fn on_conflict_update(self, keys: &[&str], columns: &[&str]) -> String {
        let quoted: Vec<String> = keys.iter().map(|k| self.quote(k)).collect();
        let mut updated: Vec<&str> = columns
            .iter()
            .copied()
            .filter(|c| !keys.contains(c))
            .collect();
        if updated.is_empty() {
            updated.push(keys[0]);
        }
        let set: Vec<String> = updated
            .iter()
            .map(|c| format!("{0} = excluded.{0}", self.quote(c)))
            .collect();
        format!(
            "ON CONFLICT ({}) DO UPDATE SET {}",
            quoted.join(", "),
            set.join(", ")
        )
    }
}

/// Checks the names of `T`'s table and columns (they are formatted into
/// SQL): valid identifiers, at least one column, none twice.
pub(crate) fn check_names<T: Entity>() -> Result<(), Error> {
    validate_table_name(T::TABLE)?;
    if T::COLUMNS.is_empty() {
        return Err(Error::Config(format!(
            "the entity of table {:?} has no column to write",
            T::TABLE
        )));
    }
    for (i, column) in T::COLUMNS.iter().enumerate() {
        check_column(column)?;
        if T::COLUMNS[..i].contains(column) {
            return Err(Error::Config(format!(
                "the column {column:?} of table {:?} is listed twice",
                T::TABLE
            )));
        }
    }
    Ok(())
}

/// Checks a column name with the table-name rule.
fn check_column(column: &str) -> Result<(), Error> {
    validate_table_name(column).map(drop).map_err(|_| {
        Error::Config(format!(
            "invalid column name {column:?}: use 1 to 63 ASCII letters, digits and \
             underscores, not starting with a digit"
        ))
    })
}

/// Checks a token entity's names, and that its token and request-hash
/// columns are among those it writes.
pub(crate) fn check_token_names<T: TokenEntity>() -> Result<(), Error> {
    check_names::<T>()?;
    let written = |column: &str, what: &str| {
        if T::COLUMNS.contains(&column) {
            Ok(())
        } else {
            Err(Error::Config(format!(
                "the {what} column {column:?} is not among the columns of table {:?}",
                T::TABLE
            )))
        }
    };
    written(T::TOKEN_COLUMN, "token")?;
    if let Some(hash) = T::REQUEST_HASH_COLUMN {
        written(hash, "request-hash")?;
    }
    Ok(())
}

/// Checks the conflict columns of an upsert: at least one, each among the
/// entity's columns, none twice.
pub(crate) fn check_conflict<T: Entity>(conflict: &[&str]) -> Result<(), Error> {
    check_names::<T>()?;
    if conflict.is_empty() {
        return Err(Error::Config(
            "an upsert needs at least one conflict column".into(),
        ));
    }
    for (i, column) in conflict.iter().enumerate() {
        if !T::COLUMNS.contains(column) {
            return Err(Error::Config(format!(
                "the conflict column {column:?} is not among the columns of table {:?} ({})",
                T::TABLE,
                T::COLUMNS.join(", ")
            )));
        }
        if conflict[..i].contains(column) {
            return Err(Error::Config(format!(
                "the conflict column {column:?} is given twice"
            )));
        }
    }
    Ok(())
}

/// `entity`'s values for `columns`, as one argument list.
pub(crate) fn arguments<'q, DB, T>(
    entity: &'q T,
    columns: &[&str],
) -> Result<<DB as Database>::Arguments<'q>, Error>
where
    DB: Database,
    T: EntityBind<DB>,
{
    let mut arguments = <DB as Database>::Arguments::<'q>::default();
    for column in columns {
        entity
            .bind_column(column, &mut arguments)
            .map_err(|err| Error::store(sqlx::Error::Encode(err)))?;
    }
    Ok(arguments)
}

/// The answer of a call that took the lock.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) enum Answer<T> {
    /// A row that was there already: nothing to commit.
    Existing(T),
    /// The row this call inserted.
    Saved(T),
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl<T> Answer<T> {
    pub(crate) fn into_inner(self) -> T {
        match self {
            Answer::Existing(row) | Answer::Saved(row) => row,
        }
    }
}

/// An entity-mode call whose key and fingerprint are valid.
pub(crate) struct Prepared {
    pub(crate) scope: Scope,
    pub(crate) key: Key,
    pub(crate) fingerprint: Fingerprint,
    policy: Policy,
    started: Instant,
}

impl Prepared {
    pub(crate) fn new(call: Call) -> Result<Self, Error> {
        let (scope, key, fingerprint, policy) = call.into_parts();
        Ok(Prepared {
            scope,
            key: key?,
            fingerprint: fingerprint?,
            policy,
            started: Instant::now(),
        })
    }

    pub(crate) fn span(&self) -> tracing::Span {
        tracing::info_span!("idem", scope = %self.scope, key = %self.key, mode = "entity")
    }

    pub(crate) fn waiting(&self) -> Wait {
        Wait {
            deadline: Instant::now() + self.policy.wait_bound(),
            step: FIRST_POLL,
            waited: false,
        }
    }

    /// A row found under the key: it is the answer, unless its stored
    /// fingerprint says another payload made it.
    pub(crate) fn replay<T: TokenEntity>(&self, found: T) -> Result<T, Error> {
        self.check_found(&found)?;
        tracing::debug!(decision = "replayed", "returning the stored entity");
        metrics::replayed(&self.scope, self.started.elapsed());
        Ok(found)
    }

    fn check_found<T: TokenEntity>(&self, found: &T) -> Result<(), Error> {
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

    /// The lock is held and no row exists: the body runs.
    pub(crate) fn executing(&self) {
        tracing::debug!(decision = "claimed", "running the operation");
        metrics::executed(&self.scope);
    }

    /// The body failed: nothing is stored.
    pub(crate) fn failed(&self) {
        tracing::debug!(
            decision = "released",
            "the operation failed; nothing was stored, a retry runs again"
        );
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

    /// The insert found the token taken by a row written without the lock:
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
            "the token was stored meanwhile by a writer that did not take the lock; \
             returning its row"
        );
        self.check_found(&winner)?;
        Ok(winner)
    }
}

/// The bounded, backed-off wait for a token another call holds.
pub(crate) struct Wait {
    deadline: Instant,
    step: Duration,
    waited: bool,
}

impl Wait {
    /// Pauses before the next look, or answers [`Error::InProgress`] once
    /// the bound has passed.
    pub(crate) async fn pause(&mut self, scope: &Scope) -> Result<(), Error> {
        let now = Instant::now();
        if now >= self.deadline {
            tracing::info!(
                decision = "in progress",
                waited = self.waited,
                "another call holds the token"
            );
            metrics::in_progress(scope);
            return Err(Error::InProgress {
                retry_after: RETRY_AFTER,
            });
        }
        if !self.waited {
            tracing::debug!(
                decision = "waiting",
                "another call holds the token; waiting for its entity"
            );
            self.waited = true;
        }
        tokio::time::sleep(self.step.min(self.deadline - now)).await;
        self.step = (self.step * 2).min(MAX_POLL);
        Ok(())
    }
}

/// A pooled connection that goes back to the pool only when [`give_back`]
/// says it holds no lock and no transaction; dropped otherwise (a call
/// dropped mid-way, an error), it is closed instead.
///
/// [`give_back`]: Held::give_back
pub(crate) struct Held<DB: Database> {
    conn: Option<PoolConnection<DB>>,
}

impl<DB: Database> Held<DB> {
    pub(crate) async fn acquire(pool: &Pool<DB>) -> Result<Self, Error> {
        Ok(Held {
            conn: Some(pool.acquire().await?),
        })
    }

    pub(crate) fn conn(&mut self) -> &mut DB::Connection {
        self.conn
            .as_mut()
            .expect("the connection is only taken by give_back")
    }

    /// Returns the connection to the pool: it holds no lock and no
    /// transaction.
    pub(crate) fn give_back(mut self) {
        drop(self.conn.take());
    }
}

impl<DB: Database> Drop for Held<DB> {
    fn drop(&mut self) {
        if let Some(mut conn) = self.conn.take() {
            conn.close_on_drop();
        }
    }
}

/// A digest of the table and the token, for the per-token lock's key.
#[cfg(feature = "postgres")]
pub(crate) fn lock_digest(table: &str, token: &Key) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(b"idem-entity\0");
    hasher.update(table.as_bytes());
    hasher.update(b"\0");
    hasher.update(token.as_str().as_bytes());
    hasher.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[cfg(feature = "postgres")]
    #[test]
    fn lock_digests_separate_tables_and_tokens() {
        let k = Key::new("k").unwrap();
        let a = lock_digest("payments", &k);
        assert_eq!(a, lock_digest("payments", &k));
        assert_ne!(a, lock_digest("refunds", &k));
        assert_ne!(a, lock_digest("payments", &Key::new("k2").unwrap()));
        // The separator keeps ("ab", "c") and ("a", "bc") apart.
        assert_ne!(
            lock_digest("ab", &Key::new("c").unwrap()),
            lock_digest("a", &Key::new("bc").unwrap())
        );
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
