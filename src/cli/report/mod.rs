//! `cairn report [RUN] -o report.html`: one self-contained HTML page about
//! a run — the DAG coloured by state, a timeline of its stages and item
//! attempts, item outcomes over runs by stage code, the slowest and the
//! troubled items, pass@k and model comparisons, and a release's files
//! linked to their provenance — or the same data as JSON (`--json`).
//!
//! `data` gathers it from the manifest, the ledger and the workspace;
//! `html` draws it (SVG charts, `layout` placing the DAG); `palette` is the
//! colours it shares with `cairn dag`.

mod data;
mod html;
mod layout;
pub mod palette;

use super::args::{Global, ReportArgs};
use super::error::CliError;
use super::render;
use super::workspace;

pub fn report(global: &Global, args: &ReportArgs) -> Result<(), CliError> {
    let loaded = workspace::load(global)?;
    let mut ctx = loaded.read_context()?;
    if ctx.ledger.is_none() {
        return Err(CliError::usage(
            "no run is recorded yet; `cairn run` records one, then `cairn report` shows it",
        ));
    }
    let report = data::gather(&mut ctx, args.run).map_err(|e| match e {
        data::ReportError::NoSuchRun(_) | data::ReportError::NoRuns => {
            CliError::usage(e.to_string())
        }
        data::ReportError::Store(e) => e.into(),
        data::ReportError::Schedule(e) => e.into(),
    })?;
    if args.json {
        render::json(&report)?;
        return Ok(());
    }
    let page = html::render(&report);
    match &args.output {
        Some(path) => {
            crate::release::write_atomic(path, page.as_bytes())?;
            if !global.quiet {
                errln!(
                    "wrote {} ({} KiB): run {} of `{}`",
                    path.display(),
                    page.len().div_ceil(1024),
                    report.run.id,
                    report.pipeline
                );
            }
        }
        None => out!("{page}"),
    }
    Ok(())
}
