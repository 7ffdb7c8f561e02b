//! Entity mode's model: the traits a business row implements
//! (`#[derive(idem::Entity)]` writes them), the databases it runs on, the
//! checks on its names, and the trait by which each backend builds its
//! statements ([`EntitySql`], in `<backend>/entity.rs`). The flow
//! that runs them is [`crate::entity`]'s.

use std::collections::HashSet;
use std::future::Future;
use std::sync::{Arc, OnceLock};

use sqlx::error::BoxDynError;
use sqlx::{Database, FromRow, Pool};

use super::exec::Value;
use super::flow::validate_table_name;
use super::{Backend, SqlStore};
use idem_core::error::Error;
use idem_core::fingerprint::Fingerprint;

use idem_core::key::{Key, KeyError};

/// Entity mode's statements on a backend: built for each entity, whose
/// table and column names are known only at run time, by the backend
/// (`<backend>/entity.rs`), with its quotes and placeholders. The names
/// are checked first ([`check_names`], [`check_conflict`]). Sealed, as
/// [`Backend`] is.
pub trait EntitySql {
    /// The rows whose `columns` hold the values bound, in order:
    /// `SELECT * FROM <table> WHERE <c1> = <p1> AND ...`.
    fn select_where(table: &str, columns: &[&str]) -> String;

    /// Inserts a row of `columns`, bound in order. Where the backend
    /// answers inserted rows (SQLite, PostgreSQL), the row as stored, or
    /// nothing when a row holds its `token` already; elsewhere (MySQL) a
    /// plain insert, whose duplicate token the flow catches.
    fn insert(table: &str, columns: &[&str], token: &str) -> String;

    /// Inserts a row of `columns`, bound in order, or updates the row it
    /// conflicts with on `conflict` to the values of the
    /// [`updated_columns`]. Where the backend answers written rows
    /// (SQLite, PostgreSQL), the row as stored; elsewhere (MySQL) the flow
    /// reads it back with [`select_where`](Self::select_where).
    fn upsert(table: &str, columns: &[&str], conflict: &[&str]) -> String;
}

