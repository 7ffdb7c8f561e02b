//! The conformance cases of claim and replay: a key runs once and
//! replays, its payload is checked, errors are released or replayed,
//! scopes keep keys apart, invalid keys are refused.

use std::collections::HashMap;
use std::time::Duration;

use serde::Serialize;

use super::support::{call, charge, fresh_key, pay, payment, Receipt, Runs, TestError};
use crate::engine::{run, Call};
use crate::policy::Policy;
use crate::store::Store;
use idem_core::error::Error;
use idem_core::key::{Key, Scope};
use idem_core::record::State;

/// The first call with a key runs the body and stores its result; every
/// later call with the key and the same payload gets that result back
/// without running the body. The record is completed, with fence 1.
pub async fn execute_once_then_replay<S: Store>(store: S) {
    let key = fresh_key("once");
    let runs = Runs::default();
    let first = pay(&store, &key, &charge(100), Policy::new(), &runs)
        .await
        .unwrap();
    for _ in 0..3 {
        let again = pay(&store, &key, &charge(100), Policy::new(), &runs)
            .await
            .unwrap();
        assert_eq!(again, first);
    }
    assert_eq!(runs.count(), 1);
    let (scope, k) = payment(&key);
    let record = store
        .get(&scope, &k)
        .await
        .unwrap()
        .expect("the record is stored");
    assert_eq!(record.state, State::Completed);
    assert_eq!(record.fence, 1);
    assert!(record.outcome.is_some());
}

