//! The error messages that `#[idempotent(...)]` and the derive's
//! `#[idem(...)]` share, each written once so that both attributes word a
//! mistake the same way, and the folding of several errors into one.
//!
//! `attribute` is how a message names the attribute, as in
//! ``"`#[idempotent]`"``; `place` may add where it stands, as in
//! ``"`#[idem(...)]` on a field"``.

use proc_macro2::Ident;
use syn::parse::ParseStream;
use syn::spanned::Spanned;

/// An option given a second time, reported at `at`, that second one.
pub(crate) fn repeated(at: impl Spanned, label: &str, attribute: &str) -> syn::Error {
    syn::Error::new(
        at.span(),
        format!("`{label}` is given more than once in {attribute}; keep only one"),
    )
}

/// A flag written with a value, as in `token = true`, reported at the flag.
pub(crate) fn flag_with_value(at: impl Spanned, label: &str, attribute: &str) -> syn::Error {
    syn::Error::new(
        at.span(),
        format!("`{label}` in {attribute} is a flag and takes no value; write `{label}` alone"),
    )
}

/// A name that is no option of the attribute; `known` says which are, as
/// in ``"the options are `key`, `store`"``.
pub(crate) fn unknown_option(ident: &Ident, place: &str, known: &str) -> syn::Error {
    syn::Error::new_spanned(
        ident,
        format!("unknown option `{ident}` in {place}; {known}"),
    )
}

/// An option `name` that `input` does not follow with `=`; `value` is the
/// example the message suggests.
pub(crate) fn missing_equals(
    input: ParseStream<'_>,
    name: &str,
    attribute: &str,
    value: &str,
) -> syn::Error {
    input.error(format!(
        "expected `=` after `{name}` in {attribute}: write `{name} = {value}`"
    ))
}

/// Every error, in order, as one, so that all are reported at once; `Ok`
/// when there is none.
pub(crate) fn combine(errors: impl IntoIterator<Item = syn::Error>) -> syn::Result<()> {
    match errors.into_iter().reduce(|mut all, next| {
        all.combine(next);
        all
    }) {
        Some(all) => Err(all),
        None => Ok(()),
    }
}

/// The rule of `idem`'s table names, applied to every name formatted into
/// SQL: 1 to 63 ASCII letters, digits and underscores, not starting with a
/// digit.
pub(crate) fn check_name(name: &str, what: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let valid_start = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    let valid_rest = chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if valid_start && valid_rest && name.len() <= 63 {
        Ok(())
    } else {
        Err(format!(
            "invalid {what} name {name:?}: use 1 to 63 ASCII letters, digits and underscores, \
             not starting with a digit"
        ))
    }
}
