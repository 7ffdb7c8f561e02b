//! What the SQL backends share: table names and the embedded migrations'
//! bookkeeping.

use crate::Error;

/// The default name of the records table.
pub(crate) const DEFAULT_TABLE: &str = "idem_records";

/// Checks a table name: 1 to 63 characters of ASCII letters, digits and
/// underscores, not starting with a digit. Names are formatted into SQL
/// (a table name cannot be bound), so nothing else is accepted.
pub(crate) fn validate_table_name(name: &str) -> Result<String, Error> {
    let mut chars = name.chars();
    let valid_start = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    let valid_rest = chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid_start || !valid_rest || name.len() > 63 {
        return Err(Error::Config(format!(
            "invalid table name {name:?}: use 1 to 63 ASCII letters, digits and underscores, \
             not starting with a digit"
        )));
    }
    Ok(name.to_owned())
}

/// Fills the `{table}` placeholders of a statement.
pub(crate) fn render(sql: &str, table: &str) -> String {
    sql.replace("{table}", table)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names() {
        assert!(validate_table_name("idem_records").is_ok());
        assert!(validate_table_name("_t1").is_ok());
        assert!(validate_table_name(&"a".repeat(63)).is_ok());
        for bad in [
            "",
            "1abc",
            "a-b",
            "a b",
            "a;drop",
            "a\"b",
            "é",
            &"a".repeat(64),
        ] {
            assert!(validate_table_name(bad).is_err(), "{bad:?}");
        }
    }
}
