//! `cairn import STAGE FILE`: outcomes made before cairn, taken into a
//! per-item stage (see [`crate::schedule::import`]).

use super::args::{Global, ImportArgs};
use super::error::CliError;
use super::workspace;
use crate::schedule::{self, Context};
use crate::store::{Ledger, PipelineId};

pub fn import(global: &Global, args: &ImportArgs) -> Result<(), CliError> {
    let loaded = workspace::load(global)?;
    let manifest = &loaded.manifest;
    let i = (manifest.stages.iter())
        .position(|stage| stage.name == args.stage)
        .ok_or_else(|| loaded.unknown_stage(&args.stage))?;
    let _lock = workspace::hold(manifest, false)?;
    let ledger = Ledger::open(&manifest.cache_dir(), &PipelineId::of(manifest))?;
    let mut ctx = Context::new(manifest, &loaded.dag, Some(ledger))?;
    ctx.explain = false;
    let invocation = super::shared_cache::invocation();
    let imported = schedule::import(&mut ctx, i, &args.outcomes, &invocation)?;
    let classes = (imported.by_class.iter())
        .map(|(class, n)| format!("{n} {class}"))
        .collect::<Vec<_>>()
        .join(", ");
    outln!(
        "imported {} outcome(s) of `{}` from {} (sha256:{}){}",
        imported.recorded(),
        args.stage,
        args.outcomes.display(),
        imported.sha256,
        if classes.is_empty() {
            String::new()
        } else {
            format!(": {classes}")
        }
    );
    if !imported.kept.is_empty() {
        let shown: Vec<&str> = imported.kept.iter().take(5).map(String::as_str).collect();
        let more = imported.kept.len().saturating_sub(shown.len());
        outln!(
            "kept {} item(s) that have an outcome under their fingerprint already ({}{}): `cairn run --force {}/ITEM` runs one again",
            imported.kept.len(),
            shown.join(", "),
            if more > 0 {
                format!(", … {more} more")
            } else {
                String::new()
            },
            args.stage
        );
    }
    if !imported.upstream_pending.is_empty() {
        errln!(
            "warning: upstream stage(s) {} would run first; the items were planned from their outputs as the workspace holds them, and an item whose inputs a re-run changes runs again",
            imported.upstream_pending.join(", ")
        );
    }
    outln!(
        "the next `cairn run` reuses them while each item's stage code and inputs are unchanged; `cairn run --reverify {}` runs them again",
        args.stage
    );
    Ok(())
}
