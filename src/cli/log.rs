//! `cairn log [RUN|STAGE]`.

use super::args::{Global, LogArgs};
use super::error::CliError;
use super::render;
use super::workspace;
use crate::store::{Ledger, RunRecord, StageRun};

/// `cairn log RUN --json`.
#[derive(serde::Serialize)]
struct RunTimeline {
    run: RunRecord,
    stages: Vec<StageRun>,
}

/// The error for run `run_id`, which this pipeline's ledger does not have.
pub(super) fn no_such_run(ledger: &Ledger, run_id: i64) -> Result<CliError, CliError> {
    let hint = match ledger.runs(1)?.first() {
        Some(newest) => format!("its newest is run {}", newest.id),
        None => "it has no run yet".to_owned(),
    };
    Ok(CliError::usage(format!(
        "no run {run_id} in this pipeline's ledger ({hint}; `cairn log` lists them)"
    )))
}

/// One run's timeline: each selected stage, its state, why, when it
/// started (from the run's start) and for how long.
fn run_timeline(ledger: &Ledger, run_id: i64, json: bool) -> Result<(), CliError> {
    let Some(run) = ledger.run(run_id)? else {
        return Err(no_such_run(ledger, run_id)?);
    };
    let stages = ledger.stage_runs(run_id)?;
    if json {
        render::json(&RunTimeline { run, stages })?;
        return Ok(());
    }
    let took = run
        .finished_ms
        .map(|f| format!(", {}", render::elapsed_ms(run.started_ms, f)))
        .unwrap_or_default();
    let mut about = vec![format!(
        "run {} {}: started {}{took}",
        run.id,
        run.status,
        render::time(run.started_ms)
    )];
    if let Some(version) = &run.cairn_version {
        about.push(format!("cairn {version}"));
    }
    if let Some(digest) = &run.manifest_digest {
        about.push(format!("manifest {}", &digest[..digest.len().min(12)]));
    }
    outln!("{}", about.join(" · "));
    outln!("  {}", run.command);
    if stages.is_empty() {
        outln!(
            "(no stage timeline: the run was recorded before ledger schema 10, or it was killed)"
        );
        return Ok(());
    }
    let mut rows = vec![
        ["STAGE", "STATE", "START", "DURATION", "WHERE", "WHY"]
            .map(String::from)
            .to_vec(),
    ];
    for stage in &stages {
        let start = stage
            .started_ms
            .map(|s| format!("+{}", render::elapsed_ms(run.started_ms, s)))
            .unwrap_or_default();
        let duration = stage
            .started_ms
            .zip(stage.finished_ms)
            .map(|(s, f)| render::elapsed_ms(s, f))
            .unwrap_or_default();
        let why = match (&stage.reason, &stage.message) {
            (Some(reason), Some(message)) => format!("{reason}: {message}"),
            (Some(text), None) | (None, Some(text)) => text.clone(),
            (None, None) => String::new(),
        };
        rows.push(vec![
            stage.stage.clone(),
            stage.state.clone(),
            start,
            duration,
            format!("{}@{}", stage.executor, stage.host),
            why,
        ]);
    }
    out!("{}", render::table(&rows));
    Ok(())
}

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
    // A number no stage is named: a run.
    if let Some(run) = args
        .stage
        .as_deref()
        .filter(|s| loaded.manifest.stage(s).is_none())
        .and_then(|s| s.parse::<i64>().ok())
    {
        return run_timeline(ledger, run, args.json);
    }
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
