//! `cairn gc`: drop stored objects that no current result references (what
//! is live, and how it is collected: `store::collect_garbage`).

use super::args::{GcArgs, Global};
use super::error::CliError;
use super::workspace;
use crate::store::{Ledger, PipelineId, WhenLocked, WorkspaceLock, collect_garbage};

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
    let collected = collect_garbage(&loaded.manifest, &ledger, &cache, args.dry_run)?;
    if args.dry_run {
        for (path, _) in &collected.files {
            outln!("would remove {}", path.display());
        }
    }
    let verb = if args.dry_run { "would free" } else { "freed" };
    outln!(
        "{verb} {} file(s) and {} inline object(s), {} bytes; kept {} object(s)",
        collected.files.len(),
        collected.inline_objects,
        collected.bytes,
        collected.kept
    );
    Ok(())
}
