//! One stage's work once it must run: prepare its job, run the command and
//! the checks, then store the outputs. Runs as a tokio task; talks back to
//! the dispatcher through [`TaskLinks`].

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedSender;

use super::ScheduleError;
use super::context::Context;
use super::limits::Limits;
use crate::exec::{Executor, Job, LocalExecutor, Outcome, RUN_MARKER, base_environment};
use crate::manifest::{Command, EnvValue, Stage};
use crate::store::{INLINE_MAX, ObjectStore, OutputRecord, Published, now_ms, remove_path};

/// How a stage's command, checks and output storage ended.
pub struct TaskResult {
    /// False if the run stopped before the command could start.
    pub started: bool,
    pub outcome: Outcome,
    /// Why the stage failed, if it did.
    pub failure: Option<String>,
    /// The stored outputs, when it succeeded.
    pub published: Option<Published>,
    pub started_ms: i64,
}

/// What a running task tells the dispatcher before it ends.
pub struct TaskLinks {
    pub stage: usize,
    /// Told the output digests as soon as they are final, so downstream
    /// stages can start while the objects are made durable.
    pub hashed: UnboundedSender<(usize, Vec<OutputRecord>, Duration)>,
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
    /// Indices of the resources the stage holds.
    holds: Vec<usize>,
    /// The stage's rank in the topological order: earlier goes first.
    priority: u64,
}

impl StageTask {
    /// Builds the stage's job: the command, the project root, the
    /// environment.
    pub fn prepare(
        ctx: &Context<'_>,
        stage: &Stage,
        log_dir: &Path,
        run_token: &str,
        limits: Limits,
        holds: Vec<usize>,
        priority: u64,
    ) -> Result<Self, ScheduleError> {
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
        Ok(Self {
            job: Job {
                command: stage.run.clone(),
                cwd: ctx.manifest.root.clone(),
                env,
                timeout: stage.timeout,
                log: log_dir.join(format!("{}.log", stage.name)),
            },
            checks: stage.checks.clone(),
            store: ctx.store.clone(),
            outputs,
            limits,
            holds,
            priority,
        })
    }

    /// Removes the stage's stale outputs and creates their parent
    /// directories.
    fn clear_outputs(&self) -> Result<(), ScheduleError> {
        for (_, _, abs) in &self.outputs {
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
        executor: LocalExecutor,
        links: TaskLinks,
    ) -> Result<TaskResult, ScheduleError> {
        let Some(permits) = self.limits.acquire(self.priority, &self.holds).await else {
            return Ok(TaskResult {
                started: false,
                outcome: Outcome::Success,
                failure: None,
                published: None,
                started_ms: now_ms(),
            });
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
            started_ms,
        };
        task.failure = self.verdict(&executor, outcome).await?;
        // The job slot and resources are free while the outputs are stored.
        drop(permits);
        if task.failure.is_some() {
            return Ok(task);
        }

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
        task.published = Some(if small {
            store.publish(staged)?
        } else {
            tokio::task::spawn_blocking(move || store.publish(staged))
                .await
                .map_err(|e| ScheduleError::Task(e.to_string()))??
        });
        Ok(task)
    }

    /// `Some(reason)` if the stage did not succeed: the command failed, a
    /// declared output is missing, or a check failed.
    async fn verdict(
        &self,
        executor: &LocalExecutor,
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
        for check in &self.checks {
            let job = Job {
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
