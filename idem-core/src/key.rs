//! Client keys and operation scopes.

use std::cell::Cell;
use std::fmt;
use std::sync::Arc;

/// The longest key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 255;

/// A validated idempotency key: 1 to 255 bytes of visible ASCII
/// (`0x21..=0x7E`, so no spaces and no control characters).
// Shared, not copied: a call hands its key to its claim, its record and
// its guard, and cloning it only counts a reference.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(Arc<str>);

/// Which key rule a value broke.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// No key was given (an `Option` key that is `None`).
    #[error("no idempotency key was given")]
    Missing,
    /// The key is the empty string.
    #[error("the key is empty; it must be 1 to 255 bytes of visible ASCII")]
    Empty,
    /// The key is longer than [`MAX_KEY_LEN`].
    #[error("the key is {len} bytes long; at most 255 bytes are allowed")]
    TooLong {
        /// The key's length in bytes.
        len: usize,
    },
    /// The key holds a byte outside visible ASCII.
    #[error("the key has byte 0x{byte:02x} at offset {offset}; only visible ASCII (0x21..=0x7e) is allowed")]
    InvalidByte {
        /// Where the first offending byte is.
        offset: usize,
        /// The offending byte.
        byte: u8,
    },
    /// A key derived from a value ([`key_of`](crate::fingerprint::key_of))
    /// whose value could not be serialized.
    #[error("the key's value could not be serialized: {0}")]
    Unserializable(String),
}

impl Key {
    /// Validates `value` as a key.
    pub fn new(value: impl Into<String>) -> Result<Self, KeyError> {
        let value = value.into();
        Self::checked(&value)
    }

    /// Validates `value` as a key, copying it once.
    pub fn checked(value: &str) -> Result<Self, KeyError> {
        Self::check(value)?;
        Ok(Key(Arc::from(value)))
    }

    /// Checks the key rules without allocating.
    pub fn check(value: &str) -> Result<(), KeyError> {
        if value.is_empty() {
            return Err(KeyError::Empty);
        }
        if value.len() > MAX_KEY_LEN {
            return Err(KeyError::TooLong { len: value.len() });
        }
        // Every byte is looked at, without an early exit, so that the
        // compiler checks many at once; where one is wrong is found after.
        let printable = |b: u8| b.wrapping_sub(0x21) < 0x7e - 0x21 + 1;
        if value.bytes().fold(true, |ok, b| ok & printable(b)) {
            return Ok(());
        }
        match value.bytes().position(|b| !printable(b)) {
            Some(offset) => Err(KeyError::InvalidByte {
                offset,
                byte: value.as_bytes()[offset],
            }),
            None => Ok(()),
        }
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for Key {
    type Error = KeyError;
    fn try_from(value: String) -> Result<Self, KeyError> {
        Key::new(value)
    }
}

impl TryFrom<&str> for Key {
    type Error = KeyError;
    fn try_from(value: &str) -> Result<Self, KeyError> {
        Key::checked(value)
    }
}

impl std::str::FromStr for Key {
    type Err = KeyError;
    fn from_str(value: &str) -> Result<Self, KeyError> {
        Key::checked(value)
    }
}

/// Values that can serve as an idempotency key: strings, [`Key`] itself,
/// and integers (their decimal form). Used by the `key = ...` argument of
/// `#[idempotent]`, so a field of any of these types can be named directly.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be used as an idempotency key",
    label = "not a key",
    note = "a key is a `str`, a `String`, an `idem::Key`, an integer, a `uuid::Uuid` \
            (feature `uuid`), an `Option` of one of these, or a reference to any of them; \
            wrap a `Display` value as `key = idem::Displayed(&id)`, or derive a key from \
            fields with `key = idem::key_of(&(a, b))`"
)]
pub trait AsKey {
    /// Validates and converts the value.
    fn to_key(&self) -> Result<Key, KeyError>;
}

