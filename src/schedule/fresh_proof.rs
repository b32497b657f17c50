//! A fresh proof: what a run that left every stage of a pipeline valid saw,
//! kept so that the next `cairn run` with nothing to do can tell so by
//! `stat` alone, as ninja and make do, without loading the manifest or
//! deciding any stage again.
//!
//! A run decides every stage from four things: the manifest (its bytes,
//! where it is, the profile), the variables the keys read from the
//! environment, the ledger, and the files the stages read and write. A
//! proof holds each of them fixed:
//!
//! - it is kept under [`key`], the digest of the manifest's bytes, its
//!   path, the working directory, the profile and the cairn binary;
//! - it lists the digest of every variable the keys read;
//! - it lives in the ledger, whose triggers delete every proof in the same
//!   transaction as any write of a result, an item outcome or an inline
//!   object (see `store::ledger::schema`);
//! - it lists the stat of every file and directory the stages read and
//!   write, every stored object their results name, the lock file, and the
//!   directories those paths lie in.
//!
//! It is made only after checking that what it lists *is* what the run
//! decided from: each input's and output's digest, as the stat cache
//! vouches for it from the files' stats now, must be the digest the run
//! used or recorded, and the lock file must say what the run would write.
//! A file written within a timestamp tick of being hashed (racy, see
//! [`StatEntry::racy`]) when the proof was made is hashed again when it is
//! checked.
//!
//! A per-item stage's proof also lists its item list (unchanged since it
//! was read) and every item's inputs; its items' outcomes are in the
//! ledger. Stages whose freshness rests on anything else get no proof:
//! per-item stages with `item_outputs` (checked against the store item by
//! item), stages in an
//! image (a tag is pinned by asking a registry), built-ins with work beyond
//! their outputs (`register`, `oci-mirror`), and remote caches.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use super::Context;
use super::kept_plans::{KeptItem, KeptPlan};
use crate::file_stat::{FileStat, Found, OpenDir, Stated, lstat_in_dir, stat_in_dir};
use crate::fingerprint::{
    Digest, DirStat, EntryKind, PathMap, StatEntry, Vouched, hash_file, now_ns,
};
use crate::manifest::{Foreach, Manifest};
use crate::side_by_side::{in_shares, shares_for};
use crate::store::{OutputKind, OutputRecord};

/// Set (to anything) to have every `run` that a proof answers also decide
/// every stage the slow way and fail loudly if any is not fresh: how the
/// test suite checks each proof it meets.
pub const CHECK_VAR: &str = "CAIRN_CHECK_FRESH_PROOF";

/// Bumped whenever the encoding or what a proof lists changes.
const FORMAT: &[u8; 8] = b"cfproof3";

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

/// One thing a proof rests on, as it was when the proof was made.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Watched {
    /// A file the stages read or write (or the lock file), with the entry
    /// its digest was vouched for by. (A proof keeps the digest of a racy
    /// entry only: no other is hashed when it is checked.)
    File(PathBuf, StatEntry),
    /// A directory whose listing entered a digest.
    Dir(PathBuf, DirStat),
    /// A directory a path lies in (its own, not a link to another):
    /// replaced by a symbolic link, the path would be elsewhere.
    Place { path: PathBuf, dev: u64, ino: u64 },
    /// A stored object a result names: present with its size.
    Object {
        path: PathBuf,
        dev: u64,
        ino: u64,
        size: u64,
    },
}

impl Watched {
    fn path(&self) -> &Path {
        match self {
            Watched::File(path, _) | Watched::Dir(path, _) => path,
            Watched::Place { path, .. } | Watched::Object { path, .. } => path,
        }
    }

    /// Whether `self` and `other` say the same of what is there, seen at
    /// whatever moment (a stage's input that a per-item stage also lists
    /// is vouched for twice, seen at two moments).
    fn same_state(&self, other: &Watched) -> bool {
        match (self, other) {
            (Watched::File(_, a), Watched::File(_, b)) => {
                StatEntry { seen_ns: 0, ..*a } == StatEntry { seen_ns: 0, ..*b }
            }
            (Watched::Dir(_, a), Watched::Dir(_, b)) => {
                DirStat { seen_ns: 0, ..*a } == DirStat { seen_ns: 0, ..*b }
            }
            _ => self == other,
        }
    }
}

/// What a run that left every stage valid saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proof {
    /// The project root it was made for.
    pub root: PathBuf,
    /// Every stage, in the order the run decided them: its name and where
    /// its commands run (for the run's timeline).
    pub stages: Vec<(String, String)>,
    env: Vec<(String, Option<Digest>)>,
    watched: Vec<Watched>,
}

/// What checking a proof found.
#[derive(Debug)]
pub enum Checked {
    /// Everything is as it was. `renewed`: a racy file was hashed again and
    /// found unchanged; the proof now trusts it without hashing.
    Holds { renewed: bool },
    /// Something differs (`why`, named for `-v`): the stages must be
    /// decided. `stated`: the `stat` of each file found as the proof saw it,
    /// for the run to take instead of `stat`ing it again. `changed`: the
    /// file found changed, if a file was the difference (the stages that
    /// read it are the likeliest to run).
    Fails {
        why: String,
        stated: Stated,
        changed: Option<PathBuf>,
    },
}

/// Checks `watched` in a few shares side by side when there are many: a
/// proof of a thousand stages holds two thousand paths, and their `stat`s
/// are most of a no-op run.
fn check_side_by_side(watched: &mut [Watched], listed: &HashMap<PathBuf, Vec<PathBuf>>) -> Checked {
    /// Fewer paths than this a thread are not worth one.
    const SHARE: usize = 512;
    let shares = shares_for(watched.len(), SHARE);
    check_in_shares(watched, listed, shares)
}

/// Checks `watched` in `shares` shares side by side: every path is
/// `stat`ed first, and only if every `stat` held are the racy files hashed
/// and the racy directories listed again (so a proof that fails for a
/// `stat` hashes nothing).
fn check_in_shares(
    watched: &mut [Watched],
    listed: &HashMap<PathBuf, Vec<PathBuf>>,
    shares: usize,
) -> Checked {
    let differs = AtomicBool::new(false);
    let shares = in_shares(watched, shares, "cairn-proof", |first, share| {
        check_share(share, first, &differs)
    });
    // The first difference a share found, in the shares' order, is the
    // one reported.
    let first_difference = shares.iter().find_map(|share| share.differs);
    // A directory swapped (for a link, say) leaves nothing handed on: the
    // files below it may not be where they were.
    let moved = shares.iter().any(|share| share.place_differs);
    let (mut found, racy): (Vec<_>, Vec<_>) = shares
        .into_iter()
        .map(|share| (share.stated, share.racy))
        .unzip();
    let racy: Vec<(usize, Found)> = racy.into_iter().flatten().collect();
    let stated = |found: Vec<Vec<(usize, Found)>>| {
        let mut stated = Stated::default();
        if moved {
            return stated;
        }
        for (index, found) in found.into_iter().flatten() {
            if let Watched::File(path, _) = &watched[index] {
                stated.insert(path.clone(), found);
            }
        }
        stated
    };
    if let Some(index) = first_difference {
        return failed_at(&watched[index], stated(found));
    }
    let rechecked = in_shares(
        &racy,
        shares_for(racy.len(), 16),
        "cairn-proof",
        |_, share| {
            share
                .iter()
                .map(|(index, found)| {
                    unchanged_on_a_second_look(&watched[*index], &found.stat, listed)
                })
                .collect::<Vec<bool>>()
        },
    );
    let (held, changed): (Vec<_>, Vec<_>) = racy
        .iter()
        .zip(rechecked.into_iter().flatten())
        .partition(|(_, unchanged)| *unchanged);
    if let Some(((index, _), _)) = changed.first() {
        found.push(held.into_iter().map(|(found, _)| *found).collect());
        return failed_at(&watched[*index], stated(found));
    }
    // Racy entries found unchanged are trusted from when they were seen.
    for &(index, Found { seen_ns, .. }) in &racy {
        match &mut watched[index] {
            Watched::File(_, entry) => entry.seen_ns = seen_ns,
            Watched::Dir(_, stat) => stat.seen_ns = seen_ns,
            Watched::Place { .. } | Watched::Object { .. } => {}
        }
    }
    Checked::Holds {
        renewed: !racy.is_empty(),
    }
}

