//! Runs jobs as Slurm batch jobs.
//!
//! A job is submitted with `sbatch --parsable`, named by the scheduler
//! (the name derives from the stage or item fingerprint and the attempt
//! number, so the same attempt is found again by name), with:
//! - the project root as working directory (`--chdir`): the root must be on
//!   a filesystem every node mounts at the same path, and outputs are hashed
//!   where they land;
//! - exactly the job's environment: `sbatch` itself runs with a cleared
//!   environment plus the job's variables (and `SLURM_CONF` when cairn has
//!   one), and `--export=ALL` hands that to the job. Secret values travel the
//!   same way, never on a command line or in a file cairn writes;
//! - its stdout and stderr appended to the job's log (`--output`,
//!   `--open-mode=append`), redacted when the job ends;
//! - the run's token in `--comment`, so jobs of a cairn process that died
//!   can be found (`orphans`), and the placement the stage asks for
//!   (partition, account, time limit, cpus, memory, gres, extra arguments).
//!
//! Slurm has no watch API: job states are read with `squeue`, one call for
//! every job the executor is waiting for, at an interval growing from 100 ms
//! to `poll` (back to 100 ms when a job joins). How a job ended maps to an
//! [`Outcome`]: COMPLETED → success; FAILED → its exit code (which the
//! stage's `classify` rules read); CANCELLED → cancelled; TIMEOUT →
//! timed out; NODE_FAIL, PREEMPTED, BOOT_FAIL, OUT_OF_MEMORY and DEADLINE →
//! an infrastructure failure, never a verdict. A job dropped before it
//! ended (an interrupted run) is cancelled with `scancel`, unless the run
//! was started with `--detach`; a cairn process killed outright leaves it
//! running, and a later run adopts it by name.

mod window;

use std::time::Duration;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::batch::{Batch, BatchEngine, Batcher, exec_line, index_script, shared_env};
use super::{
    BoxFuture, ClusterJobGuard, ExecError, Executor, HeldWindow, InfraKind, Job, Outcome,
    RUN_MARKER, Running, redact_log,
};
use crate::manifest::{Command, SlurmSettings};

/// A job submitted to Slurm: its job id and name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlurmJob {
    pub id: String,
    pub name: String,
}

/// A job's state as `squeue` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobState {
    pub state: String,
    /// `REASON` for a pending job, the node list otherwise.
    pub reason: String,
}

#[derive(Debug, Clone)]
pub struct SlurmExecutor {
    settings: SlurmSettings,
    /// One permit per job queued or running (`max_jobs`).
    in_flight: Arc<tokio::sync::Semaphore>,
    poller: Arc<Poller>,
    /// Gathers items into job arrays when `batch` is above 1.
    batcher: Option<Arc<Batcher>>,
}

/// How long a job array waits for more items after its first, unless it
/// fills first: items that become ready together are submitted together.
const ARRAY_LINGER: Duration = Duration::from_millis(100);

/// What the last `squeue` said of a job being waited for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    /// Not polled yet.
    Unknown,
    State(JobState),
    /// Slurm no longer knows the job.
    Forgotten,
    /// `squeue` failed: why.
    Failed(String),
}

/// The jobs being waited for, by id: one `squeue` serves them all.
#[derive(Debug, Default)]
struct Poller {
    waiting: std::sync::Mutex<PollerState>,
}

#[derive(Debug, Default)]
struct PollerState {
    jobs: std::collections::HashMap<String, tokio::sync::watch::Sender<Seen>>,
    /// Whether the polling task runs.
    polling: bool,
    /// A job joined since the last poll: poll again soon.
    joined: bool,
}

/// How many `squeue` calls in a row may fail before the jobs waited for
/// fail with the error.
const QUERY_TRIES: u32 = 3;

impl Poller {
    /// The waiters (a panic elsewhere leaves plain entries behind).
    fn lock(&self) -> std::sync::MutexGuard<'_, PollerState> {
        self.waiting
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Job ids per `squeue` call, so a command line stays short.
const IDS_PER_QUERY: usize = 512;

/// Stops waiting for a job when its waiter ends or is dropped.
struct Waiting<'a> {
    poller: &'a Poller,
    id: String,
}

