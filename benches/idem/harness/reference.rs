//! The reference of a backend: the statements its store sends for a call,
//! without idem's engine, sent by pgbench or by a sqlx loop.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use idem::Fingerprint;

/// Who sends the reference's statements.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Client {
    /// pgbench, `-M prepared`.
    Pgbench,
    /// A sqlx loop on the pool, one call after another in each task.
    Loop,
}

/// Whether the reference is measured here: `Some(Err(why))` where it
/// cannot be (the Redis backends, which have none, never ask).
pub fn reference_status(client: &Client) -> Option<Result<(), &'static str>> {
    static PGBENCH: OnceLock<bool> = OnceLock::new();
    match client {
        Client::Pgbench
            if !*PGBENCH.get_or_init(|| {
                std::process::Command::new("pgbench")
                    .arg("--version")
                    .output()
                    .is_ok()
            }) =>
        {
            Some(Err("pgbench not found"))
        }
        Client::Pgbench | Client::Loop => Some(Ok(())),
    }
}

/// The reference's ratio as printed beside idem's.
pub fn reference_note(reference: Option<Result<f64, &str>>) -> String {
    match reference {
        None => String::new(),
        Some(Ok(r)) => format!(" (reference {r:.2})"),
        Some(Err(why)) => format!(" (reference not measured: {why})"),
    }
}

/// The calls a reference client makes.
#[derive(Clone, Copy, Debug)]
pub enum Script {
    /// A first execution in record mode: each statement on its own, the
    /// body taking the time given after its INSERT, as the plain call's.
    Record(Duration),
    /// A first execution in transactional mode: the same statements
    /// between BEGIN and COMMIT, after the read of the record that the
    /// store sends before its claim there, where it sends one.
    Tx(Duration),
    /// [`Script::Tx`] without that read.
    TxWithoutRead(Duration),
    /// A replay: the one read by key.
    Replay,
}

/// One statement of the reference, its parameters named as the store's
/// `Param` (and the bench's `Amount`).
#[derive(Clone, Debug)]
pub struct Sql {
    pub sql: String,
    pub params: Vec<String>,
}

impl Sql {
    /// Whether this is the bench's business INSERT (the body's write),
    /// after which a body that takes time waits.
    pub fn is_business(&self) -> bool {
        self.params.iter().any(|p| p == "Amount")
    }
}

/// The reference's statements: the store's own, from
/// `reference_statements`, and the bench's business INSERT.
#[derive(Debug)]
pub struct RefSql {
    /// A first execution: the claim, the read where the claim returns no
    /// row (the store reads the record back then), the business INSERT,
    /// the completion.
    pub first: Vec<Sql>,
    /// A replay: the record by key.
    pub replay: Sql,
    /// Where the store reads the record (`replay`) before its claim in
    /// transactional mode: `None` nowhere, `Some(true)` beside the
    /// transaction, on another connection, `Some(false)` in it.
    pub tx_read: Option<bool>,
}

/// The key of the record the reference's replays read: numeric, as
/// pgbench sets its keys, and below every key it makes.
pub const REPLAY_KEY: &str = "0";

