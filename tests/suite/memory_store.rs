//! `MemoryStore`'s records (a vector plus an index of `(32-bit hash,
//! position)` entries, removal by swap_remove) and its clock (the wall
//! clock at creation plus `Instant` elapsed, read under the records' lock).
//!
//! Through the public `Store` API only: a model of what each key holds is
//! kept in a `HashMap`, and every answer and every key's record must agree
//! with it across claims, takeovers, completions, releases, forgets and
//! purges, with many keys (so that 32-bit hash collisions are likely) and
//! with concurrent tasks.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem::record::{Begin, Claim, ClaimToken, Outcome, OutcomeKind, State};
use idem::store::BeginRequest;
use idem::{run, Call, Error, Fingerprint, Key, MemoryStore, Policy, Scope, Store};

const LONG: Duration = Duration::from_secs(3_600);

fn key(s: &str) -> Key {
    Key::new(s).unwrap()
}

fn fp(n: u64) -> Fingerprint {
    Fingerprint::of_bytes(format!("memory-store-payload-{n}").as_bytes())
}

fn outcome(n: u64) -> Outcome {
    Outcome {
        kind: OutcomeKind::Ok,
        body: n.to_string().into_bytes(),
    }
}

async fn begin(
    store: &MemoryStore,
    scope: &Scope,
    key: &Key,
    fingerprint: &Fingerprint,
    token: ClaimToken,
    lease: Duration,
    ttl: Duration,
) -> Begin {
    store
        .begin(&BeginRequest {
            scope,
            key,
            fingerprint,
            token,
            lease,
            ttl,
        })
        .await
        .unwrap()
}

/// A claim with a long lease and ttl, which must be granted.
async fn claim(store: &MemoryStore, scope: &Scope, key: &Key, f: &Fingerprint) -> Claim {
    match begin(store, scope, key, f, ClaimToken::new(), LONG, LONG).await {
        Begin::Claimed(c) => c,
        other => panic!("expected a claim of {key:?}, got {other:?}"),
    }
}

/// A record made already expired (lease and ttl of zero).
async fn expired_record(store: &MemoryStore, scope: &Scope, key: &Key) {
    let answer = begin(
        store,
        scope,
        key,
        &fp(0),
        ClaimToken::new(),
        Duration::ZERO,
        Duration::ZERO,
    )
    .await;
    assert!(matches!(answer, Begin::Claimed(_)), "{answer:?}");
}

/// xorshift64
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

// ---------------------------------------------------------------------------
// swap_remove edge cases
// ---------------------------------------------------------------------------

/// The only record, released, forgotten and purged: the store is empty and
/// the key can be claimed afresh (fence 1) each time.
#[tokio::test]
async fn only_record_removed_every_way() {
    let store = MemoryStore::new();
    let scope = Scope::new("memory.only");
    let k = key("only");
    let c = claim(&store, &scope, &k, &fp(1)).await;
    assert_eq!(c.fence, 1);
    store.release(&c).await.unwrap();
    assert!(store.is_empty());
    assert!(store.get(&scope, &k).await.unwrap().is_none());

    let c = claim(&store, &scope, &k, &fp(1)).await;
    assert_eq!(c.fence, 1);
    assert!(store.forget(&scope, &k).await.unwrap());
    assert!(store.is_empty());
    assert!(!store.forget(&scope, &k).await.unwrap());
    assert!(matches!(store.release(&c).await, Err(Error::LeaseLost)));
    assert!(matches!(
        store.complete(&c, &outcome(1)).await,
        Err(Error::LeaseLost)
    ));

    expired_record(&store, &scope, &k).await;
    assert_eq!(store.purge_expired(1).await.unwrap(), 1);
    assert!(store.is_empty());
    let c = claim(&store, &scope, &k, &fp(1)).await;
    assert_eq!(c.fence, 1);
    assert_eq!(store.len(), 1);
}