impl Drop for Waiting<'_> {
    /// The job is no longer polled once its last waiter is gone.
    fn drop(&mut self) {
        let mut state = self.poller.lock();
        if state
            .jobs
            .get(&self.id)
            .is_some_and(|sender| sender.receiver_count() <= 1)
        {
            state.jobs.remove(&self.id);
        }
    }
}

impl SlurmExecutor {
    pub fn new(settings: SlurmSettings) -> Self {
        let permits = settings
            .max_jobs
            .clamp(1, tokio::sync::Semaphore::MAX_PERMITS);
        let batcher = (settings.batch > 1).then(|| Batcher::new(settings.batch, ARRAY_LINGER));
        Self {
            settings,
            in_flight: Arc::new(tokio::sync::Semaphore::new(permits)),
            poller: Arc::default(),
            batcher,
        }
    }

    /// Waits for room under `max_jobs`.
    async fn room(&self) -> Result<tokio::sync::OwnedSemaphorePermit, ExecError> {
        self.in_flight
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| ExecError::Wait(std::io::Error::other(e)))
    }

    /// The `sbatch` arguments for `job` (the script goes on stdin).
    pub fn sbatch_args(&self, job: &Job) -> Vec<String> {
        self.sbatch_args_named(job, &job.name, &job.log)
    }

    /// The `sbatch` arguments for `job` under another name and log (a job
    /// array's, which every index shares).
    fn sbatch_args_named(&self, job: &Job, name: &str, output: &Path) -> Vec<String> {
        let s = &self.settings;
        let mut args = vec![
            "--parsable".to_owned(),
            format!("--job-name={name}"),
            format!("--chdir={}", job.cwd.display()),
            format!("--output={}", output.display()),
            "--open-mode=append".to_owned(),
            "--export=ALL".to_owned(),
            // cairn retries; Slurm must not requeue on its own.
            "--no-requeue".to_owned(),
            format!("--comment=cairn-run={}", job.token),
        ];
        let mut push = |flag: &str, value: Option<String>| {
            if let Some(value) = value {
                args.push(format!("--{flag}={value}"));
            }
        };
        push("partition", s.partition.clone());
        push("account", s.account.clone());
        // The stage's own timeout, else the executor's.
        let limit = job.timeout.or(s.time_limit);
        push(
            "time",
            limit.map(|d| d.as_secs().div_ceil(60).max(1).to_string()),
        );
        push("cpus-per-task", s.cpus.map(|n| n.to_string()));
        push("mem", s.memory.clone());
        push("gres", s.gres.clone());
        args.extend(s.sbatch_args.iter().cloned());
        args
    }

    /// Submits `job`; the id Slurm gave it.
    pub async fn submit_job(&self, job: &Job) -> Result<SlurmJob, ExecError> {
        let id = self
            .sbatch(self.sbatch_args(job), &job.env, &batch_script(&job.command))
            .await?;
        Ok(SlurmJob {
            id,
            name: job.name.clone(),
        })
    }

    /// Submits `batch` as one job array, index `i` running job `i`; the
    /// array task ids (`1234_0`, `1234_1`, …).
    pub async fn submit_array(&self, batch: &Batch) -> Result<Vec<String>, ExecError> {
        let first = &batch.jobs[0];
        let output = array_output(first, &batch.name, "%a");
        let mut args = self.sbatch_args_named(first, &batch.name, &output);
        args.push(format!("--array=0-{}", batch.jobs.len() - 1));
        let env: Vec<(String, String)> = shared_env(batch).cloned().collect();
        let script = index_script(batch, "SLURM_ARRAY_TASK_ID");
        let id = self.sbatch(args, &env, &script).await?;
        Ok((0..batch.jobs.len()).map(|i| format!("{id}_{i}")).collect())
    }

    /// Runs `sbatch` with `args`, exactly the environment `env` and
    /// `script` on stdin; the job id it printed.
    async fn sbatch(
        &self,
        args: Vec<String>,
        env: &[(String, String)],
        script: &str,
    ) -> Result<String, ExecError> {
        let mut command = tokio::process::Command::new("sbatch");
        command
            .args(args)
            .env_clear()
            // Not the run marker: a resumed run kills this machine's
            // processes that carry it, and a job is Slurm's to keep (the
            // token is in its comment).
            .envs(
                env.iter()
                    .filter(|(k, _)| k != RUN_MARKER)
                    .map(|(k, v)| (k, v)),
            )
            .envs(slurm_client_env())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().map_err(|source| ExecError::Spawn {
            program: "sbatch".to_owned(),
            source,
        })?;
        feed(&mut child, script.as_bytes()).await?;
        let out = child.wait_with_output().await.map_err(ExecError::Wait)?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        // `--parsable` prints `ID` or `ID;CLUSTER`.
        let id = stdout.trim().split(';').next().unwrap_or_default();
        if !out.status.success() || id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
            return Err(ExecError::Engine {
                engine: "slurm",
                action: "submit",
                detail: format!(
                    "sbatch {}: {}",
                    describe_status(out.status),
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            });
        }
        Ok(id.to_owned())
    }

    /// The job named `name` that Slurm still knows (running, pending, or
    /// finished within `MinJobAge`), the newest if several.
    pub async fn find(&self, name: &str) -> Result<Option<SlurmJob>, ExecError> {
        let text = squeue(&["--states=all", "--name", name, "--format=%i"]).await?;
        Ok(text
            .lines()
            .filter_map(|line| line.trim().parse::<u64>().ok())
            .max()
            .map(|id| SlurmJob {
                id: id.to_string(),
                name: name.to_owned(),
            }))
    }

    /// The id of the job array named `name` that Slurm still knows, the
    /// newest if several.
    async fn find_array(&self, name: &str) -> Result<Option<String>, ExecError> {
        let text = squeue(&["--states=all", "--name", name, "--format=%F"]).await?;
        Ok(text
            .lines()
            .filter_map(|line| line.trim().parse::<u64>().ok())
            .max()
            .map(|id| id.to_string()))
    }

    /// Where the job writes its stdout (`StdOut=` in `scontrol`).
    async fn stdout_path(&self, job: &SlurmJob) -> Result<Option<std::path::PathBuf>, ExecError> {
        let text = run_client("scontrol", &["show", "job", &job.id]).await?;
        Ok(text
            .split_whitespace()
            .find_map(|field| field.strip_prefix("StdOut="))
            .map(std::path::PathBuf::from))
    }

    /// The exit code of a finished job (`ExitCode=N:S` in `scontrol`).
    async fn exit_code(&self, job: &SlurmJob) -> Result<(i32, i32), ExecError> {
        let text = run_client("scontrol", &["show", "job", &job.id]).await?;
        Ok(parse_exit_code(&text).unwrap_or((-1, 0)))
    }

    /// Waits until the job ends; how it ended. Its state comes from the
    /// executor's one polling task, which reads every waited-for job with
    /// one `squeue` per interval.
    pub async fn wait_job(&self, job: &SlurmJob) -> Result<Outcome, ExecError> {
        let (mut seen, _waiting) = self.watch(&job.id);
        loop {
            let now = seen.borrow_and_update().clone();
            match now {
                Seen::Unknown => {}
                Seen::Forgotten => return Ok(Outcome::Infra(InfraKind::Vanished)),
                Seen::Failed(detail) => {
                    return Err(ExecError::Engine {
                        engine: "slurm",
                        action: "read a job's state",
                        detail,
                    });
                }
                Seen::State(state) => {
                    if let Some(outcome) = self.ended(job, &state).await? {
                        return Ok(outcome);
                    }
                }
            }
            // The sender lives while this job is waited for.
            let _ = seen.changed().await;
        }
    }

    /// Registers `id` with the poller (starting it if it is not running).
    fn watch(&self, id: &str) -> (tokio::sync::watch::Receiver<Seen>, Waiting<'_>) {
        let mut state = self.poller.lock();
        let receiver = match state.jobs.get(id) {
            Some(sender) => sender.subscribe(),
            None => {
                let (sender, receiver) = tokio::sync::watch::channel(Seen::Unknown);
                state.jobs.insert(id.to_owned(), sender);
                receiver
            }
        };
        state.joined = true;
        if !state.polling {
            state.polling = true;
            tokio::spawn(self.clone().poll_all());
        }
        let waiting = Waiting {
            poller: &self.poller,
            id: id.to_owned(),
        };
        (receiver, waiting)
    }

    /// Reads the state of every waited-for job, one `squeue` per interval,
    /// until no job is waited for.
    async fn poll_all(self) {
        let floor = Duration::from_millis(100);
        let ceiling = self.settings.poll.max(floor);
        let mut interval = floor;
        // A slurmctld busy for a moment fails a query or two: only a
        // failure that lasts fails the jobs waited for.
        let mut failures = 0u32;
        loop {
            let ids: Vec<String> = {
                let mut state = self.poller.lock();
                if state.jobs.is_empty() {
                    state.polling = false;
                    return;
                }
                if std::mem::take(&mut state.joined) {
                    interval = floor;
                }
                state.jobs.keys().cloned().collect()
            };
            let mut seen = std::collections::HashMap::new();
            let mut failed = None;
            for chunk in ids.chunks(IDS_PER_QUERY) {
                match states(chunk).await {
                    Ok(states) => seen.extend(states),
                    Err(error) => failed = Some(error),
                }
            }
            failures = if failed.is_some() { failures + 1 } else { 0 };
            if let Some(error) = &failed
                && failures < QUERY_TRIES
            {
                tracing::warn!(error = %error, "squeue failed; asking again");
            } else {
                let state = self.poller.lock();
                for id in &ids {
                    let Some(sender) = state.jobs.get(id) else {
                        continue;
                    };
                    // Slurm could not be asked: every waiter fails with why.
                    let now = match &failed {
                        Some(ExecError::Engine { detail, .. }) => Seen::Failed(detail.clone()),
                        Some(error) => Seen::Failed(error.to_string()),
                        None => seen.remove(id).map_or(Seen::Forgotten, Seen::State),
                    };
                    sender.send_if_modified(|old| {
                        let changed = *old != now;
                        *old = now;
                        changed
                    });
                }
            }
            tokio::time::sleep(interval).await;
            interval = (interval * 2).min(ceiling);
        }
    }

    async fn ended(&self, job: &SlurmJob, state: &JobState) -> Result<Option<Outcome>, ExecError> {
        if !has_ended(&state.state) {
            return Ok(None);
        }
        Ok(Some(match state.state.as_str() {
            "COMPLETED" => Outcome::Success,
            "FAILED" => match self.exit_code(job).await? {
                (0, signal) if signal > 0 => Outcome::Signal(signal),
                (code, _) => Outcome::Exit(code),
            },
            "CANCELLED" => Outcome::Cancelled,
            "TIMEOUT" => Outcome::TimedOut(self.settings.time_limit.unwrap_or_default()),
            "OUT_OF_MEMORY" => Outcome::Infra(InfraKind::OutOfMemory),
            "NODE_FAIL" | "BOOT_FAIL" => Outcome::Infra(InfraKind::NodeLost),
            "PREEMPTED" => Outcome::Infra(InfraKind::Preempted),
            "DEADLINE" => Outcome::Infra(InfraKind::Unschedulable),
            _ => Outcome::Infra(InfraKind::Unknown),
        }))
    }

    /// Cancels the job (`scancel`); a job that already ended is left alone.
    pub async fn cancel_job(&self, job: &SlurmJob) -> Result<(), ExecError> {
        run_client("scancel", &[&job.id]).await.map(drop)
    }

    /// Jobs that carry a cairn run token for which `is_live` is false: what
    /// a cairn process that died left queued or running.
    pub async fn orphans(
        &self,
        is_live: impl Fn(&str) -> bool,
    ) -> Result<Vec<SlurmJob>, ExecError> {
        let text = squeue(&["--array", "--format=%i|%j|%k"]).await?;
        Ok(text
            .lines()
            .filter_map(|line| {
                let mut fields = line.splitn(3, '|');
                let (id, name, comment) = (fields.next()?, fields.next()?, fields.next()?);
                let token = comment.trim().strip_prefix("cairn-run=")?;
                (!is_live(token)).then(|| SlurmJob {
                    id: id.trim().to_owned(),
                    name: name.trim().to_owned(),
                })
            })
            .collect())
    }
}

