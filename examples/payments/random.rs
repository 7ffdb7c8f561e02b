//! Random identifiers (`pay_4fJ2...`) and draws, without a crate for it.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use super::clock::unix_now;

/// A random identifier with a prefix: `pay_4fJ2...` (22 characters of
/// base 62, from the standard library's randomly keyed hasher).
pub fn new_id(prefix: &str) -> String {
    const ALPHABET: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut id = format!("{prefix}_");
    for _ in 0..2 {
        let mut bits = random_u64();
        for _ in 0..11 {
            id.push(ALPHABET[(bits % 62) as usize] as char);
            bits /= 62;
        }
    }
    id
}

/// 64 random bits: `RandomState` is keyed randomly per thread and its keys
/// change with every instance; a counter and the clock make each call
/// distinct.
pub fn random_u64() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::hash::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.write_u128(unix_now().as_nanos());
    hasher.finish()
}

/// A uniform draw in `[0, 1)`.
pub fn random_unit() -> f64 {
    (random_u64() >> 11) as f64 / (1u64 << 53) as f64
}
