//! The run ledger: an SQLite database at `cache/ledger.db`.
//!
//! Tables: `runs` (one row per `cairn run`), `results` (one row per stage
//! execution, with its full key and output records as JSON), `heads`,
//! `stage_runs`, `items`, `item_attempts`, `redraws`, inline `objects` and `stat_cache`; see
//! [`schema`] for their history. A connection speaks for one pipeline (see
//! [`pipelines`]): every read and write of runs, results, heads and items
//! is that pipeline's. Each result is written in one transaction (with the
//! others that end meanwhile, see [`writer`]), only after its outputs are
//! in the object store; SQLite's journal makes a `kill -9` leave either
//! the whole transaction or none of it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;

use super::StoreError;
use super::output_record::OutputRecord;
use crate::fingerprint::{Digest, StageKey, StatEntry};

mod damage;
mod items;
mod pipelines;
mod proofs;
mod redraws;
mod results;
mod runs;
mod schema;
mod stat_cache;
mod timeline;
mod writer;

use damage::parse_outputs;
pub use damage::{SET_ASIDE_REASON, UnreadableResult};
pub use items::{ClassCount, OrphanedJobs, import_origin};
use pipelines::Claim;
pub use pipelines::PipelineId;
pub use proofs::KeptBeside;
pub use redraws::{Draws, Redraw};
pub use schema::LEDGER_SCHEMA_VERSION;
use schema::{OLDEST_MIGRATED, SCHEMA};
pub use timeline::StageRun;
pub use writer::{LedgerWriter, Record, Recorded, ResultRow};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ResultStatus {
    Ok,
    Failed,
}

impl ResultStatus {
    fn as_str(self) -> &'static str {
        match self {
            ResultStatus::Ok => "ok",
            ResultStatus::Failed => "failed",
        }
    }
}

/// One execution of a stage.
#[derive(Debug, Clone, Serialize)]
pub struct ResultRecord {
    pub id: i64,
    pub run_id: i64,
    pub stage: String,
    pub fingerprint: Digest,
    pub status: ResultStatus,
    pub outputs: Vec<OutputRecord>,
    pub command: String,
    pub started_ms: i64,
    pub finished_ms: i64,
    pub exit_code: Option<i32>,
    pub log_path: Option<String>,
    pub error: Option<String>,
    /// `remote:URL` if a remote cache supplied it; `None` if it ran here.
    pub origin: Option<String>,
}

/// A result about to be recorded.
#[derive(Debug, Clone)]
pub struct NewResult<'a> {
    pub run_id: i64,
    pub stage: &'a str,
    pub key: &'a StageKey,
    pub status: ResultStatus,
    pub outputs: &'a [OutputRecord],
    pub command: &'a str,
    pub started_ms: i64,
    pub finished_ms: i64,
    pub exit_code: Option<i32>,
    pub log_path: Option<&'a str>,
    pub error: Option<&'a str>,
    /// The attempt of the command that made it (a plain stage's last),
    /// recorded in the same transaction.
    pub attempt: Option<&'a ItemAttempt>,
    /// `remote:URL` if a remote cache supplied it.
    pub origin: Option<&'a str>,
}

/// The outcomes of a stage's items under one stage code, as its plan
/// reads them (see [`Ledger::item_outcomes`]): 56 bytes an item, so that a
/// million items' outcomes are held beside their plan in 56 MB (held as
/// strings, each took 200 bytes and two allocations more).
#[derive(Debug, Default)]
pub struct ItemOutcomes {
    rows: Vec<OutcomeRow>,
    /// Every class the rows name, once each.
    classes: Vec<String>,
    /// The result and outputs of each row that has either.
    extras: Vec<(Option<String>, Option<String>)>,
}

#[derive(Debug)]
struct OutcomeRow {
    fingerprint: Digest,
    key: u64,
    attempts: u32,
    /// Its place in `classes`.
    class: u32,
    /// 1 + its place in `extras`; 0 if it has neither.
    extra: u32,
}

