//! Code generation: the annotated `async fn` keeps its signature and its body
//! becomes a call to `::idem::expansion::run` (or `run_in_transaction`),
//! with the outcome policy on the call.
//!
//! What the attribute asks of the user's types is checked by trait
//! functions of `::idem::expansion` (`AsKey::to_key`, `Argument::to_json`,
//! `Output::codec`, ...), each spanned at the user's tokens it concerns (the
//! key, an argument, the output type, the `replayable` option), so that a
//! missing bound is reported there, once, in the attribute's words.

use proc_macro2::{Delimiter, Group, Ident, Span, TokenStream, TokenTree};
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::visit_mut::VisitMut;
use syn::{AttrStyle, Expr, FnArg, ItemFn, Pat, PatIdent, ReturnType, Type};

use crate::attr::{Args, DurationArg, InProgress, MissingKey, Replayable};
use crate::valid::{self, Given};

/// Parses the attribute's arguments and the item, checks both, and returns
/// the rewritten function.
pub(crate) fn idempotent(args: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let args = syn::parse2::<Args>(args);
    // When the arguments do not parse, whether `fingerprint` or `scope` was
    // given is unknown: do not report pattern arguments or generics then.
    let given = args.as_ref().map_or(
        Given {
            fingerprint: true,
            scope: true,
        },
        |a| Given {
            fingerprint: a.fingerprint.is_some(),
            scope: a.scope.is_some(),
        },
    );
    let function = valid::item(item, given);
    match (args, function) {
        (Ok(args), Ok(function)) => {
            check_tx(&args, &function)?;
            Ok(expand(&args, function))
        }
        (Err(mut a), Err(b)) => {
            a.combine(b);
            Err(a)
        }
        (Err(e), _) | (_, Err(e)) => Err(e),
    }
}

/// `tx = conn` must name an argument bound by a plain identifier.
fn check_tx(args: &Args, function: &ItemFn) -> syn::Result<()> {
    let Some(tx) = &args.tx else { return Ok(()) };
    let named = function.sig.inputs.iter().any(|input| match input {
        FnArg::Typed(arg) => matches!(&*arg.pat, Pat::Ident(pat) if pat.ident == *tx),
        FnArg::Receiver(_) => false,
    });
    if named {
        Ok(())
    } else {
        Err(syn::Error::new_spanned(
            tx,
            format!(
                "`tx = {tx}` in `#[idempotent]` must name an argument of the function \
                 holding the open transaction or connection, such as \
                 `{tx}: &mut sqlx::Transaction<'_, sqlx::Sqlite>`"
            ),
        ))
    }
}

