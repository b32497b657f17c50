//! CLI errors and the exit codes they map to.

use crate::manifest::LoadError;
use crate::schedule::ScheduleError;
use crate::store::StoreError;

/// Documented exit codes.
pub mod exit {
    pub const OK: u8 = 0;
    pub const STAGE_FAILED: u8 = 1;
    pub const BAD_INPUT: u8 = 2;
    /// `--locked`: the result would differ from the committed lock file.
    pub const LOCK_DIFFERS: u8 = 3;
    /// `cairn builtin`: what a built-in depends on failed (a registry kept
    /// failing): infrastructure (sysexits' `EX_TEMPFAIL`).
    pub const INFRA: u8 = 75;
    pub const INTERRUPTED: u8 = 130;
}

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Manifest(#[from] LoadError),
    #[error("{message}")]
    Usage {
        message: String,
        help: Option<String>,
    },
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Release(#[from] crate::release::ReleaseError),
    #[error("failed to write output")]
    Output(#[from] std::io::Error),
    /// Already reported; carries the exit code.
    #[error("exit {0}")]
    Exit(u8),
}

impl CliError {
    pub fn usage(message: impl Into<String>) -> Self {
        Self::Usage {
            message: message.into(),
            help: None,
        }
    }

    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Manifest(_) | CliError::Usage { .. } => exit::BAD_INPUT,
            CliError::Store(
                StoreError::Locked { .. }
                | StoreError::PipelineNameTaken { .. }
                | StoreError::LockFile { .. },
            ) => exit::BAD_INPUT,
            CliError::Schedule(ScheduleError::BadItems { .. } | ScheduleError::Import { .. }) => {
                exit::BAD_INPUT
            }
            CliError::Exit(code) => *code,
            CliError::Schedule(_)
            | CliError::Store(_)
            | CliError::Release(_)
            | CliError::Output(_) => exit::STAGE_FAILED,
        }
    }
}
