//! The one place that decides whether a stage runs, and why.
//!
//! A stage is decided from its key (what it reads and how it runs, see
//! `crate::fingerprint`), the ledger's results under that key, the store's
//! copies of their outputs and what the run asks of it (`--force`, an
//! upstream stage that will run first). `cairn run` acts on the
//! [`Decision`] (restores or runs); `status`, `run -n` and `why` report it.
//! The proptest that a prediction is what a run does guards that both
//! read the same decision.

use std::borrow::Cow;

use serde::Serialize;

use super::ScheduleError;
use super::context::Context;
use super::task::Only;
use crate::fingerprint::{Change, Digest, StageKey};
use crate::manifest::ItemClass;
use crate::store::ResultStatus;
use crate::store::{OutputRecord, ResultRecord};

/// What a stage is asked beyond its own state.
#[derive(Debug, Default)]
pub struct Asked {
    /// `--force` named it.
    pub forced: bool,
    /// `--only`: it runs if it has items in that state (known once its
    /// key is made, which plans its items).
    pub only: Option<Only>,
    /// The upstream stages that will run before it: a prediction's (a run
    /// decides a stage only once its upstream stages ran).
    pub upstream_pending: Vec<String>,
    /// A prediction reads each stored copy it would restore to find a
    /// damaged one; a run finds it as it restores (reading every byte
    /// once), removes it and runs the stage, which stores it afresh.
    pub predicting: bool,
}

/// A stage decided.
#[derive(Debug)]
pub struct Decision {
    /// Its key, or why it cannot be computed now (with its causes).
    pub key: Result<StageKey, String>,
    pub verdict: Verdict,
}

/// Whether a stage is fresh or runs.
#[derive(Debug)]
pub enum Verdict {
    /// A valid result exists for its key: `restore` lists the outputs
    /// whose workspace copy differs from the store (brought back, nothing
    /// run), each stored copy sound if a prediction asked.
    Fresh {
        record: Box<ResultRecord>,
        restore: Vec<OutputRecord>,
    },
    /// It must run, for this reason.
    Run(DirtyReason),
}

/// Decides stage `i`.
pub fn decide(ctx: &mut Context<'_>, i: usize, asked: Asked) -> Result<Decision, ScheduleError> {
    let key = ctx.key_of(i).map_err(|error| super::with_causes(&error));
    let verdict = if asked.forced || asked.only.is_some_and(|only| has_units_in(ctx, i, only)) {
        Verdict::Run(DirtyReason::Forced)
    } else if !asked.upstream_pending.is_empty() {
        Verdict::Run(DirtyReason::UpstreamStale {
            stages: asked.upstream_pending,
        })
    } else {
        match &key {
            // No upstream stage is pending, so nothing will create what is
            // missing: running it would fail the same way.
            Err(error) => Verdict::Run(DirtyReason::Unreadable {
                error: error.clone(),
            }),
            Ok(key) => match freshness(ctx, i, key)? {
                Freshness::Dirty(reason) => Verdict::Run(reason),
                Freshness::Fresh(record) => fresh(ctx, record.into_owned(), asked.predicting)?,
            },
        }
    };
    Ok(Decision { key, verdict })
}

/// Whether per-item stage `i` has items in the state `--only` names.
fn has_units_in(ctx: &Context<'_>, i: usize, only: Only) -> bool {
    ctx.item_plan(i).is_some_and(|plan| {
        plan.iter().any(|p| {
            matches!(
                (&p.outcome, only),
                (None, Only::Pending)
                    | (Some((ItemClass::Infra, _)), Only::Infra)
                    | (Some((ItemClass::Error, _)), Only::Error)
            )
        })
    })
}

/// A valid result's verdict: fresh, with the outputs the workspace lost or
/// changed to restore; unless a prediction finds the stored copy of one of
/// them damaged, and the stage then runs again (a restore is made only of
/// sound bytes; a run finds the damage as it restores).
fn fresh(
    ctx: &mut Context<'_>,
    record: ResultRecord,
    predicting: bool,
) -> Result<Verdict, ScheduleError> {
    let mut restore = Vec::new();
    for output in &record.outputs {
        if ctx.workspace_matches(output) {
            continue;
        }
        if predicting && !ctx.stored_intact(output)? {
            return Ok(Verdict::Run(DirtyReason::StoreIncomplete {
                output: output.name.clone(),
            }));
        }
        restore.push(output.clone());
    }
    Ok(Verdict::Fresh {
        record: Box::new(record),
        restore,
    })
}

