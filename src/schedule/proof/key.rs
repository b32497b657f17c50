//! What a proof is kept under and where it is looked for, before the
//! manifest is parsed.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::record::FORMAT;
use crate::manifest::Manifest;

/// What a proof is kept under: the digest of the manifest's bytes, the path
/// it was given by and the working directory, the profile, and the cairn
/// binary (a rebuilt cairn may decide otherwise). `None` if the binary or
/// the working directory cannot be known.
pub fn key_of(manifest: &Manifest) -> Option<[u8; 32]> {
    key(
        &manifest.path,
        manifest.source.as_bytes(),
        manifest.profile.as_deref(),
    )
}

/// [`key_of`] a manifest not parsed yet: its path, bytes and profile.
pub fn key(manifest: &Path, source: &[u8], profile: Option<&str>) -> Option<[u8; 32]> {
    let exe = std::env::current_exe().ok()?;
    let meta = std::fs::metadata(&exe).ok()?;
    let cwd = std::env::current_dir().ok()?;
    let mut hasher = blake3::Hasher::new();
    hasher.update(FORMAT);
    for part in [
        exe.as_os_str().as_encoded_bytes(),
        cwd.as_os_str().as_encoded_bytes(),
        manifest.as_os_str().as_encoded_bytes(),
        profile.unwrap_or("\u{0}none").as_bytes(),
    ] {
        hasher.update(&(part.len() as u64).to_le_bytes());
        hasher.update(part);
    }
    for number in [meta.dev(), meta.ino(), meta.size()] {
        hasher.update(&number.to_le_bytes());
    }
    hasher.update(&meta.mtime().to_le_bytes());
    hasher.update(&meta.mtime_nsec().to_le_bytes());
    hasher.update(source);
    Some(*hasher.finalize().as_bytes())
}

/// Where the project root of the manifest at `path` is, read from its text
/// without parsing it: `root = "…"` in its `[pipeline]` table, else the
/// manifest's directory. Only a hint: a proof found under it is used only
/// if it was made for the same root.
pub fn root_hint(path: &Path, source: &str) -> Option<PathBuf> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut in_pipeline = false;
    let mut root = None;
    for line in source.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_pipeline = line == "[pipeline]";
            continue;
        }
        if !in_pipeline {
            continue;
        }
        if let Some(rest) = line.strip_prefix("root")
            && let Some(value) = rest.trim_start().strip_prefix('=')
            && let Some(quoted) = value.trim().strip_prefix('"')
            && let Some((text, _)) = quoted.split_once('"')
        {
            if text.contains('\\') {
                return None;
            }
            root = Some(text.to_owned());
        }
    }
    dir.join(root.unwrap_or_default()).canonicalize().ok()
}
