//! `cairn audit`: re-hash everything the records vouch for.
//!
//! For each stage's current result (the lock file's entry, else the newest
//! successful one): the workspace copy of every output and every stored
//! object are hashed again from their bytes (no stat cache), and each
//! result's inputs that another stage produces are compared with what that
//! stage records. Every mismatch is reported; nothing is repaired.

use std::collections::HashMap;
use std::path::PathBuf;

use rayon::prelude::*;
use serde::Serialize;

use super::StoreError;
use super::current::{Current, current_results};
use super::ledger::{Ledger, ResultRecord};
use super::objects::{ObjectStore, OutputKind, OutputRecord};
use crate::fingerprint::{Content, Digest, EntryKind, StatCache, hash_file, tree_digest};
use crate::manifest::Manifest;

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum MismatchKind {
    /// The workspace copy of an output differs from its recorded digest.
    Workspace,
    /// An output recorded as valid is missing from the workspace.
    WorkspaceMissing,
    /// A stored object no longer hashes to its name.
    Store,
    /// A stored object is gone.
    StoreMissing,
    /// A result was computed from an upstream output other than the one
    /// the upstream stage records.
    Input,
    /// The lock file names a result the ledger does not hold.
    Lock,
}

impl MismatchKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            MismatchKind::Workspace => "workspace",
            MismatchKind::WorkspaceMissing => "workspace-missing",
            MismatchKind::Store => "store",
            MismatchKind::StoreMissing => "store-missing",
            MismatchKind::Input => "input",
            MismatchKind::Lock => "lock",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Mismatch {
    pub kind: MismatchKind,
    pub stage: String,
    /// The file or object concerned.
    pub path: String,
    pub expected: String,
    pub actual: String,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct AuditReport {
    pub stages: usize,
    pub files: usize,
    pub bytes: u64,
    pub mismatches: Vec<Mismatch>,
}

/// What one check hashes, and what it should find.
struct Check {
    stage: String,
    kind: MismatchKind,
    path: PathBuf,
    shown: String,
    expected: Digest,
    /// Bytes held in the ledger instead of a file (inline objects).
    inline: Option<Vec<u8>>,
}

pub fn audit(manifest: &Manifest, ledger: &Ledger) -> Result<AuditReport, StoreError> {
    let store = ObjectStore::new(&manifest.cache_dir());
    let mut report = AuditReport::default();
    let mut by_stage = current_results(manifest, ledger)?;
    let mut current: Vec<(String, ResultRecord)> = Vec::new();
    for stage in &manifest.stages {
        match by_stage.remove(&stage.name) {
            Some(Current::Found(record)) => current.push((stage.name.clone(), record)),
            Some(Current::LockedButMissing(fingerprint)) => report.mismatches.push(Mismatch {
                kind: MismatchKind::Lock,
                stage: stage.name.clone(),
                path: manifest.lock_path().display().to_string(),
                expected: fingerprint.to_string(),
                actual: "no such result in the ledger".to_owned(),
            }),
            None => {}
        }
    }
    report.stages = current.len();

    // Inputs produced upstream must be what upstream records.
    let produced: HashMap<&str, (&str, Digest)> = current
        .iter()
        .flat_map(|(stage, record)| {
            record
                .outputs
                .iter()
                .map(move |o| (o.path.as_str(), (stage.as_str(), o.digest)))
        })
        .collect();
    for (stage, record) in &current {
        let key = ledger.key(record.id)?;
        for (name, component) in &key.components {
            let Some(path) = name.strip_prefix("input:") else {
                continue;
            };
            if let Some((upstream, digest)) = produced.get(path)
                && *digest != component.digest
            {
                report.mismatches.push(Mismatch {
                    kind: MismatchKind::Input,
                    stage: stage.clone(),
                    path: path.to_owned(),
                    expected: format!("{digest} (recorded by `{upstream}`)"),
                    actual: component.digest.to_string(),
                });
            }
        }
    }

    let mut checks = Vec::new();
    for (stage, record) in &current {
        for output in &record.outputs {
            plan_output(
                manifest,
                &store,
                ledger,
                stage,
                output,
                &mut checks,
                &mut report,
            )?;
        }
    }
    let results: Vec<(usize, Option<(Digest, u64)>)> = checks
        .par_iter()
        .enumerate()
        .map(|(i, check)| {
            let hashed = match &check.inline {
                Some(bytes) => Some((Digest::of(bytes), bytes.len() as u64)),
                None => std::fs::metadata(&check.path).ok().and_then(|meta| {
                    hash_file(&check.path, meta.len(), false)
                        .ok()
                        .map(|d| (d, meta.len()))
                }),
            };
            (i, hashed)
        })
        .collect();
    for (i, hashed) in results {
        let check = &checks[i];
        match hashed {
            Some((digest, size)) => {
                report.files += 1;
                report.bytes += size;
                if digest != check.expected {
                    report.mismatches.push(Mismatch {
                        kind: check.kind.clone(),
                        stage: check.stage.clone(),
                        path: check.shown.clone(),
                        expected: check.expected.to_string(),
                        actual: digest.to_string(),
                    });
                }
            }
            None => report.mismatches.push(Mismatch {
                kind: match check.kind {
                    MismatchKind::Workspace => MismatchKind::WorkspaceMissing,
                    _ => MismatchKind::StoreMissing,
                },
                stage: check.stage.clone(),
                path: check.shown.clone(),
                expected: check.expected.to_string(),
                actual: "missing".to_owned(),
            }),
        }
    }
    report
        .mismatches
        .sort_by(|a, b| (&a.stage, &a.path).cmp(&(&b.stage, &b.path)));
    Ok(report)
}

/// The checks for one output: its workspace copy and its stored objects.
fn plan_output(
    manifest: &Manifest,
    store: &ObjectStore,
    ledger: &Ledger,
    stage: &str,
    output: &OutputRecord,
    checks: &mut Vec<Check>,
    report: &mut AuditReport,
) -> Result<(), StoreError> {
    let workspace = manifest.root.join(&output.path);
    let check = |kind, path: PathBuf, shown: String, expected, inline| Check {
        stage: stage.to_owned(),
        kind,
        path,
        shown,
        expected,
        inline,
    };
    match output.kind {
        OutputKind::File => {
            checks.push(check(
                MismatchKind::Workspace,
                workspace,
                output.path.clone(),
                output.digest,
                None,
            ));
            if output.inline {
                match ledger.inline_object(&output.digest)? {
                    Some(bytes) => checks.push(check(
                        MismatchKind::Store,
                        PathBuf::new(),
                        format!("ledger object {}", output.digest),
                        output.digest,
                        Some(bytes),
                    )),
                    None => report.mismatches.push(missing(
                        stage,
                        &format!("ledger object {}", output.digest),
                        output.digest,
                    )),
                }
            } else {
                let object = store.object_path(&output.digest);
                checks.push(check(
                    MismatchKind::Store,
                    object.clone(),
                    object.display().to_string(),
                    output.digest,
                    None,
                ));
            }
        }
        OutputKind::Dir => {
            // The tree as it stands must have the recorded digest…
            match StatCache::default().content(&workspace) {
                Ok(Content::Dir { digest, .. }) if digest == output.digest => {}
                Ok(content) => report.mismatches.push(Mismatch {
                    kind: MismatchKind::Workspace,
                    stage: stage.to_owned(),
                    path: output.path.clone(),
                    expected: output.digest.to_string(),
                    actual: content.digest().to_string(),
                }),
                Err(_) => report.mismatches.push(Mismatch {
                    kind: MismatchKind::WorkspaceMissing,
                    stage: stage.to_owned(),
                    path: output.path.clone(),
                    expected: output.digest.to_string(),
                    actual: "missing".to_owned(),
                }),
            }
            // …and every stored object of its listing must hash to its name.
            match store.tree(&output.digest) {
                Ok(mut entries) => {
                    if tree_digest(&mut entries) != output.digest {
                        report.mismatches.push(missing(
                            stage,
                            &store.tree_path(&output.digest).display().to_string(),
                            output.digest,
                        ));
                    }
                    for entry in entries
                        .iter()
                        .filter(|e| matches!(e.kind, EntryKind::File | EntryKind::Executable))
                    {
                        let object = store.object_path(&entry.digest);
                        checks.push(check(
                            MismatchKind::Store,
                            object.clone(),
                            object.display().to_string(),
                            entry.digest,
                            None,
                        ));
                    }
                }
                Err(_) => report.mismatches.push(missing(
                    stage,
                    &store.tree_path(&output.digest).display().to_string(),
                    output.digest,
                )),
            }
        }
    }
    Ok(())
}

fn missing(stage: &str, path: &str, expected: Digest) -> Mismatch {
    Mismatch {
        kind: MismatchKind::StoreMissing,
        stage: stage.to_owned(),
        path: path.to_owned(),
        expected: expected.to_string(),
        actual: "missing or unreadable".to_owned(),
    }
}
