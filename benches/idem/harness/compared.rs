//! Plain calls, idem's and the references', measured side by side.

use std::sync::Arc;
use std::time::Duration;

use futures::future::{FutureExt, LocalBoxFuture};

use super::calls::{Calls, Mode};
use super::measure::{interleave_all, measure, throughput_of, Span};
use super::reference::{reference_note, Script};
use super::window;

/// Plain calls, idem's and the reference's, interleaved.
pub struct Compared {
    /// idem / plain.
    pub ratio: f64,
    pub plain: f64,
    pub idem: f64,
    /// The reference's ratio to plain and its calls per second, or why it
    /// was not measured; `None` where the backend has no reference.
    pub reference: Option<Result<(f64, f64), &'static str>>,
    /// The second reference ([`Calls::second_reference`]): how the row
    /// names it, its ratio to plain and its calls per second.
    pub second: Option<(&'static str, f64, f64)>,
}

impl Compared {
    /// Plain calls (`modes.0`) and idem's (`modes.1`), each measured by
    /// `run`, and the reference's `script` by `tasks` clients, if any; the
    /// second reference, where there is one, is measured by `run` too, so
    /// on the same pool as the plain calls and idem's.
    pub async fn measure<'a, B: Calls, R>(
        b: &'a Arc<B>,
        modes: (Mode, Mode),
        script: Option<Script>,
        tasks: usize,
        run: R,
    ) -> Compared
    where
        R: Fn(Subject) -> LocalBoxFuture<'a, f64> + Copy + 'a,
    {
        let status = script.and(b.reference_status());
        let mut measures = vec![
            measure(move || run(Subject::Call(modes.0))),
            measure(move || run(Subject::Call(modes.1))),
        ];
        if let (Some(script), Some(Ok(()))) = (script, status) {
            measures.push(measure(move || b.reference(script, tasks, window())));
        }
        let second = match script.and_then(|script| b.second_reference(script)) {
            Some((label, script)) => {
                measures.push(measure(move || run(Subject::Loop(script))));
                Some((label, measures.len() - 1))
            }
            None => None,
        };
        let found = interleave_all(&measures).await;
        Compared {
            ratio: found[1].0,
            plain: found[0].1,
            idem: found[1].1,
            reference: status.map(|s| s.map(|()| found[2])),
            second: second.map(|(label, i)| (label, found[i].0, found[i].1)),
        }
    }

    pub fn reference_ratio(&self) -> Option<f64> {
        self.reference.and_then(|r| r.ok()).map(|(ratio, _)| ratio)
    }

    /// The calls per second, as the row says them.
    pub fn calls(&self) -> String {
        let reference = match self.reference {
            Some(Ok((_, calls))) => format!(", reference {calls:.0}"),
            _ => String::new(),
        };
        let second = match self.second {
            Some((label, _, calls)) => format!(", reference {label} {calls:.0}"),
            None => String::new(),
        };
        format!(
            "idem {:.0}, plain {:.0}{reference}{second} calls/s",
            self.idem, self.plain
        )
    }

    /// idem's ratio, and the reference's.
    pub fn measured(&self) -> String {
        let reference = self.reference.map(|r| r.map(|(ratio, _)| ratio));
        let note = reference_note(reference);
        match self.second {
            Some((label, ratio, _)) if note.ends_with(')') => format!(
                "{:.2}{}, {label} {ratio:.2})",
                self.ratio,
                &note[..note.len() - 1]
            ),
            _ => format!("{:.2}{note}", self.ratio),
        }
    }
}

/// What one measure of a [`Compared`] runs.
#[derive(Clone, Copy)]
pub enum Subject {
    /// Calls of a mode: plain, or idem's.
    Call(Mode),
    /// The second reference's script, by a sqlx loop.
    Loop(Script),
}

/// Calls per second of `subject` by `tasks` tasks on `b` for `span`, a
/// call's body taking `body` after its write.
pub fn run_subject<B: Calls>(
    b: &Arc<B>,
    tasks: usize,
    subject: Subject,
    body: Duration,
    span: Span,
) -> LocalBoxFuture<'static, f64> {
    match subject {
        Subject::Call(mode) => {
            let b = b.clone();
            throughput_of(tasks, span, move || {
                let b = b.clone();
                async move { b.call(mode, body).await }
            })
            .boxed_local()
        }
        Subject::Loop(script) => {
            let b = b.clone();
            async move { b.loop_reference(script, tasks, span).await }.boxed_local()
        }
    }
}
