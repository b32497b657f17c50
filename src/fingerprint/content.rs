//! Content digests of files and directories, with a stat cache.
//!
//! A file's digest is the BLAKE3 of its bytes. A directory's digest is a
//! Merkle digest over its entries sorted by relative path, each entry being
//! (path, kind, digest): so listing order, mtimes, owners and the absolute
//! location never matter, while renaming, adding, removing or changing the
//! executable bit of any file does.
//!
//! Paths are hashed as the bytes the file system holds (any Unix file
//! name, UTF-8 or not), never through a lossy conversion. A symbolic link
//! inside a directory is read as what it points to, as a path given as an
//! input is: its target's content is hashed (a directory's as a tree), so
//! where a link sits never decides whether an edit behind it is seen. A
//! link that points nowhere is hashed by its text; one that leads back to
//! a directory it lies in is an error naming it.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::{File, Metadata};
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::digest::Digest;
use crate::file_stat::{FileStat, OpenDir, Stated, ctime_ns, mtime_ns, stat_in_dir};
use crate::side_by_side::{in_shares, shares_for};

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
    /// The byte that stands for the kind in a tree's digest and listing.
    pub fn tag(self) -> u8 {
        match self {
            EntryKind::File => b'f',
            EntryKind::Executable => b'x',
            EntryKind::Symlink => b'l',
            EntryKind::Dir => b'd',
        }
    }

    /// The kind `tag` stands for ([`Self::tag`]).
    pub fn from_tag(tag: u8) -> Option<Self> {
        [Self::File, Self::Executable, Self::Symlink, Self::Dir]
            .into_iter()
            .find(|kind| kind.tag() == tag)
    }
}

/// One entry of a directory tree; `digest` is the file's content digest,
/// the digest of the link's text for a link that points nowhere, and all
/// zeroes for a directory. `path` is relative, as the file system's bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeEntry {
    pub path: PathBuf,
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
    entries.sort_by(|a, b| path_bytes(&a.path).cmp(path_bytes(&b.path)));
    let mut hasher = blake3::Hasher::new();
    hasher.update(b"cairn.tree\0");
    hasher.update(&1u32.to_le_bytes());
    for entry in entries.iter() {
        let path = path_bytes(&entry.path);
        hasher.update(&(path.len() as u64).to_le_bytes());
        hasher.update(path);
        hasher.update(&[entry.kind.tag()]);
        hasher.update(entry.digest.as_bytes());
    }
    Digest::from_hash(hasher.finalize())
}

/// The bytes of `path`, as the file system holds them.
pub fn path_bytes(path: &Path) -> &[u8] {
    path.as_os_str().as_bytes()
}

/// A remembered file digest, valid while the file's identity and times hold
/// and the file was not "racy" when it was remembered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatEntry {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub digest: Digest,
    /// A moment at which the file was known to be as described: when it
    /// was stat'ed to be hashed, and once the entry is saved, when it was
    /// saved (as git trusts an index entry older than the index file).
    pub seen_ns: i64,
}

impl StatEntry {
    /// An entry for the file `meta` describes, stat'ed at `seen_ns`.
    pub fn new(meta: &Metadata, digest: Digest, seen_ns: i64) -> Self {
        Self::of(&FileStat::from(meta), digest, seen_ns)
    }

    /// An entry for the file `stat` describes, stat'ed at `seen_ns`.
    pub fn of(stat: &FileStat, digest: Digest, seen_ns: i64) -> Self {
        StatEntry {
            dev: stat.dev,
            ino: stat.ino,
            size: stat.size,
            mtime_ns: stat.mtime_ns,
            ctime_ns: stat.ctime_ns,
            digest,
            seen_ns,
        }
    }

    /// The entry for a file hashed from `before` on, as `after` describes
    /// it once hashed, if nothing wrote it in between: its identity, size
    /// and mtime held (its ctime may move: storing it can link it).
    pub fn if_unchanged(
        before: &Metadata,
        after: &Metadata,
        digest: Digest,
        seen_ns: i64,
    ) -> Option<Self> {
        unchanged(before, after).then(|| Self::new(after, digest, seen_ns))
    }

    pub fn matches(&self, meta: &Metadata) -> bool {
        self.matches_stat(&FileStat::from(meta))
    }

