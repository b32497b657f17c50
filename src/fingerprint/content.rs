//! Content digests of files and directories, with a stat cache.
//!
//! A file's digest is the BLAKE3 of its bytes. A directory's digest is a
//! Merkle digest over its entries sorted by relative path, each entry being
//! (path, kind, digest): so listing order, mtimes, owners and the absolute
//! location never matter, while renaming, adding, removing or changing the
//! executable bit of any file does.

use std::collections::HashMap;
use std::fs::{File, Metadata};
use std::io::{self, Read};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::digest::Digest;

/// What sits at a path inside a directory tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EntryKind {
    File,
    Executable,
    Symlink,
    Dir,
}

impl EntryKind {
    fn tag(self) -> u8 {
        match self {
            EntryKind::File => b'f',
            EntryKind::Executable => b'x',
            EntryKind::Symlink => b'l',
            EntryKind::Dir => b'd',
        }
    }
}

/// One entry of a directory tree; `digest` is the file's content digest,
/// the link target's digest for a symlink, and all zeroes for a directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeEntry {
    pub path: String,
    pub kind: EntryKind,
    pub digest: Digest,
    pub size: u64,
}

/// The content of a path: a single file or a directory tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content {
    File {
        digest: Digest,
        size: u64,
        executable: bool,
    },
    Dir {
        digest: Digest,
        entries: Vec<TreeEntry>,
    },
}

impl Content {
    pub fn digest(&self) -> Digest {
        match self {
            Content::File { digest, .. } | Content::Dir { digest, .. } => *digest,
        }
    }
}

/// The Merkle digest of a directory's entries (sorted here, so callers may
/// pass them in any order).
pub fn tree_digest(entries: &mut [TreeEntry]) -> Digest {
    entries.sort_by(|a, b| a.path.as_bytes().cmp(b.path.as_bytes()));
    let mut hasher = blake3::Hasher::new();
    hasher.update(b"cairn.tree\0");
    hasher.update(&1u32.to_le_bytes());
    for entry in entries.iter() {
        hasher.update(&(entry.path.len() as u64).to_le_bytes());
        hasher.update(entry.path.as_bytes());
        hasher.update(&[entry.kind.tag()]);
        hasher.update(entry.digest.as_bytes());
    }
    Digest::from_hash(hasher.finalize())
}

/// A remembered file digest, valid while the file's identity and times hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatEntry {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub digest: Digest,
}

impl StatEntry {
    fn matches(&self, meta: &Metadata) -> bool {
        self.dev == meta.dev()
            && self.ino == meta.ino()
            && self.size == meta.size()
            && self.mtime_ns == mtime_ns(meta)
            && self.ctime_ns == ctime_ns(meta)
    }
}

/// Digests of files by absolute path; an optimisation only. Entries for
/// files modified in the last moments are not kept ("racy" files: a second
/// write inside the file system's timestamp granularity could go unseen).
#[derive(Debug, Default)]
pub struct StatCache {
    entries: HashMap<PathBuf, StatEntry>,
    updated: HashMap<PathBuf, StatEntry>,
}

const RACY_WINDOW: Duration = Duration::from_millis(100);

impl StatCache {
    pub fn from_entries(entries: impl IntoIterator<Item = (PathBuf, StatEntry)>) -> Self {
        Self {
            entries: entries.into_iter().collect(),
            updated: HashMap::new(),
        }
    }

    fn lookup(&self, path: &Path, meta: &Metadata) -> Option<Digest> {
        self.updated
            .get(path)
            .or_else(|| self.entries.get(path))
            .filter(|entry| entry.matches(meta))
            .map(|entry| entry.digest)
    }

    /// Remembers `digest` for the file at `path` as described by `meta`.
    pub fn record(&mut self, path: &Path, meta: &Metadata, digest: Digest) {
        let modified = UNIX_EPOCH + Duration::from_nanos(mtime_ns(meta).max(0) as u64);
        let settled = SystemTime::now()
            .duration_since(modified)
            .is_ok_and(|age| age > RACY_WINDOW);
        if settled {
            let entry = StatEntry {
                dev: meta.dev(),
                ino: meta.ino(),
                size: meta.size(),
                mtime_ns: mtime_ns(meta),
                ctime_ns: ctime_ns(meta),
                digest,
            };
            if self.entries.get(path) != Some(&entry) {
                self.updated.insert(path.to_owned(), entry);
            }
        }
    }

    /// Entries added or changed since loading, for persisting.
    pub fn take_updates(&mut self) -> Vec<(PathBuf, StatEntry)> {
        let updates: Vec<_> = self.updated.drain().collect();
        for (path, entry) in &updates {
            self.entries.insert(path.clone(), *entry);
        }
        updates
    }

    /// The digest of `path` (a file, or a directory tree), from the cache
    /// where the file is unchanged. Anything else (a FIFO, socket or device,
    /// itself or inside the tree) is an error naming it, found before any
    /// `open`, so that nothing blocks on a FIFO or reads `/dev/zero` forever.
    pub fn content(&mut self, path: &Path) -> io::Result<Content> {
        let meta = std::fs::metadata(path)?;
        if meta.is_dir() {
            self.dir_content(path)
        } else {
            refuse_special(path, &meta)?;
            let digest = self.file_digest(path, &meta)?;
            Ok(Content::File {
                digest,
                size: meta.size(),
                executable: is_executable(&meta),
            })
        }
    }

    fn file_digest(&mut self, path: &Path, meta: &Metadata) -> io::Result<Digest> {
        if let Some(digest) = self.lookup(path, meta) {
            return Ok(digest);
        }
        let digest = hash_file(path, meta.size(), true)?;
        self.record(path, meta, digest);
        Ok(digest)
    }

