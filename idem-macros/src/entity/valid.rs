//! The derive's checks, from the parsed [`Input`] to the checked
//! [`Description`]: one token and one request hash at most, flags that go
//! together, column names that are valid and distinct, a table, a column
//! to write. Every problem is reported at once, at the tokens to change, in
//! the order of the source.

use proc_macro2::Span;
use syn::Ident;

use super::ast::{Column, Description, Input};
use crate::diag::{check_name, combine};

impl<'a> Input<'a> {
    /// Checks the struct and names each field's column.
    pub(super) fn validate(self) -> syn::Result<Description<'a>> {
        let mut errors = self.errors;
        let mut columns = Vec::new();
        let mut token: Option<(usize, Span)> = None;
        let mut request_hash: Option<(usize, Span)> = None;
        for (index, field) in self.fields.into_iter().enumerate() {
            errors.extend(field.errors);
            let (ident, options) = (field.ident, field.options);
            let flag = options.token.map(|flag| flag.span);
            only_one(&mut token, index, flag, "token", &mut errors);
            let flag = options.request_hash.map(|flag| flag.span);
            only_one(&mut request_hash, index, flag, "request_hash", &mut errors);
            if let (Some(flag), Some(_)) = (options.token, options.request_hash) {
                errors.push(syn::Error::new(
                    flag.span,
                    "a field cannot be both the `token` and the `request_hash`",
                ));
            }
            if let Some(generated) = options.generated {
                if options.token.is_some() || options.request_hash.is_some() {
                    errors.push(syn::Error::new(
                        generated.span,
                        "the `token` and `request_hash` fields are written by the insert, \
                         so they cannot be `generated`",
                    ));
                }
            }
            let name = match &options.column {
                Some(lit) => lit.value(),
                None => {
                    let name = ident.to_string();
                    let name = name.strip_prefix("r#").unwrap_or(&name).to_owned();
                    if let Err(message) = check_name(&name, "column") {
                        errors.push(syn::Error::new_spanned(
                            ident,
                            format!("{message}; name the column with `#[idem(column = \"...\")]`"),
                        ));
                    }
                    name
                }
            };
            if columns.iter().any(|c: &Column<'_>| c.name == name) {
                errors.push(syn::Error::new_spanned(
                    ident,
                    format!("the column `{name}` is named twice"),
                ));
            }
            columns.push(Column {
                field: field.original,
                ident,
                name,
                generated: options.generated.is_some(),
            });
        }

        let table = match self.options.table {
            Some(lit) => Some(lit.value()),
            None => {
                errors.push(syn::Error::new_spanned(
                    self.ident,
                    format!(
                        "`#[derive(idem::Entity)]` needs the table's name: add \
                         `#[idem(table = \"{}\")]` on the struct",
                        default_table(self.ident)
                    ),
                ));
                None
            }
        };
        if !columns.is_empty() && columns.iter().all(|c| c.generated) {
            errors.push(syn::Error::new_spanned(
                self.ident,
                "every field is `generated`: an insert would write no column",
            ));
        }
        if columns.is_empty() {
            errors.push(syn::Error::new_spanned(
                self.ident,
                "`#[derive(idem::Entity)]` needs at least one field",
            ));
        }
        if let (Some((_, flag)), None) = (request_hash, token) {
            errors.push(syn::Error::new(
                flag,
                "`request_hash` is compared in entity mode, which needs a `token` field: \
                 mark the token field with `#[idem(token)]`",
            ));
        }
        combine(errors)?;

        Ok(Description {
            ident: self.ident,
            generics: self.generics,
            table: table.expect("checked"),
            fields: columns,
            token: token.map(|(index, _)| index),
            request_hash: request_hash.map(|(index, _)| index),
        })
    }
}

/// Takes the field at `index`, marked `label` at `flag`, as the struct's
/// `label` unless an earlier field is; a second one is reported at its flag.
fn only_one(
    first: &mut Option<(usize, Span)>,
    index: usize,
    flag: Option<Span>,
    label: &str,
    errors: &mut Vec<syn::Error>,
) {
    let Some(flag) = flag else { return };
    match first {
        Some(_) => errors.push(syn::Error::new(
            flag,
            format!("only one field can be the `{label}`"),
        )),
        None => *first = Some((index, flag)),
    }
}

/// A plausible table name for the hint: the struct's name in snake case,
/// plus `s`.
fn default_table(ident: &Ident) -> String {
    let mut out = String::new();
    for (i, c) in ident.to_string().chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out.push('s');
    out
}

#[cfg(test)]
mod tests {
    use proc_macro2::Span;
    use quote::quote;
    use syn::Ident;

    use super::default_table;
    use crate::entity::test_support::errors;

    #[test]
    fn mistakes_are_reported_together() {
        let messages = errors(quote! {
            struct Payment {
                #[idem(token)]
                a: String,
                #[idem(token, request_hash)]
                b: String,
                #[idem(column = "a")]
                c: String,
                #[idem(colour = "red")]
                d: String,
            }
        });
        let expected = [
            "only one field can be the `token`",
            "a field cannot be both",
            "the column `a` is named twice",
            "unknown option `colour`",
            "needs the table's name: add `#[idem(table = \"payments\")]`",
        ];
        assert_eq!(messages.len(), expected.len(), "{messages:#?}");
        for (message, expected) in messages.iter().zip(expected) {
            assert!(message.contains(expected), "{message:?} lacks {expected:?}");
        }
    }

    #[test]
    fn what_the_token_and_request_hash_allow() {
        let e = errors(quote! {
            #[idem(table = "t")]
            struct T { #[idem(token, generated)] a: String, b: i64 }
        });
        assert!(e[0].contains("cannot be `generated`"), "{e:?}");
        let e = errors(quote! {
            #[idem(table = "t")]
            struct T { a: String, #[idem(request_hash)] h: String }
        });
        assert!(e[0].contains("needs a `token` field"), "{e:?}");
    }

    #[test]
    fn table_hint() {
        assert_eq!(
            default_table(&Ident::new("Payment", Span::call_site())),
            "payments"
        );
        assert_eq!(
            default_table(&Ident::new("CardCharge", Span::call_site())),
            "card_charges"
        );
    }
}
