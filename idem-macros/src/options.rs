//! The option lists that `#[idempotent(...)]` and the derive's
//! `#[idem(...)]` parse alike: names separated by commas, each a flag
//! standing alone or followed by `= value`, every name at most once.
//!
//! `attribute` is how messages name the attribute, as in
//! ``"`#[idempotent]`"``; the messages themselves are in `diag`.

use syn::parse::{Lookahead1, ParseStream};
use syn::spanned::Spanned;
use syn::{Expr, Ident, LitStr, Token};

use crate::diag::{flag_with_value, missing_equals, repeated, unknown_option};

/// Parses `option, option, ...` to the end of `input`, a trailing comma
/// allowed.
///
/// `option` parses the next option and returns `true` when it knows its
/// name, peeked through the lookahead so that an unexpected token is
/// reported with every name expected; it returns `false` otherwise. A name
/// it does not know is reported as unknown in `place`, with `known` saying
/// which options are, as in ``"the options are `key`, `store`"``.
pub(crate) fn parse_list(
    input: ParseStream<'_>,
    place: &str,
    known: &str,
    mut option: impl FnMut(&Lookahead1<'_>) -> syn::Result<bool>,
) -> syn::Result<()> {
    while !input.is_empty() {
        let lookahead = input.lookahead1();
        if !option(&lookahead)? {
            if input.peek(Ident) {
                let ident: Ident = input.parse()?;
                return Err(unknown_option(&ident, place, known));
            }
            return Err(lookahead.error());
        }
        if input.is_empty() {
            break;
        }
        input.parse::<Token![,]>()?;
    }
    Ok(())
}

/// Parses the `=` after the option `name`; `value` is what the message
/// suggests writing after it when it is missing.
pub(crate) fn equals(
    input: ParseStream<'_>,
    name: &str,
    attribute: &str,
    value: &str,
) -> syn::Result<()> {
    if input.peek(Token![=]) {
        input.parse::<Token![=]>()?;
        Ok(())
    } else {
        Err(missing_equals(input, name, attribute, value))
    }
}

/// Parses a string literal; anything else is parsed as an expression and
/// reported at it with `message`.
pub(crate) fn string_literal(
    input: ParseStream<'_>,
    message: impl FnOnce() -> String,
) -> syn::Result<LitStr> {
    if !input.peek(LitStr) {
        let expr: Expr = input.parse()?;
        return Err(syn::Error::new_spanned(expr, message()));
    }
    input.parse()
}

/// Refuses a value after the flag `flag`, just parsed.
pub(crate) fn no_value(
    input: ParseStream<'_>,
    flag: impl Spanned,
    label: &str,
    attribute: &str,
) -> syn::Result<()> {
    if input.peek(Token![=]) {
        return Err(flag_with_value(flag, label, attribute));
    }
    Ok(())
}

/// Stores `value` in `slot`, or reports the option as repeated at `name`.
pub(crate) fn set<T>(
    slot: &mut Option<T>,
    name: impl Spanned,
    label: &str,
    attribute: &str,
    value: T,
) -> syn::Result<()> {
    if slot.is_some() {
        return Err(repeated(name, label, attribute));
    }
    *slot = Some(value);
    Ok(())
}

/// Stores the flag `flag`, just parsed, in `slot`: refuses a value after
/// it, and a flag already set.
pub(crate) fn flag<K: Spanned + Copy>(
    input: ParseStream<'_>,
    slot: &mut Option<K>,
    flag: K,
    label: &str,
    attribute: &str,
) -> syn::Result<()> {
    no_value(input, flag, label, attribute)?;
    set(slot, flag, label, attribute, flag)
}