    pub fn matches_stat(&self, stat: &FileStat) -> bool {
        self.dev == stat.dev
            && self.ino == stat.ino
            && self.size == stat.size
            && self.mtime_ns == stat.mtime_ns
            && self.ctime_ns == stat.ctime_ns
    }

    /// Whether a later write could have kept the file's times: the file
    /// was last written within one timestamp tick of `seen_ns`, so a second
    /// write in the same tick would leave size, mtime and ctime unchanged.
    pub fn racy(&self) -> bool {
        written_within_a_tick(self.mtime_ns, self.ctime_ns, self.seen_ns)
    }
}

/// Whether something last written at `mtime_ns`/`ctime_ns` was written
/// within one timestamp tick of `seen_ns` (or after it).
fn written_within_a_tick(mtime_ns: i64, ctime_ns: i64, seen_ns: i64) -> bool {
    mtime_ns
        .max(ctime_ns)
        .saturating_add(timestamp_tick(mtime_ns))
        >= seen_ns
}

/// The longest a file system's clock can lag behind the system's: Linux
/// stamps files from a clock that ticks every 1–10 ms (one jiffy), and a
/// file system that keeps whole seconds (its nanoseconds are all zero) may
/// round by up to two.
fn timestamp_tick(mtime_ns: i64) -> i64 {
    if mtime_ns % 1_000_000_000 == 0 {
        2_000_000_000
    } else {
        20_000_000
    }
}

/// Whether nothing wrote the file `before` described by the time `after`
/// describes it: its identity, size and mtime held (its ctime may move:
/// storing it can link it).
pub fn unchanged(before: &Metadata, after: &Metadata) -> bool {
    before.dev() == after.dev()
        && before.ino() == after.ino()
        && before.size() == after.size()
        && mtime_ns(before) == mtime_ns(after)
}

/// Now, in nanoseconds since the epoch, on the clock files are stamped by.
pub fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// A path's digest as the stat cache vouches for it (see
/// [`StatCache::vouch`]).
#[derive(Debug)]
pub struct Vouched {
    pub digest: Digest,
    pub files: Vec<(PathBuf, StatEntry)>,
    pub dirs: Vec<(PathBuf, DirStat)>,
}

/// A directory as `stat` saw it at `seen_ns`: a change to its entries
/// changes its mtime and ctime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirStat {
    pub dev: u64,
    pub ino: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub seen_ns: i64,
}

impl DirStat {
    pub fn new(meta: &Metadata, seen_ns: i64) -> Self {
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
            mtime_ns: mtime_ns(meta),
            ctime_ns: ctime_ns(meta),
            seen_ns,
        }
    }

    /// Whether `meta` is this directory, unchanged.
    pub fn matches(&self, meta: &Metadata) -> bool {
        meta.is_dir()
            && self.dev == meta.dev()
            && self.ino == meta.ino()
            && self.mtime_ns == mtime_ns(meta)
            && self.ctime_ns == ctime_ns(meta)
    }

    /// Whether an entry added in the same timestamp tick as `seen_ns`
    /// could have left its times as they are (see [`StatEntry::racy`]).
    pub fn racy(&self) -> bool {
        written_within_a_tick(self.mtime_ns, self.ctime_ns, self.seen_ns)
    }
}

/// The `stat` of each of `paths`, in order, taken by a few threads side by
/// side when there are many: thousands of `stat`s are most of the time it
/// takes to plan a large per-item stage, and they scale with cores. Each
/// path is `stat`ed by its name in its directory, opened once for the paths
/// in a row that lie in it (see [`stat_in_dir`]): walking every path from
/// `/` was half the time of each `stat`.
pub fn stat_side_by_side(paths: &[PathBuf]) -> Vec<io::Result<FileStat>> {
    /// Fewer than this are not worth a thread.
    const SHARE: usize = 2048;
    let shares = shares_for(paths.len(), SHARE);
    in_shares(paths, shares, "cairn-stat", |_, paths| {
        let mut dir = OpenDir::default();
        paths
            .iter()
            .map(|path| stat_in_dir(path, &mut dir))
            .collect::<Vec<_>>()
    })
    .into_iter()
    .flatten()
    .collect()
}

