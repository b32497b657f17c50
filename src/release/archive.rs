//! Writing a bundle: a reproducible tar + zstd archive of a freeze.
//!
//! The same freeze gives the same bytes on any machine: entries are sorted
//! by path, every header has mtime [`MTIME`], uid and gid 0 and no owner
//! names, modes are 0755 for directories and executables and 0644 for
//! other files, and zstd runs in its multi-threaded mode, whose output does
//! not depend on the number of threads. Everything sits under one directory,
//! `NAME-VERSION/`, next to an in-toto attestation of the freeze's files.

use std::collections::BTreeMap;
use std::io::{BufWriter, Read as _};
use std::path::Path;

use super::format::{
    ATTESTATION_FILE, FreezeManifest, MANIFEST_FILE, SUMS_FILE, parse_sums, sha256_hex,
};
use super::{HashingReader, HashingWriter, ReleaseError, temp_sibling};
use crate::manifest::catalog::is_safe_name;
use crate::store::{PREDICATE_TYPE, STATEMENT_TYPE};

/// The modification time of every entry: 2000-01-01T00:00:00Z (tools warn
/// about entries dated 1970).
pub const MTIME: u64 = 946_684_800;

pub const EXPORT_BUILD_TYPE: &str = "https://cairn.dev/buildtypes/export/v1";

/// What [`write_bundle`] wrote.
#[derive(Debug)]
pub struct BundleWritten {
    /// SHA-256 hex of the archive.
    pub sha256: String,
    pub bytes: u64,
    /// Files packed (the freeze's and the attestation).
    pub files: usize,
    pub manifest: FreezeManifest,
}

enum Entry {
    Dir,
    File { executable: bool, size: u64 },
    Attestation,
}

