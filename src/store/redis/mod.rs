//! Redis and Redis Cluster: records as hashes, every transition one Lua
//! script ([`scripts`]), expiry by Redis's own TTL, and waiters woken by
//! pub/sub on each record's channel.

mod inventory;
#[cfg(feature = "testing")]
mod reference;
mod scripts;
mod subscriptions;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{
    Cmd, ErrorKind, IntoConnectionInfo, ProtocolVersion, RedisError, RedisFuture, ServerErrorKind,
    Value,
};
use sha2::{Digest, Sha256};

use self::scripts::{Invocation, SCRIPTS};
use self::subscriptions::Subscriptions;
use crate::store::{Capabilities, Detach, Journal, Look, Store, Waiters, Wake};
use idem_core::error::Error;
use idem_core::fingerprint::Fingerprint;
use idem_core::journal::{
    decide_step, StepBegin, StepDecision, StepRecord, StepRequest, StepResolution, StepRun,
    StepState,
};
use idem_core::key::{Key, Scope};
use idem_core::record::{
    decide, duration_millis, Begin, BeginRequest, Claim, ClaimToken, Millis, Outcome, OutcomeKind,
    Record, State,
};

/// The default prefix of every key the store writes.
const DEFAULT_PREFIX: &str = "idem";

/// The longest duration written, in milliseconds (about 35,000 years):
/// the scripts compute in Lua's doubles, exact below 2^53.
const MAX_MILLIS: Millis = 1 << 50;

/// The least `proto-max-bulk-len` a Redis server can be set to (1 MiB):
/// no argument up to this long is refused for its length.
const MIN_BULK_LIMIT: usize = 1 << 20;

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

fn store_error(err: RedisError) -> Error {
    if too_large(&err) {
        return Error::Unrecorded(format!(
            "the Redis server refused an argument longer than its proto-max-bulk-len: {err}"
        ));
    }
    Error::store(err)
}

/// A refusal for length as a store error, where what was refused is not
/// an outcome.
fn unrecorded_as_store(err: Error) -> Error {
    match err {
        Error::Unrecorded(reason) => Error::store(reason),
        other => other,
    }
}

/// Whether the server refused a command because one of its arguments is
/// longer than its `proto-max-bulk-len` (`ERR Protocol error: invalid
/// bulk length`, after which it closes the connection): the same command
/// would be refused every time. Only that reply; a connection lost while
/// the command was being written is not taken for it.
fn too_large(err: &RedisError) -> bool {
    err.clone().into_server_errors().is_some_and(|errors| {
        errors.iter().any(|(_, e)| {
            e.code() == "ERR"
                && e.details()
                    .is_some_and(|d| d.starts_with("Protocol error: invalid bulk length"))
        })
    })
}

fn corrupt(what: &str) -> Error {
    Error::store(format!("corrupt idempotency record in Redis: {what}"))
}