/// A map keyed by paths, hashed with foldhash: a run looks up thousands of
/// paths, and SipHash was a measurable part of each lookup.
pub type PathMap<V> = HashMap<PathBuf, V, foldhash::fast::RandomState>;

/// Digests of files by absolute path; an optimisation only. An entry is
/// trusted while the file's identity, size and times are as recorded and
/// the file was not racy when the entry was last seen (see
/// [`StatEntry::racy`]): a file hashed right after it was written is
/// trusted once the entry is saved a tick later, as git does with its
/// index. A racy entry is hashed again, and trusted from then on.
#[derive(Debug, Default)]
pub struct StatCache {
    /// One slot a path: a lookup hashes the path once.
    /// Keyed by the path's bytes: hashed and compared as bytes, not
    /// component by component (the paths are made the same way each time).
    slots: HashMap<OsString, Slot, foldhash::fast::RandomState>,
    /// `stat`s taken moments ago, for [`Self::content_with_stated`].
    stated: Stated,
}

/// What the cache knows of one path.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    /// As loaded, or as last saved by this process.
    saved: Option<StatEntry>,
    /// Learned since, to be saved.
    updated: Option<StatEntry>,
    /// Looked up since loading: what pruning keeps.
    touched: bool,
}

impl Slot {
    fn newest(&self) -> Option<StatEntry> {
        self.updated.or(self.saved)
    }

    /// An entry to save, unless it is the one saved.
    fn learn(&mut self, entry: StatEntry) {
        self.updated = (self.saved != Some(entry)).then_some(entry);
    }
}

impl StatCache {
    pub fn from_entries(entries: impl IntoIterator<Item = (PathBuf, StatEntry)>) -> Self {
        let slots = entries.into_iter().map(|(path, entry)| {
            let slot = Slot {
                saved: Some(entry),
                ..Slot::default()
            };
            (path.into_os_string(), slot)
        });
        Self {
            slots: slots.collect(),
            stated: Stated::default(),
        }
    }

    /// Takes `stated` for [`Self::content_with_stated`]: `stat`s this
    /// process took while it has held the workspace since.
    pub fn use_stated(&mut self, stated: Stated) {
        self.stated = stated;
    }

    fn lookup(&mut self, path: &Path, stat: &FileStat) -> Option<Digest> {
        let Some(slot) = self.slots.get_mut(path.as_os_str()) else {
            let slot = Slot {
                touched: true,
                ..Slot::default()
            };
            self.slots.insert(path.as_os_str().to_owned(), slot);
            return None;
        };
        slot.touched = true;
        slot.newest()
            .filter(|entry| entry.matches_stat(stat) && !entry.racy())
            .map(|entry| entry.digest)
    }

    /// Remembers `digest` for the file at `path` as `stat` describes it,
    /// stat'ed at `seen_ns` (before its bytes were read).
    fn record(&mut self, path: &Path, stat: &FileStat, digest: Digest, seen_ns: i64) {
        let entry = StatEntry::of(stat, digest, seen_ns);
        match self.slots.get_mut(path.as_os_str()) {
            Some(slot) => slot.learn(entry),
            None => self.learn(path.to_owned(), entry),
        }
    }

    /// Remembers an entry made elsewhere (by the store, hashing an output
    /// as it copies it in).
    pub fn learn(&mut self, path: PathBuf, entry: StatEntry) {
        self.stated.take(&path);
        self.slots
            .entry(path.into_os_string())
            .or_default()
            .learn(entry);
    }

    /// Entries added or changed since loading, for persisting at
    /// `saved_ns`: from then on each is seen as of that moment.
    pub fn take_updates(&mut self, saved_ns: i64) -> Vec<(PathBuf, StatEntry)> {
        let mut updates = Vec::new();
        for (path, slot) in &mut self.slots {
            if let Some(entry) = slot.updated.take() {
                let entry = StatEntry {
                    seen_ns: saved_ns.max(entry.seen_ns),
                    ..entry
                };
                slot.saved = Some(entry);
                updates.push((PathBuf::from(path), entry));
            }
        }
        updates
    }

    /// The entries of the files under `dirs`, for a task that looks at
    /// them away from this cache; [`Self::absorb`] takes back what it
    /// learned and looked at.
    pub fn subset_under(&self, dirs: &[&Path]) -> StatCache {
        let under = self
            .slots
            .iter()
            .filter(|(path, _)| dirs.iter().any(|dir| Path::new(path).starts_with(dir)))
            .filter_map(|(path, slot)| Some((PathBuf::from(path), slot.newest()?)));
        StatCache::from_entries(under)
    }