impl Executor for SlurmExecutor {
    fn kind(&self) -> &'static str {
        "slurm"
    }

    fn submit<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, Result<Box<dyn Running>, ExecError>> {
        Box::pin(async move {
            let permit = self.room().await?;
            let Some(batcher) = &self.batcher else {
                let submitted = self.submit_job(job).await?;
                return Ok(self.running(submitted, job, None, permit));
            };
            let (placed, id) = batcher.submit(self, job).await?;
            let submitted = SlurmJob {
                id,
                name: job.name.clone(),
            };
            let written_to = array_output(job, &placed.batch, &placed.index.to_string());
            Ok(self.running(submitted, job, Some(written_to), permit))
        })
    }

    /// Through the Slurm license named after the window (see [`window`]).
    fn hold_window<'a>(
        &'a self,
        window: &'a str,
        job: &'a Job,
    ) -> BoxFuture<'a, Result<Option<Box<dyn HeldWindow>>, ExecError>> {
        Box::pin(async move { self.hold_license(window, job).await.map(Some) })
    }

    fn cancel_handle<'a>(&'a self, handle: &'a str) -> BoxFuture<'a, Result<bool, ExecError>> {
        Box::pin(async move {
            let Some(id) = handle.strip_prefix("slurm:") else {
                return Ok(false);
            };
            let job = SlurmJob {
                id: id.to_owned(),
                name: String::new(),
            };
            match self.cancel_job(&job).await {
                Ok(()) => Ok(true),
                // Already gone from Slurm: nothing left to cancel.
                Err(ExecError::Engine { detail, .. }) if detail.contains("Invalid job id") => {
                    Ok(true)
                }
                Err(other) => Err(other),
            }
        })
    }

    fn attach<'a>(
        &'a self,
        job: &'a Job,
    ) -> BoxFuture<'a, Result<Option<Box<dyn Running>>, ExecError>> {
        Box::pin(async move {
            let permit = self.room().await?;
            let found = match &self.batcher {
                None => self.find(&job.name).await?,
                // A job array's tasks share the array's name: the batch
                // records say which index runs this job. An item never
                // recorded in one is not looked up one by one.
                Some(batcher) => match batcher.placed(job).await {
                    None => None,
                    Some(placed) => self.find_array(&placed.batch).await?.map(|id| SlurmJob {
                        id: format!("{id}_{}", placed.index),
                        name: job.name.clone(),
                    }),
                },
            };
            let Some(found) = found else {
                return Ok(None);
            };
            // A cancelled job (an interrupted run's) has nothing to give:
            // submit the attempt again rather than adopt its cancellation.
            let cancelled = states(std::slice::from_ref(&found.id))
                .await?
                .get(&found.id)
                .is_some_and(|s| s.state == "CANCELLED");
            if cancelled {
                return Ok(None);
            }
            let written_to = self.stdout_path(&found).await?;
            Ok(Some(self.running(found, job, written_to, permit)))
        })
    }
}

