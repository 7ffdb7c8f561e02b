//! B6: the cost per call of a first execution and of a replay, on the
//! memory store against a plain function call, and on each backend
//! against its plain call.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use crate::harness::calls::{Calls, Mode};
use crate::harness::goal::Goal;
use crate::harness::measure::median;
use crate::harness::{keys_per_round, quick};
use crate::report::{Report, Row};

/// B6: the memory store's cost per call vs a plain function call.
pub async fn b6(report: &mut Report) {
    #[inline(never)]
    async fn plain(amount: i64) -> Result<i64, idem::Error> {
        Ok(std::hint::black_box(amount))
    }
    let keys = keys_per_round("b6", if quick() { 20_000 } else { 200_000 });
    // A store of its own for each round, so that every round measures the
    // same thing: calls on a store of one round's records (how a replay's
    // time grows with the records held is B5's to show).
    let stores: Vec<_> = keys.iter().map(|_| idem::MemoryStore::new()).collect();
    let stores = &stores;
    // The reference, in the same rounds on the same keys: the records
    // alone, in a bare map behind a mutex, as a store in memory needs
    // them at the least (a first execution: one lock, one hash, one
    // insert; a replay: one lock, one hash, one look-up, the outcome
    // copied out). What it costs at this many records is the memory's
    // (cache and TLB misses), whatever the engine does.
    let bare: Vec<_> = keys.iter().map(|_| BareMap::default()).collect();
    let bare = &bare;
    let (times, reference) = cost_per_call(
        &keys,
        |_| async {
            std::hint::black_box(plain(500).await.unwrap());
        },
        |round, k| async move {
            let store = &stores[round];
            let r: Result<i64, idem::Error> =
                idem::run(store, idem::Call::new("bench.mem", k, &500i64), plain(500)).await;
            std::hint::black_box(r.unwrap());
        },
        Some(|round: usize, k: &str| {
            std::hint::black_box(bare[round].call(k));
            std::future::ready(())
        }),
    )
    .await;
    let [first, replay] = reference.expect("measured beside");
    let beside = [first - times[0], replay - times[0]];
    let goals = [Goal::AtMost(1.0), Goal::AtMost(0.5)];
    cost_rows(
        "memory",
        times,
        "a plain async fn call",
        goals,
        Some(("the same records in a bare map", beside)),
        report,
    );
}

/// B6 on a backend's store: first executions and replays in record mode
/// against plain calls (the body's write alone), one caller.
pub async fn b6_on<B: Calls>(b: &Arc<B>, report: &mut Report) {
    let keys = keys_per_round("b6", if quick() { 20 } else { 100 });
    let (times, _) = cost_per_call(
        &keys,
        |k| b.call_key(Mode::Plain, k),
        |_, k| b.call_key(Mode::Record, k),
        no_reference(),
    )
    .await;
    let baseline = format!(
        "the plain call (the body's one {}, without idem), one caller",
        b.write()
    );
    cost_rows(b.label(), times, &baseline, [Goal::None; 2], None, report);
}

