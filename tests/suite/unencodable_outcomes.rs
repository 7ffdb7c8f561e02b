//! A result that its codec cannot encode still ends the key's first
//! execution: the body ran (a card was charged), so a retry must not run
//! it again. The caller that ran it gets its result; every retry, and every
//! duplicate that waited for it, gets [`Error::Unrecorded`], on every store.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use idem::{run, Call, Error, Policy, Store};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

const SCOPE: &str = "unencodable_outcomes.charge";

/// A value whose serialization always fails (a map with non-string keys,
/// a float that is not finite in a strict codec, a bug in a hand-written
/// `Serialize`).
#[derive(Debug, PartialEq)]
struct Receipt(u32);

impl Serialize for Receipt {
    fn serialize<S: Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
        Err(serde::ser::Error::custom("a receipt cannot be encoded"))
    }
}

impl<'de> Deserialize<'de> for Receipt {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        u32::deserialize(deserializer).map(Receipt)
    }
}

/// A body's error that is replayable but cannot be encoded either.
#[derive(Debug, PartialEq)]
enum Fail {
    Declined,
    Idem(String),
}

impl From<Error> for Fail {
    fn from(err: Error) -> Self {
        Fail::Idem(format!("{err:?}"))
    }
}

impl Serialize for Fail {
    fn serialize<S: Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
        Err(serde::ser::Error::custom("a decline cannot be encoded"))
    }
}

impl<'de> Deserialize<'de> for Fail {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Fail::Idem)
    }
}

fn call(key: &str) -> Call {
    Call::new(SCOPE, key, &"pay 10").with_policy(
        Policy::new()
            .wait(Duration::from_secs(20))
            .lease(Duration::from_secs(30)),
    )
}

fn unrecorded(got: &Result<Receipt, Error>) -> bool {
    matches!(got, Err(Error::Unrecorded(_)))
}

/// The first call gets its value; a retry runs nothing and gets
/// `Unrecorded`, which is final.
async fn an_unencodable_value_is_not_run_again<S: Store>(store: S) {
    let key = common::servers::unique_table("value");
    let runs = common::Runs::default();
    let body = |runs: common::Runs| async move {
        runs.next();
        Ok::<_, Error>(Receipt(7))
    };
    let first = run(&store, call(&key), body(runs.clone())).await;
    assert_eq!(first.unwrap(), Receipt(7));
    for _ in 0..3 {
        let retry = run(&store, call(&key), body(runs.clone())).await;
        assert!(unrecorded(&retry), "a retry got {retry:?}");
        let err = retry.unwrap_err();
        assert!(!err.is_retryable(), "{err} says a retry may succeed");
    }
    assert_eq!(runs.count(), 1, "the body ran again");
}

/// The same for a replayable error whose encoding fails.
async fn an_unencodable_replayable_error_is_not_run_again<S: Store>(store: S) {
    let key = common::servers::unique_table("error");
    let runs = common::Runs::default();
    let attempt = |runs: common::Runs| {
        let call = call(&key).replaying(|err: &Fail| *err == Fail::Declined);
        let store = &store;
        async move {
            run(store, call, async move {
                runs.next();
                Err::<u32, Fail>(Fail::Declined)
            })
            .await
        }
    };
    assert_eq!(attempt(runs.clone()).await, Err(Fail::Declined));
    let retry = attempt(runs.clone()).await;
    match retry {
        Err(Fail::Idem(err)) if err.starts_with("Unrecorded") => {}
        other => panic!("a retry got {other:?}"),
    }
    assert_eq!(runs.count(), 1, "the body ran again");
}

/// Duplicates that wait for the first call are answered `Unrecorded` as
/// it ends; none runs the body.
async fn waiting_duplicates_are_not_run<S: Store + 'static>(store: S) {
    let store = Arc::new(store);
    let key = common::servers::unique_table("racing");
    let runs = common::Runs::default();
    let tasks: Vec<_> = (0..12)
        .map(|_| {
            let (store, key, runs) = (store.clone(), key.clone(), runs.clone());
            tokio::spawn(async move {
                run(&*store, call(&key), async move {
                    runs.next();
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Ok::<_, Error>(Receipt(9))
                })
                .await
            })
        })
        .collect();
    let mut values = 0;
    for task in tasks {
        match task.await.unwrap() {
            Ok(receipt) => {
                assert_eq!(receipt, Receipt(9));
                values += 1;
            }
            other => assert!(unrecorded(&other), "a duplicate got {other:?}"),
        }
    }
    assert_eq!(runs.count(), 1, "the body ran more than once");
    assert_eq!(values, 1, "the caller that ran the body gets its value");
}

