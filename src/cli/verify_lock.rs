//! `cairn verify --lock [LOCK]`: re-hash the workspace against a lock file.
//!
//! Needs no ledger and no `cache/`: a collaborator's fresh checkout (outputs
//! present, pulled or copied, store absent) is checked against the lock
//! file committed beside the manifest. The lock file is verified first (its
//! checksum, format and pipeline); then every output it records is hashed
//! from its bytes (no stat cache) and compared with the recorded digest.
//!
//! The project root comes from the manifest beside the lock file
//! (`NAME.lock` ↔ `NAME.toml`), of which only `[pipeline] root` is read, so
//! a checkout whose inputs are absent can still be checked.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::args::Global;
use super::error::{CliError, exit};
use super::render;
use super::workspace;
use crate::fingerprint::StatCache;
use crate::store::{LockFile, StoreError};

#[derive(Serialize)]
struct LockMismatch {
    stage: String,
    output: String,
    path: String,
    expected: String,
    actual: String,
}

#[derive(Serialize)]
struct LockReport {
    lock: PathBuf,
    pipeline: String,
    stages: usize,
    outputs: usize,
    mismatches: Vec<LockMismatch>,
}

pub fn verify_lock(global: &Global, lock: Option<&Path>, json: bool) -> Result<(), CliError> {
    let (lock_path, manifest) = match lock {
        Some(lock) => (lock.to_owned(), lock.with_extension("toml")),
        None => {
            let manifest = workspace::manifest_path(global)?;
            (crate::manifest::lock_path_of(&manifest), manifest)
        }
    };
    let (name, root) = pipeline_of(&manifest, &lock_path)?;
    let text = std::fs::read_to_string(&lock_path).map_err(|e| CliError::Usage {
        message: format!(
            "failed to read the lock file `{}`: {e}",
            lock_path.display()
        ),
        help: Some("`cairn run` writes it beside the manifest".to_owned()),
    })?;
    let name = name.unwrap_or_else(|| {
        LockFile::parse(&text)
            .map(|l| l.pipeline)
            .unwrap_or_default()
    });
    let locked = LockFile::verify(&text, &name).map_err(|problem| StoreError::LockFile {
        path: lock_path.clone(),
        problem,
    })?;

    let mut stat = StatCache::default();
    let mut report = LockReport {
        lock: lock_path.clone(),
        pipeline: locked.pipeline.clone(),
        stages: locked.stages.len(),
        outputs: 0,
        mismatches: Vec::new(),
    };
    for (stage, entry) in &locked.stages {
        for (output, recorded) in &entry.outputs {
            report.outputs += 1;
            let actual = match stat.content(&root.join(&recorded.path)) {
                Ok(content) if content.digest() == recorded.digest => continue,
                Ok(content) => content.digest().to_string(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => "missing".to_owned(),
                Err(e) => format!("unreadable: {e}"),
            };
            report.mismatches.push(LockMismatch {
                stage: stage.clone(),
                output: output.clone(),
                path: recorded.path.clone(),
                expected: recorded.digest.to_string(),
                actual,
            });
        }
    }

    if json {
        render::json(&report)?;
    } else {
        for m in &report.mismatches {
            outln!(
                "mismatch in stage `{}` output `{}`: {}\n  expected {}\n  actual   {}",
                m.stage,
                m.output,
                m.path,
                m.expected,
                m.actual
            );
        }
        outln!(
            "checked {} output(s) of {} stage(s) against {}: {}",
            report.outputs,
            report.stages,
            lock_path.display(),
            if report.mismatches.is_empty() {
                "all match".to_owned()
            } else {
                format!("{} mismatch(es)", report.mismatches.len())
            }
        );
    }
    if report.mismatches.is_empty() {
        Ok(())
    } else {
        Err(CliError::Exit(exit::STAGE_FAILED))
    }
}

/// The pipeline name and project root from the manifest's `[pipeline]`
/// table; with no manifest beside the lock file, no name and the lock
/// file's directory.
fn pipeline_of(manifest: &Path, lock: &Path) -> Result<(Option<String>, PathBuf), CliError> {
    let dir = |path: &Path| {
        path.parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map_or_else(|| PathBuf::from("."), Path::to_owned)
    };
    let Ok(text) = std::fs::read_to_string(manifest) else {
        return Ok((None, dir(lock)));
    };
    let table: toml::Table = text.parse().map_err(|e| CliError::Usage {
        message: format!("failed to parse the manifest `{}`: {e}", manifest.display()),
        help: Some("`cairn status` shows where".to_owned()),
    })?;
    let pipeline = table.get("pipeline").and_then(|p| p.as_table());
    let name = pipeline
        .and_then(|p| p.get("name"))
        .and_then(|n| n.as_str())
        .map(str::to_owned);
    let root = pipeline
        .and_then(|p| p.get("root"))
        .and_then(|r| r.as_str())
        .unwrap_or(".");
    Ok((name, dir(manifest).join(root)))
}
