//! `#[derive(Entity)]`: the description of a business table, parsed from
//! `#[idem(...)]` attributes, checked, and turned into impls of
//! `idem::Entity`, `idem::TokenEntity` and `idem::EntityBind`.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::parse::{Parse, ParseStream};
use syn::spanned::Spanned;
use syn::{
    Data, DeriveInput, Field, Fields, GenericParam, Generics, Ident, LitStr, Type, WherePredicate,
};

use crate::diag::{combine, repeated};
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

/// The derive's entry point: the impls, or every problem found.
pub(crate) fn derive(input: TokenStream) -> syn::Result<TokenStream> {
    let input: DeriveInput = syn::parse2(input)?;
    let entity = Description::from_input(&input)?;
    Ok(entity.expand(&input))
}

/// A checked description of the table.
struct Description<'a> {
    table: String,
    /// Every field, with its column, in declaration order.
    fields: Vec<Column<'a>>,
    token: Option<usize>,
    request_hash: Option<usize>,
}

struct Column<'a> {
    field: &'a Field,
    ident: &'a Ident,
    name: String,
    generated: bool,
}

/// One `#[idem(...)]` attribute on the struct.
struct StructOptions {
    table: Option<LitStr>,
}

/// One `#[idem(...)]` attribute on a field.
#[derive(Default)]
struct FieldOptions {
    token: Option<kw::token>,
    request_hash: Option<kw::request_hash>,
    column: Option<LitStr>,
    generated: Option<kw::generated>,
}

impl Parse for StructOptions {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let mut options = StructOptions { table: None };
        parse_list(input, ON_STRUCT, STRUCT_OPTIONS, |lookahead| {
            if lookahead.peek(kw::table) {
                let name = input.parse::<kw::table>()?;
                let value = string_value(input, "table", "payments")?;
                set(&mut options.table, name, "table", ATTRIBUTE, value)?;
            } else {
                return Ok(false);
            }
            Ok(true)
        })?;
        Ok(options)
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

/// The rule of `idem`'s table names, applied to every name formatted into
/// SQL: 1 to 63 ASCII letters, digits and underscores, not starting with a
/// digit.
fn check_name(name: &str, what: &str) -> Result<(), String> {
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

impl<'a> Description<'a> {
    fn from_input(input: &'a DeriveInput) -> syn::Result<Self> {
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
        let mut table = None;
        for attr in input.attrs.iter().filter(|a| a.path().is_ident("idem")) {
            match attr.parse_args::<StructOptions>() {
                Ok(StructOptions { table: Some(lit) }) if table.is_some() => {
                    errors.push(repeated(lit, "table", ATTRIBUTE))
                }
                Ok(options) => table = table.or(options.table),
                Err(err) => errors.push(err),
            }
        }

        let mut columns = Vec::new();
        let mut token: Option<(usize, kw::token)> = None;
        let mut request_hash: Option<(usize, kw::request_hash)> = None;
        for (index, field) in fields.iter().enumerate() {
            let ident = field.ident.as_ref().expect("named fields");
            let mut options = FieldOptions::default();
            for attr in field.attrs.iter().filter(|a| a.path().is_ident("idem")) {
                match attr.parse_args::<FieldOptions>() {
                    Ok(more) => merge(&mut options, more, &mut errors),
                    Err(err) => errors.push(err),
                }
            }
            if let Some(flag) = options.token {
                match token {
                    Some(_) => errors.push(syn::Error::new(
                        flag.span,
                        "only one field can be the `token`",
                    )),
                    None => token = Some((index, flag)),
                }
            }
            if let Some(flag) = options.request_hash {
                match request_hash {
                    Some(_) => errors.push(syn::Error::new(
                        flag.span,
                        "only one field can be the `request_hash`",
                    )),
                    None => request_hash = Some((index, flag)),
                }
            }
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
                field,
                ident,
                name,
                generated: options.generated.is_some(),
            });
        }

        let table = match table {
            Some(lit) => Some(lit.value()),
            None => {
                errors.push(syn::Error::new_spanned(
                    &input.ident,
                    format!(
                        "`#[derive(idem::Entity)]` needs the table's name: add \
                         `#[idem(table = \"{}\")]` on the struct",
                        default_table(&input.ident)
                    ),
                ));
                None
            }
        };
        if !columns.is_empty() && columns.iter().all(|c| c.generated) {
            errors.push(syn::Error::new_spanned(
                &input.ident,
                "every field is `generated`: an insert would write no column",
            ));
        }
        if columns.is_empty() {
            errors.push(syn::Error::new_spanned(
                &input.ident,
                "`#[derive(idem::Entity)]` needs at least one field",
            ));
        }
        if let (Some(_), None) = (request_hash, token) {
            let (_, flag) = request_hash.expect("matched");
            errors.push(syn::Error::new(
                flag.span,
                "`request_hash` is compared in entity mode, which needs a `token` field: \
                 mark the token field with `#[idem(token)]`",
            ));
        }
        combine(errors)?;

        Ok(Description {
            table: table.expect("checked"),
            fields: columns,
            token: token.map(|(index, _)| index),
            request_hash: request_hash.map(|(index, _)| index),
        })
    }

    fn expand(&self, input: &DeriveInput) -> TokenStream {
        let name = &input.ident;
        let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
        let table = &self.table;
        let written: Vec<&Column<'_>> = self.fields.iter().filter(|c| !c.generated).collect();
        let column_names = written.iter().map(|c| &c.name);

        let entity = quote! {
            #[automatically_derived]
            impl #impl_generics ::idem::__private::Entity for #name #ty_generics #where_clause {
                const TABLE: &'static ::core::primitive::str = #table;
                const COLUMNS: &'static [&'static ::core::primitive::str] = &[#(#column_names),*];
            }
        };