/// A replayable error that encodes.
#[derive(Debug, Serialize, Deserialize)]
enum Refusal {
    Declined(String),
    #[serde(skip)]
    Idem(Error),
}

impl From<Error> for Refusal {
    fn from(err: Error) -> Self {
        Refusal::Idem(err)
    }
}

impl PartialEq for Refusal {
    fn eq(&self, other: &Self) -> bool {
        matches!((self, other), (Refusal::Declined(a), Refusal::Declined(b)) if a == b)
    }
}

/// An outcome longer than the call's `max_outcome` is never sent to the
/// store (where it could be refused for ever, each refusal taken for a
/// passing failure, and the key kept in progress): the caller gets its
/// value at once, and every retry `Unrecorded`, in record mode.
async fn an_outcome_over_the_limit_is_not_run_again<S: Store>(store: S) {
    let key = common::servers::unique_table("limit");
    let runs = common::Runs::default();
    let large = || "z".repeat(Call::DEFAULT_MAX_OUTCOME + 1);
    let attempt = |runs: common::Runs| {
        run(&store, call(&key), async move {
            runs.next();
            Ok::<_, Error>(large())
        })
    };
    let first = tokio::time::timeout(Duration::from_secs(10), attempt(runs.clone()))
        .await
        .expect("the first call returns");
    assert_eq!(first.unwrap().len(), Call::DEFAULT_MAX_OUTCOME + 1);
    let retry = tokio::time::timeout(Duration::from_secs(5), attempt(runs.clone()))
        .await
        .expect("a retry is answered, not held as in progress");
    match retry {
        Err(Error::Unrecorded(why)) => assert!(why.contains("max_outcome"), "{why}"),
        other => panic!("a retry got {:?}", other.map(|v| v.len())),
    }
    assert_eq!(runs.count(), 1, "the body ran again");
    // A limit set on the call applies as well, to replayable errors too.
    let key = common::servers::unique_table("limit-err");
    let declined = |runs: common::Runs| {
        let call = call(&key)
            .max_outcome(8)
            .replaying(|err: &Refusal| matches!(err, Refusal::Declined(_)));
        run(&store, call, async move {
            runs.next();
            Err::<u32, _>(Refusal::Declined("insufficient funds".into()))
        })
    };
    let runs = common::Runs::default();
    assert_eq!(
        declined(runs.clone()).await,
        Err(Refusal::Declined("insufficient funds".into()))
    );
    let retry = declined(runs.clone()).await;
    assert!(
        matches!(&retry, Err(Refusal::Idem(Error::Unrecorded(_)))),
        "{retry:?}"
    );
    assert_eq!(runs.count(), 1, "the body ran again");
}

mod over_the_limit {
    use super::*;

    common::backends!(memory, sqlite_file, postgres, mysql, redis, redis_cluster => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn an_outcome_over_the_limit() {
            let (store, _guard) = backend::store(8).await;
            an_outcome_over_the_limit_is_not_run_again(store).await;
        }
    });
}

common::backends!(memory, sqlite_file, postgres, mysql, redis => {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn unencodable_value() {
        let (store, _guard) = backend::store(8).await;
        an_unencodable_value_is_not_run_again(store).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn unencodable_replayable_error() {
        let (store, _guard) = backend::store(8).await;
        an_unencodable_replayable_error_is_not_run_again(store).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waiting_duplicates() {
        let (store, _guard) = backend::store(8).await;
        waiting_duplicates_are_not_run(store).await;
    }
});

mod transactional {
    use super::*;

    common::backends!(sqlite_file, postgres, mysql => {
        /// In transactional mode the unrecorded answer is written in the
        /// caller's transaction, with the body's own writes: once committed,
        /// a retry gets `Unrecorded` and runs nothing.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn unencodable_value_in_a_transaction() {
            let (store, _guard) = backend::store(8).await;
            let key = common::servers::unique_table("tx");
            let runs = common::Runs::default();
            let mut answers = Vec::new();
            for _ in 0..3 {
                let mut tx = store.pool().begin().await.unwrap();
                let runs = runs.clone();
                let got: Result<Receipt, Error> =
                    idem::run_in_transaction(&store, &mut *tx, call(&key), |conn| async move {
                        runs.next();
                        (Ok(Receipt(3)), conn)
                    })
                    .await;
                tx.commit().await.unwrap();
                answers.push(got);
            }
            assert_eq!(runs.count(), 1, "the body ran again: {answers:?}");
            assert!(matches!(answers[0], Ok(Receipt(3))), "{answers:?}");
            assert!(answers[1..].iter().all(unrecorded), "{answers:?}");
        }

        /// An outcome over the call's limit, in the caller's transaction.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn an_outcome_over_the_limit_in_a_transaction() {
            let (store, _guard) = backend::store(8).await;
            let key = common::servers::unique_table("txlimit");
            let runs = common::Runs::default();
            let mut answers = Vec::new();
            for _ in 0..2 {
                let mut tx = store.pool().begin().await.unwrap();
                let runs = runs.clone();
                let got: Result<String, Error> = idem::run_in_transaction(
                    &store,
                    &mut *tx,
                    call(&key).max_outcome(16),
                    |conn| async move {
                        runs.next();
                        (Ok("a receipt longer than sixteen bytes".to_owned()), conn)
                    },
                )
                .await;
                tx.commit().await.unwrap();
                answers.push(got);
            }
            assert_eq!(runs.count(), 1, "the body ran again: {answers:?}");
            assert!(answers[0].is_ok(), "{answers:?}");
            assert!(
                matches!(&answers[1], Err(Error::Unrecorded(why)) if why.contains("max_outcome")),
                "{answers:?}"
            );
        }
    });
}

