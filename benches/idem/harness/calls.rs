//! What the rows ask of a backend ([`Calls`] on every one, [`Bench`] on
//! the SQL ones), and the calls themselves: plain, or idem's in record
//! mode, with or without the local replay cache.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use idem::{idempotent, CachedStore, Fingerprint, Store};

use super::dialect::Dialect;
use super::goal::Goals;
use super::measure::{throughput_of, Span};
use super::reference::Script;

#[derive(Debug, thiserror::Error)]
pub enum PayError {
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error(transparent)]
    Idem(#[from] idem::Error),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Plain,
    Record,
    /// Record mode through a `CachedStore`.
    Cached,
    PlainTx,
    Tx,
}

/// A record-mode call on `store` whose body is `write`: the backend's
/// business write (and the body's time).
#[idempotent(key = key, store = store, scope = "bench.pay", fingerprint = amount,
             lease = "60s", wait = "30s")]
pub async fn record<S, W>(store: &S, key: &str, amount: i64, write: W) -> Result<i64, PayError>
where
    S: Store,
    W: Future<Output = Result<i64, PayError>> + Send,
{
    write.await
}

/// A call of `mode` outside a transaction, on a store and the same records
/// behind a local replay cache: `write` alone (the plain call), or as the
/// body of a record-mode call.
pub async fn outside_tx<S, W>(
    (store, cached): (&S, &CachedStore<S>),
    mode: Mode,
    key: &str,
    amount: i64,
    write: W,
) -> Result<i64, PayError>
where
    S: Store,
    W: Future<Output = Result<i64, PayError>> + Send,
{
    match mode {
        Mode::Plain => write.await,
        Mode::Record => record(store, key, amount, write).await,
        Mode::Cached => record(cached, key, amount, write).await,
        Mode::PlainTx | Mode::Tx => unreachable!("{mode:?} takes a transaction"),
    }
}

/// What the measurements of every backend (B1, B2, B4, the store's cost
/// per call) need from it.
pub trait Calls: Send + Sync + Sized + 'static {
    fn label(&self) -> &'static str;
    fn goals(&self) -> &'static Goals;
    /// The plain call's one write (the body's), as the rows name it.
    fn write(&self) -> &'static str;
    /// Whether the body can be in the caller's transaction (B1's
    /// transactional rows).
    fn transactional(&self) -> bool;
    /// Whether the reference is measured here: `None` where the backend
    /// has none, `Some(Err(why))` where it cannot be.
    fn reference_status(&self) -> Option<Result<(), &'static str>> {
        None
    }
    /// One call of the reference's `script`: the statements or scripts
    /// the store sends, without idem's engine; asked only where
    /// `reference_status` answers `Some(Ok(()))`.
    fn reference_call(&self, script: Script) -> impl Future<Output = ()> + Send;
    /// The reference's calls per second: `script` by `tasks` clients for
    /// `window`; asked only where `reference_status` answers `Some(Ok(()))`.
    /// A loop of [`Calls::reference_call`] unless the backend has another
    /// client.
    fn reference(
        self: &Arc<Self>,
        script: Script,
        tasks: usize,
        window: Duration,
    ) -> impl Future<Output = f64> + Send {
        self.loop_reference(script, tasks, Span::For(window))
    }
    /// A second reference that B1 and B7 measure beside the first, as the
    /// row names it, and its script, sent by a sqlx loop: the same
    /// statements sent by the plain call's and idem's own client, where
    /// the reference is another client's (pgbench); or, in transactional
    /// mode where the store reads the record beside the caller's
    /// transaction before its claim, the statements without that read.
    fn second_reference(&self, _script: Script) -> Option<(&'static str, Script)> {
        None
    }
    /// The reference's calls per second sent by a loop of
    /// [`Calls::reference_call`] (on the pool, for SQL), by `tasks` tasks
    /// for `span`.
    fn loop_reference(
        self: &Arc<Self>,
        script: Script,
        tasks: usize,
        span: Span,
    ) -> impl Future<Output = f64> + Send {
        let this = self.clone();
        throughput_of(tasks, span, move || {
            let this = this.clone();
            async move { this.reference_call(script).await }
        })
    }
    /// A call of `mode` (with a body taking `body` after its write) on a
    /// key of its own.
    fn call(self: &Arc<Self>, mode: Mode, body: Duration) -> impl Future<Output = ()> + Send;
    /// A call of `mode` on `key`, the body its write alone.
    fn call_key(self: &Arc<Self>, mode: Mode, key: &str) -> impl Future<Output = ()> + Send;
    fn store(&self) -> Arc<dyn Store>;
}

/// What the SQL backends' other measurements need from them.
pub trait Bench: Calls {
    fn dialect(&self) -> &'static Dialect;
    /// The records table.
    fn records(&self) -> String;
    /// Where SQLite's file is.
    fn dir(&self) -> &Path;
    /// The same tables through a pool of its own, of `connections`
    /// connections.
    fn resized(&self, connections: u32) -> impl Future<Output = Self> + Send;
    /// Closes the pool.
    fn close(&self) -> impl Future<Output = ()> + Send;
    /// Creates B8's entity table.
    fn entity_setup(&self) -> impl Future<Output = ()> + Send;
    /// One entity-mode call of B8.
    fn entity_call(self: &Arc<Self>, key: &str, body: Duration) -> impl Future<Output = ()> + Send;
    /// The usual recipe: read the key, take a lock, write.
    fn check_then_act(self: &Arc<Self>) -> impl Future<Output = ()> + Send;
    /// B3's reference: the store's statements for a first execution in
    /// record mode, without idem's engine, on one connection held for the
    /// call as check-then-act holds its own.
    fn held_reference(self: &Arc<Self>) -> impl Future<Output = ()> + Send;
    /// B3's reference for transactional mode: B1's (the store's
    /// statements in a transaction, after the read of the record the
    /// store sends before its claim there), by a sqlx loop.
    fn tx_reference(self: &Arc<Self>) -> impl Future<Output = ()> + Send;
    /// The same backend with tables of its own.
    fn fresh(&self, tag: &str) -> impl Future<Output = Self> + Send;
    /// Bulk-loads `n` completed records `k1..=kn` of `scope`.
    fn fill(
        &self,
        scope: &str,
        fp: &Fingerprint,
        n: usize,
        expires_at: i64,
    ) -> impl Future<Output = ()> + Send;
    /// Drops the tables.
    fn drop_tables(&self) -> impl Future<Output = ()> + Send;
}
