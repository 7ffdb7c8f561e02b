//! Redis and Redis Cluster as a backend of the rows that run on every
//! backend.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use idem::{CachedStore, Fingerprint, Store};

use super::calls::{outside_tx, Calls, Mode, PayError};
use super::goal::{Goal, Goals};
use super::reference::{Script, REPLAY_KEY};
use super::{take, unique};
use crate::redis_env::{self, Conn, DeleteKeys, Redis};

/// Redis's goals: none of its own, only those every backend shares.
pub const REDIS_GOALS: Goals = Goals {
    record: Goal::None,
    tx: Goal::None,
    replay: Goal::None,
    processes: Goal::None,
};

/// A single Redis or a Redis Cluster: idem's records, and the body's
/// write, under a key prefix of this run's own, whose keys are deleted
/// when it is dropped. The body's write, and so the whole plain call, is
/// one `INCRBY` on a key of its own (`<prefix>:pay:<key>`), through a
/// multiplexed connection beside the store's: one round trip, as the SQL
/// backends' plain call is their business INSERT. Record mode only: the
/// body has no transaction to be in.
pub struct RedisPayments {
    redis: Redis,
    store: idem::RedisStore,
    /// The same records behind a local replay cache.
    cached: CachedStore<idem::RedisStore>,
    conn: Conn,
    /// What the reference's calls send beside their key, made once: the
    /// reference fingerprints nothing, as idem's engine does per call.
    reference: (idem::Scope, Fingerprint, idem::record::Outcome),
    _keys: DeleteKeys,
}

impl RedisPayments {
    pub async fn new(redis: Redis) -> Self {
        let prefix = redis_env::unique_prefix("bench");
        let store = redis.store(&prefix).await;
        RedisPayments {
            cached: CachedStore::new(store.clone(), 100_000).unwrap(),
            store,
            conn: redis.conn().await,
            reference: (
                idem::Scope::from("bench.ref"),
                Fingerprint::of(&500i64).unwrap(),
                idem::record::Outcome {
                    kind: idem::record::OutcomeKind::Ok,
                    body: b"500".to_vec(),
                },
            ),
            redis,
            _keys: DeleteKeys { redis, prefix },
        }
    }

    /// The business write, then a body that takes `body`.
    async fn incr(&self, key: &str, amount: i64, body: Duration) -> Result<i64, PayError> {
        let mut conn = match &self.conn {
            Conn::Single(conn) => Conn::Single(conn.clone()),
            Conn::Cluster(conn) => Conn::Cluster(conn.clone()),
        };
        redis::cmd("INCRBY")
            .arg(format!("{}:pay:{key}", self.store.prefix()))
            .arg(amount)
            .query_async::<i64>(&mut conn)
            .await?;
        take(body).await;
        Ok(amount)
    }

    async fn pay(&self, mode: Mode, key: &str, body: Duration) {
        let write = self.incr(key, 500, body);
        outside_tx((&self.store, &self.cached), mode, key, 500, write)
            .await
            .unwrap();
    }
}

impl Calls for RedisPayments {
    fn label(&self) -> &'static str {
        match self.redis {
            Redis::Single => "Redis",
            Redis::Cluster => "Redis Cluster",
        }
    }
    fn goals(&self) -> &'static Goals {
        &REDIS_GOALS
    }
    fn write(&self) -> &'static str {
        "INCRBY"
    }
    fn transactional(&self) -> bool {
        false
    }
    fn reference_status(&self) -> Option<Result<(), &'static str>> {
        Some(Ok(()))
    }
    /// The reference's call: a first execution's scripts around the same
    /// write as idem's body, on a key of its own, or a replay's read of a
    /// record that one of them wrote.
    async fn reference_call(&self, script: Script) {
        let (scope, fingerprint, outcome) = &self.reference;
        let request = |key| idem::store::BeginRequest {
            scope,
            key,
            fingerprint,
            token: idem::record::ClaimToken::new(),
            lease: Duration::from_secs(60),
            ttl: idem::Policy::DEFAULT_TTL,
        };
        match script {
            Script::Record(body) => {
                let key = idem::Key::try_from(unique("ref").as_str()).unwrap();
                let write = async {
                    self.incr(key.as_str(), 500, body).await.unwrap();
                };
                self.store
                    .reference_first_execution(&request(&key), write, outcome)
                    .await
                    .unwrap();
            }
            Script::Replay => {
                let key = idem::Key::try_from(REPLAY_KEY).unwrap();
                let request = request(&key);
                // Written once, by the first replay of a run.
                if self.store.reference_replay(&request).await.is_err() {
                    self.store
                        .reference_first_execution(&request, async {}, outcome)
                        .await
                        .unwrap();
                    self.store.reference_replay(&request).await.unwrap();
                }
            }
            Script::Tx(_) | Script::TxWithoutRead(_) => {
                unreachable!("Redis has no transactional mode")
            }
        }
    }
    fn call(self: &Arc<Self>, mode: Mode, body: Duration) -> impl Future<Output = ()> + Send {
        let this = self.clone();
        async move { this.pay(mode, &unique("pay"), body).await }
    }
    fn call_key(self: &Arc<Self>, mode: Mode, key: &str) -> impl Future<Output = ()> + Send {
        let (this, key) = (self.clone(), key.to_owned());
        async move { this.pay(mode, &key, Duration::ZERO).await }
    }
    fn store(&self) -> Arc<dyn Store> {
        Arc::new(self.store.clone())
    }
}
