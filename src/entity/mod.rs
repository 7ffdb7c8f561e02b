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

use sqlx::{FromRow, Pool};

use crate::engine::within::run_within;
use crate::engine::Call;
pub use crate::store::sql::entity::{
    find, is_unique_violation, Entity, EntityBind, EntityDatabase, RequestHash, TokenEntity,
};
use crate::store::sql::entity_rows::EntityRows;
use idem_core::error::Error;
/// The sqlx this crate is built with: the version whose types an entity's
/// code and the SQL stores' pools are of, which `#[derive(Entity)]`'s code
/// names.
pub use sqlx;

/// Entity mode: returns the row whose token is the call's key, or runs
/// `body` once per token and saves the entity it produces. See the
/// [module documentation](self).
///
/// The flow is the engine's own: this mode gives it
/// the rows of `T` in `pool`'s database, whose insert completes the call's
/// claim in the same transaction.
pub async fn run<DB, T, E, Fut>(pool: &Pool<DB>, call: Call, body: Fut) -> Result<T, E>
where
    DB: EntityDatabase,
    T: TokenEntity + EntityBind<DB> + for<'r> FromRow<'r, DB::Row> + Send + Unpin,
    E: From<Error>,
    Fut: Future<Output = Result<T, E>>,
{
    let rows = EntityRows::<DB, T>::new(pool)?;
    run_within(call, &rows, body).await
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sql::entity::{check_conflict, check_names, is_unique_code};
    use idem_core::fingerprint::Fingerprint;

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
