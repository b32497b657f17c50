//! Verifying a bundle without writing anything: its archive digest, every
//! entry's safety, every file against `SHA256SUMS`, and the freeze's own
//! arithmetic (split IDs, counts, item digests, semantic digest), and the
//! attestation's subjects.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read as _;
use std::path::{Path, PathBuf};

use super::format::{
    ATTESTATION_FILE, FREEZE_FORMAT, FreezeManifest, ITEMS_DIR, MANIFEST_FILE, SUMS_FILE,
    is_safe_relative, item_digest, parse_sums, semantic_digest,
};
use super::{HashingReader, ReleaseError, sha256_file};
use crate::manifest::catalog::is_safe_name;

/// Size limits on what a bundle may unpack to.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_file: u64,
    pub max_total: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_file: 64 << 30,
            max_total: 1 << 40,
        }
    }
}

/// A bundle that passed every check.
#[derive(Debug)]
pub struct Verified {
    /// SHA-256 hex of the archive.
    pub sha256: String,
    /// The directory everything sits under: `NAME-VERSION`.
    pub root: String,
    pub manifest: FreezeManifest,
    /// Path under the root → (SHA-256 hex, size, executable).
    pub files: BTreeMap<String, (String, u64, bool)>,
    /// Directories under the root.
    pub dirs: BTreeSet<String>,
    pub bytes: u64,
    /// How many items the attestation's lineage traces (`uses =
    /// "lineage"`), if it carries one.
    pub lineage: Option<usize>,
}

/// A SHA-256 as 64 lowercase hex digits, from `text` (an optional
/// `sha256:` prefix and surrounding space are allowed).
pub fn parse_sha256(text: &str) -> Option<String> {
    let hex = text
        .trim()
        .trim_start_matches("sha256:")
        .to_ascii_lowercase();
    (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())).then_some(hex)
}

/// The SHA-256 a `sha256sum`-format file (`HEX  NAME`) pins.
pub fn read_sha256_file(path: &Path) -> Result<String, ReleaseError> {
    let text = std::fs::read_to_string(path).map_err(|e| ReleaseError::io(path, e))?;
    text.split_whitespace()
        .next()
        .and_then(parse_sha256)
        .ok_or_else(|| {
            ReleaseError::Invalid(format!(
                "`{}` does not start with a SHA-256",
                path.display()
            ))
        })
}

/// The digest a bundle must have: `given` (from `--sha256`), else the
/// `BUNDLE.sha256` file beside it, if there is one. Returns the digest and
/// where it came from.
pub fn expected_digest(
    bundle: &Path,
    given: Option<&str>,
) -> Result<Option<(String, String)>, ReleaseError> {
    if let Some(given) = given {
        let hex = parse_sha256(given).ok_or_else(|| {
            ReleaseError::Invalid(format!("`{given}` is not a SHA-256 (64 hex digits)"))
        })?;
        return Ok(Some((hex, "--sha256".to_owned())));
    }
    let mut sidecar = bundle.as_os_str().to_owned();
    sidecar.push(".sha256");
    let sidecar = PathBuf::from(sidecar);
    if !sidecar.exists() {
        return Ok(None);
    }
    let hex = read_sha256_file(&sidecar)?;
    Ok(Some((hex, format!("`{}`", sidecar.display()))))
}

/// Checks `bundle`; `expected` is the archive's SHA-256 hex, if pinned.
pub fn verify_bundle(
    bundle: &Path,
    expected: Option<&str>,
    limits: &Limits,
) -> Result<Verified, ReleaseError> {
    let (sha256, _) = sha256_file(bundle)?;
    if let Some(expected) = expected
        && expected != sha256
    {
        return Err(ReleaseError::Refused(vec![format!(
            "archive digest mismatch: expected sha256 {expected}, the bundle is {sha256}"
        )]));
    }
    let scan = scan(bundle, limits)?;
    if scan.broken {
        return Err(ReleaseError::Refused(scan.problems));
    }
    let mut problems = scan.problems;
    let manifest = check_contents(&scan.root, &scan.files, &scan.texts, &mut problems);
    match manifest {
        Some(manifest) if problems.is_empty() => Ok(Verified {
            sha256,
            root: scan.root.unwrap_or_default(),
            lineage: scan
                .texts
                .get(ATTESTATION_FILE)
                .and_then(|bytes| lineage_of(bytes))
                .map(|items| items.len()),
            manifest,
            bytes: scan.files.values().map(|(_, size, _)| size).sum(),
            files: scan.files,
            dirs: scan.dirs,
        }),
        _ => Err(ReleaseError::Refused(problems)),
    }
}

