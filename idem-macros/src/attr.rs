//! The arguments of `#[idempotent(...)]`.

use proc_macro2::Span;
use quote::quote;
use syn::parse::{Parse, ParseStream};
use syn::spanned::Spanned;
use syn::{Expr, Ident, LitStr};

use crate::duration;
use crate::options::{equals, flag, no_value, parse_list, set, string_literal};

mod kw {
    syn::custom_keyword!(key);
    syn::custom_keyword!(store);
    syn::custom_keyword!(scope);
    syn::custom_keyword!(ttl);
    syn::custom_keyword!(lease);
    syn::custom_keyword!(wait);
    syn::custom_keyword!(fail_fast);
    syn::custom_keyword!(fingerprint);
    syn::custom_keyword!(replayable);
    syn::custom_keyword!(tx);
    syn::custom_keyword!(entity);
    syn::custom_keyword!(missing_key);
    syn::custom_keyword!(run);
    syn::custom_keyword!(reject);
}

/// How messages name the attribute.
const ATTRIBUTE: &str = "`#[idempotent]`";

/// Every option name, in the order the documentation lists them.
const OPTIONS: &str = "the options are `key`, `store`, `scope`, `ttl`, `lease`, `wait`, \
                       `fail_fast`, `fingerprint`, `replayable`, `tx`, `entity`, `missing_key`";

/// The parsed and checked arguments.
pub(crate) struct Args {
    /// `key = <expr>`.
    pub(crate) key: Expr,
    /// `store = <expr>`.
    pub(crate) store: Expr,
    /// `scope = <expr>`.
    pub(crate) scope: Option<Expr>,
    /// `ttl = "..."`.
    pub(crate) ttl: Option<DurationArg>,
    /// `lease = "..."`.
    pub(crate) lease: Option<DurationArg>,
    /// `wait = "..."` or `fail_fast`.
    pub(crate) in_progress: Option<InProgress>,
    /// `fingerprint = <expr>`.
    pub(crate) fingerprint: Option<Expr>,
    /// `replayable = <expr>`.
    pub(crate) replayable: Option<Replayable>,
    /// `tx = <argument>`: transactional mode on that connection argument.
    pub(crate) tx: Option<Ident>,
    /// `entity`: entity mode, `store` being a sqlx pool.
    pub(crate) entity: Option<kw::entity>,
    /// `missing_key = run | reject`.
    pub(crate) missing_key: Option<MissingKey>,
}

/// `replayable = <expr>`, kept with its name so that an error about the
/// option can point at all of it.
pub(crate) struct Replayable {
    /// The option's name.
    pub(crate) name: kw::replayable,
    /// The predicate.
    pub(crate) predicate: Expr,
}

/// What to do when the key is `None`.
pub(crate) enum MissingKey {
    /// Fail with `idem::Error::MissingKey` (the default).
    Reject,
    /// Run the body without protection.
    Run(kw::run),
}

/// A duration literal checked at parse time.
pub(crate) struct DurationArg {
    /// The literal as written, for spans.
    pub(crate) lit: LitStr,
    /// Its value in milliseconds.
    pub(crate) millis: u64,
}

/// What to do when the same key is still being processed by another call.
pub(crate) enum InProgress {
    /// Wait up to this long for the first call's outcome.
    Wait(DurationArg),
    /// Fail at once.
    FailFast(kw::fail_fast),
}

/// The options as they appear, before the required ones are checked.
#[derive(Default)]
struct Partial {
    key: Option<Expr>,
    store: Option<Expr>,
    /// Kept with its name, so that entity mode can point at the whole
    /// argument when it refuses it.
    scope: Option<(kw::scope, Expr)>,
    ttl: Option<DurationArg>,
    lease: Option<DurationArg>,
    wait: Option<DurationArg>,
    fail_fast: Option<kw::fail_fast>,
    fingerprint: Option<Expr>,
    replayable: Option<Replayable>,
    tx: Option<Ident>,
    entity: Option<kw::entity>,
    missing_key: Option<(kw::missing_key, MissingKey)>,
}

