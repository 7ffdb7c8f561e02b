// The guide lives in the Markdown files beside this one, one per chapter,
// so that GitHub shows them too; every Rust example in them is a doctest.
#![doc = include_str!("index.md")]

#[doc = include_str!("payments_app.md")]
pub mod payments_app {}

#[doc = include_str!("calls.md")]
pub mod calls {}

#[doc = include_str!("options.md")]
pub mod options {}

#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
#[doc = include_str!("modes.md")]
pub mod modes {}

#[doc = include_str!("steps.md")]
pub mod steps {}

#[cfg(all(feature = "axum", feature = "sqlite"))]
#[cfg_attr(docsrs, doc(cfg(all(feature = "axum", feature = "sqlite"))))]
#[doc = include_str!("http.md")]
pub mod http {}

#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
#[doc = include_str!("consumers.md")]
pub mod consumers {}

#[cfg(all(feature = "kafka", feature = "sqlite"))]
#[cfg_attr(docsrs, doc(cfg(all(feature = "kafka", feature = "sqlite"))))]
#[doc = include_str!("kafka.md")]
pub mod kafka {}

#[doc = include_str!("stores.md")]
pub mod stores {}

#[doc = include_str!("operating.md")]
pub mod operating {}