    fn dir_content(&mut self, root: &Path) -> io::Result<Content> {
        let mut listed = Vec::new();
        list_tree(root, root, &mut listed)?;
        // Files the cache cannot vouch for are hashed in parallel.
        let misses: Vec<usize> = listed
            .iter()
            .enumerate()
            .filter(|(_, l)| l.kind_is_file() && self.lookup(&l.abs, &l.meta).is_none())
            .map(|(i, _)| i)
            .collect();
        let hashed: Vec<io::Result<Digest>> = misses
            .par_iter()
            .map(|&i| hash_file(&listed[i].abs, listed[i].meta.size(), false))
            .collect();
        let mut fresh: HashMap<usize, Digest> = HashMap::with_capacity(misses.len());
        for (i, result) in misses.into_iter().zip(hashed) {
            let digest = result?;
            self.record(&listed[i].abs, &listed[i].meta, digest);
            fresh.insert(i, digest);
        }
        let mut entries = Vec::with_capacity(listed.len());
        for (i, item) in listed.into_iter().enumerate() {
            let (kind, digest, size) = if item.meta.file_type().is_symlink() {
                let target = std::fs::read_link(&item.abs)?;
                let target = target.to_string_lossy();
                (
                    EntryKind::Symlink,
                    Digest::of(target.as_bytes()),
                    target.len() as u64,
                )
            } else if item.meta.is_dir() {
                (
                    EntryKind::Dir,
                    Digest::from_hash(blake3::Hash::from_bytes([0; 32])),
                    0,
                )
            } else {
                let digest = match fresh.get(&i) {
                    Some(d) => *d,
                    None => self.lookup(&item.abs, &item.meta).ok_or_else(|| {
                        io::Error::other(format!(
                            "{}: the stat cache lost the digest it vouched for",
                            item.abs.display()
                        ))
                    })?,
                };
                let kind = if is_executable(&item.meta) {
                    EntryKind::Executable
                } else {
                    EntryKind::File
                };
                (kind, digest, item.meta.size())
            };
            entries.push(TreeEntry {
                path: item.rel,
                kind,
                digest,
                size,
            });
        }
        let digest = tree_digest(&mut entries);
        Ok(Content::Dir { digest, entries })
    }
}

struct Listed {
    abs: PathBuf,
    rel: String,
    meta: Metadata,
}

impl Listed {
    fn kind_is_file(&self) -> bool {
        self.meta.file_type().is_file()
    }
}

fn list_tree(root: &Path, dir: &Path, out: &mut Vec<Listed>) -> io::Result<()> {
    let read = std::fs::read_dir(dir)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
    for entry in read {
        let entry = entry?;
        let abs = entry.path();
        let meta = std::fs::symlink_metadata(&abs)?;
        if !meta.file_type().is_symlink() && !meta.is_dir() {
            refuse_special(&abs, &meta)?;
        }
        let rel = abs
            .strip_prefix(root)
            .map_err(|_| io::Error::other("path outside tree"))?
            .to_string_lossy()
            .into_owned();
        let is_dir = meta.is_dir();
        out.push(Listed {
            abs: abs.clone(),
            rel,
            meta,
        });
        if is_dir {
            list_tree(root, &abs, out)?;
        }
    }
    Ok(())
}

/// What a file that is neither a regular file, a directory nor a symlink
/// is, for messages.
pub fn special_kind(file_type: std::fs::FileType) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    if file_type.is_fifo() {
        Some("a FIFO")
    } else if file_type.is_socket() {
        Some("a socket")
    } else if file_type.is_char_device() {
        Some("a character device")
    } else if file_type.is_block_device() {
        Some("a block device")
    } else {
        None
    }
}

/// An error naming `path` unless `meta` describes a regular file.
pub fn refuse_special(path: &Path, meta: &Metadata) -> io::Result<()> {
    if meta.is_file() {
        return Ok(());
    }
    let kind = special_kind(meta.file_type()).unwrap_or("not a regular file");
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "`{}` is {kind}, not a regular file or directory",
            path.display()
        ),
    ))
}

/// Opens `path` for reading only if it is a regular file: the open does not
/// block (`O_NONBLOCK`, so a FIFO swapped in after a type check cannot hang
/// it) and the type of what was opened is checked before any read.
pub fn open_regular(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    refuse_special(path, &file.metadata()?)?;
    Ok(file)
}

/// The bytes of `path`, only if it is a regular file (see [`open_regular`]).
pub fn read_regular(path: &Path) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    open_regular(path)?.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// BLAKE3 of a regular file. Large files are memory-mapped; `parallel` also
/// splits one large file across threads (off when files are already hashed
/// in parallel).
pub fn hash_file(path: &Path, size: u64, parallel: bool) -> io::Result<Digest> {
    let mut hasher = blake3::Hasher::new();
    let file = open_regular(path)?;
    if size >= 1 << 20 {
        if parallel && size >= 8 << 20 {
            hasher.update_mmap_rayon(path)?;
        } else {
            hasher.update_mmap(path)?;
        }
    } else {
        let mut file = file;
        let mut buf = Vec::with_capacity(size as usize + 1);
        file.read_to_end(&mut buf)?;
        hasher.update(&buf);
    }
    Ok(Digest::from_hash(hasher.finalize()))
}

pub fn is_executable(meta: &Metadata) -> bool {
    meta.permissions().mode() & 0o111 != 0
}

fn mtime_ns(meta: &Metadata) -> i64 {
    meta.mtime()
        .saturating_mul(1_000_000_000)
        .saturating_add(meta.mtime_nsec())
}

fn ctime_ns(meta: &Metadata) -> i64 {
    meta.ctime()
        .saturating_mul(1_000_000_000)
        .saturating_add(meta.ctime_nsec())
}
