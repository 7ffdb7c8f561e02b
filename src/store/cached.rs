//! A bounded cache of this process's completed outcomes in front of a
//! store: a replay answered from memory.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::time::Instant;

use async_trait::async_trait;
use lru::LruCache;

use super::{BeginRequest, Capabilities, Detach, Immediate, Journal, Store};
use idem_core::error::Error;
use idem_core::fingerprint::Fingerprint;
use idem_core::key::{Key, Scope};
use idem_core::record::{Begin, Claim, ClaimToken, Outcome, Record};

/// An entry's scope and key: shared with the caller's (a clone only
/// counts a reference), so a look-up copies no text.
type Slot = (Scope, Key);

/// A store with a local replay cache: a bounded LRU of the outcomes this
/// process completed, by scope and key, so that a retry reaching the same
/// process is replayed from memory, without a round trip.
///
/// The store stays the one that decides: a claim, a completion, a release
/// and every answer the cache does not hold go to it. The cache answers a
/// replay only when it is sure the store would answer the same:
///
/// - **the same payload**: an entry replays only to a request with the
///   fingerprint it was completed with; another payload asks the store
///   (which answers [`Error::KeyReused`]);
/// - **not expired**: an entry lives for the claim's TTL from the moment
///   the claim's first completion was *sent*, less a margin, measured on
///   this process's monotonic clock. The store starts the record's TTL
///   when a completion *runs*, which is later, so the entry expires first
///   (the store's clock may be set anywhere; only its rate matters). The
///   margin, a millisecond and a thousandth of the TTL, covers the store's
///   rounding of its clock to milliseconds, a difference of rate between
///   the two clocks (NTP slews at most half a thousandth), and pauses of
///   this process's clock (a suspended machine) up to that long;
/// - **not replaced**: a completed record is replaced only after it
///   expires, or after [`forget`](Store::forget). Forgetting through this
///   store drops the entry, also when the forget races a completion still
///   on its way.
///
/// One limit follows from a cache being local: a key forgotten through
/// another process (or another store value on the same records) is still
/// replayed here from its entry, until the entry expires. Forget through
/// the cached store, or leave the cache off where operators forget keys
/// from elsewhere.
///
/// Only outcomes completed through this store are cached: replays read
/// from the store are answered without their expiry, so they are not.
/// Transactional mode does not use the cache (a completion commits with
/// the caller's transaction, after the call).
///
/// ```
/// use idem::{run, Call, CachedStore, MemoryStore};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let store = CachedStore::new(MemoryStore::new(), 10_000).unwrap();
/// let charge = || run(&store, Call::new("charge", "key-1", &42), async {
///     Ok::<_, idem::Error>(7)
/// });
/// assert_eq!(charge().await.unwrap(), 7);
/// assert_eq!(charge().await.unwrap(), 7); // replayed from memory
/// # });
/// ```
#[derive(Debug)]
pub struct CachedStore<S> {
    inner: S,
    cache: Arc<Cache>,
}

impl<S: Clone> Clone for CachedStore<S> {
    fn clone(&self) -> Self {
        CachedStore {
            inner: self.inner.clone(),
            cache: self.cache.clone(),
        }
    }
}

impl<S: Store> CachedStore<S> {
    /// `inner` with a cache of at most `capacity` outcomes (the least
    /// recently used go first). A capacity of 0 is refused.
    pub fn new(inner: S, capacity: usize) -> Result<Self, Error> {
        let capacity = NonZeroUsize::new(capacity).ok_or_else(|| {
            Error::Config("the local replay cache needs a capacity of at least 1".to_owned())
        })?;
        Ok(CachedStore {
            inner,
            cache: Arc::new(Cache {
                state: Mutex::new(State {
                    entries: LruCache::new(capacity),
                    claims: HashMap::new(),
                    forgets: 0,
                }),
                capacity,
            }),
        })
    }
}

impl<S> CachedStore<S> {
    /// The store behind the cache.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// How many outcomes the cache holds (expired ones included until
    /// they are looked up or pushed out).
    pub fn cached(&self) -> usize {
        self.cache.lock().entries.len()
    }
}

