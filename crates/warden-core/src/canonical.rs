//! Canonical JSON: the one byte encoding of a JSON value that hashes and
//! signatures are computed over.
//!
//! Object keys are sorted by their UTF-8 bytes, no whitespace is emitted,
//! strings use serde_json's escaping, numbers their shortest round-trip form.
//! Sorting is done here explicitly rather than relying on `serde_json::Map`
//! ordering, which changes if any crate in the build enables serde_json's
//! `preserve_order` feature.

use serde_json::Value;

/// Append the canonical encoding of `value` to `out`.
pub fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => out.extend_from_slice(n.to_string().as_bytes()),
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push(b'{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(k, out);
                out.push(b':');
                write_canonical(v, out);
            }
            out.push(b'}');
        }
    }
}

/// The canonical encoding of `value`.
pub fn to_canonical(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    write_canonical(value, &mut out);
    out
}

fn write_string(s: &str, out: &mut Vec<u8>) {
    // serde_json's string escaping is deterministic; writing into a Vec
    // cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sorts_keys_and_strips_whitespace() {
        let v = json!({"b": 1, "a": [true, null, "x\"y"], "c": {"z": 1.5, "y": -2}});
        assert_eq!(
            String::from_utf8(to_canonical(&v)).unwrap(),
            r#"{"a":[true,null,"x\"y"],"b":1,"c":{"y":-2,"z":1.5}}"#
        );
    }
}
