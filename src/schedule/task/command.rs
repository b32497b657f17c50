//! A plain stage's run: its command as one implicit item. Each attempt is
//! on record from the moment its job starts (with the job's handle), is
//! classified by the stage's `classify` rules and retried by its `retry`,
//! like an item's; the last one that succeeds has its checks run and its
//! outputs stored.

use super::*;
use crate::store::COMMAND_ITEM;

impl StageTask {
    /// Runs the command until an attempt succeeds or no retry is left.
    pub(super) async fn run_command(
        mut self,
        executor: Arc<dyn Executor>,
        links: TaskLinks,
    ) -> Result<TaskResult, ScheduleError> {
        let cancelled_orphans = cancel_orphans(&self.orphans).await;
        let mut failed: Option<TaskResult> = None;
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let Some(permits) = self
                .limits
                .acquire_for(executor.as_ref(), self.priority, &self.holds.per_command)
                .await
            else {
                return Ok(stopped(failed, cancelled_orphans));
            };
            let Some(held) = self.hold_windows().await? else {
                return Ok(stopped(failed, cancelled_orphans));
            };
            if attempt == 1
                && let Err(error) = self.reach_services().await
            {
                release_windows(held).await;
                return Err(error);
            }
            let started_ms = now_ms();
            let started = Instant::now();
            let job = self.attempt_job(self.attempts_before + attempt);
            // All attempts share the stage's log; each is classified by
            // what it added (looked at only if a rule reads it).
            let log_start = if self.classify.iter().any(|rule| rule.output.is_some()) {
                std::fs::metadata(&job.log).map_or(0, |m| m.len())
            } else {
                0
            };
            let started_job = start_job(executor.as_ref(), &job, || self.clear_outputs()).await?;
            // On record before it ends: a cairn that dies now leaves the
            // job's handle behind, for the next run to adopt or cancel.
            let (handle, outcome) = started_job
                .outcome(|handle| {
                    let _ = links.attempts.send(ItemAttempt {
                        handle: Some(handle.to_owned()),
                        ..self.attempt_record(attempt, started_ms)
                    });
                })
                .await?;
            let (class, rule) = classify(&self.classify, outcome, &job.log, log_start, None);
            // The checks run inside the windows, like the command.
            let failure = match &class {
                ItemClass::Ok => match self.outputs_and_checks(executor.as_ref(), &job).await? {
                    None => match self.service_died().await {
                        None => self.input_changed(),
                        died => died,
                    },
                    failure => failure,
                },
                _ if outcome == Outcome::Success => Some(format!(
                    "command succeeded but is classified `{}` by `{}`",
                    class.name(),
                    rule.as_deref().unwrap_or("")
                )),
                _ => Some(format!("command {}", outcome.describe())),
            };
            release_windows(held).await;
            let class = match (&failure, class) {
                (Some(_), ItemClass::Ok) => ItemClass::Error,
                (_, class) => class,
            };
            let ended = ItemAttempt {
                finished_ms: now_ms(),
                exit_code: outcome.exit_code(),
                class: class.name().to_owned(),
                rule: rule.or_else(|| failure.clone()),
                log_path: job
                    .log
                    .exists()
                    .then(|| job.log.to_string_lossy().into_owned()),
                handle,
                ..self.attempt_record(attempt, started_ms)
            };
            // The job slot and resources are free while the outputs are
            // stored, or while a retry waits.
            drop(permits);
            let Some(failure) = failure else {
                // Recorded with the result, in one transaction.
                return Ok(TaskResult {
                    started: true,
                    outcome,
                    failure: None,
                    published: Some(
                        self.store_outputs(&links, started, StatCache::default())
                            .await?
                            .0,
                    ),
                    partial: None,
                    started_ms,
                    failure_log: None,
                    cancelled_orphans,
                    last_attempt: Some(ended),
                    stat: None,
                });
            };
            let retried = self.retry.on.contains(&class) && attempt <= self.retry.max;
            let failure = match attempt {
                1 => failure,
                n => format!("{failure} (attempt {n}, `{}`)", class.name()),
            };
            let result = TaskResult {
                started: true,
                outcome,
                failure: Some(failure),
                published: None,
                partial: None,
                started_ms,
                failure_log: None,
                cancelled_orphans: cancelled_orphans.clone(),
                last_attempt: None,
                stat: None,
            };
            if !retried {
                return Ok(TaskResult {
                    last_attempt: Some(ended),
                    ..result
                });
            }
            // Recorded now: the run may stop before the retry ends.
            let _ = links.attempts.send(ended);
            failed = Some(result);
            tracing::info!(
                stage = %self.job.stage,
                attempt,
                class = class.name(),
                "the command failed; retrying"
            );
            tokio::select! {
                () = tokio::time::sleep(self.retry.backoff_before(attempt)) => {}
                () = self.limits.stopped() => return Ok(stopped(failed, cancelled_orphans)),
            }
        }
    }

    /// The job of the command's attempt `number` (counting every earlier
    /// run's under this fingerprint): named by it, so that an earlier
    /// process's job for the same attempt is adopted.
    fn attempt_job(&self, number: u32) -> Job {
        let mut job = Job {
            name: format!("{}-{number}", self.job_name_stem),
            ..self.job.clone()
        };
        job.env
            .push((ATTEMPT_MARKER.to_owned(), number.to_string()));
        job
    }

    /// The record of attempt `attempt` of this run, started at
    /// `started_ms`, before anything is known of how it ends.
    fn attempt_record(&self, attempt: u32, started_ms: i64) -> ItemAttempt {
        ItemAttempt::started(
            self.run_id,
            &self.job.stage,
            COMMAND_ITEM,
            self.fingerprint,
            attempt,
            started_ms,
        )
    }

    /// `Some(reason)` if a successful command still failed: a declared
    /// output is missing, or a check failed.
    async fn outputs_and_checks(
        &self,
        executor: &dyn Executor,
        job: &Job,
    ) -> Result<Option<String>, ScheduleError> {
        if let Some((name, path, abs)) = self.outputs.iter().find(|(_, _, abs)| {
            std::fs::symlink_metadata(abs).is_ok_and(|meta| meta.file_type().is_symlink())
        }) {
            let target = std::fs::read_link(abs)
                .map(|target| target.display().to_string())
                .unwrap_or_default();
            // Removed (which changes nothing it points to): an output may
            // not be a link, and one left there would stop the manifest
            // from loading until someone removed it.
            let _ = std::fs::remove_file(abs);
            return Ok(Some(format!(
                "the command made declared output `{name}` ({path}) a symbolic link (to `{target}`), which cairn does not store; write a file or a directory there (the link was removed)"
            )));
        }
        if let Some((name, path, _)) = self.outputs.iter().find(|(_, _, abs)| !abs.exists()) {
            return Ok(Some(format!(
                "command succeeded but did not create declared output `{name}` ({path})"
            )));
        }
        for (n, check) in self.checks.iter().enumerate() {
            let check_job = Job {
                name: format!("{}-check{}", job.name, n + 1),
                command: check.clone(),
                ..job.clone()
            };
            let outcome = executor.run(&check_job).await?;
            if outcome != Outcome::Success {
                return Ok(Some(format!(
                    "check `{}` {}",
                    check.display(),
                    outcome.describe()
                )));
            }
        }
        Ok(None)
    }
}

/// The end of a task whose run stopped before its next attempt could
/// start: the failure of the last attempt, if there was one.
fn stopped(failed: Option<TaskResult>, cancelled_orphans: Vec<String>) -> TaskResult {
    failed.unwrap_or(TaskResult {
        cancelled_orphans,
        ..TaskResult::not_started()
    })
}
