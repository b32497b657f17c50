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
    let mut out = Vec::with_capacity(128);
    write(value, &mut out);
    // serde_json writes UTF-8 and so does `write`: nothing is replaced.
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// Appends `value` as canonical JSON to `out`: no value or string is
/// allocated on the way (a list of a million items is canonicalised once
/// each as it is read).
pub fn write(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            // serde_json's own map is already in this order; one with
            // `preserve_order` on is not.
            if map.keys().is_sorted_by(|a, b| a.as_bytes() <= b.as_bytes()) {
                write_entries(map.iter(), out);
            } else {
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                entries.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
                write_entries(entries.into_iter(), out);
            }
        }
        Value::Array(items) => {
            out.push(b'[');
            for (n, item) in items.iter().enumerate() {
                if n > 0 {
                    out.push(b',');
                }
                write(item, out);
            }
            out.push(b']');
        }
        Value::String(text) => write_string(text, out),
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(flag) => out.extend_from_slice(if *flag { b"true" } else { b"false" }),
        Value::Number(number) => {
            use std::io::Write;
            // Writing to a vector cannot fail.
            let _ = write!(out, "{number}");
        }
    }
}

/// An object of `entries`, in their order.
fn write_entries<'a>(entries: impl Iterator<Item = (&'a String, &'a Value)>, out: &mut Vec<u8>) {
    out.push(b'{');
    for (n, (key, item)) in entries.enumerate() {
        if n > 0 {
            out.push(b',');
        }
        write_string(key, out);
        out.push(b':');
        write(item, out);
    }
    out.push(b'}');
}

/// A JSON string literal, escaped as serde_json escapes it.
pub fn write_string(text: &str, out: &mut Vec<u8>) {
    // Writing a string to a vector cannot fail.
    let _ = serde_json::to_writer(&mut *out, text);
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