/// A value larger than MariaDB's `max_allowed_packet` (16 MiB by default),
/// which the server answers by closing the connection: the caller gets it,
/// retries get `Unrecorded` at once, and nothing runs again, in record
/// mode and in transactional mode.
#[cfg(feature = "mysql")]
mod too_large_for_mariadb {
    use super::*;

    /// Above the engine's default limit, so that the server's own is met.
    fn call(key: &str) -> Call {
        super::call(key).max_outcome(64 << 20)
    }

    fn huge() -> String {
        "x".repeat(17 * 1024 * 1024)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn record_mode() {
        let (store, _guard) = common::backend::mysql::store(4).await;
        let key = common::servers::unique_table("huge");
        let runs = common::Runs::default();
        let attempt = |runs: common::Runs| {
            run(&store, call(&key), async move {
                runs.next();
                Ok::<_, Error>(huge())
            })
        };
        let first = tokio::time::timeout(Duration::from_secs(20), attempt(runs.clone()))
            .await
            .expect("the first call returns");
        assert_eq!(first.unwrap().len(), 17 * 1024 * 1024);
        let retry = tokio::time::timeout(Duration::from_secs(5), attempt(runs.clone()))
            .await
            .expect("a retry is answered, not held as in progress");
        match retry {
            Err(Error::Unrecorded(why)) => assert!(why.contains("max_allowed_packet"), "{why}"),
            other => panic!("a retry got {:?}", other.map(|v| v.len())),
        }
        assert_eq!(runs.count(), 1, "the body ran again");
    }

    /// A large value that fits (7 MiB: its completion, which carries it
    /// twice, is under the 16 MiB limit) is stored and replayed as ever:
    /// the limit is asked, not guessed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_value_that_fits_is_replayed() {
        let (store, _guard) = common::backend::mysql::store(4).await;
        let key = common::servers::unique_table("fits");
        let runs = common::Runs::default();
        let value = || format!("run {}", "y".repeat(7 * 1024 * 1024));
        for _ in 0..2 {
            let runs = runs.clone();
            let got = run(&store, call(&key), async move {
                runs.next();
                Ok::<_, Error>(value())
            })
            .await;
            assert!(
                got.as_ref().is_ok_and(|v| *v == value()),
                "{:?}",
                got.map(|v| v.len())
            );
        }
        assert_eq!(runs.count(), 1, "the body ran again");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn transactional_mode() {
        let (store, _guard) = common::backend::mysql::store(4).await;
        let key = common::servers::unique_table("hugetx");
        let runs = common::Runs::default();
        let mut answers = Vec::new();
        for _ in 0..2 {
            let mut tx = store.pool().begin().await.unwrap();
            let runs = runs.clone();
            let got: Result<String, Error> =
                idem::run_in_transaction(&store, &mut *tx, call(&key), |conn| async move {
                    runs.next();
                    (Ok(huge()), conn)
                })
                .await;
            tx.commit().await.unwrap();
            answers.push(got.map(|v| v.len()));
        }
        assert_eq!(runs.count(), 1, "the body ran again: {answers:?}");
        assert!(
            matches!(answers[0], Ok(n) if n == 17 * 1024 * 1024),
            "{answers:?}"
        );
        assert!(
            matches!(answers[1], Err(Error::Unrecorded(_))),
            "{answers:?}"
        );
    }
}
