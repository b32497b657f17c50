//! What a report shows, gathered from the manifest, the ledger and the
//! workspace: the data behind the HTML page, and `cairn report --json`.

use std::collections::{BTreeMap, HashSet};

use serde::Serialize;

use crate::release::format::{FreezeManifest, MANIFEST_FILE};
use crate::schedule::{self, Context, ItemTracer, ScheduleError};
use crate::store::{ClassCount, ItemAttempt, RunRecord, StageRun, StoreError};

/// The version of the report's data (`--json`).
pub const REPORT_FORMAT: u32 = 1;

/// At most this many item attempts are drawn on the timeline (the longest
/// ones, and every one that did not end `ok`); the rest are counted.
pub const ATTEMPTS_DRAWN: usize = 2_000;

/// Rows in the tables of slowest and troubled items.
const TABLE_ROWS: usize = 15;

#[derive(Debug, Serialize)]
pub struct Report {
    pub format: u32,
    pub pipeline: String,
    pub profile: Option<String>,
    pub generated_ms: i64,
    /// The run the report is about.
    pub run: RunRecord,
    /// The newest runs, newest first (the report's run among them).
    pub runs: Vec<RunRecord>,
    /// Every stage of the manifest, in topological order.
    pub stages: Vec<StageNode>,
    /// Upstream → downstream, by stage name.
    pub edges: Vec<(String, String)>,
    /// The run's item attempts drawn on its timeline.
    pub attempts: Vec<ItemAttempt>,
    /// All of the run's item attempts, drawn or not.
    pub attempts_total: usize,
    /// The run's slowest item attempts, slowest first.
    pub slowest: Vec<ItemAttempt>,
    /// The run's items that were retried or ended in `infra`.
    pub troubled: Vec<Troubled>,
    /// Per run (of the newest runs, and the report's) and stage code: the
    /// classes items ended in.
    pub outcomes_by_run: Vec<ClassCount>,
    /// Now: each item's newest outcome, by stage code.
    pub outcomes_now: Vec<ClassCount>,
    /// The sampled stages' pass@k, groups and model comparisons.
    pub samples: Vec<serde_json::Value>,
    /// Each freeze in the workspace, its items linked to their chains.
    pub releases: Vec<Release>,
}

