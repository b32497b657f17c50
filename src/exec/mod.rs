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