/// The newest outcome of an item under one fingerprint.
#[derive(Debug, Clone, Copy)]
pub struct ItemOutcome<'o> {
    /// The item's fingerprint.
    pub fingerprint: Digest,
    /// The item's key, as [`key_hash`] hashes it.
    pub key: u64,
    pub class: &'o str,
    pub attempts: u32,
    /// Its JSON result (`item_result`), as recorded.
    pub result: Option<&'o str>,
    /// What it wrote (`item_outputs`): a JSON array of output records,
    /// as recorded.
    pub outputs: Option<&'o str>,
}

impl ItemOutcomes {
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Each outcome, in the order read.
    pub fn iter(&self) -> impl Iterator<Item = ItemOutcome<'_>> {
        self.rows.iter().map(|row| {
            let (result, outputs) = match row.extra.checked_sub(1) {
                Some(n) => {
                    let (result, outputs) = &self.extras[n as usize];
                    (result.as_deref(), outputs.as_deref())
                }
                None => (None, None),
            };
            ItemOutcome {
                fingerprint: row.fingerprint,
                key: row.key,
                class: &self.classes[row.class as usize],
                attempts: row.attempts,
                result,
                outputs,
            }
        })
    }

    fn push(
        &mut self,
        fingerprint: Digest,
        key: &str,
        class: &str,
        attempts: u32,
        extra: (Option<String>, Option<String>),
    ) {
        let class = match self.classes.iter().position(|known| known == class) {
            Some(n) => n,
            None => {
                self.classes.push(class.to_owned());
                self.classes.len() - 1
            }
        };
        let extra = match extra {
            (None, None) => 0,
            extra => {
                self.extras.push(extra);
                self.extras.len()
            }
        };
        self.rows.push(OutcomeRow {
            fingerprint,
            key: key_hash(key),
            attempts,
            class: class as u32,
            extra: extra as u32,
        });
    }
}

/// An item's key as [`ItemOutcomes`] holds it: a 64-bit hash, checked
/// beside the item's fingerprint (which covers the item, key and all).
pub fn key_hash(key: &str) -> u64 {
    use std::hash::BuildHasher;
    foldhash::fast::FixedState::default().hash_one(key)
}

/// One attempt of one item of a per-item stage.
#[derive(Debug, Clone, Serialize)]
pub struct ItemAttempt {
    pub run_id: i64,
    pub stage: String,
    pub key: String,
    pub fingerprint: Digest,
    /// 1 for the first attempt under this fingerprint in this run.
    pub attempt: u32,
    pub started_ms: i64,
    pub finished_ms: i64,
    pub exit_code: Option<i32>,
    /// `ok`, `infra`, `error` or a verdict name.
    pub class: String,
    /// The `classify` rule that matched, as written.
    pub rule: Option<String>,
    pub log_path: Option<String>,
    /// The JSON result the command wrote (`item_result`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    /// The fingerprint of the stage's code (its template) that ran it;
    /// unknown for attempts recorded before ledger schema 4.
    pub code: Option<Digest>,
    /// What it wrote (`item_outputs`), stored.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outputs: Option<Vec<OutputRecord>>,
    /// The job on its engine (`pid:4242`, `slurm:1234`), once submitted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handle: Option<String>,
    /// `remote:URL` if a remote cache supplied the outcome (no job ran).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
}

impl ItemAttempt {
    /// The record of attempt `attempt` (of run `run_id`) of item `key`,
    /// started at `started_ms`, before anything is known of how it ends.
    pub fn started(
        run_id: i64,
        stage: &str,
        key: &str,
        fingerprint: Digest,
        attempt: u32,
        started_ms: i64,
    ) -> Self {
        ItemAttempt {
            run_id,
            stage: stage.to_owned(),
            key: key.to_owned(),
            fingerprint,
            attempt,
            started_ms,
            finished_ms: started_ms,
            exit_code: None,
            class: RUNNING.to_owned(),
            rule: None,
            log_path: None,
            result: None,
            code: None,
            outputs: None,
            handle: None,
            origin: None,
        }
    }
}

/// The class of an attempt whose job has started and not yet ended.
pub const RUNNING: &str = "running";

/// The key a plain stage's attempts are recorded under: its command as one
/// implicit item (no item's key is empty).
pub const COMMAND_ITEM: &str = "";