/// A duration as the scripts take it: milliseconds, at most [`MAX_MILLIS`].
fn millis(d: Duration) -> Millis {
    duration_millis(d).min(MAX_MILLIS)
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

    /// After every write that a later decision depends on, waits until
    /// `replicas` replicas acknowledged it (`WAIT`, on the connection that
    /// wrote it), for at most `timeout`. `0` replicas turns the option
    /// off.
    ///
    /// - **Waited for:** a claim (a fresh one, a takeover, one sent
    ///   again), a step's start (fresh, adopted, allowed by an operator,
    ///   or sent again), a completion, a step's completion, a release, a
    ///   forget and an operator's step resolution.
    /// - **Not acknowledged in time:** the write is done on the primary,
    ///   but not taken as durable. A claim is handed back and fails with
    ///   a store error, so its body does not run. A step's start is put
    ///   back as the entry was and fails with a store error, so the
    ///   step's call does not run (a start sent again is left started:
    ///   in doubt). A completion or a step's completion fails with a
    ///   store error, and is stored again. A release, a forget or a
    ///   resolution fails with a store error, though the primary has it.
    /// - **Not waited for:** lease renewals and the journal's keeping
    ///   ([`Journal::keep_steps`](crate::store::Journal::keep_steps)). Waiting would not make them more
    ///   durable, the engine cannot stop a body whose renewal is not
    ///   acknowledged, and `WAIT` holds the store's one connection for
    ///   up to `timeout`, renewals coming every third of a lease for
    ///   every call in progress. So a failover can lose the renewals
    ///   that no replica had yet: the promoted replica then holds an
    ///   older lease, and a retry may take the key over once that lease
    ///   has run out, while the first attempt still runs. The first
    ///   attempt's later writes are refused then (fenced by its claim),
    ///   and every step it started is seen started or completed.
    /// - **An outage longer than the lease** (replicas that acknowledge
    ///   nothing for longer): the claims, steps and completions of that
    ///   time fail with store errors, but a body already running runs on,
    ///   its renewals on the primary alone. A failover then may lose all
    ///   of them, and a retry takes the key over at once: the two
    ///   attempts overlap as after a holder paused longer than its lease.
    ///   A step of the first attempt that had started is in doubt, and a
    ///   step journaled longer than its ttl ago whose keeping the failover
    ///   lost is gone, and runs again.
    ///
    /// `WAIT` blocks the connection it is sent on, which all the store's
    /// commands share: while replicas do not acknowledge, every command
    /// queues behind the waits in progress, each up to `timeout`.
    pub fn wait_for_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.replicas = (replicas > 0).then_some((replicas, timeout));
        self
    }

    fn keys(&self, scope: &Scope, key: &Key) -> Keys {
        record_keys(&self.prefix, scope, key)
    }

    /// The command that publishes on a record's channel.
    fn publish(&self) -> &'static str {
        if self.is_cluster() {
            "SPUBLISH"
        } else {
            "PUBLISH"
        }
    }

    /// Runs a script; `EVALSHA`, then `SCRIPT LOAD` and `EVALSHA` again
    /// if the server does not know it (a restart, a failover, a `SCRIPT
    /// FLUSH`).
    async fn invoke(&self, invocation: Invocation<'_>) -> Result<Value, Error> {
        Ok(self.invoke_then(invocation, None).await?.0)
    }

    /// [`invoke`](Self::invoke), then, when replicas are asked for, `WAIT`
    /// in the same pipeline, on the same connection to the same primary:
    /// `WAIT` counts the replicas that have everything this connection
    /// saw written, so on another connection (or after a failover, on
    /// another primary) it would prove nothing. Sent again as a whole if
    /// the connection fails. Answers the script's reply and whether enough
    /// replicas acknowledged.
    async fn invoke_replicated(&self, invocation: Invocation<'_>) -> Result<(Value, bool), Error> {
        self.invoke_then(invocation, self.replicas).await
    }

    async fn invoke_then(
        &self,
        invocation: Invocation<'_>,
        replicas: Option<(u32, Duration)>,
    ) -> Result<(Value, bool), Error> {
        let mut conn = self.shared.conn.clone();
        let mut pipeline = redis::pipe();
        pipeline.add_command(invocation.evalsha());
        if let Some((replicas, timeout)) = replicas {
            pipeline.cmd("WAIT").arg(replicas).arg(millis(timeout));
        }
        let mut loaded = false;
        loop {
            match pipeline.query_async::<Vec<Value>>(&mut conn).await {
                Ok(mut replies) => {
                    let acknowledged = match replicas {
                        None => true,
                        Some((replicas, _)) => {
                            replies.pop().as_ref().and_then(int).unwrap_or(0) >= i64::from(replicas)
                        }
                    };
                    let reply = replies.pop().unwrap_or(Value::Nil);
                    return Ok((reply, acknowledged));
                }
                Err(err)
                    if !loaded && err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) =>
                {
                    let _: Value = invocation
                        .lua
                        .load()
                        .query_async(&mut conn)
                        .await
                        .map_err(store_error)?;
                    loaded = true;
                }
                Err(err) => return Err(store_error(err)),
            }
        }
    }

    /// The completion script, and `WAIT` if asked for.
    async fn complete_once(
        &self,
        claim: &Claim,
        outcome: &Outcome,
        keys: &Keys,
    ) -> Result<(), Error> {
        self.check_length(&keys.record, outcome.body.len(), "an outcome")
            .await?;
        let (value, acknowledged) = self
            .invoke_replicated(
                SCRIPTS
                    .complete
                    .on(&keys.record)
                    .arg(self.publish())
                    .arg(&keys.channel)
                    .arg(&claim.token.as_bytes()[..])
                    .arg(outcome.kind.code())
                    .arg(&outcome.body[..])
                    .arg(millis(claim.ttl)),
            )
            .await?;
        if int(&value) != Some(1) {
            return Err(Error::LeaseLost);
        }
        if !acknowledged {
            return Err(self.not_replicated("completion"));
        }
        Ok(())
    }

    /// The release of `claim`, then `WAIT` for `replicas` if asked for.
    /// A release that no replica acknowledged is done on the primary
    /// (the key is free there) and fails with a store error: a failover
    /// may bring the claim back, to be taken over once its lease runs
    /// out.
    async fn release_then(
        &self,
        claim: &Claim,
        replicas: Option<(u32, Duration)>,
    ) -> Result<(), Error> {
        let keys = self.keys(&claim.scope, &claim.key);
        let (value, acknowledged) = self
            .invoke_then(
                SCRIPTS
                    .release
                    .on(&keys.record)
                    .arg(self.publish())
                    .arg(&keys.channel)
                    .arg(&claim.token.as_bytes()[..]),
                replicas,
            )
            .await?;
        if int(&value) != Some(1) {
            return Err(Error::LeaseLost);
        }
        self.shared.waiters.wake(&claim.scope, &claim.key);
        if !acknowledged {
            return Err(self.not_replicated("release"));
        }
        Ok(())
    }

    /// Undoes a step's start that no replica acknowledged (`before`: what
    /// the begin script answered the entry held; nothing: the entry is
    /// deleted), unless the entry changed since. Answers whether it did.
    async fn abandon_step(
        &self,
        keys: &Keys,
        claim: &Claim,
        step: &StepRequest<'_>,
        before: &[Value],
    ) -> Result<bool, Error> {
        let field = |i: usize| before.get(i).and_then(bytes).unwrap_or_default();
        let undone = self
            .invoke(
                SCRIPTS
                    .abandon_step
                    .on(&keys.record)
                    .key(&keys.journal)
                    .arg(&claim.token.as_bytes()[..])
                    .arg(step.seq)
                    .arg(step.name)
                    .arg(field(0))
                    .arg(field(1))
                    .arg(field(2)),
            )
            .await?;
        Ok(int(&undone) == Some(1))
    }

    /// Refuses an argument of `len` bytes (`what`) that the server would
    /// refuse for its length (longer than its `proto-max-bulk-len`), with
    /// [`Error::Unrecorded`]: sent, it would be refused every time, and
    /// the server would close the connection, failing every command on
    /// it. Only an argument longer than 1 MiB (the least the setting can
    /// be) is checked, by asking the server that holds the record at
    /// `record` (`CONFIG GET`); a server that does not answer is sent the
    /// argument, and its refusal is recognized ([`too_large`]).
    async fn check_length(&self, record: &str, len: usize, what: &str) -> Result<(), Error> {
        if len <= MIN_BULK_LIMIT {
            return Ok(());
        }
        let mut get = redis::cmd("CONFIG");
        get.arg("GET").arg("proto-max-bulk-len");
        let reply = match self.shared.conn.clone() {
            Conn::Single(mut conn) => get.query_async::<Value>(&mut conn).await,
            Conn::Cluster(mut conn) => {
                let node = Route::with_key(record, SlotAddr::Master);
                conn.route_command(
                    get,
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(node)),
                )
                .await
            }
        };
        let limit = match reply {
            Ok(Value::Map(pairs)) => pairs.first().and_then(|(_, v)| int(v)),
            Ok(Value::Array(items)) => items.get(1).and_then(int),
            Ok(_) | Err(_) => None,
        };
        match limit {
            Some(limit) if len as u64 > limit as u64 => Err(Error::Unrecorded(format!(
                "{what} of {len} bytes is longer than the Redis server takes \
                 (proto-max-bulk-len {limit})"
            ))),
            _ => Ok(()),
        }
    }

    fn not_replicated(&self, what: &str) -> Error {
        let (replicas, timeout) = self.replicas.unwrap_or_default();
        Error::store(format!(
            "the {what} was not acknowledged by {replicas} Redis replica(s) within {timeout:?}"
        ))
    }

    /// Answers whether the record is held by a live lease (and whose),
    /// marking it waited: a waiter's look, after it subscribed.
    /// Only a claim of the payload of `fingerprint` (of any payload:
    /// `None`) is taken for the holder.
    async fn look(&self, keys: &Keys, fingerprint: Option<&Fingerprint>) -> Result<Look, Error> {
        let value = self.invoke(SCRIPTS.look.on(&keys.record)).await?;
        let (now, record) = now_and_record(value)?;
        Ok(Look::at(record.as_ref(), now, fingerprint))
    }

    /// Waits on `(scope, key)` as [`Waiters::wait`] does, for a claim of
    /// the payload of `fingerprint` (of any payload: `None`).
    async fn wait_on(
        &self,
        scope: &Scope,
        key: &Key,
        fingerprint: Option<&Fingerprint>,
        timeout: Duration,
    ) -> Result<Option<Outcome>, Error> {
        let keys = self.keys(scope, key);
        let shared = &self.shared;
        // The subscription lives as long as the wait.
        let mut subscription = None;
        let held = &mut subscription;
        let look = move || async move {
            // Subscribed before the look, so that a completion after the
            // look is heard; a failed subscription leaves the poll.
            *held = Some(shared.subscriptions.subscribe(&keys.channel).await);
            self.look(&keys, fingerprint).await
        };
        let handed = shared.waiters.wait(scope, key, timeout, look).await;
        drop(subscription);
        handed
    }
}