impl BatchEngine for SlurmExecutor {
    fn submit_batch<'a>(
        &'a self,
        batch: &'a Batch,
    ) -> BoxFuture<'a, Result<Vec<String>, ExecError>> {
        Box::pin(self.submit_array(batch))
    }

    fn cancel_index<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), ExecError>> {
        Box::pin(async move { run_client("scancel", &[id]).await.map(drop) })
    }
}

impl SlurmExecutor {
    fn running(
        &self,
        submitted: SlurmJob,
        job: &Job,
        written_to: Option<std::path::PathBuf>,
        permit: tokio::sync::OwnedSemaphorePermit,
    ) -> Box<dyn Running> {
        Box::new(SlurmRunning {
            slurm: self.clone(),
            submitted,
            written_to: written_to.filter(|path| *path != job.log),
            log: job.log.clone(),
            redact: job.redact.clone(),
            ended: false,
            _permit: permit,
            _held: ClusterJobGuard::new(),
        })
    }
}

/// A job on Slurm. Dropped before it ended (the run was interrupted), it
/// is cancelled; a cairn process killed outright leaves it running, for the
/// next run to adopt.
struct SlurmRunning {
    slurm: SlurmExecutor,
    /// An adopted job's own log, when an earlier run named another one
    /// (`--output` is fixed at submission): copied into this attempt's log.
    written_to: Option<std::path::PathBuf>,
    submitted: SlurmJob,
    log: std::path::PathBuf,
    redact: Vec<(String, String)>,
    ended: bool,
    _permit: tokio::sync::OwnedSemaphorePermit,
    _held: ClusterJobGuard,
}

