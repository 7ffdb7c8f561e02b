//! Compile-time behaviour of `#[idempotent]`: every misuse in `tests/ui/*.rs`
//! fails with the committed message, and every shape in `tests/ui/pass/`
//! compiles and runs.
//!
//! Regenerate the `.stderr` files with
//! `TRYBUILD=overwrite cargo test -p idem-ui-tests --test ui`
//! and read every one before committing it.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
    t.pass("tests/ui/pass/*.rs");
}
