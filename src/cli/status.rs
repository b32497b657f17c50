//! `cairn status`: what would run, and an exit status CI can gate on.

use std::collections::HashSet;

use serde::Serialize;

use super::args::{Global, StatusArgs};
use super::error::{CliError, exit};
use super::locked;
use super::render;
use super::workspace;
use crate::schedule::{self, Context, StageStatus};

#[derive(Serialize)]
struct StatusJson<'a> {
    pipeline: &'a str,
    profile: Option<&'a str>,
    stages: &'a [StageStatus],
}

pub fn status(global: &Global, args: &StatusArgs) -> Result<(), CliError> {
    let loaded = workspace::load(global)?;
    let selected = loaded.selection(&args.targets)?;
    let mut ctx = loaded.read_context()?;
    let statuses = schedule::evaluate(&mut ctx, &selected, &HashSet::new())?;
    loaded.save_learnt(&mut ctx);
    let verdict = verdict(&ctx, &statuses, args.locked);

    if args.json {
        render::json(&StatusJson {
            pipeline: &loaded.manifest.name,
            profile: loaded.manifest.profile.as_deref(),
            stages: &statuses,
        })?;
        return verdict;
    }
    let mut rows = vec![vec![
        "STAGE".to_owned(),
        "STATE".to_owned(),
        "DETAIL".to_owned(),
    ]];
    for status in &statuses {
        let detail = match &status.reason {
            Some(reason) => reason.summary(),
            None if !status.outputs_to_restore.is_empty() => {
                format!(
                    "outputs modified, will be restored: {}",
                    status.outputs_to_restore.join(", ")
                )
            }
            None => status
                .last_ok_ms
                .map(|ms| format!("since {}", render::time(ms)))
                .unwrap_or_default(),
        };
        let detail = match &status.items {
            Some(items) => format!("{detail} [{}]", items.summary()),
            None => detail,
        };
        rows.push(vec![
            status.stage.clone(),
            status.state.as_str().to_owned(),
            detail,
        ]);
    }
    out!("{}", render::table(&rows));
    let pending = statuses.iter().filter(|s| s.reason.is_some()).count();
    let to_restore = statuses
        .iter()
        .filter(|s| s.reason.is_none() && !s.outputs_to_restore.is_empty())
        .count();
    let all = statuses.len();
    match (pending, to_restore) {
        (0, 0) => outln!("\nall {all} stage(s) fresh"),
        (0, _) => outln!(
            "\n{to_restore} of {all} stage(s) would have outputs restored from the store; none would run"
        ),
        (_, 0) => outln!("\n{pending} of {all} stage(s) would run; `cairn why STAGE` explains one"),
        (_, _) => outln!(
            "\n{pending} of {all} stage(s) would run and {to_restore} would have outputs restored; `cairn why STAGE` explains one"
        ),
    }
    verdict
}

/// The exit status CI gates on: 0 when every stage is fresh with its
/// outputs in place, 1 when a stage would run, failed, or would have an
/// output restored; with `--locked`, 3 when the result would differ from
/// the committed lock file.
fn verdict(ctx: &Context<'_>, statuses: &[StageStatus], locked: bool) -> Result<(), CliError> {
    if locked {
        let differences = locked::differences(ctx, statuses);
        if !differences.is_empty() {
            return Err(locked::refuse(ctx, &differences, "`status --locked`"));
        }
    }
    let settled = statuses
        .iter()
        .all(|s| s.reason.is_none() && s.outputs_to_restore.is_empty());
    if settled {
        Ok(())
    } else {
        Err(CliError::Exit(exit::STAGE_FAILED))
    }
}
