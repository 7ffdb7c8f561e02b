//! The canonical JSON form, and the special cases met on the way to it:
//! [`serialize`] writes a `Serialize` value as JSON, catching the values
//! `serde_json` has no form for; [`exact`] tells whether a JSON text reads
//! into a `serde_json::Value` without loss.

mod exact;
mod serialize;

pub(crate) use exact::exact_value;
#[cfg(test)]
pub(crate) use exact::number_is_exact;
#[cfg(feature = "http")]
pub(crate) use exact::{members_are_unique, numbers_are_exact};
pub(crate) use serialize::{plain_or_marked, to_value, to_vec, Checked, Floats};
