//! The `runs` table: one row per `cairn run`, its token and how it ended.

use super::*;

impl Ledger {
    /// Records a new run of the manifest whose text has `manifest_digest`
    /// by this cairn; `token` marks the environment of its commands.
    pub fn begin_run(
        &self,
        command: &str,
        profile: Option<&str>,
        token: &str,
        manifest_digest: &str,
    ) -> Result<i64, StoreError> {
        self.conn
            .execute(
                "INSERT INTO runs (started_ms, status, command, profile, token, pipeline, manifest_digest, cairn_version)
                 VALUES (?1, 'running', ?2, ?3, ?4, ?5, ?6, ?7)",
                params![now_ms(), command, profile, token, self.pipeline.name, manifest_digest, env!("CARGO_PKG_VERSION")],
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

    /// The newest `limit` runs, newest first.
    pub fn runs(&self, limit: usize) -> Result<Vec<RunRecord>, StoreError> {
        self.runs_where(
            "pipeline = ?2 ORDER BY id DESC LIMIT ?1",
            params![limit as i64, self.pipeline.name],
        )
    }

    /// Run `id`, if this pipeline has it.
    pub fn run(&self, id: i64) -> Result<Option<RunRecord>, StoreError> {
        let mut runs =
            self.runs_where("pipeline = ?2 AND id = ?1", params![id, self.pipeline.name])?;
        Ok(runs.pop())
    }

    fn runs_where(
        &self,
        condition: &str,
        values: impl rusqlite::Params,
    ) -> Result<Vec<RunRecord>, StoreError> {
        let mut stmt = self
            .conn
            .prepare(&format!(
                "SELECT id, started_ms, finished_ms, status, command, profile, executed, fresh, restored, failed, manifest_digest, cairn_version
                 FROM runs WHERE {condition}"
            ))
            .map_err(|e| self.db(e))?;
        let rows = stmt
            .query_map(values, |row| {
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
                    manifest_digest: row.get(10)?,
                    cairn_version: row.get(11)?,
                })
            })
            .map_err(|e| self.db(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.db(e))
    }

    /// Whether a run is left `running` (by a process that was killed, as
    /// the caller holds the workspace lock).
    pub fn has_open_runs(&self) -> Result<bool, StoreError> {
        self.conn
            .query_row(
                "SELECT EXISTS (SELECT 1 FROM runs WHERE status = 'running')",
                [],
                |row| row.get(0),
            )
            .map_err(|e| self.db(e))
    }

    /// Marks runs left `running` by a process that no longer holds the
    /// workspace lock (it was killed) as `killed`; returns their tokens.
    pub fn close_abandoned_runs(&self) -> Result<Vec<String>, StoreError> {
        // (Asked first: closing walks every item attempt of the ledger, and
        // most runs find nothing to close.)
        if !self.has_open_runs()? {
            return Ok(Vec::new());
        }
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
}
