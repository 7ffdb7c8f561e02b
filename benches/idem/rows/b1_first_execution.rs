//! B1: the throughput of first executions, idem's against plain calls,
//! and the reference's.

use std::sync::Arc;
use std::time::Duration;

use crate::harness::calls::{Calls, Mode};
use crate::harness::compared::{run_subject, Compared};
use crate::harness::goal::Goal;
use crate::harness::measure::Span;
use crate::harness::reference::Script;
use crate::harness::{window, CONCURRENCY};
use crate::report::{Report, Row};

/// B1: first execution throughput, attribute vs none, and the reference.
pub async fn b1<B: Calls>(b: &Arc<B>, report: &mut Report) {
    let goals = b.goals();
    let write = b.write();
    let (bare, slow) = (Duration::ZERO, Duration::from_millis(20));
    let tx = (Mode::PlainTx, Mode::Tx);
    let record = (Mode::Plain, Mode::Record);
    let cases = [
        (
            "transactional, bare",
            "tx",
            tx,
            bare,
            Some(Script::Tx(bare)),
            goals.tx,
        ),
        (
            "record mode, bare",
            "record",
            record,
            bare,
            Some(Script::Record(bare)),
            goals.record,
        ),
        (
            "transactional, 20 ms body",
            "",
            tx,
            slow,
            Some(Script::Tx(slow)),
            Goal::AtLeast(0.97),
        ),
        (
            "record mode, 20 ms body",
            "",
            record,
            slow,
            Some(Script::Record(slow)),
            Goal::AtLeast(0.97),
        ),
    ];
    for (what, short, modes, body, script, goal) in cases {
        if modes == tx && !b.transactional() {
            continue;
        }
        let what = if body.is_zero() {
            format!("{what} {write}")
        } else {
            what.to_owned()
        };
        let found = Compared::measure(b, modes, script, CONCURRENCY, |subject| {
            run_subject(b, CONCURRENCY, subject, body, Span::For(window()))
        })
        .await;
        if body.is_zero() {
            // A backend with record mode only: its name alone.
            let label = if b.transactional() {
                format!("{} {short}", b.label())
            } else {
                b.label().to_owned()
            };
            report
                .b1
                .push((label, found.ratio, found.reference_ratio()));
        }
        report.rows.push(Row::judged(
            ("B1", b.label()),
            format!(
                "first execution, {what}: throughput vs no attribute ({}, {CONCURRENCY} tasks, {} ms each)",
                found.calls(),
                window().as_millis()
            ),
            found.measured(),
            (goal, ""),
            (found.ratio, found.reference_ratio()),
        ));
    }
}
