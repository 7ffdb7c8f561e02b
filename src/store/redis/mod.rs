//! Redis and Redis Cluster: records as hashes, every transition one Lua
//! script ([`scripts`]), expiry by Redis's own TTL, and waiters woken by
//! pub/sub on each record's channel.
//!
//! - this file: the store, its connection (a single Redis or a cluster)
//!   and the layout of a record's keys;
//! - [`calls`]: how a script reaches the server: `EVALSHA`, `WAIT` for
//!   replicas (what a failover can lose), the length check, errors;
//! - [`records`]: the record transitions ([`Store`]);
//! - [`journal`]: the step transitions ([`Journal`](crate::store::Journal));
//! - [`waking`]: the waits of duplicates ([`Wake`](crate::store::Wake)),
//!   on the channels of [`subscriptions`];
//! - [`replies`]: the scripts' replies decoded into records;
//! - `inventory`: the operator's listings; `reference`: the benches'
//!   reference flows.

mod calls;
mod inventory;
mod journal;
mod records;
#[cfg(feature = "testing")]
mod reference;
mod replies;
mod scripts;
mod subscriptions;
mod waking;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, IntoConnectionInfo, ProtocolVersion, RedisFuture, Value};
use sha2::{Digest, Sha256};

use self::calls::store_error;
use self::subscriptions::Subscriptions;
use crate::store::{Detach, Store, Waiters};
use idem_core::error::Error;
use idem_core::key::{Key, Scope};

/// The default prefix of every key the store writes.
const DEFAULT_PREFIX: &str = "idem";

/// How long a command may wait for its answer before it fails (and the
/// engine's retry, with the same claim token, takes over).
const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);

/// Records in Redis or in a Redis Cluster (feature `redis`).
///
/// - **One script per transition.** Claim, takeover, renewal, completion,
///   release, forget and the step journal's writes are each one Lua script
///   (`EVALSHA`, loaded on first use and again after `NOSCRIPT`), atomic as
///   the SQL stores' statements are. A claim answered by a lost reply and
///   sent again is recognized by its token.
/// - **The server's clock.** Leases and expiries are computed in the
///   scripts from `TIME`, never from this process's clock.
/// - **Redis expires records.** Each record is written with `PEXPIREAT`,
///   its step journal too, so [`Store::purge_expired`] has nothing to do
///   and answers 0 ([`Capabilities::deletes_expired_itself`](crate::store::Capabilities::deletes_expired_itself)).
/// - **One slot per record.** The keys of a record (`<prefix>:{<tag>}:r`
///   for the record, `:j` for its journal, `:c` for its channel) share the
///   hash tag `<tag>`, the SHA-256 of its scope and key, so every script
///   touches one slot and runs on any cluster.
/// - **Waiters woken by pub/sub.** A duplicate that waits subscribes to
///   the record's channel (`SSUBSCRIBE` on a cluster, `SUBSCRIBE` on a
///   single Redis) before it looks; a completion or release publishes
///   there when someone waits. A lost subscription falls back to polling.
/// - **Bytes.** Outcomes and step outputs are stored as they are, so any
///   codec works.
///
/// Redis replicates asynchronously: a claim, a step's start or a
/// completion acknowledged by a primary that fails before its replicas
/// have it can be lost in a failover, and a retry may then run the body,
/// or a step, again.
/// [`wait_for_replicas`](RedisStore::wait_for_replicas) makes those
/// writes wait until that many replicas acknowledged them (`WAIT`); it
/// says which writes wait, and what a failover can still lose.
/// The guide's [stores chapter](crate::_guide::stores) states the guarantee.
///
/// An outcome longer than the server's `proto-max-bulk-len` is refused
/// with [`Error::Unrecorded`] (checked with `CONFIG GET` before an
/// outcome over 1 MiB is sent, and recognized in the server's refusal):
/// the engine then stores the outcome that answers `Unrecorded`. A step's
/// output that long fails with a store error, so that the step's output
/// is used and the step is in doubt at the next attempt.
///
/// ```no_run
/// # async fn demo() -> Result<(), idem::Error> {
/// use std::time::Duration;
///
/// let single = idem::RedisStore::connect("redis://127.0.0.1:6379").await?;
/// let cluster = idem::RedisStore::connect_cluster(["redis://127.0.0.1:7100"])
///     .await?
///     .wait_for_replicas(1, Duration::from_millis(500));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    shared: Arc<Shared>,
    prefix: Arc<str>,
    replicas: Option<(u32, Duration)>,
}

