//! Checks on the annotated item: an `async fn` with a body, returning a
//! `Result`, whose arguments can be fingerprinted, and which names its
//! scope if it is generic.

use proc_macro2::{TokenStream, TokenTree};
use quote::ToTokens;
use syn::visit_mut::VisitMut;
use syn::{FnArg, GenericParam, Item, ItemFn, Pat, ReturnType, Signature, TraitItemFn, Type};

use crate::diag::combine;

/// Which options that change what the item must be were given. When the
/// options do not parse, both count as given, so that only certain
/// mistakes are reported.
#[derive(Clone, Copy)]
pub(crate) struct Given {
    /// `fingerprint = ...`: the arguments need not be fingerprinted.
    pub(crate) fingerprint: bool,
    /// `scope = ...`: the function may be generic.
    pub(crate) scope: bool,
}

/// Parses `item` and checks that `#[idempotent]` can rewrite it.
pub(crate) fn item(item: TokenStream, given: Given) -> syn::Result<ItemFn> {
    let function = match syn::parse2::<Item>(item.clone()) {
        Ok(Item::Fn(function)) => function,
        parsed => {
            // A method declaration without a body is not an `Item`, or is
            // only a verbatim one.
            if let Ok(decl) = syn::parse2::<TraitItemFn>(item) {
                if decl.default.is_none() {
                    return Err(syn::Error::new_spanned(
                        &decl.sig,
                        "the `#[idempotent]` attribute needs a function body; \
                         put it on the method in the `impl` block, not on the trait's declaration",
                    ));
                }
            }
            return Err(match parsed {
                Ok(other) => not_a_function(&other),
                Err(err) => err,
            });
        }
    };
    let sig = &function.sig;

    let mut errors = Vec::new();
    if let Some(constness) = &sig.constness {
        errors.push(syn::Error::new_spanned(
            constness,
            "the `#[idempotent]` attribute only applies to `async fn`, not `const fn`",
        ));
    } else if sig.asyncness.is_none() {
        let message = if returns_future(&sig.output) {
            // What `#[async_trait]` turns an `async fn` into before this
            // attribute runs.
            "the `#[idempotent]` attribute only applies to `async fn`; \
             in an `#[async_trait]` impl it sees the method after that rewrite, \
             so use a native `async fn` in the trait instead"
        } else {
            "the `#[idempotent]` attribute only applies to `async fn`; write `async fn`"
        };
        errors.push(syn::Error::new_spanned(sig.fn_token, message));
    }

    match &sig.output {
        ReturnType::Default => errors.push(syn::Error::new_spanned(
            &sig.ident,
            format!(
                "the `#[idempotent]` function `{}` must return `Result<T, E>`, \
                 where `T` is the saved output and `E: From<idem::Error>`; \
                 add a return type",
                sig.ident
            ),
        )),
        ReturnType::Type(_, ty) if !is_result(ty) => errors.push(syn::Error::new_spanned(
            ty,
            "the `#[idempotent]` attribute needs a return type of `Result<T, E>` \
             (or an alias whose name ends in `Result`), where `T` is the saved output \
             and `E: From<idem::Error>`",
        )),
        ReturnType::Type(..) => {}
    }

    if !given.scope {
        if let Some(generic) = generic(sig) {
            errors.push(syn::Error::new_spanned(
                generic,
                "a generic `#[idempotent]` fn needs `scope = ...`: its instantiations \
                 would share the default scope (module path and fn name), so one could be \
                 answered with another's stored outcome, of another type; name the \
                 operation, as in `scope = \"cache.fill\"`, or give each type its own with \
                 a name the type provides, as in `scope = format!(\"cache.fill.{}\", T::NAME)` \
                 (not `std::any::type_name`, which may change with the compiler)",
            ));
        }
    }

    if !given.fingerprint {
        for input in &sig.inputs {
            if let FnArg::Typed(arg) = input {
                if !matches!(&*arg.pat, Pat::Ident(_)) {
                    errors.push(syn::Error::new_spanned(
                        &arg.pat,
                        "the `#[idempotent]` attribute cannot fingerprint a pattern argument; \
                         bind it to a name, or pass `fingerprint = ...` with the payload to compare",
                    ));
                }
            }
        }
    }

    combine(errors)?;
    Ok(function)
}

/// The first type or const parameter of the function, or else its first
/// argument of an `impl Trait` type: a lifetime alone does not change the
/// types that are stored.
fn generic(sig: &Signature) -> Option<TokenStream> {
    let param = sig.generics.params.iter().find_map(|param| match param {
        GenericParam::Type(param) => Some(param.to_token_stream()),
        GenericParam::Const(param) => Some(param.to_token_stream()),
        GenericParam::Lifetime(_) => None,
    });
    param.or_else(|| {
        sig.inputs.iter().find_map(|input| match input {
            FnArg::Typed(arg) => impl_trait(&arg.ty),
            FnArg::Receiver(_) => None,
        })
    })
}

/// The first `impl Trait` in `ty`, at any depth.
fn impl_trait(ty: &Type) -> Option<TokenStream> {
    struct Find(Option<TokenStream>);
    impl VisitMut for Find {
        fn visit_type_impl_trait_mut(&mut self, ty: &mut syn::TypeImplTrait) {
            self.0.get_or_insert_with(|| ty.to_token_stream());
        }
    }
    let mut find = Find(None);
    find.visit_type_mut(&mut ty.clone());
    find.0
}

