//! `uses = "lineage"`: each frozen item's chain of items, read from the
//! workspace's ledger (so it runs here, at the command line layer, as
//! `cairn builtin lineage@VERSION`). The stage's process is told the
//! manifest and profile it runs under (`CAIRN_MANIFEST`, `CAIRN_PROFILE`);
//! it reads the ledger and writes nothing but its output.
//!
//! The output holds, per frozen ID, the chain `cairn provenance
//! FREEZE/items/ID` shows, without times: the same chain gives the same
//! bytes, so a bundle that carries it stays reproducible.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;

use super::args::Global;
use super::workspace;
use crate::builtins::{BuiltinError, Invocation};
use crate::release::format::{FreezeManifest, MANIFEST_FILE};
use crate::schedule::{self, ItemTracer, MANIFEST_VAR, PROFILE_VAR};
use crate::store::items_by_content;

pub fn run(invocation: &Invocation) -> Result<String, BuiltinError> {
    let failed = |message: String| BuiltinError::Failed(message);
    let manifest = std::env::var_os(MANIFEST_VAR).ok_or_else(|| {
        failed(format!(
            "`{MANIFEST_VAR}` is not set: `lineage` runs as a stage of a pipeline"
        ))
    })?;
    let global = Global {
        file: Some(PathBuf::from(manifest)),
        profile: std::env::var(PROFILE_VAR).ok(),
        verbose: 0,
        quiet: true,
    };
    let loaded = workspace::load(&global).map_err(|e| failed(e.to_string()))?;
    let freeze = invocation.input("freeze")?;
    let text = std::fs::read_to_string(freeze.join(MANIFEST_FILE))
        .map_err(|e| failed(format!("{}: {e}", freeze.join(MANIFEST_FILE).display())))?;
    let frozen: FreezeManifest = serde_json::from_str(&text).map_err(|e| {
        failed(format!(
            "`{}` is not a freeze manifest: {e}",
            freeze.join(MANIFEST_FILE).display()
        ))
    })?;
    let mut ctx = loaded.read_context().map_err(|e| failed(e.to_string()))?;
    let every = vec![true; loaded.manifest.stages.len()];
    schedule::evaluate(&mut ctx, &every, &HashSet::new())
        .map_err(|e| failed(schedule::with_causes(&e)))?;
    let tracer = ItemTracer::new(&ctx);
    let mut items = BTreeMap::new();
    let mut untraced = Vec::new();
    for id in frozen.items.keys() {
        let target = format!("{}/items/{id}", freeze.display());
        let chain = tracer.trace(&target).map_err(|e| failed(e.to_string()))?;
        if chain.is_empty() {
            untraced.push(id.as_str());
        }
        if let Some(step) = chain.iter().find(|s| s.class.is_none()) {
            // The chain would not be the one the freeze was made from.
            return Err(failed(format!(
                "`{id}`: item `{}` of `{}` has no outcome under its inputs as they are now; run the stages before it",
                step.key, step.stage
            )));
        }
        items.insert(id.clone(), items_by_content(&chain));
    }
    let lineage = serde_json::json!({
        "pipeline": loaded.manifest.name,
        "freeze": { "name": frozen.name, "version": frozen.version, "semantic_digest": frozen.semantic_digest },
        "items": items,
    });
    let mut bytes = serde_json::to_vec_pretty(&lineage).map_err(|e| failed(e.to_string()))?;
    bytes.push(b'\n');
    crate::release::write_atomic(&invocation.output("lineage")?, &bytes)?;
    let mut summary = format!(
        "the lineage of {} frozen items",
        frozen.items.len() - untraced.len()
    );
    if !untraced.is_empty() {
        summary.push_str(&format!(
            "; {} no per-item stage wrote (e.g. `{}`)",
            untraced.len(),
            untraced[0]
        ));
    }
    Ok(summary)
}