#[derive(Debug)]
struct Cache {
    state: Mutex<State>,
    capacity: NonZeroUsize,
}

#[derive(Debug)]
struct State {
    entries: LruCache<Slot, Entry>,
    /// Each claim this store granted and that has not ended yet, by
    /// token: what its completion is cached under.
    claims: HashMap<ClaimToken, Granted>,
    /// How many forgets have run: a completion caches its outcome only if
    /// none ran while it was on its way.
    forgets: u64,
}

/// A claim granted through the cache.
#[derive(Debug)]
struct Granted {
    fingerprint: Fingerprint,
    /// When its first completion was sent: a completion sent again, once
    /// an answer was lost, may find the first one landed, and a store need
    /// not start the record's TTL again for it (Redis does not).
    sent: Option<Instant>,
}

#[derive(Debug)]
struct Entry {
    fingerprint: Fingerprint,
    outcome: Outcome,
    /// When the store's record may expire, at the earliest.
    until: Instant,
}

impl Cache {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The cached answer to `request`, if the cache is sure of it.
    fn answer(&self, request: &BeginRequest<'_>) -> Option<Begin> {
        let slot = slot(request.scope, request.key);
        let mut state = self.lock();
        let entry = state.entries.get(&slot)?;
        if entry.until <= Instant::now() {
            state.entries.pop(&slot);
            return None;
        }
        (entry.fingerprint == *request.fingerprint).then(|| Begin::Replay(entry.outcome.clone()))
    }

    fn claimed(&self, token: ClaimToken, fingerprint: Fingerprint) {
        let mut state = self.lock();
        // Claims whose end went elsewhere (a store that failed, a process
        // that lost its answer) are not kept past the cache's size.
        if state.claims.len() >= self.capacity.get() {
            state.claims.clear();
        }
        let granted = Granted {
            fingerprint,
            sent: None,
        };
        state.claims.insert(token, granted);
    }

    /// Notes a completion of `token`'s claim sent now: when its first was
    /// sent, and how many forgets had run.
    fn sending(&self, token: &ClaimToken) -> (Instant, u64) {
        let now = Instant::now();
        let mut state = self.lock();
        let sent = match state.claims.get_mut(token) {
            Some(granted) => *granted.sent.get_or_insert(now),
            None => now,
        };
        (sent, state.forgets)
    }

    fn ended(&self, token: &ClaimToken) -> Option<Granted> {
        self.lock().claims.remove(token)
    }
}

/// How long before the store's record may expire its cache entry expires
/// (see [`CachedStore`]): a millisecond, and a thousandth of `ttl`.
fn margin(ttl: Duration) -> Duration {
    Duration::from_millis(1) + ttl / 1000
}

fn slot(scope: &Scope, key: &Key) -> Slot {
    (scope.clone(), key.clone())
}

impl<S: Store> CachedStore<S> {
    /// Notes a claim the inner store granted, for its completion to cache.
    fn noted(
        &self,
        request: &BeginRequest<'_>,
        answer: Result<Begin, Error>,
    ) -> Result<Begin, Error> {
        let answer = answer?;
        if let Begin::Claimed(claim) = &answer {
            self.cache.claimed(claim.token, *request.fingerprint);
        }
        Ok(answer)
    }

    /// Caches the outcome of a completion the inner store answered with
    /// `done`, the claim's first having been sent at `sent`, and this one
    /// when `forgets` keys had been forgotten.
    fn completed(
        &self,
        claim: &Claim,
        outcome: &Outcome,
        (sent, forgets): (Instant, u64),
        done: Result<(), Error>,
    ) -> Result<(), Error> {
        if let Err(err) = done {
            // A completion that may be sent again keeps what it caches.
            if matches!(err, Error::LeaseLost) {
                self.cache.ended(&claim.token);
            }
            return Err(err);
        }
        let granted = self.cache.ended(&claim.token);
        let until = claim
            .ttl
            .checked_sub(margin(claim.ttl))
            .and_then(|kept| sent.checked_add(kept));
        let (Some(Granted { fingerprint, .. }), Some(until)) = (granted, until) else {
            return Ok(());
        };
        let mut state = self.cache.lock();
        if state.forgets == forgets {
            let entry = Entry {
                fingerprint,
                outcome: outcome.clone(),
                until,
            };
            state.entries.put(slot(&claim.scope, &claim.key), entry);
        }
        Ok(())
    }
}

