//! Issue 8: the reliability suite. What happens when things break:
//!
//! - `crash`: a process is killed (SIGKILL) while it holds a claim; after
//!   the lease a retry takes over, completes once, and the killed owner's
//!   fence can never complete nor release the key;
//! - `network`: a TCP proxy between a `PostgresStore` and PostgreSQL cuts
//!   every connection while bodies run; callers get retryable errors, no
//!   record is completed without its outcome, and the retries complete each
//!   key exactly once;
//! - `model`: random sequences of begin / complete / release / expire /
//!   purge over several keys and owners, on the memory store, SQLite,
//!   PostgreSQL and MariaDB, checked step by step against a reference model
//!   of the state machine;
//! - `input`: arbitrary bytes and strings given to the key and the
//!   `Idempotency-Key` header parsers never panic, and exactly the valid
//!   keys are accepted.
//!
//! Every test is bounded in time (seconds, not minutes).

#[path = "conformance/servers.rs"]
mod servers;

#[path = "reliability/crash.rs"]
mod crash;
#[path = "reliability/input.rs"]
mod input;
#[path = "reliability/model.rs"]
mod model;
#[path = "reliability/network.rs"]
mod network;