        let token = self.token.map(|index| {
            let column = &self.fields[index];
            let field = column.ident;
            let token_name = &column.name;
            let to_key = quote_spanned! {column.field.ty.span()=>
                ::idem::__private::AsKey::to_key(&self.#field)
            };
            let (hash_name, read_hash, write_hash) = match self.request_hash {
                Some(index) => {
                    let column = &self.fields[index];
                    let field = column.ident;
                    let hash_name = &column.name;
                    let span = column.field.ty.span();
                    (
                        quote!(::core::option::Option::Some(#hash_name)),
                        quote_spanned!(span=> ::idem::__private::RequestHash::to_fingerprint(&self.#field)),
                        quote_spanned! {span=>
                            self.#field = ::idem::__private::RequestHash::from_fingerprint(fingerprint);
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
                impl #impl_generics ::idem::__private::TokenEntity for #name #ty_generics #where_clause {
                    const TOKEN_COLUMN: &'static ::core::primitive::str = #token_name;
                    const REQUEST_HASH_COLUMN: ::core::option::Option<&'static ::core::primitive::str> =
                        #hash_name;

                    fn token(
                        &self,
                    ) -> ::core::result::Result<::idem::__private::Key, ::idem::__private::KeyError> {
                        #to_key
                    }

                    fn request_hash(
                        &self,
                    ) -> ::core::result::Result<
                        ::core::option::Option<::idem::__private::Fingerprint>,
                        ::idem::__private::Error,
                    > {
                        #read_hash
                    }

                    fn set_request_hash(&mut self, fingerprint: &::idem::__private::Fingerprint) {
                        #write_hash
                    }
                }
            }
        });

        let bind = self.expand_bind(input, &written);
        quote! {
            #entity
            #token
            #bind
        }
    }

    /// `EntityBind<DB>` for every `DB` that can encode each written field.
    fn expand_bind(&self, input: &DeriveInput, written: &[&Column<'_>]) -> TokenStream {
        let name = &input.ident;
        let db = Ident::new("__IdemDb", Span::mixed_site());
        let mut generics: Generics = input.generics.clone();
        generics.params.insert(
            0,
            GenericParam::Type(syn::parse_quote!(#db: ::idem::__private::sqlx::Database)),
        );
        let (_, ty_generics, _) = input.generics.split_for_impl();
        let where_clause = generics.make_where_clause();
        for column in written {
            let ty: &Type = &column.field.ty;
            let predicate: WherePredicate = syn::parse_quote_spanned! {ty.span()=>
                #ty: for<'__q> ::idem::__private::sqlx::Encode<'__q, #db>
                    + ::idem::__private::sqlx::Type<#db>
            };
            where_clause.predicates.push(predicate);
        }
        let (impl_generics, _, where_clause) = generics.split_for_impl();
        let arms = written.iter().map(|column| {
            let field = column.ident;
            let column_name = &column.name;
            quote! {
                #column_name => ::idem::__private::sqlx::Arguments::add(arguments, &self.#field),
            }
        });
        quote! {
            #[automatically_derived]
            impl #impl_generics ::idem::__private::EntityBind<#db> for #name #ty_generics #where_clause {
                fn bind_column<'__q>(
                    &'__q self,
                    column: &::core::primitive::str,
                    arguments: &mut <#db as ::idem::__private::sqlx::Database>::Arguments<'__q>,
                ) -> ::core::result::Result<(), ::idem::__private::sqlx::error::BoxDynError> {
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
}

/// Combines the options of several `#[idem(...)]` attributes on one field.
fn merge(into: &mut FieldOptions, more: FieldOptions, errors: &mut Vec<syn::Error>) {
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
    one(&mut into.token, more.token, "token", errors);
    one(
        &mut into.request_hash,
        more.request_hash,
        "request_hash",
        errors,
    );
    one(&mut into.column, more.column, "column", errors);
    one(&mut into.generated, more.generated, "generated", errors);
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
    use super::*;

    fn expand(input: TokenStream) -> String {
        derive(input).unwrap_or_else(|e| panic!("{e}")).to_string()
    }

    fn errors(input: TokenStream) -> Vec<String> {
        match derive(input) {
            Ok(_) => panic!("accepted"),
            Err(e) => e.into_iter().map(|e| e.to_string()).collect(),
        }
    }

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
            out.contains(":: idem :: __private :: AsKey :: to_key (& self . token)"),
            "{out}"
        );
        assert!(
            out.contains(r#""amount" => :: idem :: __private :: sqlx :: Arguments :: add (arguments , & self . amount) ,"#),
            "{out}"
        );
        // The generated column is read, never bound.
        assert!(!out.contains("self . id"), "{out}");
        assert!(
            out.contains(
                "i64 : for < '__q > :: idem :: __private :: sqlx :: Encode < '__q , __IdemDb >"
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
            out.contains(
                "impl < __IdemDb : :: idem :: __private :: sqlx :: Database , P : Clone >"
            ),
            "{out}"
        );
        assert!(
            out.contains("for Subscription < P > where P : Send , i64 :"),
            "{out}"
        );
    }

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
    fn shapes_and_flags() {
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
        let e = errors(quote! {
            #[idem(table = "t")]
            struct T { #[idem(token = true)] a: String }
        });
        assert!(e[0].contains("is a flag"), "{e:?}");
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
        let e = errors(quote! {
            #[idem(table = "t")]
            #[idem(table = "u")]
            struct T { a: String }
        });
        assert!(e[0].contains("`table` is given more than once"), "{e:?}");
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
