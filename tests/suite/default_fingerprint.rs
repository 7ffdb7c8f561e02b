//! The default fingerprint of `#[idempotent]` is the canonical JSON of the
//! tuple of references to its arguments (but `self` and the store), or of
//! `()` without any: checking each argument where it is declared does not
//! change it, so records written by earlier versions are still matched.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};

use idem::{idempotent, Error, Fingerprint, Key, MemoryStore, Scope, Store};
use serde::{Deserialize, Serialize};

#[derive(Serialize)]
struct Line {
    sku: String,
    quantity: u32,
}

#[idempotent(key = key, store = store, scope = "orders.place")]
async fn place(
    store: &MemoryStore,
    key: &str,
    lines: Vec<Line>,
    notes: BTreeMap<String, f64>,
    gift: Option<bool>,
) -> Result<usize, Error> {
    Ok(lines.len() + notes.len() + usize::from(gift.is_some()))
}

#[idempotent(key = key, store = store, scope = "orders.ping")]
async fn ping(store: &MemoryStore, key: u64) -> Result<(), Error> {
    Ok(())
}

struct Nightly {
    store: MemoryStore,
    date: String,
}

impl Nightly {
    #[idempotent(key = self.date, store = self.store, scope = "jobs.nightly")]
    async fn run(&self) -> Result<(), Error> {
        Ok(())
    }
}

async fn stored_fingerprint(store: &MemoryStore, scope: &str, key: &str) -> Fingerprint {
    let record = store
        .get(&Scope::new(scope), &Key::new(key).unwrap())
        .await
        .unwrap()
        .expect("a record");
    record.fingerprint
}

#[tokio::test]
async fn the_default_fingerprint_is_that_of_the_tuple_of_arguments() {
    let store = MemoryStore::new();
    let lines = || {
        vec![Line {
            sku: "w-1".into(),
            quantity: 2,
        }]
    };
    let notes = || BTreeMap::from([("z".to_owned(), 1.5), ("a".to_owned(), -0.0)]);
    place(&store, "o-1", lines(), notes(), Some(true))
        .await
        .unwrap();
    let expected = Fingerprint::of(&(&"o-1", &lines(), &notes(), &Some(true))).unwrap();
    assert_eq!(
        stored_fingerprint(&store, "orders.place", "o-1").await,
        expected
    );
}

#[tokio::test]
async fn one_argument_is_a_tuple_of_one() {
    let store = MemoryStore::new();
    ping(&store, 7).await.unwrap();
    let expected = Fingerprint::of(&(&7_u64,)).unwrap();
    assert_eq!(
        stored_fingerprint(&store, "orders.ping", "7").await,
        expected
    );
}

#[tokio::test]
async fn without_arguments_it_is_that_of_the_unit_value() {
    let nightly = Nightly {
        store: MemoryStore::new(),
        date: "2026-05-01".into(),
    };
    nightly.run().await.unwrap();
    let expected = Fingerprint::of(&()).unwrap();
    let stored = stored_fingerprint(&nightly.store, "jobs.nightly", "2026-05-01").await;
    assert_eq!(stored, expected);
}

/// A command holding sets, written with `idem::fingerprint::unordered`:
/// its items in canonical order, whatever order the set iterates in.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct GrantCommand {
    idempotency_token: String,
    account: String,
    #[serde(serialize_with = "idem::fingerprint::unordered")]
    permissions: HashSet<String>,
    /// Limits in wei: past `u64`, fingerprinted in their marked form.
    #[serde(serialize_with = "idem::fingerprint::unordered")]
    limits_wei: HashSet<u128>,
}

struct Grants {
    store: MemoryStore,
    runs: AtomicUsize,
}

impl Grants {
    #[idempotent(key = cmd.idempotency_token, store = self.store, scope = "grants.grant")]
    async fn grant(&self, cmd: GrantCommand) -> Result<usize, Error> {
        Ok(self.runs.fetch_add(1, Ordering::SeqCst) + 1)
    }
}

const PERMISSIONS: [&str; 24] = [
    "read", "write", "admin", "billing", "refund", "export", "import", "invite", "delete", "audit",
    "support", "charge", "payout", "dispute", "report", "webhook", "api", "sso", "mfa", "team",
    "owner", "viewer", "editor", "finance",
];

/// The same command, as a retry builds it again: each `HashSet` made anew
/// has a hasher of its own, hence its own iteration order.
fn grant_command() -> GrantCommand {
    GrantCommand {
        idempotency_token: "grant-1".into(),
        account: "acct-7".into(),
        permissions: PERMISSIONS.iter().map(|p| p.to_string()).collect(),
        limits_wei: (1..=16_u128).map(|n| n * 10_u128.pow(20)).collect(),
    }
}

/// Two equal commands whose sets iterate in different orders.
fn equal_commands_in_other_orders() -> (GrantCommand, GrantCommand) {
    let first = grant_command();
    let order = |c: &GrantCommand| {
        (
            c.permissions.iter().cloned().collect::<Vec<_>>(),
            c.limits_wei.iter().copied().collect::<Vec<_>>(),
        )
    };
    for _ in 0..64 {
        let retry = grant_command();
        if order(&first).0 != order(&retry).0 && order(&first).1 != order(&retry).1 {
            assert_eq!(first, retry, "the same command");
            return (first, retry);
        }
    }
    panic!("64 fresh HashSets iterated in one order");
}

/// An equal retry of a command holding `HashSet`s is replayed: the sets
/// are written sorted, so both calls have one fingerprint (unannotated, a
/// `HashSet` serializes in its hash order and the retry failed with
/// `KeyReused`). A command with another set is still `KeyReused`.
#[tokio::test]
async fn an_equal_retry_with_hash_sets_written_unordered_is_replayed() {
    let grants = Grants {
        store: MemoryStore::new(),
        runs: AtomicUsize::new(0),
    };
    let (first, retry) = equal_commands_in_other_orders();
    assert_eq!(
        Fingerprint::of(&first).unwrap(),
        Fingerprint::of(&retry).unwrap()
    );
    assert_eq!(grants.grant(first).await.unwrap(), 1);
    let replay = grants.grant(retry).await;
    assert!(matches!(replay, Ok(1)), "an equal retry: {replay:?}");
    let mut other = grant_command();
    other.limits_wei.insert(u128::MAX);
    assert!(matches!(grants.grant(other).await, Err(Error::KeyReused)));
    assert_eq!(grants.runs.load(Ordering::SeqCst), 1);
}
