//! `idem-admin`: look at, forget and purge idempotency records without SQL.
//!
//! ```text
//! cargo run --example idem_admin --features postgres,mysql -- \
//!     <database-url> [--table NAME] inspect <scope> <key>
//! cargo run --example idem_admin -- sqlite://app.db forget 'payments::create' order-42
//! cargo run --example idem_admin -- sqlite://app.db purge
//! ```
//!
//! - `inspect` prints the record of a key: its state, fence, lease, expiry
//!   and outcome (as text when it is UTF-8);
//! - `forget` deletes it whatever its state, so the next call with that key
//!   runs again (see `Store::forget` for what that means for a key in
//!   progress);
//! - `purge` deletes every expired record.
//!
//! The scope of an `#[idempotent]` fn is `module::path::fn_name` unless it
//! names one; an HTTP layer's scope is `METHOD /route` (plus the principal
//! on a second line). The URL's scheme picks the store: `sqlite:`,
//! `postgres:`, `mysql:` (each with its feature).

use std::process::ExitCode;

use idem::{Key, Record, Scope, State, Store};

const USAGE: &str = "usage: idem_admin <database-url> [--table NAME] \
                     (inspect <scope> <key> | forget <scope> <key> | purge)";

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match admin(&args).await {
        Ok(report) => {
            println!("{report}");
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("{message}");
            ExitCode::FAILURE
        }
    }
}

/// What the command line asks for.
enum Command {
    Inspect(Scope, Key),
    Forget(Scope, Key),
    Purge,
}

/// Runs one command line (without the program name); the report, or why
/// not.
pub async fn admin(args: &[String]) -> Result<String, String> {
    let (url, table, command) = parse(args)?;
    let store = open(&url, table.as_deref()).await?;
    run(&*store, command).await.map_err(|err| err.to_string())
}

fn parse(args: &[String]) -> Result<(String, Option<String>, Command), String> {
    let mut args = args.iter().map(String::as_str);
    let url = args.next().ok_or(USAGE)?.to_owned();
    let mut rest: Vec<&str> = args.collect();
    let mut table = None;
    if rest.first() == Some(&"--table") {
        table = Some(rest.get(1).ok_or(USAGE)?.to_string());
        rest.drain(..2);
    }
    let key = |value: &str| Key::new(value).map_err(|err| format!("invalid key: {err}"));
    let command = match rest.as_slice() {
        ["inspect", scope, k] => Command::Inspect(Scope::from_stored(scope), key(k)?),
        ["forget", scope, k] => Command::Forget(Scope::from_stored(scope), key(k)?),
        ["purge"] => Command::Purge,
        _ => return Err(USAGE.to_owned()),
    };
    Ok((url, table, command))
}

async fn open(url: &str, table: Option<&str>) -> Result<Box<dyn Store>, String> {
    let fail = |err: idem::Error| format!("cannot open {url}: {err}");
    if url.starts_with("sqlite:") {
        let store = idem::SqliteStore::connect(url).await.map_err(fail)?;
        return match table {
            Some(t) => Ok(Box::new(store.with_table_name(t).map_err(fail)?)),
            None => Ok(Box::new(store)),
        };
    }
    #[cfg(feature = "postgres")]
    if url.starts_with("postgres:") || url.starts_with("postgresql:") {
        let pool = sqlx::PgPool::connect(url)
            .await
            .map_err(|e| fail(e.into()))?;
        let store = idem::PostgresStore::new(pool)
            .with_table_name(table.unwrap_or("idem_records"))
            .map_err(fail)?;
        return Ok(Box::new(store));
    }
    #[cfg(feature = "mysql")]
    if url.starts_with("mysql:") || url.starts_with("mariadb:") {
        let pool = sqlx::MySqlPool::connect(url)
            .await
            .map_err(|e| fail(e.into()))?;
        let store = idem::MySqlStore::new(pool)
            .with_table_name(table.unwrap_or("idem_records"))
            .map_err(fail)?;
        return Ok(Box::new(store));
    }
    Err(format!(
        "unsupported URL {url}: use sqlite:, postgres: or mysql: (built with its feature)"
    ))
}

async fn run(store: &dyn Store, command: Command) -> Result<String, idem::Error> {
    Ok(match command {
        Command::Inspect(scope, key) => match store.get(&scope, &key).await? {
            Some(record) => describe(&record),
            None => format!(
                "no record for key {} in scope {:?}",
                key.as_str(),
                scope.as_str()
            ),
        },
        Command::Forget(scope, key) => {
            if store.forget(&scope, &key).await? {
                format!("forgot key {}: its next call runs again", key.as_str())
            } else {
                format!(
                    "no record for key {} in scope {:?}",
                    key.as_str(),
                    scope.as_str()
                )
            }
        }
        Command::Purge => format!("purged {} expired records", store.purge_expired(500).await?),
    })
}

fn describe(record: &Record) -> String {
    let state = match record.state {
        State::InProgress => "in progress",
        State::Completed => "completed",
    };
    let mut lines = vec![
        format!("scope        {:?}", record.scope.as_str()),
        format!("key          {}", record.key.as_str()),
        format!("state        {state}"),
        format!("fence        {}", record.fence),
        format!("fingerprint  {}", record.fingerprint.to_hex()),
        format!("created_at   {} ms", record.created_at),
        format!("expires_at   {} ms", record.expires_at),
    ];
    if let Some(lease) = record.lease_until {
        lines.push(format!("lease_until  {lease} ms"));
    }
    if let Some(outcome) = &record.outcome {
        let body = String::from_utf8(outcome.body.clone())
            .unwrap_or_else(|_| format!("{} bytes", outcome.body.len()));
        lines.push(format!("outcome      {:?}: {body}", outcome.kind));
    }
    lines.join("\n")
}