impl Parse for Args {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let mut p = Partial::default();
        parse_list(input, ATTRIBUTE, OPTIONS, |lookahead| {
            if lookahead.peek(kw::key) {
                let name = input.parse::<kw::key>()?;
                let value = expr_value(input, "key")?;
                set(&mut p.key, name, "key", ATTRIBUTE, value)?;
            } else if lookahead.peek(kw::store) {
                let name = input.parse::<kw::store>()?;
                let value = expr_value(input, "store")?;
                set(&mut p.store, name, "store", ATTRIBUTE, value)?;
            } else if lookahead.peek(kw::scope) {
                let name = input.parse::<kw::scope>()?;
                let value = expr_value(input, "scope")?;
                set(&mut p.scope, name, "scope", ATTRIBUTE, (name, value))?;
            } else if lookahead.peek(kw::fingerprint) {
                let name = input.parse::<kw::fingerprint>()?;
                let value = expr_value(input, "fingerprint")?;
                set(&mut p.fingerprint, name, "fingerprint", ATTRIBUTE, value)?;
            } else if lookahead.peek(kw::replayable) {
                let name = input.parse::<kw::replayable>()?;
                let predicate = expr_value(input, "replayable")?;
                let value = Replayable { name, predicate };
                set(&mut p.replayable, name, "replayable", ATTRIBUTE, value)?;
            } else if lookahead.peek(kw::tx) {
                let name = input.parse::<kw::tx>()?;
                equals(input, "tx", ATTRIBUTE, "conn")?;
                let value: Ident = input.parse().map_err(|e| {
                    syn::Error::new(
                        e.span(),
                        "`tx` in `#[idempotent]` names the argument holding the open \
                         transaction or connection, as in `tx = conn`",
                    )
                })?;
                set(&mut p.tx, name, "tx", ATTRIBUTE, value)?;
            } else if lookahead.peek(kw::missing_key) {
                let name = input.parse::<kw::missing_key>()?;
                equals(input, "missing_key", ATTRIBUTE, "run")?;
                let value = missing_key_value(input)?;
                set(
                    &mut p.missing_key,
                    name,
                    "missing_key",
                    ATTRIBUTE,
                    (name, value),
                )?;
            } else if lookahead.peek(kw::entity) {
                let name = input.parse::<kw::entity>()?;
                flag(input, &mut p.entity, name, "entity", ATTRIBUTE)?;
            } else if lookahead.peek(kw::ttl) {
                let name = input.parse::<kw::ttl>()?;
                let value = duration_value(input, "ttl", "24h", false)?;
                set(&mut p.ttl, name, "ttl", ATTRIBUTE, value)?;
            } else if lookahead.peek(kw::lease) {
                let name = input.parse::<kw::lease>()?;
                let value = duration_value(input, "lease", "30s", false)?;
                set(&mut p.lease, name, "lease", ATTRIBUTE, value)?;
            } else if lookahead.peek(kw::wait) {
                let name = input.parse::<kw::wait>()?;
                let value = duration_value(input, "wait", "10s", true)?;
                if p.fail_fast.is_some() {
                    return Err(wait_and_fail_fast(name));
                }
                set(&mut p.wait, name, "wait", ATTRIBUTE, value)?;
            } else if lookahead.peek(kw::fail_fast) {
                let name = input.parse::<kw::fail_fast>()?;
                no_value(input, name, "fail_fast", ATTRIBUTE)?;
                if p.wait.is_some() {
                    return Err(wait_and_fail_fast(name));
                }
                set(&mut p.fail_fast, name, "fail_fast", ATTRIBUTE, name)?;
            } else {
                return Ok(false);
            }
            Ok(true)
        })?;
        p.finish()
    }
}

