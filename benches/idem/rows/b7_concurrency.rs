//! B7: throughput against concurrency.

use std::sync::Arc;
use std::time::Duration;

use futures::future::FutureExt;

use crate::harness::calls::{Bench, Mode};
use crate::harness::compared::{run_subject, Compared};
use crate::harness::goal::Goal;
use crate::harness::measure::Span;
use crate::harness::quick;
use crate::harness::reference::Script;
use crate::report::{Report, Row};

/// B7: throughput vs concurrency, record mode with a bare INSERT: plain,
/// the reference (as many clients) and idem, through a pool of as many
/// connections as tasks. Each measurement opens its pool (and prepares its
/// statements) before it starts and closes it after, so that pgbench's
/// connections fit in the server's.
pub async fn b7<B: Bench>(b: &Arc<B>, report: &mut Report) {
    let window = Duration::from_millis(if quick() { 100 } else { 300 });
    let mut previous: Option<f64> = None;
    for tasks in [1, 4, 16, 64] {
        let found = Compared::measure(
            b,
            (Mode::Plain, Mode::Record),
            Some(Script::Record(Duration::ZERO)),
            tasks,
            |subject| {
                let b = b.clone();
                async move {
                    let sized = Arc::new(b.resized(tasks as u32).await);
                    let run = |span| run_subject(&sized, tasks, subject, Duration::ZERO, span);
                    run(Span::Calls(2 * tasks)).await;
                    let calls = run(Span::For(window)).await;
                    sized.close().await;
                    calls
                }
                .boxed_local()
            },
        )
        .await;
        report.b7.push((
            tasks,
            found.plain,
            found.reference.and_then(|r| r.ok()).map(|(_, calls)| calls),
            found.idem,
        ));
        report.rows.push(Row::judged(
            ("B7", b.label()),
            format!(
                "record mode, bare INSERT, concurrency {tasks} (tasks, connections, pgbench clients): throughput vs no attribute ({}, {} ms each)",
                found.calls(),
                window.as_millis()
            ),
            found.measured(),
            (
                previous.map_or(Goal::None, |p| Goal::AtLeast(p - 0.02)),
                if previous.is_some() { " (row above - 0.02)" } else { "" },
            ),
            (found.ratio, None),
        ));
        previous = Some(found.ratio);
    }
}