/// Bytes of a reply value.
fn bytes(value: &Value) -> Option<&[u8]> {
    match value {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

fn text(value: &Value) -> Option<&str> {
    bytes(value).and_then(|b| std::str::from_utf8(b).ok())
}

fn int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(n) => Some(*n),
        other => text(other)?.parse().ok(),
    }
}

fn array(value: Value) -> Result<Vec<Value>, Error> {
    match value {
        Value::Array(items) => Ok(items),
        Value::Nil => Ok(Vec::new()),
        other => Err(Error::store(format!(
            "unexpected reply from an idem script: {other:?}"
        ))),
    }
}

/// `{now, <fields>}`, as `peek` and `look` answer.
fn now_and_record(value: Value) -> Result<(Millis, Option<Record>), Error> {
    let mut items = array(value)?.into_iter();
    let now = items
        .next()
        .as_ref()
        .and_then(int)
        .ok_or_else(|| corrupt("no time"))?;
    let fields = array(items.next().unwrap_or(Value::Nil))?;
    Ok((now, parse_record(fields)?))
}

/// A record from its hash fields, as HGETALL lists them; `None` for none.
fn parse_record(fields: Vec<Value>) -> Result<Option<Record>, Error> {
    if fields.is_empty() {
        return Ok(None);
    }
    let mut map = std::collections::HashMap::new();
    let mut items = fields.into_iter();
    while let (Some(name), Some(value)) = (items.next(), items.next()) {
        let name = text(&name)
            .ok_or_else(|| corrupt("a field name"))?
            .to_owned();
        map.insert(name, value);
    }
    let field = |name: &str| map.get(name);
    let number = |name: &str| field(name).and_then(int);
    let scope = field("s")
        .and_then(text)
        .ok_or_else(|| corrupt("no scope"))?;
    let key = field("k").and_then(text).ok_or_else(|| corrupt("no key"))?;
    let fingerprint: [u8; 32] = field("fp")
        .and_then(bytes)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| corrupt("no fingerprint"))?;
    let state = field("st")
        .and_then(text)
        .and_then(State::parse)
        .ok_or_else(|| corrupt("no state"))?;
    let token: Option<[u8; 16]> = field("tok").and_then(bytes).and_then(|b| b.try_into().ok());
    let outcome = match (field("kind").and_then(int), field("body").and_then(bytes)) {
        (Some(kind), Some(body)) => Some(Outcome {
            kind: OutcomeKind::from_code(kind).ok_or_else(|| corrupt("an outcome kind"))?,
            body: body.to_vec(),
        }),
        _ => None,
    };
    Ok(Some(Record {
        scope: Scope::new(scope),
        key: Key::new(key).map_err(|_| corrupt("an invalid key"))?,
        fingerprint: Fingerprint::from_digest(fingerprint),
        state,
        fence: number("f").ok_or_else(|| corrupt("no fence"))?,
        token: token.map(ClaimToken::from_bytes),
        lease_until: number("lease"),
        outcome,
        created_at: number("c").ok_or_else(|| corrupt("no creation time"))?,
        expires_at: number("exp").ok_or_else(|| corrupt("no expiry"))?,
    }))
}

