//! The run ledger: an SQLite database at `cache/ledger.db`.
//!
//! Tables: `runs` (one row per `cairn run`), `results` (one row per stage
//! execution, with its full key and output records as JSON), `heads`,
//! `items`, `item_attempts`, inline `objects` and `stat_cache`; see
//! [`schema`] for their history. A connection speaks for one pipeline (see
//! [`pipelines`]): every read and write of runs, results, heads and items
//! is that pipeline's. Each result is one transaction, written only after its
//! outputs are in the object store; SQLite's journal makes a `kill -9`
//! leave either the whole row or none of it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;

use super::StoreError;
use super::objects::OutputRecord;
use crate::fingerprint::{Digest, StageKey, StatEntry};

mod damage;
mod pipelines;
mod schema;

use damage::parse_outputs;
pub use damage::{SET_ASIDE_REASON, UnreadableResult};
use pipelines::Claim;
pub use pipelines::PipelineId;
pub use schema::LEDGER_SCHEMA_VERSION;
use schema::{OLDEST_MIGRATED, SCHEMA};

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
}

/// (item key, item fingerprint) → (class, attempts, JSON result).
/// (key, fingerprint) → (class, attempts, result, outputs).
pub type ItemOutcomes =
    HashMap<(String, Digest), (String, u32, Option<String>, Option<Vec<OutputRecord>>)>;

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
}

/// The class of an attempt whose job has started and not yet ended.
pub const RUNNING: &str = "running";

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

/// The columns a [`ResultRecord`] is read from. The key (large: one
/// component per input) is left out and read on demand by [`Ledger::key`].
const RESULT_COLUMNS: &str = "id, run_id, stage, fingerprint, status, NULL, outputs_json, command, started_ms, finished_ms, exit_code, log_path, error";

impl Ledger {
    /// Opens (creating if needed) the ledger in `cache` for `pipeline`,
    /// recording which manifest the pipeline's name belongs to.
    pub fn open(cache: &Path, pipeline: &PipelineId) -> Result<Self, StoreError> {
        std::fs::create_dir_all(cache).map_err(|e| StoreError::io(cache, e))?;
        let path = cache.join("ledger.db");
        // The caller holds the workspace lock: no other cairn writes the log.
        super::ledger_health::check_wal(&path)?;
        let conn = Connection::open(&path).map_err(|e| StoreError::db(&path, e))?;
        let ledger = Self::setup(conn, path, cache, pipeline)?;
        pipelines::register(&ledger.conn, pipeline).map_err(|e| ledger.db(e))?;
        Ok(ledger)
    }