    /// The entries of `paths` (files) and of the files under them
    /// (directories, or any path without an entry of its own): what a
    /// task needs to look at them again away from this cache.
    pub fn subset_of(&self, paths: &[&Path]) -> StatCache {
        let mut entries = Vec::with_capacity(paths.len());
        let mut dirs = std::collections::HashSet::new();
        for path in paths {
            match self.entry(path) {
                Some(entry) => entries.push((path.to_path_buf(), entry)),
                None => {
                    dirs.insert(*path);
                }
            }
        }
        if !dirs.is_empty() {
            for (path, slot) in &self.slots {
                let path = Path::new(path);
                if let Some(entry) = slot.newest()
                    && path.ancestors().skip(1).any(|dir| dirs.contains(dir))
                {
                    entries.push((path.to_owned(), entry));
                }
            }
        }
        StatCache::from_entries(entries)
    }

    /// Takes back what a [`Self::subset_under`] learned and looked at.
    pub fn absorb(&mut self, subset: StatCache) {
        for (path, theirs) in subset.slots {
            // (What the task learned anew it looked at after the run began.)
            if theirs.updated.is_some() {
                self.stated.take(Path::new(&path));
            }
            let ours = self.slots.entry(path).or_default();
            if let Some(entry) = theirs.updated {
                ours.learn(entry);
            }
            ours.touched |= theirs.touched;
        }
    }

    /// Loaded entries of paths this process has neither looked up nor
    /// recorded: what a command that looked at every path it depends on
    /// can forget.
    pub fn untouched(&self) -> Vec<PathBuf> {
        self.slots
            .iter()
            .filter(|(_, slot)| slot.saved.is_some() && !slot.touched && slot.updated.is_none())
            .map(|(path, _)| PathBuf::from(path))
            .collect()
    }

    /// The entry `path`'s digest rests on (as last hashed, or found
    /// unchanged), without looking at the file.
    pub fn entry(&self, path: &Path) -> Option<StatEntry> {
        self.slots.get(path.as_os_str()).and_then(Slot::newest)
    }

    /// The digest of `path` as this cache can vouch for it without reading
    /// a byte, with what that rests on: the entry of every file (matching
    /// the file as it is now, racy or not) and the stat of every directory
    /// listed (taken before it was read). `None` if some file has no such
    /// entry, the tree holds a symbolic link, or the path cannot be read.
    pub fn vouch(&self, path: &Path) -> Option<Vouched> {
        let seen_ns = now_ns();
        let meta = std::fs::metadata(path).ok()?;
        let entry_of = |abs: &Path, meta: &Metadata| {
            self.slots
                .get(abs.as_os_str())
                .and_then(Slot::newest)
                .filter(|entry| entry.matches(meta))
        };
        if !meta.is_dir() {
            let entry = entry_of(path, &meta)?;
            return Some(Vouched {
                digest: entry.digest,
                files: vec![(path.to_owned(), entry)],
                dirs: Vec::new(),
            });
        }
        let mut listed = Vec::new();
        list_tree(path, path, &mut listed).ok()?;
        let mut vouched = Vouched {
            digest: Digest::of(b""),
            files: Vec::new(),
            dirs: vec![(path.to_owned(), DirStat::new(&meta, seen_ns))],
        };
        let mut entries = Vec::with_capacity(listed.len());
        for item in listed {
            let (kind, digest, size) = if item.through_link {
                return None;
            } else if item.meta.is_dir() {
                vouched
                    .dirs
                    .push((item.abs.clone(), DirStat::new(&item.meta, seen_ns)));
                (
                    EntryKind::Dir,
                    Digest::from_hash(blake3::Hash::from_bytes([0; 32])),
                    0,
                )
            } else {
                let entry = entry_of(&item.abs, &item.meta)?;
                vouched.files.push((item.abs.clone(), entry));
                let kind = if is_executable(&item.meta) {
                    EntryKind::Executable
                } else {
                    EntryKind::File
                };
                (kind, entry.digest, item.meta.size())
            };
            entries.push(TreeEntry {
                path: item.rel,
                kind,
                digest,
                size,
            });
        }
        vouched.digest = tree_digest(&mut entries);
        Some(vouched)
    }

