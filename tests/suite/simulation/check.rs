//! The promises, checked after every history: effects per operation,
//! answers per key, no stuck keys, bounded waits and bounded state.

use std::collections::BTreeSet;
use std::time::Duration;

use super::downstream::Effect;
use super::history::{Backend, Fate, FaultKind, History, Mode, Op, StepPolicy, LONG_TTL_MS};
use super::run::{render, Answer, ErrorClass, Observed, Run, FINAL};

/// Whether an operation may show more than one effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Repeat {
    /// Never: a second effect breaks a promise.
    Never,
    /// The guide documents a repeat for this policy and downstream.
    Documented,
}

/// What a history that kept its promises reports.
#[derive(Debug, Default)]
pub struct Passed {
    /// Known open failures that this history showed.
    pub known_open: Vec<&'static str>,
}

/// The exceptions to "the downstream sees at most one effect per
/// operation", in one place. `runs` are one epoch's (see [`epochs`]).
pub fn repeat(h: &History, runs: &[&Run], struck: usize) -> Repeat {
    // Whether some attempt may have left its call's fate unknown: its
    // caller dropped it or its step's client gave up (`ends_early`), or a
    // store fault struck, which can lose a journal write or a claim.
    let in_doubt = struck > 0 || runs.iter().any(|r| r.fate.ends_early());
    // Whether some attempt ended without the operation's outcome: its
    // body failed or a store error stopped it, and a retry runs again.
    let failed = runs
        .iter()
        .any(|r| matches!(r.answer, Answer::Err(..) | Answer::Dropped));
    // The guide, *What the simulation checks* (src/_guide/calls.md),
    // effects: "a store outage longer than the lease let another caller
    // take over from an owner that was still running (`rerun`,
    // `reconcile`)".
    let lapsed = claim_may_lapse(h);
    // The same: "or the journal could not be kept for longer than the
    // ttl (`refuse`, atomic phases)"; the guide's steps chapter
    // (src/_guide/steps.md): an entry is kept "for the operation's ttl (at least its lease) from its last
    // write", kept again at each renewal. A failover's window counts as
    // such an outage of the writes it loses (`History::unreplicated`).
    let journal_lapsed = [Op::Renew, Op::KeepSteps]
        .into_iter()
        .flat_map(|op| h.unreplicated(op))
        .any(|len_ms| len_ms >= h.ttl_ms.max(h.lease_ms));
    match h.policy {
        StepPolicy::Rerun | StepPolicy::Reconcile if lapsed => Repeat::Documented,
        StepPolicy::Refuse | StepPolicy::Atomic if journal_lapsed => Repeat::Documented,
        // A body without steps: its effect outside the database is not
        // journaled. the guide, *What happens on a call* (src/_guide/calls.md): "A re-run after a
        // crash, a stop or a drop is safe for the database's rows ...
        // Calls to other systems are made safe by durable steps"; an error
        // releases the key, "so a retry runs the body again".
        // In transactional mode the effect is a row, committed with the
        // record or rolled back with it: never twice.
        StepPolicy::NoSteps if h.mode == Mode::Transactional => Repeat::Never,
        StepPolicy::NoSteps if in_doubt || failed => Repeat::Documented,
        StepPolicy::NoSteps => Repeat::Never,
        // the guide's steps chapter (src/_guide/steps.md): rerun gives "one effect, when the
        // downstream dedupes by key".
        StepPolicy::Rerun if h.downstream.dedupes => Repeat::Never,
        // the guide's steps chapter, "The honest limit": a downstream that
        // neither dedupes nor can be asked "may see a step run twice
        // under rerun when the process dies between the downstream's
        // effect and the journal write"; steps module, *What the journal
        // costs*: "an attempt that lost its claim may still start one
        // more such call". In transactional mode nothing is journaled:
        // steps "get their keys and rerun" after any rollback.
        StepPolicy::Rerun if in_doubt => Repeat::Documented,
        StepPolicy::Rerun if h.mode == Mode::Transactional && failed => Repeat::Documented,
        // Without `Store::detach` a store journals nothing: steps run
        // with their keys and rerun, as in transactional mode.
        StepPolicy::Rerun if !h.detach && failed => Repeat::Documented,
        StepPolicy::Rerun => Repeat::Never,
        // the guide's steps chapter: reconcile gives "one effect, when the
        // downstream can be asked by key" (the generator only pairs it
        // with such a downstream).
        // A step whose earlier call may still land is neither reconciled
        // nor run again before its settle window closes (`Step::settle`).
        StepPolicy::Reconcile => Repeat::Never,
        // the guide's steps chapter: refuse gives "no second effect, unless
        // the store could not keep the journal for longer than the
        // operation's ttl".
        StepPolicy::Refuse => Repeat::Never,
        // An atomic phase's row commits with its journal entry.
        StepPolicy::Atomic => Repeat::Never,
    }
}

