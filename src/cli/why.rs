//! `cairn why STAGE`.

use std::collections::HashSet;

use super::args::{Global, WhyArgs};
use super::error::CliError;
use super::render;
use super::workspace;
use crate::schedule::{self, DirtyReason};

pub fn why(global: &Global, args: &WhyArgs) -> Result<(), CliError> {
    let loaded = workspace::load(global)?;
    let target = [loaded.stage_or_output(&args.stage)?];
    let name = &loaded.manifest.stages[target[0]].name;
    let selected = loaded.dag.upstream_closure(&target);
    let mut ctx = loaded.read_context()?;
    let statuses = schedule::evaluate(&mut ctx, &selected, &HashSet::new())?;
    loaded.save_learnt(&mut ctx);
    let status = statuses
        .into_iter()
        .find(|s| &s.stage == name)
        .expect("the target is in its own closure");

    if args.json {
        render::json(&status)?;
        return Ok(());
    }
    match &status.reason {
        None => {
            outln!(
                "`{}` is fresh: its fingerprint {} matches a validated result.",
                status.stage,
                fp(&status)
            );
            if !status.outputs_to_restore.is_empty() {
                let names: Vec<String> = status
                    .outputs_to_restore
                    .iter()
                    .map(|o| format!("`{o}`"))
                    .collect();
                outln!(
                    "the workspace copy of output {} differs from the store; `cairn run` restores it without running anything.",
                    names.join(", ")
                );
            }
        }
        Some(reason) => {
            outln!("`{}` would run: {}", status.stage, reason.summary());
            if matches!(reason, DirtyReason::UpstreamStale { .. })
                && status.changes.iter().any(|c| c.component != "items")
            {
                outln!("(and even if upstream reproduces its last outputs:)");
            }
        }
    }
    if let Some(items) = &status.items {
        outln!("\n  items: {}", items.summary());
        if !status.unfinished_items.is_empty() {
            let more = items
                .unfinished()
                .saturating_sub(status.unfinished_items.len());
            let tail = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            outln!("  to run: {}{tail}", status.unfinished_items.join(", "));
        }
    }
    for change in status.changes.iter().filter(|c| c.component != "items") {
        outln!("\n  {}", change.component);
        match &change.old {
            Some(old) => outln!("    - {}", old.shown()),
            None => outln!("    - (absent)"),
        }
        match &change.new {
            Some(new) => outln!("    + {}", new.shown()),
            None => outln!("    + (absent)"),
        }
    }
    if let Some(DirtyReason::Failed { .. }) = &status.reason {
        let log = ctx
            .latest_failure
            .get(&status.stage)
            .and_then(|attempt| attempt.log_path.as_deref());
        match log.and_then(|path| {
            render::log_tail(std::path::Path::new(path), 20).map(|tail| (path, tail))
        }) {
            Some((path, tail)) => {
                outln!("\nlast lines of {path}:");
                for line in tail.lines() {
                    outln!("  │ {line}");
                }
            }
            None => outln!("\nthe failed attempt printed nothing"),
        }
    }
    Ok(())
}

fn fp(status: &schedule::StageStatus) -> String {
    status
        .fingerprint
        .map(|d| d.to_string())
        .unwrap_or_else(|| "(unknown)".to_owned())
}