impl Drop for SlurmRunning {
    fn drop(&mut self) {
        if !self.ended && !super::cluster_jobs_detached() {
            // Blocking, and brief: the scheduler is shutting down.
            let _ = std::process::Command::new("scancel")
                .arg(&self.submitted.id)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}

impl Running for SlurmRunning {
    fn handle(&self) -> String {
        format!("slurm:{}", self.submitted.id)
    }

    fn wait(self: Box<Self>) -> BoxFuture<'static, Result<Outcome, ExecError>> {
        Box::pin(async move {
            let mut this = self;
            let outcome = this.slurm.wait_job(&this.submitted).await?;
            this.ended = true;
            let this = this;
            let log_error = |path: &std::path::Path, source| ExecError::Log {
                path: path.to_owned(),
                source,
            };
            if let Some(earlier) = &this.written_to {
                // The earlier run's log is redacted where it lies, then
                // appended to this attempt's, which `classify` reads.
                redact_log(earlier, &this.redact)
                    .await
                    .map_err(|e| log_error(earlier, e))?;
                if let Ok(text) = std::fs::read(earlier) {
                    use std::io::Write as _;
                    std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&this.log)
                        .and_then(|mut file| file.write_all(&text))
                        .map_err(|e| log_error(&this.log, e))?;
                }
            }
            redact_log(&this.log, &this.redact)
                .await
                .map_err(|e| log_error(&this.log, e))?;
            Ok(outcome)
        })
    }
}

