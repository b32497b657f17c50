//! The `items` and `item_attempts` tables: each item's newest outcome per
//! fingerprint, and every attempt, recorded when its job starts.

use super::*;

/// Jobs abandoned by a run and never adopted since (see `orphaned_jobs`).
const ORPHANED_JOBS: &str = "SELECT a.stage, a.key, a.fingerprint, a.handle
  FROM item_attempts a INDEXED BY item_attempts_stopped
  WHERE a.pipeline = ?1 AND a.class = 'abandoned' AND a.class IN ('cancelled', 'abandoned')
    AND a.handle IS NOT NULL
    AND NOT EXISTS (SELECT 1 FROM item_attempts b
                     WHERE b.pipeline = a.pipeline AND b.stage = a.stage AND b.key = a.key
                       AND b.id > a.id AND b.handle = a.handle)
  ORDER BY a.id";

/// How many attempts a stage's command made under one fingerprint, in
/// every run (results from before attempts were recorded count as one).
const COMMAND_ATTEMPTS: &str = "SELECT (SELECT COUNT(*) FROM item_attempts
          WHERE pipeline = ?1 AND stage = ?2 AND key = ?3 AND fingerprint = ?4
            AND class NOT IN ('running', 'abandoned'))
      + (SELECT COUNT(*) FROM results r
          WHERE r.pipeline = ?1 AND r.stage = ?2 AND r.fingerprint = ?4
            AND NOT EXISTS (SELECT 1 FROM item_attempts a
                             WHERE a.pipeline = r.pipeline AND a.stage = r.stage
                               AND a.key = ?3 AND a.run_id = r.run_id
                               AND a.fingerprint = r.fingerprint))";

/// A run's attempts still running when it closes. (By run: the index by
/// fingerprint covers this too, but only through every attempt of the
/// pipeline, and SQLite would pick it.)
const CLOSE_RUNNING: &str = "UPDATE item_attempts INDEXED BY item_attempts_by_run SET class = ?1
  WHERE pipeline = ?2 AND run_id = ?3 AND class = 'running'";

/// The origin of an outcome `cairn import` took from a file whose SHA-256
/// is `sha256` (hex).
pub fn import_origin(sha256: &str) -> String {
    format!("import:sha256:{sha256}")
}

/// Orphaned jobs by stage (see [`Ledger::orphaned_jobs`]).
pub type OrphanedJobs = HashMap<String, Vec<(String, Digest, String)>>;

impl Ledger {
    /// The outcome of every item of `stage` under stage code `code` (or
    /// recorded before outcomes named their code), with the item's key and
    /// fingerprint: neither old templates nor other stages cost a thing
    /// here. Outputs are left as recorded, for the caller to parse for the
    /// outcomes it keeps.
    pub fn item_outcomes(&self, stage: &str, code: &Digest) -> Result<ItemOutcomes, StoreError> {
        let mut statement = self
            .conn
            .prepare_cached(
                "SELECT key, fingerprint, class, attempts, result, outputs FROM items
                  WHERE pipeline = ?2 AND stage = ?1 AND (code = ?3 OR code IS NULL)",
            )
            .map_err(|e| self.db(e))?;
        let mut rows = statement
            .query(params![stage, self.pipeline.name, code.to_string()])
            .map_err(|e| self.db(e))?;
        let mut outcomes = ItemOutcomes::default();
        while let Some(row) = rows.next().map_err(|e| self.db(e))? {
            let text = |i: usize| row.get_ref(i).and_then(|v| Ok(v.as_str()?));
            let (Ok(key), Ok(Ok(fingerprint))) = (text(0), text(1).map(str::parse::<Digest>))
            else {
                continue;
            };
            outcomes.push(
                fingerprint,
                key,
                text(2).map_err(|e| self.db(e))?,
                row.get(3).map_err(|e| self.db(e))?,
                (
                    row.get(4).map_err(|e| self.db(e))?,
                    row.get(5).map_err(|e| self.db(e))?,
                ),
            );
        }
        Ok(outcomes)
    }