/// Whether the `Ok` answers of one operation may differ. the guide, *What
/// the simulation checks* (src/_guide/calls.md), answers: "except after such an outage, or when
/// a store without `detach` failed to save it: then each caller gets its
/// own body's value":
///
/// - a live owner may lose its claim to a store outage longer than its
///   lease (renewals failing, or an operation stalled past the lease),
///   and its caller still gets its own value (ARCHITECTURE, invariant 4:
///   "When a body ran, its caller gets its value");
/// - the guide's guarantees table (src/_guide/calls.md): a store without a background "cannot:
///   the key stays claimed, no longer renewed, until its lease runs out,
///   and a retry then runs the body again".
pub fn answers_may_differ(h: &History) -> bool {
    let lapses = claim_may_lapse(h);
    let unsaved = !h.detach
        && (h.faults.iter().any(|f| f.op == Op::Complete)
            || h.outages.iter().any(|o| o.op == Op::Complete));
    lapses || unsaved
}

/// Whether a live owner may lose its claim: an operation stalls past the
/// lease, or renewals fail (or a failover loses them) for a lease or more.
fn claim_may_lapse(h: &History) -> bool {
    h.faults.iter().any(|f| f.kind == FaultKind::DelayPastLease)
        || h.unreplicated(Op::Renew)
            .into_iter()
            .any(|len_ms| len_ms >= h.lease_ms)
}

/// Splits the runs (by start) into epochs: a run that starts when no
/// earlier one is running, and finds nothing of the operation live in the
/// store (where it looked: [`Run::free`]), or else half a ttl or more after the last run that
/// may have written the record ended (a replay does not keep it), may find
/// the record expired (a completed record is kept a ttl from its
/// completion), which frees the key (`Record::expires_at`: "When the key becomes free
/// again"). Each epoch is one operation as far as the promises go.
pub fn epochs<'r>(h: &History, o: &'r Observed) -> Vec<Vec<(usize, &'r Run)>> {
    let last = o.runs.len() - 1;
    // Whether a run may have written the record or the journal: not when
    // it replayed another's value or found the key in progress.
    let wrote = |i: usize, run: &Run| match run.answer {
        Answer::Ok(_) => o
            .effects
            .iter()
            .any(|e| e.attempt == i || (e.attempt == FINAL && i == last)),
        Answer::Err(_, ErrorClass::InProgress) => false,
        _ => true,
    };
    // When a run met the operation: a run whose body ran claimed just
    // before it (on SQLite a caller may wait for the database's lock long
    // after it called, and claim a key whose record expired meanwhile);
    // any other met what it was answered with when it was answered (a
    // claim stalled in the store may come back with a later operation's
    // outcome).
    let at = |run: &Run| run.body.unwrap_or(run.end);
    let mut order: Vec<(usize, &Run)> = o.runs.iter().enumerate().collect();
    order.sort_by_key(|(_, r)| at(r));
    let gap = Duration::from_millis(h.ttl_ms / 2);
    let mut epochs: Vec<Vec<(usize, &Run)>> = Vec::new();
    let (mut last_end, mut last_write): (Option<Duration>, Duration) = (None, Duration::ZERO);
    for (i, run) in order {
        let fresh = match (last_end, run.free) {
            (None, _) => true,
            // The store said: nothing of the operation was live.
            (Some(end), Some(free)) => free && at(run) >= end,
            (Some(end), None) => {
                h.ttl_ms != LONG_TTL_MS && at(run) >= end && at(run) >= last_write + gap
            }
        };
        if fresh {
            epochs.push(Vec::new());
        }
        epochs.last_mut().unwrap().push((i, run));
        // A run answered `InProgress` never held the key (a claim stalled
        // past the record's expiry, say): it does not keep a later claim
        // from beginning a new operation.
        let held = !matches!(run.answer, Answer::Err(_, ErrorClass::InProgress));
        if held || last_end.is_none() {
            last_end = Some(last_end.map_or(run.end, |end| end.max(run.end)));
        }
        if wrote(i, run) {
            last_write = last_write.max(run.end);
        }
    }
    epochs
}

/// The longest a caller that waits for its answer may wait: a
/// duplicate's wait, the body (twice: it may run after a wait), the
/// faults' delays, two leases, the engine's two seconds of storing in
/// line, and some slack for the claim's and the release's retries.
fn wait_bound(h: &History) -> Duration {
    let ms = h.wait_ms
        + 2 * (h.work_ms + h.downstream.commit_after_ms + h.lease_ms)
        + h.faults.len() as u64 * (h.lease_ms + 10)
        + 2_000
        + 5_000;
    Duration::from_millis(ms)
}

