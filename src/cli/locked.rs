//! `--locked`: is what a run would produce what the committed lock file
//! says?
//!
//! A stage matches when the lock file has an entry for it under the
//! fingerprint the stage has now (same inputs, command, params, …). A run
//! then either reuses that very result or re-runs the stage (its stored
//! copy is gone, e.g. on a fresh CI machine), and whether the re-run
//! reproduced the locked outputs is checked after the run — as is a stage
//! whose fingerprint cannot be known before an upstream stage has run. A missing lock
//! file, or one that cannot be trusted, matches nothing.

use super::error::{CliError, exit};
use crate::schedule::{Context, DirtyReason, StageStatus};

/// Why each selected stage would not match the lock file (empty: all do).
pub fn differences(ctx: &Context<'_>, statuses: &[StageStatus]) -> Vec<String> {
    let lock_path = ctx.manifest.lock_path();
    if let Some(problem) = &ctx.lock_problem {
        return vec![problem.to_string()];
    }
    let Some(lock) = &ctx.lock else {
        return vec![format!(
            "there is no lock file at `{}`; `cairn run` writes it",
            lock_path.display()
        )];
    };
    statuses
        .iter()
        .filter_map(|status| {
            let entry = lock.stages.get(&status.stage);
            match (status.fingerprint, entry) {
                (_, None) => Some(format!("`{}` is not in the lock file", status.stage)),
                // Its inputs come from a stage that runs first (on a fresh
                // machine, say): judged by the lock the run leaves.
                (None, Some(_))
                    if matches!(status.reason, Some(DirtyReason::UpstreamStale { .. })) =>
                {
                    None
                }
                (None, Some(_)) => Some(format!(
                    "`{}` cannot be fingerprinted ({})",
                    status.stage,
                    status
                        .reason
                        .as_ref()
                        .map(|r| r.summary())
                        .unwrap_or_default()
                )),
                (Some(now), Some(entry)) if now != entry.fingerprint => Some(format!(
                    "`{}` has fingerprint {now}, the lock file {}{}",
                    status.stage,
                    entry.fingerprint,
                    status
                        .reason
                        .as_ref()
                        .map(|r| format!(" ({})", r.summary()))
                        .unwrap_or_default()
                )),
                _ => None,
            }
        })
        .collect()
}

/// Reports `differences` on stderr and returns the `--locked` exit.
pub fn refuse(ctx: &Context<'_>, differences: &[String], what: &str) -> CliError {
    errln!(
        "error: {what}: the result would differ from the committed lock file `{}`",
        ctx.manifest.lock_path().display()
    );
    for difference in differences {
        errln!("  {difference}");
    }
    errln!("  help: run without `--locked` to bring the lock file up to date, and commit it");
    CliError::Exit(exit::LOCK_DIFFERS)
}
