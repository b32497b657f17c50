//! Canonical JSON: equal values give equal bytes, by construction.
//!
//! Compact (no whitespace), object keys sorted by their UTF-8 bytes at
//! every depth, arrays in their order, strings and numbers written by
//! serde_json (its escapes; non-ASCII text as is). Keys are sorted here,
//! explicitly: serde_json's map keeps insertion order when its
//! `preserve_order` feature is on, and any crate in a build can turn that
//! on. Fingerprints (params, items, `foreach` settings, built-in
//! invocations) hash these bytes, so a golden test pins them.
//!
//! Like `records`, this stands apart from the layers: the manifest and the
//! fingerprint both use it.

use serde_json::Value;

/// `value` as canonical JSON text.
pub fn to_string(value: &Value) -> String {
    let mut out = String::new();
    write(value, &mut out);
    out
}

fn write(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push('{');
            for (n, (key, item)) in entries.into_iter().enumerate() {
                if n > 0 {
                    out.push(',');
                }
                write_string(key, out);
                out.push(':');
                write(item, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (n, item) in items.iter().enumerate() {
                if n > 0 {
                    out.push(',');
                }
                write(item, out);
            }
            out.push(']');
        }
        Value::String(text) => write_string(text, out),
        Value::Null => out.push_str("null"),
        Value::Bool(flag) => out.push_str(if *flag { "true" } else { "false" }),
        Value::Number(number) => out.push_str(&number.to_string()),
    }
}

/// A JSON string literal, escaped as serde_json escapes it.
fn write_string(text: &str, out: &mut String) {
    out.push_str(&Value::from(text).to_string());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pins the bytes. If this fails, every fingerprint built on canonical
    /// JSON changed: bump `KEY_SCHEMA_VERSION` deliberately.
    #[test]
    fn golden_canonical_bytes() {
        let value = serde_json::json!({
            "zeta": [3, 1.5, -2, true, null],
            "Alpha": {"y": "é\"\\\n\u{1}", "x": {"b": [], "a": {}}},
            "alpha": "",
            "ä": 1,
            "a b": 10000000000u64,
        });
        let text = to_string(&value);
        assert_eq!(
            text,
            r#"{"Alpha":{"x":{"a":{},"b":[]},"y":"é\"\\\n\u0001"},"a b":10000000000,"alpha":"","zeta":[3,1.5,-2,true,null],"ä":1}"#
        );
        assert_eq!(
            blake3::hash(text.as_bytes()).to_hex().as_str(),
            "8954d3c67399a75567d6637f420800b0ab04f8da74653b24281af28490d8a357"
        );
    }

    /// Keys are sorted at every depth whatever order they were inserted in.
    #[test]
    fn insertion_order_never_shows() {
        let mut forward = serde_json::Map::new();
        let mut backward = serde_json::Map::new();
        for key in ["c", "a", "b"] {
            forward.insert(key.to_owned(), serde_json::json!({"z": 1, "y": [key]}));
        }
        for key in ["b", "a", "c"] {
            backward.insert(key.to_owned(), serde_json::json!({"y": [key], "z": 1}));
        }
        let (forward, backward) = (Value::Object(forward), Value::Object(backward));
        assert_eq!(to_string(&forward), to_string(&backward));
        assert!(to_string(&forward).starts_with(r#"{"a":{"y":["a"],"z":1},"b""#));
    }
}
