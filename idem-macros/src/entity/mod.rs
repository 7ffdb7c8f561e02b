//! `#[derive(Entity)]`: the description of a business table, parsed from
//! `#[idem(...)]` attributes, checked, and turned into impls of
//! `idem::Entity`, `idem::TokenEntity` and `idem::EntityBind`.
//!
//! - `ast`: the struct as parsed, and as checked;
//! - `attr`: the `#[idem(...)]` options on the struct and its fields;
//! - `valid`: the checks, from the one to the other;
//! - `expand`: the impls.

mod ast;
mod attr;
mod expand;
mod valid;

use proc_macro2::TokenStream;
use syn::DeriveInput;

use self::ast::Input;

/// The derive's entry point: the impls, or every problem found.
pub(crate) fn derive(input: TokenStream) -> syn::Result<TokenStream> {
    let input: DeriveInput = syn::parse2(input)?;
    let entity = Input::from_syn(&input)?.validate()?;
    Ok(expand::derive(&entity))
}

/// What the tests of each step look at: the whole derive's output, or every
/// message it reports.
#[cfg(test)]
mod test_support {
    use proc_macro2::TokenStream;

    use super::derive;

    pub(super) fn expand(input: TokenStream) -> String {
        derive(input).unwrap_or_else(|e| panic!("{e}")).to_string()
    }

    pub(super) fn errors(input: TokenStream) -> Vec<String> {
        match derive(input) {
            Ok(_) => panic!("accepted"),
            Err(e) => e.into_iter().map(|e| e.to_string()).collect(),
        }
    }
}
