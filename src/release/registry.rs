//! A registry: a directory of verified freezes, `NAME/VERSION/`, and an
//! `index.json` that records each one's digests.
//!
//! A bundle is imported only after [`verify_bundle`] passed; it is unpacked
//! into a hidden directory inside the registry, every file re-hashed
//! against what was verified, then renamed into place, and only then is the
//! index replaced (temporary file, fsync, rename). A refusal leaves the
//! registry as it was. Importing is serialised by a lock on `.lock`.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::verify::{Limits, Verified, verify_bundle};
use super::{HashingReader, HashingWriter, ReleaseError, write_atomic};

pub const INDEX_FILE: &str = "index.json";
pub const REGISTRY_FORMAT: &str = "cairn.registry/1";

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Index {
    format: String,
    /// name → version → entry.
    datasets: BTreeMap<String, BTreeMap<String, IndexEntry>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct IndexEntry {
    sha256: String,
    semantic_digest: String,
    total: usize,
    counts: BTreeMap<String, usize>,
}

/// What registering did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Registered {
    Imported,
    /// The same digest was already there: nothing was written.
    AlreadyPresent,
}

#[derive(Debug, Serialize)]
pub struct Registration {
    pub name: String,
    pub version: String,
    pub sha256: String,
    pub semantic_digest: String,
    pub total: usize,
    /// Where the freeze now is.
    pub path: PathBuf,
    pub outcome: Registered,
}

/// Verifies `bundle` against `expected` (SHA-256 hex), then imports it into
/// the registry at `into`.
pub fn register(
    bundle: &Path,
    expected: &str,
    into: &Path,
    limits: &Limits,
) -> Result<Registration, ReleaseError> {
    let verified = verify_bundle(bundle, Some(expected), limits)?;
    let name = verified.manifest.name.clone();
    let version = verified.manifest.version.clone();
    let destination = into.join(&name).join(&version);
    let registration = |outcome| Registration {
        name: name.clone(),
        version: version.clone(),
        sha256: verified.sha256.clone(),
        semantic_digest: verified.manifest.semantic_digest.clone(),
        total: verified.manifest.total,
        path: destination.clone(),
        outcome,
    };
    // Refuse what can be refused before touching the registry at all.
    if let Some(existing) = conflict(into, &verified)? {
        return Ok(registration(existing));
    }
    std::fs::create_dir_all(into).map_err(|e| ReleaseError::io(into, e))?;
    let _lock = RegistryLock::acquire(into)?;
    // Again under the lock: another import may have won the race.
    if let Some(existing) = conflict(into, &verified)? {
        return Ok(registration(existing));
    }

    let staging = into.join(format!(".incoming-{}", std::process::id()));
    if staging.exists() {
        std::fs::remove_dir_all(&staging).map_err(|e| ReleaseError::io(&staging, e))?;
    }
    let unpacked = unpack(bundle, &verified, &staging);
    let placed = unpacked.and_then(|()| {
        let parent = into.join(&name);
        std::fs::create_dir_all(&parent).map_err(|e| ReleaseError::io(&parent, e))?;
        let from = staging.join(&verified.root);
        std::fs::rename(&from, &destination).map_err(|e| ReleaseError::io(&destination, e))?;
        File::open(&parent)
            .and_then(|dir| dir.sync_all())
            .map_err(|e| ReleaseError::io(&parent, e))
    });
    let _ = std::fs::remove_dir_all(&staging);
    placed?;

    let mut index = read_index(into)?.unwrap_or_else(|| Index {
        format: REGISTRY_FORMAT.to_owned(),
        datasets: BTreeMap::new(),
    });
    index
        .datasets
        .entry(name.clone())
        .or_default()
        .insert(version.clone(), entry_of(&verified));
    let mut text = serde_json::to_vec_pretty(&index).expect("indexes serialise");
    text.push(b'\n');
    write_atomic(&into.join(INDEX_FILE), &text)?;
    Ok(registration(Registered::Imported))
}

/// What a registry lacks of a registered version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lack {
    /// Its index does not list the version (or there is no index).
    Unlisted,
    /// Its index lists the version with another archive digest.
    OtherDigest,
    /// Its index lists the version, but its directory is gone.
    FilesGone,
    /// Its index cannot be read; why.
    Unreadable(String),
}

/// What the registry at `into` lacks of `name` `version` registered with
/// archive digest `sha256`; `None` if its index lists it so and its
/// directory is there.
pub fn lacks(into: &Path, name: &str, version: &str, sha256: &str) -> Option<Lack> {
    let listed = match read_index(into) {
        Ok(index) => index
            .as_ref()
            .and_then(|index| index.datasets.get(name))
            .and_then(|versions| versions.get(version))
            .map(|entry| entry.sha256 == sha256),
        Err(error) => return Some(Lack::Unreadable(error.to_string())),
    };
    match listed {
        None => Some(Lack::Unlisted),
        Some(false) => Some(Lack::OtherDigest),
        // The test `register` makes before it imports (the files inside
        // are `cairn audit`'s and `cairn verify`'s to check).
        Some(true) if !into.join(name).join(version).is_dir() => Some(Lack::FilesGone),
        Some(true) => None,
    }
}

fn entry_of(verified: &Verified) -> IndexEntry {
    IndexEntry {
        sha256: verified.sha256.clone(),
        semantic_digest: verified.manifest.semantic_digest.clone(),
        total: verified.manifest.total,
        counts: verified.manifest.counts.clone(),
    }
}

