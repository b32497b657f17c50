//! `cairn run`.

use std::collections::HashSet;

use super::args::{Global, RunArgs};
use super::error::{CliError, exit};
use super::fresh_run::{self, Asked};
use super::locked;
use super::progress::HumanReporter;
use super::run_events::JsonReporter;
use super::workspace;
use crate::file_stat::Stated;
use crate::schedule::proof::EarlyHistory;
use crate::schedule::{self, Context, History, RunOptions, State};
use crate::store::{Ledger, PipelineId};

pub fn run(global: &Global, args: &RunArgs) -> Result<(), CliError> {
    // With the workspace held for a proof that failed, its history is read
    // while the manifest is parsed, or taken up as it was kept beside the
    // proof.
    // The `stat`s the proof's check took stand for the run's own while the
    // workspace is held from then on.
    let (early, kept, stated, changed) = match fresh_run::run(global, args)? {
        Asked::Answered => return Ok(()),
        Asked::Decide(None) => (None, None, Stated::default(), None),
        Asked::Decide(Some(mut held)) => {
            let kept = held.kept_manifest.take();
            let stated = std::mem::take(&mut held.stated);
            let changed = held.changed.take();
            let early = EarlyHistory::start(held.failed);
            let stated = if early.is_some() {
                stated
            } else {
                Stated::default()
            };
            (early, kept, stated, changed)
        }
    };
    let taken_up = match &kept {
        Some(kept) => workspace::take_up(global, kept, &stated)?,
        None => None,
    };
    let kept_manifest_refused = kept.is_some() && taken_up.is_none();
    let loaded = match taken_up {
        Some(loaded) => loaded,
        None => workspace::load(global)?,
    };
    let selected = loaded.selection(&args.targets)?;
    let forced = loaded.forced(&args.force)?;
    let reverify = reverified(&loaded, &args.reverify)?;
    if args.jobs == Some(0) {
        return Err(CliError::usage("`-j 0` would run nothing; give at least 1"));
    }
    let kept_lists = early
        .as_ref()
        .map_or(&[][..], |early| early.kept_lists(&loaded.manifest));
    schedule::check_item_lists(&loaded.manifest, &selected, kept_lists)?;

    if args.dry_run {
        let mut ctx = loaded.read_context()?;
        let asked: HashSet<usize> = forced.stages.union(&reverify).copied().collect();
        let statuses = schedule::evaluate(&mut ctx, &selected, &asked)?;
        if args.locked {
            let differences = locked::differences(&ctx, &statuses);
            if !differences.is_empty() {
                return Err(locked::refuse(&ctx, &differences, "`run --locked`"));
            }
        }
        let mut would = 0;
        for status in &statuses {
            match (&status.reason, status.state) {
                (Some(reason), _) => {
                    would += 1;
                    outln!("would run  {} ({})", status.stage, reason.summary());
                }
                (None, State::Fresh) if !status.outputs_to_restore.is_empty() => {
                    outln!(
                        "would restore  {} ({})",
                        status.stage,
                        status.outputs_to_restore.join(", ")
                    );
                }
                _ => {}
            }
        }
        if would == 0 {
            outln!("nothing to run: {} stage(s) fresh", statuses.len());
        }
        return Ok(());
    }

    let manifest = &loaded.manifest;
    let early = early.map(|early| early.finish(manifest));
    let (_lock, history, stated) = match early {
        Some((lock, Some(history))) => {
            tracing::debug!("the history was read while the manifest was parsed");
            (lock, history?, stated)
        }
        // Read for another pipeline than the manifest's (its lock let go
        // first), or not read early: the usual way.
        early => {
            drop(early);
            let lock = workspace::hold(manifest, args.no_wait)?;
            let ledger = Ledger::open(&manifest.cache_dir(), &PipelineId::of(manifest))?;
            if args.locked {
                // Checked before anything runs: a stage whose fingerprint
                // differs from the lock file would certainly change it.
                let mut check = loaded.read_context()?;
                let statuses = schedule::evaluate(&mut check, &selected, &forced.stages)?;
                let differences = locked::differences(&check, &statuses);
                if !differences.is_empty() {
                    return Err(locked::refuse(&check, &differences, "`run --locked`"));
                }
            }
            let history = History::read(&manifest.lock_path(), &manifest.name, Some(ledger))?;
            // (The workspace was let go meanwhile: its `stat`s may be old.)
            (Some(lock), history, Stated::default())
        }
    };
    let mut ctx = Context::with_history(manifest, &loaded.dag, history);
    ctx.stat.use_stated(stated);
    ctx.explain = !global.quiet;
    // (`--locked` reported it already, reading it for the check.)
    if let Some(problem) = ctx
        .lock_problem
        .as_ref()
        .filter(|_| !global.quiet && !args.locked)
    {
        errln!("warning: {problem}");
    }
    let options = RunOptions {
        jobs: args
            .jobs
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get())),
        keep_going: args.keep_going,
        forced: forced.stages,
        forced_items: forced.items,
        reverify,
        selected,
        invocation: super::shared_cache::invocation(),
        limit: args.limit,
        only: args.only,
        locked: args.locked,
        remote: super::shared_cache::open(&loaded, &args.remote)?,
        kept_manifest_refused,
        changed,
    };

    // One scheduler thread: it only waits on children and hands work out;
    // hashing and copying run on tokio's blocking pool.
    if args.detach {
        crate::exec::detach_cluster_jobs();
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(CliError::Output)?;
    let summary = if args.json {
        let mut reporter = JsonReporter::default();
        match runtime.block_on(schedule::run(&mut ctx, &options, &mut reporter)) {
            Ok(summary) => {
                reporter.finished(&summary);
                summary
            }
            Err(error) => {
                reporter.failed(&schedule::with_causes(&error));
                return Err(error.into());
            }
        }
    } else {
        let mut reporter = HumanReporter::new(global.quiet, global.verbose > 0);
        let summary = runtime.block_on(schedule::run(&mut ctx, &options, &mut reporter));
        reporter.finish();
        summary?
    };

    let c = summary.counts;
    if !global.quiet {
        let mut parts = vec![format!("{} ran", c.executed), format!("{} fresh", c.fresh)];
        if c.restored > 0 {
            parts.push(format!("{} restored", c.restored));
        }
        if c.failed > 0 {
            parts.push(format!("{} failed", c.failed));
        }
        if !summary.partial.is_empty() {
            parts.push(format!("{} partial", summary.partial.len()));
        }
        if !summary.cut_short.is_empty() {
            parts.push(format!("{} interrupted", summary.cut_short.len()));
        }
        if summary.not_attempted() > 0 {
            parts.push(format!("{} not attempted", summary.not_attempted()));
        }
        errln!("{} (run {})", parts.join(", "), summary.run_id);
        if let Some(remote) = &options.remote {
            errln!("{}", schedule::remote_summary(remote));
        }
    }
    match summary.uploads_unfinished {
        0 => {}
        usize::MAX => {
            errln!("warning: uploads to the remote cache were cut short; the results are kept here")
        }
        left => errln!(
            "warning: {left} upload(s) to the remote cache did not finish in time; the results are kept here"
        ),
    }
    if summary.interrupted {
        return Err(CliError::Exit(exit::INTERRUPTED));
    }
    if !summary.lock_differs.is_empty() && summary.failed.is_empty() {
        let differences: Vec<String> = summary
            .lock_differs
            .iter()
            .map(|stage| format!("`{stage}` produced outputs other than the lock file records"))
            .collect();
        return Err(locked::refuse(&ctx, &differences, "`run --locked`"));
    }
    if !summary.failed.is_empty() {
        if !global.quiet {
            errln!(
                "see `cairn log {}` and `cairn why {}`",
                summary.failed[0],
                summary.failed[0]
            );
        }
        return Err(CliError::Exit(exit::STAGE_FAILED));
    }
    // What the run holds (every stage's key, record and plan) is left for
    // the process's exit to free: freed piece by piece it took a
    // millisecond or two. The ledger's connection is closed as usual.
    drop(ctx.ledger.take());
    std::mem::forget(ctx);
    std::mem::forget(loaded);
    Ok(())
}

/// Takes the workspace, waiting for another cairn unless `no_wait`.
/// The per-item stages `--reverify` names.
fn reverified(loaded: &workspace::Loaded, names: &[String]) -> Result<HashSet<usize>, CliError> {
    let mut stages = HashSet::new();
    for name in names {
        let i = (loaded.manifest.stages.iter())
            .position(|stage| stage.name == *name)
            .ok_or_else(|| loaded.unknown_stage(name))?;
        if loaded.manifest.stages[i].foreach.is_none() {
            return Err(CliError::usage(format!(
                "`--reverify {name}`: `{name}` is not a per-item stage; only item outcomes are imported"
            )));
        }
        stages.insert(i);
    }
    Ok(stages)
}
