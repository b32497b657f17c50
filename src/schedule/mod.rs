//! Scheduling: deciding what is fresh, running what is not, and reporting.
//!
//! `context` evaluates freshness (fingerprint + ledger lookup), `status`
//! evaluates a whole selection without running, `dispatch` runs it, and
//! `events` is what reporters consume.

mod context;
mod decision;
mod dispatch;
mod events;
mod executors;
mod import;
mod inputs_read;
mod item_fields;
mod item_lineage;
mod item_outputs;
mod items;
mod limits;
pub mod proof;
mod samples;
mod services;
mod shared_cache;
mod status;
mod task;
mod timeline;
mod transfer;

pub use context::{Context, History};
pub use decision::DirtyReason;
pub use dispatch::{RunOptions, RunSummary, run};
pub use events::{Done, Event, Reporter};
pub use import::{Imported, import};
pub use item_fields::check_item_lists;
pub use item_lineage::ItemTracer;
pub use items::{ItemCounts, load_items};
pub use samples::summary as sampled_summary;
pub use shared_cache::host_name;
pub use status::{StageStatus, State, evaluate};
pub use task::{MANIFEST_VAR, Only, PROFILE_VAR};
pub use timeline::StageState;
pub use transfer::{Pulled, Pushed, pull, push, remote_summary};

use std::path::PathBuf;

/// An error followed by its causes, on one line: for messages that outlive
/// the error (a failed stage's record, a status line), where the cause (the
/// file that is a FIFO, the disk that is full) is the useful part.
pub use crate::causes::with_causes;

use crate::exec::ExecError;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    #[error("failed to read input `{}` of stage `{stage}`", path.display())]
    Input {
        stage: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to prepare `{}`", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Exec(#[from] ExecError),
    #[error("{message}")]
    Items { stage: String, message: String },
    /// The image a stage runs in cannot be pinned to a digest.
    #[error("stage `{stage}`: {message}")]
    Image { stage: String, message: String },
    /// An item list read before the run starts holds a bad key or lacks a
    /// field the stage writes: bad input, nothing ran.
    #[error("failed to plan the items of stage `{stage}`: {message}")]
    BadItems { stage: String, message: String },
    /// An input fetched by URL cannot be had, or is not what its pin says:
    /// nothing of the stage ran.
    #[error("{message}")]
    Fetch { stage: String, message: String },
    /// A file `cairn import` was given that cannot be imported.
    #[error("cannot import `{}`: {message}", file.display())]
    Import { file: PathBuf, message: String },
    #[error("the ledger is not open for writing")]
    NoLedger,
    #[error("a stage task failed: {0}")]
    Task(String),
    /// What cairn kept for itself is not what it stands for (found under
    /// `CAIRN_CHECK_FRESH_PROOF`).
    #[error("internal error: {0}; please report this as a cairn bug")]
    Internal(String),
    /// A service the stage uses could not be brought up or failed its
    /// check: nothing of the stage ran.
    #[error("{0}")]
    Service(String),
}
