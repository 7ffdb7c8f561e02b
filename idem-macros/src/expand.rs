//! Code generation: the annotated `async fn` keeps its signature and its body
//! becomes a call to `::idem::__private::run`.

use proc_macro2::{Ident, Span, TokenStream, TokenTree};
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::visit_mut::VisitMut;
use syn::{AttrStyle, Expr, FnArg, ItemFn, Pat, PatIdent, ReturnType, Type};

use crate::attr::{Args, DurationArg, InProgress};
use crate::valid;

/// Parses the attribute's arguments and the item, checks both, and returns
/// the rewritten function.
pub(crate) fn idempotent(args: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let args = syn::parse2::<Args>(args);
    // When the arguments do not parse, whether `fingerprint` was given is
    // unknown: do not report pattern arguments then.
    let fingerprint_given = args.as_ref().map_or(true, |a| a.fingerprint.is_some());
    let function = valid::item(item, fingerprint_given);
    match (args, function) {
        (Ok(args), Ok(function)) => Ok(expand(&args, function)),
        (Err(mut a), Err(b)) => {
            a.combine(b);
            Err(a)
        }
        (Err(e), _) | (_, Err(e)) => Err(e),
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
    let fingerprint = match &args.fingerprint {
        Some(expr) => expr.to_token_stream(),
        None => default_fingerprint(&sig, store_arg.as_ref()),
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
        if Some(&*ident) == store_arg.as_ref() || !body_idents.contains(ident) {
            continue;
        }
        let mutability = mutability.take();
        rebinds.push(quote! {
            #[allow(unused_variables)]
            let #mutability #ident = #ident;
        });
    }

    let scope = match &args.scope {
        Some(expr) => expr.to_token_stream(),
        None => {
            let name = sig.ident.to_string();
            let name = name.strip_prefix("r#").unwrap_or(&name);
            quote!(::core::concat!(::core::module_path!(), "::", #name))
        }
    };
    let key = &args.key;
    let store = &args.store;
    let policy = policy(args);

    let (return_type, return_span) = match &sig.output {
        ReturnType::Type(_, ty) => {
            let mut ty = (**ty).clone();
            EraseImplTrait.visit_type_mut(&mut ty);
            (ty.into_token_stream(), ty_span(&sig.output))
        }
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
    let call = Ident::new("__idem_call", Span::mixed_site());
    // Bounds on the output and error types are reported at the return type.
    let run = match &args.replayable {
        None => quote_spanned!(return_span=> ::idem::__private::run),
        Some(_) => quote_spanned!(return_span=> ::idem::__private::run_replaying),
    };
    let replayable = args.replayable.as_ref().map(|pred| quote!(, #pred));
    let key_fn = quote_spanned!(key.span()=> ::idem::__private::key);
    let fingerprint_fn = quote_spanned!(fingerprint.span()=> ::idem::__private::fingerprint);

    quote! {
        #(#outer_attrs)*
        #vis #sig {
            #(#inner_attrs)*
            let #call = ::idem::__private::Call::from_parts(
                ::idem::__private::scope(#scope),
                #key_fn(&(#key)),
                #fingerprint_fn(&(#fingerprint)),
                #policy,
            );
            #run(&(#store), #call, async {
                #(#rebinds)*
                #fake_return
                #(#stmts)*
            } #replayable)
            .await
        }
    }
}

/// `Policy::new()` with the options that were given.
fn policy(args: &Args) -> TokenStream {
    let duration = |arg: &DurationArg| {
        let millis = arg.millis;
        quote_spanned!(arg.lit.span()=> ::core::time::Duration::from_millis(#millis))
    };
    let mut policy = quote!(::idem::__private::Policy::new());
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

/// Every argument except `self` and the store, as a tuple of references:
/// `(&a, &b,)`, or `()` when there is none.
fn default_fingerprint(sig: &syn::Signature, store_arg: Option<&Ident>) -> TokenStream {
    let refs = sig.inputs.iter().filter_map(|input| match input {
        FnArg::Typed(arg) => match &*arg.pat {
            Pat::Ident(pat) if Some(&pat.ident) != store_arg => {
                let ident = &pat.ident;
                Some(quote_spanned!(ident.span()=> &#ident,))
            }
            // Pattern arguments are rejected by `valid` when no
            // `fingerprint` is given.
            _ => None,
        },
        FnArg::Receiver(_) => None,
    });
    quote!((#(#refs)*))
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

fn ty_span(output: &ReturnType) -> Span {
    match output {
        ReturnType::Type(_, ty) => ty.span(),
        ReturnType::Default => Span::call_site(),
    }
}

/// Replaces `impl Trait` by `_`, which a `let` type annotation accepts.
struct EraseImplTrait;

impl VisitMut for EraseImplTrait {
    fn visit_type_mut(&mut self, ty: &mut Type) {
        if let Type::ImplTrait(impl_trait) = ty {
            *ty = Type::Infer(syn::TypeInfer {
                underscore_token: syn::Token![_](impl_trait.impl_token.span),
            });
        } else {
            syn::visit_mut::visit_type_mut(self, ty);
        }
    }
}
