//! The canonical JSON form: the one text each payload that the crate
//! compares is reduced to, and the special cases met on the way. The
//! fingerprint of a payload ([`crate::fingerprint`], and through it
//! `#[idempotent]`'s default one), of an HTTP request's JSON body
//! (`idem::http`) and the content key of a consumer's message
//! (`idem::consumer::content_key_of_json`) hash this form; outcomes and
//! step outputs are written by [`to_vec`].
//!
//! One file per job:
//!
//! - `serialize`: a `Serialize` value to JSON bytes or to a
//!   `serde_json::Value`, through a wrapper that catches the values
//!   `serde_json` has no form for;
//! - `exact`: whether a JSON text reads into a `Value` without losing
//!   what tells it apart from another text;
//! - `text`: a `Value` to its canonical text, the bytes that are hashed.
//!
//! Nothing here may change a byte it writes: stored fingerprints and
//! outcomes are compared with these bytes, from one release to the next.
//!
//! # The canonical text
//!
//! Object members sorted by key, comparing the keys' UTF-8 bytes, at every
//! depth; array order kept; no whitespace; strings escaped as `serde_json`
//! escapes them (`"`, `\`, and control characters only; other characters
//! as UTF-8); numbers as `serde_json` prints them (integers in decimal,
//! floats in their shortest round-trip form). The members are sorted at
//! write time, so the text is the same whether or not `serde_json`'s
//! `preserve_order` feature is on in the final build.
//!
//! # Values JSON has no form for
//!
//! `serde_json` writes every non-finite float (NaN, +inf, -inf) as `null`,
//! silently. Stored as an outcome, that `null` is read back as something
//! else, or not at all; in a fingerprint, payloads that differ only there
//! would compare equal. And its `Value` has no integer beyond 64 bits, so
//! that a payload holding one (an amount in wei, a `u128` id) could not be
//! fingerprinted at all. So:
//!
//! - [`to_vec`] (outcomes, step outputs) refuses a non-finite float, with
//!   an error that says so, and writes a wide integer as a number, as
//!   `serde_json` does;
//! - [`to_value`] (fingerprints) writes each as a mark that no other value
//!   shares: `"\0NaN"`, `"\0inf"`, `"\0-inf"`, or `"\0int:"` and the
//!   integer's digits; every string that starts with NUL gets one more NUL
//!   in front; and [`write_text`] puts `\0marked\0`, which starts no JSON
//!   text, before the whole, so that the marked form of one payload is
//!   never the plain form of another.
//!
//! A value with neither gets exactly the bytes `serde_json` gives it.
//!
//! # JSON numbers and repeated members
//!
//! A JSON text received as bytes (an HTTP body, a consumer's message) is
//! hashed in its canonical form only when reading it into a
//! `serde_json::Value` cannot make two different texts equal; otherwise it
//! is hashed by its bytes, under a tag of their own. [`exact_value`]
//! decides. Reading can lose two things:
//!
//! - **Numbers.** A `Value` holds a number as a 64-bit integer or as an
//!   `f64`. `100000000000000000001`, past 64 bits, would be read as the
//!   double of `100000000000000000000`, and `0.10000000000000001` as the
//!   double of `0.1`: each would be merged with another number. So each
//!   number of the text must be an integer of 64 bits, or one whose
//!   double's shortest text (the one `serde_json`, ryu and JavaScript's
//!   `JSON.stringify` write, such as `59.97000000000001` for `19.99 * 3`)
//!   has the value of the number's text, in any spelling
//!   (`5.997000000000001e1`, `1e+21`, `0.00000015`, `-0.0`): the canonical
//!   text writes it as that shortest text, which no number of another
//!   value is written as. Also refused: a number beyond the doubles
//!   (`1e400`, `1e-400`), and one that `serde_json` (without its
//!   `float_roundtrip` feature) reads as a neighbour of its nearest double
//!   (`1945349.4000000001`, read as the double written `1945349.4`).
//! - **Members named twice.** A `Value` keeps the last member of an object
//!   that names one twice, which would merge `{"amount":1,"amount":100}`
//!   with `{"amount":100}`, where a reader that keeps the first sees 1.
//!
//! A text nested deeper than `serde_json` reads (128 levels) is hashed by
//! its bytes too.

mod exact;
mod serialize;
mod text;

pub use exact::exact_value;
pub use serialize::{plain_or_marked, to_value, to_vec, Checked, Floats};
pub use text::write_text;
