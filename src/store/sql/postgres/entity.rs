//! PostgreSQL's statements for entity mode, built for each entity from its
//! table and column names (checked before): an insert and an upsert that
//! answer the row as stored (`RETURNING *`), in one round trip. The flow
//! that runs them is [`EntityDatabase`]'s.

use sqlx::Postgres;

use crate::store::sql::entity::{listed, updated_columns, EntityDatabase, EntitySql};

impl EntitySql for Postgres {
    fn select_where(table: &str, columns: &[&str]) -> String {
        let conditions = listed(columns, " AND ", |n, c| format!(r#""{c}" = ${n}"#));
        format!(r#"SELECT * FROM "{table}" WHERE {conditions}"#)
    }

    fn insert(table: &str, columns: &[&str], token: &str) -> String {
        let insert = plain_insert(table, columns);
        format!(r#"{insert} ON CONFLICT ("{token}") DO NOTHING RETURNING *"#)
    }

    fn upsert(table: &str, columns: &[&str], conflict: &[&str]) -> String {
        let (insert, keys) = (plain_insert(table, columns), names(conflict));
        let updated = updated_columns(columns, conflict);
        let set = listed(&updated, ", ", |_, c| format!(r#""{c}" = excluded."{c}""#));
        format!("{insert} ON CONFLICT ({keys}) DO UPDATE SET {set} RETURNING *")
    }
}

/// `INSERT INTO <table> (<columns>) VALUES (<a placeholder each>)`.
fn plain_insert(table: &str, columns: &[&str]) -> String {
    let names = names(columns);
    let values = listed(columns, ", ", |n, _| format!("${n}"));
    format!(r#"INSERT INTO "{table}" ({names}) VALUES ({values})"#)
}

/// `names`, quoted.
fn names(names: &[&str]) -> String {
    listed(names, ", ", |_, name| format!(r#""{name}""#))
}

impl EntityDatabase for Postgres {}