/// A journal entry from `name, fp, state, token, output, updated, expires`.
fn parse_step(scope: &Scope, key: &Key, seq: u32, fields: &[Value]) -> Result<StepRecord, Error> {
    let get = |i: usize| fields.get(i).filter(|v| !matches!(v, Value::Nil));
    Ok(StepRecord {
        scope: scope.clone(),
        key: key.clone(),
        seq,
        name: get(0)
            .and_then(text)
            .ok_or_else(|| corrupt("a step without a name"))?
            .to_owned(),
        fingerprint: Fingerprint::from_digest(
            get(1)
                .and_then(bytes)
                .and_then(|b| b.try_into().ok())
                .ok_or_else(|| corrupt("a step without a fingerprint"))?,
        ),
        state: get(2)
            .and_then(text)
            .and_then(StepState::parse)
            .ok_or_else(|| corrupt("a step without a state"))?,
        token: ClaimToken::from_bytes(
            get(3)
                .and_then(bytes)
                .and_then(|b| b.try_into().ok())
                .ok_or_else(|| corrupt("a step without a token"))?,
        ),
        output: get(4).and_then(bytes).map(<[u8]>::to_vec),
        updated_at: get(5)
            .and_then(int)
            .ok_or_else(|| corrupt("a step without a time"))?,
        expires_at: get(6)
            .and_then(int)
            .ok_or_else(|| corrupt("a step without an expiry"))?,
    })
}