/// Whether a job in Slurm state `state` has ended (every other state is
/// on its way: queued, starting, running, suspended, requeued).
fn has_ended(state: &str) -> bool {
    !matches!(
        state,
        "PENDING"
            | "RUNNING"
            | "CONFIGURING"
            | "COMPLETING"
            | "SUSPENDED"
            | "REQUEUED"
            | "REQUEUE_HOLD"
            | "REQUEUE_FED"
            | "RESIZING"
            | "SIGNALING"
            | "STAGE_OUT"
            | "STOPPED"
            | "RESV_DEL_HOLD"
    )
}

/// The batch script: the command, run by `/bin/sh` on the node.
fn batch_script(command: &Command) -> String {
    format!("#!/bin/sh\n{}\n", exec_line(command))
}

/// Where index `index` (`%a` for every index) of the job array `batch`
/// writes its output: beside the first job's log, appended to each job's
/// own log when it ends.
fn array_output(job: &Job, batch: &str, index: &str) -> PathBuf {
    job.log
        .parent()
        .unwrap_or(Path::new(""))
        .join(format!("{batch}.{index}.log"))
}

/// The states of the jobs `ids` that Slurm still knows, by id (one
/// `squeue`; a job it has forgotten is absent).
async fn states(ids: &[String]) -> Result<std::collections::HashMap<String, JobState>, ExecError> {
    let list = ids.join(",");
    // `--array`: one line per array task, pending ones too.
    let text = match squeue(&[
        "--array",
        "--states=all",
        "--jobs",
        &list,
        "--format=%i|%T|%R",
    ])
    .await
    {
        Ok(text) => text,
        // A list of one id that has aged out is an error; of several, not.
        Err(ExecError::Engine { detail, .. }) if detail.contains("Invalid job id") => {
            return Ok(std::collections::HashMap::new());
        }
        Err(other) => return Err(other),
    };
    Ok(text
        .lines()
        .filter_map(|line| {
            let mut fields = line.splitn(3, '|');
            let (id, state, reason) = (fields.next()?, fields.next()?, fields.next()?);
            Some((
                id.trim().to_owned(),
                JobState {
                    state: state.trim().to_owned(),
                    reason: reason.trim().to_owned(),
                },
            ))
        })
        .collect())
}

/// What Slurm's client commands need from cairn's own environment.
/// Writes `script` to the child's stdin and closes it. A child that exits
/// without reading all of it (`sbatch` refusing a submission) has closed
/// the pipe: not an error here, since its exit status and stderr say what
/// happened (and a refused submission is an infrastructure failure, which
/// is retried).
async fn feed(child: &mut tokio::process::Child, script: &[u8]) -> Result<(), ExecError> {
    use tokio::io::AsyncWriteExt as _;
    if let Some(mut stdin) = child.stdin.take() {
        match stdin.write_all(script).await {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
            other => other.map_err(ExecError::Wait)?,
        }
    }
    Ok(())
}

fn slurm_client_env() -> Vec<(String, String)> {
    ["SLURM_CONF"]
        .iter()
        .filter_map(|name| Some(((*name).to_owned(), std::env::var(name).ok()?)))
        .collect()
}

async fn squeue(args: &[&str]) -> Result<String, ExecError> {
    let mut all = vec!["--noheader"];
    all.extend_from_slice(args);
    run_client("squeue", &all).await
}

