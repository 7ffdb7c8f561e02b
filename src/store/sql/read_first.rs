//! Whether a claim on the pool reads the record first.
//!
//! A read before the claim answers a duplicate (a replay, a key in
//! progress, a key reused) with one plain read, which takes no lock and
//! writes nothing; it costs a first execution one round trip more. Which
//! is cheaper depends on the calls. On MariaDB a claim that finds the key
//! taken costs one upsert that changes nothing, on a row lock that ends
//! with its statement; on SQLite it takes the database's write lock for
//! that statement (waiting its turn at the store's gate). Both therefore
//! read first only while duplicates are common among the calls
//! ([`ReadFirst::WhileDuplicates`]): a retry storm or a redelivered batch
//! is answered by reads, a run of first executions claims at once, and a
//! rare duplicate among them pays one write that changes nothing.
//! PostgreSQL's claim answers a duplicate without writing, and never
//! reads first.
//!
//! The read only ever answers a duplicate: the key is handed out by the
//! claim alone, whichever way this goes.

use std::sync::atomic::{AtomicU32, Ordering};

/// A backend's rule for reading before the claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadFirst {
    Never,
    /// While more than a quarter or so of the recent claims found the key
    /// taken (a retry storm, a redelivered batch): see [`Duplicates`].
    WhileDuplicates,
}

/// A store's rule, and for [`ReadFirst::WhileDuplicates`] the share of its
/// recent claims that found the key taken, as a moving average (each claim
/// weighs an eighth), in 1/1024ths. Updates race without harm: a lost one
/// only shifts when the rule turns.
#[derive(Debug)]
pub(crate) struct Duplicates {
    rule: ReadFirst,
    share: AtomicU32,
}

/// The whole scale: every recent claim found its key taken.
const ALL: u32 = 1024;
/// Above this share the store reads first.
const READ_FIRST_ABOVE: u32 = ALL / 4;

impl Duplicates {
    /// A store's count under `rule`, of no claim yet.
    pub(crate) fn new(rule: ReadFirst) -> Self {
        Duplicates {
            rule,
            share: AtomicU32::new(0),
        }
    }

    /// Whether the next claim reads first.
    pub(crate) fn read_first(&self) -> bool {
        match self.rule {
            ReadFirst::Never => false,
            ReadFirst::WhileDuplicates => self.share.load(Ordering::Relaxed) > READ_FIRST_ABOVE,
        }
    }

    /// Counts a call's answer: its key was found taken (`true`: a replay,
    /// a key in progress or reused, by the read or by the claim), or the
    /// call claimed it. Only [`ReadFirst::WhileDuplicates`] counts: a
    /// store that never reads first keeps no shared counter busy between
    /// the tasks of a process.
    pub(crate) fn note(&self, taken: bool) {
        if self.rule != ReadFirst::WhileDuplicates {
            return;
        }
        let share = self.share.load(Ordering::Relaxed);
        let share = if taken {
            share + (ALL - share).div_ceil(8)
        } else {
            share - share.div_ceil(8)
        };
        self.share.store(share, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_ignores_the_calls() {
        let d = Duplicates::new(ReadFirst::Never);
        for _ in 0..100 {
            d.note(true);
        }
        assert_eq!(d.share.load(Ordering::Relaxed), 0);
        assert!(!d.read_first());
    }

    #[test]
    fn reads_first_while_duplicates_are_common_and_stops_after() {
        let d = Duplicates::new(ReadFirst::WhileDuplicates);
        assert!(!d.read_first(), "first executions only: claim at once");
        // One duplicate among first executions does not turn it.
        d.note(true);
        for _ in 0..3 {
            d.note(false);
        }
        assert!(!d.read_first());
        // A run of duplicates turns it within a few calls...
        let turned = (1..=10).find(|_| {
            d.note(true);
            d.read_first()
        });
        assert!(turned.is_some_and(|n| n <= 4), "{turned:?}");
        // ...it holds while they go on, reaching the whole scale...
        for _ in 0..100 {
            d.note(true);
        }
        assert_eq!(d.share.load(Ordering::Relaxed), ALL);
        // ...and first executions turn it back, down to nothing.
        let back = (1..=30).find(|_| {
            d.note(false);
            !d.read_first()
        });
        assert!(back.is_some_and(|n| n <= 12), "{back:?}");
        for _ in 0..100 {
            d.note(false);
        }
        assert_eq!(d.share.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn one_claim_in_two_taken_reads_first() {
        let d = Duplicates::new(ReadFirst::WhileDuplicates);
        for _ in 0..50 {
            d.note(false);
            d.note(true);
        }
        assert!(d.read_first());
    }
}
