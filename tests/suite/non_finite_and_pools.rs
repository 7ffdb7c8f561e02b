//! Values `serde_json` cannot write (non-finite floats) or hold (integers
//! beyond 64 bits), through `#[idempotent]`, and entity
//! mode on a pool of one connection.
//!
//! - `serde_json` writes every non-finite float (NaN, +inf, -inf) as
//!   `null`. Payloads that differ only there must still get different
//!   fingerprints (a reused key is refused, not replayed), and a non-finite
//!   output, which JSON cannot hold, must not be stored as `null`, which
//!   every retry would fail to decode (or decode as something else): it is
//!   refused by the codec, and retries get `Error::Unrecorded`.
//! - `unrelated_tokens_run_at_once_on_a_one_connection_pool`:
//!   entity mode promises that a claim holds no connection and no lock
//!   while the body runs, so first calls with different tokens run at once
//!   on every backend (SQLite included) and a body may use the same pool:
//!   two bodies meet at a barrier, each querying the one-connection pool.

use crate::common;
use crate::common::journal_of;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::{idempotent, MemoryStore};
use tokio::sync::Barrier;

static CHARGES: AtomicUsize = AtomicUsize::new(0);

#[idempotent(key = key, store = store, scope = "non_finite.charge_amount")]
async fn charge_amount(store: &MemoryStore, key: &str, amount: f64) -> Result<String, idem::Error> {
    CHARGES.fetch_add(1, Ordering::SeqCst);
    Ok(format!("charged {amount}"))
}

/// Two calls under one key whose only argument that differs is `+inf`
/// against `-inf` (or NaN): the second must be refused as a reused key
/// (`KeyReused`), not answered with the first call's outcome.
#[tokio::test]
async fn infinities_share_no_default_fingerprint() {
    let store = MemoryStore::new();
    let first = charge_amount(&store, "k-inf", f64::INFINITY).await.unwrap();
    assert_eq!(first, "charged inf");
    let second = charge_amount(&store, "k-inf", f64::NEG_INFINITY).await;
    assert!(
        matches!(second, Err(idem::Error::KeyReused)),
        "a call with another payload (-inf instead of +inf) was answered with {second:?}: \
         the default fingerprint maps every non-finite float to null"
    );
    let third = charge_amount(&store, "k-inf", f64::NAN).await;
    assert!(
        matches!(third, Err(idem::Error::KeyReused)),
        "a call with another payload (NaN instead of +inf) was answered with {third:?}"
    );
    assert_eq!(CHARGES.load(Ordering::SeqCst), 1);
}

#[derive(Debug, Clone, PartialEq, sqlx::FromRow, idem::Entity)]
#[idem(table = "pooled_tickets")]
pub struct Ticket {
    #[idem(token)]
    pub token: String,
    pub seat: i64,
}

fn ddl(backend: &str) -> &'static str {
    match backend {
        "mysql" => {
            "CREATE TABLE pooled_tickets (token VARCHAR(255) NOT NULL UNIQUE, seat BIGINT NOT NULL)"
        }
        _ => "CREATE TABLE pooled_tickets (token TEXT NOT NULL UNIQUE, seat BIGINT NOT NULL)",
    }
}

common::backends!(sqlite_file, postgres, mysql => {
    use idem::idempotent;

    type Pool = sqlx::Pool<backend::Database>;

    pub struct Box_ {
        pool: Pool,
        barrier: Barrier,
        runs: AtomicUsize,
    }

    impl Box_ {
        #[idempotent(key = token, store = self.pool, entity, wait = "60s")]
        async fn book(&self, token: &str, seat: i64) -> Result<Ticket, idem::Error> {
            self.runs.fetch_add(1, Ordering::SeqCst);
            // The body uses the pool the claim was taken on.
            sqlx::query("SELECT 1").execute(&self.pool).await.map_err(idem::Error::store)?;
            tokio::time::timeout(Duration::from_secs(20), self.barrier.wait())
                .await
                .map_err(|_| idem::Error::store("the other token's body never ran meanwhile"))?;
            Ok(Ticket { token: token.to_owned(), seat })
        }
    }

    /// PASSING (kept): different tokens are not serialised by their claims,
    /// even with one connection for everything.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn unrelated_tokens_run_at_once_on_a_one_connection_pool() {
        let ns = backend::namespace("pool_of_one").await;
        let pool = backend::pool(&ns, 1).await;
        sqlx::raw_sql(ddl(backend::NAME)).execute(&pool).await.unwrap();
        let service = Arc::new(Box_ { pool, barrier: Barrier::new(2), runs: AtomicUsize::new(0) });
        let a = tokio::spawn({
            let s = service.clone();
            async move { s.book("tok-a", 1).await }
        });
        let b = tokio::spawn({
            let s = service.clone();
            async move { s.book("tok-b", 2).await }
        });
        let (a, b) = (a.await.unwrap(), b.await.unwrap());
        assert_eq!(a.unwrap(), Ticket { token: "tok-a".into(), seat: 1 });
        assert_eq!(b.unwrap(), Ticket { token: "tok-b".into(), seat: 2 });
        assert_eq!(service.runs.load(Ordering::SeqCst), 2);
        // Replays run nothing.
        assert_eq!(service.book("tok-a", 1).await.unwrap().seat, 1);
        assert_eq!(service.runs.load(Ordering::SeqCst), 2);
    }
});

