//! What `#[idempotent]` expands to, reached as `::idem::expansion`. Not a
//! public API: it may change in any release.
//!
//! The generated code checks what the attribute asks of the user's types
//! through the traits below. Each carries `#[diagnostic::on_unimplemented]`
//! and a blanket implementation marked `#[diagnostic::do_not_recommend]`,
//! so that an unmet bound is reported once, in the attribute's words (the
//! argument, the output, the `replayable` option), rather than as the
//! `serde` bounds behind it. Each is called as a trait function
//! (`Output::codec()`), so that no error points into this module, and
//! spanned by the macro at the user's tokens it concerns.

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

pub use crate::engine::{run, run_in_transaction, Call, MissingKey};
pub use crate::policy::Policy;
pub use ::core::time::Duration;
pub use idem_core::error::Error;
pub use idem_core::fingerprint::Fingerprint;
pub use idem_core::key::{AsKey, Key, KeyError, Scope};

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub use crate::entity::{run as run_entity, Entity, EntityBind, RequestHash, TokenEntity};

use crate::engine::{Codec, Json, OkOnly, Replaying};
use idem_core::canonical::{plain_or_marked, Checked, Floats};
use std::cell::Cell;

/// The `scope = ...` expression's value.
#[diagnostic::on_unimplemented(
    message = "the `scope` of an `#[idempotent]` fn must convert into `idem::Scope`",
    label = "`{Self}` is not a scope",
    note = "a scope is a `&str`, a `String` or an `idem::Scope`, \
            as in `scope = \"payments.charge\"` or \
            `scope = Scope::new(\"payments.charge\").with_principal(&cmd.tenant)`"
)]
pub trait IntoScope {
    /// The scope.
    fn into_scope(self) -> Scope;
}

#[diagnostic::do_not_recommend]
impl<T: Into<Scope>> IntoScope for T {
    fn into_scope(self) -> Scope {
        self.into()
    }
}

/// An argument in the default fingerprint.
#[diagnostic::on_unimplemented(
    message = "the argument of type `{Self}` must implement `Serialize`: \
               `#[idempotent]` fingerprints every argument but `self` and the store",
    label = "this argument is part of the default fingerprint",
    note = "derive `serde::Serialize` for `{Self}`, or say what identifies a request \
            with `fingerprint = ...`, as in `fingerprint = (&cmd.amount, &cmd.currency)`"
)]
pub trait Argument {
    /// The argument, to be fingerprinted with the others by [`arguments`].
    fn to_json(&self) -> Arg<'_>;
}

#[diagnostic::do_not_recommend]
impl<T: Serialize> Argument for T {
    fn to_json(&self) -> Arg<'_> {
        Arg(self)
    }
}

/// An argument of the default fingerprint, serialized when [`arguments`]
/// knows how: a payload holding a non-finite float is written in a form of
/// its own, all of it (see [`Fingerprint`]).
pub struct Arg<'a>(&'a dyn ArgumentValue);

/// An argument's JSON value, plain or marked ([`Floats`]).
trait ArgumentValue {
    fn value(&self, floats: Floats, seen: &Cell<bool>) -> Result<Value, serde_json::Error>;
}

impl<T: Serialize> ArgumentValue for T {
    fn value(&self, floats: Floats, seen: &Cell<bool>) -> Result<Value, serde_json::Error> {
        serde_json::to_value(Checked::new(self, floats, seen))
    }
}

/// The default fingerprint of one or more arguments: that of the tuple of
/// their references, whose JSON form is the array of their values (`()`,
/// for no argument, is fingerprinted as [`Payload`]).
pub fn arguments<const N: usize>(values: [Arg<'_>; N]) -> Result<Fingerprint, Error> {
    let (values, marked) = plain_or_marked(|floats, seen| {
        values.iter().map(|arg| arg.0.value(floats, seen)).collect()
    })?;
    Fingerprint::of_value(&Value::Array(values), marked)
}

/// The `fingerprint = ...` expression's value.
#[diagnostic::on_unimplemented(
    message = "the `fingerprint` of an `#[idempotent]` fn must implement `Serialize`",
    label = "`{Self}` is not `Serialize`",
    note = "the fingerprint is the canonical JSON of this value; derive `serde::Serialize` \
            for `{Self}`, or fingerprint fields that are, as in \
            `fingerprint = (&cmd.amount, &cmd.currency)`"
)]
pub trait Payload {
    /// The payload's fingerprint.
    fn fingerprint(&self) -> Result<Fingerprint, Error>;
}

