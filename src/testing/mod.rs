//! The store conformance suite, for anyone who writes a [`Store`].
//!
//! Every store built into this crate passes the same cases: the
//! contract's own (`idem_core::testing`, each transition called straight
//! on the store), and these, through the engine: claim and replay, payload mismatch, a duplicate in progress, lease takeover with
//! fencing, release, ttl expiry, purge, a dropped caller, scoping, a
//! storm of concurrent calls, and the step journal of durable steps (see
//! the functions below). A store of your own
//! is done when it passes them too, on the real backend.
//!
//! Each case is a plain `async fn` that takes a fresh store and panics
//! when the store breaks the contract. [`store_conformance!`](crate::store_conformance)
//! turns them into tests: one `#[test]` per case, each on a store of its
//! own, run on a multi-thread tokio runtime of 4 workers (as
//! `#[tokio::test(flavor = "multi_thread", worker_threads = 4)]` would).
//! Call a case yourself to run it in a harness of your own.
//!
//! Every case works on keys that no other case, process or run uses, so
//! that stores on one database (one table, even) can run the cases in
//! parallel and again and again. The cases sleep for a few hundred
//! milliseconds where leases and ttls must lapse; the slowest takes about
//! a second.
//!
//! ```
//! // tests/store_conformance.rs of a crate with a store of its own; the
//! // memory store stands in for it here.
//! use idem::MemoryStore as MyStore;
//!
//! // A future yielding the store, and a guard dropped when the case ends
//! // (a temporary directory, a table to drop; `()` for none).
//! idem::store_conformance!(my_store, async { (MyStore::new(), ()) });
//! # fn main() {}
//! ```
//!
//! Enabled by the `testing` feature, which is meant for dev-dependencies:
//!
//! ```toml
//! [dev-dependencies]
//! idem = { version = "0.1", features = ["testing"] }
//! ```

mod expiry;
mod fencing;
mod replays;
mod steps;
mod support;
mod waiting;

// The cases through the engine, by what they hold the store to.
pub use self::expiry::{
    forget_frees_the_key, purge_removes_only_expired, ttl_expiry_frees_the_key,
};
pub use self::fencing::{
    forgotten_owner_is_fenced_out, lease_takeover_fences_the_old_owner,
    purged_claim_cannot_touch_the_next_one, zombie_completion_after_release_is_refused,
};
pub use self::replays::{
    execute_once_then_replay, fingerprint_ignores_field_order, invalid_keys_rejected,
    key_reused_with_other_payload, replayable_error_replayed, scopes_do_not_collide,
    transient_error_released_then_retried, unbounded_wait_is_accepted,
};
pub use self::steps::{
    a_clean_failure_takes_the_start_back, a_journal_of_another_payload_is_refused,
    a_step_completion_sent_again_is_accepted, a_step_journal_is_fenced,
    forget_and_purge_clear_the_journal, steps_called_in_another_order_are_refused,
    steps_in_doubt_follow_their_policy, steps_replay_after_a_failed_attempt,
    storm_runs_each_step_once,
};
pub use self::waiting::{
    dropped_caller_hands_the_key_back, fail_fast_reports_in_progress,
    in_progress_duplicate_waits_then_replays, live_owner_keeps_its_claim, storm_runs_each_key_once,
    ttl_shorter_than_lease_keeps_the_claim,
};
// The contract's own cases, which call the store's transitions straight,
// and the runner of every case.
pub use idem_core::testing::{
    a_claim_is_granted_once, a_claim_sent_again_is_granted_again, a_completed_key_replays,
    a_completion_sent_again_is_accepted, a_lapsed_lease_is_taken_over_and_fenced,
    a_release_frees_the_key, an_expired_record_frees_the_key, another_payload_is_refused,
    forget_frees_the_key_and_fences_its_owner, purge_deletes_only_what_expired, run_case,
    the_journal_replays_and_fences,
};

#[cfg(doc)]
use crate::store::Store;

/// Emits the [store conformance suite](crate::testing) for one store: a
/// module named `$backend` with one `#[test]` per case.
///
/// `$make` is a future yielding `(store, guard)`: the store under test, and
/// whatever keeps its resources alive (a temporary directory, a guard that
/// drops the store's table), dropped when the case ends; `()` for nothing.
/// It is evaluated afresh for every case, in the new module, which sees the
/// items of the module around it. Each test builds a multi-thread tokio
/// runtime of 4 workers and runs the case on it, so the crate needs no
/// tokio of its own.
///
/// The step cases need a step journal ([`Store::journal`]), and fail on a
/// store that answers none: a wrapper that forgets to forward it would
/// run durable steps unjournaled. A store that keeps no journal on purpose
/// says so, `store_conformance!(name, make, journal = false)`, and the
/// step cases are left out.
///
/// ```
/// use idem::MemoryStore;
///
/// // `memory::execute_once_then_replay`, `memory::storm_runs_each_key_once`, ...
/// idem::store_conformance!(memory, async { (MemoryStore::new(), ()) });
/// # fn main() {}
/// ```
#[macro_export]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
macro_rules! store_conformance {
    ($backend:ident, $make:expr $(,)?) => {
        $crate::store_conformance!($backend, $make, journal = true);
    };
    ($backend:ident, $make:expr, journal = true $(,)?) => {
        mod $backend {
            #[allow(unused_imports)]
            use super::*;

            $crate::store_conformance!(@records $make);
            $crate::store_conformance!(@cases $make;
                steps_replay_after_a_failed_attempt,
                steps_in_doubt_follow_their_policy,
                a_step_journal_is_fenced,
                a_clean_failure_takes_the_start_back,
                a_step_completion_sent_again_is_accepted,
                steps_called_in_another_order_are_refused,
                a_journal_of_another_payload_is_refused,
                forget_and_purge_clear_the_journal,
                storm_runs_each_step_once,
            );
        }
    };
    ($backend:ident, $make:expr, journal = false $(,)?) => {
        mod $backend {
            #[allow(unused_imports)]
            use super::*;

            $crate::store_conformance!(@records $make);
        }
    };
    // The cases every store passes, a journal or not.
    (@records $make:expr) => {
        $crate::store_conformance!(@cases $make;
            execute_once_then_replay,
            fingerprint_ignores_field_order,
            key_reused_with_other_payload,
            in_progress_duplicate_waits_then_replays,
            fail_fast_reports_in_progress,
            transient_error_released_then_retried,
            replayable_error_replayed,
            ttl_expiry_frees_the_key,
            purge_removes_only_expired,
            lease_takeover_fences_the_old_owner,
            zombie_completion_after_release_is_refused,
            purged_claim_cannot_touch_the_next_one,
            live_owner_keeps_its_claim,
            ttl_shorter_than_lease_keeps_the_claim,
            dropped_caller_hands_the_key_back,
            unbounded_wait_is_accepted,
            scopes_do_not_collide,
            invalid_keys_rejected,
            forget_frees_the_key,
            forgotten_owner_is_fenced_out,
            storm_runs_each_key_once,
            a_claim_is_granted_once,
            a_claim_sent_again_is_granted_again,
            a_completed_key_replays,
            another_payload_is_refused,
            a_lapsed_lease_is_taken_over_and_fenced,
            a_release_frees_the_key,
            a_completion_sent_again_is_accepted,
            an_expired_record_frees_the_key,
            purge_deletes_only_what_expired,
            forget_frees_the_key_and_fences_its_owner,
            the_journal_replays_and_fences,
        );
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {$(
        #[test]
        fn $case() {
            $crate::testing::run_case(async {
                let (store, _guard) = $make.await;
                $crate::testing::$case(store).await;
            });
        }
    )*};
}
