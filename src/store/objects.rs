//! Content-addressed copies of outputs under `cache/objects/`.
//!
//! Every write goes to a temporary file in `cache/tmp/`, is fsynced, then
//! renamed to its digest's name: an object either exists whole or not at
//! all. Directory outputs are stored file by file, plus a tree listing under
//! `cache/trees/<digest>.tree` (see [`super::tree_listing`]). Restores
//! verify every byte against its digest before they replace anything in
//! the workspace.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use super::StoreError;
use super::clearing::remove_path;
use super::layout;
use super::ledger::Ledger;
use super::link::{self, Link};
use super::output_record::{INLINE_MAX, OutputKind, OutputRecord};
use super::tree_listing;
use crate::fingerprint::{
    Content, Digest, EntryKind, StatCache, StatEntry, TreeEntry, now_ns, open_regular,
    read_regular, refuse_special, tree_digest,
};

/// Files of one directory restored at once: restoring is mostly waiting for
/// the disk (fsync), so more than the cores.
const RESTORE_THREADS: usize = 8;

/// Outputs copied and hashed into the store's temporary area, waiting for
/// [`ObjectStore::publish`]. Dropped unpublished, its files are removed.
#[derive(Debug)]
pub struct Staged {
    pub records: Vec<OutputRecord>,
    pending: Vec<(PathBuf, PathBuf)>,
    inline: Vec<(Digest, Vec<u8>)>,
    /// Stat-cache entries of the workspace files staged, hashed as they
    /// were copied: the next run need not read them again.
    seen: Vec<(PathBuf, StatEntry)>,
}

/// Published outputs: their records, and the small objects the ledger must
/// store with the result, and the stat entries of the files hashed.
#[derive(Debug, Default)]
pub struct Published {
    pub records: Vec<OutputRecord>,
    pub inline: Vec<(Digest, Vec<u8>)>,
    pub seen: Vec<(PathBuf, StatEntry)>,
}

/// The metadata of the output at `abs`, with the moment before it was
/// taken (what a stat-cache entry of it is trusted from).
fn look_at(abs: &Path) -> Result<(fs::Metadata, i64), StoreError> {
    let seen_ns = now_ns();
    let meta = fs::metadata(abs).map_err(|e| StoreError::io(abs, e))?;
    Ok((meta, seen_ns))
}

impl Staged {
    /// The stat entries of the workspace files hashed as they were copied.
    pub fn seen(&self) -> &[(PathBuf, StatEntry)] {
        &self.seen
    }

    fn for_outputs(count: usize) -> Self {
        Self {
            records: Vec::with_capacity(count),
            pending: Vec::new(),
            inline: Vec::new(),
            seen: Vec::new(),
        }
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        for (temp, _) in &self.pending {
            let _ = fs::remove_file(temp);
        }
    }
}

#[derive(Debug, Clone)]
pub struct ObjectStore {
    cache: PathBuf,
    /// How stored files and workspace copies share the disk.
    link: Link,
    /// Objects this process wrote and hashed as it wrote them (downloads):
    /// a restore need not read them a second time.
    hashed_here: std::sync::Arc<std::sync::Mutex<std::collections::HashSet<Digest>>>,
}

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

impl ObjectStore {
    pub fn new(cache: &Path) -> Self {
        Self {
            cache: cache.to_owned(),
            link: Link::Copy,
            hashed_here: Default::default(),
        }
    }

    /// Stores and restores files by `link` (see [`super::link`]).
    pub fn with_link(mut self, link: Link) -> Self {
        self.link = link;
        self
    }

    pub fn object_path(&self, digest: &Digest) -> PathBuf {
        let hex = digest.hex();
        layout::objects(&self.cache).join(&hex[..2]).join(&hex[2..])
    }

    /// Where the listing of stored directory `digest` is: the compact
    /// listing cairn writes, or else the JSON one an older cairn wrote, if
    /// that is there.
    pub fn tree_path(&self, digest: &Digest) -> PathBuf {
        let compact = self.compact_tree_path(digest);
        if compact.exists() {
            return compact;
        }
        let older = compact.with_extension("json");
        match older.exists() {
            true => older,
            false => compact,
        }
    }

    /// Where the listing of stored directory `digest` is written (see
    /// [`super::tree_listing`]).
    pub fn compact_tree_path(&self, digest: &Digest) -> PathBuf {
        layout::trees(&self.cache).join(format!("{}.tree", digest.hex()))
    }

    pub fn objects_dir(&self) -> PathBuf {
        layout::objects(&self.cache)
    }

    pub fn trees_dir(&self) -> PathBuf {
        layout::trees(&self.cache)
    }

    pub fn tmp_dir(&self) -> PathBuf {
        layout::staging(&self.cache)
    }