/// Removing the last record (no move), then the first (the last moves into
/// position 0), then a middle one: every other key still finds its own
/// record, and fenced writes reach the moved record.
#[tokio::test]
async fn last_first_and_middle_removals_keep_every_key() {
    let store = MemoryStore::new();
    let scope = Scope::new("memory.positions");
    let keys: Vec<Key> = (0..6).map(|i| key(&format!("p{i}"))).collect();
    let mut claims = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        claims.push(claim(&store, &scope, k, &fp(i as u64)).await);
    }
    // The last one.
    store.release(&claims[5]).await.unwrap();
    // The first: p4 moves to position 0.
    assert!(store.forget(&scope, &keys[0]).await.unwrap());
    // p4 was moved: its claim still completes, and it replays.
    store.complete(&claims[4], &outcome(4)).await.unwrap();
    let again = begin(
        &store,
        &scope,
        &keys[4],
        &fp(4),
        ClaimToken::new(),
        LONG,
        LONG,
    )
    .await;
    assert_eq!(again, Begin::Replay(outcome(4)));
    // A middle one.
    store.release(&claims[2]).await.unwrap();
    for (i, k) in keys.iter().enumerate() {
        let r = store.get(&scope, k).await.unwrap();
        match i {
            0 | 2 | 5 => assert!(r.is_none(), "{i}: {r:?}"),
            _ => {
                let r = r.unwrap_or_else(|| panic!("{i} lost"));
                assert_eq!(r.key, *k);
                assert_eq!(r.fingerprint, fp(i as u64));
            }
        }
    }
    assert_eq!(store.len(), 3);
    for i in [1, 3] {
        store.renew(&claims[i]).await.unwrap();
        store
            .complete(&claims[i], &outcome(i as u64))
            .await
            .unwrap();
    }
    for i in [1, 3, 4] {
        let r = store.get(&scope, &keys[i]).await.unwrap().unwrap();
        assert_eq!(r.outcome, Some(outcome(i as u64)));
    }
}

/// Expired and live records interleaved, purged in batches of every size
/// from 1 to more than all: only the expired ones go, every live one stays
/// findable under its own key, and takeovers in place of expired records
/// (made while others are purged) stay too.
#[tokio::test]
async fn purge_in_batches_while_positions_shift() {
    for batch in [1usize, 2, 3, 5, 7, 64, 1000] {
        let store = MemoryStore::new();
        let scope = Scope::new("memory.purge");
        let mut live = Vec::new();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ batch as u64);
        for i in 0..300u64 {
            let k = key(&format!("q{i}"));
            if rng.below(3) == 0 {
                let c = claim(&store, &scope, &k, &fp(i)).await;
                if i % 2 == 0 {
                    store.complete(&c, &outcome(i)).await.unwrap();
                }
                live.push((i, k, c));
            } else {
                expired_record(&store, &scope, &k).await;
            }
        }
        let expired = 300 - live.len() as u64;
        // Half the expired ones are taken over in place before the purge.
        let mut taken = Vec::new();
        for i in (0..300u64).step_by(7) {
            if live.iter().any(|(j, _, _)| *j == i) {
                continue;
            }
            let k = key(&format!("q{i}"));
            let c = claim(&store, &scope, &k, &fp(1000 + i)).await;
            assert_eq!(c.fence, 2, "a takeover of an expired record");
            taken.push((i, k, c));
        }
        let purged = store.purge_expired(batch).await.unwrap();
        assert_eq!(purged, expired - taken.len() as u64, "batch {batch}");
        assert_eq!(store.len(), live.len() + taken.len(), "batch {batch}");
        for (i, k, c) in &live {
            let r = store.get(&scope, k).await.unwrap().unwrap();
            assert_eq!(r.key, *k);
            assert_eq!(r.fingerprint, fp(*i));
            assert_eq!(r.token, Some(c.token));
        }
        for (i, k, c) in &taken {
            let r = store.get(&scope, k).await.unwrap().unwrap();
            assert_eq!(r.fingerprint, fp(1000 + i));
            store.complete(c, &outcome(1000 + i)).await.unwrap();
        }
        for i in 0..300u64 {
            let k = key(&format!("q{i}"));
            let known =
                live.iter().any(|(j, _, _)| *j == i) || taken.iter().any(|(j, _, _)| *j == i);
            assert_eq!(
                store.get(&scope, &k).await.unwrap().is_some(),
                known,
                "q{i}"
            );
        }
        assert_eq!(store.purge_expired(batch).await.unwrap(), 0);
    }
}

// ---------------------------------------------------------------------------
// Model test: many keys, random operations, HashMap model
// ---------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct Model {
    fingerprint: u64,
    token: ClaimToken,
    fence: i64,
    outcome: Option<u64>,
    /// Made with a lease and ttl of zero: expired already.
    expired: bool,
}