    /// The items of `stage` whose outcome under a fingerprint was imported
    /// (`cairn import`), each with that fingerprint, found through their
    /// own index: a stage with none costs nothing.
    pub fn imported_items(&self, stage: &str) -> Result<Vec<(String, Digest)>, StoreError> {
        let mut statement = self
            .conn
            .prepare_cached(
                "SELECT key, fingerprint FROM items INDEXED BY items_imported
                  WHERE pipeline = ?2 AND stage = ?1 AND origin >= 'import:' AND origin < 'import;'",
            )
            .map_err(|e| self.db(e))?;
        let rows = statement
            .query_map(params![stage, self.pipeline.name], |row| {
                Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?))
            })
            .map_err(|e| self.db(e))?;
        let mut imported = Vec::new();
        for row in rows {
            let (key, fingerprint) = row.map_err(|e| self.db(e))?;
            if let Ok(fingerprint) = fingerprint.parse() {
                imported.push((key, fingerprint));
            }
        }
        Ok(imported)
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
        self.insert_attempts(&tx, attempts)?;
        tx.commit().map_err(|e| self.db(e))
    }

    /// Records `attempts` (each replacing its record of having started)
    /// and the outcomes of those that ended, within `tx`.
    pub(super) fn insert_attempts<'a>(
        &self,
        tx: &rusqlite::Transaction<'_>,
        attempts: impl IntoIterator<Item = &'a ItemAttempt>,
    ) -> Result<(), StoreError> {
        {
            let mut insert = tx
                .prepare_cached(
                    "INSERT INTO item_attempts (run_id, stage, key, fingerprint, attempt, started_ms, finished_ms, exit_code, class, rule, log_path, code, pipeline, handle)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
                )
                .map_err(|e| self.db(e))?;
            let mut upsert = tx
                .prepare_cached(
                    "INSERT INTO items (pipeline, stage, key, fingerprint, class, attempts, run_id, finished_ms, result, code, outputs, origin) VALUES (?10, ?1, ?2, ?3, ?4, 1, ?5, ?6, ?7, ?8, ?9, ?11)
                     ON CONFLICT(pipeline, stage, key, fingerprint) DO UPDATE SET class = ?4, attempts = attempts + 1, run_id = ?5, finished_ms = ?6, result = ?7, code = ?8, outputs = ?9, origin = ?11",
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
                        attempt.origin,
                    ])
                    .map_err(|e| self.db(e))?;
            }
        }
        Ok(())
    }

    /// Every attempt of one item, oldest first.
    pub fn item_attempts(&self, stage: &str, key: &str) -> Result<Vec<ItemAttempt>, StoreError> {
        self.attempts_where(
            "pipeline = ?3 AND stage = ?1 AND key = ?2",
            params![stage, key, self.pipeline.name],
        )
    }

    /// Every item attempt of run `run_id` (plain stages' commands under
    /// [`COMMAND_ITEM`]), in the order they were recorded.
    pub fn run_attempts(&self, run_id: i64) -> Result<Vec<ItemAttempt>, StoreError> {
        self.attempts_where(
            "pipeline = ?2 AND run_id = ?1",
            params![run_id, self.pipeline.name],
        )
    }

    fn attempts_where(
        &self,
        condition: &str,
        values: impl rusqlite::Params,
    ) -> Result<Vec<ItemAttempt>, StoreError> {
        let mut statement = self
            .conn
            .prepare(&format!(
                "SELECT run_id, stage, key, fingerprint, attempt, started_ms, finished_ms, exit_code, class, rule, log_path, code, handle
                 FROM item_attempts WHERE {condition} ORDER BY id"
            ))
            .map_err(|e| self.db(e))?;
        let rows = statement
            .query_map(values, |row| {
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
                    // An attempt no job made keeps where it came from as
                    // its handle (`remote:URL`, `import:sha256:HEX`).
                    origin: (row.get::<_, Option<String>>(12)?)
                        .filter(|h| h.starts_with("remote:") || h.starts_with("import:")),
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
                "SELECT key, fingerprint, code, class, attempts, run_id, finished_ms, origin FROM items
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
                    origin: row.get(7)?,
                })
            })
            .map_err(|e| self.db(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.db(e))
    }

    /// Jobs that a dead (or detached) run left on their engine, that no
    /// later attempt adopted, by stage: `(item key, item fingerprint, job
    /// handle)`, oldest first. Few or none: one query a run finds them all.
    pub fn orphaned_jobs(&self) -> Result<OrphanedJobs, StoreError> {
        let mut statement = self
            .conn
            .prepare_cached(ORPHANED_JOBS)
            .map_err(|e| self.db(e))?;
        let mut rows = statement
            .query(params![self.pipeline.name])
            .map_err(|e| self.db(e))?;
        let mut orphans = OrphanedJobs::new();
        while let Some(row) = rows.next().map_err(|e| self.db(e))? {
            let job = (|| Ok((row.get(1)?, fingerprint_at(row, 2)?, row.get(3)?)))()
                .map_err(|e| self.db(e))?;
            let stage: String = row.get(0).map_err(|e| self.db(e))?;
            orphans.entry(stage).or_default().push(job);
        }
        Ok(orphans)
    }

    /// How many attempts of plain stage `stage`'s command under
    /// `fingerprint` are over (ended or cancelled): the next one is
    /// numbered one more. A result with no attempt on record in its run
    /// (recorded before attempts were, or a failure before the job
    /// started) counts as one; an attempt left `running` or `abandoned`
    /// does not, so the next run adopts its job by name.
    pub fn command_attempts(&self, stage: &str, fingerprint: &Digest) -> Result<u32, StoreError> {
        self.conn
            .prepare_cached(COMMAND_ATTEMPTS)
            .and_then(|mut statement| {
                statement.query_row(
                    params![
                        self.pipeline.name,
                        stage,
                        COMMAND_ITEM,
                        fingerprint.to_string()
                    ],
                    |row| row.get(0),
                )
            })
            .map_err(|e| self.db(e))
    }

    /// How many attempts of each item of `stage` were cancelled, by (key,
    /// fingerprint): they ended without an outcome, and the next attempt
    /// must have a name of its own.
    pub fn cancelled_attempts(
        &self,
        stage: &str,
    ) -> Result<HashMap<(String, Digest), u32>, StoreError> {
        let mut statement = self
            .conn
            .prepare_cached(
                // Left to itself SQLite walks every attempt of the stage
                // by `item_attempts_by_item`, for the order of the grouping.
                "SELECT key, fingerprint, COUNT(*) FROM item_attempts INDEXED BY item_attempts_stopped
                  WHERE pipeline = ?1 AND stage = ?2 AND class = 'cancelled'
                    AND class IN ('cancelled', 'abandoned')
                  GROUP BY key, fingerprint",
            )
            .map_err(|e| self.db(e))?;
        let rows = statement
            .query_map(params![self.pipeline.name, stage], |row| {
                Ok(((row.get(0)?, fingerprint_at(row, 1)?), row.get(2)?))
            })
            .map_err(|e| self.db(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.db(e))
    }

    /// Records that the orphaned jobs `handles` of `stage` were cancelled.
    pub fn orphans_cancelled(&self, stage: &str, handles: &[String]) -> Result<(), StoreError> {
        let tx = self.conn.unchecked_transaction().map_err(|e| self.db(e))?;
        for handle in handles {
            tx.execute(
                "UPDATE item_attempts INDEXED BY item_attempts_stopped SET class = 'cancelled'
                  WHERE pipeline = ?1 AND stage = ?2 AND handle = ?3 AND class = 'abandoned'
                    AND class IN ('cancelled', 'abandoned')",
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
            .execute(CLOSE_RUNNING, params![class, self.pipeline.name, run_id])
            .map(drop)
            .map_err(|e| self.db(e))
    }
}

/// The fingerprint in column `i` (one that does not parse matches nothing).
fn fingerprint_at(row: &rusqlite::Row<'_>, i: usize) -> rusqlite::Result<Digest> {
    let text: String = row.get(i)?;
    Ok(text.parse().unwrap_or(Digest::of(b"")))
}

/// How many items of a stage ended in one class: in one run (`run_id`),
/// or now (`run_id` none: the newest outcome of each item), under one
/// version of the stage's code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClassCount {
    pub stage: String,
    pub run_id: Option<i64>,
    /// The fingerprint of the stage's code (unknown before schema 4).
    pub code: Option<String>,
    pub class: String,
    pub count: u64,
}

impl Ledger {
    /// For every run from `since_run` on, the classes its items' last
    /// attempts in it ended in, by stage and stage code; oldest run first.
    pub fn attempt_classes(&self, since_run: i64) -> Result<Vec<ClassCount>, StoreError> {
        self.class_counts(
            "SELECT stage, run_id, code, class, COUNT(*) FROM item_attempts a
             WHERE pipeline = ?1 AND run_id >= ?2 AND key != '' AND class != 'running'
               AND id = (SELECT MAX(id) FROM item_attempts b
                         WHERE b.pipeline = a.pipeline AND b.stage = a.stage
                           AND b.key = a.key AND b.run_id = a.run_id)
             GROUP BY stage, run_id, code, class
             ORDER BY stage, run_id, code, class",
            Some(since_run),
        )
    }

    /// The newest outcome of each item of each per-item stage under each
    /// fingerprint, counted by stage, stage code and class.
    pub fn outcome_classes(&self) -> Result<Vec<ClassCount>, StoreError> {
        self.class_counts(
            "SELECT stage, ?2, code, class, COUNT(*) FROM items
             WHERE pipeline = ?1 AND key != ''
             GROUP BY stage, code, class
             ORDER BY stage, code, class",
            None,
        )
    }

    /// Counts by `query`, given the pipeline as `?1` and `second` as `?2`.
    fn class_counts(
        &self,
        query: &str,
        second: Option<i64>,
    ) -> Result<Vec<ClassCount>, StoreError> {
        let mut statement = self.conn.prepare(query).map_err(|e| self.db(e))?;
        let rows = statement
            .query_map(params![self.pipeline.name, second], |row| {
                Ok(ClassCount {
                    stage: row.get(0)?,
                    run_id: row.get(1)?,
                    code: row.get(2)?,
                    class: row.get(3)?,
                    count: row.get::<_, i64>(4)? as u64,
                })
            })
            .map_err(|e| self.db(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.db(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Outcomes come back as recorded, each item's key as its hash, each
    /// class held once however many items end in it, and a result only
    /// where one was recorded.
    #[test]
    fn item_outcomes_read_back_compactly_as_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::new_for_tests(dir.path());
        let code = Digest::of(b"code");
        let ended = |key: &str, class: &str, result: Option<&str>| ItemAttempt {
            class: class.to_owned(),
            finished_ms: 20,
            exit_code: Some(0),
            result: result.map(str::to_owned),
            code: Some(code),
            ..ItemAttempt::started(1, "check", key, Digest::of(key.as_bytes()), 1, 10)
        };
        let attempts = [
            ended("a", "ok", None),
            ended("b", "ok", Some("{\"score\":1}")),
            ended("c", "rejected", None),
            ended("d", "ok", None),
        ];
        let tx = ledger.conn.unchecked_transaction().unwrap();
        ledger.insert_attempts(&tx, &attempts).unwrap();
        tx.commit().unwrap();

        let outcomes = ledger.item_outcomes("check", &code).unwrap();
        assert_eq!(outcomes.classes, ["ok", "rejected"]);
        assert_eq!(outcomes.extras.len(), 1);
        let mut read: Vec<_> = outcomes
            .iter()
            .map(|o| (o.fingerprint, o.key, o.class, o.attempts, o.result))
            .collect();
        read.sort_by_key(|(fingerprint, ..)| *fingerprint);
        let mut recorded: Vec<_> = attempts
            .iter()
            .map(|a| {
                let result = a.result.as_deref();
                (a.fingerprint, key_hash(&a.key), a.class.as_str(), 1, result)
            })
            .collect();
        recorded.sort_by_key(|(fingerprint, ..)| *fingerprint);
        assert_eq!(read, recorded);
        assert!(ledger.item_outcomes("other", &code).unwrap().is_empty());
    }

    /// A run finds the jobs dead runs left in one query, through the
    /// index of stopped attempts alone: every stage's, none adopted since,
    /// and none of an attempt that ended as most do.
    #[test]
    fn orphaned_jobs_are_found_among_the_stopped_attempts_alone() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::new_for_tests(dir.path());
        let fingerprint = Digest::of(b"f");
        let attempt = |stage: &str, key: &str, class: &str, handle: &str| ItemAttempt {
            class: class.to_owned(),
            handle: Some(handle.to_owned()),
            ..ItemAttempt::started(1, stage, key, fingerprint, 1, 0)
        };
        ledger
            .record_item_attempts(&[
                attempt("a", "x", "abandoned", "job-1"),
                attempt("a", "y", "abandoned", "job-2"),
                attempt("b", "", "abandoned", "job-3"),
                attempt("b", "z", "ok", "job-4"),
                attempt("c", "w", "cancelled", "job-5"),
                // job-2 adopted by a later attempt.
                attempt("a", "y", "ok", "job-2"),
            ])
            .unwrap();
        let mut orphans: Vec<_> = ledger
            .orphaned_jobs()
            .unwrap()
            .into_iter()
            .flat_map(|(stage, jobs)| jobs.into_iter().map(move |(_, _, h)| (stage.clone(), h)))
            .collect();
        orphans.sort();
        assert_eq!(
            orphans,
            [
                ("a".to_owned(), "job-1".to_owned()),
                ("b".to_owned(), "job-3".to_owned())
            ]
        );
        let finding = plan(&ledger, ORPHANED_JOBS);
        assert!(
            finding.contains("USING INDEX item_attempts_stopped (pipeline=?)"),
            "{finding}"
        );
    }

    /// What SQLite plans for `sql` (its parameters NULL), a step a line.
    fn plan(ledger: &Ledger, sql: &str) -> String {
        let mut statement = ledger
            .conn
            .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
            .unwrap();
        let nulls = vec![rusqlite::types::Null; statement.parameter_count()];
        let steps = statement
            .query_map(rusqlite::params_from_iter(nulls), |row| {
                row.get::<_, String>(3)
            })
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        steps.join("\n")
    }

    /// What a run asks as each command starts, and does as it closes,
    /// goes through an index straight to the stage's (or the run's) rows,
    /// not through every attempt of the pipeline's history: with several
    /// indexes on `item_attempts`, SQLite (without statistics) can pick a
    /// covering one that matches the pipeline alone.
    #[test]
    fn each_stages_attempts_are_found_by_an_index_to_their_rows() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::new_for_tests(dir.path());
        let closing = plan(&ledger, CLOSE_RUNNING);
        assert!(
            closing.contains("item_attempts_by_run (pipeline=? AND run_id=?)"),
            "{closing}"
        );
        let counting = plan(&ledger, COMMAND_ATTEMPTS);
        for step in [
            "COVERING INDEX item_attempts_by_fingerprint (pipeline=? AND stage=? AND key=? AND fingerprint=?)",
            "COVERING INDEX item_attempts_by_fingerprint (pipeline=? AND stage=? AND key=? AND fingerprint=? AND run_id=?)",
        ] {
            assert!(counting.contains(step), "{counting}");
        }
    }
}
