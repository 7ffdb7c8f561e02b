//! [`MemoryStore`](super::MemoryStore)'s records: a vector of records in
//! the order they were written, and a hashed index of their positions.
//!
//! Each index entry is eight bytes, a position and 32 bits of its record's
//! hash, so that:
//! - growing the index rehashes from the entries alone, never reading a
//!   record (a read of a record is a cache miss once there are many);
//! - a look-up reads a record only when 32 bits of its hash match;
//! - a record is kept once, with its scope and key, and nothing else.
//!
//! Records written together, which are read together again when their
//! calls are retried, sit side by side; a removal moves the last record
//! into the gap.
//!
//! Hashed with foldhash, seeded at random per map: SipHash, the standard
//! map's, is slow for the short keys every replay hashes. Foldhash resists only
//! the simplest flooding of one bucket, which is enough for a store that
//! lives in one process (for tests and tools), not for a server's map of
//! untrusted keys.

use std::hash::BuildHasher;

use foldhash::fast::RandomState;
use hashbrown::HashTable;

use idem_core::error::Error;
use idem_core::key::{Key, Scope};
use idem_core::record::Record;

/// Where a record is: its position in the records, and 32 bits of the
/// hash of its scope and key.
#[derive(Clone, Copy, Debug)]
struct Entry {
    hash: u32,
    at: u32,
}

/// The 64-bit hash the table sees for 32 bits of ours: the table takes its
/// bucket from the low bits and its 7-bit tag from the top ones, so both
/// come from the bits kept.
fn spread(hash: u32) -> u64 {
    (u64::from(hash) << 32) | u64::from(hash)
}

/// The records, by scope and key.
#[derive(Debug, Default)]
pub(super) struct Records {
    index: HashTable<Entry>,
    held: Vec<Record>,
    hasher: RandomState,
}

impl Records {
    /// How many records are held.
    pub(super) fn len(&self) -> usize {
        self.held.len()
    }

    /// The hash of `(scope, key)`, which [`Records::find`] and
    /// [`Records::push`] take, so that a claim hashes once.
    pub(super) fn hash(&self, scope: &Scope, key: &Key) -> u32 {
        // The stored form of the scope says all of it.
        let hash = self.hasher.hash_one((scope.as_str(), key.as_str()));
        (hash ^ (hash >> 32)) as u32
    }

    /// The position of the record of `(scope, key)`, whose hash is `hash`.
    pub(super) fn find(&self, hash: u32, scope: &Scope, key: &Key) -> Option<usize> {
        let held = &self.held;
        self.index
            .find(spread(hash), |e| {
                e.hash == hash && {
                    let r = &held[e.at as usize];
                    r.key == *key && r.scope == *scope
                }
            })
            .map(|e| e.at as usize)
    }

    /// The record of `(scope, key)`.
    pub(super) fn get(&self, scope: &Scope, key: &Key) -> Option<&Record> {
        let at = self.find(self.hash(scope, key), scope, key)?;
        Some(&self.held[at])
    }

    /// The record at `at`, a position [`Records::find`] gave.
    pub(super) fn at(&self, at: usize) -> &Record {
        &self.held[at]
    }

    /// The record at `at`, to change it in place; its scope and key must
    /// stay as they are.
    pub(super) fn at_mut(&mut self, at: usize) -> &mut Record {
        &mut self.held[at]
    }

    /// Adds `record`, whose scope and key (of hash `hash`) no record holds.
    pub(super) fn push(&mut self, hash: u32, record: Record) -> Result<(), Error> {
        let at = u32::try_from(self.held.len())
            .map_err(|_| Error::Store("the memory store holds as many records as it can".into()))?;
        self.held.push(record);
        self.index
            .insert_unique(spread(hash), Entry { hash, at }, |e| spread(e.hash));
        Ok(())
    }

    /// Removes the record at `at` and returns it, moving the last record
    /// into its place.
    pub(super) fn swap_remove(&mut self, at: usize) -> Record {
        let r = &self.held[at];
        let hash = self.hash(&r.scope, &r.key);
        if let Ok(entry) = self.index.find_entry(spread(hash), |e| e.at as usize == at) {
            entry.remove();
        }
        let last = self.held.len() - 1;
        if at != last {
            let r = &self.held[last];
            let hash = self.hash(&r.scope, &r.key);
            if let Some(entry) = self.index.find_mut(spread(hash), |e| e.at as usize == last) {
                // `at` came from a `u32` position.
                entry.at = at as u32;
            }
        }
        self.held.swap_remove(at)
    }

    /// Removes the record of `(scope, key)` and returns it.
    pub(super) fn remove(&mut self, scope: &Scope, key: &Key) -> Option<Record> {
        let at = self.find(self.hash(scope, key), scope, key)?;
        Some(self.swap_remove(at))
    }

    /// The records, in their order.
    pub(super) fn iter(&self) -> impl Iterator<Item = &Record> {
        self.held.iter()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use idem_core::fingerprint::Fingerprint;
    use idem_core::record::State;

    fn record(scope: &Scope, key: &Key, fence: i64) -> Record {
        Record {
            scope: scope.clone(),
            key: key.clone(),
            fingerprint: Fingerprint::from_digest([0; 32]),
            state: State::InProgress,
            fence,
            token: None,
            lease_until: None,
            outcome: None,
            created_at: 0,
            expires_at: 0,
        }
    }

    /// Adds, replaces and removes records of a few hundred keys in two
    /// scopes, in a pseudo-random order, and checks after each step that
    /// every key finds exactly the record a plain map says it holds: a
    /// removal that moved the last record must have moved its index entry
    /// with it.
    #[test]
    fn finds_what_a_plain_map_holds() {
        let scopes = [Scope::from("a"), Scope::from("b")];
        let keys: Vec<Key> = (0..300)
            .map(|i| Key::try_from(format!("k{i}").as_str()).unwrap())
            .collect();
        let mut records = Records::default();
        let mut model: HashMap<(usize, usize), i64> = HashMap::new();
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for step in 0..20_000i64 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let (s, k) = ((seed % 2) as usize, ((seed >> 8) % 300) as usize);
            let (scope, key) = (&scopes[s], &keys[k]);
            let hash = records.hash(scope, key);
            match (records.find(hash, scope, key), (seed >> 20) % 3) {
                (None, _) => {
                    records.push(hash, record(scope, key, step)).unwrap();
                    model.insert((s, k), step);
                }
                (Some(at), 0) => {
                    assert_eq!(records.swap_remove(at).fence, model[&(s, k)]);
                    model.remove(&(s, k));
                }
                (Some(at), _) => {
                    records.at_mut(at).fence = step;
                    model.insert((s, k), step);
                }
            }
            assert_eq!(records.len(), model.len());
            if step % 97 == 0 {
                for (s, scope) in scopes.iter().enumerate() {
                    for (k, key) in keys.iter().enumerate() {
                        let found = records.get(scope, key).map(|r| r.fence);
                        assert_eq!(found, model.get(&(s, k)).copied(), "step {step}");
                    }
                }
            }
        }
        assert_eq!(records.iter().count(), model.len());
    }
}