    fn temp_file(&self) -> Result<(PathBuf, File), StoreError> {
        let dir = self.tmp_dir();
        fs::create_dir_all(&dir).map_err(|e| StoreError::io(&dir, e))?;
        let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("{}-{n}", std::process::id()));
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&path)
            .map_err(|e| StoreError::io(&path, e))?;
        Ok((path, file))
    }

    /// Moves a finished temp file to `dest`. An existing object is replaced
    /// (atomically, by rename) rather than trusted: the new bytes were just
    /// hashed, the old ones may have been damaged since.
    fn rename_into_place(&self, temp: &Path, dest: &Path) -> Result<(), StoreError> {
        if let Some(parent) = dest.parent() {
            fs::create_dir_all(parent).map_err(|e| StoreError::io(parent, e))?;
        }
        fs::rename(temp, dest).map_err(|e| StoreError::io(dest, e))
    }

    /// Makes a stale output `path` no longer there, without waiting for
    /// its bytes to be freed (see [`super::clearing`]).
    pub fn clear_away(&self, path: &Path) -> io::Result<()> {
        let tmp = self.tmp_dir();
        let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        // (Named apart from the store's own temporary files: one a killed
        // run left here is never in their way.)
        let aside = tmp.join(format!("cleared-{}-{n}", std::process::id()));
        super::clearing::clear_away(path, &tmp, aside)
    }

    /// A path in the store's temporary area no one else uses (its
    /// directory made), for bytes arriving from elsewhere.
    pub fn fresh_temp_path(&self) -> PathBuf {
        let dir = self.tmp_dir();
        let _ = fs::create_dir_all(&dir);
        let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        dir.join(format!("{}-{n}", std::process::id()))
    }

    /// Makes downloaded, verified files durable and visible: each
    /// `(temp, dest)` is fsynced (its writeback was started by the download
    /// that wrote it, so this mostly waits for the disk to finish), then
    /// renamed into place. `hashed` names the objects among them (each
    /// hashed as it was written).
    pub fn publish_downloads(
        &self,
        placed: Vec<(PathBuf, PathBuf)>,
        hashed: Vec<Digest>,
    ) -> Result<(), StoreError> {
        let temps: Vec<&Path> = placed.iter().map(|(temp, _)| temp.as_path()).collect();
        if let Err(error) = sync_files(&temps) {
            // Not published, so not kept.
            for (temp, _) in &placed {
                let _ = fs::remove_file(temp);
            }
            return Err(error);
        }
        for (temp, dest) in placed {
            self.rename_into_place(&temp, &dest)?;
        }
        self.hashed_here
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(hashed);
        Ok(())
    }

    /// Whether this process wrote object `digest` and hashed it then
    /// (taken once: a later restore reads it again).
    fn just_hashed(&self, digest: &Digest) -> bool {
        self.hashed_here
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(digest)
    }

    /// Copies one workspace file into a temporary file of the store,
    /// hashing the bytes it copies. Not yet durable nor visible.
    fn copy_in(&self, src: &Path, staged: &mut Staged) -> Result<(Digest, u64), StoreError> {
        if self.link != Link::Copy {
            let temp = self.fresh_temp_path();
            let linked = match self.link {
                Link::Hardlink => link::hardlink(src, &temp),
                _ => link::reflink(src, &temp, 0o644),
            }
            .map_err(|e| StoreError::io(src, e))?;
            if linked {
                // The bytes stored are the ones hashed: the temp file's.
                let hashed = fs::metadata(&temp).and_then(|meta| {
                    let digest = crate::fingerprint::hash_file(&temp, meta.len(), true)?;
                    Ok((digest, meta.len()))
                });
                let (digest, size) = match hashed {
                    Ok(hashed) => hashed,
                    Err(e) => {
                        let _ = fs::remove_file(&temp);
                        return Err(StoreError::io(&temp, e));
                    }
                };
                staged.pending.push((temp, self.object_path(&digest)));
                return Ok((digest, size));
            }
        }
        let mut input = open_regular(src).map_err(|e| StoreError::io(src, e))?;
        let (temp, mut out) = self.temp_file()?;
        let mut hasher = blake3::Hasher::new();
        let mut buf = vec![0u8; 256 * 1024];
        let mut size = 0u64;
        let copied = loop {
            let n = match input.read(&mut buf) {
                Ok(0) => break Ok(()),
                Ok(n) => n,
                Err(e) => break Err(StoreError::io(src, e)),
            };
            hasher.update(&buf[..n]);
            if let Err(e) = out.write_all(&buf[..n]) {
                break Err(StoreError::io(&temp, e));
            }
            size += n as u64;
        };
        if let Err(error) = copied {
            // (A disk that filled up keeps nothing of the copy.)
            let _ = fs::remove_file(&temp);
            return Err(error);
        }
        let digest = Digest::from_hash(hasher.finalize());
        staged.pending.push((temp, self.object_path(&digest)));
        Ok((digest, size))
    }

    /// Copies a stage's declared outputs (files or directories) into the
    /// store's temporary area and hashes them. The digests are final; the
    /// objects become durable and visible only through [`Self::publish`].
    pub fn stage(&self, outputs: &[(String, String, PathBuf)]) -> Result<Staged, StoreError> {
        self.stage_with(outputs, true, &mut StatCache::default())
    }

    /// Like [`Self::stage`], with the files of directory outputs listed
    /// through `listing`: a stat cache that knows files of theirs (a
    /// per-item stage's entries, checked or stored moments ago) spares
    /// reading them again.
    pub fn stage_listed(
        &self,
        outputs: &[(String, String, PathBuf)],
        listing: &mut StatCache,
    ) -> Result<Staged, StoreError> {
        self.stage_with(outputs, true, listing)
    }

    /// Like [`Self::stage`], but every file goes to `objects/`, none into
    /// the ledger: for outputs recorded outside a result (an item's).
    pub fn stage_in_objects(
        &self,
        outputs: &[(String, String, PathBuf)],
    ) -> Result<Staged, StoreError> {
        self.stage_with(outputs, false, &mut StatCache::default())
    }

    /// [`Self::stage_listed`] if every output is a file small enough to go
    /// inline (a read of a few kilobytes, made on the caller's thread);
    /// `None`, with nothing staged, if one is not.
    pub fn stage_small(
        &self,
        outputs: &[(String, String, PathBuf)],
    ) -> Result<Option<Staged>, StoreError> {
        let Some(looks) = outputs
            .iter()
            .map(|(_, _, abs)| {
                look_at(abs)
                    .ok()
                    .filter(|(meta, _)| meta.is_file() && meta.len() <= INLINE_MAX)
            })
            .collect::<Option<Vec<_>>>()
        else {
            return Ok(None);
        };
        self.stage_looked(outputs, looks, true, &mut StatCache::default())
            .map(Some)
    }

    fn stage_with(
        &self,
        outputs: &[(String, String, PathBuf)],
        inline: bool,
        listing: &mut StatCache,
    ) -> Result<Staged, StoreError> {
        let looks = outputs
            .iter()
            .map(|(_, _, abs)| look_at(abs))
            .collect::<Result<Vec<_>, _>>()?;
        self.stage_looked(outputs, looks, inline, listing)
    }

    /// Stages each of `outputs`, as `looks` (one each) found it.
    fn stage_looked(
        &self,
        outputs: &[(String, String, PathBuf)],
        looks: Vec<(fs::Metadata, i64)>,
        inline: bool,
        listing: &mut StatCache,
    ) -> Result<Staged, StoreError> {
        let mut staged = Staged::for_outputs(outputs.len());
        for (output, look) in outputs.iter().zip(looks) {
            let record = self.stage_one(output, look, inline, listing, &mut staged)?;
            staged.records.push(record);
        }
        Ok(staged)
    }

    /// Stages output `name` (`path`, at `abs`) from its metadata and the
    /// moment before it was taken.
    fn stage_one(
        &self,
        (name, path, abs): &(String, String, PathBuf),
        (meta, seen_ns): (fs::Metadata, i64),
        inline: bool,
        listing: &mut StatCache,
        staged: &mut Staged,
    ) -> Result<OutputRecord, StoreError> {
        let executable = meta.permissions().mode() & 0o111 != 0;
        if !meta.is_dir() {
            refuse_special(abs, &meta).map_err(|e| StoreError::io(abs, e))?;
            let (digest, size, inline) = self.stage_file(abs, meta.len(), inline, staged)?;
            if let Ok(after) = fs::metadata(abs)
                && let Some(entry) = StatEntry::if_unchanged(&meta, &after, digest, seen_ns)
            {
                staged.seen.push((abs.to_owned(), entry));
            }
            return Ok(OutputRecord {
                name: name.to_owned(),
                path: path.to_owned(),
                kind: OutputKind::File,
                digest,
                size,
                executable,
                inline,
            });
        }
        let Content::Dir { mut entries, .. } =
            listing.content(abs).map_err(|e| StoreError::io(abs, e))?
        else {
            let replaced = io::Error::other("it was replaced by a file while being stored");
            return Err(StoreError::io(abs, replaced));
        };
        let mut total = 0;
        for entry in entries.iter_mut() {
            if matches!(entry.kind, EntryKind::File | EntryKind::Executable) {
                // Listing hashed every file: one already stored (an item's
                // output, an unchanged file of a re-run) is not copied again.
                if self.holds(&entry.digest, entry.size) {
                    total += entry.size;
                    continue;
                }
                let (digest, size) = self.copy_in(&abs.join(&entry.path), staged)?;
                // The bytes stored are the truth, even if the file changed
                // since it was listed.
                entry.digest = digest;
                entry.size = size;
                total += size;
            }
        }
        // Files that changed while copied no longer match their entries.
        staged.seen.extend(listing.take_updates(0));
        let digest = tree_digest(&mut entries);
        let listing = tree_listing::encode(&entries);
        let (temp, mut out) = self.temp_file()?;
        // (Pending first: a listing that does not fit is removed with it.)
        staged
            .pending
            .push((temp.clone(), self.compact_tree_path(&digest)));
        out.write_all(&listing)
            .map_err(|e| StoreError::io(&temp, e))?;
        Ok(OutputRecord {
            name: name.to_owned(),
            path: path.to_owned(),
            kind: OutputKind::Dir,
            digest,
            size: total,
            executable: false,
            inline: false,
        })
    }

    /// Stages one file output: inline if small (a file can grow between the
    /// stat and the read, hence the second look at the size), else copied.
    fn stage_file(
        &self,
        abs: &Path,
        len: u64,
        inline: bool,
        staged: &mut Staged,
    ) -> Result<(Digest, u64, bool), StoreError> {
        if inline && len <= INLINE_MAX {
            let bytes = read_regular(abs).map_err(|e| StoreError::io(abs, e))?;
            if bytes.len() as u64 <= INLINE_MAX {
                let digest = Digest::of(&bytes);
                let size = bytes.len() as u64;
                staged.inline.push((digest, bytes));
                return Ok((digest, size, true));
            }
        }
        let (digest, size) = self.copy_in(abs, staged)?;
        Ok((digest, size, false))
    }

    /// Makes staged file objects durable (fsync) and visible (rename). Only
    /// then may a result refer to them; inline objects travel with the
    /// result into the ledger.
    pub fn publish(&self, mut staged: Staged) -> Result<Published, StoreError> {
        for (temp, _) in &staged.pending {
            File::open(temp)
                .and_then(|f| f.sync_all())
                .map_err(|e| StoreError::io(temp, e))?;
        }
        let mut pending = std::mem::take(&mut staged.pending).into_iter();
        while let Some((temp, dest)) = pending.next() {
            if let Err(error) = self.rename_into_place(&temp, &dest) {
                // Not published, so not kept.
                for (temp, _) in std::iter::once((temp, dest)).chain(pending) {
                    let _ = fs::remove_file(temp);
                }
                return Err(error);
            }
        }
        Ok(Published {
            records: std::mem::take(&mut staged.records),
            inline: std::mem::take(&mut staged.inline),
            seen: std::mem::take(&mut staged.seen),
        })
    }

    /// The tree listing of a stored directory. (Read, not looked for
    /// first: the JSON listing of an older cairn is tried only when there
    /// is no compact one.)
    pub fn tree(&self, digest: &Digest) -> Result<Vec<TreeEntry>, StoreError> {
        let compact = self.compact_tree_path(digest);
        let (path, read) = match fs::read(&compact) {
            Err(missing) if missing.kind() == io::ErrorKind::NotFound => {
                let older = compact.with_extension("json");
                match fs::read(&older) {
                    // (Neither: the listing cairn writes is what is missing.)
                    Err(e) if e.kind() == io::ErrorKind::NotFound => (compact, Err(missing)),
                    read => (older, read),
                }
            }
            read => (compact, read),
        };
        let bytes = read.map_err(|e| StoreError::io(&path, e))?;
        tree_listing::decode_checked(&bytes, digest)
            .map_err(|detail| StoreError::Corrupt { path, detail })
    }

    /// Whether the object `digest` is stored with `size` bytes.
    pub fn holds(&self, digest: &Digest, size: u64) -> bool {
        fs::metadata(self.object_path(digest)).is_ok_and(|m| m.len() == size)
    }

    /// True if every object the record needs is present with its size (a
    /// cheap check; restores verify the bytes).
    pub fn is_complete(&self, record: &OutputRecord) -> bool {
        let present = |digest: &Digest, size: u64| self.holds(digest, size);
        match record.kind {
            // Committed in the same transaction as the result itself.
            OutputKind::File if record.inline => true,
            OutputKind::File => present(&record.digest, record.size),
            OutputKind::Dir => self.tree(&record.digest).is_ok_and(|entries| {
                entries
                    .iter()
                    .filter(|e| matches!(e.kind, EntryKind::File | EntryKind::Executable))
                    .all(|e| present(&e.digest, e.size))
            }),
        }
    }

    /// True if every object the record needs is stored and hashes to its
    /// name: what a restore would find. Reads every byte; `status` asks
    /// only about the outputs it expects `run` to restore.
    pub fn verify(
        &self,
        record: &OutputRecord,
        ledger: Option<&Ledger>,
    ) -> Result<bool, StoreError> {
        let object_intact = |digest: &Digest| {
            let path = self.object_path(digest);
            fs::metadata(&path)
                .ok()
                .filter(|meta| meta.is_file())
                .and_then(|meta| crate::fingerprint::hash_file(&path, meta.len(), false).ok())
                .is_some_and(|found| found == *digest)
        };
        Ok(match record.kind {
            OutputKind::File if record.inline => match ledger {
                Some(ledger) => ledger
                    .inline_object(&record.digest)?
                    .is_some_and(|bytes| Digest::of(&bytes) == record.digest),
                None => false,
            },
            OutputKind::File => object_intact(&record.digest),
            OutputKind::Dir => self.tree(&record.digest).is_ok_and(|entries| {
                entries
                    .iter()
                    .filter(|e| matches!(e.kind, EntryKind::File | EntryKind::Executable))
                    .all(|e| object_intact(&e.digest))
            }),
        })
    }

    /// Every object digest a record refers to (files, and a tree's files).
    pub fn referenced(&self, record: &OutputRecord) -> Vec<Digest> {
        match record.kind {
            OutputKind::File => vec![record.digest],
            OutputKind::Dir => self
                .tree(&record.digest)
                .map(|entries| {
                    entries
                        .iter()
                        .filter(|e| matches!(e.kind, EntryKind::File | EntryKind::Executable))
                        .map(|e| e.digest)
                        .collect()
                })
                .unwrap_or_default(),
        }
    }

    /// Rewrites the workspace copy of an output from the store, verifying
    /// each object's bytes; the old copy is replaced only once the new one
    /// is complete. Whatever fails, nothing half-written is left beside it,
    /// and a damaged object is removed only once every entry that needs it
    /// has been looked at (see [`Self::restore_entries`]).
    pub fn restore(
        &self,
        record: &OutputRecord,
        dest: &Path,
        ledger: Option<&Ledger>,
    ) -> Result<(), StoreError> {
        let parent = dest.parent().unwrap_or(Path::new("."));
        fs::create_dir_all(parent).map_err(|e| StoreError::io(parent, e))?;
        let staging = restore_staging(dest);
        remove_path(&staging).map_err(|e| StoreError::io(&staging, e))?;
        let placed = self
            .restore_into(record, &staging, dest, ledger)
            .map_err(|error| named_as_restored(error, &staging, dest))
            .and_then(|()| remove_path(dest).map_err(|e| StoreError::io(dest, e)))
            .and_then(|()| fs::rename(&staging, dest).map_err(|e| StoreError::io(dest, e)));
        if placed.is_err() {
            let _ = remove_path(&staging);
        }
        placed
    }

    /// Writes the output `record` describes at `staging`, verified.
    fn restore_into(
        &self,
        record: &OutputRecord,
        staging: &Path,
        dest: &Path,
        ledger: Option<&Ledger>,
    ) -> Result<(), StoreError> {
        match record.kind {
            OutputKind::File if record.inline => {
                let ledger = ledger.ok_or_else(|| StoreError::Corrupt {
                    path: dest.to_owned(),
                    detail: "an inline object needs the ledger".to_owned(),
                })?;
                let bytes =
                    ledger
                        .inline_object(&record.digest)?
                        .ok_or_else(|| StoreError::Corrupt {
                            path: ledger.path().to_owned(),
                            detail: format!("inline object {} is missing", record.digest),
                        })?;
                write_verified(
                    &bytes,
                    &record.digest,
                    ledger.path(),
                    staging,
                    record.executable,
                )
            }
            OutputKind::File => {
                let copied = self.copy_verified(&record.digest, staging, record.executable);
                if matches!(copied, Err(StoreError::Corrupt { .. })) {
                    // A damaged object must not be taken for a stored one:
                    // gone, the stage that re-runs stores it afresh.
                    let _ = fs::remove_file(self.object_path(&record.digest));
                }
                copied
            }
            OutputKind::Dir => {
                let entries = self.tree(&record.digest)?;
                fs::create_dir_all(staging).map_err(|e| StoreError::io(staging, e))?;
                self.restore_entries(&entries, staging, dest, record)
            }
        }
    }

    /// Restores a directory's entries under `staging`: the directories
    /// first, then the files, several at a time, each copy's writeback
    /// started; then every copy is synced. Every damaged object is found in
    /// this one pass and removed after it (two entries may share one), so
    /// the re-run that follows stores them all afresh.
    fn restore_entries(
        &self,
        entries: &[TreeEntry],
        staging: &Path,
        dest: &Path,
        record: &OutputRecord,
    ) -> Result<(), StoreError> {
        let mut files = Vec::new();
        for entry in entries {
            let target = staging.join(&entry.path);
            match entry.kind {
                EntryKind::Dir => {
                    fs::create_dir_all(&target).map_err(|e| StoreError::io(&target, e))?
                }
                EntryKind::File | EntryKind::Executable => {
                    if let Some(p) = target.parent() {
                        fs::create_dir_all(p).map_err(|e| StoreError::io(p, e))?;
                    }
                    files.push((entry, target));
                }
                EntryKind::Symlink => {
                    // (Not damage: the store keeps a link that points
                    // nowhere by the digest of its text alone.)
                    return Err(StoreError::Corrupt {
                        path: dest.to_owned(),
                        detail: format!(
                            "it holds `{}`, a symbolic link that points nowhere, which the store keeps only by the digest of its text",
                            entry.path.display()
                        ),
                    });
                }
            }
        }
        // Placed first, several at a time: a copy is written and its
        // writeback started, not waited for.
        let next = AtomicUsize::new(0);
        let failed = AtomicBool::new(false);
        let place_files = || -> Result<(Vec<&TreeEntry>, Vec<&Path>), StoreError> {
            let mut damaged = Vec::new();
            let mut copied = Vec::new();
            while let Some((entry, target)) = files.get(next.fetch_add(1, Ordering::Relaxed)) {
                if failed.load(Ordering::Relaxed) {
                    break;
                }
                let executable = entry.kind == EntryKind::Executable;
                match self.place_verified(&entry.digest, target, executable) {
                    Ok(Placed::Copied) => copied.push(target.as_path()),
                    Ok(Placed::Linked) => {}
                    Err(StoreError::Corrupt { .. }) => damaged.push(*entry),
                    Err(other) => {
                        failed.store(true, Ordering::Relaxed);
                        return Err(other);
                    }
                }
            }
            Ok((damaged, copied))
        };
        let mut damaged = Vec::new();
        let mut copied = Vec::new();
        for (found, written) in on_threads(RESTORE_THREADS.min(files.len()), place_files)? {
            damaged.extend(found);
            copied.extend(written);
        }
        if !damaged.is_empty() {
            for entry in &damaged {
                let _ = fs::remove_file(self.object_path(&entry.digest));
            }
            let mut paths: Vec<String> = damaged
                .iter()
                .map(|entry| entry.path.display().to_string())
                .collect();
            paths.sort_unstable();
            return Err(StoreError::Corrupt {
                path: self.objects_dir(),
                detail: format!(
                    "{} stored file(s) of `{}` do not hash to their names: {}",
                    paths.len(),
                    record.path,
                    paths.join(", ")
                ),
            });
        }
        // Then made durable, all of them on their way to the disk at once
        // (a copy synced as soon as written waits out the disk's latency
        // one file at a time).
        sync_files(&copied)
    }

    /// Re-stores object `digest` from `source` if `source` still holds
    /// exactly those bytes (hashed while copied); the damaged or missing
    /// object is replaced atomically. `Ok(false)`: `source` differs, and
    /// nothing was changed.
    pub fn restore_object_from(&self, digest: &Digest, source: &Path) -> Result<bool, StoreError> {
        let mut staged = Staged {
            records: Vec::new(),
            pending: Vec::new(),
            inline: Vec::new(),
            seen: Vec::new(),
        };
        let (copied, _) = self.copy_in(source, &mut staged)?;
        if copied != *digest {
            return Ok(false);
        }
        self.publish(staged)?;
        Ok(true)
    }

    /// Rewrites the tree listing of a directory whose workspace copy lists
    /// exactly as recorded.
    pub fn restore_tree_listing(
        &self,
        digest: &Digest,
        mut entries: Vec<TreeEntry>,
    ) -> Result<bool, StoreError> {
        if tree_digest(&mut entries) != *digest {
            return Ok(false);
        }
        let listing = tree_listing::encode(&entries);
        let (temp, mut out) = self.temp_file()?;
        let written = out
            .write_all(&listing)
            .and_then(|()| out.sync_all())
            .map_err(|e| StoreError::io(&temp, e))
            .and_then(|()| self.rename_into_place(&temp, &self.compact_tree_path(digest)));
        if written.is_err() {
            let _ = fs::remove_file(&temp);
        }
        written.map(|()| true)
    }

    /// Removes a damaged object or tree listing, so that no result is taken
    /// for complete while it needs it; absent is fine.
    pub fn discard(&self, path: &Path) -> Result<(), StoreError> {
        remove_path(path).map_err(|e| StoreError::io(path, e))
    }

    /// Restores `dest` from object `digest`, durable.
    fn copy_verified(
        &self,
        digest: &Digest,
        dest: &Path,
        executable: bool,
    ) -> Result<(), StoreError> {
        if self.place_verified(digest, dest, executable)? == Placed::Copied {
            File::open(dest)
                .and_then(|f| f.sync_all())
                .map_err(|e| StoreError::io(dest, e))?;
        }
        Ok(())
    }

    /// Restores `dest` from object `digest`: a link where `[cache] link`
    /// asks for one and one can be made, else a copy whose writeback is
    /// started but not waited for (the caller syncs it). What is in place
    /// is checked against `digest` unless this process hashed the object
    /// as it wrote it; a damaged object is `Corrupt` (and left for the
    /// caller to remove).
    fn place_verified(
        &self,
        digest: &Digest,
        dest: &Path,
        executable: bool,
    ) -> Result<Placed, StoreError> {
        let source = self.object_path(digest);
        if self.link != Link::Copy && self.link_verified(&source, digest, dest, executable)? {
            return Ok(Placed::Linked);
        }
        let io = |e| StoreError::io(&source, e);
        let mut from = File::open(&source).map_err(io)?;
        let (mut to, mode) = create_restored(dest, executable)?;
        // Copied by the kernel (`copy_file_range`). A write that finds no
        // room is the restored file's failure, not the object's.
        let size = io::copy(&mut from, &mut to).map_err(|e| match e.kind() {
            io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded => StoreError::io(dest, e),
            _ => io(e),
        })?;
        if !self.just_hashed(digest)
            && crate::fingerprint::hash_file(dest, size, true).map_err(io)? != *digest
        {
            drop(to);
            let _ = fs::remove_file(dest);
            // (The damaged object is removed by the caller, once no other
            // entry still reads it.)
            return Err(StoreError::Corrupt {
                path: source.clone(),
                detail: format!("content does not hash to {digest}"),
            });
        }
        // The mode asked for, whatever the umask.
        to.set_permissions(fs::Permissions::from_mode(mode))
            .map_err(|e| StoreError::io(dest, e))?;
        start_writeback(&to);
        Ok(Placed::Copied)
    }
}

