//! In-process wake-ups for duplicates waiting on a key, and the outcome
//! of a completion in this process handed straight to them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

use tokio::sync::Notify;

use idem_core::fingerprint::Fingerprint;
use idem_core::key::{Key, Scope};
use idem_core::record::{Claim, ClaimToken, Millis, Outcome, Record};

type Slot = (String, String);

/// The map key of `(scope, key)`.
fn slot_of(scope: &Scope, key: &Key) -> Slot {
    (scope.as_str().to_owned(), key.as_str().to_owned())
}

/// The duplicates of this process waiting on each key, so that a completion
/// or release in this process wakes them at once instead of at their next
/// poll, and a completion answers them without a read.
#[derive(Debug, Default)]
pub(crate) struct Waiters {
    slots: Mutex<HashMap<Slot, Arc<Waiting>>>,
    /// The keys whose completion this process is sending, with how many
    /// completions of each are under way (see [`Waiters::complete`]).
    completing: Mutex<HashMap<Slot, usize>>,
    /// The claims this process holds on the store's pool, by key (see
    /// [`Waiters::hold`]).
    held: Mutex<HashMap<Slot, Held>>,
}

/// A claim this process holds: its token, the payload it was granted for,
/// and until when its lease runs as this process last heard of it.
#[derive(Debug, Clone, Copy)]
struct Held {
    token: ClaimToken,
    fingerprint: Fingerprint,
    until: Instant,
}

/// How many held keys are kept before the expired ones are dropped at the
/// next hold.
const HELD_SWEEP: usize = 1024;

/// The waiters of one key.
#[derive(Debug, Default)]
struct Waiting {
    notify: Notify,
    /// The outcome a claim of this process completed with, by the claim's
    /// token.
    handed: Mutex<Option<(ClaimToken, Outcome)>>,
}

/// What a waiter saw when it began to wait, after registering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Look {
    /// Nobody holds the key (completed, released, lapsed, gone): look at
    /// the record again.
    Free,
    /// A live claim of the waiter's payload holds it, with this token
    /// (`None` on rows written before tokens existed). A claim of another
    /// payload is [`Look::Free`] to the waiter: the record answers it (the
    /// key is reused), and nothing of that claim may be handed to it.
    HeldBy(Option<ClaimToken>),
}

impl Look {
    /// What a waiter for a claim of the payload of `fingerprint` (of any
    /// payload: `None`) makes of a live claim with `token`, granted for
    /// the payload of `holder`.
    pub(crate) fn held(
        token: Option<ClaimToken>,
        holder: &Fingerprint,
        fingerprint: Option<&Fingerprint>,
    ) -> Self {
        match fingerprint.is_none_or(|f| f == holder) {
            true => Look::HeldBy(token),
            false => Look::Free,
        }
    }

    /// What the same waiter makes of `record` at `now`.
    pub(crate) fn at(
        record: Option<&Record>,
        now: Millis,
        fingerprint: Option<&Fingerprint>,
    ) -> Self {
        match record {
            Some(r) if r.holds_lease(now) => Look::held(r.token, &r.fingerprint, fingerprint),
            _ => Look::Free,
        }
    }
}

impl Waiters {
    fn slot(&self, scope: &Scope, key: &Key) -> Option<Arc<Waiting>> {
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        if slots.is_empty() {
            return None;
        }
        slots.get(&slot_of(scope, key)).cloned()
    }

    /// Wakes every waiter of `(scope, key)`. Cheap when nobody waits.
    pub(crate) fn wake(&self, scope: &Scope, key: &Key) {
        if let Some(waiting) = self.slot(scope, key) {
            waiting.notify.notify_waiters();
        }
    }

    /// Wakes the waiters of the claim's key with the outcome the claim
    /// was just completed with, in the store, committed. A waiter takes it
    /// only if the claim it saw holding the key is this one (same token):
    /// it was waiting when the record became this outcome, so that is its
    /// answer, as a read right then would have said. A record kept for no
    /// time (a zero TTL) is expired once completed: nothing is handed.
    pub(crate) fn hand_over(&self, claim: &Claim, outcome: &Outcome) {
        let Some(waiting) = self.slot(&claim.scope, &claim.key) else {
            return;
        };
        if !claim.ttl.is_zero() {
            *waiting.handed.lock().unwrap_or_else(|e| e.into_inner()) =
                Some((claim.token, outcome.clone()));
        }
        waiting.notify.notify_waiters();
    }

