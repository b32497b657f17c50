//! One stage's work once it must run: prepare its job, run the command and
//! the checks, then store the outputs. Runs as a tokio task; talks back to
//! the dispatcher through [`TaskLinks`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use tokio::sync::mpsc::UnboundedSender;
use tokio::task::JoinSet;

use super::ScheduleError;
use super::context::Context;
use super::item_outputs::ItemOutputs;
use super::items::{ItemCounts, PlannedItem, aggregate, file_name, fill, fill_command};
use super::limits::Limits;
use crate::exec::{Executor, Job, Outcome, RUN_MARKER, base_environment, redact_text};
use crate::fingerprint::Digest;
use crate::manifest::{ClassifyRule, Command, EnvValue, Foreach, ItemClass, Stage};
use crate::store::{
    INLINE_MAX, ItemAttempt, ObjectStore, OutputRecord, Published, RUNNING, now_ms, remove_path,
};

/// How a stage's command, checks and output storage ended.
pub struct TaskResult {
    /// False if the run stopped before the command could start.
    pub started: bool,
    pub outcome: Outcome,
    /// Why the stage failed, if it did.
    pub failure: Option<String>,
    /// The stored outputs, when it succeeded.
    pub published: Option<Published>,
    /// A per-item stage that ran only some of its items (`--limit`,
    /// `--only`): not a failure, but not complete either.
    pub partial: Option<String>,
    pub started_ms: i64,
    /// The log that shows why it failed, when that is not the stage's own:
    /// a failing item's.
    pub failure_log: Option<PathBuf>,
    /// Jobs a dead run left for items no longer wanted, cancelled now
    /// (their handles).
    pub cancelled_orphans: Vec<String>,
}

impl TaskResult {
    fn not_started() -> Self {
        TaskResult {
            started: false,
            outcome: Outcome::Success,
            failure: None,
            published: None,
            partial: None,
            started_ms: now_ms(),
            failure_log: None,
            cancelled_orphans: Vec::new(),
        }
    }
}

/// What a running task tells the dispatcher before it ends.
pub struct TaskLinks {
    pub stage: usize,
    /// Told the output digests as soon as they are final, so downstream
    /// stages can start while the objects are made durable.
    pub hashed: UnboundedSender<(usize, Vec<OutputRecord>, Duration)>,
    /// Told every finished attempt of an item, to be recorded at once.
    pub attempts: UnboundedSender<ItemAttempt>,
}

/// Which unfinished items a run takes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Only {
    /// Never attempted under their current fingerprint.
    Pending,
    /// Last attempt failed on infrastructure.
    Infra,
    /// Last attempt ended in error.
    Error,
}

/// The per-item part of a task.
struct Items {
    name: String,
    spec: Foreach,
    outputs: ItemOutputs,
    plan: Vec<PlannedItem>,
    only: Option<Only>,
    limit: Option<usize>,
    log_dir: PathBuf,
    run_id: i64,
    /// Handles of jobs a dead run left for items this plan no longer wants.
    orphans: Vec<String>,
}

/// A built-in stage's command (`cairn builtin …`) with the running cairn
/// binary in place of `cairn`, so that the same build runs it.
fn builtin_command(command: &Command) -> Command {
    match (command, std::env::current_exe()) {
        (Command::Exec(argv), Ok(exe)) if !argv.is_empty() => {
            let mut argv = argv.clone();
            argv[0] = exe.to_string_lossy().into_owned();
            Command::Exec(argv)
        }
        _ => command.clone(),
    }
}

/// The resources a stage holds (indices into `[resources]`).
#[derive(Debug, Clone, Default)]
pub struct Holds {
    /// Held by each command: the stage's, or each item's.
    pub per_command: Vec<usize>,
    /// Held once by a per-item stage for as long as its items run.
    pub per_stage: Vec<usize>,
}

/// A declared output: (name, path as written, absolute path).
pub type Declared = (String, String, PathBuf);

/// Everything a task needs, detached from the dispatcher's borrows.
pub struct StageTask {
    job: Job,
    checks: Vec<Command>,
    store: ObjectStore,
    outputs: Vec<Declared>,
    limits: Limits,
    /// The resources the stage holds.
    holds: Holds,
    /// The stage's rank in the topological order: earlier goes first.
    priority: u64,
    /// Set for a per-item stage.
    items: Option<Items>,
    job_prefix: String,
}