/// How a restored file was put in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Placed {
    /// Its own bytes, written but not yet synced.
    Copied,
    /// The stored object's blocks (a hard link or a reflink), already
    /// durable.
    Linked,
}

/// Asks the kernel to start writing `file`'s dirty pages to the disk now,
/// without waiting: a later fsync then finds them written or on their
/// way. Only a hint; an error changes nothing the fsync will not report.
pub(in crate::store) fn start_writeback(file: &File) {
    use std::os::fd::AsRawFd as _;
    // SAFETY: `file` is an open descriptor for the whole call;
    // sync_file_range reads no memory of ours.
    unsafe {
        libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE);
    }
}

/// Fsyncs every file of `paths`, [`RESTORE_THREADS`] at a time (their
/// writeback already started, so most of the wait overlaps).
fn sync_files(paths: &[&Path]) -> Result<(), StoreError> {
    let next = AtomicUsize::new(0);
    let sync = || -> Result<(), StoreError> {
        while let Some(path) = paths.get(next.fetch_add(1, Ordering::Relaxed)) {
            File::open(path)
                .and_then(|f| f.sync_all())
                .map_err(|e| StoreError::io(path, e))?;
        }
        Ok(())
    };
    on_threads(RESTORE_THREADS.min(paths.len()), sync).map(drop)
}