    /// Notes that this process holds `claim`, granted for the payload of
    /// `fingerprint`, until its lease runs out, counted from now. A
    /// duplicate of this process that waits for the key then knows its
    /// holder without reading the record ([`Waiters::held_here`]).
    #[cfg_attr(not(feature = "_sql"), allow(dead_code))]
    pub(crate) fn hold(&self, claim: &Claim, fingerprint: &Fingerprint) {
        let Some(until) = Instant::now().checked_add(claim.lease) else {
            return;
        };
        let slot = slot_of(&claim.scope, &claim.key);
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if held.len() >= HELD_SWEEP {
            // Claims whose caller vanished without completing or releasing.
            let now = Instant::now();
            held.retain(|_, held| held.until > now);
        }
        let fingerprint = *fingerprint;
        held.insert(
            slot,
            Held {
                token: claim.token,
                fingerprint,
                until,
            },
        );
    }

    /// Notes that `claim`'s lease was renewed now, if this process still
    /// notes it as held ([`Waiters::hold`]).
    #[cfg_attr(not(feature = "_sql"), allow(dead_code))]
    pub(crate) fn renewed(&self, claim: &Claim) {
        let Some(until) = Instant::now().checked_add(claim.lease) else {
            return;
        };
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(held) = held.get_mut(&slot_of(&claim.scope, &claim.key)) {
            if held.token == claim.token {
                held.until = until;
            }
        }
    }

    /// Forgets that this process holds `claim` (completed, released,
    /// lost): a later claim of the key, by another token, is left alone.
    #[cfg_attr(not(feature = "_sql"), allow(dead_code))]
    pub(crate) fn unhold(&self, claim: &Claim) {
        if !self
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
        {
            self.unhold_at(&slot_of(&claim.scope, &claim.key), claim.token);
        }
    }

    fn unhold_at(&self, slot: &Slot, token: ClaimToken) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if held.get(slot).is_some_and(|held| held.token == token) {
            held.remove(slot);
        }
    }

    /// The token of the claim this process holds on `(scope, key)`, and
    /// the payload it was granted for, while its lease runs by this
    /// process's reckoning: a waiter here can then wait for it without
    /// reading the record, since its completion or release wakes the
    /// waiters here itself. A claim it no longer holds in fact (taken over
    /// elsewhere) fails to complete, and that failure wakes the waiters
    /// too.
    #[cfg_attr(not(feature = "_sql"), allow(dead_code))]
    pub(crate) fn held_here(&self, scope: &Scope, key: &Key) -> Option<(ClaimToken, Fingerprint)> {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if held.is_empty() {
            return None;
        }
        held.get(&slot_of(scope, key))
            .filter(|held| held.until > Instant::now())
            .map(|held| (held.token, held.fingerprint))
    }

    /// Runs `complete`, the completion of `claim` with `outcome`, and then
    /// hands the outcome over to the waiters of its key (or, when it
    /// failed or was dropped, wakes them to look at the record).
    ///
    /// Until it returns, messages from the store about this key
    /// ([`Waiters::wake_from_store`]) are left to it: the store tells its
    /// listeners of a completion when it commits, which is before the
    /// completing connection gets its own reply, and a waiter woken by
    /// that message would find nothing handed over yet and read the record
    /// again, through the pool with every other waiter of the key.
    #[cfg_attr(not(any(feature = "_sql", feature = "redis")), allow(dead_code))]
    pub(crate) async fn complete<Fut, E>(
        &self,
        claim: &Claim,
        outcome: &Outcome,
        complete: Fut,
    ) -> Result<(), E>
    where
        Fut: std::future::Future<Output = Result<(), E>>,
    {
        let mut completing = Completing::start(self, claim);
        let completed = complete.await;
        // Before the hand-over: a waiter that registers after it must not
        // take the key for held, and read the record instead.
        completing.unhold();
        if completed.is_ok() {
            self.hand_over(claim, outcome);
            completing.handed = true;
        }
        completed
    }

    /// Wakes the waiters of `(scope, key)` for a message from the store (a
    /// `NOTIFY`, a published message), unless a completion of the key in
    /// this process is under way: that completion wakes them itself, with
    /// its outcome in hand (see [`Waiters::complete`]).
    #[cfg_attr(not(any(feature = "postgres", feature = "redis")), allow(dead_code))]
    pub(crate) fn wake_from_store(&self, scope: &Scope, key: &Key) {
        {
            let completing = self.completing.lock().unwrap_or_else(|e| e.into_inner());
            if !completing.is_empty() && completing.contains_key(&slot_of(scope, key)) {
                return;
            }
        }
        self.wake(scope, key);
    }

    /// Wakes every waiter of every key (the notifications of a lost
    /// connection may be lost too: each waiter looks again).
    #[cfg_attr(not(any(feature = "postgres", feature = "redis")), allow(dead_code))]
    pub(crate) fn wake_all(&self) {
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        for waiting in slots.values() {
            waiting.notify.notify_waiters();
        }
    }

    /// Waits for a wake-up of `(scope, key)` or `timeout`, whichever comes
    /// first, while another caller holds the key. `look` reads the record
    /// (with the database's clock) after the waiter is registered, so a
    /// wake between the caller's last look and the registration is not
    /// lost: if the key is no longer held (completed, released, lapsed)
    /// this returns at once.
    ///
    /// Answers the outcome handed over by the completion of the very claim
    /// `look` saw holding the key, or `None`: look at the record.
    pub(crate) async fn wait<F, Fut, E>(
        &self,
        scope: &Scope,
        key: &Key,
        timeout: Duration,
        look: F,
    ) -> Result<Option<Outcome>, E>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<Look, E>>,
    {
        let slot = slot_of(scope, key);
        let waiting = {
            let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            slots.entry(slot.clone()).or_default().clone()
        };
        let _cleanup = Cleanup {
            waiters: self,
            slot,
            waiting: &waiting,
        };
        let notified = waiting.notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let Look::HeldBy(holder) = look().await? else {
            return Ok(None);
        };
        let _ = tokio::time::timeout(timeout, notified).await;
        let handed = waiting.handed.lock().unwrap_or_else(|e| e.into_inner());
        Ok(handed
            .as_ref()
            .filter(|(token, _)| holder == Some(*token))
            .map(|(_, outcome)| outcome.clone()))
    }
}

