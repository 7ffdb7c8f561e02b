//! The `#[idempotent]` attribute of the [`idem`](https://docs.rs/idem) crate.
//!
//! This crate is an implementation detail: use the attribute through
//! `idem::idempotent`. The attribute only parses, checks and wires; every
//! decision is made by the library behind `::idem::expansion`.

#![warn(missing_docs, unreachable_pub)]

use proc_macro::TokenStream;

mod attr;
mod diag;
mod duration;
mod entity;
mod expand;
mod options;
mod valid;

/// Makes an `async fn` idempotent: the first call with a key runs the body
/// and saves its result; every later call with the same key gets the saved
/// result back without running the body again.
///
/// ```
/// use idem::{idempotent, MemoryStore};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize)]
/// struct Charge {
///     idempotency_key: String,
///     amount: u64,
/// }
///
/// #[derive(Debug, PartialEq, Serialize, Deserialize)]
/// struct Receipt {
///     amount: u64,
/// }
///
/// #[derive(Debug)]
/// enum PaymentError {
///     Idem(idem::Error),
/// }
///
/// impl From<idem::Error> for PaymentError {
///     fn from(err: idem::Error) -> Self {
///         PaymentError::Idem(err)
///     }
/// }
///
/// struct Payments {
///     store: MemoryStore,
/// }
///
/// impl Payments {
///     #[idempotent(key = cmd.idempotency_key, store = self.store, ttl = "24h")]
///     async fn charge(&self, cmd: Charge) -> Result<Receipt, PaymentError> {
///         // Runs once per key; a retry gets this receipt back.
///         Ok(Receipt { amount: cmd.amount })
///     }
/// }
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let payments = Payments { store: MemoryStore::new() };
/// let charge = || Charge { idempotency_key: "c-1".into(), amount: 500 };
/// let first = payments.charge(charge()).await.unwrap();
/// assert_eq!(payments.charge(charge()).await.unwrap(), first);
/// # });
/// ```
///
/// # Requirements
///
/// - The function is an `async fn` with a body: a free function, an
///   inherent method, or a method of a trait `impl` (native `async fn` in
///   traits; under `#[async_trait]` the attribute would only see the
///   rewritten method).
/// - It returns `Result<T, E>` (or an alias whose name ends in `Result`).
///   `T: Serialize + DeserializeOwned` is what is saved and replayed;
///   `E: From<idem::Error>` receives the library's own failures (key reused
///   with another payload, call still in progress, store errors).
/// - Every argument other than `self` is `Serialize` (it is part of the
///   default fingerprint), unless `fingerprint = ...` is given.
/// - A generic function (a type or const parameter, or an `impl Trait`
///   argument) gives `scope = ...`: its instantiations would otherwise
///   share one scope, and one could be answered with another's stored
///   outcome, of another type. Lifetimes alone are fine. The attribute sees
///   only the function's own parameters: a method of a generic `impl` whose
///   output depends on the `impl`'s parameters needs a `scope` too.
///
/// A missing bound is reported at what needs it, in these words: the
/// argument, the output type, the `key`, `scope` or `fingerprint`
/// expression, or the `replayable` option.
///
/// # Options
///
/// | option | meaning |
/// |---|---|
/// | `key = <expr>` | **required.** The client's idempotency key: a `str`, `String`, `idem::Key`, an integer, a `uuid::Uuid` (feature `uuid`), an `Option` of these, or a reference to any of them; `idem::Displayed(&x)` for any `Display` value, `idem::key_of(&(a, b))` for a key derived from several fields. Any expression over the arguments, such as `cmd.idempotency_key`, `order_id` or `&cmd.key`. |
/// | `store = <expr>` | **required.** The store, any `idem::Store` (also behind `Arc` or `&`), such as `self.store`. When it is an argument (`store = store`), that argument is left out of the default fingerprint. |
/// | `scope = <expr>` | The operation the key belongs to, anything `Into<idem::Scope>` (`"payments.charge"`, a `String`, a `Scope` with a principal). Default: the module path and function name, such as `"my_app::payments::charge"`; see [Scopes](#scopes). Required on a generic function. |
/// | `ttl = "24h"` | How long a record, and so the key, is kept. Default: 24 hours. |
/// | `lease = "30s"` | How long a running call holds the key before another call may take it over. Default: 30 seconds. |
/// | `wait = "5s"` | When the same key is still running elsewhere, wait up to this long for its result, then replay it. `"0s"` does not wait. Default: 5 seconds. |
/// | `fail_fast` | When the same key is still running elsewhere, fail at once with `idem::Error::InProgress`. Cannot be combined with `wait`. |
/// | `fingerprint = <expr>` | The payload compared between calls with the same key (`Serialize`). Default: every argument except `self` and the store, as a tuple of references. A different payload under a known key fails with `idem::Error::KeyReused`. |
/// | `tx = <argument>` | Transactional mode: the argument (a `&mut Transaction<'_, DB>`, `&mut PoolConnection<DB>` or `&mut DB::Connection`) on which the claim and the completion are written, so they commit or roll back with the body's own writes. The body uses the argument as usual; it is not part of the default fingerprint. |
/// | `entity` | Entity mode: no records table, the business row is the record. `store` is a sqlx pool (`SqlitePool`, `PgPool`, `MySqlPool`) and `T` a `#[derive(idem::Entity)]` type with a `#[idem(token)]` field, read with `sqlx::FromRow` (it need not be `Serialize`). The row whose token is the key is returned; otherwise the body runs once per token, under a renewed claim on the token, and the entity it returns, which must carry the key as its token, is inserted and returned as stored. The token alone identifies the operation, so a tenant goes into the token itself: `scope` is refused, as are `ttl`, `replayable` and `tx`; `lease` sets the claim's lease (how soon a crashed owner's token is taken over). See `idem::entity`. |
/// | `replayable = <expr>` | A predicate `Fn(&E) -> bool` choosing the errors that are saved and replayed like results (`E` must then be `Serialize + DeserializeOwned`; an `idem::Error` inside it is, see its *Serialized form*). Other errors release the key, so a retry runs the body again. Pick permanent answers (a declined card), never the library's transient errors. |
/// | `missing_key = reject` \| `run` | What a `None` key (an `Option` key) does. `reject`, the default: the call fails with `idem::Error::MissingKey` and the body does not run. `run`: the body runs **without protection**, with nothing claimed, recorded or replayed, so every retry without a key runs it again and concurrent duplicates all run; for operations whose clients may send no key and accept that. An invalid key is refused either way. Not with `entity`. |
///
/// Durations are string literals checked at compile time: one or more
/// `<integer><unit>` parts with units `ms`, `s`, `m`, `h`, `d`, such as
/// `"500ms"`, `"30s"` or `"1h30m"`; `ttl` and `lease` must be longer than
/// zero.
///
/// `key`, `scope` and `fingerprint` are evaluated before the body runs.
/// `key` and `fingerprint` are only borrowed; `scope` is taken by value, so
/// write `scope = cmd.tenant.as_str()` rather than moving a field out of an
/// argument the body still uses.
///
/// # Scopes
///
/// Records are unique per scope and key. The default scope is the module
/// path and the function name, such as `"my_app::payments::charge"`, so
/// **renaming the function, or moving it or its module, starts a new key
/// space**: after the deploy, the stored outcomes are no longer found, and
/// every retry in flight runs its body again. Two methods with the same
/// name in one module share that default. Give anything deployed a scope
/// that names the operation and outlives refactorings (in record and
/// transactional mode):
///
/// ```text
/// #[idempotent(key = cmd.idempotency_key, store = self.store, scope = "payments.charge")]
/// ```
///
/// In entity mode, `scope` is refused at compile time: the row is found by
/// its token alone, so a scope, and any tenant in it, would be ignored.
/// Put the tenant into the key itself (`key = format!("{tenant}:{id}")`).
/// Entity mode's claims have a scope of their own, `idem.entity.<table>`,
/// in the table `idem_entity_claims` (see `idem::admin`).
///
/// # Telling a replay from a first run
///
/// `Result<T, E>` does not say whether the body ran. Return
/// `Result<idem::Tracked<T>, E>` where the caller needs to know: the body
/// returns `Ok(Tracked::new(value))` (or `Ok(value.into())`), and
/// `is_replayed()` is `true` on a value answered from a record. It is
/// stored as `T`, so the records of either signature serve the other.
///
/// # The rewritten body
///
/// The body runs inside an `async` block handed to the library. It keeps
/// its spans, so errors in it point at your code. `return` and `?` return
/// from the body as usual. Arguments the body uses are moved into it; `self`
/// is borrowed only in the fields the body uses, so `&self`, `&mut self`
/// and `self` receivers all work with `store = self.store`, as long as the
/// body does not mutate or move the store's own field.
///
/// The `replayable` predicate is built with the call, before the body's
/// future, and lives as long as the call: it may not capture an argument
/// that the body moves.
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    match expand::idempotent(args.into(), item.clone().into()) {
        Ok(tokens) => tokens.into(),
        Err(err) => {
            // Keep the item as written, so the only errors are ours.
            let mut tokens: TokenStream = err.into_compile_error().into();
            tokens.extend(item);
            tokens
        }
    }
}