impl Partial {
    fn finish(self) -> syn::Result<Args> {
        if let Some(flag) = &self.entity {
            entity_alone(flag, &self)?;
        }
        let missing = |name: &str, example: &str| {
            syn::Error::new(
                Span::call_site(),
                format!(
                    "the `#[idempotent]` attribute needs `{name} = ...`, \
                     for example `#[idempotent({example})]`"
                ),
            )
        };
        let key = self
            .key
            .ok_or_else(|| missing("key", "key = cmd.idempotency_key, store = self.store"));
        let store = self
            .store
            .ok_or_else(|| missing("store", "key = cmd.idempotency_key, store = self.store"));
        let (key, store) = match (key, store) {
            (Ok(key), Ok(store)) => (key, store),
            (Err(mut a), Err(b)) => {
                a.combine(b);
                return Err(a);
            }
            (Err(e), _) | (_, Err(e)) => return Err(e),
        };
        let in_progress = match (self.wait, self.fail_fast) {
            (Some(wait), None) => Some(InProgress::Wait(wait)),
            (None, Some(flag)) => Some(InProgress::FailFast(flag)),
            (None, None) => None,
            // Rejected while parsing.
            (Some(_), Some(_)) => unreachable!("`wait` and `fail_fast` together"),
        };
        Ok(Args {
            key,
            store,
            scope: self.scope.map(|(_, expr)| expr),
            ttl: self.ttl,
            lease: self.lease,
            in_progress,
            fingerprint: self.fingerprint,
            replayable: self.replayable,
            tx: self.tx,
            entity: self.entity,
            missing_key: self.missing_key.map(|(_, value)| value),
        })
    }
}

