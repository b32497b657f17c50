//! Executors run one command and report how it ended. They know nothing of
//! graphs, fingerprints or caching.

mod batch;
mod image;
mod kubernetes;
mod local;
mod slurm;

pub use batch::{ATTEMPT_MARKER, ITEM_MARKER, SAMPLE_MARKER, SEED_MARKER};
pub use image::{ImageRef, ImageResolver, PinnedImage};
pub use kubernetes::{KubernetesExecutor, job_spec, kubernetes_name, label_value, qps_limit};
pub use local::{LocalExecutor, is_local_handle};
pub use slurm::{JobState, SlurmExecutor, SlurmJob};

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;

use crate::manifest::Command;

/// One command to run.
#[derive(Debug, Clone)]
pub struct Job {
    /// The job's name on an engine that names jobs: derived from the stage
    /// (or item) fingerprint and the attempt, so the same attempt is found
    /// again by name.
    pub name: String,
    /// The run's token: marks every process and job this run starts.
    pub token: String,
    /// The stage it belongs to (a label on engines that label jobs).
    pub stage: String,
    pub command: Command,
    pub cwd: PathBuf,
    /// The complete environment of the process.
    pub env: Vec<(String, String)>,
    pub timeout: Option<Duration>,
    /// stdout and stderr are appended here.
    pub log: PathBuf,
    /// (name, value) of secrets whose values are redacted from the log.
    pub redact: Vec<(String, String)>,
    /// The names of the stage's secret variables (an engine with its own
    /// secret store hands them over by name instead of by value).
    pub secrets: Vec<String>,
    /// The image it runs in, by digest (`REPO@sha256:…`), on engines that
    /// run images; pinned before the job was fingerprinted.
    pub image: Option<String>,
}

/// The variable that marks every process a run starts (its value is the
/// run's token), inherited by their children.
pub const RUN_MARKER: &str = "CAIRN_RUN";

/// Kills every process whose environment carries `RUN_MARKER=token`: what
/// a cairn process that was itself killed (`kill -9`) left running. Returns
/// how many were signalled. Processes that dropped their environment are not
/// found; nor, on systems without `/proc`, is anything.
pub fn kill_marked_processes(token: &str) -> usize {
    let needle = format!("{RUN_MARKER}={token}");
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut killed = 0;
    // One buffer, large enough for most environments: `std::fs::read`
    // would start from a few bytes (a `/proc` file has no size) and read
    // a typical environment in eight calls.
    let mut environ = Vec::with_capacity(16 * 1024);
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if pid <= 1 || pid == std::process::id() as i32 {
            continue;
        }
        environ.clear();
        let read = std::fs::File::open(entry.path().join("environ"))
            .and_then(|mut file| std::io::Read::read_to_end(&mut file, &mut environ));
        if read.is_err() {
            continue;
        }
        if environ
            .split(|b| *b == 0)
            .any(|var| var == needle.as_bytes())
        {
            // SAFETY: kill(2) has no memory-safety preconditions.
            if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
                killed += 1;
            }
        }
    }
    killed
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Success,
    Exit(i32),
    Signal(i32),
    TimedOut(Duration),
    /// The engine failed the job, not the command: always the `infra`
    /// class, never a verdict.
    Infra(InfraKind),
    /// Cancelled before it ended (by cairn or by someone else).
    Cancelled,
}

/// Why an engine failed a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InfraKind {
    /// The engine refused or lost the submission.
    SubmitFailed,
    /// The image could not be pulled.
    ImagePull,
    /// No node could take the job in time.
    Unschedulable,
    /// The job was evicted or its node went away.
    NodeLost,
    /// A higher-priority job took its place.
    Preempted,
    /// Killed for using more memory than it asked for.
    OutOfMemory,
    /// The engine forgot the job before cairn saw it end.
    Vanished,
    /// An end state cairn does not know.
    Unknown,
}

impl InfraKind {
    pub fn describe(self) -> &'static str {
        match self {
            InfraKind::SubmitFailed => "could not be submitted",
            InfraKind::ImagePull => "could not pull its image",
            InfraKind::Unschedulable => "could not be scheduled",
            InfraKind::NodeLost => "lost its node",
            InfraKind::Preempted => "was preempted",
            InfraKind::OutOfMemory => "ran out of memory",
            InfraKind::Vanished => "vanished from the engine",
            InfraKind::Unknown => "ended in a state cairn does not know",
        }
    }
}

impl Outcome {
    pub fn exit_code(self) -> Option<i32> {
        match self {
            Outcome::Success => Some(0),
            Outcome::Exit(code) => Some(code),
            Outcome::Signal(_) | Outcome::TimedOut(_) | Outcome::Infra(_) | Outcome::Cancelled => {
                None
            }
        }
    }