/// A completion under way in this process (see [`Waiters::complete`]).
/// When it drops without having handed its outcome over (it failed, or
/// its caller dropped it), the waiters of its key are woken to look at
/// the record: the store's message, if it sent one, was left to it.
struct Completing<'a> {
    waiters: &'a Waiters,
    claim: &'a Claim,
    slot: Slot,
    handed: bool,
    /// Whether the note that this process holds the claim is dropped.
    unheld: bool,
}

impl<'a> Completing<'a> {
    fn start(waiters: &'a Waiters, claim: &'a Claim) -> Self {
        let slot = slot_of(&claim.scope, &claim.key);
        let mut completing = waiters.completing.lock().unwrap_or_else(|e| e.into_inner());
        *completing.entry(slot.clone()).or_default() += 1;
        Completing {
            waiters,
            claim,
            slot,
            handed: false,
            unheld: false,
        }
    }

    /// Drops the note that this process holds the claim (once).
    fn unhold(&mut self) {
        if !self.unheld {
            self.waiters.unhold_at(&self.slot, self.claim.token);
            self.unheld = true;
        }
    }
}

impl Drop for Completing<'_> {
    fn drop(&mut self) {
        // The mark goes first: a message that comes after the wake below
        // must wake the waiters again, not be left to a completion that
        // is over.
        self.unhold();
        {
            let mut completing = self
                .waiters
                .completing
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if let Some(count) = completing.get_mut(&self.slot) {
                *count -= 1;
                if *count == 0 {
                    completing.remove(&self.slot);
                }
            }
        }
        if !self.handed {
            self.waiters.wake(&self.claim.scope, &self.claim.key);
        }
    }
}

/// Removes a slot when its last waiter leaves.
struct Cleanup<'a> {
    waiters: &'a Waiters,
    slot: Slot,
    waiting: &'a Arc<Waiting>,
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        let mut slots = self.waiters.slots.lock().unwrap_or_else(|e| e.into_inner());
        // The map's handle and ours: nobody else waits.
        if Arc::strong_count(self.waiting) <= 2 {
            if let Some(existing) = slots.get(&self.slot) {
                if Arc::ptr_eq(existing, self.waiting) {
                    slots.remove(&self.slot);
                }
            }
        }
    }
}