/// The start of every job name of `stage`: `cairn-STAGE-WORKSPACE`, where
/// WORKSPACE is 8 hex digits of the project root and pipeline name, so two
/// checkouts of one pipeline sharing a cluster never adopt each other's
/// jobs.
fn job_prefix(ctx: &Context<'_>, stage: &Stage) -> String {
    let workspace = crate::fingerprint::Digest::of(
        format!("{}\0{}", ctx.manifest.root.display(), ctx.manifest.name).as_bytes(),
    );
    format!("cairn-{}-{}", stage.name, &workspace.hex()[..8])
}

impl StageTask {
    /// Builds the stage's job: the command, the project root, the
    /// environment.
    #[allow(clippy::too_many_arguments)]
    pub fn prepare(
        ctx: &Context<'_>,
        i: usize,
        fingerprint: &Digest,
        log_dir: &Path,
        run_token: &str,
        limits: Limits,
        holds: Holds,
        priority: u64,
    ) -> Result<Self, ScheduleError> {
        let stage = &ctx.manifest.stages[i];
        // The same fingerprint and attempt give the same job name in every
        // run: a job an earlier cairn process submitted for this attempt
        // (it was killed meanwhile) is adopted, not submitted again.
        let attempt = match &ctx.ledger {
            Some(ledger) => ledger.stage_attempts(&stage.name, fingerprint)? + 1,
            None => 1,
        };
        let outputs = stage
            .outputs
            .iter()
            .map(|output| {
                (
                    output.name.clone(),
                    output.path.to_string(),
                    output.path.resolve(&ctx.manifest.root),
                )
            })
            .collect();
        let mut env = base_environment();
        env.push((RUN_MARKER.to_owned(), run_token.to_owned()));
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
        let mut redact = Vec::new();
        for name in &stage.secrets {
            if let Ok(value) = std::env::var(name) {
                env.retain(|(k, _)| k != name);
                env.push((name.clone(), value.clone()));
                // Too short a value would redact ordinary text.
                if value.len() >= 4 {
                    redact.push((name.clone(), value));
                }
            }
        }
        Ok(Self {
            job: Job {
                // Items' jobs are named the same way, by the item's
                // fingerprint and attempt.
                name: format!(
                    "{}-{}-{attempt}",
                    job_prefix(ctx, stage),
                    &fingerprint.hex()[..16]
                ),
                token: run_token.to_owned(),
                stage: stage.name.clone(),
                command: match &stage.uses {
                    Some(_) => builtin_command(&stage.run),
                    None => stage.run.clone(),
                },
                cwd: ctx.manifest.root.clone(),
                env,
                timeout: stage.timeout,
                log: log_dir.join(format!("{}.log", stage.name)),
                redact,
                secrets: stage.secrets.clone(),
                // Pinned when the stage was fingerprinted (per-item images
                // are set on each item's job).
                image: ctx.images.get(&i).map(|pinned| pinned.reference.clone()),
            },
            checks: stage.checks.clone(),
            store: ctx.store.clone(),
            outputs,
            limits,
            holds,
            priority,
            items: None,
            job_prefix: job_prefix(ctx, stage),
        })
    }

    /// Makes this the task of a per-item stage over `plan`; `orphans`: the
    /// jobs a dead run left for items `plan` no longer wants.
    #[allow(clippy::too_many_arguments)]
    pub fn with_items(
        mut self,
        stage: &Stage,
        plan: Vec<PlannedItem>,
        orphans: Vec<String>,
        only: Option<Only>,
        limit: Option<usize>,
        log_dir: &Path,
        run_id: i64,
    ) -> Self {
        let spec = stage.foreach.clone().expect("a per-item stage");
        self.items = Some(Items {
            name: stage.name.clone(),
            spec,
            outputs: ItemOutputs::of(stage, &self.job.cwd),
            plan,
            only,
            limit,
            log_dir: log_dir.join(&stage.name),
            run_id,
            orphans,
        });
        self
    }

    /// Removes the stage's stale outputs and creates their parent
    /// directories.
    fn clear_outputs(&self) -> Result<(), ScheduleError> {
        self.clear_outputs_where(|_| true)
    }