/// Runs `work` on `threads` scoped threads (at least one) and gathers what
/// each returns; the first error wins, a panic is passed on.
fn on_threads<T: Send>(
    threads: usize,
    work: impl Fn() -> Result<T, StoreError> + Sync,
) -> Result<Vec<T>, StoreError> {
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads.max(1)).map(|_| scope.spawn(&work)).collect();
        workers
            .into_iter()
            .map(|worker| match worker.join() {
                Ok(result) => result,
                Err(panic) => std::panic::resume_unwind(panic),
            })
            .collect()
    })
}

impl ObjectStore {
    /// Restores `dest` as a link of the object `source` if it hashes to
    /// `digest` (damaged: `Corrupt`). `Ok(false)`: no link
    /// could be made (or a hard link would give the object another mode),
    /// copy instead.
    fn link_verified(
        &self,
        source: &Path,
        digest: &Digest,
        dest: &Path,
        executable: bool,
    ) -> Result<bool, StoreError> {
        let io = |e| StoreError::io(source, e);
        let size = fs::metadata(source).map_err(io)?.len();
        let linked = match self.link {
            Link::Hardlink => {
                if link::is_executable(source).map_err(io)? != executable {
                    return Ok(false);
                }
                link::hardlink(source, dest).map_err(io)?
            }
            _ => {
                let mode = if executable { 0o755 } else { 0o644 };
                link::reflink(source, dest, mode).map_err(io)?
            }
        };
        if !linked {
            return Ok(false);
        }
        // What is in place now is what is checked (unless the object was
        // hashed as this process wrote it).
        if !self.just_hashed(digest)
            && crate::fingerprint::hash_file(dest, size, true).map_err(io)? != *digest
        {
            let _ = fs::remove_file(dest);
            return Err(StoreError::Corrupt {
                path: source.to_owned(),
                detail: format!("content does not hash to {digest}"),
            });
        }
        Ok(true)
    }
}

