//! JSON record files: a JSON array, or JSON Lines (one value per line).

use std::path::Path;

/// Reads a JSON array or JSONL file; errors name the file and the line.
pub fn read(path: &Path, what: &str) -> Result<Vec<serde_json::Value>, String> {
    let bytes = crate::fingerprint::read_regular(path)
        .map_err(|e| format!("cannot read {what} `{}`: {e}", path.display()))?;
    let text = String::from_utf8(bytes)
        .map_err(|e| format!("{what} `{}` is not UTF-8: {e}", path.display()))?;
    if text.trim_start().starts_with('[') {
        return serde_json::from_str(&text)
            .map_err(|e| format!("{what} `{}` is not a JSON array: {e}", path.display()));
    }
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(n, line)| {
            serde_json::from_str(line)
                .map_err(|e| format!("{what} `{}` line {}: not JSON: {e}", path.display(), n + 1))
        })
        .collect()
}