    pub fn describe(self) -> String {
        match self {
            Outcome::Success => "exited with status 0".to_owned(),
            Outcome::Exit(code) => format!("exited with status {code}"),
            Outcome::Signal(signal) => format!("was killed by signal {signal}"),
            Outcome::TimedOut(limit) => {
                format!("timed out after {}", humantime::format_duration(limit))
            }
            Outcome::Infra(kind) => {
                format!("failed on infrastructure: the job {}", kind.describe())
            }
            Outcome::Cancelled => "was cancelled".to_owned(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("failed to start `{program}`")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to write log file `{}`", path.display())]
    Log {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to write `{}`", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to wait for a child process")]
    Wait(#[source] std::io::Error),
    /// A remote engine refused an action (submit, query, cancel).
    #[error("{engine} could not {action}: {detail}")]
    Engine {
        engine: &'static str,
        action: &'static str,
        detail: String,
    },
}

/// A future an executor returns (the trait stays object-safe, so the
/// scheduler holds executors as `Arc<dyn Executor>`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// An engine that runs jobs: this machine's processes, a Slurm cluster, …
///
/// The lifecycle a remote engine needs: `submit` starts a job named
/// `job.name` (derived from the fingerprint and the attempt); `attach` finds
/// the job of that name an earlier cairn process submitted, so a resumed
/// run waits for it instead of submitting it twice; the [`Running`] job is
/// waited for; `cancel` stops one by its handle.
pub trait Executor: Send + Sync {
    /// `local`, `slurm`, …
    fn kind(&self) -> &'static str;

    /// Whether its jobs run on this machine, and so take one of the run's
    /// `-j N` job slots.
    fn uses_local_slots(&self) -> bool {
        false
    }

    /// Starts `job`.
    fn submit<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, Result<Box<dyn Running>, ExecError>>;

    /// The job named `job.name` that the engine still has (queued, running or
    /// finished), submitted by an earlier cairn process.
    fn attach<'a>(
        &'a self,
        job: &'a Job,
    ) -> BoxFuture<'a, Result<Option<Box<dyn Running>>, ExecError>>;

    /// The job named `job.name` if the engine has it (adopted), else a
    /// newly submitted one.
    fn start<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, Result<Box<dyn Running>, ExecError>> {
        Box::pin(async move {
            match self.attach(job).await? {
                Some(adopted) => {
                    tracing::info!(job = %job.name, handle = %adopted.handle(), "adopted a job already submitted");
                    Ok(adopted)
                }
                None => self.submit(job).await,
            }
        })
    }

    /// Cancels the job named by `handle` (what [`Running::handle`] gave an
    /// earlier process) if it is this engine's: true if it was. A job that
    /// already ended is left alone.
    fn cancel_handle<'a>(&'a self, handle: &'a str) -> BoxFuture<'a, Result<bool, ExecError>> {
        let _ = handle;
        Box::pin(async { Ok(false) })
    }

    /// Takes the window `window` for the run of `job` (the stage's: its
    /// token holds the window, its project root may keep a heartbeat)
    /// across every process and machine that uses this engine, waiting
    /// while another holds it; `None` if this engine has no such windows
    /// (the window is then this process's alone).
    fn hold_window<'a>(
        &'a self,
        window: &'a str,
        job: &'a Job,
    ) -> BoxFuture<'a, Result<Option<Box<dyn HeldWindow>>, ExecError>> {
        let _ = (window, job);
        Box::pin(async { Ok(None) })
    }

    /// Starts the job (see [`Executor::start`]) and waits for it.
    fn run<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, Result<Outcome, ExecError>> {
        Box::pin(async move { self.start(job).await?.wait().await })
    }
}

/// A window held across machines ([`Executor::hold_window`]). Dropped
/// without `release`, it lapses on its own after a while.
pub trait HeldWindow: Send {
    fn release(self: Box<Self>) -> BoxFuture<'static, Result<(), ExecError>>;
}

/// A job an executor started or adopted.
pub trait Running: Send {
    /// What identifies the job on its engine (`pid:4242`, `slurm:1234`).
    fn handle(&self) -> String;

    /// Waits until the job ends; its log is complete and redacted then.
    fn wait(self: Box<Self>) -> BoxFuture<'static, Result<Outcome, ExecError>>;
}