/// Writes `bytes` to `dest` if they hash to `digest`; `source` names where
/// they came from in the error otherwise.
fn write_verified(
    bytes: &[u8],
    digest: &Digest,
    source: &Path,
    dest: &Path,
    executable: bool,
) -> Result<(), StoreError> {
    if Digest::of(bytes) != *digest {
        return Err(StoreError::Corrupt {
            path: source.to_owned(),
            detail: format!("content does not hash to {digest}"),
        });
    }
    let (mut out, mode) = create_restored(dest, executable)?;
    out.write_all(bytes)
        .and_then(|()| out.sync_all())
        .map_err(|e| StoreError::io(dest, e))?;
    fs::set_permissions(dest, fs::Permissions::from_mode(mode)).map_err(|e| StoreError::io(dest, e))
}

/// Creates (or truncates) the restored file `dest` with the mode an
/// executable or a plain file gets; returns it and that mode.
fn create_restored(dest: &Path, executable: bool) -> Result<(File, u32), StoreError> {
    let mode = if executable { 0o755 } else { 0o644 };
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(dest)
        .map(|file| (file, mode))
        .map_err(|e| StoreError::io(dest, e))
}

/// Where `dest` is restored until it is whole: beside it, hidden, one name
/// for every run (one process writes a workspace at a time), so what a run
/// killed mid-restore left there is removed by the next restore of it.
fn restore_staging(dest: &Path) -> PathBuf {
    let mut name = std::ffi::OsString::from(".");
    name.push(dest.file_name().unwrap_or_default());
    name.push(".cairn-restore");
    dest.with_file_name(name)
}