/// Packs the freeze directory `freeze` into `bundle` (zstd `level`). The
/// freeze's files are checked against its `SHA256SUMS` as they are read;
/// on any error the bundle is not written.
/// `lineage`: each frozen item's chain (what `uses = "lineage"` writes),
/// carried in the attestation.
pub fn write_bundle(
    freeze: &Path,
    bundle: &Path,
    level: i32,
    lineage: Option<&serde_json::Value>,
) -> Result<BundleWritten, ReleaseError> {
    let read = |name: &str| {
        let path = freeze.join(name);
        std::fs::read_to_string(&path).map_err(|e| ReleaseError::io(&path, e))
    };
    let manifest_text = read(MANIFEST_FILE)?;
    let manifest: FreezeManifest = serde_json::from_str(&manifest_text).map_err(|e| {
        ReleaseError::Invalid(format!(
            "`{}` is not a freeze manifest: {e}",
            freeze.join(MANIFEST_FILE).display()
        ))
    })?;
    let sums_text = read(SUMS_FILE)?;
    let sums = parse_sums(&sums_text).map_err(ReleaseError::Invalid)?;
    let root = manifest.bundle_root();
    if !is_safe_name(&manifest.name) || !is_safe_name(&manifest.version) {
        return Err(ReleaseError::Invalid(format!(
            "freeze name `{}` or version `{}` is not a safe name",
            manifest.name, manifest.version
        )));
    }

    let mut entries: BTreeMap<String, Entry> = BTreeMap::new();
    walk(freeze, "", &mut entries)?;
    let mut unlisted: Vec<&str> = entries
        .iter()
        .filter(|(path, e)| matches!(e, Entry::File { .. }) && *path != SUMS_FILE)
        .map(|(path, _)| path.as_str())
        .filter(|path| !sums.contains_key(*path))
        .collect();
    let missing: Vec<&str> = sums
        .keys()
        .map(String::as_str)
        .filter(|path| !matches!(entries.get(*path), Some(Entry::File { .. })))
        .collect();
    if !unlisted.is_empty() || !missing.is_empty() {
        unlisted.truncate(10);
        return Err(ReleaseError::Invalid(format!(
            "the freeze `{}` does not match its {SUMS_FILE}: unlisted files [{}], missing files [{}]",
            freeze.display(),
            unlisted.join(", "),
            missing
                .iter()
                .take(10)
                .copied()
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let attestation = attestation(&manifest, &sums, &sha256_hex(sums_text.as_bytes()), lineage);
    entries.insert(ATTESTATION_FILE.to_owned(), Entry::Attestation);

    let tmp = temp_sibling(bundle);
    let result = pack(freeze, &root, &entries, &sums, &attestation, &tmp, level);
    match result {
        Ok((sha256, bytes)) => {
            std::fs::rename(&tmp, bundle).map_err(|e| ReleaseError::io(bundle, e))?;
            Ok(BundleWritten {
                sha256,
                bytes,
                files: entries
                    .values()
                    .filter(|e| !matches!(e, Entry::Dir))
                    .count(),
                manifest,
            })
        }
        Err(error) => {
            let _ = std::fs::remove_file(&tmp);
            Err(error)
        }
    }
}

fn pack(
    freeze: &Path,
    root: &str,
    entries: &BTreeMap<String, Entry>,
    sums: &BTreeMap<String, String>,
    attestation: &[u8],
    tmp: &Path,
    level: i32,
) -> Result<(String, u64), ReleaseError> {
    let io = |e| ReleaseError::io(tmp, e);
    let file = std::fs::File::create(tmp).map_err(io)?;
    let hashed = HashingWriter::new(BufWriter::with_capacity(1 << 20, file));
    let mut encoder = zstd::stream::write::Encoder::new(hashed, level).map_err(io)?;
    encoder.include_checksum(true).map_err(io)?;
    // Multi-threaded mode even with one thread: its output is the same for
    // any thread count (single-threaded output differs).
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    encoder.multithread(threads.max(1)).map_err(io)?;
    let mut tar = tar::Builder::new(encoder);

    append(
        &mut tar,
        &format!("{root}/"),
        tar::EntryType::Directory,
        0o755,
        &mut std::io::empty(),
    )
    .map_err(io)?;
    for (path, entry) in entries {
        let name = format!("{root}/{path}");
        match entry {
            Entry::Dir => {
                append(
                    &mut tar,
                    &format!("{name}/"),
                    tar::EntryType::Directory,
                    0o755,
                    &mut std::io::empty(),
                )
                .map_err(io)?;
            }
            Entry::Attestation => {
                let mut header = header(tar::EntryType::Regular, attestation.len() as u64, 0o644);
                tar.append_data(&mut header, &name, attestation)
                    .map_err(io)?;
            }
            Entry::File { executable, size } => {
                let source = freeze.join(path);
                let file =
                    std::fs::File::open(&source).map_err(|e| ReleaseError::io(&source, e))?;
                let mut reader = HashingReader::new(file.take(*size));
                let mode = if *executable { 0o755 } else { 0o644 };
                let mut header = header(tar::EntryType::Regular, *size, mode);
                tar.append_data(&mut header, &name, &mut reader)
                    .map_err(|e| ReleaseError::io(&source, e))?;
                let (_, hex, read) = reader.finish();
                let expected = sums.get(path).map(String::as_str).unwrap_or("");
                if read != *size || (path != SUMS_FILE && hex != expected) {
                    return Err(ReleaseError::Invalid(format!(
                        "`{}` changed since it was frozen ({SUMS_FILE} says {expected}, it is now {hex})",
                        source.display()
                    )));
                }
            }
        }
    }
    let encoder = tar.into_inner().map_err(io)?;
    let hashed = encoder.finish().map_err(io)?;
    let (buffered, sha256, bytes) = hashed.finish();
    let file = buffered.into_inner().map_err(|e| io(e.into_error()))?;
    file.sync_all().map_err(io)?;
    Ok((sha256, bytes))
}

fn header(kind: tar::EntryType, size: u64, mode: u32) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_size(size);
    header.set_mode(mode);
    header.set_mtime(MTIME);
    header.set_uid(0);
    header.set_gid(0);
    header
}

fn append<W: std::io::Write>(
    tar: &mut tar::Builder<W>,
    name: &str,
    kind: tar::EntryType,
    mode: u32,
    data: &mut impl std::io::Read,
) -> std::io::Result<()> {
    let mut header = header(kind, 0, mode);
    tar.append_data(&mut header, name, data)
}

/// The regular files under `dir`, recursively, as paths relative to it
/// (`/`-separated, sorted). Anything but regular files and directories is
/// refused.
pub fn files_under(dir: &Path) -> Result<Vec<String>, ReleaseError> {
    let mut entries = BTreeMap::new();
    walk(dir, "", &mut entries)?;
    Ok(entries
        .into_iter()
        .filter(|(_, entry)| matches!(entry, Entry::File { .. }))
        .map(|(path, _)| path)
        .collect())
}

/// Lists `dir` recursively into `entries` (paths relative to the freeze).
/// Anything but regular files and directories is refused.
fn walk(
    dir: &Path,
    prefix: &str,
    entries: &mut BTreeMap<String, Entry>,
) -> Result<(), ReleaseError> {
    let listing = std::fs::read_dir(dir).map_err(|e| ReleaseError::io(dir, e))?;
    for entry in listing {
        let entry = entry.map_err(|e| ReleaseError::io(dir, e))?;
        let path = entry.path();
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            return Err(ReleaseError::Invalid(format!(
                "`{}` is not a UTF-8 name",
                path.display()
            )));
        };
        let relative = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        let meta = std::fs::symlink_metadata(&path).map_err(|e| ReleaseError::io(&path, e))?;
        if meta.is_dir() {
            entries.insert(relative.clone(), Entry::Dir);
            walk(&path, &relative, entries)?;
        } else if meta.is_file() {
            use std::os::unix::fs::PermissionsExt as _;
            entries.insert(
                relative,
                Entry::File {
                    executable: meta.permissions().mode() & 0o111 != 0,
                    size: meta.len(),
                },
            );
        } else {
            return Err(ReleaseError::Invalid(format!(
                "`{}` is not a regular file or directory; a freeze holds nothing else",
                path.display()
            )));
        }
    }
    Ok(())
}

/// The in-toto statement packed with the freeze: its files as subjects,
/// what it is as parameters, each item's lineage (when given) as internal
/// parameters. It carries no time, so it is reproducible.
fn attestation(
    manifest: &FreezeManifest,
    sums: &BTreeMap<String, String>,
    sums_sha256: &str,
    lineage: Option<&serde_json::Value>,
) -> Vec<u8> {
    let subjects: Vec<serde_json::Value> = sums
        .iter()
        .map(|(path, hex)| serde_json::json!({ "name": path, "digest": { "sha256": hex } }))
        .collect();
    let mut statement = serde_json::json!({
        "_type": STATEMENT_TYPE,
        "subject": subjects,
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": EXPORT_BUILD_TYPE,
                "externalParameters": {
                    "name": manifest.name,
                    "version": manifest.version,
                    "semantic_digest": manifest.semantic_digest,
                    "counts": manifest.counts,
                    "total": manifest.total,
                },
                "resolvedDependencies": [
                    { "name": SUMS_FILE, "digest": { "sha256": sums_sha256 } }
                ],
            },
            "runDetails": {
                "builder": { "id": format!("https://cairn.dev/cairn@{}", env!("CARGO_PKG_VERSION")) },
            },
        },
    });
    if let Some(lineage) = lineage {
        statement["predicate"]["buildDefinition"]["internalParameters"] =
            serde_json::json!({ "lineage": lineage });
    }
    let mut bytes = serde_json::to_vec_pretty(&statement).expect("statements serialise");
    bytes.push(b'\n');
    bytes
}