/// A journal script's call for `step` of `claim`'s operation: the record
/// and the journal, then the token, seq, name, fingerprint and ttl.
fn step_call<'a>(
    lua: &'a scripts::Lua,
    keys: &Keys,
    claim: &Claim,
    step: &StepRequest<'_>,
) -> Invocation<'a> {
    lua.on(&keys.record)
        .key(&keys.journal)
        .arg(&claim.token.as_bytes()[..])
        .arg(step.seq)
        .arg(step.name)
        .arg(&step.fingerprint.as_bytes()[..])
        .arg(millis(step.ttl))
}

/// The status word a journal script answers first.
fn status(items: &[Value]) -> Result<&str, Error> {
    items
        .first()
        .and_then(text)
        .ok_or_else(|| Error::store("unexpected reply from an idem journal script"))
}

/// The claim script's call for `request` on the record at `keys`.
fn claim_call(keys: &Keys, request: &BeginRequest<'_>) -> Invocation<'static> {
    SCRIPTS
        .claim
        .on(&keys.record)
        .key(&keys.journal)
        .arg(request.scope.as_str())
        .arg(request.key.as_str())
        .arg(&request.fingerprint.as_bytes()[..])
        .arg(&request.token.as_bytes()[..])
        .arg(millis(request.lease))
        .arg(millis(request.ttl))
}

#[async_trait]
impl Store for RedisStore {
    async fn begin(&self, request: &BeginRequest<'_>) -> Result<Begin, Error> {
        let keys = self.keys(request.scope, request.key);
        // A record found free that the script did not claim changed in
        // between: impossible in one script, so a few rounds at most.
        for _ in 0..3 {
            let (value, acknowledged) = self.invoke_replicated(claim_call(&keys, request)).await?;
            let mut items = array(value)?;
            match status(&items)? {
                "claimed" => {
                    let fence = items.get(1).and_then(int).ok_or_else(|| corrupt("fence"))?;
                    let claim = Claim::granted(request, fence);
                    if !acknowledged {
                        // Not durable: hand it back, so that no body runs
                        // on a claim a failover may lose.
                        let _ = self.release_then(&claim, None).await;
                        return Err(self.not_replicated("claim"));
                    }
                    return Ok(Begin::Claimed(claim));
                }
                "found" => {
                    let now = items
                        .get(1)
                        .and_then(int)
                        .ok_or_else(|| corrupt("no time"))?;
                    let fields = array(items.pop().unwrap_or(Value::Nil))?;
                    let record = parse_record(fields)?.ok_or_else(|| corrupt("no record"))?;
                    if let Some(answer) = decide(request, &record, now).answer()? {
                        return Ok(answer);
                    }
                }
                other => return Err(Error::store(format!("unexpected claim answer {other:?}"))),
            }
        }
        Err(Error::store(
            "the Redis claim script and record::decide disagree on whether the key is free",
        ))
    }

    async fn peek(&self, request: &BeginRequest<'_>) -> Result<Option<Begin>, Error> {
        let keys = self.keys(request.scope, request.key);
        let value = self.invoke(SCRIPTS.peek.on(&keys.record)).await?;
        match now_and_record(value)? {
            (_, None) => Ok(None),
            (now, Some(record)) => decide(request, &record, now).answer(),
        }
    }

    async fn renew(&self, claim: &Claim) -> Result<(), Error> {
        let keys = self.keys(&claim.scope, &claim.key);
        // Not waited for (`wait_for_replicas` says why).
        let value = self
            .invoke(
                SCRIPTS
                    .renew
                    .on(&keys.record)
                    .arg(&claim.token.as_bytes()[..])
                    .arg(millis(claim.lease)),
            )
            .await?;
        match int(&value) {
            Some(1) => Ok(()),
            _ => Err(Error::LeaseLost),
        }
    }

    async fn complete(&self, claim: &Claim, outcome: &Outcome) -> Result<(), Error> {
        let keys = self.keys(&claim.scope, &claim.key);
        let complete = self.complete_once(claim, outcome, &keys);
        self.shared.waiters.complete(claim, outcome, complete).await
    }

    async fn release(&self, claim: &Claim) -> Result<(), Error> {
        self.release_then(claim, self.replicas).await
    }

    async fn get(&self, scope: &Scope, key: &Key) -> Result<Option<Record>, Error> {
        let keys = self.keys(scope, key);
        let value = self.invoke(SCRIPTS.peek.on(&keys.record)).await?;
        Ok(now_and_record(value)?.1)
    }

    async fn forget(&self, scope: &Scope, key: &Key) -> Result<bool, Error> {
        let keys = self.keys(scope, key);
        let (value, acknowledged) = self
            .invoke_replicated(
                SCRIPTS
                    .forget
                    .on(&keys.record)
                    .key(&keys.journal)
                    .arg(self.publish())
                    .arg(&keys.channel),
            )
            .await?;
        self.shared.waiters.wake(scope, key);
        if !acknowledged {
            return Err(self.not_replicated("forget"));
        }
        Ok(int(&value) == Some(1))
    }

    /// Nothing to do: Redis deletes expired records and journals itself.
    async fn purge_expired(&self, batch: usize) -> Result<u64, Error> {
        let _ = batch;
        Ok(0)
    }

    fn journal(&self) -> Option<&dyn Journal> {
        Some(self)
    }

    fn capabilities(&self) -> Capabilities<'_> {
        Capabilities::default()
            .with_wake(self)
            .with_detach(self)
            .deleting_expired_itself()
    }
}

