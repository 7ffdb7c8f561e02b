//! How a transition reaches Redis: its script by `EVALSHA` (loaded
//! again after `NOSCRIPT`), followed by `WAIT` in the same pipeline when
//! writes wait for replicas ([`RedisStore::wait_for_replicas`] says what
//! a failover can still lose), the check of an argument's length against
//! the server's `proto-max-bulk-len`, and Redis's errors as the store's.

use std::time::Duration;

use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{ErrorKind, RedisError, ServerErrorKind, Value};

use super::replies::int;
use super::scripts::Invocation;
use super::{Conn, RedisStore};
use idem_core::error::Error;
use idem_core::record::{duration_millis, Millis};

/// The longest duration written, in milliseconds (about 35,000 years):
/// the scripts compute in Lua's doubles, exact below 2^53.
const MAX_MILLIS: Millis = 1 << 50;

/// The least `proto-max-bulk-len` a Redis server can be set to (1 MiB):
/// no argument up to this long is refused for its length.
const MIN_BULK_LIMIT: usize = 1 << 20;

impl RedisStore {
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

    /// The command that publishes on a record's channel.
    pub(super) fn publish(&self) -> &'static str {
        if self.is_cluster() {
            "SPUBLISH"
        } else {
            "PUBLISH"
        }
    }

    /// Runs a script; `EVALSHA`, then `SCRIPT LOAD` and `EVALSHA` again
    /// if the server does not know it (a restart, a failover, a `SCRIPT
    /// FLUSH`).
    pub(super) async fn invoke(&self, invocation: Invocation<'_>) -> Result<Value, Error> {
        Ok(self.invoke_then(invocation, None).await?.0)
    }

    /// [`invoke`](Self::invoke), then, when replicas are asked for, `WAIT`
    /// in the same pipeline, on the same connection to the same primary:
    /// `WAIT` counts the replicas that have everything this connection
    /// saw written, so on another connection (or after a failover, on
    /// another primary) it would prove nothing. Sent again as a whole if
    /// the connection fails. Answers the script's reply and whether enough
    /// replicas acknowledged.
    pub(super) async fn invoke_replicated(
        &self,
        invocation: Invocation<'_>,
    ) -> Result<(Value, bool), Error> {
        self.invoke_then(invocation, self.replicas).await
    }

    pub(super) async fn invoke_then(
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

    /// Refuses an argument of `len` bytes (`what`) that the server would
    /// refuse for its length (longer than its `proto-max-bulk-len`), with
    /// [`Error::Unrecorded`]: sent, it would be refused every time, and
    /// the server would close the connection, failing every command on
    /// it. Only an argument longer than 1 MiB (the least the setting can
    /// be) is checked, by asking the server that holds the record at
    /// `record` (`CONFIG GET`); a server that does not answer is sent the
    /// argument, and its refusal is recognized ([`too_large`]).
    pub(super) async fn check_length(
        &self,
        record: &str,
        len: usize,
        what: &str,
    ) -> Result<(), Error> {
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

    /// Nothing when the write (`what`) was `acknowledged` by as many
    /// replicas as asked for; else the store error that says it was not.
    pub(super) fn replicated(&self, acknowledged: bool, what: &str) -> Result<(), Error> {
        match acknowledged {
            true => Ok(()),
            false => Err(self.not_replicated(what)),
        }
    }

    pub(super) fn not_replicated(&self, what: &str) -> Error {
        let (replicas, timeout) = self.replicas.unwrap_or_default();
        Error::store(format!(
            "the {what} was not acknowledged by {replicas} Redis replica(s) within {timeout:?}"
        ))
    }
}

pub(super) fn store_error(err: RedisError) -> Error {
    if too_large(&err) {
        return Error::Unrecorded(format!(
            "the Redis server refused an argument longer than its proto-max-bulk-len: {err}"
        ));
    }
    Error::store(err)
}

/// A refusal for length as a store error, where what was refused is not
/// an outcome.
pub(super) fn unrecorded_as_store(err: Error) -> Error {
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

/// A duration as the scripts take it: milliseconds, at most [`MAX_MILLIS`].
pub(super) fn millis(d: Duration) -> Millis {
    duration_millis(d).min(MAX_MILLIS)
}
