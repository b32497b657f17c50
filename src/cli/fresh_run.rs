//! `cairn run` with nothing to do, told by the fresh proof alone: the
//! manifest is hashed, not parsed; the stages are not decided again; every
//! path the last run read and wrote is `stat`ed (see
//! [`crate::schedule::proof`]). Anything else goes the usual way.

use std::path::PathBuf;

use super::args::{Global, RunArgs};
use super::error::CliError;
use super::workspace;
use crate::file_stat::Stated;
use crate::fingerprint::Digest;
use crate::manifest::lock_path_of;
use crate::schedule::proof::{self, CHECK_VAR, Checked, FailedProof, Proof};
use crate::store::{Ledger, RunCounts, StageRun, WorkspaceLock, now_ms};

/// What became of a `cairn run` the proof was asked about.
pub enum Asked {
    /// The proof held: the run is recorded, every stage fresh.
    Answered,
    /// The stages are to be decided the usual way. When the proof was
    /// read and failed, the workspace's lock and the ledger it was read
    /// from are handed on (the ledger speaking for the proof's pipeline).
    Decide(Option<Box<Held>>),
}

/// A proof that was read and failed, and what the run takes on from its
/// check.
pub struct Held {
    pub failed: FailedProof,
    /// The validated manifest kept beside the proof that failed, encoded
    /// (see [`crate::manifest::kept`]).
    pub kept_manifest: Option<Vec<u8>>,
    /// The `stat`s the proof's check took of the files it found unchanged,
    /// while the lock was held.
    pub stated: Stated,
    /// The file the proof found changed, if a file was what failed it.
    pub changed: Option<PathBuf>,
}

/// Answers `cairn run` from the proof the last run kept, if it holds.
pub fn run(global: &Global, args: &RunArgs) -> Result<Asked, CliError> {
    let policy = proof::Policy {
        every_stage: args.targets.is_empty(),
        remote_cache: args.remote.remote_cache.is_some(),
        only: args.only.is_some(),
        // (`-v` lists every fresh stage as it is decided.)
        asks_more: global.verbose > 0
            || !args.force.is_empty()
            || !args.reverify.is_empty()
            || args.dry_run
            || args.locked
            || args.json
            || args.detach
            || args.limit.is_some()
            || args.jobs == Some(0),
    };
    if !policy.may_answer() {
        return Ok(Asked::Decide(None));
    }
    let path = workspace::manifest_path(global)?;
    let Ok(source) = std::fs::read(&path) else {
        return Ok(Asked::Decide(None));
    };
    let profile = global.profile.as_deref();
    let (Some(key), Ok(text)) = (
        proof::key(&path, &source, profile),
        std::str::from_utf8(&source),
    ) else {
        return Ok(Asked::Decide(None));
    };
    let Some(root) = proof::root_hint(&path, text) else {
        return Ok(Asked::Decide(None));
    };
    let cache = crate::store::layout::cache(&root);
    // (Taking the lock makes the cache directory: only where a ledger is.)
    if !crate::store::layout::ledger(&cache).is_file() {
        return Ok(Asked::Decide(None));
    }
    // Another cairn at work: the usual way waits for it.
    let Some(lock) = WorkspaceLock::try_acquire(&cache) else {
        return Ok(Asked::Decide(None));
    };
    // A ledger that cannot be read is the usual way's to report.
    let Ok(Some((ledger, body))) = Ledger::open_for_proof(&cache, &key) else {
        return Ok(Asked::Decide(None));
    };
    let Some(mut proof) = Proof::decode(&body).filter(|proof| proof.root == root) else {
        return Ok(Asked::Decide(None));
    };
    let held = |lock, ledger, key, (kept_manifest, kept_history)| {
        Box::new(Held {
            failed: FailedProof {
                lock,
                ledger,
                root: root.clone(),
                lock_path: lock_path_of(&path),
                key,
                kept_history,
            },
            kept_manifest,
            stated: Stated::default(),
            changed: None,
        })
    };
    match proof.check() {
        Checked::Fails {
            why,
            stated,
            changed,
        } => {
            tracing::debug!(
                "the fresh proof does not hold: {why} ({} files found as it saw them)",
                stated.len()
            );
            let kept = (
                ledger.kept_manifest(&key).ok().flatten(),
                ledger.kept_history(&key).ok().flatten(),
            );
            // (A killed run's processes may still write: until they are
            // found and killed, nothing found on disk is taken as it was.)
            let quiet = matches!(ledger.has_open_runs(), Ok(false));
            let mut held = held(lock, ledger, Some(key), kept);
            if quiet {
                held.stated = stated;
            }
            held.changed = changed;
            return Ok(Asked::Decide(Some(held)));
        }
        Checked::Holds { renewed } => {
            tracing::debug!(
                "the fresh proof holds: {} paths as the last run left them{}",
                proof.paths(),
                if renewed {
                    " (racy files hashed again)"
                } else {
                    ""
                }
            );
            if renewed && let Err(error) = ledger.renew_fresh_proof(&key, &proof.encode()) {
                tracing::debug!("the fresh proof was not renewed: {error}");
            }
        }
    }
    // A run that died is for the usual way to close (and its processes
    // to be found).
    if !matches!(ledger.has_open_runs(), Ok(false)) {
        return Ok(Asked::Decide(Some(held(lock, ledger, None, (None, None)))));
    }
    if std::env::var_os(CHECK_VAR).is_some() {
        check_the_slow_way(global)?;
    }
    let run_id = record(&ledger, &proof, profile, &source)?;
    if !global.quiet {
        errln!("0 ran, {} fresh (run {run_id})", proof.stages.len());
    }
    Ok(Asked::Answered)
}

