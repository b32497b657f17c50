//! `cairn audit [--repair]`.

use std::path::Path;

use super::args::{AuditArgs, Global};
use super::error::{CliError, exit};
use super::render;
use super::workspace;
use crate::store::{
    Ledger, MismatchKind, PipelineId, StoreError, WhenLocked, WorkspaceLock, audit,
};

/// Holds the workspace for the audit, as a run does: a run in progress has
/// outputs half-written and results not yet recorded, which an audit would
/// report as mismatches that are not there; no run starts mid-audit; and
/// repairing writes the store and the ledger. `None` when there is no cache
/// yet (nothing to audit, nothing to hold).
fn hold_workspace(cache: &Path, no_wait: bool) -> Result<Option<WorkspaceLock>, CliError> {
    if !cache.exists() {
        return Ok(None);
    }
    let when_locked = if no_wait {
        WhenLocked::Fail
    } else {
        WhenLocked::Wait
    };
    let lock = WorkspaceLock::acquire(cache, when_locked, |holder| {
        let who = holder.map(|p| format!(" (pid {p})")).unwrap_or_default();
        errln!("waiting for the run in progress{who} to end before auditing…");
    });
    match lock {
        Ok(lock) => Ok(Some(lock)),
        Err(StoreError::Locked { holder, .. }) => {
            let who = holder.map(|p| format!(" (pid {p})")).unwrap_or_default();
            Err(CliError::usage(format!(
                "a run is in progress{who} in `{}`: its outputs are not final, so an audit now would report mismatches that are not there; audit when it ends, or without `--no-wait` to wait for it",
                cache.display()
            )))
        }
        Err(other) => Err(other.into()),
    }
}

pub fn audit_cmd(global: &Global, args: &AuditArgs) -> Result<(), CliError> {
    let loaded = workspace::load(global)?;
    let cache = loaded.manifest.cache_dir();
    let _lock = hold_workspace(&cache, args.no_wait)?;
    let Some(ledger) = Ledger::open_existing(&cache, &PipelineId::of(&loaded.manifest))? else {
        return Err(CliError::usage(format!(
            "nothing to audit: no ledger under `{}` yet; `cairn run` records one",
            cache.display()
        )));
    };
    let report = audit(&loaded.manifest, &ledger, args.repair)?;
    if args.json {
        render::json(&report)?;
    } else {
        for m in &report.mismatches {
            outln!(
                "mismatch ({}) in stage `{}`: {}\n  expected {}\n  actual   {}",
                m.kind.as_str(),
                m.stage,
                m.path,
                m.expected,
                m.actual
            );
        }
        for r in &report.repairs {
            outln!("{} ({}): {}", r.action.as_str(), r.stage, r.path);
        }
        outln!(
            "audited {} stage(s): {} file(s), {} bytes re-hashed; {} mismatch(es)",
            report.stages,
            report.files,
            report.bytes,
            report.mismatches.len()
        );
        let unread = report
            .mismatches
            .iter()
            .any(|m| m.kind == MismatchKind::Record);
        if unread && !args.repair {
            outln!(
                "results whose records cannot be read hide the rest; `cairn audit --repair` sets them aside"
            );
        } else if !report.mismatches.is_empty() && !args.repair {
            outln!("`cairn audit --repair` mends what can be mended");
        }
        let rerun = report.stages_to_rerun();
        if !rerun.is_empty() {
            outln!(
                "no good copy left for {} stage(s): {}; `cairn run` runs them again",
                rerun.len(),
                rerun
                    .iter()
                    .map(|s| format!("`{s}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    // Once repaired, every mismatch is mended or left to the next run.
    if report.mismatches.is_empty() || args.repair {
        Ok(())
    } else {
        Err(CliError::Exit(exit::STAGE_FAILED))
    }
}
