//! The expansion, checked on its output text.

use super::*;

fn expand_str(args: TokenStream, item: TokenStream) -> String {
    idempotent(args, item)
        .unwrap_or_else(|e| panic!("{e}"))
        .to_string()
}

fn squash(tokens: TokenStream) -> String {
    tokens.to_string()
}

#[test]
fn whole_expansion_of_a_method() {
    let out = expand_str(
        quote!(key = cmd.token, store = self.store),
        quote! {
            /// Docs stay.
            pub async fn charge(&self, cmd: Charge) -> Result<Receipt, PaymentError> {
                let receipt = self.gateway.charge(cmd.amount).await?;
                Ok(receipt)
            }
        },
    );
    let expected = squash(quote! {
        #[doc = r" Docs stay."]
        pub async fn charge(&self, cmd: Charge) -> Result<Receipt, PaymentError> {
            ::idem::expansion::run(
                &(self.store),
                ::idem::expansion::Call::from_parts(
                    ::idem::expansion::IntoScope::into_scope(
                        ::core::concat!(::core::module_path!(), "::", "charge")
                    ),
                    ::idem::expansion::AsKey::to_key(&(cmd.token))
                        .map_err(::idem::expansion::Error::from),
                    ::idem::expansion::arguments([
                        ::idem::expansion::Argument::to_json(&(cmd))
                    ]),
                    ::idem::expansion::Policy::new(),
                )
                .with_codec(::idem::expansion::Output::codec()),
                async {
                    #[allow(unused_variables)]
                    let cmd = cmd;
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
                        let __idem_fake_return: Result<Receipt, PaymentError> = loop {};
                        return __idem_fake_return;
                    }
                    let receipt = self.gateway.charge(cmd.amount).await?;
                    Ok(receipt)
                }
            )
            .await
        }
    });
    assert_eq!(out, expected);
}

#[test]
fn default_fingerprint_skips_receiver_and_store_argument() {
    let out = expand_str(
        quote!(key = key, store = store),
        quote!(
            async fn f(store: &S, key: &str, amount: u64) -> Result<(), E> {
                Ok(())
            }
        ),
    );
    assert!(
        out.contains(&squash(quote!(arguments([
            ::idem::expansion::Argument::to_json(&(key)),
            ::idem::expansion::Argument::to_json(&(amount))
        ])))),
        "{out}"
    );
    assert!(out.contains("run (& (store) , :: idem"), "{out}");
    assert!(
        out.contains(
            ", :: idem :: expansion :: Policy :: new () ,) \
             . with_codec (:: idem :: expansion :: Output :: codec ()) , async"
        ),
        "{out}"
    );

    let out = expand_str(
        quote!(key = KEY, store = STORE),
        quote!(
            async fn f(&mut self) -> Result<(), E> {
                Ok(())
            }
        ),
    );
    assert!(
        out.contains(&squash(quote!(
            ::idem::expansion::Payload::fingerprint(&())
        ))),
        "{out}"
    );
}

#[test]
fn explicit_fingerprint_scope_and_replayable() {
    let out = expand_str(
        quote! {
            key = cmd.key,
            store = self.store,
            scope = "payments.create",
            fingerprint = (&cmd.amount, &cmd.currency),
            replayable = |e| e.is_final(),
        },
        quote!(
            async fn f(&self, cmd: Cmd) -> Result<(), E> {
                Ok(())
            }
        ),
    );
    assert!(
        out.contains(&squash(quote!(into_scope("payments.create")))),
        "{out}"
    );
    assert!(
        out.contains(&squash(quote!(::idem::expansion::Payload::fingerprint(
            &((&cmd.amount, &cmd.currency))
        )))),
        "{out}"
    );
    assert!(
        out.contains(
            ":: idem :: expansion :: Policy :: new () ,) \
             . with_codec (:: idem :: expansion :: Output :: codec ()) , \
             :: idem :: expansion :: replayable :: < Result < () , E > , _ > \
             (| e | e . is_final ())) , async"
        ),
        "{out}"
    );
    assert!(
        out.contains(
            ":: idem :: expansion :: run (& (self . store) , \
             :: idem :: expansion :: ReplayableError :: replaying (:: idem"
        ),
        "{out}"
    );
}

#[test]
fn transactional_and_replayable_call_one_function() {
    let out = expand_str(
        quote!(key = key, store = store, tx = conn, replayable = |_| true),
        quote!(
            async fn f(store: &S, conn: &mut C, key: &str) -> Result<impl Sized, E> {
                Ok(1)
            }
        ),
    );
    // `impl Trait` names no error type: `()` stands for it.
    assert!(
        out.contains(
            ":: idem :: expansion :: replayable :: < Result < () , E > , _ > (| _ | true)"
        ),
        "{out}"
    );
    assert!(
        out.contains(
            ":: idem :: expansion :: run_in_transaction (& (store) , conn , \
             :: idem :: expansion :: ReplayableError :: replaying (:: idem"
        ),
        "{out}"
    );
    assert!(!out.contains("run_in_transaction_replaying"), "{out}");
}

