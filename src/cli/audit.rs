//! `cairn audit [--repair]`.

use super::args::{AuditArgs, Global};
use super::error::{CliError, exit};
use super::render;
use super::workspace;
use crate::store::{Ledger, MismatchKind, PipelineId, WhenLocked, WorkspaceLock, audit};

pub fn audit_cmd(global: &Global, args: &AuditArgs) -> Result<(), CliError> {
    let loaded = workspace::load(global)?;
    let cache = loaded.manifest.cache_dir();
    let Some(ledger) = Ledger::open_existing(&cache, &PipelineId::of(&loaded.manifest))? else {
        return Err(CliError::usage(format!(
            "nothing to audit: no ledger under `{}` yet; `cairn run` records one",
            cache.display()
        )));
    };
    // Repairing writes the store and the ledger: not beside a run.
    let _lock = match args.repair {
        true => Some(WorkspaceLock::acquire(&cache, WhenLocked::Wait, |_| {
            eprintln!(
                "waiting for another cairn process to release the workspace `{}`…",
                cache.display()
            );
        })?),
        false => None,
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
