//! Every decision is a tracing event and a metrics counter.

use std::sync::{Arc, Mutex};

use idem::{run, Call, Error, MemoryStore, Policy};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::MetricKind;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

/// Collects the `decision` field of every event.
#[derive(Clone, Default)]
struct Decisions(Arc<Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> Layer<S> for Decisions {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        struct Find(Option<String>);
        impl Visit for Find {
            fn record_str(&mut self, field: &Field, value: &str) {
                if field.name() == "decision" {
                    self.0 = Some(value.to_owned());
                }
            }
            fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
                if field.name() == "decision" {
                    self.0 = Some(format!("{value:?}").trim_matches('"').to_owned());
                }
            }
        }
        let mut find = Find(None);
        event.record(&mut find);
        if let Some(d) = find.0 {
            self.0.lock().unwrap().push(d);
        }
    }
}

#[test]
fn decisions_are_traced_and_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let decisions = Decisions::default();
    let subscriber = tracing_subscriber::registry().with(
        decisions
            .clone()
            .with_filter(tracing_subscriber::filter::LevelFilter::DEBUG),
    );

    metrics::with_local_recorder(&recorder, || {
        tracing::subscriber::with_default(subscriber, || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(async {
                    let store = MemoryStore::new();
                    let ok = |payload: u32| {
                        let store = &store;
                        async move {
                            run(store, Call::new("obs.op", "k1", &payload), async {
                                Ok::<_, Error>(payload)
                            })
                            .await
                        }
                    };
                    ok(1).await.unwrap(); // claimed
                    ok(1).await.unwrap(); // replayed
                    assert!(matches!(ok(2).await, Err(Error::KeyReused)));
                    let failing = run(&store, Call::new("obs.op", "k2", &()), async {
                        Err::<u32, _>(Error::Config("boom".into()))
                    });
                    assert!(failing.await.is_err()); // claimed, released
                                                     // A lapsed lease (a claim nobody renews) taken over.
                    let (scope, k3) = (idem::Scope::new("obs.op"), idem::Key::new("k3").unwrap());
                    let fingerprint = idem::Fingerprint::of(&()).unwrap();
                    let stale = idem::store::BeginRequest {
                        scope: &scope,
                        key: &k3,
                        fingerprint: &fingerprint,
                        token: idem::record::ClaimToken::new(),
                        lease: std::time::Duration::from_millis(30),
                        ttl: std::time::Duration::from_secs(60),
                    };
                    use idem::Store;
                    assert!(matches!(
                        store.begin(&stale).await.unwrap(),
                        idem::record::Begin::Claimed(_)
                    ));
                    tokio::time::sleep(std::time::Duration::from_millis(60)).await;
                    let taken = run(
                        &store,
                        Call::new("obs.op", "k3", &()).with_policy(Policy::new().fail_fast()),
                        async { Ok::<_, Error>(1) },
                    )
                    .await;
                    assert_eq!(taken.unwrap(), 1);
                    // A claim lost while its body ran (the record was
                    // deleted under it): the caller still gets its value.
                    let k5 = idem::Key::new("k5").unwrap();
                    let lost = run(&store, Call::new("obs.op", "k5", &()), async {
                        let record = store.get(&scope, &k5).await.unwrap().unwrap();
                        let claim = idem::record::Claim {
                            scope: scope.clone(),
                            key: k5.clone(),
                            fence: record.fence,
                            token: record.token.unwrap(),
                            lease: std::time::Duration::from_secs(30),
                            ttl: std::time::Duration::from_secs(60),
                        };
                        store.release(&claim).await.unwrap();
                        Ok::<_, Error>(7)
                    })
                    .await;
                    assert_eq!(lost.unwrap(), 7);
                    // In progress under fail_fast.
                    let slow = run(&store, Call::new("obs.op", "k4", &()), async {
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        Ok::<_, Error>(0)
                    });
                    let dup = async {
                        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                        run(
                            &store,
                            Call::new("obs.op", "k4", &()).with_policy(Policy::new().fail_fast()),
                            async { Ok::<_, Error>(1) },
                        )
                        .await
                    };
                    let (slow, dup) = tokio::join!(slow, dup);
                    slow.unwrap();
                    assert!(matches!(dup, Err(Error::InProgress { .. })));
                });
        });
    });

    let seen = decisions.0.lock().unwrap().clone();
    for expected in [
        "claimed",
        "replayed",
        "key reused",
        "released",
        "taken over",
        "lease lost",
        "in progress",
    ] {
        assert!(
            seen.iter().any(|d| d == expected),
            "no {expected:?} event in {seen:?}"
        );
    }

    let counters: std::collections::HashMap<String, u64> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| match (key.kind(), value) {
            (MetricKind::Counter, DebugValue::Counter(n)) => Some((key.key().name().to_owned(), n)),
            _ => None,
        })
        .collect();
    // Executions: k1, k2, the k3 takeover, k4, k5.
    assert_eq!(
        counters.get(idem::metrics::EXECUTIONS),
        Some(&5),
        "{counters:?}"
    );
    assert_eq!(counters.get(idem::metrics::REPLAYS), Some(&1));
    assert_eq!(counters.get(idem::metrics::KEY_REUSED), Some(&1));
    assert_eq!(counters.get(idem::metrics::TAKEOVERS), Some(&1));
    assert_eq!(counters.get(idem::metrics::IN_PROGRESS), Some(&1));
    assert_eq!(counters.get(idem::metrics::LEASE_LOST), Some(&1));
}

