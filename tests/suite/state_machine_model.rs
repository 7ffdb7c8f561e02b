//! Model-based: random sequences of begin / complete / release / expire /
//! purge over a few keys and owners, run on a store and, step by step, on a
//! reference model of the state machine (the rules of `record::decide` and
//! of the `Store` contract). Every answer and, after every step, every
//! record must agree with the model. Run on the memory store, SQLite (in
//! memory), PostgreSQL, MariaDB/MySQL, Redis and Redis Cluster.
//!
//! Time is real: a begin asks for a short (`SHORT`) or a long lease and
//! ttl, and `Expire` sleeps until every short deadline has passed. So that
//! no answer depends on how fast a step runs, a short deadline that a step
//! could reach is first waited out; should a step be slow enough to reach
//! one anyway, both readings of that deadline are accepted.

use crate::common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use idem::record::{Begin, Claim, ClaimToken, Outcome, OutcomeKind, State};
use idem::store::BeginRequest;
use idem::{Error, Fingerprint, Key, Scope, Store};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

const KEYS: usize = 3;
const OWNERS: usize = 2;
const SHORT: Duration = Duration::from_millis(60);
const LONG: Duration = Duration::from_secs(3_600);
/// Slack between the test's clock and the store's millisecond clock.
const SLACK: Duration = Duration::from_millis(3);
const CASES: u32 = 32;
const STEPS: usize = 20;

#[derive(Clone, Debug)]
enum Op {
    /// `owner` (a payload, so a fingerprint) begins on `key`.
    Begin {
        key: usize,
        owner: usize,
        short_lease: bool,
        short_ttl: bool,
    },
    /// One of the claims handed out so far (current or stale) completes.
    Complete { claim: usize, value: u8 },
    /// One of the claims handed out so far releases.
    Release { claim: usize },
    /// Every short deadline passes.
    Expire,
    /// Expired records are purged.
    Purge,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0..KEYS, 0..OWNERS, prop::bool::weighted(0.3), prop::bool::weighted(0.2)).prop_map(
            |(key, owner, short_lease, short_ttl)| Op::Begin { key, owner, short_lease, short_ttl }
        ),
        3 => (any::<usize>(), any::<u8>()).prop_map(|(claim, value)| Op::Complete { claim, value }),
        2 => any::<usize>().prop_map(|claim| Op::Release { claim }),
        1 => Just(Op::Expire),
        1 => Just(Op::Purge),
    ]
}

/// When a deadline passes, as far as the test can tell.
#[derive(Clone, Copy, Debug)]
enum Deadline {
    Never,
    /// Set by a store call that ran from `start` to `end`: it passes at
    /// some point in `start + SHORT ..= end + SHORT`.
    Short {
        start: Instant,
        end: Instant,
    },
}

impl Deadline {
    fn new(short: bool, start: Instant, end: Instant) -> Self {
        if short {
            Deadline::Short { start, end }
        } else {
            Deadline::Never
        }
    }

    /// Surely passed for a step that started at `at`.
    fn passed_by(self, at: Instant) -> bool {
        matches!(self, Deadline::Short { end, .. } if at >= end + SHORT + SLACK)
    }

    /// Surely not passed for a step that ended at `at`.
    fn pending_at(self, at: Instant) -> bool {
        match self {
            Deadline::Never => true,
            Deadline::Short { start, .. } => at + SLACK < start + SHORT,
        }
    }

    /// When it has surely passed.
    fn surely_passed_at(self) -> Option<Instant> {
        match self {
            Deadline::Never => None,
            Deadline::Short { end, .. } => Some(end + SHORT + SLACK),
        }
    }
}

#[derive(Clone, Debug)]
struct ModelRecord {
    owner: usize,
    fence: i64,
    /// The claim (its index among those handed out) that wrote the record:
    /// only it may renew, complete or release, whatever the fence says.
    claim: usize,
    /// `Some` once completed.
    outcome: Option<u8>,
    lease: Deadline,
    expires: Deadline,
}

type Model = HashMap<usize, ModelRecord>;

/// What a step answered, comparable with the model's prediction.
#[derive(Clone, Debug, PartialEq)]
enum Answer {
    Claimed(i64),
    Replay(Vec<u8>),
    KeyReused,
    InProgress,
    Done,
    LeaseLost,
    Purged(u64),
}

#[derive(Clone, Debug)]
struct HeldClaim {
    key: usize,
    fence: i64,
    token: ClaimToken,
    short_ttl: bool,
}