    /// The digest of `path` (a file, or a directory tree), from the cache
    /// where the file is unchanged. Anything else (a FIFO, socket or device,
    /// itself or inside the tree) is an error naming it, found before any
    /// `open`, so that nothing blocks on a FIFO or reads `/dev/zero` forever.
    pub fn content(&mut self, path: &Path) -> io::Result<Content> {
        let seen_ns = now_ns();
        let meta = std::fs::metadata(path)?;
        self.content_as_stated(path, &FileStat::from(&meta), seen_ns)
    }

    /// [`Self::content`], from the `stat` of `path` taken earlier in this
    /// run if there is one (see [`Stated`]), and `path` is not a symbolic
    /// link (which could lead to a path the run writes). For paths no stage
    /// of the run writes before it looks: a stage's sources, a stage's
    /// outputs as it is decided.
    pub fn content_with_stated(&mut self, path: &Path) -> io::Result<Content> {
        match self.take_stated(path) {
            Some((stat, seen_ns)) => self.content_as_stated(path, &stat, seen_ns),
            None => self.content(path),
        }
    }

    /// The `stat` of `path` taken earlier in this run, with when it was
    /// taken, if there is one and `path` is not a symbolic link (see
    /// [`Self::content_with_stated`]): once.
    pub fn take_stated(&mut self, path: &Path) -> Option<(FileStat, i64)> {
        let found = self.stated.take(path).filter(|found| !found.link)?;
        Some((found.stat, found.seen_ns))
    }

    /// [`Self::content`] of a path `stat`ed already (`stat`, taken after
    /// `seen_ns`): see [`stat_side_by_side`].
    pub fn content_as_stated(
        &mut self,
        path: &Path,
        stat: &FileStat,
        seen_ns: i64,
    ) -> io::Result<Content> {
        if stat.is_dir() {
            self.dir_content(path)
        } else {
            stat.refuse_special(path)?;
            let digest = self.file_digest(path, stat, seen_ns)?;
            Ok(Content::File {
                digest,
                size: stat.size,
                executable: stat.mode & 0o111 != 0,
            })
        }
    }

    fn file_digest(&mut self, path: &Path, stat: &FileStat, seen_ns: i64) -> io::Result<Digest> {
        if let Some(digest) = self.lookup(path, stat) {
            return Ok(digest);
        }
        let digest = hash_file(path, stat.size, true)?;
        tracing::trace!(path = %path.display(), "hashed");
        self.record(path, stat, digest, seen_ns);
        Ok(digest)
    }

