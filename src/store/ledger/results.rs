//! The `results` and `heads` tables (one row per stage execution, the
//! newest of each stage) and the inline `objects` small outputs live in.

use super::*;

impl Ledger {
    /// Records a result and, in the same transaction, the small objects
    /// its outputs keep inline.
    pub fn record(
        &self,
        result: &NewResult<'_>,
        inline: &[(Digest, Vec<u8>)],
    ) -> Result<i64, StoreError> {
        let tx = self.conn.unchecked_transaction().map_err(|e| self.db(e))?;
        let id = self.insert_result(&tx, result, inline)?;
        tx.commit().map_err(|e| self.db(e))?;
        Ok(id)
    }

    /// Inserts a result, its inline objects and its attempt, and moves its
    /// stage's head, within `tx`.
    pub(super) fn insert_result(
        &self,
        tx: &rusqlite::Transaction<'_>,
        result: &NewResult<'_>,
        inline: &[(Digest, Vec<u8>)],
    ) -> Result<i64, StoreError> {
        let key_json = serde_json::to_string(result.key).expect("keys serialise");
        let outputs_json = serde_json::to_string(result.outputs).expect("outputs serialise");
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
                "INSERT INTO results (run_id, stage, fingerprint, status, key_json, outputs_json, command, started_ms, finished_ms, exit_code, log_path, error, pipeline, origin)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
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
                result.origin,
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
        if let Some(attempt) = result.attempt {
            self.insert_attempts(tx, std::slice::from_ref(attempt))?;
        }
        Ok(id)
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

    /// The newest successful result of every stage.
    pub fn latest_ok_all(&self) -> Result<HashMap<String, ResultRecord>, StoreError> {
        let sql = format!(
            "SELECT {RESULT_COLUMNS} FROM results WHERE id IN (SELECT ok_id FROM heads WHERE pipeline = ?1 AND ok_id IS NOT NULL)"
        );
        let records = self.query(&sql, [&self.pipeline.name])?;
        Ok(records.into_iter().map(|r| (r.stage.clone(), r)).collect())
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

    pub(super) fn query(
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
                    origin: row.get(13)?,
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