/// The proof failed at `watched`, handing on `stated`.
fn failed_at(watched: &Watched, stated: Stated) -> Checked {
    Checked::Fails {
        why: format!("{} changed", watched.path().display()),
        stated,
        changed: match watched {
            Watched::File(path, _) => Some(path.clone()),
            _ => None,
        },
    }
}

/// What checking one share of a proof found.
#[derive(Default)]
struct Share {
    /// The index of the share's first difference.
    differs: Option<usize>,
    /// Each file found as the proof saw it and not racy: its index, and
    /// how it was found.
    stated: Vec<(usize, Found)>,
    /// The same of each racy file or directory whose `stat` held, to be
    /// hashed or listed again.
    racy: Vec<(usize, Found)>,
    /// A directory a path lies in is not the one the proof saw.
    place_differs: bool,
}

/// `stat`s each of `watched` (from index `first` of the proof's) in turn
/// (see [`Proof::check`]). Once a difference is found (here, or in another
/// share: `differs`) the proof fails: the files are still looked at, for
/// each found unchanged to be handed on (the run looks at every one), and
/// the directories the paths lie in, but no other directory or stored
/// object.
fn check_share(watched: &[Watched], first: usize, differs: &AtomicBool) -> Share {
    let mut share = Share {
        stated: Vec::with_capacity(watched.len()),
        ..Share::default()
    };
    // (Files are `stat`ed by name in their directory: in byte order,
    // most files of a directory come one after another.)
    let mut dir = OpenDir::default();
    for (index, watched) in (first..).zip(watched) {
        let failed = share.differs.is_some() || differs.load(Ordering::Relaxed);
        let seen_ns = now_ns();
        let changed = match watched {
            // Every file is looked at, after a difference too: the run
            // then looks at each, and takes what was found here (see
            // [`Stated`]). (The directories are checked all the same: a
            // file handed on was found in the directories the proof saw.)
            Watched::File(path, entry) => match found_in_dir(path, &mut dir, seen_ns) {
                Ok(found) if entry.matches_stat(&found.stat) => {
                    let found = (index, found);
                    match entry.racy() {
                        true => share.racy.push(found),
                        false => share.stated.push(found),
                    }
                    false
                }
                _ => true,
            },
            Watched::Place { path, dev, ino } => {
                let moved = !std::fs::symlink_metadata(path)
                    .is_ok_and(|meta| meta.is_dir() && meta.dev() == *dev && meta.ino() == *ino);
                share.place_differs |= moved;
                moved
            }
            _ if failed => false,
            Watched::Dir(path, stat) => match std::fs::metadata(path) {
                Ok(meta) if stat.matches(&meta) => {
                    if stat.racy() {
                        let found = Found {
                            stat: FileStat::from(&meta),
                            seen_ns,
                            link: false,
                        };
                        share.racy.push((index, found));
                    }
                    false
                }
                _ => true,
            },
            Watched::Object {
                path,
                dev,
                ino,
                size,
            } => !std::fs::metadata(path)
                .is_ok_and(|meta| meta.dev() == *dev && meta.ino() == *ino && meta.len() == *size),
        };
        if changed && share.differs.is_none() {
            differs.store(true, Ordering::Relaxed);
            share.differs = Some(index);
        }
    }
    share
}

/// How the file at `path` is found (by name in `dir`: see
/// [`stat_in_dir`]): an `lstat`, which is its `stat` unless it is a
/// symbolic link, then followed. (Whether it is a link is what the checks
/// of a manifest's outputs ask.)
fn found_in_dir(path: &Path, dir: &mut OpenDir, seen_ns: i64) -> std::io::Result<Found> {
    let stat = lstat_in_dir(path, dir)?;
    let link = stat.is_symlink();
    let stat = if link { stat_in_dir(path, dir)? } else { stat };
    Ok(Found {
        stat,
        seen_ns,
        link,
    })
}

/// Whether a racy entry whose `stat` held is unchanged: a file's bytes
/// hash to its digest; a directory lists the entries the proof lists (one
/// added within the tick it was listed in could have kept its times).
fn unchanged_on_a_second_look(
    watched: &Watched,
    stat: &FileStat,
    listed: &HashMap<PathBuf, Vec<PathBuf>>,
) -> bool {
    match watched {
        Watched::File(path, entry) => {
            hash_file(path, stat.size, false).is_ok_and(|digest| digest == entry.digest)
        }
        Watched::Dir(path, _) => listing(path).as_ref() == listed.get(path),
        Watched::Place { .. } | Watched::Object { .. } => true,
    }
}

/// The paths in directory `path`, sorted; `None` if it cannot be read.
fn listing(path: &Path) -> Option<Vec<PathBuf>> {
    let mut entries = std::fs::read_dir(path)
        .ok()?
        .map(|entry| entry.map(|entry| entry.path()))
        .collect::<Result<Vec<_>, _>>()
        .ok()?;
    entries.sort();
    Some(entries)
}

impl Proof {
    /// The proof of a run that used `used` (each stage's fingerprint and
    /// outputs) for every stage of `ctx`'s manifest, in `order`, with the
    /// item plans to keep beside it (`None`: those kept still hold);
    /// `None` if the pipeline cannot have one or the workspace is no longer
    /// what the run decided from (both logged at debug level).
    pub fn make(
        ctx: &Context<'_>,
        used: &HashMap<usize, (Digest, Vec<OutputRecord>)>,
        order: &[usize],
        lock: &str,
    ) -> Option<(Proof, Option<Vec<KeptPlan>>)> {
        match Self::try_make(ctx, used, order, lock) {
            Ok(proof) => Some(proof),
            Err(why) => {
                tracing::debug!("no fresh proof: {why}");
                None
            }
        }
    }

    fn try_make(
        ctx: &Context<'_>,
        used: &HashMap<usize, (Digest, Vec<OutputRecord>)>,
        order: &[usize],
        lock: &str,
    ) -> Result<(Proof, Option<Vec<KeptPlan>>), String> {
        let mut draft = ProofDraft::new(ctx, order);
        draft.add_used(ctx, order.iter().copied(), used)?;
        draft.finish(ctx, lock)
    }