    /// Opens an existing ledger for reading `pipeline`'s history; `None`
    /// if there is none yet.
    pub fn open_existing(cache: &Path, pipeline: &PipelineId) -> Result<Option<Self>, StoreError> {
        let path = cache.join("ledger.db");
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
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |row| row.get(0))
            .map_err(|e| StoreError::db(&path, e))?;
        let tables: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table'",
                [],
                |row| row.get(0),
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
        conn.busy_timeout(std::time::Duration::from_secs(30))
            .map_err(|e| StoreError::db(&path, e))?;
        conn.execute_batch("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;")
            .and_then(|()| {
                if version == LEDGER_SCHEMA_VERSION {
                    Ok(())
                } else if migrate {
                    schema::migrate(&conn, version, &pipeline.name, &pipeline.manifest)
                } else {
                    conn.execute_batch(&format!(
                        "BEGIN; {SCHEMA} PRAGMA user_version = {LEDGER_SCHEMA_VERSION}; COMMIT;"
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
        conn.busy_timeout(std::time::Duration::from_secs(30))
            .map_err(|e| self.db(e))?;
        Ok(Self {
            conn,
            path: self.path.clone(),
            pipeline: pipeline.clone(),
        })
    }

    fn db(&self, e: rusqlite::Error) -> StoreError {
        StoreError::db(&self.path, e)
    }

    /// Records a new run; `token` marks the environment of its commands.
    pub fn begin_run(
        &self,
        command: &str,
        profile: Option<&str>,
        token: &str,
    ) -> Result<i64, StoreError> {
        self.conn
            .execute(
                "INSERT INTO runs (started_ms, status, command, profile, token, pipeline) VALUES (?1, 'running', ?2, ?3, ?4, ?5)",
                params![now_ms(), command, profile, token, self.pipeline.name],
            )
            .map_err(|e| self.db(e))?;
        Ok(self.conn.last_insert_rowid())
    }

    pub fn finish_run(
        &self,
        run_id: i64,
        status: &str,
        counts: RunCounts,
    ) -> Result<(), StoreError> {
        self.conn
            .execute(
                "UPDATE runs SET finished_ms = ?2, status = ?3, executed = ?4, fresh = ?5, restored = ?6, failed = ?7 WHERE id = ?1",
                params![run_id, now_ms(), status, counts.executed as i64, counts.fresh as i64, counts.restored as i64, counts.failed as i64],
            )
            .map_err(|e| self.db(e))?;
        Ok(())
    }

    /// Records a result and, in the same transaction, the small objects
    /// its outputs keep inline.
    pub fn record(
        &self,
        result: &NewResult<'_>,
        inline: &[(Digest, Vec<u8>)],
    ) -> Result<i64, StoreError> {
        let key_json = serde_json::to_string(result.key).expect("keys serialise");
        let outputs_json = serde_json::to_string(result.outputs).expect("outputs serialise");
        let tx = self.conn.unchecked_transaction().map_err(|e| self.db(e))?;
        if !inline.is_empty() {
            let mut insert = tx
                .prepare_cached("INSERT OR REPLACE INTO objects (digest, bytes) VALUES (?1, ?2)")
                .map_err(|e| self.db(e))?;
            for (digest, bytes) in inline {
                insert
                    .execute(params![&digest.as_bytes()[..], bytes])
                    .map_err(|e| self.db(e))?;
            }
        }
        let mut statement = self
            .conn
            .prepare_cached(
                "INSERT INTO results (run_id, stage, fingerprint, status, key_json, outputs_json, command, started_ms, finished_ms, exit_code, log_path, error, pipeline)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
            )
            .map_err(|e| self.db(e))?;
        statement
            .execute(params![
                result.run_id,
                result.stage,
                result.key.fingerprint().to_string(),
                result.status.as_str(),
                key_json,
                outputs_json,
                result.command,
                result.started_ms,
                result.finished_ms,
                result.exit_code,
                result.log_path,
                result.error,
                self.pipeline.name,
            ])
            .map_err(|e| self.db(e))?;
        drop(statement);
        let id = self.conn.last_insert_rowid();
        let head = match result.status {
            ResultStatus::Ok => {
                "INSERT INTO heads (pipeline, stage, ok_id, attempt_id) VALUES (?3, ?1, ?2, ?2)
                 ON CONFLICT(pipeline, stage) DO UPDATE SET ok_id = ?2, attempt_id = ?2"
            }
            ResultStatus::Failed => {
                "INSERT INTO heads (pipeline, stage, ok_id, attempt_id) VALUES (?3, ?1, NULL, ?2)
                 ON CONFLICT(pipeline, stage) DO UPDATE SET attempt_id = ?2"
            }
        };
        tx.prepare_cached(head)
            .and_then(|mut s| s.execute(params![result.stage, id, self.pipeline.name]))
            .map_err(|e| self.db(e))?;
        tx.commit().map_err(|e| self.db(e))?;
        Ok(id)
    }

    /// The newest outcome of every item of `stage`: (key, fingerprint) →
    /// (class, attempts).
    pub fn item_outcomes(&self, stage: &str) -> Result<ItemOutcomes, StoreError> {
        let mut statement = self
            .conn
            .prepare_cached(
                "SELECT key, fingerprint, class, attempts, result, outputs FROM items WHERE pipeline = ?2 AND stage = ?1",
            )
            .map_err(|e| self.db(e))?;
        let rows = statement
            .query_map(params![stage, self.pipeline.name], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, String>(2)?,
                    row.get::<_, u32>(3)?,
                    row.get::<_, Option<String>>(4)?,
                    row.get::<_, Option<String>>(5)?,
                ))
            })
            .map_err(|e| self.db(e))?;
        let mut outcomes = HashMap::new();
        for row in rows {
            let (key, fingerprint, class, attempts, result, outputs) =
                row.map_err(|e| self.db(e))?;
            let outputs = outputs.and_then(|text| serde_json::from_str(&text).ok());
            if let Ok(fingerprint) = fingerprint.parse() {
                outcomes.insert((key, fingerprint), (class, attempts, result, outputs));
            }
        }
        Ok(outcomes)
    }

    /// Every output recorded with an outcome of an item of `stage` (under
    /// any fingerprint): what `gc` must keep for items to be restorable.
    pub fn item_outputs(&self, stage: &str) -> Result<Vec<OutputRecord>, StoreError> {
        let mut statement = self
            .conn
            .prepare("SELECT outputs FROM items WHERE pipeline = ?2 AND stage = ?1 AND outputs IS NOT NULL")
            .map_err(|e| self.db(e))?;
        let rows = statement
            .query_map(params![stage, self.pipeline.name], |row| {
                row.get::<_, String>(0)
            })
            .map_err(|e| self.db(e))?;
        let mut records = Vec::new();
        for row in rows {
            let text = row.map_err(|e| self.db(e))?;
            if let Ok(mut parsed) = serde_json::from_str::<Vec<OutputRecord>>(&text) {
                records.append(&mut parsed);
            }
        }
        Ok(records)
    }

    /// Every output recorded with an outcome of any item of any stage.
    pub fn all_item_outputs(&self) -> Result<Vec<OutputRecord>, StoreError> {
        let mut statement = self
            .conn
            .prepare("SELECT outputs FROM items WHERE pipeline = ?1 AND outputs IS NOT NULL")
            .map_err(|e| self.db(e))?;
        let rows = statement
            .query_map(params![self.pipeline.name], |row| row.get::<_, String>(0))
            .map_err(|e| self.db(e))?;
        let mut records = Vec::new();
        for row in rows {
            let text = row.map_err(|e| self.db(e))?;
            if let Ok(mut parsed) = serde_json::from_str::<Vec<OutputRecord>>(&text) {
                records.append(&mut parsed);
            }
        }
        Ok(records)
    }

    /// Records attempts of items and their outcomes, in one transaction.
    pub fn record_item_attempts(&self, attempts: &[ItemAttempt]) -> Result<(), StoreError> {
        let tx = self.conn.unchecked_transaction().map_err(|e| self.db(e))?;
        {
            let mut insert = tx
                .prepare_cached(
                    "INSERT INTO item_attempts (run_id, stage, key, fingerprint, attempt, started_ms, finished_ms, exit_code, class, rule, log_path, code, pipeline, handle)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
                )
                .map_err(|e| self.db(e))?;
            let mut upsert = tx
                .prepare_cached(
                    "INSERT INTO items (pipeline, stage, key, fingerprint, class, attempts, run_id, finished_ms, result, code, outputs) VALUES (?10, ?1, ?2, ?3, ?4, 1, ?5, ?6, ?7, ?8, ?9)
                     ON CONFLICT(pipeline, stage, key, fingerprint) DO UPDATE SET class = ?4, attempts = attempts + 1, run_id = ?5, finished_ms = ?6, result = ?7, code = ?8, outputs = ?9",
                )
                .map_err(|e| self.db(e))?;
            let mut started = tx
                .prepare_cached(
                    "DELETE FROM item_attempts WHERE pipeline = ?1 AND run_id = ?2 AND stage = ?3 AND key = ?4 AND fingerprint = ?5 AND attempt = ?6 AND class = 'running'",
                )
                .map_err(|e| self.db(e))?;
            for attempt in attempts {
                let fingerprint = attempt.fingerprint.to_string();
                let code = attempt.code.map(|c| c.to_string());
                // An attempt that ends replaces its record of having started.
                started
                    .execute(params![
                        self.pipeline.name,
                        attempt.run_id,
                        attempt.stage,
                        attempt.key,
                        fingerprint,
                        attempt.attempt,
                    ])
                    .map_err(|e| self.db(e))?;
                let outputs = attempt
                    .outputs
                    .as_ref()
                    .map(|o| serde_json::to_string(o).expect("records serialise"));
                insert
                    .execute(params![
                        attempt.run_id,
                        attempt.stage,
                        attempt.key,
                        fingerprint,
                        attempt.attempt,
                        attempt.started_ms,
                        attempt.finished_ms,
                        attempt.exit_code,
                        attempt.class,
                        attempt.rule,
                        attempt.log_path,
                        code,
                        self.pipeline.name,
                        attempt.handle,
                    ])
                    .map_err(|e| self.db(e))?;
                if attempt.class == RUNNING {
                    continue;
                }
                upsert
                    .execute(params![
                        attempt.stage,
                        attempt.key,
                        fingerprint,
                        attempt.class,
                        attempt.run_id,
                        attempt.finished_ms,
                        attempt.result,
                        code,
                        outputs,
                        self.pipeline.name,
                    ])
                    .map_err(|e| self.db(e))?;
            }
        }
        tx.commit().map_err(|e| self.db(e))
    }

    /// Every attempt of one item, oldest first.
    pub fn item_attempts(&self, stage: &str, key: &str) -> Result<Vec<ItemAttempt>, StoreError> {
        let mut statement = self
            .conn
            .prepare(
                "SELECT run_id, stage, key, fingerprint, attempt, started_ms, finished_ms, exit_code, class, rule, log_path, code, handle
                 FROM item_attempts WHERE pipeline = ?3 AND stage = ?1 AND key = ?2 ORDER BY id",
            )
            .map_err(|e| self.db(e))?;
        let rows = statement
            .query_map(params![stage, key, self.pipeline.name], |row| {
                let fingerprint: String = row.get(3)?;
                Ok(ItemAttempt {
                    run_id: row.get(0)?,
                    stage: row.get(1)?,
                    key: row.get(2)?,
                    fingerprint: fingerprint.parse().unwrap_or(Digest::of(b"")),
                    attempt: row.get(4)?,
                    started_ms: row.get(5)?,
                    finished_ms: row.get(6)?,
                    exit_code: row.get(7)?,
                    class: row.get(8)?,
                    rule: row.get(9)?,
                    log_path: row.get(10)?,
                    result: None,
                    code: row
                        .get::<_, Option<String>>(11)?
                        .and_then(|c| c.parse().ok()),
                    outputs: None,
                    handle: row.get(12)?,
                })
            })
            .map_err(|e| self.db(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.db(e))
    }

    /// The newest outcome of each item of `stage` under each fingerprint,
    /// optionally only those produced by stage code whose fingerprint
    /// starts with `code` (`blake3:` may be left out); by key.
    pub fn item_records(
        &self,
        stage: &str,
        code: Option<&str>,
    ) -> Result<Vec<ItemRecord>, StoreError> {
        let pattern = code.map(|c| {
            let c = c.trim();
            let c = if c.starts_with("blake3:") {
                c.to_owned()
            } else {
                format!("blake3:{c}")
            };
            format!("{}%", c.replace(['%', '_'], ""))
        });
        let mut statement = self
            .conn
            .prepare(
                "SELECT key, fingerprint, code, class, attempts, run_id, finished_ms FROM items
                 WHERE pipeline = ?3 AND stage = ?1 AND (?2 IS NULL OR code LIKE ?2) ORDER BY key, finished_ms",
            )
            .map_err(|e| self.db(e))?;
        let rows = statement
            .query_map(params![stage, pattern, self.pipeline.name], |row| {
                Ok(ItemRecord {
                    key: row.get(0)?,
                    fingerprint: row.get(1)?,
                    code: row.get(2)?,
                    class: row.get(3)?,
                    attempts: row.get(4)?,
                    run_id: row.get(5)?,
                    finished_ms: row.get(6)?,
                })
            })
            .map_err(|e| self.db(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.db(e))
    }

    /// The full key recorded with a result, for diffs.
    pub fn key(&self, result_id: i64) -> Result<StageKey, StoreError> {
        let json: String = self
            .conn
            .prepare_cached("SELECT key_json FROM results WHERE id = ?1")
            .and_then(|mut s| s.query_row(params![result_id], |row| row.get(0)))
            .map_err(|e| self.db(e))?;
        serde_json::from_str(&json).map_err(|e| StoreError::Corrupt {
            path: self.path.clone(),
            detail: format!("result {result_id} has an unreadable key: {e}"),
        })
    }

    /// The bytes of a small object kept in the ledger.
    pub fn inline_object(&self, digest: &Digest) -> Result<Option<Vec<u8>>, StoreError> {
        self.conn
            .prepare_cached("SELECT bytes FROM objects WHERE digest = ?1")
            .and_then(|mut s| {
                // Bytes of any column type: damage (even to the type) is
                // then caught by the digest, not mistaken for a ledger error.
                s.query_row(params![&digest.as_bytes()[..]], |row| {
                    Ok(row
                        .get_ref(0)?
                        .as_bytes_or_null()?
                        .unwrap_or_default()
                        .to_vec())
                })
                .optional()
            })
            .map_err(|e| self.db(e))
    }

    /// Deletes inline objects not in `live`; returns (count, bytes) removed
    /// (or that would be, with `dry_run`).
    pub fn drop_inline_objects(
        &self,
        live: &std::collections::HashSet<Digest>,
        dry_run: bool,
    ) -> Result<(usize, u64), StoreError> {
        let mut statement = self
            .conn
            .prepare("SELECT digest, length(bytes) FROM objects")
            .map_err(|e| self.db(e))?;
        let rows: Vec<(Vec<u8>, i64)> = statement
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
            .and_then(|rows| rows.collect())
            .map_err(|e| self.db(e))?;
        let dead: Vec<(Vec<u8>, i64)> = rows
            .into_iter()
            .filter(|(d, _)| {
                <[u8; 32]>::try_from(d.as_slice()).map_or(true, |b| {
                    !live.contains(&Digest::from_hash(blake3::Hash::from_bytes(b)))
                })
            })
            .collect();
        if !dry_run {
            let tx = self.conn.unchecked_transaction().map_err(|e| self.db(e))?;
            for (digest, _) in &dead {
                tx.execute("DELETE FROM objects WHERE digest = ?1", params![digest])
                    .map_err(|e| self.db(e))?;
            }
            tx.commit().map_err(|e| self.db(e))?;
        }
        Ok((dead.len(), dead.iter().map(|(_, n)| *n as u64).sum()))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The newest successful result of every stage.
    pub fn latest_ok_all(&self) -> Result<HashMap<String, ResultRecord>, StoreError> {
        let sql = format!(
            "SELECT {RESULT_COLUMNS} FROM results WHERE id IN (SELECT ok_id FROM heads WHERE pipeline = ?1 AND ok_id IS NOT NULL)"
        );
        let records = self.query(&sql, [&self.pipeline.name])?;
        Ok(records.into_iter().map(|r| (r.stage.clone(), r)).collect())
    }

    /// How many attempts of `stage` under `fingerprint` ended and were
    /// recorded (succeeded or failed).
    pub fn stage_attempts(&self, stage: &str, fingerprint: &Digest) -> Result<u32, StoreError> {
        self.conn
            .prepare_cached(
                "SELECT COUNT(*) FROM results WHERE pipeline = ?1 AND stage = ?2 AND fingerprint = ?3",
            )
            .and_then(|mut statement| {
                statement.query_row(
                    params![self.pipeline.name, stage, fingerprint.to_string()],
                    |row| row.get::<_, u32>(0),
                )
            })
            .map_err(|e| self.db(e))
    }

    /// Stages whose newest attempt failed, with that attempt.
    pub fn latest_failures(&self) -> Result<HashMap<String, ResultRecord>, StoreError> {
        let sql = format!(
            "SELECT {RESULT_COLUMNS} FROM results WHERE id IN (SELECT attempt_id FROM heads WHERE pipeline = ?1) AND status = 'failed'"
        );
        let records = self.query(&sql, [&self.pipeline.name])?;
        Ok(records.into_iter().map(|r| (r.stage.clone(), r)).collect())
    }

    /// The newest successful result of `stage` under `fingerprint`.
    pub fn find_ok(
        &self,
        stage: &str,
        fingerprint: &Digest,
    ) -> Result<Option<ResultRecord>, StoreError> {
        let sql = format!(
            "SELECT {RESULT_COLUMNS} FROM results WHERE pipeline = ?3 AND stage = ?1 AND fingerprint = ?2 AND status = 'ok' ORDER BY id DESC LIMIT 1"
        );
        Ok(self
            .query(
                &sql,
                params![stage, fingerprint.to_string(), self.pipeline.name],
            )?
            .into_iter()
            .next())
    }

    /// Results of `stage` (or all stages), newest first.
    pub fn results(
        &self,
        stage: Option<&str>,
        limit: usize,
    ) -> Result<Vec<ResultRecord>, StoreError> {
        match stage {
            Some(stage) => {
                let sql = format!(
                    "SELECT {RESULT_COLUMNS} FROM results WHERE pipeline = ?3 AND stage = ?1 ORDER BY id DESC LIMIT ?2"
                );
                self.query(&sql, params![stage, limit as i64, self.pipeline.name])
            }
            None => {
                let sql = format!(
                    "SELECT {RESULT_COLUMNS} FROM results WHERE pipeline = ?2 ORDER BY id DESC LIMIT ?1"
                );
                self.query(&sql, params![limit as i64, self.pipeline.name])
            }
        }
    }

    pub fn runs(&self, limit: usize) -> Result<Vec<RunRecord>, StoreError> {
        let mut stmt = self
            .conn
            .prepare("SELECT id, started_ms, finished_ms, status, command, profile, executed, fresh, restored, failed FROM runs WHERE pipeline = ?2 ORDER BY id DESC LIMIT ?1")
            .map_err(|e| self.db(e))?;
        let rows = stmt
            .query_map(params![limit as i64, self.pipeline.name], |row| {
                Ok(RunRecord {
                    id: row.get(0)?,
                    started_ms: row.get(1)?,
                    finished_ms: row.get(2)?,
                    status: row.get(3)?,
                    command: row.get(4)?,
                    profile: row.get(5)?,
                    executed: row.get(6)?,
                    fresh: row.get(7)?,
                    restored: row.get(8)?,
                    failed: row.get(9)?,
                })
            })
            .map_err(|e| self.db(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.db(e))
    }

    /// Jobs that a dead (or detached) run left on their engine for `stage`,
    /// that no later attempt adopted: `(item key, item fingerprint, job
    /// handle)`, oldest first.
    pub fn orphaned_jobs(&self, stage: &str) -> Result<Vec<(String, Digest, String)>, StoreError> {
        let mut statement = self
            .conn
            .prepare_cached(
                "SELECT a.key, a.fingerprint, a.handle FROM item_attempts a
                  WHERE a.pipeline = ?1 AND a.stage = ?2 AND a.class = 'abandoned' AND a.handle IS NOT NULL
                    AND NOT EXISTS (SELECT 1 FROM item_attempts b
                                     WHERE b.pipeline = a.pipeline AND b.stage = a.stage AND b.key = a.key
                                       AND b.id > a.id AND b.handle = a.handle)
                  ORDER BY a.id",
            )
            .map_err(|e| self.db(e))?;
        let rows = statement
            .query_map(params![self.pipeline.name, stage], |row| {
                let fingerprint: String = row.get(1)?;
                Ok((
                    row.get::<_, String>(0)?,
                    fingerprint.parse().unwrap_or(Digest::of(b"")),
                    row.get::<_, String>(2)?,
                ))
            })
            .map_err(|e| self.db(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.db(e))
    }

    /// Records that the orphaned jobs `handles` of `stage` were cancelled.
    pub fn orphans_cancelled(&self, stage: &str, handles: &[String]) -> Result<(), StoreError> {
        let tx = self.conn.unchecked_transaction().map_err(|e| self.db(e))?;
        for handle in handles {
            tx.execute(
                "UPDATE item_attempts SET class = 'cancelled'
                  WHERE pipeline = ?1 AND stage = ?2 AND handle = ?3 AND class = 'abandoned'",
                params![self.pipeline.name, stage, handle],
            )
            .map_err(|e| self.db(e))?;
        }
        tx.commit().map_err(|e| self.db(e))
    }

    /// The attempts of run `run_id` that never ended, when the run stops
    /// without them: `abandoned` if their jobs were left running
    /// (`--detach`; the next run adopts or cancels them), else `cancelled`.
    pub fn close_running_attempts(
        &self,
        run_id: i64,
        left_running: bool,
    ) -> Result<(), StoreError> {
        let class = if left_running {
            "abandoned"
        } else {
            "cancelled"
        };
        self.conn
            .execute(
                "UPDATE item_attempts SET class = ?1 WHERE pipeline = ?2 AND run_id = ?3 AND class = 'running'",
                params![class, self.pipeline.name, run_id],
            )
            .map(drop)
            .map_err(|e| self.db(e))
    }

    /// Marks runs left `running` by a process that no longer holds the
    /// workspace lock (it was killed) as `killed`; returns their tokens.
    pub fn close_abandoned_runs(&self) -> Result<Vec<String>, StoreError> {
        let mut statement = self
            .conn
            .prepare("SELECT token FROM runs WHERE status = 'running' AND token IS NOT NULL")
            .map_err(|e| self.db(e))?;
        let tokens = statement
            .query_map([], |row| row.get::<_, String>(0))
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(|e| self.db(e))?;
        // Their attempts that never ended: the jobs may still run on their
        // engine, and an attempt that adopts one is recorded anew.
        self.conn
            .execute_batch(
                "UPDATE item_attempts SET class = 'abandoned'
                   WHERE class = 'running' AND run_id IN (SELECT id FROM runs WHERE status = 'running');
                 UPDATE runs SET status = 'killed' WHERE status = 'running';",
            )
            .map_err(|e| self.db(e))?;
        Ok(tokens)
    }

    fn query(
        &self,
        sql: &str,
        args: impl rusqlite::Params,
    ) -> Result<Vec<ResultRecord>, StoreError> {
        let mut stmt = self.conn.prepare_cached(sql).map_err(|e| self.db(e))?;
        let rows = stmt
            .query_map(args, |row| {
                let fingerprint: String = row.get(3)?;
                let status: String = row.get(4)?;
                let outputs_json: String = row.get(6)?;
                let record = ResultRecord {
                    id: row.get(0)?,
                    run_id: row.get(1)?,
                    stage: row.get(2)?,
                    fingerprint: fingerprint.parse().unwrap_or(Digest::of(b"")),
                    status: if status == "ok" {
                        ResultStatus::Ok
                    } else {
                        ResultStatus::Failed
                    },
                    outputs: Vec::new(),
                    command: row.get(7)?,
                    started_ms: row.get(8)?,
                    finished_ms: row.get(9)?,
                    exit_code: row.get(10)?,
                    log_path: row.get(11)?,
                    error: row.get(12)?,
                };
                Ok((record, outputs_json))
            })
            .map_err(|e| self.db(e))?;
        let mut records = Vec::new();
        for row in rows {
            let (mut record, outputs_json) = row.map_err(|e| self.db(e))?;
            // Read as "no outputs", a damaged record would be a fresh hit
            // that restores nothing.
            record.outputs = parse_outputs(&outputs_json)
                .map_err(|detail| self.unreadable_result(&record, &detail))?;
            records.push(record);
        }
        Ok(records)
    }

    pub fn load_stat_cache(&self) -> Result<Vec<(PathBuf, StatEntry)>, StoreError> {
        let mut stmt = self
            .conn
            .prepare("SELECT path, dev, ino, size, mtime_ns, ctime_ns, digest FROM stat_cache")
            .map_err(|e| self.db(e))?;
        let rows = stmt
            .query_map([], |row| {
                let path: String = row.get(0)?;
                let digest: String = row.get(6)?;
                Ok((
                    path,
                    row.get::<_, i64>(1)?,
                    row.get::<_, i64>(2)?,
                    row.get::<_, i64>(3)?,
                    row.get(4)?,
                    row.get(5)?,
                    digest,
                ))
            })
            .map_err(|e| self.db(e))?;
        let mut entries = Vec::new();
        for row in rows {
            let (path, dev, ino, size, mtime_ns, ctime_ns, digest) = row.map_err(|e| self.db(e))?;
            if let Ok(digest) = digest.parse() {
                entries.push((
                    PathBuf::from(path),
                    StatEntry {
                        dev: dev as u64,
                        ino: ino as u64,
                        size: size as u64,
                        mtime_ns,
                        ctime_ns,
                        digest,
                    },
                ));
            }
        }
        Ok(entries)
    }

    pub fn save_stat_cache(&mut self, updates: &[(PathBuf, StatEntry)]) -> Result<(), StoreError> {
        if updates.is_empty() {
            return Ok(());
        }
        let path = self.path.clone();
        let tx = self
            .conn
            .transaction()
            .map_err(|e| StoreError::db(&path, e))?;
        {
            let mut stmt = tx
                .prepare("INSERT OR REPLACE INTO stat_cache (path, dev, ino, size, mtime_ns, ctime_ns, digest) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)")
                .map_err(|e| StoreError::db(&path, e))?;
            for (file, entry) in updates {
                stmt.execute(params![
                    file.to_string_lossy(),
                    entry.dev as i64,
                    entry.ino as i64,
                    entry.size as i64,
                    entry.mtime_ns,
                    entry.ctime_ns,
                    entry.digest.to_string()
                ])
                .map_err(|e| StoreError::db(&path, e))?;
            }
        }
        tx.commit().map_err(|e| StoreError::db(&path, e))
    }

    /// Loads results with their key JSON parsed lazily; `ok` of a stage
    /// under its current fingerprint, preferring the newest.
    pub fn lookup<'a>(
        &self,
        latest: &'a HashMap<String, ResultRecord>,
        stage: &str,
        fingerprint: &Digest,
    ) -> Result<Option<std::borrow::Cow<'a, ResultRecord>>, StoreError> {
        match latest.get(stage) {
            // No successful result at all: nothing to look up.
            None => return Ok(None),
            Some(record) if record.fingerprint == *fingerprint => {
                return Ok(Some(std::borrow::Cow::Borrowed(record)));
            }
            Some(_) => {}
        }
        Ok(self
            .find_ok(stage, fingerprint)?
            .map(std::borrow::Cow::Owned))
    }
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
