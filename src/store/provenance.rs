//! Lineage: the chain of recorded results behind an output, back to source
//! files.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use super::StoreError;
use super::current::{Current, current_results};
use super::ledger::Ledger;
use super::objects::OutputRecord;
use crate::fingerprint::Digest;
use crate::graph::Dag;
use crate::manifest::{EnvValue, Manifest, OutputIndex, ProjectPath};

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
    dag: &Dag,
    ledger: &Ledger,
    target: &str,
) -> Result<Lineage, LineageError> {
    let current = current_results(manifest, ledger)?;
    let writers = OutputIndex::new(&manifest.stages);
    let writer_of = |path: &str| {
        writers
            .producer_of(&ProjectPath::new(path.to_owned()))
            .map(|(s, _)| manifest.stages[s].name.clone())
    };
    let start = match manifest.stage(target) {
        Some(stage) => stage.name.clone(),
        None => writer_of(target.trim_start_matches("./").trim_end_matches('/'))
            .ok_or_else(|| LineageError::UnknownTarget(target.to_owned()))?,
    };

    let mut stages: Vec<StageRecord> = Vec::new();
    let mut sources: BTreeMap<String, InputRecord> = BTreeMap::new();
    let mut queue = vec![start];
    let mut seen = std::collections::HashSet::new();
    while let Some(name) = queue.pop() {
        if !seen.insert(name.clone()) {
            continue;
        }
        let Some(Current::Found(record)) = current.get(&name) else {
            return Err(LineageError::NoResult(name));
        };
        let key = ledger.key(record.id)?;
        let stage = manifest
            .stage(&name)
            .expect("stages come from the manifest");
        let mut inputs = Vec::new();
        let mut params = BTreeMap::new();
        for (component, value) in &key.components {
            if let Some(path) = component.strip_prefix("input:") {
                let produced_by = writer_of(path);
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
    // Upstream first: the graph's order.
    let mut rank: HashMap<&str, usize> = HashMap::new();
    for (r, &i) in dag.order().iter().enumerate() {
        rank.insert(manifest.stages[i].name.as_str(), r);
    }
    stages.sort_by_key(|s| rank[s.stage.as_str()]);
    Ok(Lineage {
        target: target.to_owned(),
        stages,
        sources: sources.into_values().collect(),
    })
}
