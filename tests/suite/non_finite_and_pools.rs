//! Values `serde_json` cannot write, through `#[idempotent]`, and entity
//! mode on a pool of one connection.
//!
//! - `infinities_share_one_default_fingerprint` and
//!   `a_non_finite_output_is_stored_but_never_replayed` are ignored: they
//!   fail, and show open defects (run them with `-- --ignored`).
//!   `serde_json` writes every non-finite float (NaN, +inf, -inf) as
//!   `null`, so payloads that differ only there share one fingerprint (a
//!   reused key is replayed instead of refused), and a non-finite output
//!   is stored as `null`, which no retry can decode. Fingerprints and the
//!   JSON codec should refuse non-finite floats (a serializer that
//!   forwards to serde_json's and fails on them).
//! - `unrelated_tokens_run_at_once_on_a_one_connection_pool`:
//!   entity mode promises that a claim holds no connection and no lock
//!   while the body runs, so first calls with different tokens run at once
//!   on every backend (SQLite included) and a body may use the same pool:
//!   two bodies meet at a barrier, each querying the one-connection pool.

use crate::common;

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

/// Open defect. Two calls under one key whose only argument that differs is
/// `+inf` against `-inf` (or NaN): the second must be refused as a reused
/// key (`KeyReused`), not answered with the first call's outcome.
#[tokio::test]
#[ignore = "open: non-finite floats are fingerprinted as null"]
async fn infinities_share_one_default_fingerprint() {
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

/// Open defect. An output the attribute's JSON codec (`Output::codec`) cannot
/// round-trip: `serde_json` writes a non-finite float as `null`, the record
/// is completed with it, and every retry of the very same call then fails
/// to decode it. The body ran once, and no retry can ever get its outcome.
#[tokio::test]
#[ignore = "open: a non-finite output is stored as null, which no retry decodes"]
async fn a_non_finite_output_is_stored_but_never_replayed() {
    let store = MemoryStore::new();
    assert_eq!(rate(&store, "r-1").await.unwrap(), f64::INFINITY);
    let retry = rate(&store, "r-1").await;
    assert_eq!(RATES.load(Ordering::SeqCst), 1);
    assert!(
        matches!(retry, Ok(v) if v == f64::INFINITY),
        "the retry of the same call got {retry:?}, not the first outcome"
    );
}
