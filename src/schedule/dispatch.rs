//! The dispatcher: runs the selected stages in dependency order, at most
//! `jobs` at a time, skipping what is validated and committing each result
//! as soon as it is complete.

use std::collections::{BTreeSet, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokio::task::JoinSet;

use super::ScheduleError;
use super::context::{Context, DirtyReason, Freshness};
use super::events::{Done, Event, Reporter};
use crate::exec::{
    Executor, Job, LocalExecutor, Outcome, RUN_MARKER, base_environment, kill_marked_processes,
};
use crate::fingerprint::StageKey;
use crate::manifest::{Command, EnvValue, Stage};
use crate::store::{
    INLINE_MAX, LockFile, NewResult, ObjectStore, OutputRecord, Published, ResultStatus, RunCounts,
    StoreError, now_ms, remove_path,
};

#[derive(Debug, Clone)]
pub struct RunOptions {
    pub jobs: usize,
    pub keep_going: bool,
    pub forced: HashSet<usize>,
    pub selected: Vec<bool>,
    /// The command line, recorded with the run.
    pub invocation: String,
}

#[derive(Debug, Clone, Default)]
pub struct RunSummary {
    pub run_id: i64,
    pub counts: RunCounts,
    pub failed: Vec<String>,
    pub blocked: Vec<String>,
    pub interrupted: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Waiting,
    Running,
    Ok,
    Failed,
}

/// How a stage's command, checks and output storage ended.
struct TaskResult {
    outcome: Outcome,
    /// Why the stage failed, if it did.
    failure: Option<String>,
    /// The stored outputs, when it succeeded.
    published: Option<Published>,
    started_ms: i64,
    elapsed: Duration,
}

/// Where a task announces that its outputs' digests are known.
struct Hashed {
    tx: tokio::sync::mpsc::UnboundedSender<(usize, Vec<OutputRecord>, Duration)>,
    stage: usize,
}

/// Gives a job slot back to the dispatcher when dropped (also when the task
/// ends early or is aborted).
struct SlotRelease(Option<tokio::sync::mpsc::UnboundedSender<()>>);

impl Drop for SlotRelease {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

/// A declared output, as the task that stores it needs it.
#[derive(Clone)]
struct Declared {
    name: String,
    path: String,
    abs: PathBuf,
}

pub async fn run(
    ctx: &mut Context<'_>,
    options: &RunOptions,
    reporter: &mut dyn Reporter,
) -> Result<RunSummary, ScheduleError> {
    let manifest = ctx.manifest;
    let ledger = ctx.ledger.as_ref().ok_or(ScheduleError::NoLedger)?;
    for token in ledger.close_abandoned_runs()? {
        let killed = kill_marked_processes(&token);
        if killed > 0 {
            tracing::warn!("killed {killed} process(es) left running by a cairn process that died");
        }
    }
    let token = format!("{}-{}", std::process::id(), now_ms());
    let run_id = ledger.begin_run(&options.invocation, manifest.profile.as_deref(), &token)?;
    let log_dir = manifest.cache_dir().join("logs").join(run_id.to_string());

    let n = manifest.stages.len();
    let position: Vec<usize> = {
        let mut p = vec![0; n];
        for (rank, &i) in ctx.dag.order().iter().enumerate() {
            p[i] = rank;
        }
        p
    };
    let mut slots = vec![Slot::Waiting; n];
    let mut remaining: Vec<usize> = (0..n)
        .map(|i| {
            ctx.dag
                .upstream(i)
                .iter()
                .filter(|&&u| options.selected[u])
                .count()
        })
        .collect();
    let mut ready: BTreeSet<(usize, usize)> = (0..n)
        .filter(|&i| options.selected[i] && remaining[i] == 0)
        .map(|i| (position[i], i))
        .collect();
    let mut summary = RunSummary {
        run_id,
        ..Default::default()
    };
    reporter.event(Event::RunStarted {
        run_id,
        stages: options.selected.iter().filter(|s| **s).count(),
    });

    std::fs::create_dir_all(&log_dir).map_err(|source| ScheduleError::Io {
        path: log_dir.clone(),
        source,
    })?;
    let executor = LocalExecutor;
    let mut running: JoinSet<(usize, StageKey, Result<TaskResult, ScheduleError>)> = JoinSet::new();
    // Job slots in use. A slot is released when a stage's command and checks
    // end, before its outputs are stored, so storing overlaps other commands.
    let mut busy = 0usize;
    let (release_tx, mut release_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    // A stage's output digests are final once its outputs are copied into
    // the store's temporary area; downstream stages may start then, while
    // the copies are made durable (their fingerprints depend on content,
    // not on the upstream result being recorded first).
    let (hashed_tx, mut hashed_rx) =
        tokio::sync::mpsc::unbounded_channel::<(usize, Vec<OutputRecord>, Duration)>();

    let mut stop = false;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);

    loop {
        while release_rx.try_recv().is_ok() {
            busy -= 1;
        }
        // Start everything that is ready, up to the job limit.
        while !stop && busy < options.jobs.max(1) {
            let Some(&(rank, i)) = ready.iter().next() else {
                break;
            };
            ready.remove(&(rank, i));
            let stage = &manifest.stages[i];
            let started = Instant::now();
            let key = match ctx.key_of(i) {
                Ok(key) => key,
                Err(error) => {
                    fail(
                        ctx,
                        &mut slots,
                        &mut summary,
                        reporter,
                        i,
                        &error.to_string(),
                        None,
                    );
                    stop |= !options.keep_going;
                    continue;
                }
            };
            let reason = if options.forced.contains(&i) {
                DirtyReason::Forced
            } else {
                match ctx.freshness(i, &key)? {
                    Freshness::Fresh(record) => {
                        let record = record.into_owned();
                        match bring_back(ctx, &record.outputs)? {
                            Err(reason) => reason,
                            Ok(restored) => {
                                ctx.note_outputs(&record.outputs);
                                let done = if restored {
                                    Done::Restored
                                } else {
                                    Done::Fresh
                                };
                                if restored {
                                    summary.counts.restored += 1;
                                } else {
                                    summary.counts.fresh += 1;
                                }
                                reporter.event(Event::StageDone {
                                    stage: &stage.name,
                                    done,
                                    elapsed: started.elapsed(),
                                });
                                complete(
                                    i,
                                    ctx,
                                    options,
                                    &mut slots,
                                    &mut remaining,
                                    &mut ready,
                                    &position,
                                );
                                continue;
                            }
                        }
                    }
                    Freshness::Dirty(reason) => reason,
                }
            };
            reporter.event(Event::StageStarted {
                stage: &stage.name,
                reason: &reason,
            });
            let job = match prepare(ctx, stage, &log_dir, &token) {
                Ok(job) => job,
                Err(error) => {
                    fail(
                        ctx,
                        &mut slots,
                        &mut summary,
                        reporter,
                        i,
                        &error.to_string(),
                        None,
                    );
                    stop |= !options.keep_going;
                    continue;
                }
            };
            slots[i] = Slot::Running;
            let checks = stage.checks.clone();
            let executor = executor.clone();
            let store = ctx.store.clone();
            let declared: Vec<Declared> = stage
                .outputs
                .iter()
                .map(|o| Declared {
                    name: o.name.clone(),
                    path: o.path.to_string(),
                    abs: o.path.resolve(&manifest.root),
                })
                .collect();
            busy += 1;
            let slot = SlotRelease(Some(release_tx.clone()));
            let hashed = Hashed {
                tx: hashed_tx.clone(),
                stage: i,
            };
            running.spawn(async move {
                let result = execute(&executor, job, checks, store, declared, slot, hashed).await;
                (i, key, result)
            });
        }

        if running.is_empty() {
            break;
        }

        tokio::select! {
            Some(()) = release_rx.recv() => busy -= 1,
            Some((i, records, elapsed)) = hashed_rx.recv() => {
                outputs_known(ctx, options, reporter, &mut slots, &mut remaining, &mut ready, &position, i, &records, elapsed);
            }

            joined = running.join_next() => {
                let Some(joined) = joined else { continue };
                let (i, key, result) = joined.map_err(|e| ScheduleError::Task(e.to_string()))?;
                while let Ok((j, records, elapsed)) = hashed_rx.try_recv() {
                    outputs_known(ctx, options, reporter, &mut slots, &mut remaining, &mut ready, &position, j, &records, elapsed);
                }
                let stage = &manifest.stages[i];
                let log = log_dir.join(format!("{}.log", stage.name));
                match result {
                    Err(error) => {
                        record_failure(ctx, run_id, stage, &key, None, now_ms(), &log, &error.to_string())?;
                        fail(ctx, &mut slots, &mut summary, reporter, i, &error.to_string(), Some(log));
                        stop |= !options.keep_going;
                    }
                    Ok(task) => match &task.failure {
                        Some(message) => {
                            record_failure(
                                ctx,
                                run_id,
                                stage,
                                &key,
                                task.outcome.exit_code(),
                                task.started_ms,
                                &log,
                                message,
                            )?;
                            fail(ctx, &mut slots, &mut summary, reporter, i, message, Some(log));
                            stop |= !options.keep_going;
                        }
                        None => {
                            let published = task.published.expect("a successful task has published outputs");
                            commit(ctx, run_id, stage, &key, published, task.started_ms, &log)?;
                            summary.counts.executed += 1;
                        }
                    },
                }
            }
            _ = &mut ctrl_c => {
                running.abort_all();
                while running.join_next().await.is_some() {}
                summary.interrupted = true;
                reporter.event(Event::Interrupted);
                break;
            }
        }
    }

    // Stages never reached because something upstream failed.
    for &i in ctx.dag.order() {
        if options.selected[i]
            && slots[i] == Slot::Waiting
            && !summary.interrupted
            && let Some(&by) = ctx.dag.upstream(i).iter().find(|&&u| {
                slots[u] == Slot::Failed || summary.blocked.contains(&manifest.stages[u].name)
            })
        {
            summary.blocked.push(manifest.stages[i].name.clone());
            reporter.event(Event::StageBlocked {
                stage: &manifest.stages[i].name,
                by: &manifest.stages[by].name,
            });
        }
    }

    let unreached = (0..n).find(|&i| {
        options.selected[i]
            && slots[i] == Slot::Waiting
            && !summary.blocked.contains(&manifest.stages[i].name)
    });
    if let Some(i) = unreached
        && !stop
        && !summary.interrupted
    {
        return Err(ScheduleError::Task(format!(
            "scheduler stopped before stage `{}` could run",
            manifest.stages[i].name
        )));
    }

    ctx.save_stat_cache()?;
    write_lock_file(ctx)?;
    let status = if summary.interrupted {
        "interrupted"
    } else if summary.failed.is_empty() {
        "ok"
    } else {
        "failed"
    };
    if let Some(ledger) = &ctx.ledger {
        ledger.finish_run(run_id, status, summary.counts)?;
    }
    Ok(summary)
}

/// Makes the workspace copies of a fresh stage's outputs match the store.
/// `Ok(true)` if anything was restored; `Err(reason)` if a stored object is
/// damaged, so the result cannot be trusted and the stage must run.
fn bring_back(
    ctx: &mut Context<'_>,
    outputs: &[OutputRecord],
) -> Result<Result<bool, DirtyReason>, ScheduleError> {
    let mut restored = false;
    for output in outputs {
        if ctx.workspace_matches(output) {
            continue;
        }
        let ledger = ctx.ledger.as_ref().ok_or(ScheduleError::NoLedger)?;
        match ctx.store.restore(output, &ctx.abs(&output.path), ledger) {
            Ok(()) => restored = true,
            Err(StoreError::Corrupt { path, detail }) => {
                tracing::warn!(
                    "stored copy of `{}` is damaged ({}: {detail}); re-running",
                    output.path,
                    path.display()
                );
                return Ok(Err(DirtyReason::StoreIncomplete {
                    output: output.name.clone(),
                }));
            }
            Err(other) => return Err(other.into()),
        }
    }
    Ok(Ok(restored))
}

/// A stage's outputs are hashed: report it done and release downstream.
#[allow(clippy::too_many_arguments)]
fn outputs_known(
    ctx: &mut Context<'_>,
    options: &RunOptions,
    reporter: &mut dyn Reporter,
    slots: &mut [Slot],
    remaining: &mut [usize],
    ready: &mut BTreeSet<(usize, usize)>,
    position: &[usize],
    i: usize,
    records: &[OutputRecord],
    elapsed: Duration,
) {
    ctx.note_outputs(records);
    reporter.event(Event::StageDone {
        stage: &ctx.manifest.stages[i].name,
        done: Done::Ran,
        elapsed,
    });
    complete(i, ctx, options, slots, remaining, ready, position);
}

fn complete(
    i: usize,
    ctx: &Context<'_>,
    options: &RunOptions,
    slots: &mut [Slot],
    remaining: &mut [usize],
    ready: &mut BTreeSet<(usize, usize)>,
    position: &[usize],
) {
    slots[i] = Slot::Ok;
    for &d in ctx.dag.downstream(i) {
        if options.selected[d] {
            remaining[d] -= 1;
            if remaining[d] == 0 {
                ready.insert((position[d], d));
            }
        }
    }
}

fn fail(
    ctx: &Context<'_>,
    slots: &mut [Slot],
    summary: &mut RunSummary,
    reporter: &mut dyn Reporter,
    i: usize,
    message: &str,
    log: Option<PathBuf>,
) {
    slots[i] = Slot::Failed;
    summary.counts.failed += 1;
    let name = &ctx.manifest.stages[i].name;
    summary.failed.push(name.clone());
    reporter.event(Event::StageFailed {
        stage: name,
        message,
        log: log.as_deref(),
    });
}

/// Removes stale outputs, creates their parent directories, opens the log.
fn prepare(
    ctx: &Context<'_>,
    stage: &Stage,
    log_dir: &std::path::Path,
    token: &str,
) -> Result<Job, ScheduleError> {
    for output in &stage.outputs {
        let abs = output.path.resolve(&ctx.manifest.root);
        remove_path(&abs).map_err(|source| ScheduleError::Io {
            path: abs.clone(),
            source,
        })?;
        if let Some(parent) = abs.parent() {
            std::fs::create_dir_all(parent).map_err(|source| ScheduleError::Io {
                path: parent.to_owned(),
                source,
            })?;
        }
    }
    let log = log_dir.join(format!("{}.log", stage.name));
    let mut env = base_environment();
    env.push((RUN_MARKER.to_owned(), token.to_owned()));
    for (name, value) in &stage.env {
        let value = match value {
            EnvValue::Literal(text) => Some(text.clone()),
            EnvValue::PassThrough => std::env::var(name).ok(),
        };
        env.retain(|(k, _)| k != name);
        if let Some(value) = value {
            env.push((name.clone(), value));
        }
    }
    Ok(Job {
        command: stage.run.clone(),
        cwd: ctx.manifest.root.clone(),
        env,
        timeout: stage.timeout,
        log,
    })
}

/// Runs the command, then the checks; then stores the outputs (off the
/// scheduler's thread, so other stages start meanwhile).
async fn execute(
    executor: &LocalExecutor,
    job: Job,
    checks: Vec<Command>,
    store: ObjectStore,
    declared: Vec<Declared>,
    slot: SlotRelease,
    hashed: Hashed,
) -> Result<TaskResult, ScheduleError> {
    let started_ms = now_ms();
    let started = Instant::now();
    let outcome = executor.run(&job).await?;
    let mut task = TaskResult {
        outcome,
        failure: None,
        published: None,
        started_ms,
        elapsed: Duration::ZERO,
    };
    if outcome != Outcome::Success {
        task.failure = Some(format!("command {}", outcome.describe()));
    } else if let Some(missing) = declared.iter().find(|d| !d.abs.exists()) {
        task.failure = Some(format!(
            "command succeeded but did not create declared output `{}` ({})",
            missing.name, missing.path
        ));
    } else {
        for check in checks {
            let check_job = Job {
                command: check.clone(),
                ..job.clone()
            };
            let check_outcome = executor.run(&check_job).await?;
            if check_outcome != Outcome::Success {
                task.failure = Some(format!(
                    "check `{}` {}",
                    check.display(),
                    check_outcome.describe()
                ));
                break;
            }
        }
    }
    drop(slot);
    if task.failure.is_none() {
        let outputs: Vec<(String, String, PathBuf)> = declared
            .into_iter()
            .map(|d| (d.name, d.path, d.abs))
            .collect();
        // Small files go inline into the ledger: a read of a few kilobytes,
        // not worth a trip to the blocking pool. Anything bigger is copied
        // and fsynced there.
        let small = outputs.iter().all(|(_, _, abs)| {
            std::fs::metadata(abs).is_ok_and(|m| m.is_file() && m.len() <= INLINE_MAX)
        });
        let staged = if small {
            store.stage(&outputs)?
        } else {
            let staging_store = store.clone();
            tokio::task::spawn_blocking(move || staging_store.stage(&outputs))
                .await
                .map_err(|e| ScheduleError::Task(e.to_string()))??
        };
        let _ = hashed
            .tx
            .send((hashed.stage, staged.records.clone(), started.elapsed()));
        task.published = Some(if small {
            store.publish(staged)?
        } else {
            tokio::task::spawn_blocking(move || store.publish(staged))
                .await
                .map_err(|e| ScheduleError::Task(e.to_string()))??
        });
    }
    task.elapsed = started.elapsed();
    Ok(task)
}

fn commit(
    ctx: &mut Context<'_>,
    run_id: i64,
    stage: &Stage,
    key: &StageKey,
    published: Published,
    started_ms: i64,
    log: &std::path::Path,
) -> Result<(), ScheduleError> {
    let Published { records, inline } = published;
    let ledger = ctx.ledger.as_ref().ok_or(ScheduleError::NoLedger)?;
    let finished_ms = now_ms();
    let command = stage.run.display();
    // Quiet stages leave no log file; record a path only if there is one.
    let log_path = log.exists().then(|| log.to_string_lossy().into_owned());
    let id = ledger.record(
        &NewResult {
            run_id,
            stage: &stage.name,
            key,
            status: ResultStatus::Ok,
            outputs: &records,
            command: &command,
            started_ms,
            finished_ms,
            exit_code: Some(0),
            log_path: log_path.as_deref(),
            error: None,
        },
        &inline,
    )?;
    ctx.note_outputs(&records);
    let record = crate::store::ResultRecord {
        id,
        run_id,
        stage: stage.name.clone(),
        fingerprint: key.fingerprint(),
        status: ResultStatus::Ok,
        outputs: records,
        command,
        started_ms,
        finished_ms,
        exit_code: Some(0),
        log_path,
        error: None,
    };
    ctx.latest_failure.remove(&stage.name);
    ctx.latest_ok.insert(stage.name.clone(), record);
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn record_failure(
    ctx: &mut Context<'_>,
    run_id: i64,
    stage: &Stage,
    key: &StageKey,
    exit_code: Option<i32>,
    started_ms: i64,
    log: &std::path::Path,
    message: &str,
) -> Result<(), ScheduleError> {
    let ledger = ctx.ledger.as_ref().ok_or(ScheduleError::NoLedger)?;
    let log_path = log.exists().then(|| log.to_string_lossy().into_owned());
    ledger.record(
        &NewResult {
            run_id,
            stage: &stage.name,
            key,
            status: ResultStatus::Failed,
            outputs: &[],
            command: &stage.run.display(),
            started_ms,
            finished_ms: now_ms(),
            exit_code,
            log_path: log_path.as_deref(),
            error: Some(message),
        },
        &[],
    )?;
    Ok(())
}

/// Rewrites the lock file from the newest successful result of each stage.
pub fn write_lock_file(ctx: &Context<'_>) -> Result<(), ScheduleError> {
    let mut lock = LockFile::new(&ctx.manifest.name);
    for stage in &ctx.manifest.stages {
        if let Some(record) = ctx.latest_ok.get(&stage.name) {
            lock.insert(&stage.name, record.fingerprint, &record.outputs);
        }
    }
    lock.write(&ctx.manifest.lock_path())?;
    Ok(())
}
