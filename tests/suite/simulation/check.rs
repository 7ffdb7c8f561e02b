//! The promises, checked after every history: effects per operation,
//! answers per key, no stuck keys, bounded waits, bounded state, and the
//! outbox's messages, leases and deliveries.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::downstream::Effect;
use super::history::{Backend, Fate, FaultKind, History, Mode, Op, StepPolicy, LONG_TTL_MS};
use super::outbox::{contents, LeaseEnd, Seen, DRAIN};
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
        // Without `Detach` a store journals nothing: steps run
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

    if let Some(seen) = &o.outbox {
        outbox(h, o, seen, &mut broken);
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

/// The charge an answer's value names (`ch_<id>`, padded or not).
fn charge_of(value: &str) -> Option<u64> {
    let digits = value.strip_prefix("ch_")?;
    let end = digits.find('.').unwrap_or(digits.len());
    digits[..end].parse().ok()
}

/// The outbox's promises (src/outbox/mod.rs, the module's documentation:
/// *Exactly once, end to end* and *Relays*; `MessageId`, `Outbox::lease`,
/// `Outbox::mark_relayed`, `Leased::attempts`), checked on what the
/// bodies published, what the relays leased and delivered, the consumer,
/// and the table after the final drain.
fn outbox(h: &History, o: &Observed, seen: &Seen, broken: &mut Vec<String>) {
    let log = &seen.log;
    let last = o.runs.len() - 1;
    let who = |attempt: usize| {
        if attempt == FINAL {
            "the final call".to_owned()
        } else {
            format!("attempt {attempt}")
        }
    };
    // Every message the outbox held at some point: the rows after the
    // drain, and those delivered (a relayed row may have been purged).
    let mut held: BTreeMap<&str, (&str, &str)> = BTreeMap::new();
    for row in &seen.rows {
        held.insert(&row.id, (&row.topic, &row.payload));
    }
    for deliveries in log.deliveries.values() {
        for d in deliveries {
            held.insert(&d.message.id, (&d.message.topic, &d.message.payload));
        }
    }
    let held_content: BTreeSet<(&str, &str)> = held.values().copied().collect();

    // "A stable id": `MessageId` is "the same for the same operation
    // (scope, key and payload) and the same message (topic, key, payload
    // and headers), in any attempt, process or takeover": what `publish`
    // answered and what a relay leased are the derivation of the content.
    let published = log.publications.iter().flat_map(|p| &p.messages);
    let delivered = log.deliveries.values().flatten().map(|d| &d.message);
    for m in published.chain(delivered) {
        if m.id != m.derived {
            broken.push(format!(
                "outbox: message {} {:?} has the id {}, not the one its content derives ({})",
                m.topic, m.payload, m.id, m.derived
            ));
        }
    }

    // "Enqueued once. A message is written on your transaction, with your
    // rows: it commits or rolls back with them. A replay does not run the
    // body, so it enqueues nothing." Every message held was published by
    // a body whose transaction committed (or may have: its caller dropped
    // it, its commit failed)...
    for (id, (topic, payload)) in &held {
        let by_committed = log
            .publications
            .iter()
            .any(|p| p.committed != Some(false) && p.messages.iter().any(|m| m.id == *id));
        if !by_committed {
            broken.push(format!(
                "outbox: message {topic} {payload:?} ({id}) was in the outbox, but every body \
                 that published it rolled back (or none published it)"
            ));
        }
    }
    // A message a rolled-back body published, and a later body published
    // again, shows as a lease of it before that later body began.
    for (at, lease) in log.leases.iter().enumerate() {
        for row in &lease.rows {
            let began = log
                .publications
                .iter()
                .filter(|p| p.committed != Some(false) && p.messages.iter().any(|m| m.id == row.id))
                .map(|p| p.at)
                .min();
            if let Some(began) = began.filter(|began| lease.got < *began) {
                broken.push(format!(
                    "outbox: row {} was leased at {:?} (lease {at}), before the first body that \
                     committed it began publishing ({began:?})",
                    row.seq, lease.got
                ));
            }
        }
    }
    // ... and a body whose transaction committed has its messages there.
    for p in &log.publications {
        if p.committed != Some(true) {
            continue;
        }
        for m in &p.messages {
            if !held.contains_key(m.id.as_str()) {
                broken.push(format!(
                    "outbox: {} committed the transaction of charge {} with message {} {:?}, \
                     which the outbox never held",
                    who(p.attempt),
                    p.charge,
                    m.topic,
                    m.payload
                ));
            }
        }
    }
    // Per operation: an effect that an `Ok` answers with committed with
    // its messages, whichever attempt's body made it.
    for (epoch, runs) in epochs(h, o).iter().enumerate() {
        for (i, run) in runs {
            let Answer::Ok(value) = &run.answer else {
                continue;
            };
            let Some(charge) = charge_of(value) else {
                continue;
            };
            for (topic, payload) in contents(seen.messages, charge) {
                if !held_content.contains(&(topic, payload.as_str())) {
                    let i = if *i == last { FINAL } else { *i };
                    broken.push(format!(
                        "outbox: epoch {epoch}: {} was answered with charge {charge}, whose \
                         message {topic} {payload:?} the outbox never held",
                        who(i)
                    ));
                }
            }
        }
    }

    // "a message whose id the outbox holds already is not written again"
    // (`Outbox::publish`): one row per message, unless a purge deleted
    // the first (a relayed row past its ttl) and a later operation of the
    // key published it again.
    let mut seqs: BTreeMap<&str, BTreeSet<i64>> = BTreeMap::new();
    for row in &seen.rows {
        seqs.entry(&row.id).or_default().insert(row.seq);
    }
    for lease in &log.leases {
        for row in &lease.rows {
            seqs.entry(&row.id).or_default().insert(row.seq);
        }
    }
    for (id, seqs) in &seqs {
        if seqs.len() > 1 && log.purged == 0 {
            broken.push(format!(
                "outbox: message {id} was written {} times (rows {seqs:?}), nothing purged",
                seqs.len()
            ));
        }
    }
    let mut contents_seen: BTreeMap<(&str, &str), BTreeSet<&str>> = BTreeMap::new();
    for (id, content) in &held {
        contents_seen.entry(*content).or_default().insert(id);
    }
    for ((topic, payload), ids) in &contents_seen {
        if ids.len() > 1 {
            broken.push(format!(
                "outbox: message {topic} {payload:?} was held under {} ids: {ids:?}",
                ids.len()
            ));
        }
    }

    // "Produced at least once ... Processed once": after the final drain
    // nothing waits (`Outbox::waiting`), every message was delivered, and
    // the consumer that dedupes on the id had one effect of each.
    if seen.waiting != 0 {
        broken.push(format!(
            "outbox: {} messages still wait after the final drain",
            seen.waiting
        ));
    }
    for row in &seen.rows {
        if !row.relayed {
            broken.push(format!(
                "outbox: row {} ({} {:?}) is not relayed after the final drain",
                row.seq, row.topic, row.payload
            ));
        }
    }
    for (id, (topic, payload)) in &held {
        if !log.deliveries.contains_key(*id) {
            broken.push(format!(
                "outbox: message {topic} {payload:?} ({id}) was never delivered"
            ));
        }
    }
    for (topic, payload) in &held_content {
        let effects = log
            .effects
            .get(&(topic.to_string(), payload.to_string()))
            .copied()
            .unwrap_or(0);
        if effects != 1 {
            broken.push(format!(
                "outbox: the consumer, deduping by id, had {effects} effects of {topic} \
                 {payload:?}"
            ));
        }
    }

    // *Relays*: "no row is marked that the broker did not acknowledge":
    // a row is relayed only when a relay that delivered it marked it (the
    // harness's relays mark what they delivered, and only that).
    let marked: BTreeSet<i64> = log
        .leases
        .iter()
        .filter(|l| matches!(l.end, Some(LeaseEnd::Marked { .. })))
        .flat_map(|l| l.delivered.iter().copied())
        .collect();
    for row in &seen.rows {
        if row.relayed && !marked.contains(&row.seq) {
            broken.push(format!(
                "outbox: row {} ({} {:?}) is relayed, though no relay that delivered it \
                 marked it",
                row.seq, row.topic, row.payload
            ));
        }
    }
    for lease in &log.leases {
        if let Some(LeaseEnd::Marked { newly, .. }) = lease.end {
            if newly > lease.rows.len() as u64 {
                broken.push(format!(
                    "outbox: a mark of {} rows marked {newly}",
                    lease.rows.len()
                ));
            }
        }
    }

    // *Relays*: "each row is relayed by one relay at a time": a row is
    // leased again only after its lease passed or its relay gave it back,
    // never once marked; and `Leased::attempts` counts its leases.
    let slack = Duration::from_millis(2);
    for (a_at, a) in log.leases.iter().enumerate() {
        for (b_at, b) in log.leases.iter().enumerate() {
            // `a` was leased before `b` was asked for.
            if a_at == b_at || a.got > b.asked {
                continue;
            }
            for row in &b.rows {
                let Some(before) = a.rows.iter().find(|r| r.seq == row.seq) else {
                    continue;
                };
                if let Some(LeaseEnd::Marked { done, .. }) = a.end {
                    if done <= b.asked {
                        broken.push(format!(
                            "outbox: row {} was leased at {:?} (lease {b_at}), after lease \
                             {a_at} marked it relayed",
                            row.seq, b.got
                        ));
                    }
                }
                if let Some((parked, unparked)) = a.parked() {
                    // *Parked messages*: "no relay leases it again ...
                    // until unparked".
                    if parked + slack < b.asked && b.got + slack < unparked {
                        broken.push(format!(
                            "outbox: row {} was leased at {:?}..{:?} (lease {b_at}) while \
                             parked ({parked:?}..{unparked:?}, lease {a_at})",
                            row.seq, b.asked, b.got
                        ));
                    }
                }
                let live = b.got + slack < a.asked + a.lease;
                let kept = a.released().is_none_or(|sent| sent > b.got);
                if live && kept {
                    broken.push(format!(
                        "outbox: row {} was leased by relay {} at {:?}..{:?} while relay {}'s \
                         lease from {:?} for {:?} held it",
                        row.seq, b.relay, b.asked, b.got, a.relay, a.asked, a.lease
                    ));
                }
                if row.attempts <= before.attempts {
                    broken.push(format!(
                        "outbox: row {} counts {} leases at lease {b_at}, {} at the earlier \
                         lease {a_at}",
                        row.seq, row.attempts, before.attempts
                    ));
                }
            }
        }
    }

    // *Exactly once*: "A relay that dies between the two leaves the row
    // leased; after the lease another relay ... produces it again"; and
    // *Relays*: a relay "that is only slow ... may see its lease end while
    // it still produces: the next relay produces the rows too"; a row
    // given back is "produced again later". So of the leases that
    // delivered one row, at most one marked it before it passed: every
    // other died, gave it back, or let its lease pass.
    for deliveries in log.deliveries.values() {
        let mut by_seq: BTreeMap<i64, Vec<usize>> = BTreeMap::new();
        for d in deliveries {
            by_seq.entry(d.seq).or_default().push(d.lease);
        }
        for (seq, leases) in by_seq {
            let clean: Vec<usize> = leases
                .iter()
                .copied()
                .filter(|&at| {
                    let lease = &log.leases[at];
                    matches!(lease.end, Some(LeaseEnd::Marked { .. })) && !lease.may_have_passed()
                })
                .collect();
            if clean.len() > 1 {
                broken.push(format!(
                    "outbox: row {seq} was delivered {} times (leases {leases:?}), and leases \
                     {clean:?} each marked it before their lease passed",
                    leases.len()
                ));
            }
        }
    }

    // Relay calls fail only under faults, which strike the store's
    // wrapper, not the outbox.
    for (relay, err) in &log.errors {
        let relay = if *relay == DRAIN {
            "the drain".to_owned()
        } else {
            format!("relay {relay}")
        };
        broken.push(format!("outbox: {relay}: {err}"));
    }
    for (at, lease) in log.leases.iter().enumerate() {
        if let Some(LeaseEnd::Failed(err)) = &lease.end {
            broken.push(format!("outbox: lease {at} (relay {}): {err}", lease.relay));
        }
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
