//! B3: idem against the usual check-then-act recipe.

use std::sync::Arc;
use std::time::Duration;

use crate::harness::calls::{Bench, Mode};
use crate::harness::goal::Goal;
use crate::harness::measure::{interleave_all, measure, throughput};
use crate::harness::quick;
use crate::report::{Report, Row};

/// B3: idem vs check-then-act (read the key, lock, write), in record mode
/// and, where the backend has it, in transactional mode, and the record
/// mode's statements without the engine (the reference), the four
/// measured in the same rounds.
pub async fn b3<B: Bench>(b: &Arc<B>, report: &mut Report) {
    let ops = if quick() { 80 } else { 400 };
    let idem = move |mode| {
        let b = b.clone();
        move || {
            let b = b.clone();
            throughput(ops, move || {
                let b = b.clone();
                async move { b.call(mode, Duration::ZERO).await }
            })
        }
    };
    let mut measures = vec![
        measure(move || {
            let b = b.clone();
            throughput(ops, move || {
                let b = b.clone();
                async move { b.check_then_act().await }
            })
        }),
        measure(move || {
            let b = b.clone();
            throughput(ops, move || {
                let b = b.clone();
                async move { b.held_reference().await }
            })
        }),
        measure(idem(Mode::Record)),
    ];
    if b.transactional() {
        measures.push(measure(idem(Mode::Tx)));
        measures.push(measure(move || {
            let b = b.clone();
            throughput(ops, move || {
                let b = b.clone();
                async move { b.tx_reference().await }
            })
        }));
    }
    let found = interleave_all(&measures).await;
    let recipe = found[0].1;
    // (mode, idem's measure, its reference's)
    let mut modes = vec![("record mode", found[2], found[1])];
    if b.transactional() {
        modes.push(("transactional mode", found[3], found[4]));
    }
    for (mode, (ratio, calls), (reference, reference_calls)) in modes {
        let (note, also) = (
            format!(" (reference {reference:.2})"),
            format!("; reference {reference_calls:.0} calls/s"),
        );
        report.rows.push(Row::judged(
            ("B3", b.label()),
            format!(
                "{mode} vs check-then-act (SELECT key, lock, INSERT record, business INSERT, UPDATE, unlock): throughput ({calls:.0} vs {recipe:.0} calls/s{also})"
            ),
            format!("{ratio:.2}{note}"),
            (Goal::Above(1.0), ""),
            (ratio, None),
        ));
    }
}