#[async_trait]
impl Journal for RedisStore {
    async fn keep_steps(&self, scope: &Scope, key: &Key, ttl: Duration) -> Result<(), Error> {
        let keys = self.keys(scope, key);
        // Not waited for, as renewals are not (`wait_for_replicas`).
        self.invoke(
            SCRIPTS
                .keep_steps
                .on(&keys.record)
                .key(&keys.journal)
                .arg(duration_millis(ttl)),
        )
        .await?;
        Ok(())
    }

    async fn undo_step(&self, claim: &Claim, step: &StepRequest<'_>) -> Result<bool, Error> {
        // Not waited for by a replica: a delete lost in a failover leaves
        // the step in doubt, the state it was in before.
        let keys = self.keys(&claim.scope, &claim.key);
        self.abandon_step(&keys, claim, step, &[]).await
    }

    async fn begin_step(&self, claim: &Claim, step: &StepRequest<'_>) -> Result<StepBegin, Error> {
        let keys = self.keys(&claim.scope, &claim.key);
        let (value, acknowledged) = self
            .invoke_replicated(
                step_call(&SCRIPTS.begin_step, &keys, claim, step)
                    .arg(u8::from(step.adopt))
                    .arg(millis(step.settle)),
            )
            .await?;
        let items = array(value)?;
        match status(&items)? {
            "lost" => Err(Error::LeaseLost),
            "run" => {
                let run = match items.get(1).and_then(text) {
                    Some("fresh") => StepRun::Fresh,
                    Some("adopted") => StepRun::Adopted,
                    Some("allowed") => StepRun::Allowed,
                    other => return Err(Error::store(format!("unexpected step run {other:?}"))),
                };
                if !acknowledged {
                    // The marker may be lost in a failover: the step's
                    // call must not run on it. Put back what the entry
                    // held, so that the step is not taken for one in
                    // doubt.
                    let _ = self.abandon_step(&keys, claim, step, &items[2..]).await;
                    return Err(self.not_replicated("step's start"));
                }
                Ok(StepBegin::Run(run))
            }
            "found" => {
                let now = items
                    .get(1)
                    .and_then(int)
                    .ok_or_else(|| corrupt("no time"))?;
                let entry = parse_step(&claim.scope, &claim.key, step.seq, &items[2..])?;
                match decide_step(step, claim.token, Some(&entry), now) {
                    // This attempt's start, sent again after its answer
                    // was lost: its call runs only once a replica has it.
                    // Not acknowledged, it is left started (what it
                    // replaced is not known any more): in doubt, which
                    // refuses rather than runs twice.
                    StepDecision::Answer(StepBegin::Run(StepRun::Again)) if !acknowledged => {
                        Err(self.not_replicated("step's start"))
                    }
                    StepDecision::Answer(answer) => Ok(answer),
                    StepDecision::Start(_) => Err(Error::store(
                        "the Redis journal script and journal::decide_step disagree",
                    )),
                }
            }
            other => Err(Error::store(format!("unexpected step answer {other:?}"))),
        }
    }

