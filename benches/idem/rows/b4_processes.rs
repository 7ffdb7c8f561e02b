//! B4': B4 across processes, this binary run again as its children.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use super::b4_one_key::{calls_on_one_key, OneKey};
use crate::harness::calls::{Bench, Calls};
use crate::harness::sql::{lite, my, pg};
use crate::harness::{rounds, unique, unix_micros};
use crate::report::Report;

/// The variable that makes this binary B4''s child, naming the backend;
/// `IDEM_BENCH_CHILD_DIR` and `IDEM_BENCH_CHILD_TABLE` say where SQLite's
/// file is and which records table to use.
pub const CHILD: &str = "IDEM_BENCH_CHILD";

/// B4': B4's 64 calls spread over 4 processes (this binary again), each
/// making 16 at the same instant of the wall clock.
pub async fn b4_processes<B: Bench>(b: &Arc<B>, report: &mut Report) {
    const PROCESSES: usize = 4;
    let exe = std::env::current_exe().unwrap();
    let mut children = Vec::new();
    for _ in 0..PROCESSES {
        let mut child = tokio::process::Command::new(&exe)
            .env(CHILD, b.label())
            .env("IDEM_BENCH_CHILD_DIR", b.dir())
            .env("IDEM_BENCH_CHILD_TABLE", b.records())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        assert_eq!(lines.next_line().await.unwrap().as_deref(), Some("ready"));
        children.push((child, stdin, lines));
    }
    let mut found = OneKey::default();
    for _ in 0..rounds() {
        let round = format!("{} {}\n", unique("b4p"), unix_micros() + 100_000);
        for (_, stdin, _) in &mut children {
            stdin.write_all(round.as_bytes()).await.unwrap();
        }
        let mut returns = Vec::new();
        for (_, _, lines) in &mut children {
            while let Some(line) = lines.next_line().await.unwrap() {
                let Some((won, at)) = line.split_once(' ') else {
                    break;
                };
                returns.push((won == "1", at.parse().unwrap()));
            }
        }
        found.add(&returns);
    }
    for (mut child, stdin, _) in children {
        drop(stdin);
        child.wait().await.unwrap();
    }
    found.report(
        ("B4'", b.label()),
        format!(
            "{} calls on one key from {PROCESSES} processes ({CHILD_CALLS} each, at one instant)",
            PROCESSES * CHILD_CALLS
        ),
        b.dialect().goals.processes,
        report,
    );
}

/// The calls each child of B4' makes.
pub const CHILD_CALLS: usize = 16;

/// B4''s child: opens its connections and its listener with a first
/// round of calls, says `ready`, then for each line `key at` on its
/// standard input makes its calls on `key` at `at`, and answers a line
/// `ran returned_at` for each, then `end`.
pub async fn child<B: Calls>(b: Arc<B>) {
    // One call runs the body, the others wait: the pool's connections are
    // open, and PostgreSQL's listener is listening.
    calls_on_one_key(&b, &unique("warm"), CHILD_CALLS, None).await;
    println!("ready");
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = lines.next_line().await.unwrap() {
        let (key, at) = line.split_once(' ').unwrap();
        let returns = calls_on_one_key(&b, key, CHILD_CALLS, Some(at.parse().unwrap())).await;
        let mut out = String::new();
        for (won, at) in returns {
            let _ = writeln!(out, "{} {at}", u8::from(won));
        }
        println!("{out}end");
    }
}

/// Runs B4''s child on the backend labelled `label`.
pub async fn child_main(label: &str) {
    let dir = PathBuf::from(std::env::var("IDEM_BENCH_CHILD_DIR").unwrap());
    let table = std::env::var("IDEM_BENCH_CHILD_TABLE").unwrap();
    match label {
        l if l == pg::DIALECT.label => {
            child(Arc::new(pg::Payments::for_child(&dir, &table).await)).await
        }
        l if l == my::DIALECT.label => {
            child(Arc::new(my::Payments::for_child(&dir, &table).await)).await
        }
        l if l == lite::DIALECT.label => {
            child(Arc::new(lite::Payments::for_child(&dir, &table).await)).await
        }
        other => panic!("no backend {other}"),
    }
}