/// Random begin / complete / renew / release / forget / purge over 2,000
/// keys in three scopes (some scopes share key strings, and one scope's
/// string is a prefix of another's), checked answer by answer against a
/// `HashMap`, and every key checked every few hundred steps.
#[tokio::test]
async fn random_operations_agree_with_a_hash_map() {
    let store = MemoryStore::new();
    let scopes = [
        Scope::new("memory.m"),
        Scope::new("memory.m2"),
        Scope::new("memory.m").with_principal("x"),
    ];
    const KEYS: u64 = 2_000;
    let keys: Vec<Key> = (0..KEYS).map(|i| key(&format!("m{i}"))).collect();
    let mut model: HashMap<(usize, u64), Model> = HashMap::new();
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for step in 0..40_000u64 {
        let s = rng.below(3) as usize;
        let k = rng.below(KEYS);
        let (scope, key) = (&scopes[s], &keys[k as usize]);
        match rng.below(16) {
            // begin with one of two payloads, sometimes already expired
            0..=6 => {
                let f = rng.below(2);
                let short = rng.below(6) == 0;
                let token = ClaimToken::new();
                let (lease, ttl) = if short {
                    (Duration::ZERO, Duration::ZERO)
                } else {
                    (LONG, LONG)
                };
                let answer = begin(&store, scope, key, &fp(f), token, lease, ttl).await;
                let expected = match model.get(&(s, k)) {
                    None => Some(1),
                    Some(m) if m.expired => Some(m.fence + 1),
                    Some(m) if m.fingerprint != f => {
                        assert_eq!(answer, Begin::KeyReused, "step {step}");
                        None
                    }
                    Some(m) => {
                        match m.outcome {
                            Some(o) => assert_eq!(answer, Begin::Replay(outcome(o)), "step {step}"),
                            None => assert!(
                                matches!(answer, Begin::InProgress { .. }),
                                "step {step}: {answer:?}"
                            ),
                        }
                        None
                    }
                };
                if let Some(fence) = expected {
                    match answer {
                        Begin::Claimed(c) => assert_eq!(c.fence, fence, "step {step}"),
                        other => panic!("step {step}: expected a claim, got {other:?}"),
                    }
                    model.insert(
                        (s, k),
                        Model {
                            fingerprint: f,
                            token,
                            fence,
                            outcome: None,
                            expired: short,
                        },
                    );
                }
            }
            // complete / renew / release the current claim, or a stale one
            7..=12 => {
                let Some(m) = model.get(&(s, k)).cloned() else {
                    continue;
                };
                let stale = rng.below(5) == 0;
                let claim = Claim {
                    scope: scope.clone(),
                    key: key.clone(),
                    fence: m.fence,
                    token: if stale { ClaimToken::new() } else { m.token },
                    lease: LONG,
                    ttl: LONG,
                };
                let in_progress = m.outcome.is_none();
                let op = rng.below(3);
                let done = match op {
                    0 => store.complete(&claim, &outcome(step)).await,
                    1 => store.renew(&claim).await,
                    _ => store.release(&claim).await,
                };
                if stale || !in_progress {
                    assert!(
                        matches!(done, Err(Error::LeaseLost)),
                        "step {step}: {done:?}"
                    );
                } else {
                    done.unwrap_or_else(|e| panic!("step {step}: {e:?}"));
                    match op {
                        0 => {
                            let e = model.get_mut(&(s, k)).unwrap();
                            e.outcome = Some(step);
                            // A completion sets a new (long) ttl.
                            e.expired = false;
                        }
                        1 => {
                            // A renewal with a long lease makes it live.
                            model.get_mut(&(s, k)).unwrap().expired = false;
                        }
                        _ => {
                            model.remove(&(s, k));
                        }
                    }
                }
            }
            13 => {
                let removed = store.forget(scope, key).await.unwrap();
                assert_eq!(removed, model.remove(&(s, k)).is_some(), "step {step}");
            }
            14 => {
                if rng.below(20) == 0 {
                    let batch = 1 + rng.below(40) as usize;
                    let purged = store.purge_expired(batch).await.unwrap();
                    let before = model.len();
                    model.retain(|_, m| !m.expired);
                    assert_eq!(purged, (before - model.len()) as u64, "step {step}");
                }
            }
            _ => {
                let r = store.get(scope, key).await.unwrap();
                check(&model, s, k, scope, key, r.as_ref(), step);
            }
        }
        assert_eq!(store.len(), model.len(), "step {step}");
        if step % 5_000 == 0 {
            for (s, scope) in scopes.iter().enumerate() {
                for (k, key) in keys.iter().enumerate() {
                    let r = store.get(scope, key).await.unwrap();
                    check(&model, s, k as u64, scope, key, r.as_ref(), step);
                }
            }
        }
    }
}

