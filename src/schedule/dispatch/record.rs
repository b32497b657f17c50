//! Recording what ran: a result into the ledger (after its objects are
//! stored), a failure, and the lock file the run leaves.

use super::*;

/// A successful result about to be recorded.
pub(super) struct Made {
    pub(super) outputs: Vec<OutputRecord>,
    pub(super) inline: Vec<(Digest, Vec<u8>)>,
    pub(super) started_ms: i64,
    pub(super) finished_ms: i64,
    pub(super) exit_code: Option<i32>,
    pub(super) log_path: Option<String>,
    /// The attempt of the command that made it (a plain stage's last).
    pub(super) attempt: Option<ItemAttempt>,
    /// `remote:URL` when a remote cache supplied it.
    pub(super) origin: Option<String>,
}

impl Dispatcher<'_, '_> {
    /// Hands a successful result this run made, with its inline objects,
    /// to the ledger writer; [`Self::result_recorded`] takes it from there.
    pub(super) fn commit(
        &mut self,
        i: usize,
        key: &StageKey,
        published: Published,
        started_ms: i64,
        log: &std::path::Path,
        attempt: Option<ItemAttempt>,
    ) -> Result<(), ScheduleError> {
        let Published {
            records,
            inline,
            seen,
        } = published;
        for (path, entry) in seen {
            self.ctx.stat.learn(path, entry);
        }
        let made = Made {
            outputs: records,
            inline,
            started_ms,
            finished_ms: now_ms(),
            // A rule may have accepted another exit status.
            exit_code: attempt.as_ref().map_or(Some(0), |a| a.exit_code),
            // Quiet stages leave no log file; a path only if there is one
            // (a command's last attempt looked once its checks were done).
            log_path: match &attempt {
                Some(attempt) => attempt.log_path.clone(),
                None => log.exists().then(|| log.to_string_lossy().into_owned()),
            },
            attempt,
            origin: None,
        };
        let row = self.result_row(i, key, made);
        self.send_record(Record::Result {
            stage: i,
            row: Box::new(row),
        })
    }

    /// The ledger writer recorded stage `i`'s result as `id`: it is the one
    /// this run uses; then its upload is queued.
    pub(super) fn result_recorded(&mut self, i: usize, id: i64, row: ResultRow) {
        let ResultRow {
            mut record,
            key,
            attempt: _,
            inline,
        } = row;
        record.id = id;
        let record = self.use_result(i, record);
        self.upload_result(i, &key, &record, inline);
    }

    /// Records a successful result of stage `i` here and now, and makes it
    /// the one this run uses (downstream keys, the lock file).
    pub(super) fn record_ok(
        &mut self,
        i: usize,
        key: &StageKey,
        made: Made,
    ) -> Result<ResultRecord, ScheduleError> {
        let ledger = self.ctx.ledger.as_ref().ok_or(ScheduleError::NoLedger)?;
        let row = self.result_row(i, key, made);
        let id = ledger.record_row(&row)?;
        let ResultRow { mut record, .. } = row;
        record.id = id;
        Ok(self.use_result(i, record))
    }

    /// Stage `i`'s result as it is recorded (its id the ledger's answer).
    fn result_row(&self, i: usize, key: &StageKey, made: Made) -> ResultRow {
        let stage = &self.ctx.manifest.stages[i];
        let record = ResultRecord {
            id: 0,
            run_id: self.run_id,
            stage: stage.name.clone(),
            fingerprint: key.fingerprint(),
            status: ResultStatus::Ok,
            outputs: made.outputs,
            command: stage.describe_run(),
            started_ms: made.started_ms,
            finished_ms: made.finished_ms,
            exit_code: made.exit_code,
            log_path: made.log_path,
            error: None,
            origin: made.origin,
        };
        ResultRow {
            record,
            key: key.clone(),
            attempt: made.attempt,
            inline: made.inline,
        }
    }