/// The columns an upsert on `conflict` updates: those of `columns` not in
/// `conflict`; with no other column, the first conflict column, set to
/// itself, so that the written row is still answered.
pub(crate) fn updated_columns<'a>(columns: &[&'a str], conflict: &[&'a str]) -> Vec<&'a str> {
    let mut updated: Vec<&str> = columns
        .iter()
        .copied()
        .filter(|c| !conflict.contains(c))
        .collect();
    if updated.is_empty() {
        updated.push(conflict[0]);
    }
    updated
}

/// `names`, each written by `write` with its number (from 1), joined by
/// `separator`: the lists of entity mode's statements.
pub(crate) fn listed(
    names: &[&str],
    separator: &str,
    write: impl Fn(usize, &str) -> String,
) -> String {
    let written: Vec<String> = names
        .iter()
        .enumerate()
        .map(|(i, name)| write(i + 1, name))
        .collect();
    written.join(separator)
}

/// A business table, as `#[derive(idem::Entity)]` describes it.
///
/// ```
/// use idem::{Entity, TokenEntity};
///
/// #[derive(Entity, sqlx::FromRow)]
/// #[idem(table = "payments")]
/// struct Payment {
///     #[idem(token)]
///     idempotency_token: String,
///     amount_cents: i64,
///     status: String,
/// }
///
/// assert_eq!(<Payment as Entity>::TABLE, "payments");
/// assert_eq!(
///     <Payment as Entity>::COLUMNS,
///     ["idempotency_token", "amount_cents", "status"]
/// );
/// assert_eq!(<Payment as TokenEntity>::TOKEN_COLUMN, "idempotency_token");
/// // Entity mode: #[idempotent(key = cmd.key, store = self.pool, entity)]
/// // returns the row whose token is the key, or runs once and inserts it.
/// ```
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

/// The databases entity mode and upserts run on: `Sqlite`, `Postgres` and
/// `MySql`, each with its backend's feature.
pub trait EntityDatabase: Backend + EntitySql {
    /// The records store holding entity mode's claims, in the pool's
    /// database (table `idem_entity_claims`, created on first use). Made
    /// per call, it keeps no connection warm.
    #[doc(hidden)]
    fn claims(pool: &Pool<Self>) -> impl Future<Output = Result<SqlStore<Self>, Error>> {
        async move {
            let mut store = SqlStore::<Self>::new(pool.clone()).with_table_name(CLAIMS_TABLE)?;
            // Made for one call: connections kept for its next statements
            // would only be held away from the pool.
            store.warm = Arc::new(super::warm::Warm::off(pool.clone()));
            let database = format!("{} {:?}", <Self as Database>::NAME, pool.connect_options());
            migrate_once(database, store.migrate()).await?;
            Ok(store)
        }
    }

    /// Inserts the entity on `conn` and answers the row as stored, or
    /// `None` when a row holds its token already, with the backend's
    /// [`insert`](EntitySql::insert), which answers both (SQLite,
    /// PostgreSQL).
    #[doc(hidden)]
    fn insert_entity<'c, T>(
        conn: &'c mut Self::Connection,
        entity: &'c T,
    ) -> impl Future<Output = Result<Option<T>, Error>> + 'c
    where
        T: TokenEntity + EntityBind<Self> + for<'r> FromRow<'r, Self::Row> + Send + Unpin,
    {
        async move {
            let insert = Self::insert(T::TABLE, T::COLUMNS, T::TOKEN_COLUMN);
            let args = arguments::<Self, T>(entity, T::COLUMNS)?;
            let row = Self::fetch_row_with(conn, &insert, args).await?;
            Ok(row.map(|row| T::from_row(&row)).transpose()?)
        }
    }

    /// Inserts the entity, or updates the row it conflicts with on
    /// `conflict`, and answers the row as stored, with the backend's
    /// [`upsert`](EntitySql::upsert), which answers it (SQLite,
    /// PostgreSQL).
    #[doc(hidden)]
    fn upsert_entity<T>(
        pool: &Pool<Self>,
        entity: &T,
        conflict: &[&str],
    ) -> impl Future<Output = Result<T, Error>>
    where
        T: EntityBind<Self> + for<'r> FromRow<'r, Self::Row> + Send + Unpin,
    {
        async move {
            check_conflict::<T>(conflict)?;
            let upsert = Self::upsert(T::TABLE, T::COLUMNS, conflict);
            let mut conn = pool.acquire().await?;
            let args = arguments::<Self, T>(entity, T::COLUMNS)?;
            let row = Self::fetch_row_with(&mut conn, &upsert, args).await?;
            Ok(T::from_row(&row.ok_or(sqlx::Error::RowNotFound)?)?)
        }
    }
}

/// The name of the table holding entity mode's claims.
pub(crate) const CLAIMS_TABLE: &str = crate::admin::ENTITY_CLAIMS_TABLE;

/// The row whose token is `token`, if any.
pub async fn find<DB, T>(pool: &Pool<DB>, token: &Key) -> Result<Option<T>, Error>
where
    DB: EntityDatabase,
    T: TokenEntity + for<'r> FromRow<'r, DB::Row> + Send + Unpin,
{
    let mut conn = pool.acquire().await?;
    find_on::<DB, T>(&mut conn, token).await
}

/// The row whose token is `token`, if any, read on `conn`.
pub(crate) async fn find_on<DB, T>(
    conn: &mut DB::Connection,
    token: &Key,
) -> Result<Option<T>, Error>
where
    DB: EntityDatabase,
    T: TokenEntity + for<'r> FromRow<'r, DB::Row> + Send + Unpin,
{
    check_token_names::<T>()?;
    let find = DB::select_where(T::TABLE, &[T::TOKEN_COLUMN]);
    let row = DB::fetch_row(conn, &find, vec![Value::Text(token.as_str())]).await?;
    Ok(row.map(|row| T::from_row(&row)).transpose()?)
}

/// Runs `migrate` once per database in this process, keyed by `database`
/// (the backend and its connect options). First calls wait for each other
/// rather than migrate at once.
pub(crate) async fn migrate_once<F>(database: String, migrate: F) -> Result<(), Error>
where
    F: Future<Output = Result<(), Error>>,
{
    static MIGRATED: OnceLock<tokio::sync::Mutex<HashSet<String>>> = OnceLock::new();
    let mut migrated = MIGRATED.get_or_init(Default::default).lock().await;
    if !migrated.contains(&database) {
        migrate.await?;
        migrated.insert(database);
    }
    Ok(())
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
pub(crate) fn is_unique_code(code: Option<&str>) -> bool {
    matches!(code, Some("23505" | "2067" | "1555"))
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
