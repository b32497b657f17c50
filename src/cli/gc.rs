//! `cairn gc`: drop stored objects that no current result references.
//!
//! Live (see `store::live_outputs`): the objects of each stage's newest
//! successful result and of the result its lock file names, for this
//! pipeline and for every other pipeline sharing the project root's
//! `cache/`. Older results whose objects are dropped stop counting as cache
//! hits (a hit requires its objects), so nothing invalid is ever reused.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use super::args::{GcArgs, Global};
use super::error::CliError;
use super::workspace;
use crate::fingerprint::Digest;
use crate::store::{
    Ledger, ObjectStore, OutputKind, PipelineId, StoreError, WhenLocked, WorkspaceLock,
    live_outputs,
};

pub fn gc(global: &Global, args: &GcArgs) -> Result<(), CliError> {
    let loaded = workspace::load(global)?;
    let cache = loaded.manifest.cache_dir();
    if !cache.exists() {
        outln!("nothing to collect: no cache at {}", cache.display());
        return Ok(());
    }
    let _lock = WorkspaceLock::acquire(&cache, WhenLocked::Wait, |holder| {
        let who = holder.map(|p| format!(" (pid {p})")).unwrap_or_default();
        errln!("waiting for another cairn process{who} to release the workspace…");
    })?;
    let ledger = Ledger::open(&cache, &PipelineId::of(&loaded.manifest))?;
    let store = ObjectStore::new(&cache);
    let mut live_objects: HashSet<Digest> = HashSet::new();
    let mut live_trees: HashSet<Digest> = HashSet::new();
    let mut live_inline: HashSet<Digest> = HashSet::new();
    for output in live_outputs(&loaded.manifest, &ledger)? {
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

    let (inline_count, inline_bytes) = ledger.drop_inline_objects(&live_inline, args.dry_run)?;
    let bytes: u64 = dead.iter().map(|(_, s)| s).sum::<u64>() + inline_bytes;
    for (path, _) in &dead {
        if args.dry_run {
            outln!("would remove {}", path.display());
        } else {
            std::fs::remove_file(path).map_err(|e| StoreError::io(path, e))?;
        }
    }
    let verb = if args.dry_run { "would free" } else { "freed" };
    outln!(
        "{verb} {} file(s) and {inline_count} inline object(s), {bytes} bytes; kept {} object(s)",
        dead.len(),
        live_objects.len() + live_inline.len()
    );
    Ok(())
}

fn read_dir(dir: &Path) -> Result<Vec<PathBuf>, CliError> {
    match std::fs::read_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(StoreError::io(dir, e).into()),
        Ok(entries) => {
            let mut paths: Vec<PathBuf> =
                entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
            paths.sort();
            Ok(paths)
        }
    }
}

fn size(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}