/// Records the run as a no-op run is recorded: every stage fresh.
fn record(
    ledger: &Ledger,
    proof: &Proof,
    profile: Option<&str>,
    source: &[u8],
) -> Result<i64, CliError> {
    let token = format!("{}-{}", std::process::id(), now_ms());
    let digest = Digest::of(source).hex();
    let run_id = ledger.begin_run(&super::shared_cache::invocation(), profile, &token, &digest)?;
    let now = now_ms();
    let host = crate::schedule::host_name();
    let stages: Vec<StageRun> = proof
        .stages
        .iter()
        .map(|(stage, executor)| StageRun::fresh(stage, executor, &host, now))
        .collect();
    ledger.record_stage_runs(run_id, &stages)?;
    let counts = RunCounts {
        fresh: stages.len(),
        ..RunCounts::default()
    };
    ledger.finish_run(run_id, "ok", counts)?;
    Ok(run_id)
}

/// `CAIRN_CHECK_FRESH_PROOF`: every stage decided the usual way must be
/// fresh with its outputs in place, or the proof was wrong.
fn check_the_slow_way(global: &Global) -> Result<(), CliError> {
    let loaded = workspace::load(global)?;
    let mut ctx = loaded.read_context()?;
    let every = vec![true; loaded.manifest.stages.len()];
    let statuses = crate::schedule::evaluate(&mut ctx, &every, &Default::default())?;
    let wrong: Vec<String> = statuses
        .iter()
        .filter(|s| s.reason.is_some() || !s.outputs_to_restore.is_empty())
        .map(|s| match &s.reason {
            Some(reason) => format!("`{}` ({})", s.stage, reason.summary()),
            None => format!("`{}` (outputs to restore)", s.stage),
        })
        .collect();
    if wrong.is_empty() {
        return Ok(());
    }
    Err(CliError::Usage {
        message: format!(
            "internal error: the fresh proof held, but these stages are not fresh: {}",
            wrong.join(", ")
        ),
        help: Some("please report this as a cairn bug".to_owned()),
    })
}