static RATES: AtomicUsize = AtomicUsize::new(0);

#[idempotent(key = key, store = store, scope = "non_finite.rate")]
async fn rate(store: &MemoryStore, key: &str) -> Result<f64, idem::Error> {
    RATES.fetch_add(1, Ordering::SeqCst);
    Ok(f64::INFINITY)
}

/// An output the attribute's JSON codec (`Output::codec`) cannot write:
/// `serde_json` alone writes a non-finite float as `null`, which every
/// retry would then fail to decode. The caller gets its result, the body
/// runs once, and every retry is told, with the reason, that the outcome
/// was not recorded.
#[tokio::test]
async fn a_non_finite_output_is_refused_and_retries_are_told() {
    let store = MemoryStore::new();
    assert_eq!(rate(&store, "r-1").await.unwrap(), f64::INFINITY);
    for _ in 0..2 {
        let retry = rate(&store, "r-1").await;
        assert!(
            matches!(&retry, Err(idem::Error::Unrecorded(reason)) if reason.contains("non-finite")),
            "the retry of the same call got {retry:?}, not Unrecorded"
        );
    }
    assert_eq!(RATES.load(Ordering::SeqCst), 1);
}

/// A durable step whose output holds a non-finite float: its journal entry
/// must not be completed with `null`, which every later attempt would
/// replay as an error (or as another value). The step's call ran, so the
/// attempt fails with the reason and the entry stays started, in doubt,
/// for the step's policy to decide, as any output that cannot be written.
#[tokio::test]
async fn a_non_finite_step_output_is_not_journaled() {
    use idem::engine::{run, Call};
    use idem::journal::StepState;
    use idem::steps::step;

    use idem::{Key, Scope};

    let store = MemoryStore::new();
    let calls = AtomicUsize::new(0);
    let result = run(&store, Call::new("non_finite.step", "s-1", &1), async {
        let rate: f64 = step("rate", |_key| async {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok::<_, idem::Error>(f64::NAN)
        })
        .await?;
        Ok::<_, idem::Error>(rate.is_nan())
    })
    .await;
    assert!(
        matches!(&result, Err(idem::Error::Serialization(e)) if e.to_string().contains("non-finite")),
        "{result:?}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let entries = journal_of(&store)
        .steps(&Scope::new("non_finite.step"), &Key::new("s-1").unwrap())
        .await
        .unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].state, StepState::Started, "{entries:?}");
}

#[derive(serde::Serialize, serde::Deserialize)]
struct WeiTransfer {
    token: String,
    /// 20 ETH in wei: past `u64::MAX` (about 18.4 ETH).
    amount_wei: u128,
}

static SENDS: AtomicUsize = AtomicUsize::new(0);

#[idempotent(key = cmd.token, store = store, scope = "non_finite.send")]
async fn send(store: &MemoryStore, cmd: WeiTransfer) -> Result<u128, idem::Error> {
    SENDS.fetch_add(1, Ordering::SeqCst);
    Ok(cmd.amount_wei)
}

/// Integers beyond 64 bits, which `serde_json`'s `Value` has no number
/// for: a payload holding one is fingerprinted (it could not be, and every
/// call failed before its body), its retry is replayed, and another amount
/// under the same key is refused.
#[tokio::test]
async fn a_u128_payload_is_fingerprinted_and_replayed() {
    let store = MemoryStore::new();
    let cmd = |amount_wei| WeiTransfer {
        token: "wei-1".into(),
        amount_wei,
    };
    let wei = 20_000_000_000_000_000_000;
    assert_eq!(send(&store, cmd(wei)).await.unwrap(), wei);
    assert_eq!(send(&store, cmd(wei)).await.unwrap(), wei);
    assert!(matches!(
        send(&store, cmd(wei + 1)).await,
        Err(idem::Error::KeyReused)
    ));
    assert_eq!(SENDS.load(Ordering::SeqCst), 1);
    let key = idem::fingerprint::key_of(&(u128::MAX,));
    assert!(idem::AsKey::to_key(&key).is_ok());
    assert_ne!(
        idem::Fingerprint::of(&i128::MIN).unwrap(),
        idem::Fingerprint::of(&(i128::MIN + 1)).unwrap()
    );
}