/// What clones of a store share: the connection, and the waiters of this
/// process with their subscriptions.
struct Shared {
    conn: Conn,
    waiters: Arc<Waiters>,
    subscriptions: Subscriptions,
    /// Whether the channels of this process are subscribed and the
    /// connection has not dropped since.
    listening: Arc<AtomicBool>,
    relay: tokio::task::JoinHandle<()>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.relay.abort();
    }
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("cluster", &self.shared.conn.is_cluster())
            .field("prefix", &self.prefix)
            .field("replicas", &self.replicas)
            .finish_non_exhaustive()
    }
}

/// A connection to a single Redis (reconnecting by itself) or to a
/// cluster (following its slots and failovers by itself).
#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Conn {
    fn is_cluster(&self) -> bool {
        matches!(self, Conn::Cluster(_))
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(conn) => conn.req_packed_command(cmd),
            Conn::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(conn) => conn.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(conn) => conn.get_db(),
            Conn::Cluster(conn) => conn.get_db(),
        }
    }
}

/// The keys of one record, all under one hash tag.
struct Keys {
    record: String,
    journal: String,
    channel: String,
}

/// The keys of `(scope, key)` under `prefix`: their hash tag is the hex
/// SHA-256 of `<len(scope)>:<scope><key>`, so that no scope or key can
/// end the tag early or put two records in one.
fn record_keys(prefix: &str, scope: &Scope, key: &Key) -> Keys {
    let mut hasher = Sha256::new();
    hasher.update(scope.as_str().len().to_string());
    hasher.update(b":");
    hasher.update(scope.as_str());
    hasher.update(key.as_str());
    let tag: String = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Keys {
        record: format!("{prefix}:{{{tag}}}:r"),
        journal: format!("{prefix}:{{{tag}}}:j"),
        channel: format!("{prefix}:{{{tag}}}:c"),
    }
}

impl RedisStore {
    /// A store on the single Redis at `url` (`redis://host:port/db`, with
    /// `user:password@` if needed), through one multiplexed connection that
    /// reconnects by itself. Needs Redis 7.0 or later.
    pub async fn connect(url: &str) -> Result<Self, Error> {
        let info = url
            .into_connection_info()
            .map_err(|e| Error::Config(format!("invalid Redis URL {url:?}: {e}")))?;
        let settings = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        let client = redis::Client::open(info.set_redis_settings(settings)).map_err(store_error)?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let config = ConnectionManagerConfig::new()
            .set_push_sender(tx)
            .set_automatic_resubscription()
            .set_response_timeout(Some(DEFAULT_RESPONSE_TIMEOUT))
            .set_connection_timeout(Some(DEFAULT_RESPONSE_TIMEOUT));
        let conn = client
            .get_connection_manager_with_config(config)
            .await
            .map_err(store_error)?;
        Self::on(Conn::Single(conn), rx).checked().await
    }