    /// Checks every variable and path against what the proof saw: any
    /// difference fails it. A racy file is hashed (until a difference is
    /// found). A proof that fails gives the `stat`s of the files that held.
    pub fn check(&mut self) -> Checked {
        for (name, digest) in &self.env {
            let now = std::env::var(name)
                .ok()
                .map(|value| Digest::of(value.as_bytes()));
            if now != *digest {
                return Checked::Fails {
                    why: format!("the variable {name} changed"),
                    stated: Stated::default(),
                    changed: None,
                };
            }
        }
        // What each directory holds, only when one must be listed again.
        let racy_dir = self
            .watched
            .iter()
            .any(|w| matches!(w, Watched::Dir(_, stat) if stat.racy()));
        let listed = if racy_dir {
            self.listed_children()
        } else {
            HashMap::new()
        };
        check_side_by_side(&mut self.watched, &listed)
    }

    /// The files and directories the proof lists in each directory whose
    /// listing it lists, sorted.
    fn listed_children(&self) -> HashMap<PathBuf, Vec<PathBuf>> {
        let mut children: HashMap<PathBuf, Vec<PathBuf>> = self
            .watched
            .iter()
            .filter_map(|w| match w {
                Watched::Dir(path, _) => Some((path.clone(), Vec::new())),
                _ => None,
            })
            .collect();
        for watched in &self.watched {
            let (Watched::File(path, _) | Watched::Dir(path, _)) = watched else {
                continue;
            };
            if let Some(siblings) = path.parent().and_then(|dir| children.get_mut(dir)) {
                siblings.push(path.clone());
            }
        }
        for siblings in children.values_mut() {
            siblings.sort();
        }
        children
    }

    /// How many paths the proof rests on.
    pub fn paths(&self) -> usize {
        self.watched.len()
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Encoder(Vec::with_capacity(64 + self.watched.len() * 96));
        out.0.extend_from_slice(FORMAT);
        out.path(&self.root);
        out.u64(self.stages.len() as u64);
        for (name, executor) in &self.stages {
            out.text(name);
            out.text(executor);
        }
        out.u64(self.env.len() as u64);
        for (name, digest) in &self.env {
            out.text(name);
            match digest {
                Some(digest) => {
                    out.0.push(1);
                    out.0.extend_from_slice(digest.as_bytes());
                }
                None => out.0.push(0),
            }
        }
        // Compact, as most of a proof is thousands of files: each path
        // after what it shares with the one before, numbers as varints,
        // a file's times after its mtime, and its digest only while it is
        // racy (the only time a check hashes it).
        out.u64(self.watched.len() as u64);
        let mut before: &[u8] = &[];
        for watched in &self.watched {
            let path = watched.path().as_os_str().as_encoded_bytes();
            match watched {
                Watched::File(_, entry) => {
                    out.0.push(0);
                    out.path_after(before, path);
                    out.var(entry.dev);
                    out.var(entry.ino);
                    out.var(entry.size);
                    out.times(entry.mtime_ns, entry.ctime_ns, entry.seen_ns);
                    if entry.racy() {
                        out.0.push(1);
                        out.0.extend_from_slice(entry.digest.as_bytes());
                    } else {
                        out.0.push(0);
                    }
                }
                Watched::Dir(_, d) => {
                    out.0.push(1);
                    out.path_after(before, path);
                    out.var(d.dev);
                    out.var(d.ino);
                    out.times(d.mtime_ns, d.ctime_ns, d.seen_ns);
                }
                Watched::Place { dev, ino, .. } => {
                    out.0.push(2);
                    out.path_after(before, path);
                    out.var(*dev);
                    out.var(*ino);
                }
                Watched::Object { dev, ino, size, .. } => {
                    out.0.push(3);
                    out.path_after(before, path);
                    out.var(*dev);
                    out.var(*ino);
                    out.var(*size);
                }
            }
            before = path;
        }
        out.0
    }

