//! `cairn provenance PATH|STAGE`.

use std::collections::HashSet;

use super::args::{Global, ProvenanceArgs};
use super::error::CliError;
use super::render;
use super::targets::PathTarget;
use super::workspace;
use crate::schedule::{self, ItemTracer};
use crate::store::{
    AttestationError, ItemStep, Ledger, LineageError, PipelineId, lineage, statement,
};

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
    let mut lineage = match lineage(&loaded.manifest, &loaded.dag, &ledger, &target) {
        Ok(lineage) => lineage,
        Err(LineageError::Store(e)) => return Err(e.into()),
        Err(other) => return Err(CliError::usage(other.to_string())),
    };
    if loaded.manifest.stage(&target).is_none() {
        // A file an item wrote: the items behind it too.
        let mut ctx = loaded.read_context()?;
        let every = vec![true; loaded.manifest.stages.len()];
        schedule::evaluate(&mut ctx, &every, &HashSet::new())?;
        lineage.items = ItemTracer::new(&ctx).trace(&target)?;
        loaded.save_learnt(&mut ctx);
    }
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
    for step in &lineage.items {
        print_item(step)?;
    }
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

fn print_item(step: &ItemStep) -> Result<(), CliError> {
    let outcome = match &step.class {
        Some(class) => format!("{class} after {} attempt(s)", step.attempts),
        None => {
            "NOT RUN under its inputs as they are now: `cairn run` brings it up to date".to_owned()
        }
    };
    outln!(
        "item `{}` of `{}`  {}",
        step.key,
        step.stage,
        step.fingerprint
    );
    outln!("  outcome   {outcome}");
    if let (Some(run), Some(started), Some(finished)) =
        (step.run_id, step.started_ms, step.finished_ms)
    {
        outln!(
            "  run       {run} at {}, took {}",
            render::time(started),
            render::elapsed_ms(started, finished)
        );
    }
    match (&step.origin, &step.source) {
        (Some(origin), source) if origin.starts_with("import:") => {
            let source = source
                .as_ref()
                .map(|s| format!(", from {s}"))
                .unwrap_or_default();
            outln!(
                "  origin    IMPORTED (`cairn import` of a file of {}{source}), not run by cairn",
                &origin["import:".len()..]
            );
        }
        (Some(origin), _) => outln!("  origin    {origin}"),
        (None, _) => {}
    }
    outln!("  code      {}", step.code);
    if let Some(image) = &step.image {
        outln!("  image     {image}");
    }
    if let serde_json::Value::Object(fields) = &step.fields {
        for (name, value) in fields {
            let value = match value {
                serde_json::Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            outln!("  field     {name} = {value}");
        }
    }
    for input in &step.inputs {
        let from = match (&input.from, &input.item) {
            (Some(stage), Some(item)) => format!("item `{item}` of `{stage}`"),
            (Some(stage), None) => format!("from `{stage}`"),
            _ => "source".to_owned(),
        };
        outln!("  input     {}  {}  ({from})", input.path, input.digest);
    }
    if let Some(result) = &step.result {
        outln!("  result    {result}");
    }
    for output in &step.outputs {
        outln!("  output    {}  {}", output.path, output.digest);
    }
    if let Some(log) = &step.log {
        outln!("  log       {log}");
    }
    outln!();
    Ok(())
}
