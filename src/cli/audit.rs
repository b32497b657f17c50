//! `cairn audit`.

use super::args::{AuditArgs, Global};
use super::error::{CliError, exit};
use super::render;
use super::workspace;
use crate::store::{Ledger, PipelineId, audit};

pub fn audit_cmd(global: &Global, args: &AuditArgs) -> Result<(), CliError> {
    let loaded = workspace::load(global)?;
    let Some(ledger) = Ledger::open_existing(
        &loaded.manifest.cache_dir(),
        &PipelineId::of(&loaded.manifest),
    )?
    else {
        return Err(CliError::usage(format!(
            "nothing to audit: no ledger under `{}` yet; `cairn run` records one",
            loaded.manifest.cache_dir().display()
        )));
    };
    let report = audit(&loaded.manifest, &ledger)?;
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
        outln!(
            "audited {} stage(s): {} file(s), {} bytes re-hashed; {} mismatch(es)",
            report.stages,
            report.files,
            report.bytes,
            report.mismatches.len()
        );
    }
    if report.mismatches.is_empty() {
        Ok(())
    } else {
        Err(CliError::Exit(exit::STAGE_FAILED))
    }
}