/// An item's newest outcome under one fingerprint.
#[derive(Debug, Clone, Serialize)]
pub struct ItemRecord {
    pub key: String,
    pub fingerprint: String,
    /// The stage code's fingerprint behind it, if recorded.
    pub code: Option<String>,
    pub class: String,
    pub attempts: u32,
    pub run_id: i64,
    pub finished_ms: i64,
    /// Where it came from when cairn did not make it here: `remote:URL`
    /// (a remote cache), `import:sha256:HEX` (`cairn import`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunRecord {
    pub id: i64,
    pub started_ms: i64,
    pub finished_ms: Option<i64>,
    pub status: String,
    pub command: String,
    pub profile: Option<String>,
    pub executed: i64,
    pub fresh: i64,
    pub restored: i64,
    pub failed: i64,
    /// BLAKE3 of the manifest's text (unknown before ledger schema 10).
    pub manifest_digest: Option<String>,
    /// The cairn that ran it (unknown before ledger schema 10).
    pub cairn_version: Option<String>,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct RunCounts {
    pub executed: usize,
    pub fresh: usize,
    pub restored: usize,
    pub failed: usize,
}

pub struct Ledger {
    conn: Connection,
    path: PathBuf,
    /// The pipeline whose history this connection reads and writes.
    pipeline: PipelineId,
}

/// Sets up every connection: it waits for another writer rather than
/// failing; commits are durable at checkpoints (the WAL keeps them
/// atomic); and a cached statement keeps its plan when new values are
/// bound. Without the last, SQLite plans some queries again at every
/// execution (the orphaned jobs, once asked of every stage a run started,
/// took five times as long).
fn configure(conn: &Connection) -> rusqlite::Result<()> {
    conn.busy_timeout(std::time::Duration::from_secs(30))?;
    conn.execute_batch("PRAGMA synchronous=NORMAL;")?;
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )?;
    Ok(())
}

/// The columns a [`ResultRecord`] is read from. The key (large: one
/// component per input) is left out and read on demand by [`Ledger::key`].
const RESULT_COLUMNS: &str = "id, run_id, stage, fingerprint, status, NULL, outputs_json, command, started_ms, finished_ms, exit_code, log_path, error, origin";

impl Ledger {
    /// A new ledger in `dir/cache`, for pipeline `p`.
    #[cfg(test)]
    pub(crate) fn new_for_tests(dir: &Path) -> Self {
        let pipeline = PipelineId {
            name: "p".to_owned(),
            manifest: "cairn.toml".to_owned(),
        };
        Self::open(&dir.join("cache"), &pipeline).unwrap()
    }

    /// Opens (creating if needed) the ledger in `cache` for `pipeline`,
    /// recording which manifest the pipeline's name belongs to.
    pub fn open(cache: &Path, pipeline: &PipelineId) -> Result<Self, StoreError> {
        std::fs::create_dir_all(cache).map_err(|e| StoreError::io(cache, e))?;
        let path = super::layout::ledger(cache);
        // The caller holds the workspace lock: no other cairn writes the log.
        super::ledger_health::check_wal(&path)?;
        let conn = Connection::open(&path).map_err(|e| StoreError::db(&path, e))?;
        let ledger = Self::setup(conn, path, cache, pipeline)?;
        pipelines::register(&ledger.conn, pipeline).map_err(|e| ledger.db(e))?;
        Ok(ledger)
    }

    /// A second connection to this ledger, for writes made off the
    /// scheduler's thread (a run's item attempts, on tokio's blocking pool).
    /// The ledger is open already: nothing is created or migrated.
    pub fn another_connection(&self) -> Result<Self, StoreError> {
        let conn = Connection::open(&self.path).map_err(|e| self.db(e))?;
        configure(&conn).map_err(|e| self.db(e))?;
        Ok(Self {
            conn,
            path: self.path.clone(),
            pipeline: self.pipeline.clone(),
        })
    }

