//! The derive's code generation, from a checked [`Description`]: impls of
//! `idem::Entity`, of `idem::TokenEntity` when there is a token field, and
//! of `idem::EntityBind<DB>` for every database that can encode the
//! written fields.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{GenericParam, Generics, Ident, Type, WherePredicate};

use super::ast::{Column, Description};

/// Every impl the derive writes.
pub(super) fn derive(entity: &Description<'_>) -> TokenStream {
    let name = entity.ident;
    let (impl_generics, ty_generics, where_clause) = entity.generics.split_for_impl();
    let table = &entity.table;
    let written: Vec<&Column<'_>> = entity.fields.iter().filter(|c| !c.generated).collect();
    let column_names = written.iter().map(|c| &c.name);

    let table_impl = quote! {
        #[automatically_derived]
        impl #impl_generics ::idem::expansion::Entity for #name #ty_generics #where_clause {
            const TABLE: &'static ::core::primitive::str = #table;
            const COLUMNS: &'static [&'static ::core::primitive::str] = &[#(#column_names),*];
        }
    };
    let token = entity.token.map(|index| token_entity(entity, index));
    let bind = entity_bind(entity, &written);
    quote! {
        #table_impl
        #token
        #bind
    }
}

/// `TokenEntity`, the token being `entity.fields[index]`.
fn token_entity(entity: &Description<'_>, index: usize) -> TokenStream {
    let name = entity.ident;
    let (impl_generics, ty_generics, where_clause) = entity.generics.split_for_impl();
    let column = &entity.fields[index];
    let field = column.ident;
    let token_name = &column.name;
    let to_key = quote_spanned! {column.field.ty.span()=>
        ::idem::expansion::AsKey::to_key(&self.#field)
    };
    let (hash_name, read_hash, write_hash) = match entity.request_hash {
        Some(index) => {
            let column = &entity.fields[index];
            let field = column.ident;
            let hash_name = &column.name;
            let span = column.field.ty.span();
            (
                quote!(::core::option::Option::Some(#hash_name)),
                quote_spanned!(span=> ::idem::expansion::RequestHash::to_fingerprint(&self.#field)),
                quote_spanned! {span=>
                    self.#field = ::idem::expansion::RequestHash::from_fingerprint(fingerprint);
                },
            )
        }
        None => (
            quote!(::core::option::Option::None),
            quote!(::core::result::Result::Ok(::core::option::Option::None)),
            quote!(let _ = fingerprint;),
        ),
    };
    quote! {
        #[automatically_derived]
        impl #impl_generics ::idem::expansion::TokenEntity for #name #ty_generics #where_clause {
            const TOKEN_COLUMN: &'static ::core::primitive::str = #token_name;
            const REQUEST_HASH_COLUMN: ::core::option::Option<&'static ::core::primitive::str> =
                #hash_name;

            fn token(
                &self,
            ) -> ::core::result::Result<::idem::expansion::Key, ::idem::expansion::KeyError> {
                #to_key
            }

            fn request_hash(
                &self,
            ) -> ::core::result::Result<
                ::core::option::Option<::idem::expansion::Fingerprint>,
                ::idem::expansion::Error,
            > {
                #read_hash
            }

            fn set_request_hash(&mut self, fingerprint: &::idem::expansion::Fingerprint) {
                #write_hash
            }
        }
    }
}

/// `EntityBind<DB>` for every `DB` that can encode each written field.
fn entity_bind(entity: &Description<'_>, written: &[&Column<'_>]) -> TokenStream {
    let name = entity.ident;
    let db = Ident::new("__IdemDb", Span::mixed_site());
    let mut generics: Generics = entity.generics.clone();
    generics.params.insert(
        0,
        GenericParam::Type(syn::parse_quote!(#db: ::idem::entity::sqlx::Database)),
    );
    let (_, ty_generics, _) = entity.generics.split_for_impl();
    let where_clause = generics.make_where_clause();
    for column in written {
        let ty: &Type = &column.field.ty;
        let predicate: WherePredicate = syn::parse_quote_spanned! {ty.span()=>
            #ty: for<'__q> ::idem::entity::sqlx::Encode<'__q, #db>
                + ::idem::entity::sqlx::Type<#db>
        };
        where_clause.predicates.push(predicate);
    }
    let (impl_generics, _, where_clause) = generics.split_for_impl();
    let arms = written.iter().map(|column| {
        let field = column.ident;
        let column_name = &column.name;
        quote! {
            #column_name => ::idem::entity::sqlx::Arguments::add(arguments, &self.#field),
        }
    });
    quote! {
        #[automatically_derived]
        impl #impl_generics ::idem::expansion::EntityBind<#db> for #name #ty_generics #where_clause {
            fn bind_column<'__q>(
                &'__q self,
                column: &::core::primitive::str,
                arguments: &mut <#db as ::idem::entity::sqlx::Database>::Arguments<'__q>,
            ) -> ::core::result::Result<(), ::idem::entity::sqlx::error::BoxDynError> {
                match column {
                    #(#arms)*
                    other => ::core::result::Result::Err(::core::convert::From::from(
                        ::std::format!("the entity has no column {:?} to bind", other),
                    )),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use quote::quote;

    use crate::entity::test_support::expand;

    #[test]
    fn a_payment_with_token_hash_rename_and_generated_id() {
        let out = expand(quote! {
            #[derive(sqlx::FromRow)]
            #[idem(table = "payments")]
            struct Payment {
                #[idem(generated)]
                id: i64,
                #[idem(token, column = "idempotency_token")]
                token: String,
                amount: i64,
                #[idem(request_hash)]
                request_hash: Option<String>,
            }
        });
        assert!(
            out.contains(r#"const TABLE : & 'static :: core :: primitive :: str = "payments""#),
            "{out}"
        );
        assert!(
            out.contains(r#"& ["idempotency_token" , "amount" , "request_hash"]"#),
            "{out}"
        );
        assert!(out.contains(r#"const TOKEN_COLUMN : & 'static :: core :: primitive :: str = "idempotency_token""#), "{out}");
        assert!(
            out.contains(r#":: core :: option :: Option :: Some ("request_hash")"#),
            "{out}"
        );
        assert!(
            out.contains(":: idem :: expansion :: AsKey :: to_key (& self . token)"),
            "{out}"
        );
        assert!(
            out.contains(r#""amount" => :: idem :: entity :: sqlx :: Arguments :: add (arguments , & self . amount) ,"#),
            "{out}"
        );
        // The generated column is read, never bound.
        assert!(!out.contains("self . id"), "{out}");
        assert!(
            out.contains(
                "i64 : for < '__q > :: idem :: entity :: sqlx :: Encode < '__q , __IdemDb >"
            ),
            "{out}"
        );
    }

    #[test]
    fn without_a_token_only_entity_and_bind() {
        let out = expand(quote! {
            #[idem(table = "subscriptions")]
            struct Subscription<P: Clone> where P: Send {
                user_id: i64,
                r#type: P,
            }
        });
        assert!(!out.contains("TokenEntity"), "{out}");
        assert!(out.contains(r#"& ["user_id" , "type"]"#), "{out}");
        assert!(
            out.contains("impl < __IdemDb : :: idem :: entity :: sqlx :: Database , P : Clone >"),
            "{out}"
        );
        assert!(
            out.contains("for Subscription < P > where P : Send , i64 :"),
            "{out}"
        );
    }
}
