//! Lineage: the chain of recorded results behind an output, back to source
//! files.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use super::StoreError;
use super::current::{Current, current_results};
use super::ledger::Ledger;
use super::output_record::OutputRecord;
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
    /// When an item wrote the target: that item first, then the items of
    /// per-item stages whose files it read, and theirs.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub items: Vec<ItemStep>,
}

/// One item's outcome in a chain, under the fingerprint its inputs give
/// today.
#[derive(Debug, Clone, Serialize)]
pub struct ItemStep {
    pub stage: String,
    pub key: String,
    pub fingerprint: Digest,
    /// The fingerprint of the stage's code it ran under.
    pub code: Digest,
    /// Its outcome (`ok`, a verdict, …); `None`: none under these inputs,
    /// it has not run since they changed.
    pub class: Option<String>,
    pub attempts: u32,
    pub run_id: Option<i64>,
    pub started_ms: Option<i64>,
    pub finished_ms: Option<i64>,
    /// Its log file.
    pub log: Option<String>,
    /// Where its outcome came from when cairn did not make it here:
    /// `remote:URL`, or `import:sha256:HEX` (`cairn import`, with the
    /// `source` its line named, if any).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// The image it ran in, pinned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Its record in the item list.
    pub fields: serde_json::Value,
    pub inputs: Vec<ItemInput>,
    /// The JSON its command wrote (`item_result`).
    pub result: Option<serde_json::Value>,
    /// What it wrote (`item_outputs`).
    pub outputs: Vec<OutputRecord>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ItemInput {
    pub path: String,
    pub digest: Digest,
    /// The stage that wrote it; `None` for a source file.
    pub from: Option<String>,
    /// The item of that stage that wrote it, when one did.
    pub item: Option<String>,
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
        // What its items read, and what it needs, are upstream too.
        if let Some(i) = manifest.stages.iter().position(|s| s.name == name) {
            queue.extend(
                dag.upstream(i)
                    .iter()
                    .map(|&u| manifest.stages[u].name.clone()),
            );
        }
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
        items: Vec::new(),
    })
}