impl AsKey for Key {
    fn to_key(&self) -> Result<Key, KeyError> {
        Ok(self.clone())
    }
}

impl AsKey for str {
    fn to_key(&self) -> Result<Key, KeyError> {
        Key::checked(self)
    }
}

impl AsKey for String {
    fn to_key(&self) -> Result<Key, KeyError> {
        Key::checked(self)
    }
}

impl<T: AsKey + ?Sized> AsKey for &T {
    fn to_key(&self) -> Result<Key, KeyError> {
        (**self).to_key()
    }
}

impl<T: AsKey> AsKey for Option<T> {
    /// `None` is a missing key: [`KeyError::Missing`].
    fn to_key(&self) -> Result<Key, KeyError> {
        match self {
            Some(value) => value.to_key(),
            None => Err(KeyError::Missing),
        }
    }
}

macro_rules! integer_keys {
    ($($ty:ty),*) => {$(
        impl AsKey for $ty {
            fn to_key(&self) -> Result<Key, KeyError> {
                // Written on the stack, then copied once: 40 bytes hold
                // any of these integers in decimal.
                let mut text = [0; 40];
                let mut rest = &mut text[..];
                let _ = std::io::Write::write_fmt(&mut rest, format_args!("{self}"));
                let len = 40 - rest.len();
                Ok(Key(Arc::from(std::str::from_utf8(&text[..len]).unwrap_or_default())))
            }
        }
    )*};
}
integer_keys!(u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize);

/// A UUID is a key in its hyphenated lowercase form
/// (`67e55044-10b1-426f-9247-bb680e5fe0c8`).
#[cfg(feature = "uuid")]
#[cfg_attr(docsrs, doc(cfg(feature = "uuid")))]
impl AsKey for uuid::Uuid {
    fn to_key(&self) -> Result<Key, KeyError> {
        let mut text = [0; uuid::fmt::Hyphenated::LENGTH];
        Ok(Key(Arc::from(&*self.hyphenated().encode_lower(&mut text))))
    }
}

/// Any [`Display`](fmt::Display) value as a key, by its text: for your own
/// id types, and for types of other crates that this one does not know.
/// The text must follow the key rules (1 to 255 bytes of visible ASCII).
///
/// ```
/// use idem_core::{AsKey, Displayed};
///
/// struct OrderId(u64);
/// impl std::fmt::Display for OrderId {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
///         write!(f, "order-{}", self.0)
///     }
/// }
///
/// let key = Displayed(&OrderId(42)).to_key().unwrap();
/// assert_eq!(key.as_str(), "order-42");
/// // In the attribute: #[idempotent(key = idem_core::Displayed(&cmd.order), ...)]
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Displayed<T>(pub T);

impl<T: fmt::Display> AsKey for Displayed<T> {
    fn to_key(&self) -> Result<Key, KeyError> {
        Key::new(self.0.to_string())
    }
}

/// The longest stored form of a [`Scope`], in bytes: an operation and a
/// principal of at most 255 bytes each, and the line feed between them. It
/// fits the unique index of every store.
pub const MAX_SCOPE_LEN: usize = 2 * SCOPE_PART_LEN + 1;

/// The longest stored form of each part of a scope. A part of this length
/// or longer is shortened to exactly this length, so a shortened part is
/// never equal to one kept whole.
const SCOPE_PART_LEN: usize = 255;

/// What a shortened part puts between its prefix and its digest.
const DIGEST_MARK: &str = "...sha256:";

