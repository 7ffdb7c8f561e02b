//! Running a statement and reading its row on any of the SQL backends.
//!
//! sqlx asks a generic caller to spell out, at every use, that the
//! backend's connection executes statements and that strings, bytes and
//! integers encode and decode. [`Exec`] says it once: it is implemented
//! for every sqlx database that can, and the skeleton in
//! [`records`](super::records) needs nothing more than `DB: Exec`.
#![allow(unreachable_pub)] // named by the sealed `Dialect`, so `pub`; unnameable outside

use std::future::Future;

use sqlx::query::Query;
use sqlx::{Column, ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Row, Type};

/// A value bound to a statement's placeholder.
#[derive(Clone, Copy, Debug)]
pub enum Value<'a> {
    Text(&'a str),
    Bytes(&'a [u8]),
    /// A `NULL` in a bytes column.
    NullBytes,
    Int(i64),
    Small(i16),
}

/// Statements and row reads for a sqlx database whose connection executes
/// statements with bound strings, bytes and integers.
pub trait Exec: Database {
    /// `sql` with `values` bound in order.
    #[doc(hidden)]
    fn query<'a>(sql: &'a str, values: Vec<Value<'a>>) -> Query<'a, Self, Self::Arguments<'a>>;

    /// Runs `sql` with `values` bound in order.
    #[doc(hidden)]
    fn execute<'a>(
        conn: &'a mut Self::Connection,
        sql: &'a str,
        values: Vec<Value<'a>>,
    ) -> impl Future<Output = Result<Self::QueryResult, sqlx::Error>> + Send + 'a;

    /// Runs `sql`, which may hold several statements, unprepared (DDL).
    #[doc(hidden)]
    fn execute_script<'a>(
        conn: &'a mut Self::Connection,
        sql: &'a str,
    ) -> impl Future<Output = Result<Self::QueryResult, sqlx::Error>> + Send + 'a;

    /// Runs `sql` and reads the integer in the first column of its row, if
    /// there is one.
    #[doc(hidden)]
    fn fetch_int<'a>(
        conn: &'a mut Self::Connection,
        sql: &'a str,
        values: Vec<Value<'a>>,
    ) -> impl Future<Output = Result<Option<i64>, sqlx::Error>> + Send + 'a;

    /// Runs `sql` and returns its row, if there is one.
    #[doc(hidden)]
    fn fetch_row<'a>(
        conn: &'a mut Self::Connection,
        sql: &'a str,
        values: Vec<Value<'a>>,
    ) -> impl Future<Output = Result<Option<Self::Row>, sqlx::Error>> + Send + 'a;

    /// Runs `sql` and returns its rows.
    #[doc(hidden)]
    fn fetch_all<'a>(
        conn: &'a mut Self::Connection,
        sql: &'a str,
        values: Vec<Value<'a>>,
    ) -> impl Future<Output = Result<Vec<Self::Row>, sqlx::Error>> + Send + 'a;

    /// Runs `sql` with `arguments` and returns its row, if there is one.
    #[doc(hidden)]
    fn fetch_row_with<'a>(
        conn: &'a mut Self::Connection,
        sql: &'a str,
        arguments: Self::Arguments<'a>,
    ) -> impl Future<Output = Result<Option<Self::Row>, sqlx::Error>> + Send + 'a;

    /// The text of a column.
    #[doc(hidden)]
    fn text(row: &Self::Row, column: &str) -> Result<String, sqlx::Error>;
    /// The bytes of a column, possibly NULL.
    #[doc(hidden)]
    fn bytes(row: &Self::Row, column: &str) -> Result<Option<Vec<u8>>, sqlx::Error>;
    /// The integer of a column, possibly NULL.
    #[doc(hidden)]
    fn int(row: &Self::Row, column: &str) -> Result<Option<i64>, sqlx::Error>;
    /// The small integer of a column, possibly NULL.
    #[doc(hidden)]
    fn small(row: &Self::Row, column: &str) -> Result<Option<i16>, sqlx::Error>;
}