/// What one pass over the archive found.
struct Scan {
    root: Option<String>,
    files: BTreeMap<String, (String, u64, bool)>,
    dirs: BTreeSet<String>,
    /// The bytes of the small files at the root (`manifest.json`, …).
    texts: BTreeMap<String, Vec<u8>>,
    problems: Vec<String>,
    /// The archive could not be read to its end: its contents are not
    /// worth checking further.
    broken: bool,
}

/// The largest root file kept in memory to be parsed.
const TEXT_MAX: u64 = 512 << 20;

fn scan(bundle: &Path, limits: &Limits) -> Result<Scan, ReleaseError> {
    let file = std::fs::File::open(bundle).map_err(|e| ReleaseError::io(bundle, e))?;
    let mut found = Scan {
        root: None,
        files: BTreeMap::new(),
        dirs: BTreeSet::new(),
        texts: BTreeMap::new(),
        problems: Vec::new(),
        broken: false,
    };
    let corrupt = |e: std::io::Error| format!("the archive is truncated or corrupt: {e}");
    let decoder = match zstd::stream::read::Decoder::new(file) {
        Ok(decoder) => decoder,
        Err(e) => {
            found.problems.push(corrupt(e));
            found.broken = true;
            return Ok(found);
        }
    };
    let mut archive = tar::Archive::new(decoder);
    let entries = match archive.entries() {
        Ok(entries) => entries,
        Err(e) => {
            found.problems.push(corrupt(e));
            found.broken = true;
            return Ok(found);
        }
    };
    let mut total = 0u64;
    for entry in entries {
        let mut entry = match entry {
            Ok(entry) => entry,
            Err(e) => {
                found.problems.push(corrupt(e));
                found.broken = true;
                return Ok(found);
            }
        };
        let raw = entry.path_bytes().into_owned();
        let Ok(name) = String::from_utf8(raw) else {
            found
                .problems
                .push("an entry's path is not UTF-8".to_owned());
            continue;
        };
        let Some(relative) = located(&name, &mut found) else {
            continue;
        };
        let kind = entry.header().entry_type();
        let size = entry.header().size().unwrap_or(u64::MAX);
        match kind {
            tar::EntryType::Directory => {
                if let Some(relative) = relative {
                    found.dirs.insert(relative);
                }
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let Some(relative) = relative else {
                    found.problems.push(format!(
                        "entry `{name}` is a file where the bundle's directory should be"
                    ));
                    continue;
                };
                if size > limits.max_file {
                    found.problems.push(format!(
                        "entry `{name}` is {size} bytes, over the limit of {} bytes per file",
                        limits.max_file
                    ));
                    continue;
                }
                total = total.saturating_add(size);
                if total > limits.max_total {
                    found.problems.push(format!(
                        "the bundle unpacks to more than the limit of {} bytes",
                        limits.max_total
                    ));
                    return Ok(found);
                }
                let executable = entry.header().mode().unwrap_or(0) & 0o111 != 0;
                let keep = !relative.contains('/') && size <= TEXT_MAX;
                let mut reader = HashingReader::new(&mut entry);
                let mut text = Vec::new();
                let read = if keep {
                    reader.read_to_end(&mut text).map(|n| n as u64)
                } else {
                    std::io::copy(&mut reader, &mut std::io::sink())
                };
                let (_, hex, _) = reader.finish();
                if let Err(e) = read {
                    found.problems.push(corrupt(e));
                    found.broken = true;
                    return Ok(found);
                }
                if keep {
                    found.texts.insert(relative.clone(), text);
                }
                if found
                    .files
                    .insert(relative, (hex, size, executable))
                    .is_some()
                {
                    found.problems.push(format!("entry `{name}` appears twice"));
                }
            }
            tar::EntryType::Symlink | tar::EntryType::Link => {
                let target = entry
                    .link_name_bytes()
                    .map(|t| String::from_utf8_lossy(&t).into_owned())
                    .unwrap_or_default();
                let what = if kind == tar::EntryType::Symlink {
                    "a symbolic link"
                } else {
                    "a hard link"
                };
                let leaves = target.starts_with('/') || escapes(&name, &target);
                found.problems.push(if leaves {
                    format!("entry `{name}` is {what} to `{target}`, which leaves the bundle")
                } else {
                    format!("entry `{name}` is {what} to `{target}`; bundles hold only regular files and directories")
                });
            }
            tar::EntryType::Char | tar::EntryType::Block | tar::EntryType::Fifo => {
                found
                    .problems
                    .push(format!("entry `{name}` is a device or FIFO; bundles hold only regular files and directories"));
            }
            other => {
                found.problems.push(format!(
                    "entry `{name}` has an unsupported type ({other:?})"
                ));
            }
        }
    }
    // Read to the end of the compressed stream: a truncated or damaged
    // frame (and its checksum) shows only there.
    let mut decoder = archive.into_inner();
    if let Err(e) = std::io::copy(&mut decoder, &mut std::io::sink()) {
        found.problems.push(corrupt(e));
        found.broken = true;
    }
    Ok(found)
}