    async fn complete_step(
        &self,
        claim: &Claim,
        step: &StepRequest<'_>,
        output: &[u8],
    ) -> Result<(), Error> {
        let keys = self.keys(&claim.scope, &claim.key);
        // A step's output the server cannot take is a store error, not
        // `Unrecorded`: the step's effect happened, so its output is used
        // all the same, and the step is in doubt at the next attempt.
        self.check_length(&keys.record, output.len(), "a step's output")
            .await
            .map_err(unrecorded_as_store)?;
        let (value, acknowledged) = self
            .invoke_replicated(step_call(&SCRIPTS.complete_step, &keys, claim, step).arg(output))
            .await
            .map_err(unrecorded_as_store)?;
        let items = array(value)?;
        match status(&items)? {
            "ok" if acknowledged => Ok(()),
            "ok" => Err(self.not_replicated("step's completion")),
            "lost" => Err(Error::LeaseLost),
            _ => Err(crate::store::step_not_journaled(step)),
        }
    }

    async fn steps(&self, scope: &Scope, key: &Key) -> Result<Vec<StepRecord>, Error> {
        let keys = self.keys(scope, key);
        let mut conn = self.shared.conn.clone();
        let fields: Vec<(Vec<u8>, Value)> = redis::cmd("HGETALL")
            .arg(&keys.journal)
            .query_async(&mut conn)
            .await
            .map_err(store_error)?;
        // `<seq>:<field>` → the entry's fields in parse_step's order.
        const ORDER: [&str; 7] = ["n", "fp", "st", "tok", "out", "u", "e"];
        let mut entries = std::collections::BTreeMap::<u32, Vec<Value>>::new();
        for (name, value) in fields {
            let name = std::str::from_utf8(&name).map_err(|_| corrupt("a journal field"))?;
            let (seq, field) = name
                .split_once(':')
                .ok_or_else(|| corrupt("a journal field"))?;
            let seq: u32 = seq.parse().map_err(|_| corrupt("a journal field"))?;
            let Some(at) = ORDER.iter().position(|f| *f == field) else {
                continue;
            };
            entries
                .entry(seq)
                .or_insert_with(|| vec![Value::Nil; ORDER.len()])[at] = value;
        }
        entries
            .into_iter()
            .map(|(seq, fields)| parse_step(scope, key, seq, &fields))
            .collect()
    }