#[diagnostic::do_not_recommend]
impl<T: Serialize + ?Sized> Payload for T {
    fn fingerprint(&self) -> Result<Fingerprint, Error> {
        Fingerprint::of(self)
    }
}

/// The `T` of the function's `Result<T, E>`, stored and replayed.
#[diagnostic::on_unimplemented(
    message = "the output of an `#[idempotent]` fn must implement `Serialize` and \
               `DeserializeOwned` to be stored",
    label = "`{Self}` is stored, and replayed to every retry",
    note = "derive them: `#[derive(serde::Serialize, serde::Deserialize)]` on `{Self}`"
)]
pub trait Output: Sized {
    /// [`Json`], for a type found to be a serde type here.
    fn codec() -> CheckedJson<Self>;
}

#[diagnostic::do_not_recommend]
impl<T: Serialize + DeserializeOwned> Output for T {
    fn codec() -> CheckedJson<Self> {
        CheckedJson {
            encode: |value| Json.encode(value),
            decode: |bytes| Json.decode(bytes),
        }
    }
}

/// [`Json`] for a type whose serde bounds [`Output`] checked, so that the
/// call that stores it requires nothing more, and reports nothing twice.
pub struct CheckedJson<T> {
    encode: fn(&T) -> Result<Vec<u8>, Error>,
    decode: fn(&[u8]) -> Result<T, Error>,
}

impl<T> Codec<T> for CheckedJson<T> {
    fn encode(&self, value: &T) -> Result<Vec<u8>, Error> {
        (self.encode)(value)
    }

    fn decode(&self, bytes: &[u8]) -> Result<T, Error> {
        (self.decode)(bytes)
    }
}

/// The `E` of the function's `Result<T, E>`, under `replayable`.
#[diagnostic::on_unimplemented(
    message = "the `replayable` option of `#[idempotent]` stores errors of type `{Self}`, \
               which must implement `Serialize` and `DeserializeOwned`",
    label = "the errors this picks are stored, and replayed to every retry",
    note = "derive them: `#[derive(serde::Serialize, serde::Deserialize)]` on `{Self}`; \
            an `idem::Error` inside it serializes as its kind and message"
)]
pub trait ReplayableError: Sized {
    /// `call` storing the errors that `predicate` picks.
    fn replaying<C, P>(call: Call<OkOnly<C>>, predicate: P) -> Call<Replaying<C, P, Self>>
    where
        P: Fn(&Self) -> bool;
}

#[diagnostic::do_not_recommend]
impl<E: Serialize + DeserializeOwned> ReplayableError for E {
    fn replaying<C, P>(call: Call<OkOnly<C>>, predicate: P) -> Call<Replaying<C, P, Self>>
    where
        P: Fn(&Self) -> bool,
    {
        call.replaying(predicate)
    }
}

/// The error type of the annotated function's return type.
pub trait Returns {
    /// `E` of `Result<T, E>`.
    type Error;
}

impl<T, E> Returns for Result<T, E> {
    type Error = E;
}

/// The `replayable` predicate, its argument typed as the error of `R`
/// (the function's return type), so that a closure such as
/// `|e| e.is_final()` needs no annotation.
pub fn replayable<R: Returns, P: Fn(&R::Error) -> bool>(predicate: P) -> P {
    predicate
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_fingerprint_is_that_of_the_tuple_of_arguments() {
        let (name, amount, tags) = ("ada", 500_u64, vec![("b", 2), ("a", 1)]);
        let tuple = Fingerprint::of(&(&name, &amount, &tags)).unwrap();
        let values = arguments([name.to_json(), amount.to_json(), tags.to_json()]).unwrap();
        assert_eq!(values, tuple);
        let one = arguments([name.to_json()]).unwrap();
        assert_eq!(one, Fingerprint::of(&(&name,)).unwrap());
    }
}