/// The model's answer to `op` and its next state, reading every deadline
/// that a step from `start` to `end` might have seen pass as `late`
/// (passed or not).
///
/// On a store whose database deletes expired records itself
/// (`expires_itself`, Redis), an expired record is gone before the step:
/// a claim after it is a fresh one (fence 1), its owner's completion or
/// release finds nothing, and a purge deletes nothing.
fn predict(
    model: &Model,
    claims: &[HeldClaim],
    op: &Op,
    (start, end): (Instant, Instant),
    late: bool,
    expires_itself: bool,
) -> (Answer, Model) {
    let passed = |d: Deadline| d.passed_by(start) || (late && !d.pending_at(end));
    let mut next = model.clone();
    if expires_itself {
        next.retain(|_, r| !passed(r.expires));
    }
    let model = &next.clone();
    let answer = match *op {
        Op::Begin {
            key,
            owner,
            short_lease,
            short_ttl,
        } => {
            let fence = match model.get(&key) {
                None => Some(1),
                Some(r) if passed(r.expires) => Some(r.fence + 1),
                Some(r) if r.owner != owner => return (Answer::KeyReused, next),
                Some(ModelRecord {
                    outcome: Some(v), ..
                }) => return (Answer::Replay(vec![*v]), next),
                Some(r) if !passed(r.lease) => return (Answer::InProgress, next),
                Some(r) => Some(r.fence + 1),
            };
            let fence = fence.unwrap();
            next.insert(
                key,
                ModelRecord {
                    owner,
                    fence,
                    claim: claims.len(),
                    outcome: None,
                    lease: Deadline::new(short_lease, start, end),
                    // In progress, a record lives at least as long as its lease.
                    expires: Deadline::new(short_ttl && short_lease, start, end),
                },
            );
            Answer::Claimed(fence)
        }
        Op::Complete { claim, value } => {
            let index = claim % claims.len();
            let claim = &claims[index];
            match next.get_mut(&claim.key) {
                // In progress under this claim, or completed by it with the
                // same outcome (a completion sent again).
                Some(r) if r.claim == index && r.outcome.is_none_or(|v| v == value) => {
                    r.outcome = Some(value);
                    r.lease = Deadline::Never;
                    r.expires = Deadline::new(claim.short_ttl, start, end);
                    Answer::Done
                }
                _ => Answer::LeaseLost,
            }
        }
        Op::Release { claim } => {
            let index = claim % claims.len();
            let claim = &claims[index];
            match model.get(&claim.key) {
                Some(r) if r.outcome.is_none() && r.claim == index => {
                    next.remove(&claim.key);
                    Answer::Done
                }
                _ => Answer::LeaseLost,
            }
        }
        Op::Expire => Answer::Done,
        Op::Purge if expires_itself => Answer::Purged(0),
        Op::Purge => {
            next.retain(|_, r| !passed(r.expires));
            Answer::Purged((model.len() - next.len()) as u64)
        }
    };
    (answer, next)
}

/// Runs `op` on the store.
async fn apply(
    store: &dyn Store,
    scope: &Scope,
    keys: &[Key],
    claims: &[HeldClaim],
    op: &Op,
    granted: &mut Option<ClaimToken>,
) -> Result<Answer, Error> {
    let fingerprints: Vec<Fingerprint> = (0..OWNERS)
        .map(|o| Fingerprint::of_bytes(format!("owner {o}").as_bytes()))
        .collect();
    let claim_of = |i: usize| {
        let held = &claims[i % claims.len()];
        Claim {
            scope: scope.clone(),
            key: keys[held.key].clone(),
            fence: held.fence,
            token: held.token,
            lease: LONG,
            ttl: if held.short_ttl { SHORT } else { LONG },
        }
    };
    let lost = |r: Result<(), Error>| match r {
        Ok(()) => Ok(Answer::Done),
        Err(Error::LeaseLost) => Ok(Answer::LeaseLost),
        Err(e) => Err(e),
    };
    Ok(match *op {
        Op::Begin {
            key,
            owner,
            short_lease,
            short_ttl,
        } => {
            let request = BeginRequest {
                scope,
                key: &keys[key],
                fingerprint: &fingerprints[owner],
                token: ClaimToken::new(),
                lease: if short_lease { SHORT } else { LONG },
                ttl: if short_ttl { SHORT } else { LONG },
            };
            match store.begin(&request).await? {
                Begin::Claimed(claim) => {
                    *granted = Some(claim.token);
                    Answer::Claimed(claim.fence)
                }
                Begin::Replay(outcome) => {
                    assert_eq!(outcome.kind, OutcomeKind::Ok);
                    Answer::Replay(outcome.body)
                }
                Begin::KeyReused => Answer::KeyReused,
                Begin::InProgress { .. } => Answer::InProgress,
            }
        }
        Op::Complete { claim, value } => {
            let outcome = Outcome {
                kind: OutcomeKind::Ok,
                body: vec![value],
            };
            lost(store.complete(&claim_of(claim), &outcome).await)?
        }
        Op::Release { claim } => lost(store.release(&claim_of(claim)).await)?,
        Op::Expire => Answer::Done,
        Op::Purge => Answer::Purged(store.purge_expired(2).await?),
    })
}

