//! The `stage_runs` table: every stage a run selected, how it ended, why,
//! and when — what a timeline of the run is drawn from.

use super::*;

/// One selected stage of one run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StageRun {
    pub stage: String,
    /// `ran`, `fresh`, `restored`, `remote`, `failed`, `partial`,
    /// `blocked`, `stopped` or `interrupted`.
    pub state: String,
    /// Why it ran, or how it was restored.
    pub reason: Option<String>,
    /// What ended it: the failure, the items it left, what blocked it.
    pub message: Option<String>,
    /// Every selected upstream stage had finished.
    pub ready_ms: Option<i64>,
    /// Its command had a job slot (for a fresh stage: it was decided).
    pub started_ms: Option<i64>,
    /// Its outputs were hashed: downstream stages could start.
    pub hashed_ms: Option<i64>,
    /// Its result was recorded (or its failure).
    pub finished_ms: Option<i64>,
    /// The `[executors]` entry its commands ran on, else `local`.
    pub executor: String,
    /// The machine cairn ran on.
    pub host: String,
}

impl Ledger {
    /// Records the stages of run `run_id`, in one transaction.
    pub fn record_stage_runs(&self, run_id: i64, stages: &[StageRun]) -> Result<(), StoreError> {
        let tx = self.conn.unchecked_transaction().map_err(|e| self.db(e))?;
        {
            let mut insert = tx
                .prepare_cached(
                    "INSERT OR REPLACE INTO stage_runs (run_id, stage, state, reason, message, ready_ms, started_ms, hashed_ms, finished_ms, executor, host)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
                )
                .map_err(|e| self.db(e))?;
            for s in stages {
                insert
                    .execute(params![
                        run_id,
                        s.stage,
                        s.state,
                        s.reason,
                        s.message,
                        s.ready_ms,
                        s.started_ms,
                        s.hashed_ms,
                        s.finished_ms,
                        s.executor,
                        s.host
                    ])
                    .map_err(|e| self.db(e))?;
            }
        }
        tx.commit().map_err(|e| self.db(e))
    }

    /// The stages run `run_id` selected, in the order they started (or
    /// were decided); those that never did (blocked, stopped) last.
    pub fn stage_runs(&self, run_id: i64) -> Result<Vec<StageRun>, StoreError> {
        let mut statement = self
            .conn
            .prepare(
                "SELECT stage, state, reason, message, ready_ms, started_ms, hashed_ms, finished_ms, executor, host
                 FROM stage_runs WHERE run_id = ?1
                 ORDER BY started_ms IS NULL, COALESCE(started_ms, ready_ms, finished_ms), stage",
            )
            .map_err(|e| self.db(e))?;
        let rows = statement
            .query_map([run_id], |row| {
                Ok(StageRun {
                    stage: row.get(0)?,
                    state: row.get(1)?,
                    reason: row.get(2)?,
                    message: row.get(3)?,
                    ready_ms: row.get(4)?,
                    started_ms: row.get(5)?,
                    hashed_ms: row.get(6)?,
                    finished_ms: row.get(7)?,
                    executor: row.get(8)?,
                    host: row.get(9)?,
                })
            })
            .map_err(|e| self.db(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.db(e))
    }
}