#[async_trait]
impl<S: Store> Store for CachedStore<S> {
    async fn begin(&self, request: &BeginRequest<'_>) -> Result<Begin, Error> {
        if let Some(answer) = self.cache.answer(request) {
            return Ok(answer);
        }
        let answer = self.inner.begin(request).await;
        self.noted(request, answer)
    }

    async fn peek(&self, request: &BeginRequest<'_>) -> Result<Option<Begin>, Error> {
        if let Some(answer) = self.cache.answer(request) {
            return Ok(Some(answer));
        }
        self.inner.peek(request).await
    }

    async fn renew(&self, claim: &Claim) -> Result<(), Error> {
        self.inner.renew(claim).await
    }

    async fn complete(&self, claim: &Claim, outcome: &Outcome) -> Result<(), Error> {
        let (sent, forgets) = self.cache.sending(&claim.token);
        let done = self.inner.complete(claim, outcome).await;
        self.completed(claim, outcome, (sent, forgets), done)
    }

    async fn release(&self, claim: &Claim) -> Result<(), Error> {
        self.cache.ended(&claim.token);
        self.inner.release(claim).await
    }

    async fn get(&self, scope: &Scope, key: &Key) -> Result<Option<Record>, Error> {
        self.inner.get(scope, key).await
    }

    async fn forget(&self, scope: &Scope, key: &Key) -> Result<bool, Error> {
        // Counted first, so that a completion on its way now does not
        // cache what is about to be forgotten; dropped after, so that no
        // replay from the entry overlaps the forget's end.
        self.cache.lock().forgets += 1;
        let forgotten = self.inner.forget(scope, key).await;
        let mut state = self.cache.lock();
        state.forgets += 1;
        state.entries.pop(&slot(scope, key));
        drop(state);
        forgotten
    }

    async fn purge_expired(&self, batch: usize) -> Result<u64, Error> {
        self.inner.purge_expired(batch).await
    }

    fn journal(&self) -> Option<&dyn Journal> {
        self.inner.journal()
    }

    fn capabilities(&self) -> Capabilities<'_> {
        // The cache answers what it holds at once, whatever the store
        // behind it; waiting is the store's.
        let inner = self.inner.capabilities();
        let mut offered = Capabilities::default().with_immediate(self);
        offered.wake = inner.wake;
        offered.deletes_expired_itself = inner.deletes_expired_itself;
        if inner.detach.is_some() {
            offered = offered.with_detach(self);
        }
        offered
    }
}

impl<S: Store> Immediate for CachedStore<S> {
    fn begin_now(&self, request: &BeginRequest<'_>) -> Option<Result<Begin, Error>> {
        if let Some(answer) = self.cache.answer(request) {
            return Some(Ok(answer));
        }
        let answer = self.inner.capabilities().immediate?.begin_now(request)?;
        Some(self.noted(request, answer))
    }

    fn complete_now(&self, claim: &Claim, outcome: &Outcome) -> Option<Result<(), Error>> {
        let immediate = self.inner.capabilities().immediate?;
        let (sent, forgets) = self.cache.sending(&claim.token);
        let done = immediate.complete_now(claim, outcome)?;
        Some(self.completed(claim, outcome, (sent, forgets), done))
    }
}

impl<S: Store> Detach for CachedStore<S> {
    fn detach(&self) -> Option<Arc<dyn Store>> {
        // A dropped caller's claim is handed back, or its outcome stored,
        // through the same cache.
        let inner = self.inner.capabilities().detached()?;
        Some(Arc::new(CachedStore {
            inner,
            cache: self.cache.clone(),
        }))
    }
}