/// Durable steps are counted by decision (`ran`, `replayed`), and steps in
/// doubt by resolution, each logged.
#[test]
fn steps_and_steps_in_doubt_are_counted() {
    use idem::steps::{self, step, Step};

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let decisions = Decisions::default();
    let messages = Messages::default();
    let subscriber = tracing_subscriber::registry()
        .with(decisions.with_filter(tracing_subscriber::filter::LevelFilter::DEBUG))
        .with(messages.clone());
    metrics::with_local_recorder(&recorder, || {
        tracing::subscriber::with_default(subscriber, || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(async {
                    let store = MemoryStore::new();
                    // `lose`: the step's answer is lost; `fail`: the body
                    // fails after the step.
                    let attempt = |key: &'static str,
                                   kind: &'static str,
                                   lose: bool,
                                   fail: bool| {
                        let store = &store;
                        async move {
                            run(store, Call::new("obs.steps", key, &()), async move {
                                let charge = |_key| async move {
                                    if lose {
                                        return Err(Error::store("lost"));
                                    }
                                    Ok::<_, Error>(5u32)
                                };
                                let charged = match kind {
                                    "refuse" => Step::new("charge").refuse().run(charge).await?,
                                    "reconcile" => {
                                        Step::new("charge")
                                            .reconcile(|_key| async { Ok(Some(6u32)) })
                                            // Nothing is left in flight here.
                                            .settle(std::time::Duration::ZERO)
                                            .run(charge)
                                            .await?
                                    }
                                    _ => step("charge", charge).await?,
                                };
                                if fail {
                                    return Err(Error::Config("after the step".into()));
                                }
                                Ok::<_, Error>(charged)
                            })
                            .await
                        }
                    };
                    // Ran, then replayed by the retry.
                    assert!(attempt("s0", "rerun", false, true).await.is_err());
                    assert_eq!(attempt("s0", "rerun", false, false).await.unwrap(), 5);
                    // In doubt, rerun.
                    assert!(attempt("s1", "rerun", true, false).await.is_err());
                    assert_eq!(attempt("s1", "rerun", false, false).await.unwrap(), 5);
                    // In doubt, refused, then resolved by an operator.
                    assert!(attempt("s2", "refuse", true, false).await.is_err());
                    assert!(matches!(
                        attempt("s2", "refuse", false, false).await,
                        Err(Error::OutcomeUnknown { .. })
                    ));
                    let (scope, s2) =
                        (idem::Scope::new("obs.steps"), idem::Key::new("s2").unwrap());
                    assert!(
                        steps::resolve(&store, &scope, &s2, 0, "charge", Some(&7u32))
                            .await
                            .unwrap()
                    );
                    assert_eq!(attempt("s2", "refuse", false, false).await.unwrap(), 7);
                    // In doubt, reconciled.
                    assert!(attempt("s3", "reconcile", true, false).await.is_err());
                    assert_eq!(attempt("s3", "reconcile", false, false).await.unwrap(), 6);
                });
        });
    });

    let mut counted: std::collections::HashMap<(String, String), u64> = Default::default();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let DebugValue::Counter(n) = value else {
            continue;
        };
        let name = key.key().name().to_owned();
        for label in key.key().labels() {
            if ["decision", "resolution"].contains(&label.key()) {
                counted.insert((name.clone(), label.value().to_owned()), n);
            }
        }
    }
    let count =
        |name: &str, label: &str| counted.get(&(name.to_owned(), label.to_owned())).copied();
    assert_eq!(count(steps::STEPS, "ran"), Some(2), "{counted:?}");
    assert_eq!(count(steps::STEPS, "replayed"), Some(2), "{counted:?}");
    for resolution in ["rerun", "refused", "operator_completed", "reconciled"] {
        assert_eq!(
            count(steps::STEPS_IN_DOUBT, resolution),
            Some(1),
            "{resolution}: {counted:?}"
        );
    }
    let logged = messages.0.lock().unwrap().clone();
    for expected in [
        "running it again",
        "refusing until an operator",
        "asking the downstream",
        "resolved by an operator",
    ] {
        assert!(
            logged.iter().any(|m| m.contains(expected)),
            "no {expected:?} in {logged:?}"
        );
    }
}

/// Collects every event's message.
#[derive(Clone, Default)]
struct Messages(Arc<Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> Layer<S> for Messages {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        struct Message(String);
        impl Visit for Message {
            fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        self.0.lock().unwrap().push(message.0);
    }
}