    /// [`Self::clear_outputs`] for the outputs whose name passes `wanted`.
    fn clear_outputs_where(&self, wanted: impl Fn(&str) -> bool) -> Result<(), ScheduleError> {
        for (_, _, abs) in self.outputs.iter().filter(|(name, _, _)| wanted(name)) {
            remove_path(abs).map_err(|source| ScheduleError::Io {
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
        Ok(())
    }

    /// Runs the command, then the checks; then stores the outputs.
    pub async fn run(
        self,
        executor: Arc<dyn Executor>,
        links: TaskLinks,
    ) -> Result<TaskResult, ScheduleError> {
        if self.items.is_some() {
            return self.run_items(executor, links).await;
        }
        let Some(permits) = self
            .limits
            .acquire_for(executor.as_ref(), self.priority, &self.holds.per_command)
            .await
        else {
            return Ok(TaskResult::not_started());
        };
        self.clear_outputs()?;
        let started_ms = now_ms();
        let started = Instant::now();
        let outcome = executor.run(&self.job).await?;
        let mut task = TaskResult {
            started: true,
            outcome,
            failure: None,
            published: None,
            partial: None,
            started_ms,
            failure_log: None,
            cancelled_orphans: Vec::new(),
        };
        task.failure = self.verdict(executor.as_ref(), outcome).await?;
        // The job slot and resources are free while the outputs are stored.
        drop(permits);
        if task.failure.is_some() {
            return Ok(task);
        }
        task.published = Some(self.store_outputs(&links, started).await?);
        Ok(task)
    }

    /// Stages the outputs, announces their digests, then publishes them.
    async fn store_outputs(
        self,
        links: &TaskLinks,
        started: Instant,
    ) -> Result<Published, ScheduleError> {
        // Small files go inline into the ledger: a read of a few kilobytes,
        // not worth a trip to the blocking pool. Anything bigger is copied
        // and fsynced there.
        let small = self.outputs.iter().all(|(_, _, abs)| {
            std::fs::metadata(abs).is_ok_and(|m| m.is_file() && m.len() <= INLINE_MAX)
        });
        let store = self.store;
        let outputs = self.outputs;
        let staged = if small {
            store.stage(&outputs)?
        } else {
            let staging_store = store.clone();
            tokio::task::spawn_blocking(move || staging_store.stage(&outputs))
                .await
                .map_err(|e| ScheduleError::Task(e.to_string()))??
        };
        let _ = links
            .hashed
            .send((links.stage, staged.records.clone(), started.elapsed()));
        Ok(if small {
            store.publish(staged)?
        } else {
            tokio::task::spawn_blocking(move || store.publish(staged))
                .await
                .map_err(|e| ScheduleError::Task(e.to_string()))??
        })
    }

    /// Runs the unfinished items (each with its own retries), reports every
    /// attempt as it ends, then writes the merged results as the output.
    async fn run_items(
        mut self,
        executor: Arc<dyn Executor>,
        links: TaskLinks,
    ) -> Result<TaskResult, ScheduleError> {
        let started_ms = now_ms();
        let started = Instant::now();
        let mut items = self.items.take().expect("a per-item task");
        let cancelled_orphans = cancel_orphans(executor.as_ref(), &items.orphans).await;
        std::fs::create_dir_all(&items.log_dir).map_err(|source| ScheduleError::Io {
            path: items.log_dir.clone(),
            source,
        })?;
        if !items.outputs.is_empty() {
            let restored = items.outputs.prepare(&mut items.plan, &self.store)?;
            if restored > 0 {
                tracing::info!("restored {restored} item output(s) of `{}`", items.name);
            }
        }
        let mut todo: Vec<usize> = items
            .plan
            .iter()
            .enumerate()
            .filter(|(_, p)| match (&p.outcome, items.only) {
                (Some((class, _)), _) if class.is_final() => false,
                (_, None) => true,
                (None, Some(only)) => only == Only::Pending,
                (Some((ItemClass::Infra, _)), Some(only)) => only == Only::Infra,
                (Some((_, _)), Some(only)) => only == Only::Error,
            })
            .map(|(i, _)| i)
            .collect();
        if let Some(limit) = items.limit {
            todo.truncate(limit);
        }

        // Resources held per stage: taken once, for as long as the items
        // run; the items themselves only need job slots.
        let _window = if todo.is_empty() || self.holds.per_stage.is_empty() {
            None
        } else {
            match self
                .limits
                .acquire_resources(self.priority, &self.holds.per_stage)
                .await
            {
                Some(permits) => Some(permits),
                None => {
                    return Ok(TaskResult {
                        cancelled_orphans,
                        ..TaskResult::not_started()
                    });
                }
            }
        };
        let stage_jobs = Arc::new(Semaphore::new(
            items.spec.jobs.unwrap_or(Semaphore::MAX_PERMITS),
        ));
        let runner = Arc::new(ItemRunner {
            executor,
            job_prefix: self.job_prefix.clone(),
            job: self.job.clone(),
            checks: self.checks.clone(),
            spec: items.spec.clone(),
            limits: self.limits.clone(),
            holds: self.holds.per_command.clone(),
            priority: self.priority,
            log_dir: items.log_dir.clone(),
            stage: items.name.clone(),
            run_id: items.run_id,
            attempts: links.attempts.clone(),
            outputs: items.outputs.clone(),
            store: self.store.clone(),
        });
        // A bounded window of item tasks: tens of thousands of waiting
        // futures would cost memory and buy nothing.
        let mut queue = todo.into_iter();
        let mut running = JoinSet::new();
        let mut spawn_next = |running: &mut JoinSet<_>, plan: &[PlannedItem]| {
            if let Some(index) = queue.next() {
                let planned = plan[index].clone();
                let (runner, stage_jobs) = (runner.clone(), stage_jobs.clone());
                running.spawn(async move {
                    let _slot = stage_jobs.acquire_owned().await;
                    (index, runner.run(&planned).await)
                });
            }
        };
        for _ in 0..ITEMS_IN_FLIGHT {
            spawn_next(&mut running, &items.plan);
        }
        let mut stopped = false;
        // Items that ended in error in this run: key, why, last log.
        let mut errors: Vec<(String, Option<String>, Option<PathBuf>)> = Vec::new();
        while let Some(joined) = running.join_next().await {
            let (index, result) = joined.map_err(|e| ScheduleError::Task(e.to_string()))?;
            match result? {
                Some(end) => {
                    if end.class == ItemClass::Error {
                        errors.push((items.plan[index].item.key.clone(), end.why, end.log));
                    }
                    items.plan[index].outcome = Some((end.class, end.attempts));
                    items.plan[index].result = end.result;
                }
                None => stopped = true,
            }
            if !stopped {
                spawn_next(&mut running, &items.plan);
            }
        }

        let counts = ItemCounts::of(&items.plan);
        let mut task = TaskResult {
            started: true,
            outcome: Outcome::Success,
            failure: None,
            published: None,
            partial: None,
            started_ms,
            failure_log: None,
            cancelled_orphans,
        };
        if stopped {
            task.failure = Some(format!(
                "stopped before every item ran ({})",
                counts.summary()
            ));
        } else if counts.error > items.spec.allow_errors {
            let mut failure = format!(
                "{} item(s) ended in error, {} allowed ({})",
                counts.error,
                items.spec.allow_errors,
                counts.summary()
            );
            // The first failing item (in key order) speaks for the rest.
            errors.sort_by(|a, b| a.0.cmp(&b.0));
            if let Some((key, why, log)) = errors.into_iter().next() {
                failure.push_str(&format!("; first: item `{key}`"));
                if let Some(why) = why {
                    failure.push_str(&format!(" ({why})"));
                }
                task.failure_log = log;
            }
            task.failure = Some(failure);
        } else if counts.infra > 0 {
            task.failure = Some(format!(
                "{} item(s) still failing on infrastructure after retries; a later run retries them ({})",
                counts.infra,
                counts.summary()
            ));
        } else if counts.pending > 0 {
            task.partial = Some(format!(
                "{} item(s) left for a later run ({})",
                counts.pending,
                counts.summary()
            ));
        }
        if task.failure.is_some() || task.partial.is_some() {
            return Ok(task);
        }

        // The merged results: the one output the items do not write into.
        let merged = |name: &str| !items.outputs.contains(name);
        self.clear_outputs_where(merged)?;
        let (_, _, path) = self
            .outputs
            .iter()
            .find(|(name, _, _)| merged(name))
            .cloned()
            .ok_or_else(|| ScheduleError::Task("a per-item stage has no output".to_owned()))?;
        std::fs::write(&path, aggregate(&items.plan)).map_err(|source| ScheduleError::Io {
            path: path.clone(),
            source,
        })?;
        task.published = Some(self.store_outputs(&links, started).await?);
        Ok(task)
    }

    /// `Some(reason)` if the stage did not succeed: the command failed, a
    /// declared output is missing, or a check failed.
    async fn verdict(
        &self,
        executor: &dyn Executor,
        outcome: Outcome,
    ) -> Result<Option<String>, ScheduleError> {
        if outcome != Outcome::Success {
            return Ok(Some(format!("command {}", outcome.describe())));
        }
        if let Some((name, path, _)) = self.outputs.iter().find(|(_, _, abs)| !abs.exists()) {
            return Ok(Some(format!(
                "command succeeded but did not create declared output `{name}` ({path})"
            )));
        }
        for (n, check) in self.checks.iter().enumerate() {
            let job = Job {
                name: format!("{}-check{}", self.job.name, n + 1),
                command: check.clone(),
                ..self.job.clone()
            };
            let outcome = executor.run(&job).await?;
            if outcome != Outcome::Success {
                return Ok(Some(format!(
                    "check `{}` {}",
                    check.display(),
                    outcome.describe()
                )));
            }
        }
        Ok(None)
    }
}

/// Cancels the jobs `handles` (left by a dead run for items no longer
/// wanted) on `executor`; the handles it cancelled. One it cannot is left
/// on record, to be tried again by the next run.
async fn cancel_orphans(executor: &dyn Executor, handles: &[String]) -> Vec<String> {
    let mut cancelled = Vec::new();
    for handle in handles {
        match executor.cancel_handle(handle).await {
            Ok(true) => {
                tracing::info!(job = %handle, "cancelled a job a dead run left for an item no longer wanted");
                cancelled.push(handle.clone());
            }
            Ok(false) => tracing::warn!(
                job = %handle,
                "a dead run left this job, for an item no longer wanted, on another engine than the stage's now: cancel it by hand"
            ),
            Err(error) => {
                tracing::warn!(job = %handle, error = %error, "could not cancel a job a dead run left")
            }
        }
    }
    cancelled
}

/// Runs one item: its command and checks, classification and retries.
struct ItemRunner {
    executor: Arc<dyn Executor>,
    /// `cairn-STAGE-WORKSPACE`, see [`job_prefix`].
    job_prefix: String,
    job: Job,
    checks: Vec<Command>,
    spec: Foreach,
    limits: Limits,
    holds: Vec<usize>,
    priority: u64,
    log_dir: PathBuf,
    stage: String,
    run_id: i64,
    attempts: UnboundedSender<ItemAttempt>,
    outputs: ItemOutputs,
    store: ObjectStore,
}

impl ItemRunner {
    /// The item's final outcome in this run and its attempt count; `None`
    /// if the run stopped first.
    async fn run(&self, planned: &PlannedItem) -> Result<Option<ItemEnd>, ScheduleError> {
        let item = &planned.item;
        let filled = fill_command(&self.job.command, &item.value).and_then(|command| {
            Ok((
                command,
                self.checks
                    .iter()
                    .map(|c| fill_command(c, &item.value))
                    .collect::<Result<Vec<_>, _>>()?,
            ))
        });
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let Some(permits) = self
                .limits
                .acquire_for(self.executor.as_ref(), self.priority, &self.holds)
                .await
            else {
                return Ok(None);
            };
            let started_ms = now_ms();
            let log = self
                .log_dir
                .join(format!("{}.{attempt}.log", file_name(&item.key)));
            self.outputs.clear(item)?;
            let mut handle = None;
            let (class, rule, exit_code, result) = match &filled {
                Err(message) => (ItemClass::Error, Some(message.clone()), None, None),
                Ok((command, checks)) => {
                    let previous = planned.outcome.as_ref().map_or(0, |(_, n)| *n);
                    let mut job = Job {
                        // The same item, fingerprint and attempt number give
                        // the same name: a job an earlier cairn process
                        // submitted for this attempt is adopted, not
                        // submitted again.
                        name: format!(
                            "{}-{}-{}",
                            self.job_prefix,
                            &planned.fingerprint.hex()[..16],
                            previous + attempt
                        ),
                        command: command.clone(),
                        log: log.clone(),
                        image: planned.image.clone().or_else(|| self.job.image.clone()),
                        ..self.job.clone()
                    };
                    job.env.push((ITEM_MARKER.to_owned(), item.key.clone()));
                    job.env
                        .push((ATTEMPT_MARKER.to_owned(), (previous + attempt).to_string()));
                    let running = self.executor.start(&job).await?;
                    handle = Some(running.handle());
                    // On record before it ends: a cairn that dies now
                    // leaves the job's handle behind.
                    let _ = self.attempts.send(ItemAttempt {
                        class: RUNNING.to_owned(),
                        handle: handle.clone(),
                        ..self.attempt_record(planned, attempt, started_ms)
                    });
                    let outcome = running.wait().await?;
                    let mut failed_check = None;
                    if outcome == Outcome::Success {
                        for (n, check) in checks.iter().enumerate() {
                            let check_job = Job {
                                name: format!("{}-check{}", job.name, n + 1),
                                command: check.clone(),
                                ..job.clone()
                            };
                            let check_outcome = self.executor.run(&check_job).await?;
                            if check_outcome != Outcome::Success {
                                failed_check = Some(format!(
                                    "check `{}` {}",
                                    check.display(),
                                    check_outcome.describe()
                                ));
                                break;
                            }
                        }
                    }
                    let (result, result_problem) = self.read_result(&item.value);
                    let (class, rule) = match failed_check {
                        // A command that claims success but fails its
                        // check is an error, never an ok.
                        Some(check) => (ItemClass::Error, Some(check)),
                        None => match classify(&self.spec.classify, outcome, &log, result.as_ref())
                        {
                            (ItemClass::Ok, rule) => {
                                match (result_problem, self.failed_result_check(result.as_ref())) {
                                    (Some(problem), _) => (ItemClass::Error, Some(problem)),
                                    (None, Some(check)) => (ItemClass::Error, Some(check)),
                                    (None, None) => (ItemClass::Ok, rule),
                                }
                            }
                            other => other,
                        },
                    };
                    (class, rule, outcome.exit_code(), result)
                }
            };
            drop(permits);
            let (class, rule, outputs) = if self.outputs.is_empty() {
                (class, rule, None)
            } else if class.is_final() {
                match self.outputs.store(item, &class, &self.store).await? {
                    Ok(records) => (class, rule, Some(records)),
                    Err(message) => {
                        self.outputs.clear(item)?;
                        (ItemClass::Error, Some(message), None)
                    }
                }
            } else {
                // A failed attempt leaves nothing behind.
                self.outputs.clear(item)?;
                (class, rule, None)
            };
            let why_failed = rule
                .clone()
                .or_else(|| exit_code.map(|code| format!("exit status {code}")));
            let _ = self.attempts.send(ItemAttempt {
                finished_ms: now_ms(),
                exit_code,
                class: class.name().to_owned(),
                rule,
                log_path: log.exists().then(|| log.to_string_lossy().into_owned()),
                result: result.as_ref().map(|r| r.to_string()),
                outputs,
                handle,
                ..self.attempt_record(planned, attempt, started_ms)
            });
            let retry = &self.spec.retry;
            if retry.on.contains(&class) && attempt <= retry.max {
                let backoff = retry.backoff.saturating_mul(1 << (attempt - 1).min(16));
                tokio::time::sleep(backoff).await;
                continue;
            }
            let attempts = planned.outcome.as_ref().map_or(0, |(_, n)| *n) + attempt;
            return Ok(Some(ItemEnd {
                class,
                attempts,
                result,
                why: why_failed,
                log: log.exists().then_some(log),
            }));
        }
    }
}

/// An item at the end of a run.
struct ItemEnd {
    class: ItemClass,
    attempts: u32,
    result: Option<serde_json::Value>,
    /// Why its last attempt failed (the rule, check or exit status).
    why: Option<String>,
    /// Its last attempt's log, if the attempt printed anything.
    log: Option<PathBuf>,
}

/// Whether a relative path written by filling a template (`..` from an
/// item field, or an absolute path) leads outside the project root.
fn leaves_root(path: &str) -> bool {
    let mut depth = 0usize;
    for component in Path::new(path).components() {
        match component {
            std::path::Component::Normal(_) => depth += 1,
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir if depth > 0 => depth -= 1,
            _ => return true,
        }
    }
    false
}

/// Redacts every secret value in the strings (keys included) of `value`.
fn redact_json(value: &mut serde_json::Value, secrets: &[(String, String)]) {
    if secrets.is_empty() {
        return;
    }
    match value {
        serde_json::Value::String(text) => {
            if let Some(redacted) = redact_text(text, secrets) {
                *text = redacted;
            }
        }
        serde_json::Value::Array(items) => {
            for item in items {
                redact_json(item, secrets);
            }
        }
        serde_json::Value::Object(map) => {
            let entries = std::mem::take(map);
            for (key, mut item) in entries {
                redact_json(&mut item, secrets);
                map.insert(redact_text(&key, secrets).unwrap_or(key), item);
            }
        }
        _ => {}
    }
}

impl ItemRunner {
    /// The record of an attempt that started at `started_ms`, before
    /// anything is known of how it ends.
    fn attempt_record(&self, planned: &PlannedItem, attempt: u32, started_ms: i64) -> ItemAttempt {
        ItemAttempt {
            run_id: self.run_id,
            stage: self.stage.clone(),
            key: planned.item.key.clone(),
            fingerprint: planned.fingerprint,
            attempt,
            started_ms,
            finished_ms: started_ms,
            exit_code: None,
            class: RUNNING.to_owned(),
            rule: None,
            log_path: None,
            result: None,
            code: Some(planned.code),
            outputs: None,
            handle: None,
        }
    }

    /// The item's JSON result, if the stage declares one: `(result,
    /// problem)`, where the problem says why it is missing or unreadable.
    fn read_result(&self, item: &serde_json::Value) -> (Option<serde_json::Value>, Option<String>) {
        let Some(template) = &self.spec.result else {
            return (None, None);
        };
        let path = match fill(template, item) {
            Ok(path) => path,
            Err(message) => return (None, Some(message)),
        };
        if leaves_root(&path) {
            return (
                None,
                Some(format!(
                    "item result `{path}` lies outside the project root"
                )),
            );
        }
        match crate::fingerprint::read_regular(&self.job.cwd.join(&path)) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                (None, Some(format!("item result `{path}` was not written")))
            }
            Err(e) => (
                None,
                Some(format!("item result `{path}` cannot be read: {e}")),
            ),
            Ok(bytes) => match serde_json::from_slice(&bytes) {
                // A secret the command wrote into its result is redacted
                // as in its log: the result reaches the ledger and the
                // merged output.
                Ok(mut value) => {
                    redact_json(&mut value, &self.job.redact);
                    (Some(value), None)
                }
                Err(error) => (
                    None,
                    Some(format!("item result `{path}` is not JSON: {error}")),
                ),
            },
        }
    }