    async fn resolve_step(
        &self,
        scope: &Scope,
        key: &Key,
        seq: u32,
        name: &str,
        resolution: &StepResolution,
    ) -> Result<bool, Error> {
        let keys = self.keys(scope, key);
        let invocation = SCRIPTS
            .resolve_step
            .on(&keys.record)
            .key(&keys.journal)
            .arg(seq)
            .arg(name);
        let invocation = match resolution {
            StepResolution::Completed(output) => {
                self.check_length(&keys.record, output.len(), "a step's output")
                    .await
                    .map_err(unrecorded_as_store)?;
                invocation.arg("completed").arg(&output[..])
            }
            StepResolution::Rerun => invocation.arg("rerun").arg(""),
        };
        let (value, acknowledged) = self
            .invoke_replicated(invocation)
            .await
            .map_err(unrecorded_as_store)?;
        if !acknowledged {
            return Err(self.not_replicated("step's resolution"));
        }
        Ok(int(&value) == Some(1))
    }
}

#[async_trait]
impl Wake for RedisStore {
    async fn wait_for_change(
        &self,
        scope: &Scope,
        key: &Key,
        timeout: Duration,
    ) -> Result<(), Error> {
        self.wait_on(scope, key, None, timeout).await.map(drop)
    }

    async fn wait_for_outcome(
        &self,
        request: &BeginRequest<'_>,
        timeout: Duration,
    ) -> Result<Option<Begin>, Error> {
        Ok(self
            .wait_on(
                request.scope,
                request.key,
                Some(request.fingerprint),
                timeout,
            )
            .await?
            .map(Begin::Replay))
    }

    fn wakes_across_processes(&self) -> bool {
        self.shared.listening.load(Ordering::Relaxed)
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

    #[test]
    /// Each transition has a script of its own: no two fields of
    /// `SCRIPTS` hold the same code (a copy-paste slip would make one
    /// transition run another's script).
    fn every_transition_has_its_own_script() {
        let s = &*SCRIPTS;
        let all = [
            &s.claim,
            &s.peek,
            &s.look,
            &s.renew,
            &s.complete,
            &s.release,
            &s.forget,
            &s.begin_step,
            &s.abandon_step,
            &s.complete_step,
            &s.resolve_step,
            &s.keep_steps,
        ];
        let hashes: std::collections::HashSet<_> = all
            .iter()
            .map(|lua| lua.on("k").evalsha().get_packed_command())
            .collect();
        assert_eq!(hashes.len(), all.len());
    }
}