/// Describes a business table for entity mode and upserts: implements
/// `idem::Entity`, `idem::EntityBind<DB>` for every database that can
/// encode the fields, and, with a token field, `idem::TokenEntity`.
///
/// ```text
/// #[derive(sqlx::FromRow, idem::Entity)]
/// #[idem(table = "payments")]           // required: the table
/// struct Payment {
///     #[idem(generated)]                // filled in by the database: read, never written
///     id: i64,
///     #[idem(token)]                    // the UNIQUE idempotency token column
///     idempotency_token: String,
///     #[idem(column = "amount_cents")]  // a column named otherwise than the field
///     amount: i64,
///     #[idem(request_hash)]             // the payload's fingerprint (String, Vec<u8>, or Option)
///     request_hash: String,
/// }
/// ```
///
/// Each field is a column of the same name unless `column` renames it
/// (rename it for `sqlx::FromRow` too, with `#[sqlx(rename = "...")]`).
/// Names must be 1 to 63 ASCII letters, digits and underscores, not
/// starting with a digit; they are quoted in SQL, so they are
/// case-sensitive. The token field is anything `idem::AsKey` stored as
/// text (`String`, `Option<String>`); the body of an entity-mode operation
/// sets it to the key, and the library fills the request hash in.
///
/// See `idem::entity` for the flow and the statements.
#[proc_macro_derive(Entity, attributes(idem))]
pub fn derive_entity(input: TokenStream) -> TokenStream {
    match entity::derive(input.into()) {
        Ok(tokens) => tokens.into(),
        Err(err) => err.into_compile_error().into(),
    }
}
