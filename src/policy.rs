//! How long records live, how long a claim is held, and what a duplicate
//! does while the first call runs.

use std::time::Duration;

/// What a duplicate does when it finds the key in progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InProgressPolicy {
    /// Wait up to this long for the first call to finish, then replay its
    /// outcome (or run, if it released the key). Past the bound: `InProgress`.
    Wait(Duration),
    /// Answer `InProgress` at once.
    FailFast,
}

/// The knobs of one idempotent operation. Defaults: records kept 24 hours,
/// claims leased for 30 seconds, duplicates wait up to 5 seconds.
///
/// The attribute sets them with `ttl = "…"`, `lease = "…"`, `wait = "…"`
/// or `fail_fast`; the engine's [`Call`](crate::Call) takes a `Policy`:
///
/// ```
/// use std::time::Duration;
/// use idem::{Call, InProgressPolicy, Policy};
///
/// // Keep a payment's answer a week; a duplicate answers 409 at once
/// // instead of waiting for the first call.
/// let policy = Policy::new()
///     .ttl(Duration::from_secs(7 * 24 * 3600))
///     .lease(Duration::from_secs(60))
///     .fail_fast();
/// assert_eq!(policy.in_progress, InProgressPolicy::FailFast);
/// assert_eq!(policy.wait_bound(), Duration::ZERO);
///
/// let call = Call::new("payments::capture", "order-42", &1200u64).with_policy(policy);
/// # let _ = call;
/// // The same through the attribute:
/// // #[idempotent(key = cmd.key, store = self.store, ttl = "7d", lease = "60s", fail_fast)]
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// How long a record (and so the key) is kept after its claim and after
    /// its completion.
    pub ttl: Duration,
    /// How long a claim is held before another caller may take it over.
    pub lease: Duration,
    /// What a duplicate does while the first call runs.
    pub in_progress: InProgressPolicy,
}

impl Policy {
    /// The default record lifetime: 24 hours.
    pub const DEFAULT_TTL: Duration = Duration::from_secs(24 * 60 * 60);
    /// The default lease: 30 seconds.
    pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
    /// The default bound on waiting for an in-progress call: 5 seconds.
    pub const DEFAULT_WAIT: Duration = Duration::from_secs(5);

    /// The defaults.
    pub const fn new() -> Self {
        Policy {
            ttl: Self::DEFAULT_TTL,
            lease: Self::DEFAULT_LEASE,
            in_progress: InProgressPolicy::Wait(Self::DEFAULT_WAIT),
        }
    }

    /// Sets how long records are kept.
    pub const fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Sets how long a claim is held.
    pub const fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Duplicates wait up to `bound` for the first call's outcome.
    pub const fn wait(mut self, bound: Duration) -> Self {
        self.in_progress = InProgressPolicy::Wait(bound);
        self
    }

    /// Duplicates fail at once with `InProgress`.
    pub const fn fail_fast(mut self) -> Self {
        self.in_progress = InProgressPolicy::FailFast;
        self
    }

    /// The wait bound (zero when failing fast).
    pub fn wait_bound(&self) -> Duration {
        match self.in_progress {
            InProgressPolicy::Wait(bound) => bound,
            InProgressPolicy::FailFast => Duration::ZERO,
        }
    }
}

impl Default for Policy {
    fn default() -> Self {
        Policy::new()
    }
}