/// Implements [`Wake`](crate::store::Wake) for a store whose duplicates
/// wait through its [`Waiters`], from one `wait_on`: the store's wait on
/// `(scope, key)` for a claim of the payload of `fingerprint` (of any
/// payload: `None`), for at most `timeout`, answering the outcome handed
/// over by that claim's completion, if any ([`Waiters::wait`]). Both
/// waits of the trait are that one; `across`, when given, says whether
/// other processes wake the store now.
///
/// ```ignore
/// wake_by_waiting!(Shared, |store, scope, key, fingerprint, timeout| {
///     store.waiters.wait(scope, key, timeout, || store.look(..)).await
/// });
/// ```
macro_rules! wake_by_waiting {
    (
        $store:ty $(where $($generic:ident: $bound:path),*)?,
        |$this:ident, $scope:ident, $key:ident, $fingerprint:ident, $timeout:ident| $wait:block
        $(, across: $across:expr)? $(,)?
    ) => {
        impl$(<$($generic: $bound),*>)? $store {
            async fn wait_on(
                &self,
                $scope: &$crate::key::Scope,
                $key: &$crate::key::Key,
                $fingerprint: Option<&$crate::Fingerprint>,
                $timeout: ::std::time::Duration,
            ) -> Result<Option<$crate::record::Outcome>, $crate::Error> {
                let $this = self;
                $wait
            }
        }

        #[::async_trait::async_trait]
        impl$(<$($generic: $bound),*>)? $crate::store::Wake for $store {
            async fn wait_for_change(
                &self,
                scope: &$crate::key::Scope,
                key: &$crate::key::Key,
                timeout: ::std::time::Duration,
            ) -> Result<(), $crate::Error> {
                self.wait_on(scope, key, None, timeout).await.map(drop)
            }

            async fn wait_for_outcome(
                &self,
                request: &$crate::record::BeginRequest<'_>,
                timeout: ::std::time::Duration,
            ) -> Result<Option<$crate::record::Begin>, $crate::Error> {
                let handed = self
                    .wait_on(request.scope, request.key, Some(request.fingerprint), timeout)
                    .await?;
                Ok(handed.map($crate::record::Begin::Replay))
            }

            $(
                fn wakes_across_processes(&self) -> bool {
                    ($across)(self)
                }
            )?
        }
    };
}
pub(crate) use wake_by_waiting;

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[tokio::test]
    async fn wake_is_prompt_and_slots_are_cleaned() {
        let waiters = Arc::new(Waiters::default());
        let scope = Scope::new("op");
        let key = Key::new("k").unwrap();
        let w = waiters.clone();
        let (s2, k2) = (scope.clone(), key.clone());
        let start = Instant::now();
        let task = tokio::spawn(async move {
            w.wait(&s2, &k2, Duration::from_secs(10), || async {
                Ok::<_, ()>(Look::HeldBy(None))
            })
            .await
        });
        while waiters.slots.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        waiters.wake(&scope, &key);
        assert_eq!(task.await.unwrap().unwrap(), None);
        assert!(start.elapsed() < Duration::from_secs(5));
        assert!(waiters.slots.lock().unwrap().is_empty());
    }

    fn claim(token: ClaimToken, ttl: Duration) -> Claim {
        Claim {
            scope: Scope::new("op"),
            key: Key::new("k").unwrap(),
            fence: 1,
            token,
            lease: Duration::from_secs(1),
            ttl,
        }
    }

    /// A waiter that saw `holder` hold the key, woken by the completion of
    /// `completed` with the outcome `"done"`.
    async fn handed_to(holder: Look, completed: ClaimToken, ttl: Duration) -> Option<Outcome> {
        let waiters = Arc::new(Waiters::default());
        let w = waiters.clone();
        let task = tokio::spawn(async move {
            let (scope, key) = (Scope::new("op"), Key::new("k").unwrap());
            w.wait(&scope, &key, Duration::from_secs(10), || async {
                Ok::<_, ()>(holder)
            })
            .await
        });
        while waiters.slots.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        // Registered; give the waiter time to look and sleep.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let outcome = Outcome {
            kind: idem_core::record::OutcomeKind::Ok,
            body: b"\"done\"".to_vec(),
        };
        waiters.hand_over(&claim(completed, ttl), &outcome);
        let handed = task.await.unwrap().unwrap();
        assert!(waiters.slots.lock().unwrap().is_empty());
        handed
    }

    #[tokio::test]
    async fn the_holders_completion_is_handed_over() {
        let token = ClaimToken::new();
        let ttl = Duration::from_secs(60);
        let handed = handed_to(Look::HeldBy(Some(token)), token, ttl).await;
        assert_eq!(handed.map(|o| o.body), Some(b"\"done\"".to_vec()));
    }

    /// Another claim's completion (the waiter saw a later claim hold the
    /// key), a holder without a token, or a record kept for no time: the
    /// waiter looks at the record itself.
    #[tokio::test]
    async fn nothing_else_is_handed_over() {
        let (token, ttl) = (ClaimToken::new(), Duration::from_secs(60));
        let other = Look::HeldBy(Some(ClaimToken::new()));
        assert_eq!(handed_to(other, token, ttl).await, None);
        assert_eq!(handed_to(Look::HeldBy(None), token, ttl).await, None);
        let holder = Look::HeldBy(Some(token));
        assert_eq!(handed_to(holder, token, Duration::ZERO).await, None);
    }

    /// A waiter of the key `claim(token)` holds, waiting with a long
    /// timeout, and a handle to see whether it has returned.
    fn waiting(
        waiters: &Arc<Waiters>,
        token: ClaimToken,
    ) -> tokio::task::JoinHandle<Option<Outcome>> {
        let w = waiters.clone();
        tokio::spawn(async move {
            let (scope, key) = (Scope::new("op"), Key::new("k").unwrap());
            w.wait(&scope, &key, Duration::from_secs(30), || async {
                Ok::<_, ()>(Look::HeldBy(Some(token)))
            })
            .await
            .unwrap()
        })
    }

    async fn registered(waiters: &Waiters) {
        while waiters.slots.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    fn done() -> Outcome {
        Outcome {
            kind: idem_core::record::OutcomeKind::Ok,
            body: b"\"done\"".to_vec(),
        }
    }

    /// The store's message of a completion sent from this process arrives
    /// before the completion's reply: the waiters stay asleep until the
    /// completion hands them its outcome, and do not read the record.
    #[tokio::test]
    async fn a_message_during_a_completion_here_is_left_to_it() {
        let waiters = Arc::new(Waiters::default());
        let token = ClaimToken::new();
        let waiter = waiting(&waiters, token);
        registered(&waiters).await;
        let (reply, replied) = tokio::sync::oneshot::channel::<()>();
        let w = waiters.clone();
        let completion = tokio::spawn(async move {
            let claim = claim(token, Duration::from_secs(60));
            let (scope, key) = (claim.scope.clone(), claim.key.clone());
            w.complete(&claim, &done(), async {
                // Committed: the store tells every listener, this one too.
                w.wake_from_store(&scope, &key);
                replied.await.unwrap();
                Ok::<_, ()>(())
            })
            .await
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            !waiter.is_finished(),
            "the message woke a waiter of a completion under way"
        );
        reply.send(()).unwrap();
        completion.await.unwrap().unwrap();
        assert_eq!(waiter.await.unwrap().map(|o| o.body), Some(done().body));
        // Once it returned, the store's messages of the key wake again.
        assert!(waiters.completing.lock().unwrap().is_empty());
        let waiter = waiting(&waiters, token);
        registered(&waiters).await;
        waiters.wake_from_store(&Scope::new("op"), &Key::new("k").unwrap());
        assert_eq!(waiter.await.unwrap(), None);
    }

    /// A completion that fails, or whose caller drops it, wakes the waiters
    /// whose message it held back: they look at the record themselves.
    #[tokio::test]
    async fn a_failed_or_dropped_completion_wakes_its_waiters() {
        let waiters = Arc::new(Waiters::default());
        let token = ClaimToken::new();
        let claim = claim(token, Duration::from_secs(60));
        let waiter = waiting(&waiters, token);
        registered(&waiters).await;
        let failed = waiters
            .complete(&claim, &done(), async {
                waiters.wake_from_store(&claim.scope, &claim.key);
                Err::<(), _>("the reply was lost")
            })
            .await;
        assert_eq!(failed, Err("the reply was lost"));
        let woken = tokio::time::timeout(Duration::from_secs(5), waiter).await;
        assert_eq!(woken.expect("woken").unwrap(), None);

        let waiter = waiting(&waiters, token);
        registered(&waiters).await;
        let w = waiters.clone();
        let completion = tokio::spawn(async move {
            let claim = claim_for(token);
            w.complete(&claim, &done(), async {
                w.wake_from_store(&claim.scope, &claim.key);
                std::future::pending::<Result<(), ()>>().await
            })
            .await
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished());
        completion.abort();
        let woken = tokio::time::timeout(Duration::from_secs(5), waiter).await;
        assert_eq!(woken.expect("woken").unwrap(), None);
        assert!(waiters.completing.lock().unwrap().is_empty());
    }

    /// A claim held here answers a waiter's look without the store until
    /// it is completed, released or its lease runs out; the completion
    /// forgets it before it hands over, so a waiter that starts after the
    /// hand-over reads the record instead of waiting for nothing.
    #[tokio::test]
    async fn a_claim_held_here_is_known_until_it_ends() {
        let waiters = Arc::new(Waiters::default());
        let (scope, key) = (Scope::new("op"), Key::new("k").unwrap());
        let token = ClaimToken::new();
        let held = claim(token, Duration::from_secs(60));
        assert_eq!(waiters.held_here(&scope, &key), None);
        let fingerprint = Fingerprint::of_bytes(b"payload");
        waiters.hold(&held, &fingerprint);
        assert_eq!(waiters.held_here(&scope, &key), Some((token, fingerprint)));
        // Another claim's end leaves it alone.
        waiters.unhold(&claim(ClaimToken::new(), Duration::from_secs(60)));
        assert_eq!(waiters.held_here(&scope, &key), Some((token, fingerprint)));
        // A renewal moves its lease on; another claim's leaves it alone.
        waiters.renewed(&held);
        waiters.renewed(&claim(ClaimToken::new(), Duration::ZERO));
        assert_eq!(waiters.held_here(&scope, &key), Some((token, fingerprint)));

        // A waiter that looks here while it is held gets the outcome.
        let w = waiters.clone();
        let waiter = tokio::spawn(async move {
            let (scope, key) = (Scope::new("op"), Key::new("k").unwrap());
            w.wait(&scope, &key, Duration::from_secs(30), || async {
                let (holder, _) = w.held_here(&scope, &key).expect("held here");
                Ok::<_, ()>(Look::HeldBy(Some(holder)))
            })
            .await
            .unwrap()
        });
        registered(&waiters).await;
        waiters
            .complete(&held, &done(), async { Ok::<_, ()>(()) })
            .await
            .unwrap();
        // After the completion nothing is held: a later waiter reads.
        assert_eq!(waiters.held_here(&scope, &key), None);
        assert_eq!(waiter.await.unwrap().map(|o| o.body), Some(done().body));

        // A lease that ran out is not held any more.
        let lapsed = Claim {
            lease: Duration::ZERO,
            ..claim(token, Duration::from_secs(60))
        };
        waiters.hold(&lapsed, &fingerprint);
        assert_eq!(waiters.held_here(&scope, &key), None);
        // A dropped completion forgets it too.
        waiters.hold(&held, &fingerprint);
        let w = waiters.clone();
        let completion = tokio::spawn(async move {
            let held = claim_for(token);
            w.complete(&held, &done(), std::future::pending::<Result<(), ()>>())
                .await
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        completion.abort();
        let _ = completion.await;
        assert_eq!(waiters.held_here(&scope, &key), None);
    }

    fn claim_for(token: ClaimToken) -> Claim {
        claim(token, Duration::from_secs(60))
    }

    #[tokio::test]
    async fn changed_record_returns_at_once() {
        let waiters = Waiters::default();
        let scope = Scope::new("op");
        let key = Key::new("k").unwrap();
        let start = Instant::now();
        waiters
            .wait(&scope, &key, Duration::from_secs(10), || async {
                Ok::<_, ()>(Look::Free)
            })
            .await
            .unwrap();
        assert!(start.elapsed() < Duration::from_secs(5));
    }
}
