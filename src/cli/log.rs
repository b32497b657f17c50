//! `cairn log [STAGE]`.

use super::args::{Global, LogArgs};
use super::error::CliError;
use super::render;
use super::workspace;

pub fn log(global: &Global, args: &LogArgs) -> Result<(), CliError> {
    let loaded = workspace::load(global)?;
    let ctx = loaded.read_context()?;
    let Some(ledger) = &ctx.ledger else {
        if args.json {
            render::json(&Vec::<()>::new())?;
        } else {
            outln!("no runs recorded yet; `cairn run` records one");
        }
        return Ok(());
    };
    match &args.stage {
        None => {
            let runs = ledger.runs(args.limit)?;
            if args.json {
                render::json(&runs)?;
                return Ok(());
            }
            let mut rows = vec![
                [
                    "RUN", "STARTED", "STATUS", "RAN", "FRESH", "RESTORED", "FAILED", "DURATION",
                ]
                .map(String::from)
                .to_vec(),
            ];
            for run in &runs {
                rows.push(vec![
                    run.id.to_string(),
                    render::time(run.started_ms),
                    run.status.clone(),
                    run.executed.to_string(),
                    run.fresh.to_string(),
                    run.restored.to_string(),
                    run.failed.to_string(),
                    run.finished_ms
                        .map(|f| render::elapsed_ms(run.started_ms, f))
                        .unwrap_or_default(),
                ]);
            }
            out!("{}", render::table(&rows));
        }
        Some(stage) => {
            if loaded.manifest.stage(stage).is_none() {
                return Err(loaded.unknown_stage(stage));
            }
            let results = ledger.results(Some(stage), args.limit)?;
            if args.json {
                render::json(&results)?;
                return Ok(());
            }
            if results.is_empty() {
                outln!("stage `{stage}` has not run yet");
                return Ok(());
            }
            let mut rows = vec![
                [
                    "RUN",
                    "STARTED",
                    "STATUS",
                    "FINGERPRINT",
                    "DURATION",
                    "DETAIL",
                ]
                .map(String::from)
                .to_vec(),
            ];
            for r in &results {
                rows.push(vec![
                    r.run_id.to_string(),
                    render::time(r.started_ms),
                    if r.status == crate::store::ResultStatus::Ok {
                        "ok".into()
                    } else {
                        "failed".into()
                    },
                    r.fingerprint.short(),
                    render::elapsed_ms(r.started_ms, r.finished_ms),
                    r.error
                        .clone()
                        .or_else(|| r.log_path.clone())
                        .unwrap_or_default(),
                ]);
            }
            out!("{}", render::table(&rows));
        }
    }
    Ok(())
}
