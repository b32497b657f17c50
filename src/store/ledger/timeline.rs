//! The `stage_runs` table: every stage a run selected, how it ended, why,
//! and when — what a timeline of the run is drawn from. A run's fresh
//! stages are kept in one row of `fresh_stage_runs` instead.

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

impl StageRun {
    /// Stage `stage`, on `executor` at `host`, in `state`, nothing timed yet.
    pub fn new(stage: &str, state: &str, executor: &str, host: &str) -> Self {
        Self {
            stage: stage.to_owned(),
            state: state.to_owned(),
            reason: None,
            message: None,
            ready_ms: None,
            started_ms: None,
            hashed_ms: None,
            finished_ms: None,
            executor: executor.to_owned(),
            host: host.to_owned(),
        }
    }

    /// Stage `stage` decided fresh at `at_ms`, nothing run.
    pub fn fresh(stage: &str, executor: &str, host: &str, at_ms: i64) -> Self {
        Self {
            ready_ms: Some(at_ms),
            started_ms: Some(at_ms),
            finished_ms: Some(at_ms),
            ..Self::new(stage, "fresh", executor, host)
        }
    }
}

impl Ledger {
    /// Records the stages of run `run_id`, in one transaction: the fresh
    /// ones in one row of `fresh_stage_runs`, the others a row each.
    pub fn record_stage_runs(&self, run_id: i64, stages: &[StageRun]) -> Result<(), StoreError> {
        let host = stages
            .iter()
            .find(|s| in_one_row(s, None))
            .map(|s| s.host.as_str());
        let (fresh, others): (Vec<&StageRun>, Vec<&StageRun>) =
            stages.iter().partition(|s| in_one_row(s, host));
        let tx = self.conn.unchecked_transaction().map_err(|e| self.db(e))?;
        if let Some(host) = host {
            let rows: Vec<FreshRow<&String>> = fresh
                .iter()
                .map(|s| {
                    FreshRow(
                        &s.stage,
                        &s.executor,
                        s.ready_ms,
                        s.started_ms,
                        s.finished_ms,
                    )
                })
                .collect();
            let json = serde_json::to_string(&rows).map_err(|e| StoreError::Corrupt {
                path: self.path.clone(),
                detail: format!("run {run_id}'s fresh stages: {e}"),
            })?;
            tx.prepare_cached(
                "INSERT OR REPLACE INTO fresh_stage_runs (run_id, host, stages) VALUES (?1, ?2, ?3)",
            )
            .and_then(|mut insert| insert.execute(params![run_id, host, json]))
            .map_err(|e| self.db(e))?;
        }
        {
            let mut insert = tx
                .prepare_cached(
                    "INSERT OR REPLACE INTO stage_runs (run_id, stage, state, reason, message, ready_ms, started_ms, hashed_ms, finished_ms, executor, host)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
                )
                .map_err(|e| self.db(e))?;
            for s in others {
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
                 FROM stage_runs WHERE run_id = ?1",
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
        let mut stages: Vec<StageRun> = rows.collect::<Result<_, _>>().map_err(|e| self.db(e))?;
        let fresh: Option<(String, String)> = self
            .conn
            .query_row(
                "SELECT host, stages FROM fresh_stage_runs WHERE run_id = ?1",
                [run_id],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .optional()
            .map_err(|e| self.db(e))?;
        if let Some((host, json)) = fresh {
            let rows: Vec<FreshRow<String>> =
                serde_json::from_str(&json).map_err(|e| StoreError::Corrupt {
                    path: self.path.clone(),
                    detail: format!("run {run_id}'s fresh stages cannot be read: {e}"),
                })?;
            stages.extend(rows.into_iter().map(
                |FreshRow(stage, executor, ready_ms, started_ms, finished_ms)| StageRun {
                    stage,
                    state: FRESH.to_owned(),
                    reason: None,
                    message: None,
                    ready_ms,
                    started_ms,
                    hashed_ms: None,
                    finished_ms,
                    executor,
                    host: host.clone(),
                },
            ));
        }
        stages.sort_by(|a, b| {
            let at = |s: &StageRun| {
                (
                    s.started_ms.is_none(),
                    s.started_ms.or(s.ready_ms).or(s.finished_ms),
                )
            };
            at(a).cmp(&at(b)).then_with(|| a.stage.cmp(&b.stage))
        });
        Ok(stages)
    }
}

/// A fresh stage as `fresh_stage_runs` holds it: `[stage, executor,
/// ready_ms, started_ms, finished_ms]`.
#[derive(Serialize, serde::Deserialize)]
struct FreshRow<S>(S, S, Option<i64>, Option<i64>, Option<i64>);

const FRESH: &str = "fresh";

/// Whether `stage` is recorded in its run's one row of fresh stages: fresh,
/// with no reason, message or hashing time, on `host` (any, if `None`).
fn in_one_row(stage: &StageRun, host: Option<&str>) -> bool {
    stage.state == FRESH
        && stage.reason.is_none()
        && stage.message.is_none()
        && stage.hashed_ms.is_none()
        && host.is_none_or(|host| stage.host == host)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stage(name: &str, state: &str, started_ms: Option<i64>) -> StageRun {
        StageRun {
            stage: name.to_owned(),
            state: state.to_owned(),
            reason: None,
            message: None,
            ready_ms: Some(1),
            started_ms,
            hashed_ms: None,
            finished_ms: started_ms,
            executor: "local".to_owned(),
            host: "here".to_owned(),
        }
    }

    /// A run's fresh stages go into one row and come back among the others
    /// as they were, in the order they started; a fresh stage with a reason
    /// (or on another host) keeps a row of its own.
    #[test]
    fn fresh_stages_are_one_row_and_read_back_in_order_among_the_others() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::new_for_tests(dir.path());
        let run = ledger.begin_run("run", None, "t", "m").unwrap();
        let mut restored = stage("d", "restored", Some(3));
        restored.reason = Some("outputs restored from the store".to_owned());
        let mut elsewhere = stage("e", "fresh", Some(5));
        elsewhere.host = "there".to_owned();
        let stages = vec![
            stage("b", "fresh", Some(2)),
            stage("a", "fresh", Some(2)),
            stage("c", "ran", Some(4)),
            restored,
            elsewhere,
            stage("f", "blocked", None),
        ];
        ledger.record_stage_runs(run, &stages).unwrap();
        let rows: i64 = ledger
            .conn
            .query_row("SELECT count(*) FROM stage_runs", [], |row| row.get(0))
            .unwrap();
        assert_eq!(rows, 4, "a, b in one row");
        let names: Vec<String> = ledger
            .stage_runs(run)
            .unwrap()
            .into_iter()
            .map(|s| s.stage)
            .collect();
        assert_eq!(names, ["a", "b", "d", "c", "e", "f"]);
        let mut back = ledger.stage_runs(run).unwrap();
        back.sort_by(|x, y| x.stage.cmp(&y.stage));
        let mut sent = stages;
        sent.sort_by(|x, y| x.stage.cmp(&y.stage));
        assert_eq!(back, sent);
    }
}
