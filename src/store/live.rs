//! What `gc` must keep: the outputs every pipeline of the project root
//! still needs.
//!
//! | pipeline | live |
//! |---|---|
//! | the one collecting (its manifest loaded) | for each stage in the manifest: the result its lock-file entry names and its newest successful result; every output its items recorded |
//! | every other pipeline recorded in the ledger | for each stage it ever ran: its newest successful result and the result its lock file (beside its manifest, if still there) names; every output its items recorded |
//!
//! Other pipelines' manifests are not loaded (they may not even parse with
//! this cairn), so their live set is the conservative one: a stage they
//! dropped stays live until they collect themselves.

use super::StoreError;
use super::current::{Current, current_results};
use super::ledger::{Ledger, PipelineId};
use super::lockfile::LockFile;
use super::output_record::OutputRecord;
use crate::manifest::{Manifest, lock_path_of};

/// Every output record that must stay restorable, over all pipelines.
pub fn live_outputs(manifest: &Manifest, ledger: &Ledger) -> Result<Vec<OutputRecord>, StoreError> {
    let mut live = Vec::new();
    let latest = ledger.latest_ok_all()?;
    let current = current_results(manifest, ledger)?;
    for stage in &manifest.stages {
        if let Some(record) = latest.get(&stage.name) {
            live.extend(record.outputs.iter().cloned());
        }
        if let Some(Current::Found(record)) = current.get(&stage.name) {
            live.extend(record.outputs.iter().cloned());
        }
        // What per-item stages' items wrote stays restorable, item by item.
        if stage
            .foreach
            .as_ref()
            .is_some_and(|f| !f.item_outputs.is_empty())
        {
            live.extend(ledger.item_outputs(&stage.name)?);
        }
    }
    for other in ledger.pipelines()? {
        if other.name != ledger.pipeline().name {
            live.extend(other_pipeline_live(ledger, &other, &manifest.root)?);
        }
    }
    Ok(live)
}

fn other_pipeline_live(
    ledger: &Ledger,
    other: &PipelineId,
    root: &std::path::Path,
) -> Result<Vec<OutputRecord>, StoreError> {
    let view = ledger.for_pipeline(other)?;
    let mut live: Vec<OutputRecord> = view
        .latest_ok_all()?
        .into_values()
        .flat_map(|record| record.outputs)
        .collect();
    // Unverified on purpose: even a hand-edited lock's results stay live.
    let lock = std::fs::read_to_string(lock_path_of(&other.manifest_path(root)))
        .ok()
        .and_then(|text| LockFile::parse(&text).ok());
    for (stage, entry) in lock.iter().flat_map(|lock| &lock.stages) {
        if let Some(record) = view.find_ok(stage, &entry.fingerprint)? {
            live.extend(record.outputs);
        }
    }
    live.extend(view.all_item_outputs()?);
    Ok(live)
}