/// The operation a key belongs to, optionally narrowed to a principal
/// (tenant, account, API key id).
///
/// Records are unique per `(scope, key)`: the same key used for two
/// operations, or by two principals, never shares a result. The operation
/// must not contain a line feed; the principal may be any text.
///
/// # Long scopes
///
/// The stored form is bounded by [`MAX_SCOPE_LEN`], so that it fits every
/// store's index whatever the operation (an HTTP layer may use a raw
/// request path) or the principal. A part (the operation or the principal)
/// of 255 bytes or more is shortened to exactly 255 bytes: its first bytes,
/// then `...sha256:` and the SHA-256 of the whole part in 64 hex digits.
/// So is a part holding a NUL, which PostgreSQL's text cannot hold (its
/// NULs are written as dots in the first bytes; the digest tells it apart):
///
/// ```
/// use idem_core::{Scope, MAX_SCOPE_LEN};
///
/// let path = format!("POST /files/{}", "a".repeat(4000));
/// let scope = Scope::new(&path).with_principal("acct_1");
/// assert!(scope.as_str().len() <= MAX_SCOPE_LEN);
/// assert!(scope.operation().starts_with("POST /files/aaaa"));
/// assert_eq!(scope.operation().len(), 255);
/// assert_eq!(scope.principal(), Some("acct_1"));
///
/// // Another long path, differing at its very end: another scope.
/// let other = Scope::new(format!("{path}b")).with_principal("acct_1");
/// assert_ne!(scope, other);
/// ```
///
/// Parts shorter than 255 bytes are kept as they are. A shortened part
/// stays distinct from every other part, shortened or whole: the digest
/// covers all of it, and a part kept whole is never 255 bytes long. The
/// accessors ([`operation`](Scope::operation),
/// [`principal`](Scope::principal), [`as_str`](Scope::as_str), `Display`)
/// answer the parts as stored, shortened where they were long.
#[derive(Clone, Debug)]
pub struct Scope {
    // `operation` alone, or `operation '\n' principal`, each part shortened
    // where it is long: the operation has no line feed (nor has its
    // shortened form), so the split is unambiguous. Shared, like a `Key`.
    // After the stored form (its first `stored_len` bytes), the label of
    // the scope's metrics when it is not the operation (see
    // `with_metric_label`): one allocation, and a scope no larger.
    joined: Arc<str>,
    operation_len: u32,
    stored_len: u32,
}