/// Checks an entry's path: relative, no `..`, under the one root. Returns
/// its path below the root (`None` for the root itself), or records a
/// problem and returns `None` from the outer option.
fn located(name: &str, found: &mut Scan) -> Option<Option<String>> {
    let trimmed = name.trim_end_matches('/');
    if name.starts_with('/') {
        found
            .problems
            .push(format!("entry `{name}` has an absolute path"));
        return None;
    }
    if trimmed.split('/').any(|part| part == "..") {
        found.problems.push(format!(
            "entry `{name}` has a `..` component, which escapes the bundle"
        ));
        return None;
    }
    if !is_safe_relative(trimmed) {
        found
            .problems
            .push(format!("entry `{name}` has an unsafe path"));
        return None;
    }
    let (top, rest) = match trimmed.split_once('/') {
        Some((top, rest)) => (top, Some(rest.to_owned())),
        None => (trimmed, None),
    };
    match &found.root {
        None => found.root = Some(top.to_owned()),
        Some(root) if root != top => {
            found.problems.push(format!(
                "entry `{name}` is outside the bundle's directory `{root}/`"
            ));
            return None;
        }
        Some(_) => {}
    }
    Some(rest)
}

/// Whether a link at `name` pointing to `target` resolves outside the
/// bundle's directory.
fn escapes(name: &str, target: &str) -> bool {
    // Depth of the link's directory below the bundle root (the root itself
    // is depth 0 for an entry directly inside it).
    let mut depth = name.trim_end_matches('/').split('/').count() as i64 - 2;
    for part in target.split('/') {
        match part {
            "" | "." => {}
            ".." => depth -= 1,
            _ => depth += 1,
        }
        if depth < 0 {
            return true;
        }
    }
    false
}