/// Runs a Slurm client command; its stdout, or an error with its stderr.
async fn run_client(program: &'static str, args: &[&str]) -> Result<String, ExecError> {
    let out = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|source| ExecError::Spawn {
            program: program.to_owned(),
            source,
        })?;
    if !out.status.success() {
        return Err(ExecError::Engine {
            engine: "slurm",
            action: program,
            detail: format!(
                "{program} {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn describe_status(status: std::process::ExitStatus) -> String {
    match status.code() {
        Some(code) => format!("exited with status {code}"),
        None => "was killed by a signal".to_owned(),
    }
}

/// `ExitCode=2:0` in `scontrol show job` output: (exit code, signal).
fn parse_exit_code(text: &str) -> Option<(i32, i32)> {
    let value = text
        .split_whitespace()
        .find_map(|field| field.strip_prefix("ExitCode="))?;
    let (code, signal) = value.split_once(':')?;
    Some((code.parse().ok()?, signal.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    /// A submitter that exits without reading its script (as `sbatch`
    /// does when the controller refuses it) closes the pipe under the
    /// write: its exit status is the answer, not a broken pipe.
    #[tokio::test]
    async fn a_child_that_stops_reading_its_script_is_judged_by_its_exit_status() {
        let mut child = tokio::process::Command::new("sh")
            .args(["-c", "exit 3"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // More than a pipe holds, so the write meets the closed end.
        feed(&mut child, &vec![b'#'; 4 << 20]).await.unwrap();
        let status = child.wait().await.unwrap();
        assert_eq!(status.code(), Some(3));
    }

    fn job() -> Job {
        Job {
            name: "cairn-oracle-1a2b3c4d5e6f-1".to_owned(),
            token: "123-456".to_owned(),
            command: Command::Shell("python3 oracle.py 'a b'".to_owned()),
            cwd: PathBuf::from("/shared/project"),
            env: vec![("PATH".to_owned(), "/usr/bin".to_owned())],
            timeout: Some(Duration::from_secs(90)),
            log: PathBuf::from("/shared/project/cache/logs/7/oracle.log"),
            redact: Vec::new(),
            stage: "oracle".to_owned(),
            secrets: Vec::new(),
            image: None,
        }
    }

    #[test]
    fn sbatch_arguments_carry_name_place_log_token_and_placement() {
        let slurm = SlurmExecutor::new(SlurmSettings {
            partition: Some("gpu".to_owned()),
            account: Some("curation".to_owned()),
            time_limit: Some(Duration::from_secs(3600)),
            cpus: Some(4),
            memory: Some("8G".to_owned()),
            gres: Some("gpu:1".to_owned()),
            sbatch_args: vec!["--exclusive".to_owned()],
            poll: Duration::from_secs(2),
            max_jobs: 8,
            batch: 1,
        });
        assert_eq!(
            slurm.sbatch_args(&job()),
            [
                "--parsable",
                "--job-name=cairn-oracle-1a2b3c4d5e6f-1",
                "--chdir=/shared/project",
                "--output=/shared/project/cache/logs/7/oracle.log",
                "--open-mode=append",
                "--export=ALL",
                "--no-requeue",
                "--comment=cairn-run=123-456",
                "--partition=gpu",
                "--account=curation",
                // The stage's 90 s timeout wins, rounded up to minutes.
                "--time=2",
                "--cpus-per-task=4",
                "--mem=8G",
                "--gres=gpu:1",
                "--exclusive",
            ]
        );
    }

    #[test]
    fn the_batch_script_runs_the_command_as_one_quoted_word() {
        assert_eq!(
            batch_script(&Command::Shell("echo 'it''s' $HOME".to_owned())),
            "#!/bin/sh\nexec /bin/sh -c 'echo '\\''it'\\'''\\''s'\\'' $HOME'\n"
        );
        assert_eq!(
            batch_script(&Command::Exec(vec!["python3".into(), "a b.py".into()])),
            "#!/bin/sh\nexec python3 'a b.py'\n"
        );
    }

    #[test]
    fn exit_codes_are_read_from_scontrol() {
        let text =
            "JobId=12 JobName=x\n   Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=3:0\n";
        assert_eq!(parse_exit_code(text), Some((3, 0)));
        assert_eq!(parse_exit_code("ExitCode=0:9"), Some((0, 9)));
        assert_eq!(parse_exit_code("JobState=PENDING"), None);
    }
}