fn check(
    model: &HashMap<(usize, u64), Model>,
    s: usize,
    k: u64,
    scope: &Scope,
    key: &Key,
    r: Option<&idem::record::Record>,
    step: u64,
) {
    match (model.get(&(s, k)), r) {
        (None, None) => {}
        (Some(m), Some(r)) => {
            assert_eq!(r.scope, *scope, "step {step}");
            assert_eq!(r.key, *key, "step {step}");
            assert_eq!(r.fingerprint, fp(m.fingerprint), "step {step}");
            assert_eq!(r.token, Some(m.token), "step {step}");
            assert_eq!(r.fence, m.fence, "step {step}");
            assert_eq!(r.outcome, m.outcome.map(outcome), "step {step}");
            assert_eq!(
                r.state,
                if m.outcome.is_some() {
                    State::Completed
                } else {
                    State::InProgress
                },
                "step {step}"
            );
        }
        (m, r) => panic!("step {step}: ({s},{k}) model {m:?} store {r:?}"),
    }
}

/// Enough keys that 32-bit hash collisions are expected (about one per
/// 65,536 keys squared over two: ~2 here), each with its own payload and
/// outcome; then every other one is removed (by release, forget or purge,
/// in turn) and every key checked: no key finds another's record.
#[tokio::test]
async fn many_keys_never_find_another_keys_record() {
    const N: u64 = 90_000;
    let store = MemoryStore::new();
    let scope = Scope::new("memory.many");
    let keys: Vec<Key> = (0..N).map(|i| key(&format!("{i:x}"))).collect();
    let mut claims = Vec::with_capacity(N as usize);
    for (i, k) in keys.iter().enumerate() {
        if i % 6 == 5 {
            expired_record(&store, &scope, k).await;
            claims.push(None);
        } else {
            let c = claim(&store, &scope, k, &fp(i as u64)).await;
            claims.push(Some(c));
        }
    }
    for (i, c) in claims.iter().enumerate() {
        if let Some(c) = c {
            if i % 2 == 0 {
                store.complete(c, &outcome(i as u64)).await.unwrap();
            }
        }
    }
    // Remove: i % 6 == 1 released, 3 forgotten, 5 purged (expired).
    for (i, c) in claims.iter().enumerate() {
        match i % 6 {
            1 => store.release(c.as_ref().unwrap()).await.unwrap(),
            3 => assert!(store.forget(&scope, &keys[i]).await.unwrap()),
            _ => {}
        }
    }
    assert_eq!(store.purge_expired(777).await.unwrap(), N / 6);
    assert_eq!(store.len() as u64, N / 2);
    for (i, k) in keys.iter().enumerate() {
        let r = store.get(&scope, k).await.unwrap();
        if i % 2 == 1 {
            assert!(r.is_none(), "{i}: {r:?}");
            continue;
        }
        let r = r.unwrap_or_else(|| panic!("{i} lost"));
        assert_eq!(r.key, *k);
        assert_eq!(r.fingerprint, fp(i as u64));
        assert_eq!(r.outcome, Some(outcome(i as u64)));
        // And the claim path agrees: a replay of its own outcome.
        let again = begin(
            &store,
            &scope,
            k,
            &fp(i as u64),
            ClaimToken::new(),
            LONG,
            LONG,
        )
        .await;
        assert_eq!(again, Begin::Replay(outcome(i as u64)), "{i}");
    }
    // The removed keys are free: claimed afresh.
    for (i, k) in keys
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 2 == 1)
        .take(5_000)
    {
        let c = claim(&store, &scope, k, &fp(7)).await;
        assert_eq!(c.fence, 1, "{i}");
    }
}

// ---------------------------------------------------------------------------
// Concurrency
// ---------------------------------------------------------------------------

