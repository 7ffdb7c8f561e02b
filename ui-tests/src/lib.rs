//! Nothing: this package holds the trybuild cases of `idem`'s attribute
//! and derive in `tests/`, with only the dependencies those cases use.
