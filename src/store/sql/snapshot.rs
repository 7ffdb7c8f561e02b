//! Every statement each backend sends, byte for byte, compared with the
//! copy kept in `tests/snapshots/sql/<backend>.sql`: where a statement's
//! text lives may change, what the database receives may not, unless the
//! copy is changed with it (and the change then shows in review): how a
//! transaction that writes opens, the records, the journal, the outbox and
//! the inventory on the default table, and entity mode on an example
//! entity. (The migrations, sent once, are not in it.)
//!
//! `IDEM_BLESS_SQL=1 cargo test -p idem --all-features --lib snapshot`
//! writes the copies anew.

use std::fmt::Write as _;

use super::entity::EntitySql;
use super::statements::Statement;
use super::{Backend, DEFAULT_TABLE};

/// The example entity's table, columns and token column.
const ENTITY_TABLE: &str = "payments";
const ENTITY_COLUMNS: &[&str] = &["idempotency_token", "amount_cents", "status"];
const ENTITY_TOKEN: &str = "idempotency_token";
/// The conflict columns of the example upserts: the token; every column
/// (nothing else to update); two columns.
const ENTITY_CONFLICTS: &[&[&str]] = &[
    &["idempotency_token"],
    &["idempotency_token", "amount_cents", "status"],
    &["amount_cents", "status"],
];

/// The snapshot's text for `DB`: one `-- name` line per statement, its
/// bound values in order where the statement names them, then its SQL.
/// `reads_back`: entity mode's upsert answers nothing, and its row is read
/// back (MySQL).
fn render<DB: Backend + EntitySql>(reads_back: bool) -> String {
    let mut out = String::new();
    let mut put = |name: &str, sql: &str| {
        writeln!(out, "-- {name}\n{sql}\n").unwrap();
    };
    put("begin_write", DB::BEGIN_WRITE);
    let s = DB::statements(DEFAULT_TABLE.to_owned());
    let with_params = |s: &Statement| format!("{:?}", s.params);
    let mut records: Vec<(String, &Statement)> = vec![
        (format!("claim, returns {:?}", s.claim_returns), &s.claim),
        ("claimed".into(), &s.claimed),
        ("select".into(), &s.select),
        ("look".into(), &s.look),
        ("renew".into(), &s.renew),
        ("complete".into(), &s.complete),
        ("release".into(), &s.release),
        ("forget".into(), &s.forget),
        ("purge".into(), &s.purge),
    ];
    if let Some(claim) = &s.claim_without_returning {
        records.push(("claim_without_returning".into(), claim));
    }
    if let Some(take_over) = &s.take_over {
        records.push(("take_over".into(), take_over));
    }
    for (name, statement) in records {
        put(
            &format!("records.{name} {}", with_params(statement)),
            &statement.sql,
        );
    }
    let j = &s.steps;
    for (name, sql) in [
        ("fence", &j.fence),
        ("select", &j.select),
        ("insert", &j.insert),
        ("start", &j.start),
        ("complete", &j.complete),
        ("list", &j.list),
        ("resolve_completed", &j.resolve_completed),
        ("resolve_rerun", &j.resolve_rerun),
        ("insert_fenced", &j.insert_fenced),
        ("complete_fenced", &j.complete_fenced),
        ("forget", &j.forget),
        ("undo", &j.undo),
        ("keep", &j.keep),
        ("purge", &j.purge),
    ] {
        put(&format!("journal.{name}"), sql);
    }
    for (name, sql) in super::outbox::sent::<DB>(&DB::outbox(DEFAULT_TABLE)) {
        put(&format!("outbox.{name}"), &sql);
    }
    for (name, sql) in super::inventory::sent::<DB>(DEFAULT_TABLE) {
        put(&format!("inventory.{name}"), &sql);
    }
    for (name, sql) in entity::<DB>(reads_back) {
        put(&format!("entity.{name}"), &sql);
    }
    out
}

/// Entity mode's statements on the example entity.
fn entity<DB: EntitySql>(reads_back: bool) -> Vec<(String, String)> {
    let mut sent = vec![
        (
            "find".to_owned(),
            DB::select_where(ENTITY_TABLE, &[ENTITY_TOKEN]),
        ),
        (
            "insert".to_owned(),
            DB::insert(ENTITY_TABLE, ENTITY_COLUMNS, ENTITY_TOKEN),
        ),
    ];
    for conflict in ENTITY_CONFLICTS {
        sent.push((
            format!("upsert {conflict:?}"),
            DB::upsert(ENTITY_TABLE, ENTITY_COLUMNS, conflict),
        ));
        if reads_back {
            sent.push((
                format!("upserted {conflict:?}"),
                DB::select_where(ENTITY_TABLE, conflict),
            ));
        }
    }
    sent
}

/// Compares `DB`'s statements with `tests/snapshots/sql/<name>.sql`, or
/// writes them
/// there when `IDEM_BLESS_SQL` is set.
fn check(name: &str, rendered: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/snapshots/sql")
        .join(format!("{name}.sql"));
    if std::env::var_os("IDEM_BLESS_SQL").is_some() {
        std::fs::write(&path, rendered).unwrap();
        return;
    }
    let kept =
        std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()));
    if kept == rendered {
        return;
    }
    let (kept, rendered): (Vec<_>, Vec<_>) = (kept.lines().collect(), rendered.lines().collect());
    let line = kept
        .iter()
        .zip(&rendered)
        .position(|(a, b)| a != b)
        .unwrap_or(kept.len().min(rendered.len()));
    panic!(
        "{name}'s statements differ from {} at line {}:\n  kept: {:?}\n  sent: {:?}",
        path.display(),
        line + 1,
        kept.get(line),
        rendered.get(line)
    );
}

#[cfg(feature = "sqlite")]
#[test]
fn sqlite_sends_the_statements_of_its_snapshot() {
    check("sqlite", &render::<sqlx::Sqlite>(false));
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_sends_the_statements_of_its_snapshot() {
    check("postgres", &render::<sqlx::Postgres>(false));
}

#[cfg(feature = "mysql")]
#[test]
fn mysql_sends_the_statements_of_its_snapshot() {
    check("mysql", &render::<sqlx::MySql>(true));
}
