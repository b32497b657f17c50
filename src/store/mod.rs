//! Everything cairn keeps: the object store, the ledger, the lock file and
//! the workspace lock. Every path under `cache/` is named in [`layout`],
//! with the one room that writes it.

mod attestation;
mod audit;
mod clearing;
mod current;
pub mod fetched;
mod gc;
pub mod layout;
mod ledger;
mod ledger_health;
pub mod link;
mod live;
mod lockfile;
mod objects;
mod output_record;
mod provenance;
pub mod reserve;
pub mod shared_cache;
mod tree_listing;
mod workspace_lock;

pub use attestation::{
    AttestationError, PREDICATE_TYPE, STATEMENT_TYPE, items_by_content, statement,
};
pub use audit::{AuditReport, Mismatch, MismatchKind, Repair, RepairAction, audit};
pub use clearing::remove_path;
pub use clearing::{Cleared, cleared};
pub use current::{Current, current_ok, current_results, read_lock};
pub use gc::{Collected, collect_garbage};
pub use ledger::{
    COMMAND_ITEM, ClassCount, Draws, ItemAttempt, ItemOutcomes, ItemRecord, KeptBeside,
    LEDGER_SCHEMA_VERSION, Ledger, LedgerWriter, NewResult, OrphanedJobs, PipelineId, RUNNING,
    Record, Recorded, Redraw, ResultRecord, ResultRow, ResultStatus, RunCounts, RunRecord,
    SET_ASIDE_REASON, StageRun, UnreadableResult, import_origin, key_hash, now_ms,
};
pub use live::live_outputs;
pub use lockfile::{
    LOCK_FORMAT_VERSION, LockFile, LockProblem, LockedOutput, LockedStage, RenderedStages,
    recorded_checksum,
};
pub use objects::{ObjectStore, Published, Staged};
pub use output_record::{INLINE_MAX, OutputKind, OutputRecord};
pub use provenance::{
    InputRecord, ItemInput, ItemStep, Lineage, LineageError, StageRecord, lineage,
};
pub use workspace_lock::{WhenLocked, WorkspaceLock};

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("failed to access `{}`", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to use the ledger `{}`", path.display())]
    Db {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("store entry `{}` is corrupt: {detail}", path.display())]
    Corrupt { path: PathBuf, detail: String },
    #[error(
        "the ledger `{}` has schema version {found}, this cairn reads version {expected}; move `cache/` aside (outputs will be rebuilt) or use the cairn that wrote it",
        path.display()
    )]
    LedgerVersion {
        path: PathBuf,
        found: i64,
        expected: i64,
    },
    #[error(
        "the pipeline name `{name}` of `{manifest}` is taken by `{holder}` in the project root `{}`; give one of them another `[pipeline] name` so that their histories stay apart",
        root.display()
    )]
    PipelineNameTaken {
        name: String,
        /// The manifest that holds the name.
        holder: String,
        /// The manifest refused.
        manifest: String,
        root: PathBuf,
    },
    #[error("the lock file `{}` cannot be trusted: {problem}; `cairn run` rewrites it from the ledger", path.display())]
    LockFile {
        path: PathBuf,
        problem: lockfile::LockProblem,
    },
    #[error(
        "the ledger `{}` is damaged ({detail}); move it aside with the `-wal` and `-shm` files beside it (`mv cache/ledger.db cache/ledger.db.damaged`, and so on) and run again: cairn starts a new ledger, re-runs the stages it has no record of and reuses every stored object (see \"A damaged ledger\" in docs/cli.md)",
        path.display()
    )]
    LedgerDamaged { path: PathBuf, detail: String },
    #[error(
        "the ledger's write-ahead log `{}` is damaged ({detail}); move it aside with the `-shm` file beside it and run again: cairn goes on from the ledger as of its last checkpoint and re-runs the stages whose results only the log held (see \"A damaged ledger\" in docs/cli.md)",
        path.display()
    )]
    LedgerWalDamaged { path: PathBuf, detail: String },
    #[error("another cairn process{} holds the workspace lock `{}`", holder.map(|p| format!(" (pid {p})")).unwrap_or_default(), path.display())]
    Locked { path: PathBuf, holder: Option<u32> },
}

impl StoreError {
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        Self::Io {
            path: path.to_owned(),
            source,
        }
    }

    /// An error from the ledger at `path`; one saying its file is damaged
    /// becomes [`StoreError::LedgerDamaged`], with what to do.
    pub fn db(path: &Path, source: rusqlite::Error) -> Self {
        use rusqlite::ErrorCode::{DatabaseCorrupt, NotADatabase};
        if let rusqlite::Error::SqliteFailure(failure, _) = &source
            && matches!(failure.code, DatabaseCorrupt | NotADatabase)
        {
            return Self::LedgerDamaged {
                path: path.to_owned(),
                detail: source.to_string(),
            };
        }
        Self::Db {
            path: path.to_owned(),
            source,
        }
    }
}
