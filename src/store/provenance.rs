//! Lineage: the chain of recorded results behind an output, back to source
//! files.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use super::StoreError;
use super::ledger::{Ledger, ResultRecord};
use super::lockfile::LockFile;
use super::objects::OutputRecord;
use crate::fingerprint::Digest;
use crate::manifest::{EnvValue, Manifest};

/// One stage's recorded result, as it entered the chain.
#[derive(Debug, Clone, Serialize)]
pub struct StageRecord {
    pub stage: String,
    pub fingerprint: Digest,
    pub command: String,
    pub run_id: i64,
    pub started_ms: i64,
    pub finished_ms: i64,
    /// Param name → value, as hashed.
    pub params: BTreeMap<String, String>,
    /// Names of the environment variables the stage declares (never
    /// their values).
    pub env: Vec<String>,
    pub inputs: Vec<InputRecord>,
    pub outputs: Vec<OutputRecord>,
    pub version: Option<String>,
    /// The cairn that recorded it.
    pub tool: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct InputRecord {
    pub path: String,
    pub digest: Digest,
    /// The stage whose output it is; `None` for a source file.
    pub produced_by: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Lineage {
    pub target: String,
    /// Upstream first, the target's stage last.
    pub stages: Vec<StageRecord>,
    /// Files no stage produces that the chain read.
    pub sources: Vec<InputRecord>,
}

#[derive(Debug, thiserror::Error)]
pub enum LineageError {
    #[error("`{0}` is neither a stage nor an output of one")]
    UnknownTarget(String),
    #[error("stage `{0}` has no successful result to trace; run it first")]
    NoResult(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The chain behind `target`, a stage name or an output path (a file inside
/// an output directory counts).
pub fn lineage(
    manifest: &Manifest,
    ledger: &Ledger,
    target: &str,
) -> Result<Lineage, LineageError> {
    let lock = std::fs::read_to_string(manifest.lock_path())
        .ok()
        .and_then(|text| LockFile::parse(&text).ok());
    let latest = ledger.latest_ok_all()?;
    let current = |stage: &str| -> Result<Option<ResultRecord>, StoreError> {
        match lock.as_ref().and_then(|l| l.stages.get(stage)) {
            Some(entry) => ledger.find_ok(stage, &entry.fingerprint),
            None => Ok(latest.get(stage).cloned()),
        }
    };

    let start = match manifest.stage(target) {
        Some(stage) => stage.name.clone(),
        None => {
            let wanted = target.trim_start_matches("./").trim_end_matches('/');
            manifest
                .stages
                .iter()
                .find(|s| {
                    s.outputs.iter().any(|o| {
                        let p = o.path.as_str();
                        wanted == p || wanted.starts_with(&format!("{p}/"))
                    })
                })
                .map(|s| s.name.clone())
                .ok_or_else(|| LineageError::UnknownTarget(target.to_owned()))?
        }
    };

    // Which stage writes which path, by output.
    let writer: HashMap<&str, &str> = manifest
        .stages
        .iter()
        .flat_map(|s| {
            s.outputs
                .iter()
                .map(move |o| (o.path.as_str(), s.name.as_str()))
        })
        .collect();

    let mut stages: Vec<StageRecord> = Vec::new();
    let mut sources: BTreeMap<String, InputRecord> = BTreeMap::new();
    let mut queue = vec![start.clone()];
    let mut seen = std::collections::HashSet::new();
    while let Some(name) = queue.pop() {
        if !seen.insert(name.clone()) {
            continue;
        }
        let record = current(&name)?.ok_or_else(|| LineageError::NoResult(name.clone()))?;
        let key = ledger.key(record.id)?;
        let stage = manifest
            .stage(&name)
            .expect("stages come from the manifest");
        let mut inputs = Vec::new();
        let mut params = BTreeMap::new();
        for (component, value) in &key.components {
            if let Some(path) = component.strip_prefix("input:") {
                let produced_by = path
                    .char_indices()
                    .filter(|(_, c)| *c == '/')
                    .map(|(i, _)| &path[..i])
                    .chain(std::iter::once(path))
                    .find_map(|candidate| writer.get(candidate).map(|w| (*w).to_owned()));
                let input = InputRecord {
                    path: path.to_owned(),
                    digest: value.digest,
                    produced_by: produced_by.clone(),
                };
                match &produced_by {
                    Some(upstream) => queue.push(upstream.clone()),
                    None => {
                        sources.insert(path.to_owned(), input.clone());
                    }
                }
                inputs.push(input);
            } else if let Some(param) = component.strip_prefix("param:") {
                params.insert(param.to_owned(), value.detail.clone());
            }
        }
        stages.push(StageRecord {
            stage: name.clone(),
            fingerprint: record.fingerprint,
            command: record.command.clone(),
            run_id: record.run_id,
            started_ms: record.started_ms,
            finished_ms: record.finished_ms,
            params,
            env: stage
                .env
                .iter()
                .map(|(name, value)| match value {
                    EnvValue::Literal(_) => name.clone(),
                    EnvValue::PassThrough => format!("{name} (passed through)"),
                })
                .collect(),
            inputs,
            outputs: record.outputs.clone(),
            version: stage.version.clone(),
            tool: format!("cairn {}", env!("CARGO_PKG_VERSION")),
        });
    }
    // Upstream first: the manifest's dependency order.
    let rank: HashMap<&str, usize> = manifest
        .stages
        .iter()
        .enumerate()
        .map(|(i, s)| (s.name.as_str(), i))
        .collect();
    stages.sort_by_key(|s| rank[s.stage.as_str()]);
    let mut ordered = Vec::with_capacity(stages.len());
    let mut placed = std::collections::HashSet::new();
    while ordered.len() < stages.len() {
        let before = ordered.len();
        for stage in &stages {
            if placed.contains(&stage.stage) {
                continue;
            }
            let ready = stage
                .inputs
                .iter()
                .all(|i| i.produced_by.as_ref().is_none_or(|p| placed.contains(p)));
            if ready {
                placed.insert(stage.stage.clone());
                ordered.push(stage.clone());
            }
        }
        if ordered.len() == before {
            break;
        }
    }
    Ok(Lineage {
        target: target.to_owned(),
        stages: ordered,
        sources: sources.into_values().collect(),
    })
}
