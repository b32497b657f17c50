//! The freeze format: what `freeze` writes, `export` packs and `verify`
//! checks.
//!
//! A freeze directory holds `items/ID/…` (one directory per item),
//! `manifest.json` and `SHA256SUMS`:
//!
//! - `SHA256SUMS` lists every other file of the freeze in `sha256sum`
//!   format, sorted by path, so `sha256sum -c SHA256SUMS` checks it.
//! - An item's digest is the SHA-256 of its own `SHA256SUMS`-style listing:
//!   the lines `HEX  PATH\n` of its files, paths relative to the item
//!   directory, sorted by their bytes.
//! - The semantic digest is the SHA-256 of the canonical JSON (sorted keys,
//!   no whitespace) of `{split: [sorted IDs]}`: what the dataset *is*, as
//!   opposed to how its files are laid out.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::fingerprint::hex;

pub const FREEZE_FORMAT: &str = "cairn.freeze/1";
pub const MANIFEST_FILE: &str = "manifest.json";
pub const SUMS_FILE: &str = "SHA256SUMS";
pub const ATTESTATION_FILE: &str = "attestation.intoto.json";
pub const ITEMS_DIR: &str = "items";

/// `manifest.json` of a freeze.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FreezeManifest {
    pub format: String,
    pub name: String,
    pub version: String,
    /// `sha256:HEX`, see the module docs.
    pub semantic_digest: String,
    pub total: usize,
    /// Items per split.
    pub counts: BTreeMap<String, usize>,
    /// Per split, its IDs, sorted.
    pub splits: BTreeMap<String, Vec<String>>,
    pub items: BTreeMap<String, FrozenItem>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FrozenItem {
    pub split: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// `sha256:HEX` of the item's file listing.
    pub digest: String,
    pub files: usize,
    pub bytes: u64,
}

impl FreezeManifest {
    /// The bytes written to `manifest.json`.
    pub fn render(&self) -> String {
        let mut text = serde_json::to_string_pretty(self).expect("manifests serialise");
        text.push('\n');
        text
    }

    /// The name of the directory a bundle of this freeze unpacks to.
    pub fn bundle_root(&self) -> String {
        format!("{}-{}", self.name, self.version)
    }
}

/// Lowercase hex of the SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// The semantic digest of a split assignment (IDs are sorted first).
pub fn semantic_digest(splits: &BTreeMap<String, Vec<String>>) -> String {
    let sorted: BTreeMap<&String, Vec<&String>> = splits
        .iter()
        .map(|(split, ids)| {
            let mut ids: Vec<&String> = ids.iter().collect();
            ids.sort();
            (split, ids)
        })
        .collect();
    let canonical = serde_json::to_string(&sorted).expect("splits serialise");
    format!("sha256:{}", sha256_hex(canonical.as_bytes()))
}

/// The digest of an item from its files' (relative path, SHA-256 hex).
pub fn item_digest<'a>(files: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut files: Vec<(&str, &str)> = files.into_iter().collect();
    files.sort();
    format!("sha256:{}", sha256_hex(render_listing(files).as_bytes()))
}

/// `HEX  PATH\n` lines, in the order given.
pub fn render_listing<'a>(files: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut text = String::new();
    for (path, hex) in files {
        text.push_str(hex);
        text.push_str("  ");
        text.push_str(path);
        text.push('\n');
    }
    text
}

/// Parses `SHA256SUMS`: path → hex. Refuses anything `freeze` would not
/// have written (escaped names, binary mode, duplicates, bad digests).
pub fn parse_sums(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut sums = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let bad = |why: &str| format!("{SUMS_FILE} line {}: {why}", n + 1);
        let (hex, path) = line
            .split_once("  ")
            .ok_or_else(|| bad("expected `HEX  PATH`"))?;
        if hex.len() != 64
            || !hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(bad("not a lowercase SHA-256"));
        }
        if !is_safe_relative(path) {
            return Err(bad(&format!("unsafe path `{path}`")));
        }
        if sums.insert(path.to_owned(), hex.to_owned()).is_some() {
            return Err(bad(&format!("`{path}` listed twice")));
        }
    }
    Ok(sums)
}

/// Whether `id` can name an item directory.
pub fn is_safe_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 255
        && id != "."
        && id != ".."
        && !id
            .chars()
            .any(|c| matches!(c, '/' | '\\' | '\0' | '\n' | '\r'))
}

/// Whether `path` is relative, `/`-separated, without `.`, `..` or empty
/// components, and printable in `SHA256SUMS` without escapes.
pub fn is_safe_relative(path: &str) -> bool {
    !path.is_empty()
        && !path.starts_with('/')
        && path.split('/').all(|part| {
            !part.is_empty()
                && part != "."
                && part != ".."
                && !part.contains(['\\', '\0', '\n', '\r'])
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn semantic_digest_ignores_id_order_but_not_membership() {
        let a = BTreeMap::from([("train".to_owned(), vec!["b".to_owned(), "a".to_owned()])]);
        let b = BTreeMap::from([("train".to_owned(), vec!["a".to_owned(), "b".to_owned()])]);
        let c = BTreeMap::from([("eval".to_owned(), vec!["a".to_owned(), "b".to_owned()])]);
        assert_eq!(semantic_digest(&a), semantic_digest(&b));
        assert_ne!(semantic_digest(&a), semantic_digest(&c));
        // The documented encoding, computed independently.
        assert_eq!(
            semantic_digest(&a),
            format!("sha256:{}", sha256_hex(br#"{"train":["a","b"]}"#))
        );
    }

    #[test]
    fn sums_round_trip_and_refuse_unsafe_paths() {
        let hex = "a".repeat(64);
        let text = render_listing([("items/x/f", hex.as_str()), ("manifest.json", hex.as_str())]);
        let sums = parse_sums(&text).unwrap();
        assert_eq!(sums.len(), 2);
        for bad in ["../x", "/etc/passwd", "a//b", "a/./b"] {
            let line = format!("{hex}  {bad}\n");
            assert!(parse_sums(&line).is_err(), "{bad} accepted");
        }
        assert!(parse_sums(&format!("{hex} *binary\n")).is_err());
    }
}