/// Checks `o`, what `h` produced. `Err` names every broken promise.
pub fn check(h: &History, o: &Observed) -> Result<Passed, String> {
    let mut broken = Vec::new();
    let mut passed = Passed::default();
    let last = o.runs.len() - 1;
    let of = |index: usize| if index == FINAL { last } else { index };

    for (epoch, runs) in epochs(h, o).iter().enumerate() {
        let members: BTreeSet<usize> = runs.iter().map(|(i, _)| *i).collect();
        let effects: Vec<&Effect> = o
            .effects
            .iter()
            .filter(|e| members.contains(&of(e.attempt)))
            .collect();
        // Effects.
        if effects.len() > 1 {
            let ids: Vec<_> = effects.iter().map(|e| (e.id, e.attempt)).collect();
            let runs: Vec<&Run> = runs.iter().map(|(_, r)| *r).collect();
            match repeat(h, &runs, o.struck) {
                Repeat::Never => broken.push(format!(
                    "effects: epoch {epoch} saw {} effects (id, attempt) {ids:?} where the \
                     policy promises one",
                    effects.len()
                )),
                Repeat::Documented => {}
            }
        }
        // Answers: one value per epoch, one of the effects' values.
        let values: BTreeSet<&str> = runs
            .iter()
            .filter_map(|(_, r)| match &r.answer {
                Answer::Ok(v) => Some(v.as_str()),
                _ => None,
            })
            .collect();
        if values.len() > 1 && !answers_may_differ(h) {
            broken.push(format!("answers: epoch {epoch} answered {values:?}"));
        }
        for value in &values {
            if !o
                .effects
                .iter()
                .any(|e| render(e.id, h.large_outcome) == *value)
            {
                broken.push(format!("answers: {value:?} is no effect's value"));
            }
        }
    }

    for (i, run) in o.runs.iter().enumerate() {
        let who = if i == last {
            "the final call".to_owned()
        } else {
            format!("attempt {i}")
        };
        match &run.answer {
            Answer::Hung => broken.push(format!(
                "wait: {who} had no answer after {:?}",
                run.end - run.start
            )),
            Answer::Err(err, class) => {
                let expected = match class {
                    ErrorClass::InProgress => i != last,
                    // A refused step is one some attempt left in doubt:
                    // its call's end unseen (a caller dropped, a client
                    // gave up), or a journal write or a claim lost to a
                    // fault. A declined call failed cleanly: its start is
                    // taken back, and it leaves no doubt (README, *Durable
                    // steps*, clean failures).
                    ErrorClass::OutcomeUnknown => {
                        h.policy == StepPolicy::Refuse
                            && (h.faulty() || o.runs.iter().any(|r| r.fate.ends_early()))
                    }
                    ErrorClass::Unrecorded => h.large_outcome,
                    ErrorClass::Store | ErrorClass::LeaseLost => {
                        h.faulty() || h.backend == Backend::Sqlite
                    }
                    ErrorClass::Timeout => {
                        matches!(run.fate, Fate::StepTimesOut { .. })
                    }
                    ErrorClass::Body => i != last && h.attempts[i].body_fails,
                    ErrorClass::Declined => i != last && h.attempts[i].declined,
                    ErrorClass::Other => false,
                };
                if !expected {
                    broken.push(format!("answers: {who} got {err}"));
                }
            }
            Answer::Ok(_) | Answer::Dropped => {}
        }
        if !run.fate.ends_early() || matches!(run.fate, Fate::StepTimesOut { .. }) {
            let took = run.end - run.start;
            if took > wait_bound(h) {
                broken.push(format!(
                    "wait: {who} waited {took:?} for its answer, over {:?}",
                    wait_bound(h)
                ));
            }
        }
    }

    // No stuck keys: the final call (checked above: not `InProgress`)
    // left the record finished or released.
    if o.stuck {
        broken.push("stuck: the record is still in progress after the final call".into());
    }
    // Memory: one operation key, one step.
    if let Some(records) = o.records {
        if records > 1 {
            broken.push(format!("memory: {records} records (or rows) for one key"));
        }
    }
    if let Some(journal) = o.journal {
        if journal > 1 {
            broken.push(format!("memory: {journal} journal entries for one step"));
        }
    }

    if !broken.is_empty() && std::env::var_os("IDEM_SIM_STRICT").is_none() {
        if let Some(open) = known_open(h, &broken) {
            passed.known_open.push(open);
            return Ok(passed);
        }
    }
    if broken.is_empty() {
        Ok(passed)
    } else {
        Err(broken.join("\n"))
    }
}

/// The failures found by this harness and still open, each named by the
/// histories where it strikes and the broken promises it shows (all of
/// them): counted and printed, not failed, until it is fixed;
/// `IDEM_SIM_STRICT=1` fails them.
fn known_open(h: &History, broken: &[String]) -> Option<&'static str> {
    // None open today. Seen before, now gone:
    // - in entity mode on SQLite, after an attempt that ended early, a
    //   later call waited about ten seconds (SQLite's busy timeout) before
    //   it was answered (seed 132, once in 260 strict seeds). Not seen in
    //   569 strict seeds since a first call dropped while migrating no
    //   longer leaves the write lock held by a pooled connection
    //   (`dropped_migrations`);
    // - on MariaDB, a transactional duplicate that InnoDB chose as a
    //   deadlock's victim, and a migration lock held by a dropped first
    //   entity-mode call: fixed, each with its test.
    let _ = (h, broken);
    None
}
