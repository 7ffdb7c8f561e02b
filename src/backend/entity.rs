//! Entity mode's statements, written once: how a backend quotes names
//! and numbers parameters is its [`Dialect`]'s. Each backend's `entity.rs`
//! puts them together with its own conflict clause.

use super::dialect::Dialect;

/// `name` quoted as an identifier.
pub(crate) fn quote<DB: Dialect>(name: &str) -> String {
    format!("{q}{name}{q}", q = DB::QUOTE)
}

/// `SELECT * FROM <table> WHERE <c1> = <p1> AND ...`.
pub(crate) fn select_where<DB: Dialect>(table: &str, columns: &[&str]) -> String {
    let conditions: Vec<String> = columns
        .iter()
        .enumerate()
        .map(|(i, c)| format!("{} = {}", quote::<DB>(c), DB::param(i + 1)))
        .collect();
    format!(
        "SELECT * FROM {} WHERE {}",
        quote::<DB>(table),
        conditions.join(" AND ")
    )
}

/// `INSERT INTO <table> (<columns>) VALUES (<params>)`.
pub(crate) fn insert<DB: Dialect>(table: &str, columns: &[&str]) -> String {
    let names: Vec<String> = columns.iter().map(|c| quote::<DB>(c)).collect();
    let params: Vec<String> = (1..=columns.len()).map(DB::param).collect();
    format!(
        "INSERT INTO {} ({}) VALUES ({})",
        quote::<DB>(table),
        names.join(", "),
        params.join(", ")
    )
}

/// `INSERT ... ON CONFLICT (<keys>) DO UPDATE SET ... RETURNING *`.
pub(crate) fn upsert_returning<DB: Dialect>(
    table: &str,
    columns: &[&str],
    keys: &[&str],
) -> String {
    format!(
        "{} {} RETURNING *",
        insert::<DB>(table, columns),
        on_conflict_update::<DB>(keys, columns)
    )
}

/// `ON CONFLICT (<keys>) DO UPDATE SET <c> = excluded.<c>, ...` over the
/// columns other than the keys (PostgreSQL and SQLite). With no other
/// column, the first key is set to itself, so that `RETURNING` still
/// answers the row.
pub(crate) fn on_conflict_update<DB: Dialect>(keys: &[&str], columns: &[&str]) -> String {
    let quoted: Vec<String> = keys.iter().map(|k| quote::<DB>(k)).collect();
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
        .map(|c| format!("{0} = excluded.{0}", quote::<DB>(c)))
        .collect();
    format!(
        "ON CONFLICT ({}) DO UPDATE SET {}",
        quoted.join(", "),
        set.join(", ")
    )
}