    fn dir_content(&mut self, root: &Path) -> io::Result<Content> {
        let seen_ns = now_ns();
        let mut listed = Vec::new();
        list_tree(root, root, &mut listed)?;
        // Files the cache cannot vouch for are hashed in parallel.
        let misses: Vec<usize> = listed
            .iter()
            .enumerate()
            .filter(|(_, l)| l.kind_is_file() && self.lookup(&l.abs, &(&l.meta).into()).is_none())
            .map(|(i, _)| i)
            .collect();
        let hashed: Vec<io::Result<Digest>> = misses
            .par_iter()
            .map(|&i| hash_file(&listed[i].abs, listed[i].meta.size(), false))
            .collect();
        let mut fresh: HashMap<usize, Digest> = HashMap::with_capacity(misses.len());
        for (i, result) in misses.into_iter().zip(hashed) {
            let digest = result?;
            tracing::trace!(path = %listed[i].abs.display(), "hashed");
            self.record(&listed[i].abs, &(&listed[i].meta).into(), digest, seen_ns);
            fresh.insert(i, digest);
        }
        let mut entries = Vec::with_capacity(listed.len());
        for (i, item) in listed.into_iter().enumerate() {
            let (kind, digest, size) = if item.meta.file_type().is_symlink() {
                // (Points nowhere: its text is all there is.)
                let target = std::fs::read_link(&item.abs)?;
                let target = path_bytes(&target);
                (EntryKind::Symlink, Digest::of(target), target.len() as u64)
            } else if item.meta.is_dir() {
                (
                    EntryKind::Dir,
                    Digest::from_hash(blake3::Hash::from_bytes([0; 32])),
                    0,
                )
            } else {
                let digest = match fresh.get(&i) {
                    Some(d) => *d,
                    None => self
                        .lookup(&item.abs, &(&item.meta).into())
                        .ok_or_else(|| {
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
    rel: PathBuf,
    /// What the entry is, links followed: a link's only where it points
    /// nowhere.
    meta: Metadata,
    /// Whether a symbolic link leads to it (itself or a directory above).
    through_link: bool,
}

impl Listed {
    fn kind_is_file(&self) -> bool {
        self.meta.file_type().is_file()
    }
}

/// Lists the tree under `dir` into `out`, links followed (see the module
/// doc).
fn list_tree(root: &Path, dir: &Path, out: &mut Vec<Listed>) -> io::Result<()> {
    let meta = std::fs::metadata(dir)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
    let mut above = vec![(meta.dev(), meta.ino())];
    list_dir(root, dir, false, &mut above, out)
}

/// [`list_tree`] of `dir`, inside the directories `above` (by device and
/// inode, `dir`'s own last).
fn list_dir(
    root: &Path,
    dir: &Path,
    through_link: bool,
    above: &mut Vec<(u64, u64)>,
    out: &mut Vec<Listed>,
) -> io::Result<()> {
    let read = std::fs::read_dir(dir)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
    for entry in read {
        let entry = entry?;
        let abs = entry.path();
        let named = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", abs.display()));
        let own = std::fs::symlink_metadata(&abs).map_err(named)?;
        let is_link = own.file_type().is_symlink();
        let meta = match is_link {
            false => own,
            true => match std::fs::metadata(&abs) {
                Ok(target) => target,
                Err(e) if e.kind() == io::ErrorKind::NotFound => own,
                Err(e) => return Err(named(e)),
            },
        };
        if !meta.file_type().is_symlink() && !meta.is_dir() {
            refuse_special(&abs, &meta)?;
        }
        let rel = abs
            .strip_prefix(root)
            .map_err(|_| io::Error::other("path outside tree"))?
            .to_owned();
        let is_dir = meta.is_dir();
        let here = (meta.dev(), meta.ino());
        if is_dir && above.contains(&here) {
            return Err(io::Error::other(format!(
                "{}: a symbolic link leads back to a directory it lies in",
                abs.display()
            )));
        }
        out.push(Listed {
            abs: abs.clone(),
            rel,
            meta,
            through_link: through_link || is_link,
        });
        if is_dir {
            above.push(here);
            list_dir(root, &abs, through_link || is_link, above, out)?;
            above.pop();
        }
    }
    Ok(())
}

/// An error naming `path` unless `meta` describes a regular file.
pub fn refuse_special(path: &Path, meta: &Metadata) -> io::Result<()> {
    FileStat::from(meta).refuse_special(path)
}

/// Opens `path` for reading only if it is a regular file: the open does not
/// block (`O_NONBLOCK`, so a FIFO swapped in after a type check cannot hang
/// it) and the type of what was opened is checked before any read.
pub fn open_regular(path: &Path) -> io::Result<File> {
    open_regular_sized(path).map(|(file, _)| file)
}

/// [`open_regular`], with the file's size when it was opened.
fn open_regular_sized(path: &Path) -> io::Result<(File, u64)> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    refuse_special(path, &meta)?;
    Ok((file, meta.len()))
}

/// The bytes of `path`, only if it is a regular file (see [`open_regular`]).
pub fn read_regular(path: &Path) -> io::Result<Vec<u8>> {
    let (file, size) = open_regular_sized(path)?;
    read_sized(file, size)
}

/// `file` read to its end, into room made for `size` bytes (and the byte
/// that finds the end). A `File`'s own `read_to_end` would ask the kernel
/// for its size and position again.
fn read_sized(file: File, size: u64) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0).saturating_add(1));
    file.take(u64::MAX).read_to_end(&mut bytes)?;
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
        hasher.update(&read_sized(file, size)?);
    }
    Ok(Digest::from_hash(hasher.finalize()))
}

pub fn is_executable(meta: &Metadata) -> bool {
    meta.permissions().mode() & 0o111 != 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::file_stat::Found;

    const MS: i64 = 1_000_000;

    /// A `stat` handed on stands in once for the one a look would make:
    /// the cache answers from it (here, for a file rewritten since, with
    /// what it held then), and the next look `stat`s the file. One of a
    /// symbolic link is not taken.
    #[test]
    fn a_stat_handed_on_stands_in_once_and_never_for_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.txt");
        std::fs::write(&path, "before").unwrap();
        let old = FileStat::from(&std::fs::metadata(&path).unwrap());
        let settled = old.mtime_ns.max(old.ctime_ns) + 60_000 * MS;
        let before = Digest::of(b"before");
        let mut cache =
            StatCache::from_entries([(path.clone(), StatEntry::of(&old, before, settled))]);
        std::fs::write(&path, "after, longer").unwrap();
        let found = |link| Found {
            stat: old,
            seen_ns: settled,
            link,
        };
        let mut stated = Stated::default();
        stated.insert(path.clone(), found(false));
        cache.use_stated(stated);
        let digest = |content: Content| content.digest();
        assert_eq!(digest(cache.content_with_stated(&path).unwrap()), before);
        let after = Digest::of(b"after, longer");
        assert_eq!(digest(cache.content_with_stated(&path).unwrap()), after);
        let mut stated = Stated::default();
        stated.insert(path.clone(), found(true));
        cache.use_stated(stated);
        assert_eq!(digest(cache.content_with_stated(&path).unwrap()), after);
    }

