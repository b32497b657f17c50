//! `cairn audit`: re-hash everything the records vouch for; with
//! `--repair`, mend what was found in the same pass.
//!
//! For each stage's current result (the lock file's entry, else the newest
//! successful one): the workspace copy of every output and every stored
//! object are hashed again from their bytes (no stat cache), and each
//! result's inputs that another stage produces are compared with what that
//! stage records. Every mismatch is reported.
//!
//! Repair, after hashing, in one pass:
//!
//! | found                                                  | done                                    |
//! |--------------------------------------------------------|-----------------------------------------|
//! | a result whose recorded outputs cannot be read         | set aside: marked failed with the reason, its stage runs again |
//! | a stored object (file, inline, tree listing) damaged or missing, and the workspace copy still hashes to it | re-stored from the workspace copy |
//! | the same, with no workspace copy that matches          | removed: every result that needs it is incomplete, so `status` names it and `run` re-runs exactly those stages |
//! | a workspace copy that differs, its stored copy whole   | restored from the store                 |
//! | an input or lock mismatch                              | reported: the next `run` re-runs or re-records what it concerns |
//!
//! `run` verifies every byte it restores and removes every damaged object
//! it meets; it does not re-hash objects it has no reason to read (that is
//! this module's job), so damage it never touches waits for an audit.

use std::collections::HashMap;
use std::path::PathBuf;

use rayon::prelude::*;
use serde::Serialize;

use super::StoreError;
use super::current::{Current, current_results, read_lock};
use super::ledger::UnreadableResult;
use super::ledger::{Ledger, ResultRecord};
use super::objects::ObjectStore;
use super::output_record::{OutputKind, OutputRecord};
use crate::fingerprint::{Content, Digest, EntryKind, StatCache, hash_file};
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
    /// A result's recorded outputs cannot be read.
    Record,
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
            MismatchKind::Record => "record",
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RepairAction {
    /// A stored object was written again from a workspace copy that still
    /// hashes to it.
    ReStored,
    /// A workspace copy was restored from the store.
    Restored,
    /// A damaged stored object was removed: the results that need it are
    /// incomplete, their stages run again.
    Removed,
    /// A result whose record cannot be read was set aside.
    SetAside,
}

impl RepairAction {
    pub fn as_str(self) -> &'static str {
        match self {
            RepairAction::ReStored => "re-stored",
            RepairAction::Restored => "restored",
            RepairAction::Removed => "removed",
            RepairAction::SetAside => "set aside",
        }
    }
}