/// One sequence on a fresh store (`scope` is the case's own).
async fn check(store: &dyn Store, scope: &Scope, ops: &[Op]) -> Result<(), TestCaseError> {
    let keys: Vec<Key> = (0..KEYS)
        .map(|k| Key::new(format!("key-{k}")).unwrap())
        .collect();
    let mut model = Model::new();
    let mut claims: Vec<HeldClaim> = Vec::new();
    for (step, op) in ops.iter().enumerate() {
        if matches!(op, Op::Complete { .. } | Op::Release { .. }) && claims.is_empty() {
            continue;
        }
        // Wait out every short deadline this step could reach; `Expire`
        // waits out all of them.
        let deadlines = model.values().flat_map(|r| [r.lease, r.expires]);
        let soon = Instant::now() + SHORT / 2;
        let wait_until = deadlines
            .filter(|d| matches!(op, Op::Expire) || !d.pending_at(soon))
            .filter_map(Deadline::surely_passed_at)
            .max();
        if let Some(at) = wait_until {
            tokio::time::sleep_until(at.into()).await;
        }

        let start = Instant::now();
        let mut granted = None;
        let answer = apply(store, scope, &keys, &claims, op, &mut granted)
            .await
            .map_err(|e| TestCaseError::fail(format!("step {step} {op:?}: {e}")))?;
        let end = Instant::now();
        let expires_itself = store.capabilities().deletes_expired_itself;
        let (on_time, on_time_model) =
            predict(&model, &claims, op, (start, end), false, expires_itself);
        let (late, late_model) = predict(&model, &claims, op, (start, end), true, expires_itself);
        model = if answer == on_time {
            on_time_model
        } else if answer == late {
            late_model
        } else {
            return Err(TestCaseError::fail(format!(
                "step {step} {op:?}: the store answered {answer:?}, the model {on_time:?} \
                 (or {late:?} with slow deadlines); model before: {model:?}"
            )));
        };
        if let (Op::Begin { key, short_ttl, .. }, Answer::Claimed(fence)) = (op, &answer) {
            claims.push(HeldClaim {
                key: *key,
                fence: *fence,
                token: granted.expect("a claim carries its token"),
                short_ttl: *short_ttl,
            });
        }

        // Every record is what the model says.
        for (k, key) in keys.iter().enumerate() {
            let asked = Instant::now();
            let stored = store
                .get(scope, key)
                .await
                .map_err(|e| TestCaseError::fail(format!("get: {e}")))?;
            if expires_itself {
                // Gone once expired; either reading near the deadline.
                if let Some(r) = model.get(&k) {
                    let gone = r.expires.passed_by(asked)
                        || (stored.is_none() && !r.expires.pending_at(Instant::now()));
                    if gone {
                        model.remove(&k);
                    }
                }
            }
            let expected = model.get(&k);
            let seen = stored.as_ref().map(|r| {
                let owner = (0..OWNERS)
                    .find(|o| {
                        r.fingerprint == Fingerprint::of_bytes(format!("owner {o}").as_bytes())
                    })
                    .expect("a known fingerprint");
                let outcome = r.outcome.as_ref().map(|o| o.body.clone());
                (owner, r.fence, r.state, outcome)
            });
            let wanted = expected.map(|r| {
                let state = match r.outcome {
                    Some(_) => State::Completed,
                    None => State::InProgress,
                };
                (r.owner, r.fence, state, r.outcome.map(|v| vec![v]))
            });
            prop_assert_eq!(seen, wanted, "step {} {:?}: record of key {}", step, op, k);
        }
    }
    Ok(())
}

/// Runs `CASES` random sequences, each on a store made by `make`.
fn run_model<S, G, F>(make: impl Fn() -> F)
where
    S: Store,
    F: std::future::Future<Output = (S, G)>,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut runner = TestRunner::new(Config {
        cases: CASES,
        failure_persistence: None,
        ..Config::default()
    });
    let case = std::sync::atomic::AtomicUsize::new(0);
    let strategy = proptest::collection::vec(op(), 1..=STEPS);
    let result = runner.run(&strategy, |ops| {
        runtime.block_on(async {
            let (store, _guard) = make().await;
            let n = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let scope = Scope::new(format!("model-{}-{n}", std::process::id()));
            check(&store, &scope, &ops).await
        })
    });
    if let Err(err) = result {
        panic!("{err}");
    }
}

// A store of its own for each case (a table of its own on the servers), so
// that a purge sees only the case's own records.
common::backends!(memory, sqlite_memory, postgres, mysql, redis, redis_cluster => {
    #[test]
    fn store_follows_the_model() {
        run_model(|| backend::store(2));
    }
});