    /// The first result check that fails, described.
    fn failed_result_check(&self, result: Option<&serde_json::Value>) -> Option<String> {
        self.spec
            .result_checks
            .iter()
            .find(|check| !result.is_some_and(|r| check.holds(r)))
            .map(|check| format!("result check `{}` failed", check.text))
    }
}

/// The class of an attempt: `infra` when the engine failed the job, else
/// the first rule that matches (every condition it gives holds), else ok for
/// exit 0 and error otherwise.
fn classify(
    rules: &[ClassifyRule],
    outcome: Outcome,
    log: &Path,
    result: Option<&serde_json::Value>,
) -> (ItemClass, Option<String>) {
    // An engine's failure is infrastructure whatever the rules say: the
    // command never ran to an end that could be a verdict.
    if let Outcome::Infra(_) | Outcome::Cancelled = outcome {
        return (ItemClass::Infra, Some(outcome.describe()));
    }
    let needs_output = rules.iter().any(|r| r.output.is_some());
    let output = if needs_output {
        std::fs::read(log)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    } else {
        String::new()
    };
    for rule in rules {
        let exit_matches = rule.exit.is_empty()
            || outcome
                .exit_code()
                .is_some_and(|code| rule.exit.contains(&code));
        let output_matches = rule.output.as_ref().is_none_or(|re| re.is_match(&output));
        let result_matches = rule
            .result
            .as_ref()
            .is_none_or(|check| result.is_some_and(|r| check.holds(r)));
        if exit_matches && output_matches && result_matches {
            return (rule.class.clone(), Some(rule.text.clone()));
        }
    }
    match outcome {
        Outcome::Success => (ItemClass::Ok, None),
        _ => (ItemClass::Error, None),
    }
}

/// How many items of one stage are in flight (waiting for a slot or
/// running) at once.
const ITEMS_IN_FLIGHT: usize = 256;

/// The variable that tells an item's command which item it runs.
pub const ITEM_MARKER: &str = "CAIRN_ITEM";

/// The variable that numbers an item's attempts (1 for its first ever
/// under its fingerprint), so a harness can record which attempt produced
/// a verdict.
pub const ATTEMPT_MARKER: &str = "CAIRN_ATTEMPT";