impl RefSql {
    /// The store's statement named `name`.
    pub fn named(statements: &[(&'static str, String, Vec<String>)], name: &str) -> Sql {
        statements
            .iter()
            .find(|(n, _, _)| *n == name)
            .map(|(_, sql, params)| Sql {
                sql: sql.clone(),
                params: params.clone(),
            })
            .unwrap_or_else(|| panic!("the store has no {name:?} statement"))
    }

    /// pgbench's script for `script` (BEGIN/COMMIT around a first
    /// execution in transactional mode) and its `-D` variables. Each `$n`
    /// becomes its parameter's variable, cast to the type sqlx binds
    /// (pgbench prepares without types). A first execution's key is
    /// numeric: the run `run`, the client and a random number.
    pub fn pgbench(&self, script: Script, run: usize) -> (String, Vec<String>) {
        let mut text = match script {
            Script::Replay => format!("\\set key {REPLAY_KEY}\n"),
            Script::Record(_) | Script::Tx(_) | Script::TxWithoutRead(_) => format!(
                "\\set key {run} * 1000000000000000 + :client_id * 10000000000000 + random(1, 1000000000000)\n"
            ),
        };
        let (statements, body) = match script {
            Script::Replay => (std::slice::from_ref(&self.replay), Duration::ZERO),
            Script::Record(body) | Script::Tx(body) | Script::TxWithoutRead(body) => {
                (&self.first[..], body)
            }
        };
        let tx = matches!(script, Script::Tx(_) | Script::TxWithoutRead(_));
        if tx {
            text.push_str("BEGIN;\n");
        }
        // pgbench has one connection a client: a read beside the
        // transaction would be inside it here. (PostgreSQL's store, the
        // only one measured by pgbench, sends none.)
        let read = match (script, self.tx_read) {
            (Script::Tx(_), Some(beside)) => {
                assert!(!beside, "pgbench cannot read beside its transaction");
                Some(&self.replay)
            }
            _ => None,
        };
        let mut defines = Vec::new();
        for statement in read.into_iter().chain(statements) {
            let mut sql = statement.sql.clone();
            for (i, param) in statement.params.iter().enumerate().rev() {
                let (value, ty) = param_value(param, REPLAY_KEY).pgbench();
                let var = param.to_lowercase();
                sql = sql.replace(&format!("${}", i + 1), &format!("CAST(:{var} AS {ty})"));
                if param != "Key" {
                    defines.push(format!("{var}={value}"));
                }
            }
            let _ = writeln!(text, "{sql};");
            if statement.is_business() && !body.is_zero() {
                let _ = writeln!(text, "\\sleep {} us", body.as_micros());
            }
        }
        if tx {
            text.push_str("COMMIT;\n");
        }
        defines.sort();
        defines.dedup();
        (text, defines)
    }
}

/// A value the reference binds.
pub enum Val {
    Text(String),
    Bytes(Vec<u8>),
    Int(i64),
    Small(i16),
}

impl Val {
    /// The value as pgbench's `-D` takes it, and its PostgreSQL type.
    pub fn pgbench(&self) -> (String, &'static str) {
        match self {
            Val::Text(t) => (t.clone(), "text"),
            Val::Bytes(b) => {
                let hex: String = b.iter().map(|b| format!("{b:02x}")).collect();
                (format!("\\x{hex}"), "bytea")
            }
            Val::Int(i) => (i.to_string(), "bigint"),
            Val::Small(i) => (i.to_string(), "smallint"),
        }
    }
}

/// What the reference binds to a parameter, for `key`: the values of a
/// call of the bench's record mode (one token for all calls: nothing reads
/// it but the completion).
pub fn param_value(param: &str, key: &str) -> Val {
    match param {
        "Scope" => Val::Text("bench.pay".to_owned()),
        "Key" => Val::Text(key.to_owned()),
        "Fingerprint" => Val::Bytes(Fingerprint::of(&500i64).unwrap().as_bytes().to_vec()),
        "Token" => Val::Bytes(vec![0x5a; 16]),
        "Lease" => Val::Int(60_000),
        "Ttl" => Val::Int(24 * 3600 * 1000),
        "OutcomeKind" => Val::Small(0),
        "Outcome" => Val::Bytes(b"500".to_vec()),
        "Amount" => Val::Int(500),
        other => panic!("the reference has no value for the parameter {other}"),
    }
}

/// pgbench's transactions per second for `script` with `clients` clients
/// for `window` (rounded up to whole seconds), against `url`.
pub async fn pgbench(
    url: &str,
    sql: &RefSql,
    script: Script,
    clients: usize,
    window: Duration,
) -> f64 {
    static RUN: AtomicUsize = AtomicUsize::new(1);
    let run = RUN.fetch_add(1, Ordering::Relaxed);
    let (text, defines) = sql.pgbench(script, run);
    let path = std::env::temp_dir().join(format!("idem-bench-{}-{run}.sql", std::process::id()));
    std::fs::write(&path, &text).unwrap();
    let mut command = tokio::process::Command::new("pgbench");
    command.args(["-n", "-M", "prepared"]);
    command.args([
        "-c",
        &clients.to_string(),
        "-j",
        &clients.min(2).to_string(),
    ]);
    command.args(["-T", &window.as_secs_f64().ceil().max(1.0).to_string()]);
    command.arg("-f").arg(&path);
    for d in &defines {
        command.args(["-D", d]);
    }
    let out = command.arg(url).output().await.unwrap();
    let _ = std::fs::remove_file(&path);
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("tps = "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|tps| tps.parse().ok())
        .filter(|_| out.status.success())
        .unwrap_or_else(|| {
            panic!(
                "pgbench failed ({}):\n{stdout}\n{}\nscript:\n{text}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        })
}