/// Fresh or dirty (and why), given the stage's current key.
fn freshness<'c>(
    ctx: &'c Context<'_>,
    i: usize,
    key: &StageKey,
) -> Result<Freshness<'c>, ScheduleError> {
    let stage = &ctx.manifest.stages[i];
    let fingerprint = key.fingerprint();
    if let Some(record) = ctx.lookup(&stage.name, &fingerprint)? {
        for output in &record.outputs {
            if !ctx.stored_completely(output)? {
                return Ok(Freshness::Dirty(DirtyReason::StoreIncomplete {
                    output: output.name.clone(),
                }));
            }
        }
        if let Some(effect) = missing_effect(ctx, stage, &record)? {
            return Ok(Freshness::Dirty(DirtyReason::EffectMissing { effect }));
        }
        return Ok(Freshness::Fresh(record));
    }
    if let Some(attempt) = ctx.latest_failure.get(&stage.name)
        && attempt.status == ResultStatus::Failed
        && attempt.fingerprint == fingerprint
    {
        return Ok(Freshness::Dirty(DirtyReason::Failed {
            exit_code: attempt.exit_code,
            error: attempt.error.clone(),
        }));
    }
    Ok(Freshness::Dirty(match ctx.latest_ok.get(&stage.name) {
        None => DirtyReason::NeverRun,
        // Reading the recorded key back costs a query per stage; a run
        // nobody watches (`--quiet`) only needs to know it changed.
        Some(previous) if ctx.explain => DirtyReason::Changed {
            changes: key.diff(&ctx.recorded_key(previous)?),
        },
        Some(_) => DirtyReason::Changed {
            changes: Vec::new(),
        },
    }))
}

/// What is missing of the work a built-in's result stands for beyond
/// its outputs (`register`'s import), read from the stored copy of the
/// output that describes it; `None` if nothing is, or if that copy
/// cannot be read (a damaged copy is the restore's to find).
fn missing_effect(
    ctx: &Context<'_>,
    stage: &crate::manifest::Stage,
    record: &ResultRecord,
) -> Result<Option<String>, ScheduleError> {
    let Some(uses) = &stage.uses else {
        return Ok(None);
    };
    let Some(port) = crate::builtins::effect_output(&uses.name) else {
        return Ok(None);
    };
    let Some(output) = record.outputs.iter().find(|o| o.name == port) else {
        return Ok(None);
    };
    let bytes = match (&ctx.ledger, output.inline) {
        (Some(ledger), true) => ledger.inline_object(&output.digest)?,
        (None, true) => None,
        (_, false) => std::fs::read(ctx.store.object_path(&output.digest)).ok(),
    };
    Ok(bytes
        .filter(|bytes| Digest::of(bytes) == output.digest)
        .and_then(|bytes| crate::builtins::missing_effect(uses, &bytes, &ctx.manifest.root)))
}

/// Why a stage must run (or why `status` calls it stale).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", rename_all = "kebab-case")]
pub enum DirtyReason {
    /// No successful result was ever recorded for this stage.
    NeverRun,
    /// `--force` named it.
    Forced,
    /// These components differ from the last successful result.
    Changed { changes: Vec<Change> },
    /// The last attempt under this very fingerprint failed.
    Failed {
        exit_code: Option<i32>,
        error: Option<String>,
    },
    /// A result exists but its stored objects are gone or damaged.
    StoreIncomplete { output: String },
    /// Upstream stages will run first; this one may or may not follow.
    UpstreamStale { stages: Vec<String> },
    /// Its fingerprint cannot be computed (an unreadable input or item
    /// list); running it would fail the same way.
    Unreadable { error: String },
    /// A result exists, but the work it stands for beyond its outputs is
    /// gone (a `register` stage's import into its registry, an
    /// `oci-mirror` stage's copies in an OCI layout).
    EffectMissing { effect: String },
}

impl DirtyReason {
    /// A one-line explanation.
    pub fn summary(&self) -> String {
        match self {
            DirtyReason::NeverRun => "never run".to_owned(),
            DirtyReason::Forced => "forced".to_owned(),
            DirtyReason::Changed { changes } if changes.is_empty() => "changed".to_owned(),
            DirtyReason::Changed { changes } => {
                const SHOWN: usize = 3;
                let mut names: Vec<String> = changes
                    .iter()
                    .take(SHOWN)
                    .map(describe_component_change)
                    .collect();
                if changes.len() > SHOWN {
                    names.push(format!("{} more", changes.len() - SHOWN));
                }
                format!("changed: {}", names.join(", "))
            }
            DirtyReason::Failed { exit_code, error } => match (error, exit_code) {
                (Some(error), _) => format!("last attempt failed: {error}"),
                (None, Some(code)) => format!("last attempt failed (exit {code})"),
                (None, None) => "last attempt failed".to_owned(),
            },
            DirtyReason::StoreIncomplete { output } => {
                format!("stored copy of output `{output}` is missing or damaged")
            }
            DirtyReason::UpstreamStale { stages } => {
                format!("upstream {} will run first", quote_list(stages))
            }
            DirtyReason::Unreadable { error } => format!("cannot be fingerprinted: {error}"),
            DirtyReason::EffectMissing { effect } => effect.clone(),
        }
    }
}

fn describe_component_change(change: &Change) -> String {
    let (kind, name) = change
        .component
        .split_once(':')
        .unwrap_or((&change.component, ""));
    let what = match kind {
        "input" => format!("input `{name}`"),
        "param" => format!("param `{name}`"),
        "env" => format!("env `{name}`"),
        other => other.to_owned(),
    };
    match (&change.old, &change.new) {
        (None, Some(_)) => format!("{what} (added)"),
        (Some(_), None) => format!("{what} (removed)"),
        _ => what,
    }
}

pub(crate) fn quote_list(items: &[String]) -> String {
    items
        .iter()
        .map(|s| format!("`{s}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The freshness of one stage.
#[derive(Debug, Clone)]
pub enum Freshness<'a> {
    /// A valid result exists for the current fingerprint.
    Fresh(Cow<'a, ResultRecord>),
    Dirty(DirtyReason),
}
