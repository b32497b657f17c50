//! What an executor is given (a [`Job`]) and what it reports: how the job
//! ended ([`Outcome`], an engine's failure as [`InfraKind`]) or why it
//! could not be run ([`ExecError`]).

use std::path::PathBuf;
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
