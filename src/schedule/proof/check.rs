//! Checking a proof: every variable and path against what it saw, by
//! `stat`, in a few shares side by side when there are many.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use super::record::{Proof, Watched};
use crate::file_stat::{FileStat, Found, OpenDir, Stated, lstat_in_dir, stat_in_dir};
use crate::fingerprint::{Digest, hash_file, now_ns};
use crate::side_by_side::{in_shares, shares_for};

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
pub(super) fn check_in_shares(
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
pub(super) struct Share {
    /// The index of the share's first difference.
    pub(super) differs: Option<usize>,
    /// Each file found as the proof saw it and not racy: its index, and
    /// how it was found.
    pub(super) stated: Vec<(usize, Found)>,
    /// The same of each racy file or directory whose `stat` held, to be
    /// hashed or listed again.
    pub(super) racy: Vec<(usize, Found)>,
    /// A directory a path lies in is not the one the proof saw.
    pub(super) place_differs: bool,
}

/// `stat`s each of `watched` (from index `first` of the proof's) in turn
/// (see [`Proof::check`]). Once a difference is found (here, or in another
/// share: `differs`) the proof fails: the files are still looked at, for
/// each found unchanged to be handed on (the run looks at every one), and
/// the directories the paths lie in, but no other directory or stored
/// object.
pub(super) fn check_share(watched: &[Watched], first: usize, differs: &AtomicBool) -> Share {
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
}