/// B6's measurement, one caller: the time per call in ns of `plain` calls,
/// of first executions (`idem`, given the round's index and the key) and
/// of their replays (`idem` again on the same keys), and the same of
/// `reference` if there is one, each the mean over a round's keys, in
/// the same rounds; their medians over the rounds, as `[plain, first,
/// replay]` and the reference's `[first, replay]`.
pub async fn cost_per_call<'a, P, PF, I, IF, R, RF>(
    keys: &'a [Vec<String>],
    plain: P,
    idem: I,
    reference: Option<R>,
) -> ([f64; 3], Option<[f64; 2]>)
where
    P: Fn(&'a str) -> PF,
    PF: Future<Output = ()>,
    I: Fn(usize, &'a str) -> IF,
    IF: Future<Output = ()>,
    R: Fn(usize, &'a str) -> RF,
    RF: Future<Output = ()>,
{
    let mut times = [Vec::new(), Vec::new(), Vec::new()];
    let mut beside = [Vec::new(), Vec::new()];
    for (round, keys) in keys.iter().enumerate() {
        let per_call = |t: Instant| t.elapsed().as_secs_f64() * 1e9 / keys.len() as f64;
        let t = Instant::now();
        for k in keys {
            plain(k).await;
        }
        times[0].push(per_call(t));
        for times in &mut times[1..] {
            let t = Instant::now();
            for k in keys {
                idem(round, k).await;
            }
            times.push(per_call(t));
        }
        if let Some(reference) = &reference {
            for times in &mut beside {
                let t = Instant::now();
                for k in keys {
                    reference(round, k).await;
                }
                times.push(per_call(t));
            }
        }
    }
    let beside = reference.map(|_| beside.map(median));
    (times.map(median), beside)
}

/// No reference for [`cost_per_call`].
pub fn no_reference<'a>() -> Option<fn(usize, &'a str) -> std::future::Ready<()>> {
    None
}

/// B6's rows: the cost per call of a first execution and of a replay,
/// from `[plain, first, replay]` in ns, against `plain` (`baseline` says
/// what that call is), and beside them, where there is one, a reference's
/// cost per call for each (`(what it is, [first, replay])`, in ns over
/// `plain`).
pub fn cost_rows(
    backend: &'static str,
    [plain, first, replay]: [f64; 3],
    baseline: &str,
    goals: [Goal; 2],
    reference: Option<(&str, [f64; 2])>,
    report: &mut Report,
) {
    let time = |ns: f64| match ns {
        ns if ns < 100.0 => format!("{ns:.1} ns"),
        ns if ns < 10_000.0 => format!("{ns:.0} ns"),
        ns => format!("{:.0} µs", ns / 1e3),
    };
    let calls = [("first execution", first), ("replay", replay)];
    for (i, ((what, ns), goal)) in calls.into_iter().zip(goals).enumerate() {
        let cost = (ns - plain) / 1e3;
        let digits = if cost.abs() < 10.0 { 2 } else { 0 };
        let (beside, measured_beside) = match reference {
            Some((which, costs)) => (
                format!("; {which}: {}", time(plain + costs[i])),
                format!(" (reference {:+.digits$} µs)", costs[i] / 1e3),
            ),
            None => Default::default(),
        };
        report.rows.push(Row::judged(
            ("B6", backend),
            format!(
                "cost per call, {what}: {} against {} for {baseline}{beside}",
                time(ns),
                time(plain)
            ),
            format!("{cost:+.digits$} µs{measured_beside}"),
            (goal, " µs"),
            (cost, None),
        ));
    }
}

/// B6's reference: a store in memory at its barest, records by key in a
/// map behind a mutex (hashed as `MemoryStore` hashes), each with what a
/// replay needs of it.
#[derive(Default)]
pub struct BareMap(
    std::sync::Mutex<hashbrown::HashMap<String, BareRecord, foldhash::fast::RandomState>>,
);

pub struct BareRecord {
    fingerprint: [u8; 32],
    expires_at: i64,
    outcome: Vec<u8>,
}

impl BareMap {
    /// The first call on `key` stores its record; a later one, of the
    /// same payload and before the record expires, copies its outcome
    /// out. Hashed once either way.
    fn call(&self, key: &str) -> Vec<u8> {
        const FINGERPRINT: [u8; 32] = [7; 32];
        let mut map = self.0.lock().unwrap();
        match map.entry_ref(key) {
            hashbrown::hash_map::EntryRef::Occupied(r)
                if r.get().expires_at > 0 && r.get().fingerprint == FINGERPRINT =>
            {
                r.get().outcome.clone()
            }
            entry => {
                let outcome = b"500".to_vec();
                entry.insert(BareRecord {
                    fingerprint: FINGERPRINT,
                    expires_at: i64::MAX,
                    outcome: outcome.clone(),
                });
                outcome
            }
        }
    }
}
