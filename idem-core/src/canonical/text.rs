//! A `serde_json::Value` to its canonical text: see [the canonical
//! text](super#the-canonical-text).

use std::io::Write;

use serde_json::Value;

use crate::error::Error;

/// What precedes the canonical text of a value holding a mark (see
/// [values JSON has no form for](super#values-json-has-no-form-for)): no
/// JSON text starts with NUL.
const MARKED: &[u8] = b"\0marked\0";

/// Writes the canonical text of `value` to `out` (a buffer, or a hasher),
/// preceded by the marked form's prefix when `marked`, as
/// [`to_value`](super::to_value) says of the value it built. A value read
/// from a JSON text holds no mark.
pub fn write_text<W: Write>(value: &Value, marked: bool, out: &mut W) -> Result<(), Error> {
    if marked {
        put(out, MARKED)?;
    }
    write_canonical(value, out)
}

fn write_canonical<W: Write>(value: &Value, out: &mut W) -> Result<(), Error> {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            put(out, b"{")?;
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    put(out, b",")?;
                }
                serde_json::to_writer(&mut *out, k)?;
                put(out, b":")?;
                write_canonical(v, out)?;
            }
            put(out, b"}")?;
        }
        Value::Array(items) => {
            put(out, b"[")?;
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    put(out, b",")?;
                }
                write_canonical(v, out)?;
            }
            put(out, b"]")?;
        }
        scalar => serde_json::to_writer(&mut *out, scalar)?,
    }
    Ok(())
}

fn put<W: Write>(out: &mut W, bytes: &[u8]) -> Result<(), Error> {
    Ok(out.write_all(bytes).map_err(serde_json::Error::io)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn text(value: &Value, marked: bool) -> Vec<u8> {
        let mut out = Vec::new();
        write_text(value, marked, &mut out).unwrap();
        out
    }

    #[test]
    fn members_sorted_by_their_bytes_without_whitespace() {
        let value = json!({"é": 1, "z": [{"b": null, "a": 1.5}], "Z": "\u{1}\"", "": true});
        assert_eq!(
            text(&value, false),
            r#"{"":true,"Z":"\u0001\"","z":[{"a":1.5,"b":null}],"é":1}"#.as_bytes()
        );
        assert_eq!(text(&json!([3, 1, 2]), false), b"[3,1,2]");
    }

    #[test]
    fn a_marked_value_is_preceded_by_the_prefix() {
        let value = json!(["\0NaN"]);
        assert_eq!(text(&value, true), b"\0marked\0[\"\\u0000NaN\"]");
        assert_eq!(text(&value, false), b"[\"\\u0000NaN\"]");
    }
}