impl<DB> Exec for DB
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> &'q [u8]: Encode<'q, DB> + Type<DB>,
    for<'q> Option<&'q [u8]>: Encode<'q, DB>,
    for<'q> i64: Encode<'q, DB>,
    for<'q> i16: Encode<'q, DB>,
    i64: Type<DB>,
    i16: Type<DB>,
    for<'r> String: Decode<'r, DB> + Type<DB>,
    for<'r> Vec<u8>: Decode<'r, DB> + Type<DB>,
    for<'r> i64: Decode<'r, DB>,
    for<'r> i16: Decode<'r, DB>,
    for<'s> &'s str: ColumnIndex<DB::Row>,
    usize: ColumnIndex<DB::Row>,
{
    fn query<'a>(sql: &'a str, values: Vec<Value<'a>>) -> Query<'a, Self, Self::Arguments<'a>> {
        let mut query = sqlx::query(sql);
        for value in values {
            query = match value {
                Value::Text(v) => query.bind(v),
                Value::Bytes(v) => query.bind(v),
                Value::NullBytes => query.bind(None::<&[u8]>),
                Value::Int(v) => query.bind(v),
                Value::Small(v) => query.bind(v),
            };
        }
        query
    }

    fn execute<'a>(
        conn: &'a mut Self::Connection,
        sql: &'a str,
        values: Vec<Value<'a>>,
    ) -> impl Future<Output = Result<Self::QueryResult, sqlx::Error>> + Send + 'a {
        Self::query(sql, values).execute(conn)
    }

    fn execute_script<'a>(
        conn: &'a mut Self::Connection,
        sql: &'a str,
    ) -> impl Future<Output = Result<Self::QueryResult, sqlx::Error>> + Send + 'a {
        // Through `Executor` on a `&str`, not `raw_sql`: the future of
        // `raw_sql(..).execute(..)` is not `Send` in every context.
        conn.execute(sql)
    }

    fn fetch_int<'a>(
        conn: &'a mut Self::Connection,
        sql: &'a str,
        values: Vec<Value<'a>>,
    ) -> impl Future<Output = Result<Option<i64>, sqlx::Error>> + Send + 'a {
        let row = Self::fetch_row(conn, sql, values);
        async move {
            match row.await? {
                // By position: the column's name differs per statement
                // (`fence`, `COUNT(*)`, ...).
                Some(row) => row.try_get(0usize),
                None => Ok(None),
            }
        }
    }

    fn fetch_row<'a>(
        conn: &'a mut Self::Connection,
        sql: &'a str,
        values: Vec<Value<'a>>,
    ) -> impl Future<Output = Result<Option<Self::Row>, sqlx::Error>> + Send + 'a {
        Self::query(sql, values).fetch_optional(conn)
    }

    fn fetch_all<'a>(
        conn: &'a mut Self::Connection,
        sql: &'a str,
        values: Vec<Value<'a>>,
    ) -> impl Future<Output = Result<Vec<Self::Row>, sqlx::Error>> + Send + 'a {
        Self::query(sql, values).fetch_all(conn)
    }

    fn fetch_row_with<'a>(
        conn: &'a mut Self::Connection,
        sql: &'a str,
        arguments: Self::Arguments<'a>,
    ) -> impl Future<Output = Result<Option<Self::Row>, sqlx::Error>> + Send + 'a {
        sqlx::query_with(sql, arguments).fetch_optional(conn)
    }

    fn text(row: &Self::Row, column: &str) -> Result<String, sqlx::Error> {
        row.try_get(ordinal(row, column)?)
    }

    fn bytes(row: &Self::Row, column: &str) -> Result<Option<Vec<u8>>, sqlx::Error> {
        row.try_get(ordinal(row, column)?)
    }

    fn int(row: &Self::Row, column: &str) -> Result<Option<i64>, sqlx::Error> {
        row.try_get(ordinal(row, column)?)
    }

    fn small(row: &Self::Row, column: &str) -> Result<Option<i16>, sqlx::Error> {
        row.try_get(ordinal(row, column)?)
    }
}

/// The position of `column` among the row's own columns. Looked up there
/// rather than by name through sqlx, whose names of a prepared statement's
/// columns come from the server's answer to the prepare: MariaDB answers
/// none for `INSERT ... RETURNING`, though each result names them.
fn ordinal<R: Row>(row: &R, column: &str) -> Result<usize, sqlx::Error> {
    row.columns()
        .iter()
        .position(|c| c.name() == column)
        .ok_or_else(|| sqlx::Error::ColumnNotFound(column.to_owned()))
}