    #[test]
    fn paths_stated_side_by_side_come_back_in_order_with_their_errors_in_place() {
        let dir = tempfile::tempdir().unwrap();
        // Enough for several threads; every fifth path is missing.
        let paths: Vec<PathBuf> = (0..10_000)
            .map(|n| {
                let path = dir.path().join(format!("{n}"));
                if n % 5 != 0 {
                    std::fs::write(&path, vec![b'x'; n % 97]).unwrap();
                }
                path
            })
            .collect();
        let stats = stat_side_by_side(&paths);
        assert_eq!(stats.len(), paths.len());
        for (n, stat) in stats.iter().enumerate() {
            match stat {
                Ok(stat) => {
                    assert_eq!((n % 5 != 0, stat.size), (true, (n % 97) as u64));
                    let meta = std::fs::metadata(&paths[n]).unwrap();
                    assert_eq!(*stat, FileStat::from(&meta));
                }
                Err(e) => assert_eq!((n % 5, e.kind()), (0, io::ErrorKind::NotFound)),
            }
        }
    }

    fn entry(mtime_ns: i64, seen_ns: i64) -> StatEntry {
        StatEntry {
            dev: 1,
            ino: 1,
            size: 1,
            mtime_ns,
            ctime_ns: mtime_ns,
            digest: Digest::of(b"x"),
            seen_ns,
        }
    }

    #[test]
    fn an_entry_seen_within_a_tick_of_its_write_is_racy() {
        let written = 1_700_000_000_123 * MS;
        assert!(entry(written, written).racy());
        assert!(entry(written, written + 19 * MS).racy());
        assert!(!entry(written, written + 21 * MS).racy());
        // Seen before the stamp (a clock set back, a stamp from the future).
        assert!(entry(written, written - 1000 * MS).racy());
        // A file system keeping whole seconds rounds by up to two.
        let whole = 1_700_000_000_000 * MS;
        assert!(entry(whole, whole + 1500 * MS).racy());
        assert!(!entry(whole, whole + 2100 * MS).racy());
    }

    #[test]
    fn a_file_hashed_right_after_its_write_is_trusted_once_saved_later() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, "one").unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        let mut cache = StatCache::default();
        let digest = cache.content(&path).unwrap().digest();
        // Hashed at once: not trusted yet, in this process.
        assert_eq!(cache.lookup(&path, &FileStat::from(&meta)), None);
        // Saved a tick later (as a run's end does): trusted from then on.
        let updates = cache.take_updates(mtime_ns(&meta) + 50 * MS);
        assert_eq!(updates.len(), 1);
        assert_eq!(cache.lookup(&path, &FileStat::from(&meta)), Some(digest));
        let mut reloaded = StatCache::from_entries(updates);
        assert_eq!(reloaded.lookup(&path, &FileStat::from(&meta)), Some(digest));
    }
}