/// `error`, a path under `staging` in it named as the path under `dest`
/// it was being restored as: the user knows their output, not the name
/// it is written under until it is whole.
fn named_as_restored(error: StoreError, staging: &Path, dest: &Path) -> StoreError {
    match error {
        StoreError::Io { path, source } => {
            let path = match path.strip_prefix(staging) {
                Ok(inside) if inside.as_os_str().is_empty() => dest.to_owned(),
                Ok(inside) => dest.join(inside),
                Err(_) => path,
            };
            StoreError::Io { path, source }
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a restore killed half-way left beside its output is gone once
    /// the output is restored again.
    #[test]
    fn a_restore_removes_what_a_killed_restore_left_beside_its_output() {
        let dir = tempfile::tempdir().unwrap();
        let store = ObjectStore::new(&dir.path().join("cache"));
        let out = dir.path().join("out");
        fs::create_dir_all(out.join("sub")).unwrap();
        fs::write(out.join("sub/b.txt"), "b\n".repeat(20_000)).unwrap();
        let staged = store
            .stage(&[("out".to_owned(), "out".to_owned(), out.clone())])
            .unwrap();
        let record = store.publish(staged).unwrap().records.remove(0);
        let left = restore_staging(&out);
        fs::create_dir_all(left.join("sub")).unwrap();
        fs::write(left.join("sub/b.txt"), "half").unwrap();
        fs::remove_dir_all(&out).unwrap();
        store.restore(&record, &out, None).unwrap();
        assert!(!left.exists());
        assert_eq!(fs::read(out.join("sub/b.txt")).unwrap().len(), 40_000);
    }

    /// A directory stored now gets a compact listing; one an older cairn
    /// stored, with a JSON listing, is still read, found stored whole and
    /// restored; a damaged listing makes the directory incomplete.
    #[test]
    fn a_directory_is_listed_compactly_and_an_older_json_listing_still_serves() {
        let dir = tempfile::tempdir().unwrap();
        let store = ObjectStore::new(&dir.path().join("cache"));
        let out = dir.path().join("out");
        fs::create_dir_all(out.join("sub")).unwrap();
        fs::write(out.join("a.txt"), "a\n").unwrap();
        fs::write(out.join("sub/b.txt"), "b\n").unwrap();
        let staged = store
            .stage(&[("out".to_owned(), "out".to_owned(), out.clone())])
            .unwrap();
        let record = store.publish(staged).unwrap().records.remove(0);
        assert_eq!(record.kind, OutputKind::Dir);

        let compact = store.tree_path(&record.digest);
        assert_eq!(compact.extension().unwrap(), "tree");
        assert!(fs::read(&compact).unwrap().starts_with(b"cairn-tree\0"));
        let entries = store.tree(&record.digest).unwrap();
        let paths: Vec<&str> = entries.iter().filter_map(|e| e.path.to_str()).collect();
        assert_eq!(paths, ["a.txt", "sub", "sub/b.txt"]);
        assert!(store.is_complete(&record));

        // As an older cairn left it.
        let json = compact.with_extension("json");
        fs::write(&json, serde_json::to_vec_pretty(&entries).unwrap()).unwrap();
        fs::remove_file(&compact).unwrap();
        assert_eq!(store.tree_path(&record.digest), json);
        assert_eq!(store.tree(&record.digest).unwrap(), entries);
        assert!(store.is_complete(&record));
        let back = dir.path().join("back");
        store.restore(&record, &back, None).unwrap();
        assert_eq!(fs::read_to_string(back.join("sub/b.txt")).unwrap(), "b\n");

        // Edited: refused (the digest it is named by no longer matches),
        // so the directory is not taken for stored.
        let text = fs::read_to_string(&json).unwrap();
        fs::write(&json, text.replace("\"a.txt\"", "\"z.txt\"")).unwrap();
        assert!(matches!(
            store.tree(&record.digest),
            Err(StoreError::Corrupt { .. })
        ));
        assert!(!store.is_complete(&record));
    }
}