/// Entity mode keeps no record: the options about records do not apply.
fn entity_alone(flag: &kw::entity, p: &Partial) -> syn::Result<()> {
    // The row is found by its token alone: a scope, and the tenant it may
    // name, would be ignored, so one tenant's token could answer another's
    // row. Refused at the argument, where the fix is.
    if let Some((name, scope)) = &p.scope {
        return Err(syn::Error::new_spanned(
            quote!(#name = #scope),
            "`entity` cannot be combined with `scope` in `#[idempotent]`: in entity mode \
             the token column alone identifies the operation, so the scope and any tenant \
             in it would be ignored; put the tenant into the key itself \
             (`key = format!(\"{tenant}:{id}\")`), or drop `entity` to use record mode, \
             where a scope's tenant is part of the key",
        ));
    }
    let why = if p.replayable.is_some() {
        Some((
            "replayable",
            "entity mode stores only the entity the body returns, never an error",
        ))
    } else if p.ttl.is_some() {
        Some((
            "ttl",
            "the entity's row lives as long as the table keeps it",
        ))
    } else if p.tx.is_some() {
        Some((
            "tx",
            "entity mode runs in a transaction of its own, on the pool given as `store`",
        ))
    } else if p.missing_key.is_some() {
        Some((
            "missing_key",
            "entity mode finds the row by its token, so it always needs a key",
        ))
    } else {
        None
    };
    match why {
        Some((option, why)) => Err(syn::Error::new_spanned(
            flag,
            format!("`entity` cannot be combined with `{option}` in `#[idempotent]`: {why}"),
        )),
        None => Ok(()),
    }
}

fn wait_and_fail_fast(at: impl Spanned) -> syn::Error {
    syn::Error::new(
        at.span(),
        "`wait` and `fail_fast` cannot be used together in `#[idempotent]`; \
         choose `wait = \"...\"` to wait for the first call's result, \
         or `fail_fast` to fail at once",
    )
}

/// Parses the value of `missing_key`: `run` or `reject`.
fn missing_key_value(input: ParseStream<'_>) -> syn::Result<MissingKey> {
    if input.peek(kw::run) {
        return Ok(MissingKey::Run(input.parse()?));
    }
    if input.peek(kw::reject) {
        input.parse::<kw::reject>()?;
        return Ok(MissingKey::Reject);
    }
    let value: Expr = input.parse()?;
    Err(syn::Error::new_spanned(
        value,
        "`missing_key` in `#[idempotent]` is `run` or `reject`: with `reject` (the default) \
         a `None` key fails with `idem::Error::MissingKey`; with `run` the body runs \
         without protection, so a retry without a key runs it again",
    ))
}

/// Parses `= <expr>`.
fn expr_value(input: ParseStream<'_>, name: &str) -> syn::Result<Expr> {
    equals(input, name, ATTRIBUTE, "<expression>")?;
    input.parse()
}

/// Parses `= "<duration>"` and checks the duration.
fn duration_value(
    input: ParseStream<'_>,
    name: &str,
    example: &str,
    allow_zero: bool,
) -> syn::Result<DurationArg> {
    equals(input, name, ATTRIBUTE, &format!("\"{example}\""))?;
    let hint = format!(
        "write a duration string such as `{name} = \"{example}\"` \
         (units `ms`, `s`, `m`, `h`, `d`; parts add up, as in \"1h30m\")"
    );
    let lit = string_literal(input, || {
        format!("`{name}` in `#[idempotent]` takes a string literal; {hint}")
    })?;
    match duration::parse_millis(&lit.value(), allow_zero) {
        Ok(millis) => Ok(DurationArg { lit, millis }),
        Err(duration::DurationError::Zero) => Err(syn::Error::new_spanned(
            &lit,
            format!(
                "`{name}` in `#[idempotent]` must be longer than zero; \
                 write a duration such as `{name} = \"{example}\"`"
            ),
        )),
        Err(err) => Err(syn::Error::new_spanned(
            &lit,
            format!("invalid `{name}` duration in `#[idempotent]`: {err}; {hint}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::ToTokens;

    fn parse(src: &str) -> syn::Result<Args> {
        syn::parse_str::<Args>(src)
    }

    fn error(src: &str) -> String {
        match parse(src) {
            Ok(_) => panic!("{src:?} was accepted"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn required_only() {
        let args = parse("key = cmd.token, store = self.store").unwrap();
        assert_eq!(args.key.to_token_stream().to_string(), "cmd . token");
        assert_eq!(args.store.to_token_stream().to_string(), "self . store");
        assert!(args.scope.is_none() && args.ttl.is_none() && args.lease.is_none());
        assert!(args.in_progress.is_none() && args.fingerprint.is_none());
        assert!(args.replayable.is_none() && args.entity.is_none());
        assert!(args.missing_key.is_none());
    }

    #[test]
    fn missing_key_run_or_reject() {
        let args = parse("key = k, store = s, missing_key = run").unwrap();
        assert!(matches!(args.missing_key, Some(MissingKey::Run(_))));
        let args = parse("missing_key = reject, key = k, store = s").unwrap();
        assert!(matches!(args.missing_key, Some(MissingKey::Reject)));
        for value in ["skip", "\"run\"", "true", "Run"] {
            let e = error(&format!("key = k, store = s, missing_key = {value}"));
            assert!(
                e.starts_with("`missing_key` in `#[idempotent]` is `run` or `reject`"),
                "{e}"
            );
        }
        assert!(
            error("key = k, store = s, missing_key").contains("expected `=` after `missing_key`")
        );
        let e = error("key = k, store = s, missing_key = run, missing_key = reject");
        assert!(
            e.starts_with("`missing_key` is given more than once"),
            "{e}"
        );
    }

    #[test]
    fn entity_flag_and_what_it_excludes() {
        let args = parse("key = cmd.token, store = self.pool, entity, wait = \"2s\"").unwrap();
        assert!(args.entity.is_some());
        // The token's claim has a lease, renewed while the body runs.
        let args = parse("key = cmd.token, store = self.pool, entity, lease = \"1s\"").unwrap();
        assert!(args.lease.is_some());
        assert!(error("key = k, store = s, entity = true").contains("is a flag"));
        assert!(error("key = k, store = s, entity, entity").starts_with("`entity` is given more"));
        for (option, src) in [
            ("scope", "scope = \"payments\""),
            (
                "scope",
                "scope = Scope::new(\"pay\").with_principal(&cmd.tenant)",
            ),
            ("replayable", "replayable = |e| true"),
            ("ttl", "ttl = \"1h\""),
            ("tx", "tx = conn"),
            ("missing_key", "missing_key = run"),
        ] {
            let e = error(&format!("key = k, store = s, entity, {src}"));
            assert!(
                e.starts_with(&format!("`entity` cannot be combined with `{option}`")),
                "{e}"
            );
        }
    }

    #[test]
    fn all_options_any_order_trailing_comma() {
        let args = parse(
            r#"store = &self.store, ttl = "1h30m", key = &cmd.key, scope = "payments.create",
               lease = "45s", wait = "2s", fingerprint = (&cmd.amount, &cmd.currency),
               replayable = |e: &MyError| e.is_final(),"#,
        )
        .unwrap();
        assert_eq!(args.ttl.unwrap().millis, 5_400_000);
        assert_eq!(args.lease.unwrap().millis, 45_000);
        assert!(matches!(args.in_progress, Some(InProgress::Wait(ref w)) if w.millis == 2_000));
        assert!(args.scope.is_some() && args.fingerprint.is_some() && args.replayable.is_some());
    }

    #[test]
    fn fail_fast_and_zero_wait() {
        let args = parse("key = k, store = s, fail_fast").unwrap();
        assert!(matches!(args.in_progress, Some(InProgress::FailFast(_))));
        let args = parse("key = k, store = s, wait = \"0s\"").unwrap();
        assert!(matches!(args.in_progress, Some(InProgress::Wait(ref w)) if w.millis == 0));
    }

    #[test]
    fn missing_required() {
        assert!(error("store = s").contains("needs `key = ...`"));
        assert!(error("key = k").contains("needs `store = ...`"));
        let both = parse("").err().unwrap();
        assert_eq!(both.into_iter().count(), 2);
    }

    #[test]
    fn unknown_and_repeated() {
        let e = error("key = k, store = s, retries = 3");
        assert!(e.starts_with("unknown option `retries`"), "{e}");
        let e = error("key = k, store = s, ttl = \"1h\", ttl = \"2h\"");
        assert!(e.starts_with("`ttl` is given more than once"), "{e}");
        let e = error("key = k, key = j, store = s");
        assert!(e.starts_with("`key` is given more than once"), "{e}");
        let e = error("key = k, store = s, fail_fast, fail_fast");
        assert!(e.starts_with("`fail_fast` is given more than once"), "{e}");
    }

    #[test]
    fn wait_with_fail_fast() {
        for src in [
            "key = k, store = s, wait = \"1s\", fail_fast",
            "key = k, store = s, fail_fast, wait = \"1s\"",
        ] {
            assert!(error(src).starts_with("`wait` and `fail_fast` cannot be used together"));
        }
    }

    #[test]
    fn bad_values() {
        assert!(error("key = k, store = s, ttl = \"0s\"").contains("must be longer than zero"));
        assert!(error("key = k, store = s, lease = \"0ms\"").contains("must be longer than zero"));
        assert!(error("key = k, store = s, ttl = \"10x\"").contains("unknown unit `x`"));
        assert!(error("key = k, store = s, ttl = \"\"").contains("the duration is empty"));
        assert!(error("key = k, store = s, ttl = 3600").contains("takes a string literal"));
        assert!(error("key = k, store = s, fail_fast = true").contains("is a flag"));
        assert!(error("key, store = s").contains("expected `=` after `key`"));
        assert!(error("key = k store = s").contains("expected `,`"));
    }
}
