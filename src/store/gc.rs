//! Collecting garbage: the stored objects, tree listings, inline objects
//! and temporary files that no live output (see [`super::live`]) needs.
//!
//! Older results whose objects are dropped stop counting as cache hits (a
//! hit requires its objects), so nothing invalid is ever reused.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use super::StoreError;
use super::clearing::remove_path;
use super::ledger::Ledger;
use super::live::live_outputs;
use super::objects::ObjectStore;
use super::output_record::OutputKind;
use crate::fingerprint::Digest;
use crate::manifest::Manifest;

/// What a collection removed (or, dry, would remove).
#[derive(Debug, Default)]
pub struct Collected {
    /// Files in `objects/`, `trees/` and `tmp/` (there, directories too),
    /// with their sizes.
    pub files: Vec<(PathBuf, u64)>,
    pub inline_objects: usize,
    /// Bytes of the files and the inline objects.
    pub bytes: u64,
    /// Objects still referenced (files and inline).
    pub kept: usize,
}

/// Removes what nothing live needs from the store under `cache`, or with
/// `dry_run` only lists it. The caller holds the workspace lock.
pub fn collect_garbage(
    manifest: &Manifest,
    ledger: &Ledger,
    cache: &Path,
    dry_run: bool,
) -> Result<Collected, StoreError> {
    let store = ObjectStore::new(cache);
    let mut live_objects: HashSet<Digest> = HashSet::new();
    let mut live_trees: HashSet<Digest> = HashSet::new();
    let mut live_inline: HashSet<Digest> = HashSet::new();
    for output in live_outputs(manifest, ledger)? {
        if output.inline {
            live_inline.insert(output.digest);
            continue;
        }
        if output.kind == OutputKind::Dir {
            live_trees.insert(output.digest);
        }
        live_objects.extend(store.referenced(&output));
    }

    let mut dead: Vec<(PathBuf, u64)> = Vec::new();
    for shard in read_dir(&store.objects_dir())? {
        for object in read_dir(&shard)? {
            let name = format!(
                "{}{}",
                shard.file_name().unwrap_or_default().to_string_lossy(),
                object.file_name().unwrap_or_default().to_string_lossy()
            );
            let live = name
                .parse::<Digest>()
                .is_ok_and(|d| live_objects.contains(&d));
            if !live {
                dead.push((object.clone(), size(&object)));
            }
        }
    }
    for tree in read_dir(&store.trees_dir())? {
        let stem = tree
            .file_stem()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        if !stem
            .parse::<Digest>()
            .is_ok_and(|d| live_trees.contains(&d))
        {
            dead.push((tree.clone(), size(&tree)));
        }
    }
    for temp in read_dir(&store.tmp_dir())? {
        dead.push((temp.clone(), size(&temp)));
    }

    let (inline_objects, inline_bytes) = ledger.drop_inline_objects(&live_inline, dry_run)?;
    if !dry_run {
        let tmp = store.tmp_dir();
        let mut removed = Vec::with_capacity(dead.len());
        for (path, size) in dead {
            // (A directory only in the temporary area: a stale output
            // cleared out of the way by a run killed before it removed it.)
            match remove_path(&path) {
                Ok(()) => removed.push((path, size)),
                // What cannot be removed there (a file another user owns in
                // a directory a stale output held, say) is left, and
                // reported: the rest is still collected, now and next time.
                Err(e) if path.starts_with(&tmp) => {
                    tracing::warn!("could not remove `{}`: {e}", path.display());
                }
                Err(e) => return Err(StoreError::io(&path, e)),
            }
        }
        dead = removed;
    }
    Ok(Collected {
        bytes: dead.iter().map(|(_, s)| s).sum::<u64>() + inline_bytes,
        files: dead,
        inline_objects,
        kept: live_objects.len() + live_inline.len(),
    })
}

fn read_dir(dir: &Path) -> Result<Vec<PathBuf>, StoreError> {
    match std::fs::read_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(StoreError::io(dir, e)),
        Ok(entries) => {
            let mut paths: Vec<PathBuf> =
                entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
            paths.sort();
            Ok(paths)
        }
    }
}

/// The bytes of a file, or of every file under a directory.
fn size(path: &Path) -> u64 {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => std::fs::read_dir(path)
            .map(|entries| entries.flatten().map(|entry| size(&entry.path())).sum())
            .unwrap_or(0),
        Ok(meta) => meta.len(),
        Err(_) => 0,
    }
}
