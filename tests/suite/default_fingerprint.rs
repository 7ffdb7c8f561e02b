//! The default fingerprint of `#[idempotent]` is the canonical JSON of the
//! tuple of references to its arguments (but `self` and the store), or of
//! `()` without any: checking each argument where it is declared does not
//! change it, so records written by earlier versions are still matched.

use std::collections::BTreeMap;

use idem::{idempotent, Error, Fingerprint, Key, MemoryStore, Scope, Store};
use serde::Serialize;

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