    /// The proof `bytes` encode; `None` for anything else (another format,
    /// a cut or damaged body).
    pub fn decode(bytes: &[u8]) -> Option<Proof> {
        let mut d = Decoder(bytes.strip_prefix(FORMAT)?);
        let root = d.path()?;
        let stages = (0..d.count()?)
            .map(|_| Some((d.text()?, d.text()?)))
            .collect::<Option<Vec<_>>>()?;
        let env = (0..d.count()?)
            .map(|_| {
                let name = d.text()?;
                let digest = match d.byte()? {
                    0 => None,
                    1 => Some(d.digest()?),
                    _ => return None,
                };
                Some((name, digest))
            })
            .collect::<Option<Vec<_>>>()?;
        let mut before = Vec::new();
        let watched = (0..d.count()?)
            .map(|_| {
                let kind = d.byte()?;
                let path = d.path_after(&mut before)?;
                Some(match kind {
                    0 => {
                        let (dev, ino, size) = (d.var()?, d.var()?, d.var()?);
                        let (mtime_ns, ctime_ns, seen_ns) = d.times()?;
                        let digest = match d.byte()? {
                            0 => None,
                            1 => Some(d.digest()?),
                            _ => return None,
                        };
                        let entry = StatEntry {
                            dev,
                            ino,
                            size,
                            mtime_ns,
                            ctime_ns,
                            // (Not racy: never hashed again, so never read.)
                            digest: digest
                                .unwrap_or(Digest::from_hash(blake3::Hash::from_bytes([0; 32]))),
                            seen_ns,
                        };
                        // A racy file is hashed when the proof is checked.
                        if digest.is_none() && entry.racy() {
                            return None;
                        }
                        Watched::File(path, entry)
                    }
                    1 => {
                        let (dev, ino) = (d.var()?, d.var()?);
                        let (mtime_ns, ctime_ns, seen_ns) = d.times()?;
                        let stat = DirStat {
                            dev,
                            ino,
                            mtime_ns,
                            ctime_ns,
                            seen_ns,
                        };
                        Watched::Dir(path, stat)
                    }
                    2 => Watched::Place {
                        path,
                        dev: d.var()?,
                        ino: d.var()?,
                    },
                    3 => Watched::Object {
                        path,
                        dev: d.var()?,
                        ino: d.var()?,
                        size: d.var()?,
                    },
                    _ => return None,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        d.0.is_empty().then_some(Proof {
            root,
            stages,
            env,
            watched,
        })
    }
}

/// What the items of per-item stage `i` were planned from: its item list
/// (unchanged since it was read, and not written within a tick before:
/// a later write then shows in its stat) and every item's inputs, each
/// vouched for with the digest its fingerprint hashed.
fn items_read(
    ctx: &Context<'_>,
    i: usize,
    foreach: &Foreach,
    keep_plan: bool,
    watching: &mut Watching<'_>,
) -> Result<Option<KeptPlan>, String> {
    let stage = &ctx.manifest.stages[i];
    let root = &ctx.manifest.root;
    if !super::item_outputs::ItemOutputs::of(stage, root).is_empty() {
        return Err(format!("`{}` has item outputs", stage.name));
    }
    let Some(Some((before, seen_ns))) = ctx.item_lists.get(&i) else {
        return Err(format!(
            "`{}`'s item list changed as it was read",
            stage.name
        ));
    };
    let list = foreach.items.resolve(root);
    let now = std::fs::metadata(&list).map_err(|e| format!("{}: {e}", list.display()))?;
    let digest =
        hash_file(&list, now.len(), true).map_err(|e| format!("{}: {e}", list.display()))?;
    let entry = StatEntry::new(before, digest, *seen_ns);
    if !entry.matches(&now) || entry.racy() {
        return Err(format!("{} changed as it was read", list.display()));
    }
    watching.place(&list)?;
    watching.watched.push(Watched::File(list.clone(), entry));
    // (`\0image`, `\0sample`: no path; in the fingerprint, not on disk.)
    let mut vouch_all = |paths_read: &mut dyn Iterator<Item = (&String, &Digest)>| {
        for (path, digest) in paths_read.filter(|(path, _)| !path.starts_with('\0')) {
            watching.read(ctx, root.join(path), digest)?;
        }
        Ok::<_, String>(())
    };
    let items: Vec<KeptItem> = match (ctx.item_plans.get(&i), ctx.item_reads.get(&i)) {
        (Some(plan), _) => {
            vouch_all(
                &mut plan
                    .iter()
                    .flat_map(|p| p.inputs.iter().map(|(path, d)| (path, d))),
            )?;
            if keep_plan {
                plan.iter().map(KeptItem::of).collect()
            } else {
                Vec::new()
            }
        }
        (None, Some(reads)) => {
            vouch_all(
                &mut reads
                    .iter()
                    .flat_map(|(item, digests)| item.paths.iter().zip(digests)),
            )?;
            if keep_plan {
                reads.iter().map(|(item, _)| item.clone()).collect()
            } else {
                Vec::new()
            }
        }
        (None, None) => return Err(format!("`{}`'s items were not planned", stage.name)),
    };
    // A sampled stage's units are not kept: they are drawn as planned.
    let kept = match (
        keep_plan && foreach.samples.is_none(),
        ctx.item_codes.get(&i),
    ) {
        (true, Some(code)) => Some(KeptPlan {
            stage: stage.name.clone(),
            code: *code,
            list,
            list_entry: entry,
            items,
        }),
        _ => None,
    };
    Ok(kept)
}

/// What a proof being made watches, gathered as the run's stages are gone
/// through: each path once it is sorted (see [`Watching::finish`]).
struct Watching<'r> {
    root: &'r Path,
    watched: Vec<Watched>,
    /// The directories the paths read lie in, below the root.
    places: PathMap<Watched>,
    /// Directories read and vouched for entry by entry: read by many
    /// stages or items, they are watched once.
    dirs_read: PathMap<Digest>,
}

impl<'r> Watching<'r> {
    fn new(root: &'r Path, capacity: usize) -> Self {
        Self {
            root,
            watched: Vec::with_capacity(capacity),
            places: PathMap::default(),
            dirs_read: PathMap::default(),
        }
    }

    /// `path`, which the run read (or wrote) as `expected`, with what the
    /// stat cache vouches for it by and the directories it lies in.
    fn read(&mut self, ctx: &Context<'_>, path: PathBuf, expected: &Digest) -> Result<(), String> {
        self.place(&path)?;
        // A file this run hashed or found unchanged: the entry its digest
        // rests on, as it was then. A change since shows in its stat when
        // the proof is checked, so no `stat` is needed now.
        if let Some(entry) = ctx
            .stat
            .entry(&path)
            .filter(|entry| entry.digest == *expected)
        {
            self.watched.push(Watched::File(path, entry));
            return Ok(());
        }
        if let Some(digest) = self.dirs_read.get(&path) {
            return match digest == expected {
                true => Ok(()),
                false => Err(format!("{} changed during the run", path.display())),
            };
        }
        let vouched = ctx
            .stat
            .vouch(&path)
            .ok_or_else(|| format!("{} is not vouched for by the stat cache", path.display()))?;
        if vouched.digest != *expected {
            return Err(format!("{} changed during the run", path.display()));
        }
        let Vouched { files, dirs, .. } = vouched;
        if !dirs.is_empty() {
            self.dirs_read.insert(path, *expected);
        }
        self.watched.extend(
            files
                .into_iter()
                .map(|(file, entry)| Watched::File(file, entry)),
        );
        self.watched
            .extend(dirs.into_iter().map(|(dir, stat)| Watched::Dir(dir, stat)));
        Ok(())
    }

    /// The directories `path` lies in below the root (none for a path
    /// outside it).
    fn place(&mut self, path: &Path) -> Result<(), String> {
        let places = &mut self.places;
        // A directory is placed with the ones it lies in.
        if path.parent().is_some_and(|dir| places.contains_key(dir)) {
            return Ok(());
        }
        let Ok(inside) = path.strip_prefix(self.root) else {
            return Ok(());
        };
        let mut dir = self.root.to_path_buf();
        let components: Vec<Component<'_>> = inside.components().collect();
        for component in components.iter().take(components.len().saturating_sub(1)) {
            dir.push(component);
            if places.contains_key(&dir) {
                continue;
            }
            let meta =
                std::fs::symlink_metadata(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            if !meta.is_dir() {
                return Err(format!("{} is not a directory", dir.display()));
            }
            let watched = Watched::Place {
                path: dir.clone(),
                dev: meta.dev(),
                ino: meta.ino(),
            };
            places.insert(dir.clone(), watched);
        }
        Ok(())
    }

    /// Everything watched, sorted by path bytes (the same run makes the
    /// same proof), each path once: a directory watched for its listing
    /// keeps that check (a place checks only that it is the same
    /// directory). A path seen two ways during the run (an item list
    /// rewritten after a stage that reads it was decided) gets no proof.
    fn finish(self) -> Result<Vec<Watched>, String> {
        let mut watched = self.watched;
        watched.extend(self.places.into_values());
        sort_watched(&mut watched);
        if let Some(pair) = watched.windows(2).find(|pair| {
            pair[0].path().as_os_str() == pair[1].path().as_os_str()
                && !is_place(&pair[1])
                && !pair[0].same_state(&pair[1])
        }) {
            return Err(format!(
                "{} was seen two ways during the run",
                pair[0].path().display()
            ));
        }
        watched.dedup_by(|later, first| later.path().as_os_str() == first.path().as_os_str());
        Ok(watched)
    }
}

/// A proof being made stage by stage: a run adds the stages whose results
/// it knows while its last commands run, and the others at its end, when
/// the lock file is written (see [`ProofDraft::finish`]). What a stage
/// added early watches is as the run saw it then: a change after that
/// fails the proof when it is checked, as any change does.
pub struct ProofDraft<'m> {
    watching: Watching<'m>,
    /// Each stage added: its place in the order the run decided them, its
    /// name and where its commands run.
    stages: Vec<(usize, String, String)>,
    /// Each stage's place in that order.
    place_in_order: Vec<usize>,
    /// The item plans of the stages added, each with its stage's place.
    plans: Vec<(usize, KeptPlan)>,
    /// The item plans are kept anew unless every stage that can have one
    /// was planned from the one kept.
    keep_plans: bool,
    /// How many of the entries watched were drafted (see [`Self::sort`]).
    drafted: usize,
}

impl<'m> ProofDraft<'m> {
    /// A draft of the proof of `ctx`'s run, whose stages were decided in
    /// `order`.
    pub fn new(ctx: &Context<'m>, order: &[usize]) -> Self {
        let manifest = ctx.manifest;
        // (Gathered as read, sorted at the end; sized for every path read.)
        let reads: usize = manifest
            .stages
            .iter()
            .map(|stage| 2 * (stage.inputs.len() + stage.outputs.len()))
            .chain(ctx.item_plans.values().flatten().map(|p| p.inputs.len()))
            .chain(
                ctx.item_reads
                    .values()
                    .flatten()
                    .map(|(item, _)| item.paths.len()),
            )
            .sum();
        let mut place_in_order = vec![0; manifest.stages.len()];
        for (place, &i) in order.iter().enumerate() {
            place_in_order[i] = place;
        }
        let keep_plans = manifest.stages.iter().enumerate().any(|(i, stage)| {
            stage.foreach.as_ref().is_some_and(|f| f.samples.is_none())
                && !ctx.planned_from_kept.contains(&i)
        });
        Self {
            watching: Watching::new(&manifest.root, reads + 16),
            stages: Vec::with_capacity(order.len()),
            place_in_order,
            plans: Vec::new(),
            keep_plans,
            drafted: 0,
        }
    }

    /// Adds each stage of `stages` with the result this run used for it
    /// (`used`).
    pub fn add_used(
        &mut self,
        ctx: &Context<'_>,
        stages: impl Iterator<Item = usize>,
        used: &HashMap<usize, (Digest, Vec<OutputRecord>)>,
    ) -> Result<(), String> {
        for i in stages {
            let (_, outputs) = used.get(&i).ok_or_else(|| {
                format!(
                    "`{}` has no result of this run",
                    ctx.manifest.stages[i].name
                )
            })?;
            self.add(ctx, i, outputs)?;
        }
        Ok(())
    }

    /// Adds stage `i`, whose result this run used (`outputs`): every path
    /// it read and wrote, and the stored objects it rests on.
    fn add(&mut self, ctx: &Context<'_>, i: usize, outputs: &[OutputRecord]) -> Result<(), String> {
        let manifest = ctx.manifest;
        let root = &manifest.root;
        let watching = &mut self.watching;
        let stage = &manifest.stages[i];
        if manifest.image_of(stage).is_some() {
            return Err(format!("`{}` runs in an image", stage.name));
        }
        if let Some(uses) = &stage.uses
            && crate::builtins::effect_output(&uses.name).is_some()
        {
            return Err(format!("`{}` does work beyond its outputs", stage.name));
        }
        let inputs = ctx
            .input_digests
            .get(&i)
            .ok_or_else(|| format!("`{}` was not fingerprinted", stage.name))?;
        for (input, expected) in stage.inputs.iter().zip(inputs) {
            watching.read(ctx, input.path.resolve(root), expected)?;
        }
        for output in outputs {
            watching.read(ctx, root.join(&output.path), &output.digest)?;
            if output.kind == OutputKind::Dir {
                // The listing is read and checked against its digest
                // when the stage is decided: watched as a file, so an
                // edit in place is seen too.
                let listing = ctx.store.tree_path(&output.digest);
                let seen_ns = now_ns();
                let meta = std::fs::metadata(&listing)
                    .map_err(|e| format!("{}: {e}", listing.display()))?;
                let bytes =
                    std::fs::read(&listing).map_err(|e| format!("{}: {e}", listing.display()))?;
                let entry = StatEntry::new(&meta, Digest::of(&bytes), seen_ns);
                watching.watched.push(Watched::File(listing, entry));
            }
            for (path, size) in stored_objects(ctx, output)? {
                let meta =
                    std::fs::metadata(&path).map_err(|e| format!("{}: {e}", path.display()))?;
                if meta.len() != size {
                    return Err(format!("{} is not {size} bytes", path.display()));
                }
                watching.watched.push(Watched::Object {
                    path,
                    dev: meta.dev(),
                    ino: meta.ino(),
                    size,
                });
            }
        }
        let place = self.place_in_order[i];
        if let Some(foreach) = &stage.foreach {
            let plan = items_read(ctx, i, foreach, self.keep_plans, watching)?;
            self.plans.extend(plan.map(|plan| (place, plan)));
        }
        self.stages
            .push((place, stage.name.clone(), stage.executor_name()));
        Ok(())
    }

    /// Puts what the stages added so far watch in order, as a draft: the
    /// stages added after it are sorted in among them at the end for
    /// little more than their own number.
    pub fn sort(&mut self) {
        sort_watched(&mut self.watching.watched);
        self.drafted = self.watching.watched.len();
    }

    /// Takes, for each file the draft watches, the moment the stat cache
    /// knows it as it was by now: the run's end saves the cache, and a
    /// saved entry is seen as of then (see `StatCache::take_updates`), so
    /// a file written moments before the draft is not racy in the proof.
    fn seen_as_saved(&mut self, ctx: &Context<'_>) {
        let unseen = |entry: StatEntry| StatEntry {
            seen_ns: 0,
            ..entry
        };
        let drafted = &mut self.watching.watched[..self.drafted];
        for watched in drafted {
            let Watched::File(path, entry) = watched else {
                continue;
            };
            let Some(now) = ctx.stat.entry(path) else {
                continue;
            };
            if unseen(now) == unseen(*entry) {
                entry.seen_ns = entry.seen_ns.max(now.seen_ns);
            }
        }
    }

    /// The proof, once every stage is added and the lock file written as
    /// `lock` (which it checks), with the item plans to keep beside it
    /// (`None`: those kept still hold).
    pub fn finish(
        mut self,
        ctx: &Context<'_>,
        lock: &str,
    ) -> Result<(Proof, Option<Vec<KeptPlan>>), String> {
        let manifest = ctx.manifest;
        // The lock file says what this run would write.
        let lock_path = manifest.lock_path();
        let seen_ns = now_ns();
        let meta = std::fs::metadata(&lock_path).map_err(|e| format!("the lock file: {e}"))?;
        let text = std::fs::read(&lock_path).map_err(|e| format!("the lock file: {e}"))?;
        let after = std::fs::metadata(&lock_path).map_err(|e| format!("the lock file: {e}"))?;
        if text != lock.as_bytes() || !crate::fingerprint::unchanged(&meta, &after) {
            return Err("the lock file is not what this run would write".to_owned());
        }
        let entry = StatEntry::new(&after, Digest::of(&text), seen_ns);
        self.seen_as_saved(ctx);
        self.watching.watched.push(Watched::File(lock_path, entry));
        // (In the order the stages were decided, however they were added.)
        self.stages.sort_unstable_by_key(|(place, ..)| *place);
        self.plans.sort_unstable_by_key(|(place, _)| *place);
        let plans = self.plans.into_iter().map(|(_, plan)| plan).collect();
        let proof = Proof {
            root: manifest.root.clone(),
            stages: self
                .stages
                .into_iter()
                .map(|(_, name, executor)| (name, executor))
                .collect(),
            env: ctx.env_read.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            watched: self.watching.finish()?,
        };
        Ok((proof, self.keep_plans.then_some(plans)))
    }
}

/// Sorts `watched` by path, a directory's place after what is watched of
/// the directory itself. (A stable sort: a part sorted before costs little
/// more to sort again with more added.)
fn sort_watched(watched: &mut [Watched]) {
    watched.sort_by(|a, b| {
        a.path()
            .as_os_str()
            .cmp(b.path().as_os_str())
            .then_with(|| is_place(a).cmp(&is_place(b)))
    });
}

/// Whether `watched` is the place of a directory paths lie in.
fn is_place(watched: &Watched) -> bool {
    matches!(watched, Watched::Place { .. })
}

/// The stored objects `output` needs, with their sizes (as the freshness
/// check finds them: `ObjectStore::is_complete`); a directory's listing is
/// watched apart.
fn stored_objects(ctx: &Context<'_>, output: &OutputRecord) -> Result<Vec<(PathBuf, u64)>, String> {
    let store = &ctx.store;
    Ok(match output.kind {
        OutputKind::File if output.inline => Vec::new(),
        OutputKind::File => vec![(store.object_path(&output.digest), output.size)],
        OutputKind::Dir => {
            let listing = store.tree_path(&output.digest);
            let entries = store
                .tree(&output.digest)
                .map_err(|e| format!("{}: {e}", listing.display()))?;
            let mut objects = Vec::new();
            objects.extend(
                entries
                    .iter()
                    .filter(|e| matches!(e.kind, EntryKind::File | EntryKind::Executable))
                    .map(|e| (store.object_path(&e.digest), e.size)),
            );
            objects
        }
    })
}

pub(super) struct Encoder(pub(super) Vec<u8>);

impl Encoder {
    pub(super) fn u64(&mut self, n: u64) {
        self.0.extend_from_slice(&n.to_le_bytes());
    }

    pub(super) fn text(&mut self, text: &str) {
        self.bytes(text.as_bytes());
    }

    pub(super) fn path(&mut self, path: &Path) {
        self.bytes(path.as_os_str().as_encoded_bytes());
    }

    pub(super) fn bytes(&mut self, bytes: &[u8]) {
        self.u64(bytes.len() as u64);
        self.0.extend_from_slice(bytes);
    }

    /// `n` in LEB128: seven bits a byte, low bits first.
    pub(super) fn var(&mut self, mut n: u64) {
        while n >= 0x80 {
            self.0.push(n as u8 | 0x80);
            n >>= 7;
        }
        self.0.push(n as u8);
    }

    /// An mtime, then the ctime and the time seen as differences from it
    /// (zigzag: small either way).
    fn times(&mut self, mtime_ns: i64, ctime_ns: i64, seen_ns: i64) {
        let zigzag = |n: i64| ((n << 1) ^ (n >> 63)) as u64;
        self.var(zigzag(mtime_ns));
        self.var(zigzag(ctime_ns.wrapping_sub(mtime_ns)));
        self.var(zigzag(seen_ns.wrapping_sub(mtime_ns)));
    }

    /// `path` as the length it shares with `before`, then the rest.
    fn path_after(&mut self, before: &[u8], path: &[u8]) {
        let shared = before.iter().zip(path).take_while(|(a, b)| a == b).count();
        self.var(shared as u64);
        self.var((path.len() - shared) as u64);
        self.0.extend_from_slice(&path[shared..]);
    }

    pub(super) fn stat_entry(&mut self, entry: &StatEntry) {
        for n in [entry.dev, entry.ino, entry.size] {
            self.u64(n);
        }
        for n in [entry.mtime_ns, entry.ctime_ns, entry.seen_ns] {
            self.u64(n as u64);
        }
        self.0.extend_from_slice(entry.digest.as_bytes());
    }
}

pub(super) struct Decoder<'b>(pub(super) &'b [u8]);

impl<'b> Decoder<'b> {
    pub(super) fn take(&mut self, n: usize) -> Option<&'b [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    pub(super) fn byte(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    fn i64(&mut self) -> Option<i64> {
        Some(self.u64()? as i64)
    }

    /// A count of things each at least a byte long: no more than are left.
    pub(super) fn count(&mut self) -> Option<usize> {
        let n = usize::try_from(self.u64()?).ok()?;
        (n <= self.0.len()).then_some(n)
    }

    pub(super) fn bytes(&mut self) -> Option<&'b [u8]> {
        let n = usize::try_from(self.u64()?).ok()?;
        self.take(n)
    }

