//! Executors run one command and report how it ended. They know nothing of
//! graphs, fingerprints or caching.

mod local;

pub use local::LocalExecutor;

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use crate::manifest::Command;

/// One command to run.
#[derive(Debug, Clone)]
pub struct Job {
    pub command: Command,
    pub cwd: PathBuf,
    /// The complete environment of the process.
    pub env: Vec<(String, String)>,
    pub timeout: Option<Duration>,
    /// stdout and stderr are appended here.
    pub log: PathBuf,
    /// Told the process id (= process group id) as soon as it exists.
    pub on_spawn: Option<SpawnHook>,
}

/// A callback for a spawned process's id.
#[derive(Clone)]
pub struct SpawnHook(pub std::sync::Arc<dyn Fn(u32) + Send + Sync>);

impl std::fmt::Debug for SpawnHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SpawnHook")
    }
}

/// When a process started, in clock ticks since boot (`/proc/PID/stat`
/// field 22): with the pid, it names one process across pid reuse.
pub fn process_start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = stat.rsplit_once(')')?.1;
    after_name.split_whitespace().nth(19)?.parse().ok()
}

/// Kills a process group left behind by a cairn process that was itself
/// killed (`kill -9`), if it is still ours: a live leader must have the
/// recorded start time, so a reused pid is never signalled.
pub fn kill_orphaned_group(pgid: u32, start_ticks: Option<u64>) -> bool {
    let leader_alive_and_ours = match process_start_ticks(pgid) {
        Some(ticks) => start_ticks == Some(ticks),
        // The leader is gone; while any member lives, the kernel keeps the
        // group's id from being reused, so signalling it reaches only them.
        None => true,
    };
    if !leader_alive_and_ours || pgid <= 1 {
        return false;
    }
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe { libc::kill(-(pgid as i32), libc::SIGKILL) == 0 }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Success,
    Exit(i32),
    Signal(i32),
    TimedOut(Duration),
}

impl Outcome {
    pub fn exit_code(self) -> Option<i32> {
        match self {
            Outcome::Success => Some(0),
            Outcome::Exit(code) => Some(code),
            Outcome::Signal(_) | Outcome::TimedOut(_) => None,
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
    #[error("failed to open log file `{}`", path.display())]
    Log {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to wait for a child process")]
    Wait(#[source] std::io::Error),
}

/// Where commands run.
pub trait Executor: Send + Sync {
    fn run(&self, job: &Job) -> impl Future<Output = Result<Outcome, ExecError>> + Send;
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