/// Whether `ty` looks like a `Result`: a path whose last segment is named
/// `Result` or ends in `Result` (`io::Result<T>`, `ApiResult<T>`).
fn is_result(ty: &Type) -> bool {
    match ty {
        Type::Group(group) => is_result(&group.elem),
        Type::Paren(paren) => is_result(&paren.elem),
        Type::Path(path) if path.qself.is_none() => path
            .path
            .segments
            .last()
            .is_some_and(|segment| segment.ident.to_string().ends_with("Result")),
        _ => false,
    }
}

/// Whether the return type names `Future` anywhere, as in
/// `Pin<Box<dyn Future<Output = ..> + Send>>`.
fn returns_future(output: &ReturnType) -> bool {
    fn mentions(tokens: TokenStream) -> bool {
        tokens.into_iter().any(|tree| match tree {
            TokenTree::Ident(ident) => ident == "Future",
            TokenTree::Group(group) => mentions(group.stream()),
            _ => false,
        })
    }
    mentions(output.to_token_stream())
}

fn not_a_function(item: &Item) -> syn::Error {
    const MESSAGE: &str = "the `#[idempotent]` attribute only applies to `async fn`";
    match item {
        Item::Struct(item) => syn::Error::new_spanned(item.struct_token, MESSAGE),
        Item::Enum(item) => syn::Error::new_spanned(item.enum_token, MESSAGE),
        Item::Union(item) => syn::Error::new_spanned(item.union_token, MESSAGE),
        Item::Impl(item) => syn::Error::new_spanned(
            item.impl_token,
            "the `#[idempotent]` attribute only applies to `async fn`; \
             put it on each method of the `impl` block instead",
        ),
        Item::Trait(item) => syn::Error::new_spanned(item.trait_token, MESSAGE),
        Item::Mod(item) => syn::Error::new_spanned(item.mod_token, MESSAGE),
        Item::Const(item) => syn::Error::new_spanned(item.const_token, MESSAGE),
        Item::Static(item) => syn::Error::new_spanned(item.static_token, MESSAGE),
        Item::Type(item) => syn::Error::new_spanned(item.type_token, MESSAGE),
        Item::Use(item) => syn::Error::new_spanned(item.use_token, MESSAGE),
        other => syn::Error::new_spanned(other, MESSAGE),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    const NOTHING: Given = Given {
        fingerprint: false,
        scope: false,
    };

    fn error(item: TokenStream) -> String {
        match super::item(item, NOTHING) {
            Ok(_) => panic!("accepted"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn accepts_async_fns_returning_results() {
        for item in [
            quote!(
                async fn f() -> Result<(), E> {}
            ),
            quote!(
                pub async fn f(&self, a: A) -> std::result::Result<u8, E> {
                    Ok(1)
                }
            ),
            quote!(
                async fn f(mut a: A, _b: B) -> io::Result<u8> {
                    Ok(1)
                }
            ),
            quote!(
                async fn f(self) -> ApiResult<u8> {
                    Ok(1)
                }
            ),
            quote!(
                async fn f<'a>(&mut self, t: &'a str) -> (Result<u8, E>) {
                    Ok(1)
                }
            ),
        ] {
            super::item(item, NOTHING).unwrap();
        }
    }

    #[test]
    fn generic_fns_need_a_scope() {
        for item in [
            quote!(
                async fn f<'a, T: Sized>(t: &'a T) -> Result<u8, E> {}
            ),
            quote!(
                async fn f<const N: usize>(t: [u8; N]) -> Result<u8, E> {}
            ),
            quote!(
                async fn f(store: &S, t: Vec<impl Serialize>) -> Result<u8, E> {}
            ),
        ] {
            let err = super::item(item.clone(), NOTHING).err().unwrap();
            assert!(err
                .to_string()
                .starts_with("a generic `#[idempotent]` fn needs `scope = ...`"));
            let given = Given {
                fingerprint: false,
                scope: true,
            };
            super::item(item, given).unwrap();
        }
    }

    #[test]
    fn rejects_what_it_cannot_rewrite() {
        assert!(error(quote!(
            fn f() -> Result<(), E> {}
        ))
        .contains("only applies to `async fn`"));
        assert!(error(quote!(
            const fn f() -> Result<(), E> {}
        ))
        .contains("not `const fn`"));
        assert!(error(quote!(
            struct S;
        ))
        .contains("only applies to `async fn`"));
        assert!(error(quote!(impl S {})).contains("each method"));
        assert!(error(quote!(
            async fn f(&self) -> Result<(), E>;
        ))
        .contains("function body"));
        assert!(error(quote!(
            async fn f() {}
        ))
        .contains("add a return type"));
        assert!(error(quote!(
            async fn f() -> u32 {
                1
            }
        ))
        .contains("`Result<T, E>`"));
        assert!(error(quote!(
            async fn f() -> Option<u32> {
                None
            }
        ))
        .contains("`Result<T, E>`"));
        assert!(error(quote!(
            async fn f((a, b): (u8, u8)) -> Result<(), E> {}
        ))
        .contains("cannot fingerprint a pattern argument"));
    }

    #[test]
    fn reports_every_problem_at_once() {
        let err = super::item(
            quote!(
                fn f((a, _): (u8, u8)) {}
            ),
            NOTHING,
        )
        .err()
        .unwrap();
        assert_eq!(err.into_iter().count(), 3);
    }

    #[test]
    fn explicit_fingerprint_allows_patterns() {
        let item = quote!(
            async fn f((a, b): (u8, u8)) -> Result<(), E> {
                Ok(())
            }
        );
        let given = Given {
            fingerprint: true,
            scope: false,
        };
        super::item(item, given).unwrap();
    }
}