    /// A store on the Redis Cluster that `nodes` belong to (any of its
    /// nodes, as `redis://host:port`): each script goes to the primary of
    /// its record's slot, and the connection follows resharding and
    /// failovers. Needs Redis 7.0 or later.
    pub async fn connect_cluster<I, S>(nodes: I) -> Result<Self, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut infos = Vec::new();
        for node in nodes {
            let node = node.as_ref();
            infos.push(
                node.into_connection_info()
                    .map_err(|e| Error::Config(format!("invalid Redis URL {node:?}: {e}")))?,
            );
        }
        if infos.is_empty() {
            return Err(Error::Config(
                "a Redis Cluster store needs at least one node".into(),
            ));
        }
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let client = ClusterClientBuilder::new(infos)
            .use_protocol(ProtocolVersion::RESP3)
            .push_sender(tx)
            .response_timeout(DEFAULT_RESPONSE_TIMEOUT)
            .connection_timeout(DEFAULT_RESPONSE_TIMEOUT)
            .build()
            .map_err(|e| Error::Config(format!("invalid Redis Cluster configuration: {e}")))?;
        let conn = client.get_async_connection().await.map_err(store_error)?;
        Self::on(Conn::Cluster(conn), rx).checked().await
    }

    /// The store, if its server is Redis 7.0 or later (`SPUBLISH`,
    /// `PEXPIRETIME` and scripts that write after `TIME`); else a clear
    /// error rather than a failed script at the first call.
    async fn checked(self) -> Result<Self, Error> {
        // `redis.REDIS_VERSION_NUM` exists in scripts from 7.0 on.
        let version: i64 = redis::cmd("EVAL")
            .arg("return redis.REDIS_VERSION_NUM or 0")
            .arg(0)
            .query_async(&mut self.shared.conn.clone())
            .await
            .map_err(store_error)?;
        if version < 0x07_00_00 {
            return Err(Error::Config(
                "the Redis store needs Redis 7.0 or later; this server is older".into(),
            ));
        }
        Ok(self)
    }

    fn on(conn: Conn, pushes: tokio::sync::mpsc::UnboundedReceiver<redis::PushInfo>) -> Self {
        let waiters = Arc::new(Waiters::default());
        let listening = Arc::new(AtomicBool::new(false));
        let relay = tokio::spawn(subscriptions::relay(
            pushes,
            waiters.clone(),
            listening.clone(),
        ));
        let subscriptions = Subscriptions::start(conn.clone(), listening.clone());
        RedisStore {
            shared: Arc::new(Shared {
                conn,
                waiters,
                subscriptions,
                listening,
                relay,
            }),
            prefix: DEFAULT_PREFIX.into(),
            replicas: None,
        }
    }

    /// Keys every record under `prefix` (`idem` by default), so that
    /// several applications, or several tests, share one Redis: 1 to 64
    /// printable ASCII characters, without `{` or `}` (which would change
    /// the hash slot).
    pub fn with_prefix(mut self, prefix: &str) -> Result<Self, Error> {
        let valid = (1..=64).contains(&prefix.len())
            && prefix
                .bytes()
                .all(|b| b.is_ascii_graphic() && b != b'{' && b != b'}');
        if !valid {
            return Err(Error::Config(format!(
                "invalid Redis key prefix {prefix:?}: 1 to 64 printable ASCII characters, \
                 without braces"
            )));
        }
        self.prefix = prefix.into();
        Ok(self)
    }

    /// The prefix of every key the store writes.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Whether the store is on a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.shared.conn.is_cluster()
    }

    fn keys(&self, scope: &Scope, key: &Key) -> Keys {
        record_keys(&self.prefix, scope, key)
    }
}

impl Detach for RedisStore {
    fn detach(&self) -> Option<Arc<dyn Store>> {
        Some(Arc::new(self.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_keys_of_a_record_share_one_hash_tag() {
        let keys = record_keys("app", &Scope::new("pay{ments}"), &Key::new("k}{1").unwrap());
        let tag = |k: &str| {
            let open = k.find('{').unwrap();
            let close = open + k[open..].find('}').unwrap();
            k[open + 1..close].to_owned()
        };
        assert_eq!(tag(&keys.record), tag(&keys.journal));
        assert_eq!(tag(&keys.record), tag(&keys.channel));
        assert_eq!(tag(&keys.record).len(), 64);
        assert!(keys.record.starts_with("app:{"));
        // Another key, another tag; the scope and key are not confused.
        let other = record_keys("app", &Scope::new("pay{ments}k"), &Key::new("}{1").unwrap());
        assert_ne!(tag(&keys.record), tag(&other.record));
    }
}
