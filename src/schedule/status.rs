//! What would run, and why — without running anything: each stage's
//! [`super::decision`], reported.

use std::collections::HashSet;

use serde::Serialize;

use super::ScheduleError;
use super::context::Context;
use super::decision::DirtyReason;
use super::decision::{Asked, Verdict, decide};
use super::item_outputs::ItemOutputs;
use super::items::ItemCounts;
use crate::fingerprint::{Change, Digest, StageKey};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum State {
    Fresh,
    Stale,
    NeverRun,
    Failed,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Fresh => "fresh",
            State::Stale => "stale",
            State::NeverRun => "never run",
            State::Failed => "failed",
        }
    }
}

/// The evaluated state of one stage.
#[derive(Debug, Clone, Serialize)]
pub struct StageStatus {
    pub stage: String,
    pub state: State,
    /// The current fingerprint, when every input can be known now.
    pub fingerprint: Option<Digest>,
    /// Why the stage is not fresh.
    pub reason: Option<DirtyReason>,
    /// Differences from the last successful result (also listed when an
    /// upstream stage is stale, assuming it reproduces its last outputs).
    pub changes: Vec<Change>,
    /// Outputs whose workspace copy differs from the store (fresh stages
    /// only); `cairn run` restores them without running anything.
    pub outputs_to_restore: Vec<String>,
    /// When the last successful result finished (ms since the epoch).
    pub last_ok_ms: Option<i64>,
    /// Per-item stages: their items by state.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub items: Option<ItemCounts>,
    /// Per-item stages: keys of the first items without a final outcome.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unfinished_items: Vec<String>,
    #[serde(skip)]
    pub key: Option<StageKey>,
}

/// Evaluates the selected stages in dependency order.
pub fn evaluate(
    ctx: &mut Context<'_>,
    selected: &[bool],
    forced: &HashSet<usize>,
) -> Result<Vec<StageStatus>, ScheduleError> {
    let n = ctx.manifest.stages.len();
    let mut will_run = vec![false; n];
    let mut statuses = Vec::new();
    for &i in ctx.dag.order() {
        if !selected[i] {
            continue;
        }
        let name = ctx.manifest.stages[i].name.clone();
        let pending: Vec<String> = ctx
            .dag
            .upstream(i)
            .iter()
            .filter(|&&u| will_run[u])
            .map(|&u| ctx.manifest.stages[u].name.clone())
            .collect();
        let forced = forced.contains(&i);
        let decision = decide(
            ctx,
            i,
            Asked {
                forced,
                only: None,
                upstream_pending: pending,
                predicting: true,
            },
        )?;
        let key = decision.key.ok();
        forget_unrestorable_items(ctx, i);
        let previous = ctx.latest_ok.get(&name).cloned();

        let mut status = StageStatus {
            stage: name.clone(),
            state: State::Stale,
            fingerprint: key.as_ref().map(StageKey::fingerprint),
            reason: None,
            changes: Vec::new(),
            outputs_to_restore: Vec::new(),
            last_ok_ms: previous.as_ref().map(|p| p.finished_ms),
            items: item_counts(ctx, i)?,
            unfinished_items: ctx
                .item_plan(i)
                .map(|plan| {
                    let foreach = ctx.manifest.stages[i].foreach.as_ref();
                    plan.iter()
                        .filter(|p| !p.is_kept(foreach))
                        .take(20)
                        .map(|p| match &p.outcome {
                            Some((class, _)) => format!("{} ({})", p.item.key, class.name()),
                            None => format!("{} (pending)", p.item.key),
                        })
                        .collect()
                })
                .unwrap_or_default(),
            key: key.clone(),
        };

        let reason = match decision.verdict {
            Verdict::Fresh { record, restore } => {
                ctx.note_outputs(&record.outputs);
                status.last_ok_ms = Some(record.finished_ms);
                status.outputs_to_restore = restore.into_iter().map(|o| o.name).collect();
                None
            }
            Verdict::Run(reason) => Some(reason),
        };

        if let Some(reason) = reason {
            will_run[i] = true;
            // Decoding the previous key costs; only stale stages need the diff.
            if let (Some(key), Some(previous)) = (&key, &previous) {
                status.changes = key.diff(&ctx.recorded_key(previous)?);
            }
            // Predict that the stage reproduces its last outputs, so that
            // downstream keys (and `why`) can still be computed.
            if let Some(previous) = &previous {
                ctx.note_outputs(&previous.outputs);
            }
            status.state = match (&reason, &previous) {
                (DirtyReason::Failed { .. }, _) => State::Failed,
                (_, None) => State::NeverRun,
                _ => State::Stale,
            };
            status.reason = Some(reason);
        } else {
            status.state = State::Fresh;
        }
        statuses.push(status);
    }
    Ok(statuses)
}

/// What became of per-item stage `i`'s items, as planned, with how many
/// of their outcomes were imported.
fn item_counts(ctx: &Context<'_>, i: usize) -> Result<Option<ItemCounts>, ScheduleError> {
    let Some(plan) = ctx.item_plan(i) else {
        return Ok(None);
    };
    let mut counts = ItemCounts::of(plan);
    if let Some(ledger) = &ctx.ledger {
        let imported = ledger.imported_items(&ctx.manifest.stages[i].name)?;
        if !imported.is_empty() {
            let imported: HashSet<(&str, &Digest)> =
                imported.iter().map(|(key, f)| (key.as_str(), f)).collect();
            counts.imported = (plan.iter())
                .filter(|p| {
                    p.outcome.is_some() && imported.contains(&(p.item.key.as_str(), &p.fingerprint))
                })
                .count();
        }
    }
    Ok(Some(counts))
}

/// Items whose outcome `run` will reuse only if their entries can be
/// brought back: those that cannot are pending, as `run` will find.
fn forget_unrestorable_items(ctx: &mut Context<'_>, i: usize) {
    let outputs = ItemOutputs::of(&ctx.manifest.stages[i], &ctx.manifest.root);
    if outputs.is_empty() {
        return;
    }
    let Some((plan, store, stat)) = ctx.item_plan_with_store(i) else {
        return;
    };
    for n in outputs.items_to_rerun(plan, store, stat) {
        plan[n].outcome = None;
    }
}
