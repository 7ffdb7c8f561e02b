//! The derive's `#[idem(...)]` attributes: `table` on the struct; `token`,
//! `request_hash`, `column` and `generated` on a field. Each attribute is
//! parsed on its own, then the attributes of one struct or one field are
//! combined, every mistake kept for `valid` to report in source order.

use syn::parse::{Parse, ParseStream};
use syn::spanned::Spanned;
use syn::{Attribute, LitStr};

use crate::diag::{check_name, repeated};
use crate::options::{equals, flag, parse_list, set, string_literal};

mod kw {
    syn::custom_keyword!(table);
    syn::custom_keyword!(token);
    syn::custom_keyword!(request_hash);
    syn::custom_keyword!(column);
    syn::custom_keyword!(generated);
}

/// How messages name the attribute, and where it stands.
const ATTRIBUTE: &str = "`#[idem(...)]`";
const ON_STRUCT: &str = "`#[idem(...)]` on the struct";
const ON_FIELD: &str = "`#[idem(...)]` on a field";

const STRUCT_OPTIONS: &str = "the option is `table = \"...\"`";
const FIELD_OPTIONS: &str =
    "the options are `token`, `request_hash`, `column = \"...\"`, `generated`";

/// The options of the struct: one `#[idem(...)]` attribute, or all of them
/// combined.
pub(super) struct StructOptions {
    /// `table = "..."`, its name checked.
    pub(super) table: Option<LitStr>,
}

/// The options of a field: one `#[idem(...)]` attribute, or all of them
/// combined.
#[derive(Default)]
pub(super) struct FieldOptions {
    /// `token`: the idempotency token column.
    pub(super) token: Option<kw::token>,
    /// `request_hash`: the payload's fingerprint column.
    pub(super) request_hash: Option<kw::request_hash>,
    /// `column = "..."`, its name checked.
    pub(super) column: Option<LitStr>,
    /// `generated`: filled in by the database, never written.
    pub(super) generated: Option<kw::generated>,
}

impl StructOptions {
    /// Combines the struct's `#[idem(...)]` attributes, pushing onto
    /// `errors` what they get wrong.
    pub(super) fn from_attrs(attrs: &[Attribute], errors: &mut Vec<syn::Error>) -> Self {
        let mut table = None;
        for attr in attrs.iter().filter(|a| a.path().is_ident("idem")) {
            match attr.parse_args::<StructOptions>() {
                Ok(StructOptions { table: Some(lit) }) if table.is_some() => {
                    errors.push(repeated(lit, "table", ATTRIBUTE))
                }
                Ok(options) => table = table.or(options.table),
                Err(err) => errors.push(err),
            }
        }
        StructOptions { table }
    }
}

impl FieldOptions {
    /// Combines a field's `#[idem(...)]` attributes, pushing onto `errors`
    /// what they get wrong; an attribute that does not parse adds nothing.
    pub(super) fn from_attrs(attrs: &[Attribute], errors: &mut Vec<syn::Error>) -> Self {
        let mut options = FieldOptions::default();
        for attr in attrs.iter().filter(|a| a.path().is_ident("idem")) {
            match attr.parse_args::<FieldOptions>() {
                Ok(more) => options.merge(more, errors),
                Err(err) => errors.push(err),
            }
        }
        options
    }

    /// Adds the options of another attribute on the same field; one given
    /// again is reported there, and the first one kept.
    fn merge(&mut self, more: FieldOptions, errors: &mut Vec<syn::Error>) {
        fn one<T: Spanned>(
            slot: &mut Option<T>,
            value: Option<T>,
            label: &str,
            errors: &mut Vec<syn::Error>,
        ) {
            if let Some(value) = value {
                if slot.is_some() {
                    errors.push(repeated(value, label, ATTRIBUTE));
                } else {
                    *slot = Some(value);
                }
            }
        }
        one(&mut self.token, more.token, "token", errors);
        one(
            &mut self.request_hash,
            more.request_hash,
            "request_hash",
            errors,
        );
        one(&mut self.column, more.column, "column", errors);
        one(&mut self.generated, more.generated, "generated", errors);
    }
}

impl Parse for StructOptions {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let mut table = None;
        parse_list(input, ON_STRUCT, STRUCT_OPTIONS, |lookahead| {
            if !lookahead.peek(kw::table) {
                return Ok(false);
            }
            let name = input.parse::<kw::table>()?;
            let value = string_value(input, "table", "payments")?;
            set(&mut table, name, "table", ATTRIBUTE, value)?;
            Ok(true)
        })?;
        Ok(StructOptions { table })
    }
}

impl Parse for FieldOptions {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let mut options = FieldOptions::default();
        parse_list(input, ON_FIELD, FIELD_OPTIONS, |lookahead| {
            if lookahead.peek(kw::token) {
                let name = input.parse::<kw::token>()?;
                flag(input, &mut options.token, name, "token", ATTRIBUTE)?;
            } else if lookahead.peek(kw::request_hash) {
                let name = input.parse::<kw::request_hash>()?;
                flag(
                    input,
                    &mut options.request_hash,
                    name,
                    "request_hash",
                    ATTRIBUTE,
                )?;
            } else if lookahead.peek(kw::generated) {
                let name = input.parse::<kw::generated>()?;
                flag(input, &mut options.generated, name, "generated", ATTRIBUTE)?;
            } else if lookahead.peek(kw::column) {
                let name = input.parse::<kw::column>()?;
                let value = string_value(input, "column", "idempotency_token")?;
                set(&mut options.column, name, "column", ATTRIBUTE, value)?;
            } else {
                return Ok(false);
            }
            Ok(true)
        })?;
        Ok(options)
    }
}

/// Parses `= "<name>"` and checks the name.
fn string_value(input: ParseStream<'_>, name: &str, example: &str) -> syn::Result<LitStr> {
    equals(input, name, ATTRIBUTE, &format!("\"{example}\""))?;
    let lit = string_literal(input, || {
        format!("`{name}` in `#[idem(...)]` takes a string literal, as in `{name} = \"{example}\"`")
    })?;
    check_name(&lit.value(), name).map_err(|message| syn::Error::new_spanned(&lit, message))?;
    Ok(lit)
}

#[cfg(test)]
mod tests {
    use quote::quote;

    use crate::entity::test_support::errors;

    #[test]
    fn names_are_checked() {
        let e = errors(quote! {
            #[idem(table = "pay ments")]
            struct P { a: i64 }
        });
        assert!(
            e[0].starts_with("invalid table name \"pay ments\""),
            "{e:?}"
        );
        let e = errors(quote! {
            #[idem(table = "p")]
            struct P { #[idem(column = "1a")] a: i64 }
        });
        assert!(e[0].starts_with("invalid column name \"1a\""), "{e:?}");
        let e = errors(quote! {
            #[idem(table = p)]
            struct P { a: i64 }
        });
        assert!(e[0].contains("takes a string literal"), "{e:?}");
    }

    #[test]
    fn flags_and_repeats() {
        let e = errors(quote! {
            #[idem(table = "t")]
            struct T { #[idem(token = true)] a: String }
        });
        assert!(e[0].contains("is a flag"), "{e:?}");
        let e = errors(quote! {
            #[idem(table = "t")]
            #[idem(table = "u")]
            struct T { a: String }
        });
        assert!(e[0].contains("`table` is given more than once"), "{e:?}");
    }
}