    pub(super) fn text(&mut self) -> Option<String> {
        String::from_utf8(self.bytes()?.to_vec()).ok()
    }

    pub(super) fn path(&mut self) -> Option<PathBuf> {
        use std::os::unix::ffi::OsStrExt;
        Some(PathBuf::from(std::ffi::OsStr::from_bytes(self.bytes()?)))
    }

    pub(super) fn var(&mut self) -> Option<u64> {
        let mut n = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.byte()?;
            // (The tenth byte holds the top bit alone.)
            if shift == 63 && byte > 1 {
                return None;
            }
            n |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(n);
            }
        }
        None
    }

    fn times(&mut self) -> Option<(i64, i64, i64)> {
        let unzigzag = |n: u64| ((n >> 1) as i64) ^ -((n & 1) as i64);
        let mtime_ns = unzigzag(self.var()?);
        let ctime_ns = mtime_ns.wrapping_add(unzigzag(self.var()?));
        let seen_ns = mtime_ns.wrapping_add(unzigzag(self.var()?));
        Some((mtime_ns, ctime_ns, seen_ns))
    }

    /// A path written by [`Encoder::path_after`] after `before`, which
    /// becomes it.
    fn path_after(&mut self, before: &mut Vec<u8>) -> Option<PathBuf> {
        use std::os::unix::ffi::OsStrExt;
        let shared = usize::try_from(self.var()?).ok()?;
        let rest = usize::try_from(self.var()?).ok()?;
        if shared > before.len() {
            return None;
        }
        before.truncate(shared);
        before.extend_from_slice(self.take(rest)?);
        Some(PathBuf::from(std::ffi::OsStr::from_bytes(before)))
    }

    pub(super) fn digest(&mut self) -> Option<Digest> {
        let bytes: [u8; 32] = self.take(32)?.try_into().ok()?;
        Some(Digest::from_hash(blake3::Hash::from_bytes(bytes)))
    }

    pub(super) fn stat_entry(&mut self) -> Option<StatEntry> {
        let (dev, ino, size) = (self.u64()?, self.u64()?, self.u64()?);
        let (mtime_ns, ctime_ns, seen_ns) = (self.i64()?, self.i64()?, self.i64()?);
        Some(StatEntry {
            dev,
            ino,
            size,
            mtime_ns,
            ctime_ns,
            digest: self.digest()?,
            seen_ns,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stage drafted into a proof while the last commands run watches
    /// its files as the stat cache has them once the run's end saves it:
    /// an output written moments before the draft is not left racy.
    #[test]
    fn a_drafted_stage_watches_its_files_as_the_end_saved_them() {
        use crate::fingerprint::StatCache;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let source = "[pipeline]\nname = \"draft\"\n[stages.a]\nrun = \"true\"\n\
            inputs = [\"in.txt\"]\noutputs = [\"out.txt\"]\n";
        let path = root.join("cairn.toml");
        std::fs::write(&path, source).unwrap();
        let (input, output) = (root.join("in.txt"), root.join("out.txt"));
        std::fs::write(&input, "in").unwrap();
        std::fs::write(&output, "out").unwrap();
        let manifest = crate::manifest::load_str(&path, source.to_owned(), None).unwrap();
        let dag = crate::graph::Dag::build(&manifest).unwrap();
        let mut ctx = Context::new(&manifest, &dag, None).unwrap();
        // Both hashed the moment they were written: racy.
        let entry = |path: &Path, bytes: &[u8]| {
            let stat = FileStat::from(&std::fs::metadata(path).unwrap());
            StatEntry::of(&stat, Digest::of(bytes), stat.mtime_ns.max(stat.ctime_ns))
        };
        ctx.stat = StatCache::from_entries([]);
        ctx.stat.learn(input.clone(), entry(&input, b"in"));
        ctx.stat.learn(output.clone(), entry(&output, b"out"));
        ctx.input_digests.insert(0, vec![Digest::of(b"in")]);
        let record = OutputRecord {
            name: "out.txt".into(),
            path: "out.txt".into(),
            kind: OutputKind::File,
            digest: Digest::of(b"out"),
            size: 3,
            executable: false,
            inline: true,
        };
        let used = HashMap::from([(0, (Digest::of(b"key"), vec![record]))]);
        let mut draft = ProofDraft::new(&ctx, dag.order());
        draft.add_used(&ctx, [0].into_iter(), &used).unwrap();
        draft.sort();
        // The end saves the cache a minute on.
        let saved_ns = now_ns() + 60_000_000_000;
        ctx.stat.take_updates(saved_ns);
        std::fs::write(manifest.lock_path(), "the lock").unwrap();
        let (proof, _) = draft.finish(&ctx, "the lock").unwrap();
        for file in [&input, &output] {
            let seen = proof.watched.iter().find_map(|watched| match watched {
                Watched::File(path, entry) if path == file => Some(entry.seen_ns),
                _ => None,
            });
            assert_eq!(seen, Some(saved_ns), "{}", file.display());
        }
    }

    #[test]
    fn the_root_hint_reads_root_in_the_pipeline_table_only() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let manifest = dir.path().join("cairn.toml");
        let at = |text: &str| root_hint(&manifest, text);
        let top = dir.path().canonicalize().unwrap();
        assert_eq!(at("[pipeline]\nname = \"x\"\n"), Some(top.clone()));
        assert_eq!(
            at("[pipeline]\nname = \"x\"\nroot = \"sub\" # here\n"),
            Some(top.join("sub"))
        );
        assert_eq!(
            at("[pipeline]\nname = \"x\"\n[stages.a]\nroot = \"sub\"\n"),
            Some(top.clone())
        );
        assert_eq!(at("[pipeline]\nroot = \"s\\u0075b\"\n"), None);
    }

    #[test]
    fn a_cut_or_foreign_body_decodes_to_nothing() {
        let entry = StatEntry {
            dev: 1,
            ino: 2,
            size: 3,
            mtime_ns: 4,
            ctime_ns: 5,
            digest: Digest::of(b"x"),
            seen_ns: 6,
        };
        let proof = Proof {
            root: PathBuf::from("/r"),
            stages: vec![("a".to_owned(), "local".to_owned())],
            env: vec![
                ("HOME".to_owned(), Some(Digest::of(b"/root"))),
                ("X".to_owned(), None),
            ],
            watched: vec![
                Watched::File(PathBuf::from("/r/a"), entry),
                Watched::Place {
                    path: PathBuf::from("/r/d"),
                    dev: 1,
                    ino: 9,
                },
            ],
        };
        let bytes = proof.encode();
        assert_eq!(Proof::decode(&bytes), Some(proof));
        for cut in 0..bytes.len() {
            assert_eq!(Proof::decode(&bytes[..cut]), None, "cut at {cut}");
        }
        let mut other = bytes.clone();
        other[7] ^= 1;
        assert_eq!(Proof::decode(&other), None);
    }

    /// Each path is watched once, compared by its bytes as it is sorted: a
    /// directory's listing check wins over the same directory as a place,
    /// a place spelled otherwise stays beside it, and a file seen two ways
    /// leaves the run without a proof.
    #[test]
    fn a_path_watched_twice_is_watched_once_unless_it_was_seen_two_ways() {
        let entry = |size| StatEntry {
            dev: 1,
            ino: 2,
            size,
            mtime_ns: 4,
            ctime_ns: 4,
            digest: Digest::of(b"x"),
            seen_ns: 9_000_000_000,
        };
        let dir = DirStat {
            dev: 1,
            ino: 3,
            mtime_ns: 4,
            ctime_ns: 4,
            seen_ns: 9_000_000_000,
        };
        let place = |path: &str| Watched::Place {
            path: PathBuf::from(path),
            dev: 1,
            ino: 3,
        };
        let mut watching = Watching::new(Path::new("/r"), 0);
        watching.watched.extend([
            Watched::Dir(PathBuf::from("/r/d/"), dir),
            Watched::File(PathBuf::from("/r/f"), entry(1)),
            Watched::Dir(PathBuf::from("/r/x"), dir),
            Watched::File(PathBuf::from("/r/f"), entry(1)),
        ]);
        for path in ["/r/d", "/r/x"] {
            watching.places.insert(PathBuf::from(path), place(path));
        }
        assert_eq!(
            watching.finish(),
            Ok(vec![
                place("/r/d"),
                Watched::Dir(PathBuf::from("/r/d/"), dir),
                Watched::File(PathBuf::from("/r/f"), entry(1)),
                Watched::Dir(PathBuf::from("/r/x"), dir),
            ])
        );
        let seen_later = StatEntry {
            seen_ns: 10_000_000_000,
            ..entry(1)
        };
        let mut watching = Watching::new(Path::new("/r"), 0);
        watching.watched.extend([
            Watched::File(PathBuf::from("/r/f"), entry(1)),
            Watched::File(PathBuf::from("/r/f"), seen_later),
        ]);
        assert_eq!(
            watching.finish(),
            Ok(vec![Watched::File(PathBuf::from("/r/f"), entry(1))])
        );
        let mut watching = Watching::new(Path::new("/r"), 0);
        watching.watched.extend([
            Watched::File(PathBuf::from("/r/f"), entry(1)),
            Watched::File(PathBuf::from("/r/f"), entry(2)),
        ]);
        assert_eq!(
            watching.finish(),
            Err("/r/f was seen two ways during the run".to_owned())
        );
    }

    /// A proof's encoding is pinned: a change to it must bump `FORMAT`
    /// (a proof kept by an older cairn is then not read).
    #[test]
    fn a_proofs_encoding_is_pinned() {
        let proof = Proof {
            root: PathBuf::from("/r"),
            stages: vec![("a".to_owned(), "local".to_owned())],
            env: vec![("X".to_owned(), None)],
            watched: vec![
                Watched::File(
                    PathBuf::from("/r/in/a"),
                    StatEntry {
                        dev: 2049,
                        ino: 300,
                        size: 5,
                        mtime_ns: 1_000,
                        ctime_ns: 1_000,
                        digest: Digest::of(b"x"),
                        seen_ns: 10_000_000_000,
                    },
                ),
                Watched::Place {
                    path: PathBuf::from("/r/in"),
                    dev: 2049,
                    ino: 7,
                },
            ],
        };
        assert_eq!(hex(&proof.encode()), PINNED);
    }

    const PINNED: &str = "636670726f6f663302000000000000002f72010000000000000001000000000000006105000000000000006c6f63616c01000000000000000100000000000000580002000000000000000000072f722f696e2f618110ac0205d00f00b080dfc04a00020500811007";

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Paths after the ones before them, numbers as varints (times before
    /// 1970 and the largest too), and a digest only for a racy file: what
    /// the check reads comes back, and a file takes a few dozen bytes.
    #[test]
    fn a_proof_of_many_files_is_compact_and_decodes_to_what_a_check_reads() {
        let second = 1_000_000_000;
        let settled = |n: u64| StatEntry {
            dev: 2049,
            ino: 1_000_000 + n,
            size: 20 + n % 7,
            mtime_ns: 1_764_000_000 * second + n as i64,
            ctime_ns: 1_764_000_000 * second + n as i64,
            digest: Digest::of(&n.to_le_bytes()),
            seen_ns: 1_764_000_100 * second,
        };
        let racy = StatEntry {
            mtime_ns: -5 * second,
            ctime_ns: i64::MAX,
            seen_ns: i64::MIN,
            dev: u64::MAX,
            ..settled(0)
        };
        assert!(racy.racy() && !settled(1).racy());
        let mut watched: Vec<Watched> = (0..10_000u64)
            .map(|n| Watched::File(PathBuf::from(format!("/work/tree/in/{n}.txt")), settled(n)))
            .collect();
        watched.push(Watched::File(PathBuf::from("/work/tree/racy"), racy));
        watched.push(Watched::Dir(
            PathBuf::from("/work/tree/out"),
            DirStat {
                dev: 1,
                ino: 2,
                mtime_ns: -1,
                ctime_ns: 3,
                seen_ns: 4,
            },
        ));
        watched.push(Watched::Object {
            path: PathBuf::from("/work/cache/objects/ab"),
            dev: 1,
            ino: u64::MAX,
            size: 0,
        });
        let proof = Proof {
            root: PathBuf::from("/work/tree"),
            stages: Vec::new(),
            env: Vec::new(),
            watched,
        };
        let bytes = proof.encode();
        assert!(bytes.len() < 10_003 * 40, "{} bytes", bytes.len());
        let decoded = Proof::decode(&bytes).unwrap();
        let unread = Digest::from_hash(blake3::Hash::from_bytes([0; 32]));
        let expected: Vec<Watched> = proof
            .watched
            .iter()
            .cloned()
            .map(|w| match w {
                Watched::File(path, entry) if !entry.racy() => Watched::File(
                    path,
                    StatEntry {
                        digest: unread,
                        ..entry
                    },
                ),
                other => other,
            })
            .collect();
        assert_eq!(decoded.watched, expected);
        assert_eq!(decoded.encode(), bytes);
    }

    /// A proof of thousands of paths is checked in shares side by side: a
    /// change in any share fails it, and a racy file found unchanged in any
    /// share is trusted from when it was seen.
    #[test]
    fn a_proof_checked_in_shares_finds_a_change_in_any_and_renews_racy_files_in_all() {
        let dir = tempfile::tempdir().unwrap();
        let paths: Vec<PathBuf> = (0..2_000)
            .map(|n| dir.path().join(format!("{n:05}")))
            .collect();
        for (n, path) in paths.iter().enumerate() {
            std::fs::write(path, n.to_string()).unwrap();
        }
        // Entries 3 and 1,999 (the first share and the last) seen as the
        // files were written: racy. The others seen a minute later.
        let racy = [3, 1_999];
        let watched = || -> Vec<Watched> {
            paths
                .iter()
                .enumerate()
                .map(|(n, path)| {
                    let meta = std::fs::metadata(path).unwrap();
                    let digest = hash_file(path, meta.len(), false).unwrap();
                    let written = meta.mtime() * 1_000_000_000 + meta.mtime_nsec();
                    let seen_ns = if racy.contains(&n) {
                        written
                    } else {
                        written + 60 * 1_000_000_000
                    };
                    Watched::File(path.clone(), StatEntry::new(&meta, digest, seen_ns))
                })
                .collect()
        };
        let seen = |watched: &[Watched], n: usize| match &watched[n] {
            Watched::File(_, entry) => entry.seen_ns,
            other => panic!("{other:?}"),
        };
        let listed = HashMap::new();
        for threads in [1, 2, 3] {
            let mut all = watched();
            let before: Vec<i64> = racy.iter().map(|&n| seen(&all, n)).collect();
            let settled = seen(&all, 1_000);
            assert!(matches!(
                check_in_shares(&mut all, &listed, threads),
                Checked::Holds { renewed: true }
            ));
            for (&n, before) in racy.iter().zip(before) {
                assert!(
                    seen(&all, n) > before,
                    "entry {n} not renewed ({threads} shares)"
                );
            }
            assert_eq!(
                seen(&all, 1_000),
                settled,
                "a settled entry is left as it was"
            );
        }
        // One file changed at a time, in the last share, then in the first:
        // the proof fails, and gives the `stat` of every other file but
        // the racy ones, which are not hashed once a `stat` differs. The
        // files after the difference are looked at all the same: the run
        // that follows looks at each.
        for changed in [1_990, 10] {
            let mut all = watched();
            std::fs::write(&paths[changed], "a longer text than before").unwrap();
            for threads in [1, 2, 3] {
                let Checked::Fails {
                    why,
                    stated,
                    changed: found_changed,
                } = check_in_shares(&mut all, &listed, threads)
                else {
                    panic!("the proof held after a change ({threads} shares)");
                };
                assert_eq!(why, format!("{} changed", paths[changed].display()));
                // The file that changed is named, for its readers to be
                // weighed first.
                assert_eq!(found_changed.as_ref(), Some(&paths[changed]));
                // Handed on: every file found unchanged, before the
                // difference and after it, never it nor a racy one.
                for (n, path) in paths.iter().enumerate() {
                    let handed_on = n != changed && !racy.contains(&n);
                    assert_eq!(stated.contains(path), handed_on, "{n} ({threads} shares)");
                }
                assert_eq!(stated.len(), paths.len() - 1 - racy.len());
            }
        }
        // A racy file whose `stat` held but whose bytes are not the ones
        // the proof vouched for (written again within the tick): found on
        // the second look, and not handed on; the other racy file, which
        // held, is.
        let mut all = watched();
        if let Watched::File(_, entry) = &mut all[3] {
            entry.digest = Digest::of(b"what it held before");
        }
        let Checked::Fails {
            why,
            stated,
            changed,
        } = check_in_shares(&mut all, &listed, 2)
        else {
            panic!("the proof held with a racy file rewritten");
        };
        assert_eq!(why, format!("{} changed", paths[3].display()));
        assert_eq!(changed.as_ref(), Some(&paths[3]));
        assert!(!stated.contains(&paths[3]) && stated.contains(&paths[1_999]));
        assert_eq!(stated.len(), paths.len() - 1);
        // A directory the files lie in that is not the one the proof saw:
        // nothing is handed on.
        let mut all = watched();
        all.push(Watched::Place {
            path: dir.path().to_owned(),
            dev: 0,
            ino: 0,
        });
        let Checked::Fails { stated, .. } = check_in_shares(&mut all, &listed, 2) else {
            panic!("the proof held with its directory swapped");
        };
        assert!(stated.is_empty());
        // A share only `stat`s: its racy files whose `stat` held are left
        // for the second look, the others vouched for; once another share
        // has found a difference, it still looks at every file (the run
        // takes what it found) and at no directory.
        let all = watched();
        let share = check_share(&all, 0, &AtomicBool::new(false));
        assert_eq!(share.differs, None);
        let racy_found: Vec<usize> = share.racy.iter().map(|(n, _)| *n).collect();
        assert_eq!(racy_found, racy);
        assert_eq!(share.stated.len(), paths.len() - racy.len());
        let stopped = check_share(&all, 0, &AtomicBool::new(true));
        assert_eq!(stopped.differs, None);
        assert_eq!(stopped.stated.len(), share.stated.len());
    }
}
