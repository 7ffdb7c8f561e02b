//! The struct under `#[derive(Entity)]`, twice: as parsed ([`Input`], its
//! fields and their `#[idem(...)]` options, with what those got wrong), and
//! as checked ([`Description`], the table and its columns), which is what
//! `expand` writes the impls from.

use syn::spanned::Spanned;
use syn::{Data, DeriveInput, Fields, Generics, Ident};

use super::attr::{FieldOptions, StructOptions};

/// The struct as parsed: a struct with named fields, nothing else checked.
pub(super) struct Input<'a> {
    pub(super) ident: &'a Ident,
    pub(super) generics: &'a Generics,
    pub(super) options: StructOptions,
    /// What the struct's `#[idem(...)]` attributes got wrong, in order.
    pub(super) errors: Vec<syn::Error>,
    /// Every field, in declaration order.
    pub(super) fields: Vec<Field<'a>>,
}

/// A named field as parsed.
pub(super) struct Field<'a> {
    pub(super) original: &'a syn::Field,
    pub(super) ident: &'a Ident,
    pub(super) options: FieldOptions,
    /// What the field's `#[idem(...)]` attributes got wrong, in order.
    pub(super) errors: Vec<syn::Error>,
}

/// The table, checked: what the impls are written from.
pub(super) struct Description<'a> {
    pub(super) ident: &'a Ident,
    pub(super) generics: &'a Generics,
    pub(super) table: String,
    /// Every field, with its column, in declaration order.
    pub(super) fields: Vec<Column<'a>>,
    /// The index in `fields` of the token.
    pub(super) token: Option<usize>,
    /// The index in `fields` of the request hash.
    pub(super) request_hash: Option<usize>,
}

/// A field and its column, checked.
pub(super) struct Column<'a> {
    pub(super) field: &'a syn::Field,
    pub(super) ident: &'a Ident,
    /// The column's name: `column = "..."`, or the field's.
    pub(super) name: String,
    pub(super) generated: bool,
}

impl<'a> Input<'a> {
    /// Parses the struct and every `#[idem(...)]` attribute on it. Only a
    /// shape the derive cannot describe fails here; the attributes'
    /// mistakes are kept for `valid`.
    pub(super) fn from_syn(input: &'a DeriveInput) -> syn::Result<Self> {
        let fields = match &input.data {
            Data::Struct(data) => match &data.fields {
                Fields::Named(named) => &named.named,
                other => {
                    return Err(syn::Error::new(
                        other
                            .span()
                            .join(input.ident.span())
                            .unwrap_or(input.ident.span()),
                        "`#[derive(idem::Entity)]` needs a struct with named fields: \
                         each field is a column of the same name",
                    ))
                }
            },
            Data::Enum(data) => {
                return Err(syn::Error::new_spanned(
                    data.enum_token,
                    "`#[derive(idem::Entity)]` only applies to a struct with named fields",
                ))
            }
            Data::Union(data) => {
                return Err(syn::Error::new_spanned(
                    data.union_token,
                    "`#[derive(idem::Entity)]` only applies to a struct with named fields",
                ))
            }
        };

        let mut errors = Vec::new();
        let options = StructOptions::from_attrs(&input.attrs, &mut errors);
        let fields = fields
            .iter()
            .map(|field| {
                let mut errors = Vec::new();
                Field {
                    original: field,
                    ident: field.ident.as_ref().expect("named fields"),
                    options: FieldOptions::from_attrs(&field.attrs, &mut errors),
                    errors,
                }
            })
            .collect();
        Ok(Input {
            ident: &input.ident,
            generics: &input.generics,
            options,
            errors,
            fields,
        })
    }
}

#[cfg(test)]
mod tests {
    use quote::quote;

    use crate::entity::test_support::errors;

    #[test]
    fn shapes() {
        let e = errors(quote!(
            enum E {
                A,
            }
        ));
        assert!(e[0].contains("only applies to a struct"), "{e:?}");
        let e = errors(quote! {
            #[idem(table = "t")]
            struct T(i64);
        });
        assert!(e[0].contains("named fields"), "{e:?}");
    }
}
