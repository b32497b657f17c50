//! A stage's task ended: its outputs known, its result or failure taken
//! in, its items' attempts recorded, its slot freed and what waited on it
//! released.

use super::*;

impl Dispatcher<'_, '_> {
    /// A task's output digests are final: the stage is done for everything
    /// downstream (its result is recorded when its objects are durable).
    pub(super) fn outputs_known(&mut self, hashed: Hashed) {
        let Hashed {
            stage: i,
            records,
            seen,
            elapsed,
        } = hashed;
        self.ctx.note_outputs(&records);
        // What the store saw of them, for the stages that read them to be
        // looked at again by (see `inputs_read`).
        for (path, entry) in seen {
            self.ctx.stat.learn(path, entry);
        }
        self.became(i, Became::Hashed { elapsed });
        self.complete(i);
    }

    /// A task ended: record its result, or its failure.
    pub(super) fn finished(
        &mut self,
        i: usize,
        key: &StageKey,
        mut result: Result<TaskResult, ScheduleError>,
    ) -> Result<(), ScheduleError> {
        let log = self
            .log_dir
            .join(format!("{}.log", self.ctx.manifest.stages[i].name));
        if let Ok(task) = &mut result
            && let Some(stat) = task.stat.take()
        {
            self.ctx.stat.absorb(stat);
        }
        if let Ok(task) = &result
            && !task.cancelled_orphans.is_empty()
            && let Some(ledger) = &self.ctx.ledger
        {
            ledger.orphans_cancelled(&self.ctx.manifest.stages[i].name, &task.cancelled_orphans)?;
        }
        let task = match result {
            // The run stopped before this stage got a job slot.
            Ok(task) if !task.started => {
                self.set_slot(i, Slot::Waiting);
                return Ok(());
            }
            Ok(task) => {
                let at_ms = task.started_ms;
                self.became(i, Became::Began { at_ms });
                task
            }
            Err(error) => {
                let message = crate::schedule::with_causes(&error);
                let failure = Failure {
                    message: &message,
                    exit_code: None,
                    started_ms: now_ms(),
                    log: &log,
                    attempt: None,
                };
                self.record_failure(i, key, &failure)?;
                // A service that did not come up ran nothing of the
                // stage: the message quotes the service's log.
                let log = (!matches!(error, ScheduleError::Service(_))).then_some(log);
                self.fail(i, &message, log);
                return Ok(());
            }
        };
        if let Some(message) = task.partial {
            self.set_slot(i, Slot::Partial);
            self.became(i, Became::Partial { message: &message });
            return Ok(());
        }
        match (task.failure, task.published) {
            (Some(message), _) => {
                let failure = Failure {
                    message: &message,
                    exit_code: task.outcome.exit_code(),
                    started_ms: task.started_ms,
                    log: &log,
                    attempt: task.last_attempt.as_ref(),
                };
                self.record_failure(i, key, &failure)?;
                self.fail(i, &message, Some(task.failure_log.unwrap_or(log)));
            }
            (None, Some(published)) => {
                // Recorded by the ledger writer: its answer completes it.
                self.commit(i, key, published, task.started_ms, &log, task.last_attempt)?;
            }
            (None, None) => {
                return Err(ScheduleError::Task(
                    "a successful task stored no outputs".to_owned(),
                ));
            }
        }
        Ok(())
    }

    /// Records items' attempts the moment they end, so a crash loses no
    /// finished item.
    pub(super) async fn item_attempts(
        &mut self,
        attempts: Vec<ItemAttempt>,
    ) -> Result<(), ScheduleError> {
        if attempts.is_empty() {
            return Ok(());
        }
        // A plain stage's attempts go to the ledger writer, in order with
        // its result; items' are written before the loop goes on.
        let (mut attempts, items): (Vec<_>, Vec<_>) = attempts
            .into_iter()
            .partition(|attempt| attempt.key == COMMAND_ITEM);
        if !attempts.is_empty() {
            // A job a remote engine now runs is on record at once: a cairn
            // killed meanwhile would leave the next run a job it cannot
            // adopt or cancel. (A local process carries cairn's mark and is
            // found without its record.)
            let remote_job = attempts.iter().any(|attempt| {
                attempt.class == RUNNING
                    && attempt
                        .handle
                        .as_deref()
                        .is_some_and(|handle| !crate::exec::is_local_handle(handle))
            });
            self.send_record(Record::Attempts(attempts.clone()))?;
            if remote_job {
                self.writing.hurry();
            }
        }
        if !items.is_empty() {
            let ledger = self.ctx.ledger.as_ref().ok_or(ScheduleError::NoLedger)?;
            let ledger = self.writing.attempts(ledger)?;
            let items = tokio::task::spawn_blocking(move || {
                let ledger = ledger
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                ledger.record_item_attempts(&items).map(|()| items)
            })
            .await
            .map_err(|e| ScheduleError::Task(e.to_string()))??;
            attempts.extend(items);
        }
        // A plain stage's attempts that end here are those it retries (its
        // last is recorded with its result).
        for attempt in &attempts {
            self.attempt_seen(attempt);
        }
        Ok(())
    }

    /// Puts stage `i` in `slot`, counting the selected stages still
    /// waiting.
    pub(super) fn set_slot(&mut self, i: usize, slot: Slot) {
        let selected = self.options.selected[i];
        match (
            selected && self.slots[i] == Slot::Waiting,
            selected && slot == Slot::Waiting,
        ) {
            (true, false) => self.waiting -= 1,
            (false, true) => self.waiting += 1,
            _ => {}
        }
        self.slots[i] = slot;
    }

    /// Marks a stage done and readies the downstream stages it unblocks.
    pub(super) fn complete(&mut self, i: usize) {
        self.set_slot(i, Slot::Ok);
        for &d in self.ctx.dag.downstream(i) {
            if self.options.selected[d] {
                self.remaining[d] -= 1;
                if self.remaining[d] == 0 {
                    self.ready.insert((self.rank[d], d));
                    self.became(d, Became::Ready);
                }
            }
        }
    }

    /// Stops each service no stage of this run needs any more: every
    /// selected stage that uses it has ended (or, the run stopping, never
    /// will start).
    pub(super) async fn release_services(&self) {
        for name in self.services.up() {
            let needed = self
                .ctx
                .manifest
                .stages
                .iter()
                .enumerate()
                .any(|(i, stage)| {
                    let pending = match self.slots[i] {
                        Slot::Running => true,
                        Slot::Waiting => !self.stop,
                        Slot::Ok | Slot::Failed | Slot::Partial => false,
                    };
                    self.options.selected[i]
                        && pending
                        && stage.services.iter().any(|s| s.name == name)
                });
            if !needed {
                self.services.stop(&name).await;
            }
        }
    }

    pub(super) fn fail(&mut self, i: usize, message: &str, log: Option<PathBuf>) {
        self.set_slot(i, Slot::Failed);
        if !self.options.keep_going {
            self.stop = true;
            self.limits.stop();
        }
        self.became(
            i,
            Became::Failed {
                message,
                log: log.as_deref(),
            },
        );
    }
}