/// The payload's fingerprint is that of its canonical JSON: the same value
/// built with members in another order replays, another value is
/// [`Error::KeyReused`].
pub async fn fingerprint_ignores_field_order<S: Store>(store: S) {
    #[derive(Serialize)]
    struct AmountFirst {
        amount: u64,
        currency: &'static str,
        meta: HashMap<&'static str, u32>,
    }
    #[derive(Serialize)]
    struct CurrencyFirst {
        currency: &'static str,
        meta: Vec<(&'static str, u32)>,
        amount: u64,
    }
    let key = fresh_key("order");
    let runs = Runs::default();
    let a = AmountFirst {
        amount: 5,
        currency: "EUR",
        meta: HashMap::from([("z", 1), ("a", 2), ("m", 3)]),
    };
    // The same JSON object, built with members in another order.
    let b_json =
        serde_json::json!({"meta": {"m": 3, "z": 1, "a": 2}, "currency": "EUR", "amount": 5});
    let op = |payload: Call| {
        let runs = runs.clone();
        let store = &store;
        async move {
            run(
                store,
                payload,
                async move { Ok::<_, TestError>(runs.next()) },
            )
            .await
        }
    };
    let first = op(Call::new("op.order", key.as_str(), &a)).await.unwrap();
    let second = op(Call::new("op.order", key.as_str(), &b_json))
        .await
        .unwrap();
    assert_eq!((first, second, runs.count()), (1, 1, 1));
    // A different value is a different payload.
    let c = CurrencyFirst {
        currency: "EUR",
        meta: vec![("m", 3)],
        amount: 5,
    };
    let err = op(Call::new("op.order", key.as_str(), &c))
        .await
        .unwrap_err();
    assert!(matches!(err.idem(), Some(Error::KeyReused)), "{err:?}");
}

/// A key sent again with another payload is [`Error::KeyReused`], without
/// running the body; the original payload still replays.
pub async fn key_reused_with_other_payload<S: Store>(store: S) {
    let key = fresh_key("reuse");
    let runs = Runs::default();
    pay(&store, &key, &charge(100), Policy::new(), &runs)
        .await
        .unwrap();
    let err = pay(&store, &key, &charge(999), Policy::new(), &runs)
        .await
        .unwrap_err();
    assert!(matches!(err.idem(), Some(Error::KeyReused)), "{err:?}");
    assert_eq!(runs.count(), 1, "the body must not run for a reused key");
    // The original still replays.
    let again = pay(&store, &key, &charge(100), Policy::new(), &runs)
        .await
        .unwrap();
    assert_eq!(again.amount, 100);
    assert_eq!(runs.count(), 1);
}

/// A body error that is not replayable releases the key (no record is
/// left): the retry runs the body again, and its result is then replayed.
pub async fn transient_error_released_then_retried<S: Store>(store: S) {
    let key = fresh_key("transient");
    let runs = Runs::default();
    let payload = charge(50);
    let attempt = |fail: bool| {
        let runs = runs.clone();
        run(
            &store,
            call("op.transient", &key, &payload, Policy::new()),
            async move {
                let n = runs.next();
                if fail {
                    Err(TestError::Transient)
                } else {
                    Ok(Receipt { run: n, amount: 50 })
                }
            },
        )
    };
    assert_eq!(attempt(true).await.unwrap_err(), TestError::Transient);
    assert!(store
        .get(
            &Scope::new("op.transient"),
            &Key::new(key.as_str()).unwrap()
        )
        .await
        .unwrap()
        .is_none());
    let ok = attempt(false).await.unwrap();
    assert_eq!(ok.run, 2);
    assert_eq!(attempt(false).await.unwrap(), ok);
    assert_eq!(runs.count(), 2);
}

/// A body error marked replayable (through
/// [`Call::replaying`](crate::engine::Call::replaying)) is stored and
/// replayed like a result: the body ran once.
pub async fn replayable_error_replayed<S: Store>(store: S) {
    let key = fresh_key("declined");
    let runs = Runs::default();
    let payload = charge(10);
    let attempt = || {
        let runs = runs.clone();
        crate::engine::run(
            &store,
            call("op.declined", &key, &payload, Policy::new())
                .replaying(|e: &TestError| matches!(e, TestError::Declined(_))),
            async move {
                runs.next();
                Err::<Receipt, _>(TestError::Declined("card declined".into()))
            },
        )
    };
    for _ in 0..3 {
        assert_eq!(
            attempt().await.unwrap_err(),
            TestError::Declined("card declined".into())
        );
    }
    assert_eq!(runs.count(), 1);
}

/// A bound on waiting too long to represent as an instant (`Duration::MAX`)
/// means no bound; it never panics.
pub async fn unbounded_wait_is_accepted<S: Store>(store: S) {
    let key = fresh_key("maxwait");
    let runs = Runs::default();
    let policy = Policy::new().wait(Duration::MAX);
    let first = pay(&store, &key, &charge(4), policy, &runs).await.unwrap();
    let again = pay(&store, &key, &charge(4), policy, &runs).await.unwrap();
    assert_eq!(first, again);
    assert_eq!(runs.count(), 1);
}

/// One key in different scopes, and in one scope with different
/// principals, names different records.
pub async fn scopes_do_not_collide<S: Store>(store: S) {
    let key = fresh_key("scoped");
    let runs = Runs::default();
    let payload = charge(1);
    let scopes = [
        Scope::new("orders.create"),
        Scope::new("refunds.create"),
        Scope::new("orders.create").with_principal("tenant-a"),
        Scope::new("orders.create").with_principal("tenant-b"),
    ];
    let mut results = Vec::new();
    for scope in &scopes {
        for _ in 0..2 {
            let r = run(&store, Call::new(scope, key.as_str(), &payload), async {
                Ok::<_, TestError>(runs.next())
            })
            .await
            .unwrap();
            results.push(r);
        }
    }
    assert_eq!(results, vec![1, 1, 2, 2, 3, 3, 4, 4]);
}

/// Empty, too long and non-visible-ASCII keys are [`Error::InvalidKey`],
/// before the body could run.
pub async fn invalid_keys_rejected<S: Store>(store: S) {
    let runs = Runs::default();
    let too_long = "k".repeat(256);
    for bad in ["", "has space", "tab\t", "naïve", too_long.as_str()] {
        let err = pay(&store, bad, &charge(1), Policy::new(), &runs)
            .await
            .unwrap_err();
        assert!(
            matches!(err.idem(), Some(Error::InvalidKey(_))),
            "{bad:?}: {err:?}"
        );
    }
    assert_eq!(runs.count(), 0);
}