/// The freeze's checks over what the archive holds.
fn check_contents(
    root: &Option<String>,
    files: &BTreeMap<String, (String, u64, bool)>,
    texts: &BTreeMap<String, Vec<u8>>,
    problems: &mut Vec<String>,
) -> Option<FreezeManifest> {
    let Some(root) = root else {
        problems.push("the archive is empty".to_owned());
        return None;
    };
    let (Some(manifest_bytes), Some(sums_bytes)) = (texts.get(MANIFEST_FILE), texts.get(SUMS_FILE))
    else {
        problems.push(format!(
            "the bundle has no `{root}/{MANIFEST_FILE}` or no `{root}/{SUMS_FILE}`: it is not a cairn freeze"
        ));
        return None;
    };
    let sums = match std::str::from_utf8(sums_bytes)
        .map_err(|e| e.to_string())
        .and_then(parse_sums)
    {
        Ok(sums) => sums,
        Err(e) => {
            problems.push(format!("{SUMS_FILE} is malformed: {e}"));
            return None;
        }
    };
    for (path, expected) in &sums {
        match files.get(path) {
            None => problems.push(format!(
                "file `{path}` is listed in {SUMS_FILE} but missing from the bundle"
            )),
            Some((actual, _, _)) if actual != expected => problems.push(format!(
                "file `{path}` does not match {SUMS_FILE}: expected sha256 {expected}, found {actual}"
            )),
            Some(_) => {}
        }
    }
    for path in files.keys() {
        if !sums.contains_key(path) && path != SUMS_FILE && path != ATTESTATION_FILE {
            problems.push(format!("extra file `{path}`: not listed in {SUMS_FILE}"));
        }
    }

    let manifest: FreezeManifest = match serde_json::from_slice(manifest_bytes) {
        Ok(manifest) => manifest,
        Err(e) => {
            problems.push(format!("{MANIFEST_FILE} is not a freeze manifest: {e}"));
            return None;
        }
    };
    if manifest.format != FREEZE_FORMAT {
        problems.push(format!(
            "{MANIFEST_FILE} has format `{}`; this cairn reads `{FREEZE_FORMAT}`",
            manifest.format
        ));
    }
    if !is_safe_name(&manifest.name) || !is_safe_name(&manifest.version) {
        problems.push(format!(
            "name `{}` or version `{}` is not a safe name",
            manifest.name, manifest.version
        ));
    } else if *root != manifest.bundle_root() {
        problems.push(format!(
            "the bundle's directory is `{root}/`, but the freeze is `{}`",
            manifest.bundle_root()
        ));
    }
    check_splits(&manifest, problems);
    check_items(&manifest, files, problems);
    if let Some(bytes) = texts.get(ATTESTATION_FILE) {
        check_attestation(bytes, &sums, problems);
        let strangers: Vec<String> = lineage_of(bytes)
            .map(|items| {
                items
                    .keys()
                    .filter(|id| !manifest.items.contains_key(*id))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        if let Some(id) = strangers.first() {
            problems.push(format!(
                "{ATTESTATION_FILE} traces {} item(s) the freeze does not hold, e.g. `{id}`",
                strangers.len()
            ));
        }
    } else {
        problems.push(format!("the bundle carries no `{ATTESTATION_FILE}`"));
    }
    Some(manifest)
}

fn check_splits(manifest: &FreezeManifest, problems: &mut Vec<String>) {
    let recomputed = semantic_digest(&manifest.splits);
    if recomputed != manifest.semantic_digest {
        problems.push(format!(
            "semantic digest mismatch: {MANIFEST_FILE} says {}, its split IDs give {recomputed}",
            manifest.semantic_digest
        ));
    }
    let mut total = 0;
    for (split, ids) in &manifest.splits {
        total += ids.len();
        match manifest.counts.get(split) {
            Some(count) if *count == ids.len() => {}
            Some(count) => problems.push(format!(
                "wrong count: split `{split}` has count {count}, but lists {} IDs",
                ids.len()
            )),
            None => problems.push(format!("split `{split}` has no count")),
        }
    }
    for split in manifest.counts.keys() {
        if !manifest.splits.contains_key(split) {
            problems.push(format!(
                "wrong count: `{split}` is counted but is not a split"
            ));
        }
    }
    if total != manifest.total {
        problems.push(format!(
            "wrong count: total is {}, but the splits list {total} IDs",
            manifest.total
        ));
    }
    let mut seen: BTreeMap<&str, &str> = BTreeMap::new();
    for (split, ids) in &manifest.splits {
        for id in ids {
            if let Some(other) = seen.insert(id, split) {
                problems.push(format!("ID `{id}` is in splits `{other}` and `{split}`"));
            }
            match manifest.items.get(id) {
                None => problems.push(format!(
                    "split `{split}` lists `{id}`, which is not an item of the freeze"
                )),
                Some(item) if item.split != *split => problems.push(format!(
                    "split `{split}` lists `{id}`, whose item says split `{}`",
                    item.split
                )),
                Some(_) => {}
            }
        }
    }
    for id in manifest.items.keys() {
        if !seen.contains_key(id.as_str()) {
            problems.push(format!("item `{id}` is in no split"));
        }
    }
}

fn check_items(
    manifest: &FreezeManifest,
    files: &BTreeMap<String, (String, u64, bool)>,
    problems: &mut Vec<String>,
) {
    let mut by_item: BTreeMap<&str, Vec<(&str, &str, u64)>> = BTreeMap::new();
    let prefix = format!("{ITEMS_DIR}/");
    for (path, (hex, size, _)) in files {
        let Some(rest) = path.strip_prefix(&prefix) else {
            continue;
        };
        let Some((id, inner)) = rest.split_once('/') else {
            problems.push(format!("file `{path}` is not inside an item directory"));
            continue;
        };
        by_item.entry(id).or_default().push((inner, hex, *size));
    }
    for (id, item) in &manifest.items {
        let listed = by_item.remove(id.as_str()).unwrap_or_default();
        let digest = item_digest(listed.iter().map(|(path, hex, _)| (*path, *hex)));
        if digest != item.digest {
            problems.push(format!(
                "item `{id}` does not match its digest: {MANIFEST_FILE} says {}, its files give {digest}",
                item.digest
            ));
        }
        let bytes: u64 = listed.iter().map(|(_, _, size)| size).sum();
        if listed.len() != item.files || bytes != item.bytes {
            problems.push(format!(
                "wrong count: item `{id}` should have {} files of {} bytes, has {} files of {bytes} bytes",
                item.files,
                item.bytes,
                listed.len()
            ));
        }
    }
    for id in by_item.keys() {
        problems.push(format!(
            "files under `{ITEMS_DIR}/{id}/` belong to no item of the freeze"
        ));
    }
}

/// The per-item chains an attestation carries (ID → chain), if any.
fn lineage_of(bytes: &[u8]) -> Option<serde_json::Map<String, serde_json::Value>> {
    let statement: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    match &statement["predicate"]["buildDefinition"]["internalParameters"]["lineage"]["items"] {
        serde_json::Value::Object(items) => Some(items.clone()),
        _ => None,
    }
}

fn check_attestation(bytes: &[u8], sums: &BTreeMap<String, String>, problems: &mut Vec<String>) {
    let statement: serde_json::Value = match serde_json::from_slice(bytes) {
        Ok(value) => value,
        Err(e) => {
            problems.push(format!("{ATTESTATION_FILE} is not JSON: {e}"));
            return;
        }
    };
    let mut subjects = BTreeMap::new();
    for subject in statement["subject"].as_array().into_iter().flatten() {
        if let (Some(name), Some(hex)) = (
            subject["name"].as_str(),
            subject["digest"]["sha256"].as_str(),
        ) {
            subjects.insert(name.to_owned(), hex.to_owned());
        }
    }
    if subjects != *sums {
        let differing: Vec<&String> = sums
            .keys()
            .chain(subjects.keys())
            .filter(|k| sums.get(*k) != subjects.get(*k))
            .take(5)
            .collect();
        problems.push(format!(
            "{ATTESTATION_FILE} does not attest these files as they are: {}",
            differing
                .iter()
                .map(|s| format!("`{s}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::escapes;

    #[test]
    fn links_that_climb_out_are_caught() {
        assert!(escapes("root/a", "../../etc/passwd"));
        assert!(escapes("root/a", "../x"));
        assert!(!escapes("root/a/b", "../c"));
        assert!(!escapes("root/a", "b/c"));
    }
}