/// One thing `--repair` did.
#[derive(Debug, Clone, Serialize)]
pub struct Repair {
    pub action: RepairAction,
    pub stage: String,
    pub path: String,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct AuditReport {
    pub stages: usize,
    pub files: usize,
    pub bytes: u64,
    pub mismatches: Vec<Mismatch>,
    /// With `--repair`: what was done about them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub repairs: Vec<Repair>,
}

impl AuditReport {
    /// Stages whose results `--repair` could not mend: `run` re-runs them.
    pub fn stages_to_rerun(&self) -> Vec<&str> {
        let mut stages: Vec<&str> = self
            .repairs
            .iter()
            .filter(|r| matches!(r.action, RepairAction::Removed | RepairAction::SetAside))
            .map(|r| r.stage.as_str())
            .collect();
        stages.sort_unstable();
        stages.dedup();
        stages
    }
}

/// What `--repair` may do about a failed check.
#[derive(Debug, Clone)]
enum Remedy {
    /// A workspace copy: restore it from the store.
    Restore(OutputRecord),
    /// A stored file object: re-store it from this workspace file.
    Object { source: PathBuf },
    /// An inline object: re-store it from this workspace file.
    Inline { source: PathBuf },
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
    remedy: Remedy,
}

/// What to hash, and what failed (for `--repair`).
#[derive(Default)]
struct Plan {
    checks: Vec<Check>,
    /// Failed checks (indices into `checks`).
    failed: Vec<usize>,
    /// Directory outputs whose workspace copy differs.
    workspace_dirs: Vec<(String, OutputRecord)>,
    /// Directory outputs whose tree listing is missing or damaged.
    trees: Vec<(String, OutputRecord)>,
}

/// Audits the current results; with `repair`, mends what it found (see the
/// module documentation).
pub fn audit(
    manifest: &Manifest,
    ledger: &Ledger,
    repair: bool,
) -> Result<AuditReport, StoreError> {
    let store = ObjectStore::new(&manifest.cache_dir());
    let mut report = AuditReport::default();
    let unreadable = ledger.unreadable_results()?;
    for UnreadableResult { id, stage, detail } in &unreadable {
        report.mismatches.push(Mismatch {
            kind: MismatchKind::Record,
            stage: stage.clone(),
            path: format!("{} result {id}", ledger.path().display()),
            expected: "readable recorded outputs".to_owned(),
            actual: detail.clone(),
        });
        if repair {
            ledger.set_aside_result(*id)?;
            report.repairs.push(Repair {
                action: RepairAction::SetAside,
                stage: stage.clone(),
                path: format!("result {id}"),
            });
        }
    }
    if !unreadable.is_empty() && !repair {
        // Nothing else can be read past them.
        return Ok(report);
    }
    let set_aside: Vec<&str> = unreadable.iter().map(|u| u.stage.as_str()).collect();
    if let Err(StoreError::LockFile { path, problem }) = read_lock(manifest) {
        report.mismatches.push(Mismatch {
            kind: MismatchKind::Lock,
            stage: String::new(),
            path: path.display().to_string(),
            expected: "the lock file as cairn wrote it".to_owned(),
            actual: problem.to_string(),
        });
    }
    let mut by_stage = current_results(manifest, ledger)?;
    let mut current: Vec<(String, ResultRecord)> = Vec::new();
    for stage in &manifest.stages {
        match by_stage.remove(&stage.name) {
            Some(Current::Found(record)) => current.push((stage.name.clone(), record)),
            // The next run records a new result and a new lock entry.
            Some(Current::LockedButMissing(_)) if set_aside.contains(&stage.name.as_str()) => {}
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

    let mut plan = Plan::default();
    for (stage, record) in &current {
        for output in &record.outputs {
            plan_output(
                manifest,
                &store,
                ledger,
                stage,
                output,
                &mut plan,
                &mut report,
            )?;
        }
    }
    let results: Vec<(usize, Option<(Digest, u64)>)> = plan
        .checks
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
        let check = &plan.checks[i];
        match hashed {
            Some((digest, size)) => {
                report.files += 1;
                report.bytes += size;
                if digest != check.expected {
                    plan.failed.push(i);
                    report.mismatches.push(Mismatch {
                        kind: check.kind.clone(),
                        stage: check.stage.clone(),
                        path: check.shown.clone(),
                        expected: check.expected.to_string(),
                        actual: digest.to_string(),
                    });
                }
            }
            None => {
                plan.failed.push(i);
                report.mismatches.push(Mismatch {
                    kind: match check.kind {
                        MismatchKind::Workspace => MismatchKind::WorkspaceMissing,
                        _ => MismatchKind::StoreMissing,
                    },
                    stage: check.stage.clone(),
                    path: check.shown.clone(),
                    expected: check.expected.to_string(),
                    actual: "missing".to_owned(),
                })
            }
        }
    }
    report
        .mismatches
        .sort_by(|a, b| (&a.stage, &a.path).cmp(&(&b.stage, &b.path)));
    if repair {
        mend(manifest, &store, ledger, &plan, &mut report)?;
    }
    Ok(report)
}

/// The checks for one output: its workspace copy and its stored objects.
fn plan_output(
    manifest: &Manifest,
    store: &ObjectStore,
    ledger: &Ledger,
    stage: &str,
    output: &OutputRecord,
    plan: &mut Plan,
    report: &mut AuditReport,
) -> Result<(), StoreError> {
    let workspace = manifest.root.join(&output.path);
    let check = |kind, path: PathBuf, shown: String, expected, inline, remedy| Check {
        stage: stage.to_owned(),
        kind,
        path,
        shown,
        expected,
        inline,
        remedy,
    };
    match output.kind {
        OutputKind::File => {
            plan.checks.push(check(
                MismatchKind::Workspace,
                workspace.clone(),
                output.path.clone(),
                output.digest,
                None,
                Remedy::Restore(output.clone()),
            ));
            if output.inline {
                // A missing inline object has no bytes to hash: reported
                // as missing, repaired like a damaged one.
                let bytes = ledger.inline_object(&output.digest)?;
                plan.checks.push(check(
                    MismatchKind::Store,
                    PathBuf::new(),
                    format!("ledger object {}", output.digest),
                    output.digest,
                    bytes,
                    Remedy::Inline { source: workspace },
                ));
            } else {
                let object = store.object_path(&output.digest);
                plan.checks.push(check(
                    MismatchKind::Store,
                    object.clone(),
                    object.display().to_string(),
                    output.digest,
                    None,
                    Remedy::Object { source: workspace },
                ));
            }
        }
        OutputKind::Dir => {
            // The tree as it stands must have the recorded digest…
            match StatCache::default().content(&workspace) {
                Ok(Content::Dir { digest, .. }) if digest == output.digest => {}
                Ok(content) => {
                    plan.workspace_dirs.push((stage.to_owned(), output.clone()));
                    report.mismatches.push(Mismatch {
                        kind: MismatchKind::Workspace,
                        stage: stage.to_owned(),
                        path: output.path.clone(),
                        expected: output.digest.to_string(),
                        actual: content.digest().to_string(),
                    })
                }
                Err(_) => {
                    plan.workspace_dirs.push((stage.to_owned(), output.clone()));
                    report.mismatches.push(Mismatch {
                        kind: MismatchKind::WorkspaceMissing,
                        stage: stage.to_owned(),
                        path: output.path.clone(),
                        expected: output.digest.to_string(),
                        actual: "missing".to_owned(),
                    })
                }
            }
            // …and every stored object of its listing must hash to its name.
            match store.tree(&output.digest) {
                // (`tree` checks the listing against its digest.)
                Ok(entries) => {
                    for entry in entries
                        .iter()
                        .filter(|e| matches!(e.kind, EntryKind::File | EntryKind::Executable))
                    {
                        let object = store.object_path(&entry.digest);
                        plan.checks.push(check(
                            MismatchKind::Store,
                            object.clone(),
                            object.display().to_string(),
                            entry.digest,
                            None,
                            Remedy::Object {
                                source: workspace.join(&entry.path),
                            },
                        ));
                    }
                }
                Err(_) => {
                    plan.trees.push((stage.to_owned(), output.clone()));
                    report.mismatches.push(missing(
                        stage,
                        &store.tree_path(&output.digest).display().to_string(),
                        output.digest,
                    ))
                }
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

/// The repair pass: stored copies first (from workspace copies that still
/// match, else removed), then workspace copies (from the store, where it is
/// whole).
fn mend(
    manifest: &Manifest,
    store: &ObjectStore,
    ledger: &Ledger,
    plan: &Plan,
    report: &mut AuditReport,
) -> Result<(), StoreError> {
    let mut done = |action, stage: &str, path: String| {
        report.repairs.push(Repair {
            action,
            stage: stage.to_owned(),
            path,
        })
    };
    for (stage, output) in &plan.trees {
        let workspace = manifest.root.join(&output.path);
        let listing = store.tree_path(&output.digest).display().to_string();
        match StatCache::default().content(&workspace) {
            Ok(Content::Dir { digest, entries }) if digest == output.digest => {
                let mut stored = true;
                for entry in entries
                    .iter()
                    .filter(|e| matches!(e.kind, EntryKind::File | EntryKind::Executable))
                {
                    let source = workspace.join(&entry.path);
                    stored = stored && store.restore_object_from(&entry.digest, &source)?;
                }
                // A file that changed since it was listed leaves the
                // listing unwritten: it must not vouch for it.
                if stored && store.restore_tree_listing(&output.digest, entries)? {
                    done(RepairAction::ReStored, stage, listing);
                } else {
                    store.discard(&store.tree_path(&output.digest))?;
                    done(RepairAction::Removed, stage, listing);
                }
            }
            _ => {
                store.discard(&store.tree_path(&output.digest))?;
                done(RepairAction::Removed, stage, listing);
            }
        }
    }
    for &i in &plan.failed {
        let check = &plan.checks[i];
        match &check.remedy {
            Remedy::Restore(_) => {}
            Remedy::Object { source } => {
                if source.is_file() && store.restore_object_from(&check.expected, source)? {
                    done(RepairAction::ReStored, &check.stage, check.shown.clone());
                } else {
                    store.discard(&check.path)?;
                    done(RepairAction::Removed, &check.stage, check.shown.clone());
                }
            }
            Remedy::Inline { source } => {
                let bytes = source
                    .is_file()
                    .then(|| std::fs::read(source).ok())
                    .flatten()
                    .filter(|bytes| Digest::of(bytes) == check.expected);
                match bytes {
                    Some(bytes) => {
                        ledger.put_inline_object(&check.expected, &bytes)?;
                        done(RepairAction::ReStored, &check.stage, check.shown.clone());
                    }
                    None => {
                        ledger.drop_inline_object(&check.expected)?;
                        done(RepairAction::Removed, &check.stage, check.shown.clone());
                    }
                }
            }
        }
    }
    let workspace_files = plan
        .failed
        .iter()
        .filter_map(|&i| match &plan.checks[i].remedy {
            Remedy::Restore(output) => Some((plan.checks[i].stage.clone(), output.clone())),
            _ => None,
        });
    for (stage, output) in workspace_files.chain(plan.workspace_dirs.iter().cloned()) {
        let whole = store.is_complete(&output)
            && (!output.inline || ledger.has_inline_object(&output.digest)?);
        if !whole {
            // Its stage runs again; reported with the removed objects.
            continue;
        }
        let dest = manifest.root.join(&output.path);
        match store.restore(&output, &dest, Some(ledger)) {
            Ok(()) => done(RepairAction::Restored, &stage, output.path.clone()),
            // The damaged objects it met are gone: the stage runs again.
            Err(StoreError::Corrupt { path, .. }) => {
                done(RepairAction::Removed, &stage, path.display().to_string())
            }
            Err(other) => return Err(other),
        }
    }
    Ok(())
}