/// `Some(AlreadyPresent)` if this exact bundle is registered; an error if
/// its name and version are taken by another; `None` if it may be imported.
fn conflict(into: &Path, verified: &Verified) -> Result<Option<Registered>, ReleaseError> {
    let name = &verified.manifest.name;
    let version = &verified.manifest.version;
    let destination = into.join(name).join(version);
    let index = read_index(into)?;
    let listed = index
        .as_ref()
        .and_then(|i| i.datasets.get(name))
        .and_then(|versions| versions.get(version));
    match listed {
        Some(entry) if entry.sha256 == verified.sha256 && destination.is_dir() => {
            Ok(Some(Registered::AlreadyPresent))
        }
        // Listed, its files gone: imported again from this very bundle
        // (verified against the digest the index names).
        Some(entry) if entry.sha256 == verified.sha256 && !destination.exists() => Ok(None),
        Some(entry) if entry.sha256 == verified.sha256 => {
            Err(ReleaseError::Refused(vec![format!(
                "the registry lists {name} {version}, but `{}` is not a directory; the registry is damaged",
                destination.display()
            )]))
        }
        Some(entry) => Err(ReleaseError::Refused(vec![format!(
            "{name} {version} is already registered with sha256 {}; this bundle is {}. A version is registered once: export under a new version",
            entry.sha256, verified.sha256
        )])),
        None if destination.exists() => Err(ReleaseError::Refused(vec![format!(
            "`{}` exists but the registry index does not list it; remove it or repair `{}`",
            destination.display(),
            into.join(INDEX_FILE).display()
        )])),
        None => Ok(None),
    }
}

fn read_index(into: &Path) -> Result<Option<Index>, ReleaseError> {
    let path = into.join(INDEX_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => {
            let index: Index = serde_json::from_slice(&bytes).map_err(|e| {
                ReleaseError::Refused(vec![format!(
                    "the registry index `{}` is damaged: {e}",
                    path.display()
                )])
            })?;
            if index.format != REGISTRY_FORMAT {
                return Err(ReleaseError::Refused(vec![format!(
                    "the registry index `{}` has format `{}`; this cairn writes `{REGISTRY_FORMAT}`",
                    path.display(),
                    index.format
                )]));
            }
            Ok(Some(index))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ReleaseError::io(&path, e)),
    }
}

/// Unpacks the verified bundle into `staging`, re-hashing the archive and
/// every file: a bundle that changed since it was verified is refused.
fn unpack(bundle: &Path, verified: &Verified, staging: &Path) -> Result<(), ReleaseError> {
    let changed = || {
        ReleaseError::Refused(vec![format!(
            "`{}` changed while it was being registered",
            bundle.display()
        )])
    };
    let root = staging.join(&verified.root);
    std::fs::create_dir_all(&root).map_err(|e| ReleaseError::io(&root, e))?;
    let file = File::open(bundle).map_err(|e| ReleaseError::io(bundle, e))?;
    let decoder = zstd::stream::read::Decoder::new(HashingReader::new(file))
        .map_err(|e| ReleaseError::io(bundle, e))?;
    let mut archive = tar::Archive::new(decoder);
    let mut seen = 0usize;
    for entry in archive.entries().map_err(|_| changed())? {
        let mut entry = entry.map_err(|_| changed())?;
        let name = String::from_utf8(entry.path_bytes().into_owned()).map_err(|_| changed())?;
        let relative = name
            .trim_end_matches('/')
            .strip_prefix(&verified.root)
            .map(|rest| rest.trim_start_matches('/'))
            .ok_or_else(changed)?;
        if relative.is_empty() {
            continue;
        }
        let target = root.join(relative);
        match entry.header().entry_type() {
            tar::EntryType::Directory if verified.dirs.contains(relative) => {
                std::fs::create_dir_all(&target).map_err(|e| ReleaseError::io(&target, e))?;
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let Some((hex, size, executable)) = verified.files.get(relative) else {
                    return Err(changed());
                };
                if let Some(parent) = target.parent() {
                    std::fs::create_dir_all(parent).map_err(|e| ReleaseError::io(parent, e))?;
                }
                let io = |e| ReleaseError::io(&target, e);
                let out = File::create(&target).map_err(io)?;
                let mut writer = HashingWriter::new(BufWriter::new(out));
                std::io::copy(&mut entry, &mut writer).map_err(io)?;
                let (buffered, actual, bytes) = writer.finish();
                let out = buffered.into_inner().map_err(|e| io(e.into_error()))?;
                if actual != *hex || bytes != *size {
                    return Err(changed());
                }
                use std::os::unix::fs::PermissionsExt as _;
                let mode = if *executable { 0o755 } else { 0o644 };
                out.set_permissions(std::fs::Permissions::from_mode(mode))
                    .map_err(io)?;
                out.sync_all().map_err(io)?;
                seen += 1;
            }
            _ => return Err(changed()),
        }
    }
    let mut decoder = archive.into_inner();
    std::io::copy(&mut decoder, &mut std::io::sink()).map_err(|_| changed())?;
    let (_, sha256, _) = decoder.finish().into_inner().finish();
    if sha256 != verified.sha256 || seen != verified.files.len() {
        return Err(changed());
    }
    for dir in std::iter::once(root.clone()).chain(verified.dirs.iter().map(|d| root.join(d))) {
        File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| ReleaseError::io(&dir, e))?;
    }
    Ok(())
}

/// An exclusive lock on a registry, held until dropped.
struct RegistryLock {
    _file: File,
}

impl RegistryLock {
    fn acquire(into: &Path) -> Result<Self, ReleaseError> {
        use std::os::fd::AsRawFd as _;
        let path = into.join(".lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| ReleaseError::io(&path, e))?;
        // SAFETY: flock(2) on a descriptor we own; no memory is involved.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(ReleaseError::io(&path, std::io::Error::last_os_error()));
        }
        Ok(RegistryLock { _file: file })
    }
}