    /// Opens an existing ledger for reading `pipeline`'s history; `None`
    /// if there is none yet.
    pub fn open_existing(cache: &Path, pipeline: &PipelineId) -> Result<Option<Self>, StoreError> {
        let path = super::layout::ledger(cache);
        if !path.exists() {
            return Ok(None);
        }
        // While another process holds the workspace, its log is being
        // written and is its business; otherwise the lock keeps one from
        // starting meanwhile.
        let quiet = super::WorkspaceLock::try_acquire(cache);
        if quiet.is_some() || super::WorkspaceLock::held_here(cache) {
            super::ledger_health::check_wal(&path)?;
        }
        drop(quiet);
        let conn = Connection::open(&path).map_err(|e| StoreError::db(&path, e))?;
        Self::setup(conn, path, cache, pipeline).map(Some)
    }

    fn setup(
        conn: Connection,
        path: PathBuf,
        cache: &Path,
        pipeline: &PipelineId,
    ) -> Result<Self, StoreError> {
        // Closing the last connection would otherwise checkpoint the WAL on
        // every command, even a read-only `status`; SQLite checkpoints on
        // its own as the WAL grows.
        conn.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
            true,
        )
        .map_err(|e| StoreError::db(&path, e))?;
        // Both in one statement, so one snapshot: read apart, another
        // process creating the ledger in between would look like damage
        // (no version yet, then its tables).
        let (version, tables): (i64, i64) = conn
            .query_row(
                "SELECT (SELECT user_version FROM pragma_user_version),
                        (SELECT count(*) FROM sqlite_master WHERE type = 'table')",
                [],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .map_err(|e| StoreError::db(&path, e))?;
        let migrate = (OLDEST_MIGRATED..LEDGER_SCHEMA_VERSION).contains(&version);
        if version == 0 && tables > 0 {
            // cairn creates its tables and sets the version in one
            // transaction: tables without it are what is left when part of
            // the ledger is lost.
            return Err(StoreError::LedgerDamaged {
                path,
                detail: "it has cairn's tables but no schema version".to_owned(),
            });
        }
        if version != LEDGER_SCHEMA_VERSION && !(version == 0 && tables == 0) && !migrate {
            return Err(StoreError::LedgerVersion {
                path,
                found: version,
                expected: LEDGER_SCHEMA_VERSION,
            });
        }
        configure(&conn)
            .and_then(|()| conn.execute_batch("PRAGMA journal_mode=WAL;"))
            .and_then(|()| {
                if version == LEDGER_SCHEMA_VERSION {
                    Ok(())
                } else if migrate {
                    schema::migrate(&conn, version, &pipeline.name, &pipeline.manifest)
                } else {
                    conn.execute_batch(&format!(
                        "BEGIN; {SCHEMA} {} PRAGMA user_version = {LEDGER_SCHEMA_VERSION}; COMMIT;",
                        schema::voiding_triggers()
                    ))
                }
            })
            .map_err(|e| StoreError::db(&path, e))?;
        let root = cache.parent().unwrap_or(cache);
        match pipelines::claim(&conn, root, pipeline).map_err(|e| StoreError::db(&path, e))? {
            Claim::Free | Claim::Ours | Claim::Orphaned => {}
            Claim::Taken { manifest } => {
                return Err(StoreError::PipelineNameTaken {
                    name: pipeline.name.clone(),
                    holder: manifest,
                    manifest: pipeline.manifest.clone(),
                    root: root.to_owned(),
                });
            }
        }
        Ok(Self {
            conn,
            path,
            pipeline: pipeline.clone(),
        })
    }

    /// The pipeline this connection speaks for.
    pub fn pipeline(&self) -> &PipelineId {
        &self.pipeline
    }

    /// Every pipeline that has recorded history in this ledger.
    pub fn pipelines(&self) -> Result<Vec<PipelineId>, StoreError> {
        pipelines::all(&self.conn).map_err(|e| self.db(e))
    }

    /// The same ledger file, speaking for another pipeline (read-only use:
    /// `gc` reading what every pipeline's results need).
    pub fn for_pipeline(&self, pipeline: &PipelineId) -> Result<Self, StoreError> {
        let conn = Connection::open(&self.path).map_err(|e| self.db(e))?;
        configure(&conn).map_err(|e| self.db(e))?;
        Ok(Self {
            conn,
            path: self.path.clone(),
            pipeline: pipeline.clone(),
        })
    }

    fn db(&self, e: rusqlite::Error) -> StoreError {
        StoreError::db(&self.path, e)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
