//! JSON record files: a JSON array, or JSON Lines (one value per line).

use std::io::BufRead;
use std::path::Path;

/// Reads a JSON array or JSONL file; errors name the file and the line.
pub fn read(path: &Path, what: &str) -> Result<Vec<serde_json::Value>, String> {
    let mut values = Vec::new();
    for_each(path, what, |_, value| {
        values.push(value);
        Ok(())
    })?;
    Ok(values)
}

/// Hands each record of a JSON array or JSONL file to `visit` (with its
/// 0-based position) as it is read, so no more than one is held at a time
/// here: a list of a million items is never a million parsed values. An
/// error from `visit` stops the reading and is returned as it is.
pub fn for_each(
    path: &Path,
    what: &str,
    mut visit: impl FnMut(usize, serde_json::Value) -> Result<(), String>,
) -> Result<(), String> {
    let cannot = |e: std::io::Error| format!("cannot read {what} `{}`: {e}", path.display());
    let file = crate::fingerprint::open_regular(path).map_err(cannot)?;
    let mut reader = std::io::BufReader::with_capacity(1 << 16, file);
    // What comes before the first value is kept, so that the lines and
    // offsets errors give count from the top of the file.
    let mut leading = Vec::new();
    if starts_with_bracket(&mut reader, &mut leading).map_err(cannot)? {
        let mut bytes = leading;
        std::io::Read::read_to_end(&mut reader, &mut bytes).map_err(cannot)?;
        std::str::from_utf8(&bytes)
            .map_err(|e| format!("{what} `{}` is not UTF-8: {e}", path.display()))?;
        let mut deserializer = serde_json::Deserializer::from_slice(&bytes);
        let mut failed = None;
        let elements = serde::Deserializer::deserialize_seq(
            &mut deserializer,
            Elements {
                visit: &mut visit,
                failed: &mut failed,
            },
        )
        .and_then(|()| deserializer.end());
        if let Some(message) = failed {
            return Err(message);
        }
        return elements
            .map_err(|e| format!("{what} `{}` is not a JSON array: {e}", path.display()));
    }
    let mut line = Vec::new();
    let mut n = leading.iter().filter(|&&b| b == b'\n').count();
    let mut count = 0;
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line).map_err(cannot)? == 0 {
            return Ok(());
        }
        n += 1;
        let text = std::str::from_utf8(&line)
            .map_err(|e| format!("{what} `{}` line {n} is not UTF-8: {e}", path.display()))?;
        if text.trim().is_empty() {
            continue;
        }
        let value = serde_json::from_str(text)
            .map_err(|e| format!("{what} `{}` line {n}: not JSON: {e}", path.display()))?;
        visit(count, value)?;
        count += 1;
    }
}

/// Whether the first byte that is not white space is `[` (a JSON array);
/// moves the white space before it into `leading`.
fn starts_with_bracket(reader: &mut impl BufRead, leading: &mut Vec<u8>) -> std::io::Result<bool> {
    loop {
        let buffer = reader.fill_buf()?;
        if buffer.is_empty() {
            return Ok(false);
        }
        match buffer.iter().position(|b| !b.is_ascii_whitespace()) {
            Some(at) => {
                let bracket = buffer[at] == b'[';
                leading.extend_from_slice(&buffer[..at]);
                reader.consume(at);
                return Ok(bracket);
            }
            None => {
                let all = buffer.len();
                leading.extend_from_slice(buffer);
                reader.consume(all);
            }
        }
    }
}

/// A JSON array's elements, each handed to `visit` as it is parsed. An
/// error of `visit`'s own is kept in `failed` (and ends the array as a
/// custom serde error), so it reaches the caller unchanged.
struct Elements<'a, F> {
    visit: &'a mut F,
    failed: &'a mut Option<String>,
}

impl<'de, F> serde::de::Visitor<'de> for Elements<'_, F>
where
    F: FnMut(usize, serde_json::Value) -> Result<(), String>,
{
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON array")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut n = 0;
        while let Some(value) = seq.next_element::<serde_json::Value>()? {
            if let Err(message) = (self.visit)(n, value) {
                *self.failed = Some(message);
                return Err(serde::de::Error::custom("stopped"));
            }
            n += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_text(text: &str) -> Result<Vec<serde_json::Value>, String> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("list");
        std::fs::write(&path, text).unwrap();
        read(&path, "list")
    }

    #[test]
    fn reads_arrays_and_lines_alike() {
        let array = read_text("  \n[{\"a\": 1}, {\"a\": 2}]\n").unwrap();
        let lines = read_text("{\"a\": 1}\n\n{\"a\": 2}").unwrap();
        assert_eq!(array, lines);
        assert_eq!(array.len(), 2);
        assert_eq!(read_text("").unwrap(), Vec::<serde_json::Value>::new());
    }

    #[test]
    fn errors_name_the_line_or_the_array() {
        let error = read_text("{\"a\": 1}\n{oops}\n").unwrap_err();
        assert!(error.contains("line 2: not JSON"), "{error}");
        let error = read_text("[{\"a\": 1},]").unwrap_err();
        assert!(error.contains("is not a JSON array"), "{error}");
        let error = read_text("[1] [2]").unwrap_err();
        assert!(error.contains("is not a JSON array"), "{error}");
        let error = read_text("{\"a\": \"\u{ff}\"}\n\u{0}\u{0}").unwrap_err();
        assert!(error.contains("line 2"), "{error}");
    }

    #[test]
    fn lines_count_from_the_top_of_the_file_past_leading_blank_lines() {
        let error = read_text("\n\n{oops}\n").unwrap_err();
        assert!(error.contains("line 3: not JSON"), "{error}");
        let error = read_text("\n\n  [1,\n oops]").unwrap_err();
        assert!(error.contains("line 4"), "{error}");
    }

    #[test]
    fn a_visitor_error_stops_the_reading_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        for text in ["[1, 2, 3]", "1\n2\n3\n"] {
            let path = dir.path().join("list");
            std::fs::write(&path, text).unwrap();
            let mut seen = Vec::new();
            let error = for_each(&path, "list", |n, value| {
                seen.push(value);
                if n == 1 { Err("second".into()) } else { Ok(()) }
            })
            .unwrap_err();
            assert_eq!(error, "second");
            assert_eq!(seen.len(), 2);
        }
    }
}