/// 64 tasks on one key through `run`: one body, 64 equal answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_tasks_one_key_run_once() {
    let store = MemoryStore::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let policy = Policy::new().lease(Duration::from_secs(30)).ttl(LONG);
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let (store, runs) = (store.clone(), runs.clone());
        tasks.push(tokio::spawn(async move {
            run::<_, u64, Error, _, _>(
                &store,
                Call::new("memory.one", "k", &1u64).with_policy(policy),
                async move {
                    let n = runs.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    Ok(100 + n as u64)
                },
            )
            .await
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap().unwrap(), 100);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Many tasks over 200 keys: claims, completions, releases, forgets of
/// other keys and purges of expired filler records interleave. Invariant:
/// no two holders of one key at once (a per-key in-flight counter), and a
/// completed key replays its own outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_keys_with_removals_never_double_hold() {
    let store = MemoryStore::new();
    let scope = Scope::new("memory.conc");
    let filler = Scope::new("memory.filler");
    const KEYS: usize = 200;
    let holding: Arc<Vec<AtomicUsize>> = Arc::new((0..KEYS).map(|_| AtomicUsize::new(0)).collect());
    let mut tasks = Vec::new();
    for t in 0..16u64 {
        let (store, scope, filler, holding) = (
            store.clone(),
            scope.clone(),
            filler.clone(),
            holding.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng(0x1234_5678 + t * 7919);
            for i in 0..1_500u64 {
                let k = rng.below(KEYS as u64) as usize;
                let kk = key(&format!("c{k}"));
                match rng.below(10) {
                    0 => {
                        // filler records: expired at once, forgotten or purged
                        let fk = key(&format!("f{t}-{i}"));
                        expired_record(&store, &filler, &fk).await;
                        if rng.below(2) == 0 {
                            store.forget(&filler, &fk).await.unwrap();
                        }
                    }
                    1 => {
                        store
                            .purge_expired(1 + rng.below(8) as usize)
                            .await
                            .unwrap();
                    }
                    _ => {
                        let f = fp(k as u64);
                        let answer =
                            begin(&store, &scope, &kk, &f, ClaimToken::new(), LONG, LONG).await;
                        match answer {
                            Begin::Claimed(c) => {
                                let before = holding[k].fetch_add(1, Ordering::SeqCst);
                                assert_eq!(before, 0, "two holders of c{k}");
                                tokio::task::yield_now().await;
                                holding[k].fetch_sub(1, Ordering::SeqCst);
                                if rng.below(2) == 0 {
                                    store.release(&c).await.unwrap();
                                } else {
                                    store.complete(&c, &outcome(k as u64)).await.unwrap();
                                }
                            }
                            Begin::Replay(o) => assert_eq!(o, outcome(k as u64)),
                            Begin::InProgress { .. } => {}
                            Begin::KeyReused => panic!("c{k}: key reused with its own payload"),
                        }
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    for k in 0..KEYS {
        if let Some(r) = store.get(&scope, &key(&format!("c{k}"))).await.unwrap() {
            assert_eq!(r.fingerprint, fp(k as u64));
            assert_eq!(r.state, State::Completed);
            assert_eq!(r.outcome, Some(outcome(k as u64)));
        }
    }
    store.purge_expired(1000).await.unwrap();
    assert!(store.len() <= KEYS);
}

/// `forget` racing claims of the same key: each claim granted is either
/// the only live one or was forgotten before the next was granted; the
/// store never holds two records of the key, and a forgotten claim can no
/// longer complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forget_racing_claims() {
    let store = MemoryStore::new();
    let scope = Scope::new("memory.forget");
    let k = key("k");
    let granted = Arc::new(std::sync::Mutex::new(Vec::<Claim>::new()));
    let mut tasks = Vec::new();
    for t in 0..8 {
        let (store, scope, k, granted) = (store.clone(), scope.clone(), k.clone(), granted.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..500 {
                if t % 4 == 0 {
                    store.forget(&scope, &k).await.unwrap();
                    // Some unrelated records, so positions move.
                    let other = key(&format!("o{t}"));
                    let _ = begin(
                        &store,
                        &scope,
                        &other,
                        &fp(9),
                        ClaimToken::new(),
                        LONG,
                        LONG,
                    )
                    .await;
                    store.forget(&scope, &other).await.unwrap();
                } else if let Begin::Claimed(c) =
                    begin(&store, &scope, &k, &fp(1), ClaimToken::new(), LONG, LONG).await
                {
                    granted.lock().unwrap().push(c);
                }
                tokio::task::yield_now().await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let granted = granted.lock().unwrap().clone();
    // Only the last granted claim (if its record survived) may complete.
    let current = store.get(&scope, &k).await.unwrap();
    let mut completed = 0;
    for c in &granted {
        if store.complete(c, &outcome(1)).await.is_ok() {
            completed += 1;
            assert_eq!(current.as_ref().unwrap().token, Some(c.token));
        }
    }
    assert!(completed <= 1);
    assert!(store.len() <= 1);
    assert!(
        granted.iter().all(|c| c.fence == 1),
        "every claim after a forget is fresh"
    );
}

// ---------------------------------------------------------------------------
// Clock
// ---------------------------------------------------------------------------

/// The store's times are monotonic across calls and near the wall clock.
#[tokio::test]
async fn clock_is_monotonic_and_near_the_wall_clock() {
    let store = MemoryStore::new();
    let scope = Scope::new("memory.clock");
    let mut last = 0;
    for i in 0..200 {
        let k = key(&format!("t{i}"));
        let c = claim(&store, &scope, &k, &fp(1)).await;
        let r = store.get(&scope, &k).await.unwrap().unwrap();
        assert!(r.created_at >= last);
        last = r.created_at;
        assert_eq!(r.lease_until, Some(r.created_at + LONG.as_millis() as i64));
        store.release(&c).await.unwrap();
    }
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    assert!((wall - last).abs() < 2_000, "{wall} vs {last}");
}

/// Fills `store` with `n` expired records in a scope of their own.
async fn expired_filler(store: &MemoryStore, n: usize) {
    let filler = Scope::new("memory.stall.filler");
    for i in 0..n {
        expired_record(store, &filler, &key(&format!("f{i}"))).await;
    }
}

/// Starts a purge of everything on another thread, returns once it has
/// surely taken the records' lock (it holds it for its whole single batch).
fn purge_on_a_thread(store: &MemoryStore) -> std::thread::JoinHandle<Duration> {
    let store = store.clone();
    let handle = std::thread::spawn(move || {
        let started = Instant::now();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(store.purge_expired(usize::MAX)).unwrap();
        started.elapsed()
    });
    std::thread::sleep(Duration::from_millis(30));
    handle
}

/// A claim that waited for the records' lock longer than its lease still
/// gets its whole lease, counted from when it is written: a duplicate
/// arriving right after it finds the key held. (Counted from a clock read
/// before the wait, the lease had lapsed when it was granted, and the
/// duplicate took the key over: two attempts told "run the body".)
///
/// The wait here is a purge of a big batch of expired records (one lock for
/// the whole batch), which is how a store of many records is kept tidy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_waited_for_the_lock_gets_its_whole_lease() {
    let store = MemoryStore::new();
    expired_filler(&store, 150_000).await;
    let scope = Scope::new("memory.stall");
    let k = key("victim");
    let lease = Duration::from_millis(60);

    let purge = purge_on_a_thread(&store);
    let asked = Instant::now();
    let first = begin(&store, &scope, &k, &fp(1), ClaimToken::new(), lease, LONG).await;
    let waited = asked.elapsed();
    let Begin::Claimed(first) = first else {
        panic!("{first:?}")
    };
    assert!(
        waited > lease,
        "the claim waited {waited:?}, within its lease: nothing was tried"
    );
    let purge_took = purge.join().unwrap();
    // The duplicate, at once: the first claim was granted a moment ago
    // with a lease of 60 ms, so the key is held.
    let second = begin(&store, &scope, &k, &fp(1), ClaimToken::new(), lease, LONG).await;
    assert!(
        matches!(second, Begin::InProgress { .. }),
        "a claim granted {:?} ago with a lease of {lease:?} was taken over (fence {}): \
         the first claim waited {waited:?} for the lock (purge took {purge_took:?}); \
         second answer: {second:?}",
        asked.elapsed() - waited,
        first.fence,
    );
}

/// The same for a renewal: one that waited for the lock longer than its
/// lease extends the lease from when it is written, so no duplicate takes
/// over right after the owner was told its lease is extended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_that_waited_for_the_lock_gets_its_whole_lease() {
    let store = MemoryStore::new();
    let scope = Scope::new("memory.stall-renew");
    let k = key("victim");
    let lease = Duration::from_millis(60);
    expired_filler(&store, 150_000).await;
    // Claimed with a long lease, renewals ask for 60 ms.
    let claim0 = claim(&store, &scope, &k, &fp(1)).await;
    let claim = Claim { lease, ..claim0 };

    let purge = purge_on_a_thread(&store);
    let asked = Instant::now();
    store.renew(&claim).await.unwrap();
    let waited = asked.elapsed();
    assert!(
        waited > lease,
        "the renewal waited {waited:?}, within its lease: nothing was tried"
    );
    let purge_took = purge.join().unwrap();
    let second = begin(&store, &scope, &k, &fp(1), ClaimToken::new(), lease, LONG).await;
    assert!(
        matches!(second, Begin::InProgress { .. }),
        "renewed (Ok) {:?} ago for {lease:?}, yet taken over: the renewal waited {waited:?} \
         (purge took {purge_took:?}); second answer: {second:?}",
        asked.elapsed() - waited,
    );
}