    /// Makes `record`, just recorded, the result stage `i` uses in this
    /// run (downstream keys, the lock file).
    fn use_result(&mut self, i: usize, record: ResultRecord) -> ResultRecord {
        let name = record.stage.clone();
        tracing::info!(stage = %name, result = record.id, "recorded");
        self.used
            .insert(i, (record.fingerprint, record.outputs.clone()));
        self.lock_changed = true;
        self.ctx.note_outputs(&record.outputs);
        self.ctx.latest_failure.remove(&name);
        self.ctx.latest_ok.insert(name, record.clone());
        record
    }

    /// Records a failed result of stage `i` under `key`.
    pub(super) fn record_failure(
        &self,
        i: usize,
        key: &StageKey,
        failure: &Failure<'_>,
    ) -> Result<(), ScheduleError> {
        let stage = &self.ctx.manifest.stages[i];
        let ledger = self.ctx.ledger.as_ref().ok_or(ScheduleError::NoLedger)?;
        let log_path = failure
            .log
            .exists()
            .then(|| failure.log.to_string_lossy().into_owned());
        ledger.record(
            &NewResult {
                run_id: self.run_id,
                stage: &stage.name,
                key,
                status: ResultStatus::Failed,
                outputs: &[],
                command: &stage.describe_run(),
                started_ms: failure.started_ms,
                finished_ms: now_ms(),
                exit_code: failure.exit_code,
                log_path: log_path.as_deref(),
                error: Some(failure.message),
                attempt: failure.attempt,
                origin: None,
            },
            &[],
        )?;
        Ok(())
    }

    /// Closes the run as failed after an error ended it early, if the
    /// ledger can still take that (a full disk may refuse even this; the
    /// next run then closes it).
    pub(super) fn close_as_failed(&self) {
        if let Err(error) = self.close_run("failed") {
            tracing::warn!(
                "could not record run {} as failed: {}",
                self.run_id,
                super::super::with_causes(&error)
            );
        }
    }

    /// Records how the run ended. Jobs whose tasks were dropped may still
    /// run: the next run adopts or cancels them. A full disk refusing this
    /// gets the room kept for it ([`reserve`]), once.
    pub(super) fn close_run(&self, status: &str) -> Result<(), StoreError> {
        let Some(ledger) = &self.ctx.ledger else {
            return Ok(());
        };
        let stages = self.timeline.rows();
        let close = || {
            ledger
                .close_running_attempts(self.run_id, true)
                .and_then(|()| ledger.record_stage_runs(self.run_id, &stages))
                .and_then(|()| ledger.finish_run(self.run_id, status, self.summary.counts))
        };
        match close() {
            Err(error) if !reserve::release(&self.ctx.manifest.cache_dir()) => Err(error),
            Err(_) => close(),
            Ok(()) => Ok(()),
        }
    }
}

/// The lock file this run leaves.
///
/// For each stage: the result this run found valid or produced (`used`), or
/// else its current one (the one the lock already names, else the newest).
pub(crate) fn new_lock_file(
    ctx: &Context<'_>,
    used: &HashMap<usize, (Digest, Vec<OutputRecord>)>,
) -> LockFile {
    let mut lock = LockFile::new(&ctx.manifest.name);
    enter_in_lock(&mut lock, ctx, used, |_| true);
    lock
}

/// Enters in `lock` each stage `which` takes, as [`new_lock_file`] does.
pub(super) fn enter_in_lock(
    lock: &mut LockFile,
    ctx: &Context<'_>,
    used: &HashMap<usize, (Digest, Vec<OutputRecord>)>,
    which: impl Fn(usize) -> bool,
) {
    for (i, stage) in ctx.manifest.stages.iter().enumerate() {
        if !which(i) {
            continue;
        }
        if let Some((fingerprint, outputs)) = used.get(&i) {
            lock.insert(&stage.name, *fingerprint, outputs);
        } else if let Some(record) = ctx.latest_ok.get(&stage.name) {
            lock.insert(&stage.name, record.fingerprint, &record.outputs);
        }
    }
}

/// How a stage failed, as its failed result records it.
pub(super) struct Failure<'f> {
    pub message: &'f str,
    pub exit_code: Option<i32>,
    pub started_ms: i64,
    /// The stage's log (recorded if it exists).
    pub log: &'f std::path::Path,
    /// The command's attempt that failed, if it got that far.
    pub attempt: Option<&'f ItemAttempt>,
}