#[derive(Debug, Serialize)]
pub struct StageNode {
    pub name: String,
    pub upstream: Vec<String>,
    pub per_item: bool,
    /// Its state now, as `cairn status` evaluates it.
    pub status: String,
    /// Why it is not fresh now.
    pub status_reason: Option<String>,
    /// A per-item stage: how many of its items' outcomes now were
    /// imported (`cairn import`), not made by cairn.
    #[serde(skip_serializing_if = "is_zero")]
    pub imported: usize,
    /// What the report's run did with it (`None`: not selected).
    pub run: Option<StageRun>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// An item the run had trouble with.
#[derive(Debug, Serialize)]
pub struct Troubled {
    pub stage: String,
    pub item: String,
    pub attempts: u32,
    /// Each attempt's class, in order.
    pub classes: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct Release {
    /// The `freeze` stage.
    pub stage: String,
    /// Its output directory.
    pub path: String,
    pub name: String,
    pub version: String,
    pub semantic_digest: String,
    /// Its files outside `items/` (its manifest, its checksums), which the
    /// freeze stage itself wrote.
    pub files: Vec<String>,
    pub items: Vec<ReleasedItem>,
}

#[derive(Debug, Serialize)]
pub struct ReleasedItem {
    pub id: String,
    pub split: String,
    /// Its files, relative to the freeze's directory.
    pub files: Vec<String>,
    /// The items it came from, nearest first.
    pub chain: Vec<ChainStep>,
}

#[derive(Debug, Serialize)]
pub struct ChainStep {
    pub stage: String,
    pub item: String,
    pub class: Option<String>,
    pub attempts: u32,
    pub run_id: Option<i64>,
    pub code: String,
    pub log: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    #[error("no run {0} in this pipeline's ledger (`cairn log` lists the runs)")]
    NoSuchRun(i64),
    #[error("no run is recorded yet; `cairn run` records one")]
    NoRuns,
}

/// Gathers the report of run `run` (the newest if `None`). `ctx` is read:
/// its stages are evaluated (for their state now) and their items traced.
pub fn gather(ctx: &mut Context<'_>, run: Option<i64>) -> Result<Report, ReportError> {
    let every = vec![true; ctx.manifest.stages.len()];
    let statuses = schedule::evaluate(ctx, &every, &HashSet::new())?;
    let ctx = &*ctx;
    let Some(ledger) = &ctx.ledger else {
        return Err(ReportError::NoRuns);
    };
    let runs = ledger.runs(20)?;
    let run = match run {
        Some(id) => ledger.run(id)?.ok_or(ReportError::NoSuchRun(id))?,
        None => runs.first().cloned().ok_or(ReportError::NoRuns)?,
    };
    let mut stage_runs: BTreeMap<String, StageRun> = ledger
        .stage_runs(run.id)?
        .into_iter()
        .map(|s| (s.stage.clone(), s))
        .collect();
    let manifest = ctx.manifest;
    let stages = ctx
        .dag
        .order()
        .iter()
        .map(|&i| {
            let stage = &manifest.stages[i];
            let status = statuses.iter().find(|s| s.stage == stage.name);
            StageNode {
                name: stage.name.clone(),
                upstream: ctx
                    .dag
                    .upstream(i)
                    .iter()
                    .map(|&u| manifest.stages[u].name.clone())
                    .collect(),
                per_item: stage.foreach.is_some(),
                status: status.map_or("unknown", |s| s.state.as_str()).to_owned(),
                status_reason: status.and_then(|s| s.reason.as_ref()).map(|r| r.summary()),
                imported: (status.and_then(|s| s.items.as_ref())).map_or(0, |items| items.imported),
                run: stage_runs.remove(&stage.name),
            }
        })
        .collect();
    let edges = ctx
        .dag
        .edges()
        .iter()
        .map(|(from, to, _)| {
            (
                manifest.stages[*from].name.clone(),
                manifest.stages[*to].name.clone(),
            )
        })
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();

    let all: Vec<ItemAttempt> = ledger
        .run_attempts(run.id)?
        .into_iter()
        .filter(|a| !a.key.is_empty())
        .collect();
    let (attempts, slowest, troubled) = attempts_of(&all);
    let samples = manifest
        .stages
        .iter()
        .enumerate()
        .filter_map(|(i, stage)| {
            let samples = stage.foreach.as_ref()?.samples.as_ref()?;
            let plan = ctx.item_plan(i)?;
            Some(schedule::sampled_summary(&stage.name, plan, samples, None))
        })
        .collect();
    Ok(Report {
        format: REPORT_FORMAT,
        pipeline: manifest.name.clone(),
        profile: manifest.profile.clone(),
        generated_ms: crate::store::now_ms(),
        attempts_total: all.len(),
        attempts,
        slowest,
        troubled,
        outcomes_by_run: ledger
            .attempt_classes(runs.last().map_or(run.id, |oldest| oldest.id.min(run.id)))?,
        outcomes_now: ledger.outcome_classes()?,
        samples,
        releases: releases(ctx)?,
        run,
        runs,
        stages,
        edges,
    })
}

/// The attempts drawn, the slowest, and the troubled items.
fn attempts_of(all: &[ItemAttempt]) -> (Vec<ItemAttempt>, Vec<ItemAttempt>, Vec<Troubled>) {
    let took = |a: &ItemAttempt| a.finished_ms - a.started_ms;
    let mut by_length: Vec<&ItemAttempt> = all.iter().collect();
    by_length.sort_by_key(|a| std::cmp::Reverse(took(a)));
    let slowest = by_length
        .iter()
        .take(TABLE_ROWS)
        .map(|a| (*a).clone())
        .collect();
    // Every attempt that did not end ok, then the longest of the others.
    let mut drawn: Vec<&ItemAttempt> = by_length
        .iter()
        .copied()
        .filter(|a| a.class != "ok")
        .collect();
    drawn.truncate(ATTEMPTS_DRAWN);
    let room = ATTEMPTS_DRAWN - drawn.len();
    drawn.extend(
        by_length
            .iter()
            .copied()
            .filter(|a| a.class == "ok")
            .take(room),
    );
    drawn.sort_by_key(|a| (a.started_ms, a.stage.clone(), a.key.clone()));
    let attempts = drawn.into_iter().cloned().collect();

    let mut per_item: BTreeMap<(&str, &str), Vec<&str>> = BTreeMap::new();
    for a in all {
        per_item
            .entry((&a.stage, &a.key))
            .or_default()
            .push(&a.class);
    }
    let mut troubled: Vec<Troubled> = per_item
        .into_iter()
        .filter(|(_, classes)| classes.len() > 1 || classes.contains(&"infra"))
        .map(|((stage, item), classes)| Troubled {
            stage: stage.to_owned(),
            item: item.to_owned(),
            attempts: classes.len() as u32,
            classes: classes.into_iter().map(str::to_owned).collect(),
        })
        .collect();
    troubled.sort_by_key(|t| std::cmp::Reverse(t.attempts));
    troubled.truncate(TABLE_ROWS * 4);
    (attempts, slowest, troubled)
}

/// Each `freeze` stage's output as the workspace holds it, every item's
/// files with the chain of items it came from.
fn releases(ctx: &Context<'_>) -> Result<Vec<Release>, ReportError> {
    let tracer = ItemTracer::new(ctx);
    let mut releases = Vec::new();
    for stage in &ctx.manifest.stages {
        if stage.uses.as_ref().is_none_or(|u| u.name != "freeze") {
            continue;
        }
        let Some(output) = stage.outputs.first() else {
            continue;
        };
        let dir = ctx.abs(output.path.as_str());
        let Ok(text) = std::fs::read_to_string(dir.join(MANIFEST_FILE)) else {
            continue;
        };
        let Ok(frozen) = serde_json::from_str::<FreezeManifest>(&text) else {
            continue;
        };
        let mut items = Vec::new();
        for (id, item) in &frozen.items {
            let item_dir = dir.join("items").join(id);
            // An item directory the freeze lists but the workspace lost
            // shows no files.
            let files = crate::release::files_under(&item_dir)
                .unwrap_or_default()
                .into_iter()
                .map(|file| format!("items/{id}/{file}"))
                .collect();
            let target = format!("{}/items/{id}", output.path.as_str());
            let chain = tracer
                .trace(&target)?
                .into_iter()
                .map(|step| ChainStep {
                    stage: step.stage,
                    item: step.key,
                    class: step.class,
                    attempts: step.attempts,
                    run_id: step.run_id,
                    code: step.code.short(),
                    log: step.log,
                })
                .collect();
            items.push(ReleasedItem {
                id: id.clone(),
                split: item.split.clone(),
                files,
                chain,
            });
        }
        let files = crate::release::files_under(&dir)
            .unwrap_or_default()
            .into_iter()
            .filter(|f| !f.starts_with("items/"))
            .collect();
        releases.push(Release {
            stage: stage.name.clone(),
            files,
            path: output.path.as_str().to_owned(),
            name: frozen.name,
            version: frozen.version,
            semantic_digest: frozen.semantic_digest,
            items,
        });
    }
    Ok(releases)
}