/// Rewrites a checked function.
pub(crate) fn expand(args: &Args, function: ItemFn) -> TokenStream {
    let ItemFn {
        attrs,
        vis,
        mut sig,
        block,
    } = function;
    let (inner_attrs, outer_attrs): (Vec<_>, Vec<_>) = attrs
        .into_iter()
        .partition(|attr| matches!(attr.style, AttrStyle::Inner(_)));

    let store_arg = bare_ident(&args.store);
    // Neither the store nor the connection is part of the payload.
    let not_payload: Vec<&Ident> = store_arg.iter().chain(args.tx.as_ref()).collect();
    let fingerprint_call = match &args.fingerprint {
        Some(expr) => call_spanning(
            expr,
            quote!(::idem::expansion::Payload::fingerprint),
            ref_spanning(expr, expr),
        ),
        None => default_fingerprint(&sig, &not_payload),
    };

    // Arguments the body names are moved into the body's future, as an
    // `async move` block would; `self` is captured by the block's usual
    // precise capture, so `&mut self` methods can keep `store = self.store`.
    let body_idents = idents_in(block.to_token_stream());
    let mut rebinds = Vec::new();
    for input in &mut sig.inputs {
        let FnArg::Typed(arg) = input else { continue };
        let Pat::Ident(PatIdent {
            by_ref: None,
            mutability,
            ident,
            subpat: None,
            ..
        }) = &mut *arg.pat
        else {
            continue;
        };
        // The connection reaches the body as the closure's argument.
        if not_payload.contains(&&*ident) || !body_idents.contains(ident) {
            continue;
        }
        let mutability = mutability.take();
        rebinds.push(quote! {
            #[allow(unused_variables)]
            let #mutability #ident = #ident;
        });
    }

    let scope_call = match &args.scope {
        Some(expr) => call_spanning(
            expr,
            quote!(::idem::expansion::IntoScope::into_scope),
            expr.to_token_stream(),
        ),
        None => {
            let name = sig.ident.to_string();
            let name = name.strip_prefix("r#").unwrap_or(&name);
            quote! {
                ::idem::expansion::IntoScope::into_scope(
                    ::core::concat!(::core::module_path!(), "::", #name)
                )
            }
        }
    };
    let key = &args.key;
    let store = &args.store;
    let policy = policy(args);

    let (return_type, return_span) = match &sig.output {
        ReturnType::Type(_, ty) => (erase_impl_trait(ty, Erase::Infer), ty.span()),
        // Rejected by `valid`; kept total for unit tests.
        ReturnType::Default => (quote!(()), sig.ident.span()),
    };
    // Fix the block's output type before the body is checked, so that `?`
    // and `Ok(..)` infer their error type (the same edge as
    // tracing-attributes).
    let fake_return = quote_spanned! {return_span=>
        #[allow(
            unknown_lints,
            unreachable_code,
            clippy::diverging_sub_expression,
            clippy::empty_loop,
            clippy::let_unit_value,
            clippy::let_with_type_underscore,
            clippy::needless_return,
            clippy::unreachable
        )]
        if false {
            let __idem_fake_return: #return_type = loop {};
            return __idem_fake_return;
        }
    };

    // The body's statements, spliced with their spans: a nested `{ .. }`
    // block as the tail would trip `unused_braces` on one-line bodies.
    let stmts = &block.stmts;
    // Each generated call spans the user's tokens it depends on, so that an
    // unmet bound is reported there rather than at the attribute: the key's
    // type at the key, an argument's at the argument, the output type at
    // itself, the error type at the return type or at `replayable`, the
    // store's at the store.
    let key_call = call_spanning(
        key,
        quote!(::idem::expansion::AsKey::to_key),
        ref_spanning(key, key),
    );
    let store_ref = quote_spanned!(store.span()=> &(#store));
    let run = match &args.tx {
        // Entity mode excludes `tx` and `replayable` (see `attr`).
        _ if args.entity.is_some() => quote_spanned!(return_span=> ::idem::expansion::run_entity),
        None => quote_spanned!(return_span=> ::idem::expansion::run),
        Some(_) => quote_spanned!(return_span=> ::idem::expansion::run_in_transaction),
    };
    // The outcome policy is part of the call: the output is stored as JSON
    // once `Output` found it a serde type, spanned at the output type.
    // Entity mode stores the row instead.
    let codec = match (&args.entity, &sig.output) {
        (Some(_), _) | (_, ReturnType::Default) => quote!(),
        (None, ReturnType::Type(_, ty)) => {
            let codec = call_spanning(
                ok_type(ty),
                quote!(::idem::expansion::Output::codec),
                quote!(),
            );
            quote!(.with_codec(#codec))
        }
    };
    let missing_key = match &args.missing_key {
        Some(MissingKey::Run(run)) => {
            let run = Ident::new("Run", run.span);
            quote!(.on_missing_key(::idem::expansion::MissingKey::#run))
        }
        Some(MissingKey::Reject) | None => quote!(),
    };
    let block = quote! {
        async {
            #(#rebinds)*
            #fake_return
            #(#stmts)*
        }
    };
    // Transactional mode lends the connection to the body through a closure
    // whose argument shadows the function's; the body hands it back with
    // its result, so the engine can write the completion on it.
    let (body, conn_arg) = match &args.tx {
        Some(tx) => {
            let result = Ident::new("__idem_result", Span::mixed_site());
            let body = quote! {
                move |#tx| async move {
                    let #result = #block.await;
                    (#result, #tx)
                }
            };
            (body, quote!(#tx,))
        }
        None => (block, quote!()),
    };
    // The call is built in the argument list, before the body moves the
    // arguments into its future. Its outer tokens are spanned at the return
    // type: whatever the checks above leave to the call (the error type's
    // `From<idem::Error>`) is reported there, not at the attribute.
    let from_parts = quote_spanned! {return_span=>
        ::idem::expansion::Call::from_parts(
            #scope_call,
            #key_call.map_err(::idem::expansion::Error::from),
            #fingerprint_call,
            #policy,
        )
        #codec
        #missing_key
    };
    // Replayable errors are stored once `ReplayableError` found their type
    // a serde type, spanned at the option. The predicate's argument is
    // typed from the return type (`impl Trait` there is not needed for the
    // error type, and a turbofish cannot infer it), so a closure needs no
    // annotation.
    let call = match &args.replayable {
        Some(Replayable { name, predicate }) => {
            let returns = match &sig.output {
                ReturnType::Type(_, ty) => erase_impl_trait(ty, Erase::Unit),
                ReturnType::Default => quote!(()),
            };
            call_spanning(
                &quote!(#name = #predicate),
                quote!(::idem::expansion::ReplayableError::replaying),
                quote!(#from_parts, ::idem::expansion::replayable::<#returns, _>(#predicate)),
            )
        }
        None => from_parts,
    };
    // Spanned at the return type's first token only: the `.await` repeats
    // some of the call's bounds, and one span for both reports each once.
    let run_call = quote_spanned! {return_span=>
        #run(#store_ref, #conn_arg #call, #body).await
    };

    quote! {
        #(#outer_attrs)*
        #vis #sig {
            #(#inner_attrs)*
            #run_call
        }
    }
}

/// `Policy::new()` with the options that were given.
fn policy(args: &Args) -> TokenStream {
    let duration = |arg: &DurationArg| {
        let millis = arg.millis;
        quote_spanned!(arg.lit.span()=> ::core::time::Duration::from_millis(#millis))
    };
    let mut policy = quote!(::idem::expansion::Policy::new());
    if let Some(ttl) = &args.ttl {
        let ttl = duration(ttl);
        policy.extend(quote!(.ttl(#ttl)));
    }
    if let Some(lease) = &args.lease {
        let lease = duration(lease);
        policy.extend(quote!(.lease(#lease)));
    }
    match &args.in_progress {
        Some(InProgress::Wait(wait)) => {
            let wait = duration(wait);
            policy.extend(quote!(.wait(#wait)));
        }
        Some(InProgress::FailFast(flag)) => {
            let fail_fast = format_ident!("fail_fast", span = flag.span);
            policy.extend(quote!(.#fail_fast()));
        }
        None => {}
    }
    policy
}

/// The fingerprint of every argument except `self` and the store: that of
/// the tuple of their references, `(&a, &b,)`, or of `()` when there is
/// none. Each argument is checked where it is declared.
fn default_fingerprint(sig: &syn::Signature, not_payload: &[&Ident]) -> TokenStream {
    let values: Vec<TokenStream> = sig
        .inputs
        .iter()
        .filter_map(|input| match input {
            FnArg::Typed(arg) => match &*arg.pat {
                Pat::Ident(pat) if !not_payload.contains(&&pat.ident) => Some(call_spanning(
                    arg,
                    quote!(::idem::expansion::Argument::to_json),
                    ref_spanning(arg, &pat.ident),
                )),
                // Pattern arguments are rejected by `valid` when no
                // `fingerprint` is given.
                _ => None,
            },
            FnArg::Receiver(_) => None,
        })
        .collect();
    if values.is_empty() {
        quote!(::idem::expansion::Payload::fingerprint(&()))
    } else {
        quote!(::idem::expansion::arguments([#(#values),*]))
    }
}

/// The `T` of a return type `Result<T, E>` (or of an alias such as
/// `io::Result<T>`): the first type argument of its last path segment, or
/// the whole type when it has none.
fn ok_type(ty: &Type) -> &Type {
    match ty {
        Type::Group(group) => ok_type(&group.elem),
        Type::Paren(paren) => ok_type(&paren.elem),
        Type::Path(path) => {
            let first = path
                .path
                .segments
                .last()
                .and_then(|segment| match &segment.arguments {
                    syn::PathArguments::AngleBracketed(args) => {
                        args.args.iter().find_map(|arg| match arg {
                            syn::GenericArgument::Type(ty) => Some(ty),
                            _ => None,
                        })
                    }
                    _ => None,
                });
            first.unwrap_or(ty)
        }
        other => other,
    }
}

/// The identifier when `expr` is a lone name such as `store`.
fn bare_ident(expr: &Expr) -> Option<Ident> {
    match expr {
        Expr::Path(path) if path.qself.is_none() && path.attrs.is_empty() => {
            path.path.get_ident().cloned()
        }
        _ => None,
    }
}

/// Every identifier in `tokens`, at any depth (so also inside macro calls).
fn idents_in(tokens: TokenStream) -> Vec<Ident> {
    let mut out = Vec::new();
    let mut stack = vec![tokens];
    while let Some(tokens) = stack.pop() {
        for tree in tokens {
            match tree {
                TokenTree::Ident(ident) => out.push(ident),
                TokenTree::Group(group) => stack.push(group.stream()),
                TokenTree::Punct(_) | TokenTree::Literal(_) => {}
            }
        }
    }
    out
}

/// `path(args)` whose span, as the compiler computes it from the first and
/// the last token, covers all of `user` (proc-macro spans cannot be joined
/// on stable Rust, so the path takes the span of `user`'s first token and
/// the parentheses that of its last).
fn call_spanning(user: &impl ToTokens, path: TokenStream, args: TokenStream) -> TokenStream {
    let first = user.span();
    let last = last_span(user);
    let path = path.into_iter().map(|mut tree| {
        tree.set_span(first);
        tree
    });
    let mut args = Group::new(Delimiter::Parenthesis, args);
    args.set_span(last);
    quote!(#(#path)* #args)
}

/// `&(expr)`, spanning all of `user` (`expr` itself, or the argument that
/// declares it) in the same way as [`call_spanning`].
fn ref_spanning(user: &impl ToTokens, expr: &impl ToTokens) -> TokenStream {
    let ampersand = quote_spanned!(user.span()=> &);
    let mut inner = Group::new(Delimiter::Parenthesis, expr.to_token_stream());
    inner.set_span(last_span(user));
    quote!(#ampersand #inner)
}

/// The span of the last token of `tokens` (a group's covers its contents).
fn last_span(tokens: &impl ToTokens) -> Span {
    tokens
        .to_token_stream()
        .into_iter()
        .last()
        .map_or_else(Span::call_site, |tree| tree.span())
}

/// What `impl Trait` becomes in a type written in the body.
#[derive(Clone, Copy)]
enum Erase {
    /// `_`, which a `let` type annotation accepts and infers.
    Infer,
    /// `()`, where nothing would infer `_` (a turbofish whose type only
    /// serves to name another).
    Unit,
}

/// `ty` with every `impl Trait` replaced as `erase` says.
fn erase_impl_trait(ty: &Type, erase: Erase) -> TokenStream {
    let mut erased = ty.clone();
    EraseImplTrait(erase).visit_type_mut(&mut erased);
    erased.into_token_stream()
}

struct EraseImplTrait(Erase);

impl VisitMut for EraseImplTrait {
    fn visit_type_mut(&mut self, ty: &mut Type) {
        if let Type::ImplTrait(impl_trait) = ty {
            let span = impl_trait.impl_token.span;
            *ty = match self.0 {
                Erase::Infer => Type::Infer(syn::TypeInfer {
                    underscore_token: syn::Token![_](span),
                }),
                Erase::Unit => Type::Tuple(syn::TypeTuple {
                    paren_token: syn::token::Paren(span),
                    elems: syn::punctuated::Punctuated::new(),
                }),
            };
        } else {
            syn::visit_mut::visit_type_mut(self, ty);
        }
    }
}

#[cfg(test)]
mod tests;