#[test]
fn entity_mode_passes_another_runtime_function() {
    let out = expand_str(
        quote!(key = cmd.token, store = self.pool, entity),
        quote!(
            async fn pay(&self, cmd: Cmd) -> Result<Payment, E> {
                Ok(Payment::new(cmd))
            }
        ),
    );
    assert!(
        out.contains(":: idem :: expansion :: run_entity (& (self . pool) , :: idem"),
        "{out}"
    );
    assert!(!out.contains("expansion :: run ("), "{out}");
    // The row is the record: no codec.
    assert!(!out.contains("with_codec"), "{out}");
}

#[test]
fn missing_key_run_is_on_the_call() {
    let item = quote!(
        async fn f(k: Option<String>) -> Result<(), E> {
            Ok(())
        }
    );
    let out = expand_str(quote!(key = k, store = S, missing_key = run), item.clone());
    assert!(
        out.contains(&squash(quote!(
            .with_codec(::idem::expansion::Output::codec())
            .on_missing_key(::idem::expansion::MissingKey::Run),
        ))),
        "{out}"
    );
    // `reject` is the default: nothing to say.
    let reject = expand_str(
        quote!(key = k, store = S, missing_key = reject),
        item.clone(),
    );
    assert_eq!(reject, expand_str(quote!(key = k, store = S), item));
}

#[test]
fn output_type_of_results_and_aliases() {
    for (ty, output) in [
        (quote!(Result<Receipt, E>), "Receipt"),
        (quote!(std::result::Result<Vec<u8>, E>), "Vec < u8 >"),
        (quote!(io::Result<u64>), "u64"),
        (quote!((Result<impl Sized, E>)), "impl Sized"),
        (quote!(Outcome), "Outcome"),
    ] {
        let ty: Type = syn::parse2(ty).unwrap();
        assert_eq!(ok_type(&ty).to_token_stream().to_string(), output);
    }
}

#[test]
fn policy_from_durations_and_in_progress_options() {
    let item = quote!(
        async fn f(k: u64) -> Result<(), E> {
            Ok(())
        }
    );
    let out = expand_str(
        quote!(
            key = k,
            store = S,
            ttl = "1h30m",
            lease = "500ms",
            wait = "2s"
        ),
        item.clone(),
    );
    let policy = squash(quote! {
        ::idem::expansion::Policy::new()
            .ttl(::core::time::Duration::from_millis(5400000u64))
            .lease(::core::time::Duration::from_millis(500u64))
            .wait(::core::time::Duration::from_millis(2000u64)),
    });
    assert!(out.contains(&policy), "{out}");

    let out = expand_str(quote!(key = k, store = S, fail_fast), item.clone());
    assert!(
        out.contains(&squash(quote!(Policy::new().fail_fast(),))),
        "{out}"
    );
    let out = expand_str(quote!(key = k, store = S, wait = "0s"), item);
    assert!(out.contains(&squash(
        quote!(.wait(::core::time::Duration::from_millis(0u64)))
    )));
}

#[test]
fn arguments_used_by_the_body_move_into_it() {
    let out = expand_str(
        quote!(key = key, store = store),
        quote! {
            async fn f(store: &S, key: String, mut lines: Vec<String>, unused: u8, seen: u8) -> Result<usize, E> {
                lines.push(format!("{}", seen));
                Ok(lines.len())
            }
        },
    );
    // `mut` moves from the signature to the rebinding.
    assert!(
        out.contains(&squash(
            quote!(key: String, lines: Vec<String>, unused: u8, seen: u8)
        ),),
        "{out}"
    );
    assert!(
        out.contains(&squash(quote!(let mut lines = lines;))),
        "{out}"
    );
    assert!(out.contains(&squash(quote!(let seen = seen;))), "{out}");
    assert!(!out.contains("let unused"), "{out}");
    assert!(!out.contains("let key"), "{out}");
    assert!(!out.contains("let store"), "{out}");
}

#[test]
fn raw_names_inner_attributes_and_impl_trait() {
    let out = expand_str(
        quote!(key = k, store = s),
        quote! {
            async fn r#match(k: u8) -> Result<impl Sized, E> {
                #![allow(clippy::all)]
                Ok(k)
            }
        },
    );
    assert!(
        out.contains(r#"module_path ! () , "::" , "match")"#),
        "{out}"
    );
    assert!(
        out.contains(
            "-> Result < impl Sized , E > { # ! [allow (clippy :: all)] :: idem :: expansion :: run"
        ),
        "{out}"
    );
    assert!(
        out.contains(&squash(
            quote!(let __idem_fake_return: Result<_, E> = loop {};)
        )),
        "{out}"
    );
}

#[test]
fn argument_and_item_errors_are_reported_together() {
    let err = idempotent(
        quote!(store = s),
        quote!(
            fn f() {}
        ),
    )
    .unwrap_err();
    let messages: Vec<String> = err.into_iter().map(|e| e.to_string()).collect();
    assert_eq!(messages.len(), 3, "{messages:?}");
    assert!(messages[0].contains("needs `key = ...`"));
    assert!(messages[1].contains("only applies to `async fn`"));
    assert!(messages[2].contains("must return `Result<T, E>`"));
}

#[test]
fn pattern_arguments_are_not_reported_when_the_arguments_do_not_parse() {
    let err = idempotent(
        quote!(key = k, store = s, fingerprint = ),
        quote!(
            async fn f(k: u8, (a, b): (u8, u8)) -> Result<(), E> {
                Ok(())
            }
        ),
    )
    .unwrap_err();
    assert_eq!(err.into_iter().count(), 1);
}
