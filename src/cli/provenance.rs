//! `cairn provenance PATH|STAGE`.

use super::args::{Global, ProvenanceArgs};
use super::error::CliError;
use super::render;
use super::targets::PathTarget;
use super::workspace;
use crate::store::{AttestationError, Ledger, LineageError, PipelineId, lineage, statement};

pub fn provenance(global: &Global, args: &ProvenanceArgs) -> Result<(), CliError> {
    let loaded = workspace::load(global)?;
    let Some(ledger) = Ledger::open_existing(
        &loaded.manifest.cache_dir(),
        &PipelineId::of(&loaded.manifest),
    )?
    else {
        return Err(CliError::usage("no ledger yet: `cairn run` records one"));
    };
    let target = match loaded.manifest.stage(&args.target) {
        Some(stage) => stage.name.clone(),
        None => match loaded.path_target(&args.target)? {
            PathTarget::Output { path, .. } => path,
            other => return Err(loaded.not_an_output(&args.target, &other)),
        },
    };
    let lineage = match lineage(&loaded.manifest, &loaded.dag, &ledger, &target) {
        Ok(lineage) => lineage,
        Err(LineageError::Store(e)) => return Err(e.into()),
        Err(other) => return Err(CliError::usage(other.to_string())),
    };
    if args.format.is_some() {
        let statement = match statement(&loaded.manifest, &lineage) {
            Ok(statement) => statement,
            Err(AttestationError::Store(e)) => return Err(e.into()),
            Err(changed) => return Err(CliError::usage(changed.to_string())),
        };
        render::json(&statement)?;
        return Ok(());
    }
    if args.json {
        render::json(&lineage)?;
        return Ok(());
    }
    outln!("provenance of {}\n", lineage.target);
    for source in &lineage.sources {
        outln!("source  {}  {}", source.path, source.digest);
    }
    for stage in &lineage.stages {
        outln!("\nstage `{}`  {}", stage.stage, stage.fingerprint);
        outln!("  command   {}", stage.command);
        outln!(
            "  run       {} at {}, took {} ({})",
            stage.run_id,
            render::time(stage.started_ms),
            render::elapsed_ms(stage.started_ms, stage.finished_ms),
            stage.tool
        );
        for (name, value) in &stage.params {
            outln!("  param     {name} = {value}");
        }
        for name in &stage.env {
            outln!("  env       {name}");
        }
        if let Some(version) = &stage.version {
            outln!("  version   {version}");
        }
        for input in &stage.inputs {
            let from = input
                .produced_by
                .as_deref()
                .map_or("source".to_owned(), |s| format!("from `{s}`"));
            outln!("  input     {}  {}  ({from})", input.path, input.digest);
        }
        for output in &stage.outputs {
            outln!("  output    {}  {}", output.path, output.digest);
        }
    }
    Ok(())
}