/// Set by `cairn run --detach`: an interrupted run leaves its remote jobs
/// running (the next run adopts them) instead of cancelling them.
static DETACHED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// From now on, remote jobs dropped before they end are left running.
pub fn detach_remote_jobs() {
    DETACHED.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Whether remote jobs dropped before they end are left running.
pub fn remote_jobs_detached() -> bool {
    DETACHED.load(std::sync::atomic::Ordering::SeqCst)
}

/// Counts the remote jobs this process holds (started or adopted, not yet
/// ended or cancelled). A job dropped before it ended is cancelled by its
/// `Drop`, which needs the scheduler's runtime: an interrupted run waits
/// for [`remote_jobs_released`] before it returns, so no cancellation is
/// lost to the runtime shutting down.
static REMOTE_JOBS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Held by a remote [`Running`] job, as its last field (so it is released
/// after the job's own `Drop` has cancelled it).
#[derive(Debug)]
pub struct RemoteJobGuard(());

impl RemoteJobGuard {
    pub fn new() -> Self {
        REMOTE_JOBS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        RemoteJobGuard(())
    }
}

impl Default for RemoteJobGuard {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for RemoteJobGuard {
    fn drop(&mut self) {
        REMOTE_JOBS.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Waits (at most `limit`) until every remote job this process held has
/// ended or been cancelled; false if some are still held then.
pub async fn remote_jobs_released(limit: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    let mut pause = Duration::from_millis(1);
    while REMOTE_JOBS.load(std::sync::atomic::Ordering::SeqCst) > 0 {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        // Aborted tasks are dropped by the runtime's workers soon after
        // the abort; nothing notifies when, so look again shortly.
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(50));
    }
    true
}

/// The base environment every command gets, before declared variables.
pub fn base_environment() -> Vec<(String, String)> {
    ["PATH", "HOME", "LANG", "TMPDIR"]
        .iter()
        .filter_map(|name| {
            std::env::var(name)
                .ok()
                .map(|value| ((*name).to_owned(), value))
        })
        .collect()
}

/// `text` with every secret value replaced by `[redacted NAME]`, or `None`
/// if it holds none.
pub fn redact_text(text: &str, secrets: &[(String, String)]) -> Option<String> {
    let mut redacted: Option<String> = None;
    for (name, value) in secrets {
        let current = redacted.as_deref().unwrap_or(text);
        if current.contains(value.as_str()) {
            redacted = Some(current.replace(value.as_str(), &format!("[redacted {name}]")));
        }
    }
    redacted
}

/// Replaces every secret value in the log with `[redacted NAME]` (temp file
/// and rename, so no reader sees a half-redacted log).
pub async fn redact_log(
    log: &std::path::Path,
    secrets: &[(String, String)],
) -> std::io::Result<()> {
    if secrets.is_empty() {
        return Ok(());
    }
    // Reading and rewriting a long log is blocking work: on the blocking
    // pool, so hundreds of jobs ending at once keep the event loop free.
    let (log, secrets) = (log.to_owned(), secrets.to_vec());
    tokio::task::spawn_blocking(move || redact_log_now(&log, &secrets))
        .await
        .map_err(std::io::Error::other)?
}

fn redact_log_now(log: &std::path::Path, secrets: &[(String, String)]) -> std::io::Result<()> {
    let bytes = match std::fs::read(log) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let text = String::from_utf8_lossy(&bytes);
    if let Some(text) = redact_text(&text, secrets) {
        let temp = log.with_extension("log.redacting");
        std::fs::write(&temp, text)?;
        std::fs::rename(&temp, log)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;
    use std::time::{Duration, Instant};

    use super::*;

    /// Waits until process `pid` runs with `needle` in its environment
    /// (after its `exec`; before, it has its parent's).
    fn wait_for_environment(pid: u32, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            if environ
                .split(|b| *b == 0)
                .any(|var| var == needle.as_bytes())
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        panic!("process {pid} never ran with `{needle}`");
    }

    #[test]
    fn only_the_processes_carrying_the_runs_mark_are_killed_however_large_their_environment() {
        let token = format!("mark-test-{}", std::process::id());
        // Larger than the buffer the environments are read into.
        let large = "x".repeat(40_000);
        let spawn = |mark: &str| {
            std::process::Command::new("sleep")
                .arg("30")
                .env(RUN_MARKER, mark)
                .env("LARGE", &large)
                .spawn()
                .unwrap()
        };
        let mut marked = spawn(&token);
        let mut other = spawn("another-run");
        wait_for_environment(marked.id(), &format!("{RUN_MARKER}={token}"));
        wait_for_environment(other.id(), &format!("{RUN_MARKER}=another-run"));

        assert_eq!(kill_marked_processes(&token), 1);
        assert_eq!(marked.wait().unwrap().signal(), Some(libc::SIGKILL));
        assert!(
            other.try_wait().unwrap().is_none(),
            "the other run's process was killed"
        );
        other.kill().unwrap();
        other.wait().unwrap();
    }
}