/// Two scopes are the same when their stored forms are: the label of
/// their metrics does not count.
impl PartialEq for Scope {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Scope {}

impl std::hash::Hash for Scope {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

/// A length within a scope's text. The stored form is at most
/// [`MAX_SCOPE_LEN`] bytes; a text of 4 GiB or more, which no store
/// returns, would be cut there.
fn len32(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

impl Scope {
    /// A scope for `operation`. Line feeds in the operation are replaced by
    /// spaces so the stored form stays unambiguous; an operation of 255
    /// bytes or more, or holding a NUL, is shortened (see
    /// [Long scopes](Scope#long-scopes)).
    pub fn new(operation: impl Into<String>) -> Self {
        let mut operation: String = operation.into();
        if operation.contains('\n') {
            operation = operation.replace('\n', " ");
        }
        let joined = match shortened(&operation) {
            Some(short) => short,
            None => operation,
        };
        let len = len32(joined.len());
        Scope {
            operation_len: len,
            stored_len: len,
            joined: joined.into(),
        }
    }

    /// [`Scope::new`] for a borrowed operation: no copy when this thread
    /// made the same scope last (a scope is mostly a literal, one per
    /// operation), one copy otherwise.
    fn borrowed(operation: &str) -> Self {
        // Only an operation kept as it is is remembered, so the one found
        // there needs no check again.
        let last = LAST_SCOPE
            .try_with(|last| {
                let joined = last.take()?;
                last.set(Some(joined.clone()));
                (*joined == *operation).then_some(joined)
            })
            .ok()
            .flatten();
        if let Some(joined) = last {
            return Scope {
                operation_len: len32(operation.len()),
                stored_len: len32(operation.len()),
                joined,
            };
        }
        if operation.len() >= SCOPE_PART_LEN || operation.contains('\n') || operation.contains('\0')
        {
            return Scope::new(operation);
        }
        let joined: Arc<str> = Arc::from(operation);
        let _ = LAST_SCOPE.try_with(|last| last.set(Some(joined.clone())));
        Scope {
            operation_len: len32(operation.len()),
            stored_len: len32(operation.len()),
            joined,
        }
    }

    /// The same operation, narrowed to `principal` (in place of the
    /// principal it had, if any). A principal of 255 bytes or more, or
    /// holding a NUL, is shortened (see [Long scopes](Scope#long-scopes)):
    /// any text is a principal.
    ///
    /// Two tenants sending the same key then never see each other's
    /// records. With the attribute, name the principal in `scope`:
    /// `scope = Scope::new("ledger::transfer").with_principal(&cmd.tenant)`.
    ///
    /// ```
    /// use idem_core::Scope;
    ///
    /// let acme = Scope::new("ledger::transfer").with_principal("acme");
    /// let globex = Scope::new("ledger::transfer").with_principal("globex");
    /// // Same key, other tenant: its own record, its own run.
    /// assert_ne!(acme, globex);
    /// assert_eq!(acme.operation(), "ledger::transfer");
    /// assert_eq!(acme.principal(), Some("acme"));
    /// ```
    pub fn with_principal(self, principal: impl AsRef<str>) -> Self {
        let principal = principal.as_ref();
        let short = shortened(principal);
        let principal = short.as_deref().unwrap_or(principal);
        let label = self.label();
        let mut joined = String::with_capacity(
            self.operation().len() + 1 + principal.len() + label.map_or(0, str::len),
        );
        joined.push_str(self.operation());
        joined.push('\n');
        joined.push_str(principal);
        let stored_len = len32(joined.len());
        joined.push_str(label.unwrap_or_default());
        Scope {
            joined: joined.into(),
            operation_len: self.operation_len,
            stored_len,
        }
    }

    /// The same scope, whose metrics carry `label` as their `operation`
    /// label in place of the operation: the HTTP layer's scopes of a raw
    /// request path, which would make a label of every path. The stored
    /// form, and so which records the scope names, does not change.
    pub fn with_metric_label(self, label: &str) -> Self {
        let mut joined = String::with_capacity(self.stored_len as usize + label.len());
        joined.push_str(self.as_str());
        joined.push_str(label);
        Scope {
            joined: joined.into(),
            operation_len: self.operation_len,
            stored_len: self.stored_len,
        }
    }

    /// The label given by `with_metric_label`, if any.
    fn label(&self) -> Option<&str> {
        self.joined
            .get(self.stored_len as usize..)
            .filter(|label| !label.is_empty())
    }

    /// The `operation` label of the scope's metrics: the operation, unless
    /// the scope was given another label.
    pub fn metric_label(&self) -> &str {
        self.label().unwrap_or_else(|| self.operation())
    }

    /// The operation part, as stored.
    pub fn operation(&self) -> &str {
        &self.joined[..self.operation_len as usize]
    }

    /// The principal part as stored, if any.
    pub fn principal(&self) -> Option<&str> {
        self.joined
            .get(self.operation_len as usize + 1..self.stored_len as usize)
    }

    /// The stored form: the operation, then a line feed and the principal
    /// when there is one. At most [`MAX_SCOPE_LEN`] bytes for a scope made
    /// by [`Scope::new`] and [`Scope::with_principal`].
    pub fn as_str(&self) -> &str {
        &self.joined[..self.stored_len as usize]
    }

    /// The inverse of [`Scope::as_str`]: splits at the first line feed.
    /// The parts are taken as they are, shortened or not, so that
    /// `Scope::from_stored(scope.as_str()) == scope`.
    pub fn from_stored(stored: &str) -> Self {
        Scope {
            operation_len: len32(stored.find('\n').unwrap_or(stored.len())),
            stored_len: len32(stored.len()),
            joined: stored.into(),
        }
    }
}

thread_local! {
    /// The text of the scope this thread made last from a borrowed
    /// operation, shared by the next scope of the same operation.
    static LAST_SCOPE: Cell<Option<Arc<str>>> = const { Cell::new(None) };
}

/// The stored form of a part of 255 bytes or more, or holding a NUL (which
/// PostgreSQL's text refuses): its first bytes (cut at a character
/// boundary, NULs written as dots, padded with dots), [`DIGEST_MARK`] and
/// the SHA-256 of the whole part in hex, exactly [`SCOPE_PART_LEN`] bytes
/// in all, which no part kept as it is has. `None` for a shorter part
/// without NUL, which is kept as it is.
fn shortened(part: &str) -> Option<String> {
    use sha2::{Digest, Sha256};
    use std::fmt::Write;

    if part.len() < SCOPE_PART_LEN && !part.contains('\0') {
        return None;
    }
    let digest = Sha256::digest(part.as_bytes());
    let room = SCOPE_PART_LEN - DIGEST_MARK.len() - 2 * digest.len();
    let mut cut = room.min(part.len());
    while !part.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut short = String::with_capacity(SCOPE_PART_LEN);
    short.extend(part[..cut].chars().map(|c| if c == '\0' { '.' } else { c }));
    short.extend(std::iter::repeat_n('.', room - cut));
    short.push_str(DIGEST_MARK);
    for byte in digest {
        // Writing to a String cannot fail.
        let _ = write!(short, "{byte:02x}");
    }
    debug_assert_eq!(short.len(), SCOPE_PART_LEN);
    Some(short)
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.principal() {
            Some(p) => write!(f, "{} [{}]", self.operation(), p),
            None => f.write_str(self.operation()),
        }
    }
}

impl From<&str> for Scope {
    fn from(value: &str) -> Self {
        Scope::borrowed(value)
    }
}

impl From<String> for Scope {
    fn from(value: String) -> Self {
        Scope::new(value)
    }
}

impl From<&Scope> for Scope {
    fn from(value: &Scope) -> Self {
        value.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scope whose metrics carry another label is the same scope: equal
    /// to, and hashed as, the one a store reads back (`from_stored`), by
    /// which a notification wakes the duplicates waiting on it; its
    /// principal replaced, it keeps its label.
    #[test]
    fn a_metric_label_leaves_the_scope_as_it_is() {
        use std::hash::BuildHasher;

        let plain = Scope::new("POST /nowhere/17");
        let labelled = plain.clone().with_metric_label("POST (unmatched)");
        assert_eq!(labelled, plain);
        assert_eq!(labelled.as_str(), "POST /nowhere/17");
        assert_eq!(labelled.operation(), "POST /nowhere/17");
        assert_eq!(labelled.principal(), None);
        assert_eq!(labelled.metric_label(), "POST (unmatched)");
        assert_eq!(plain.metric_label(), "POST /nowhere/17");
        let stored = Scope::from_stored(labelled.as_str());
        assert_eq!(stored, labelled);
        let state = std::collections::hash_map::RandomState::new();
        assert_eq!(state.hash_one(&stored), state.hash_one(&labelled));

        let narrowed = labelled.with_principal("acct_1");
        assert_eq!(narrowed.as_str(), "POST /nowhere/17\nacct_1");
        assert_eq!(narrowed.principal(), Some("acct_1"));
        assert_eq!(narrowed.metric_label(), "POST (unmatched)");
        assert_eq!(narrowed, Scope::from_stored("POST /nowhere/17\nacct_1"));
        let other = narrowed.with_principal("");
        assert_eq!(other.principal(), Some(""));
        assert_eq!(other.metric_label(), "POST (unmatched)");
        assert_eq!(std::mem::size_of::<Scope>(), 24);
    }

    #[test]
    fn key_rules() {
        assert!(Key::new("a").is_ok());
        assert!(Key::new("8e03978e-40d5-43e8-bc93-6894a57f9324").is_ok());
        assert_eq!(Key::new(""), Err(KeyError::Empty));
        assert_eq!(Key::new("x".repeat(255)).map(|k| k.as_str().len()), Ok(255));
        assert_eq!(
            Key::new("x".repeat(256)),
            Err(KeyError::TooLong { len: 256 })
        );
        assert_eq!(
            Key::new("ab c"),
            Err(KeyError::InvalidByte {
                offset: 2,
                byte: b' '
            })
        );
        assert_eq!(
            Key::new("é"),
            Err(KeyError::InvalidByte {
                offset: 0,
                byte: 0xc3
            })
        );
        assert_eq!(
            Key::new("a\n"),
            Err(KeyError::InvalidByte {
                offset: 1,
                byte: b'\n'
            })
        );
    }

    #[test]
    fn key_conversions() {
        assert_eq!(42u64.to_key().unwrap().as_str(), "42");
        assert_eq!((-7i32).to_key().unwrap().as_str(), "-7");
        assert_eq!(Some("k").to_key().unwrap().as_str(), "k");
        assert_eq!(None::<String>.to_key(), Err(KeyError::Missing));
        assert_eq!(String::from("k").to_key().unwrap().as_str(), "k");
    }

    #[test]
    fn scope_parts() {
        let s = Scope::new("billing::charge");
        assert_eq!(s.operation(), "billing::charge");
        assert_eq!(s.principal(), None);
        let p = s.clone().with_principal("acct_1");
        assert_eq!(p.operation(), "billing::charge");
        assert_eq!(p.principal(), Some("acct_1"));
        assert_eq!(p.as_str(), "billing::charge\nacct_1");
        assert_ne!(s, p);
        assert_eq!(p.clone().with_principal("b").principal(), Some("b"));
        assert_eq!(Scope::new("a\nb").operation(), "a b");
        assert_eq!(Scope::from_stored(p.as_str()), p);
        assert_eq!(Scope::from_stored(s.as_str()), s);
        let empty = Scope::new("op").with_principal("");
        assert_eq!(Scope::from_stored(empty.as_str()), empty);
    }

    /// A scope from a borrowed operation is the scope `Scope::new` makes,
    /// whichever scope this thread made before it.
    #[test]
    fn borrowed_scopes_are_new_ones() {
        let long = "o".repeat(SCOPE_PART_LEN + 1);
        for op in ["op", "op", "other", "a\nb", long.as_str(), "op", ""] {
            let scope = Scope::from(op);
            assert_eq!(scope, Scope::new(op), "{op:?}");
            assert_eq!(scope.operation(), Scope::new(op).operation());
            assert_eq!(scope.principal(), None);
        }
        assert_eq!(Scope::from("op").with_principal("p").as_str(), "op\np");
        assert_eq!(Scope::from("op").as_str(), "op");
    }

    /// A long operation or principal is stored as a prefix and a digest of
    /// exactly 255 bytes, so the stored form fits every store's index.
    #[test]
    fn long_scope_parts_are_bounded() {
        use sha2::Digest;

        let kept = "o".repeat(SCOPE_PART_LEN - 1);
        assert_eq!(Scope::new(&kept).as_str(), kept);
        assert_eq!(
            Scope::new("op").with_principal(&kept).principal(),
            Some(kept.as_str())
        );

        let long = format!("POST /files/{}", "a".repeat(100_000));
        let scope = Scope::new(&long).with_principal("p".repeat(100_000));
        assert!(scope.as_str().len() <= MAX_SCOPE_LEN);
        assert_eq!(scope.operation().len(), SCOPE_PART_LEN);
        assert_eq!(scope.principal().map(str::len), Some(SCOPE_PART_LEN));
        assert!(scope.operation().starts_with("POST /files/aaa"));
        let digest = format!("{DIGEST_MARK}{:x}", sha2::Sha256::digest(long.as_bytes()));
        assert!(scope.operation().ends_with(&digest), "{scope}");
        assert!(scope.principal().unwrap().starts_with("ppp"));

        // The bound is reached, not passed.
        let exact = "o".repeat(SCOPE_PART_LEN);
        assert_eq!(Scope::new(&exact).as_str().len(), SCOPE_PART_LEN);
        assert_ne!(Scope::new(&exact).as_str(), exact);
        assert_eq!(
            Scope::new(&exact).with_principal(&exact).as_str().len(),
            MAX_SCOPE_LEN
        );
    }

    /// PostgreSQL's text cannot hold a NUL: a part holding one is stored
    /// shortened, without it, and still apart from every other part.
    #[test]
    fn parts_holding_nul_are_stored_without_it() {
        let scope = Scope::new("pay").with_principal("t\0x");
        assert!(!scope.as_str().contains('\0'));
        assert_eq!(scope.principal().map(str::len), Some(SCOPE_PART_LEN));
        assert!(scope.principal().unwrap().starts_with("t.x..."));
        for other in ["t.x", "t\0y", "t\0x\0", "t"] {
            assert_ne!(scope, Scope::new("pay").with_principal(other), "{other:?}");
        }
        assert_eq!(scope, Scope::new("pay").with_principal("t\0x"));
        assert_eq!(Scope::from_stored(scope.as_str()), scope);
        let op = Scope::new("pay\0");
        assert!(!op.as_str().contains('\0'));
        assert_ne!(op, Scope::new("pay."));
        assert_eq!(Scope::borrowed("pay\0"), op);
    }

    /// Shortening never makes two scopes one: not two long parts that
    /// differ only past the prefix, not a long part and a short one that
    /// spells its shortened form.
    #[test]
    fn long_scopes_stay_distinct() {
        let long = "x".repeat(1000);
        let a = Scope::new(format!("{long}a"));
        let b = Scope::new(format!("{long}b"));
        assert_ne!(a, b);
        assert_ne!(a.as_str(), b.as_str());
        assert_eq!(a.operation()[..100], b.operation()[..100]);

        // Spelled out, a shortened operation is itself shortened again.
        assert_ne!(Scope::new(a.operation()), a);

        // A principal is still part of the identity, long or short, on a
        // long operation.
        let p1 = a.clone().with_principal("tenant-1");
        let p2 = a.clone().with_principal("tenant-2");
        assert_ne!(p1, p2);
        assert_ne!(p1, a);
        let lp1 = a.clone().with_principal(format!("{long}1"));
        let lp2 = a.clone().with_principal(format!("{long}2"));
        assert_ne!(lp1, lp2);
        assert_ne!(a.clone().with_principal(lp1.principal().unwrap()), lp1);

        // Replacing the principal keeps the (shortened) operation.
        assert_eq!(lp1.clone().with_principal("tenant-1"), p1);
        assert_eq!(lp1.operation(), a.operation());
    }

    /// The stored form of a shortened scope reads back as the same scope,
    /// and multi-byte characters are cut whole.
    #[test]
    fn long_scopes_round_trip() {
        let op = "é".repeat(500);
        let principal = format!("line:\n{}", "ü".repeat(500));
        for scope in [
            Scope::new(&op),
            Scope::new(&op).with_principal("acct_1"),
            Scope::new("op").with_principal(&principal),
            Scope::new(&op).with_principal(&principal),
            Scope::new(format!("a\n{op}")),
        ] {
            assert!(scope.as_str().len() <= MAX_SCOPE_LEN);
            assert_eq!(Scope::from_stored(scope.as_str()), scope);
            assert_eq!(Scope::from_stored(scope.as_str()).as_str(), scope.as_str());
        }
        let shortened = Scope::new("op").with_principal(&principal);
        let stored_principal = shortened.principal().unwrap();
        assert_eq!(stored_principal.len(), SCOPE_PART_LEN);
        assert!(stored_principal.starts_with("line:\nüü"));
        // 181 bytes of room: "line:\n", 87 two-byte characters and a dot.
        assert!(
            stored_principal.contains("ü....sha256:"),
            "{stored_principal}"
        );
        assert_eq!(shortened.operation(), "op");
        assert!(!Scope::new(&op).operation().contains('\n'));
    }
}
