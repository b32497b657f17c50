//! A per-item stage's run: a bounded window of item tasks over the plan,
//! the stage's window resources held while they run, and the jobs of dead
//! runs for items no longer wanted cancelled first.

use super::*;

impl StageTask {
    /// Runs the unfinished items (each with its own retries), reports every
    /// attempt as it ends, then writes the merged results as the output.
    pub(super) async fn run_items(
        mut self,
        executor: Arc<dyn Executor>,
        links: TaskLinks,
    ) -> Result<TaskResult, ScheduleError> {
        let started_ms = now_ms();
        let started = Instant::now();
        let mut items = self.items.take().expect("a per-item task");
        let cancelled_orphans = cancel_orphans(&self.orphans).await;
        std::fs::create_dir_all(&items.log_dir).map_err(|source| ScheduleError::Io {
            path: items.log_dir.clone(),
            source,
        })?;
        if let Some(remote) = &self.remote {
            let reused = super::super::remote::reuse_items(
                remote,
                &mut items.plan,
                &items.outputs,
                &self.store,
                &links.attempts,
                self.run_id,
                &items.name,
            )
            .await;
            if reused > 0 {
                tracing::info!("{reused} item(s) of `{}` from the remote cache", items.name);
            }
        }
        if !items.outputs.is_empty() {
            let restored = items.outputs.prepare(&mut items.plan, &self.store)?;
            if restored > 0 {
                tracing::info!("restored {restored} item output(s) of `{}`", items.name);
            }
        }
        let mut todo: Vec<usize> = items
            .plan
            .iter()
            .enumerate()
            .filter(|(_, p)| match (&p.outcome, items.only) {
                (Some((class, _)), _) if class.is_final() => false,
                (_, None) => true,
                (None, Some(only)) => only == Only::Pending,
                (Some((ItemClass::Infra, _)), Some(only)) => only == Only::Infra,
                (Some((_, _)), Some(only)) => only == Only::Error,
            })
            .map(|(i, _)| i)
            .collect();
        if let Some(limit) = items.limit {
            todo.truncate(limit);
        }

        // Resources held per stage: taken once, for as long as the items
        // run; the items themselves only need job slots.
        let window_permits = if todo.is_empty() || self.holds.per_stage.is_empty() {
            None
        } else {
            match self
                .limits
                .acquire_resources(self.priority, &self.holds.per_stage)
                .await
            {
                Some(permits) => Some(permits),
                None => {
                    return Ok(TaskResult {
                        cancelled_orphans,
                        ..TaskResult::not_started()
                    });
                }
            }
        };
        // ...and, for a window `across` a cluster, held there too: two runs
        // on two machines never hold it at once.
        let held_across = if window_permits.is_some() {
            match self.hold_windows().await? {
                Some(held) => held,
                None => {
                    return Ok(TaskResult {
                        cancelled_orphans,
                        ..TaskResult::not_started()
                    });
                }
            }
        } else {
            Vec::new()
        };
        let stage_jobs = Arc::new(Semaphore::new(
            items.spec.jobs.unwrap_or(Semaphore::MAX_PERMITS),
        ));
        let runner = Arc::new(ItemRunner {
            executor,
            job_prefix: self.job_prefix.clone(),
            job: self.job.clone(),
            checks: self.checks.clone(),
            spec: items.spec.clone(),
            classify: self.classify.clone(),
            retry: self.retry.clone(),
            limits: self.limits.clone(),
            holds: self.holds.per_command.clone(),
            priority: self.priority,
            log_dir: items.log_dir.clone(),
            stage: items.name.clone(),
            run_id: self.run_id,
            attempts: links.attempts.clone(),
            outputs: items.outputs.clone(),
            store: self.store.clone(),
            uploads: self.uploads.clone(),
            producer: self.producer.clone(),
        });
        // A bounded window of item tasks: tens of thousands of waiting
        // futures would cost memory and buy nothing.
        let mut queue = todo.into_iter();
        let mut running = JoinSet::new();
        let mut spawn_next = |running: &mut JoinSet<_>, plan: &[PlannedItem]| {
            if let Some(index) = queue.next() {
                let planned = plan[index].clone();
                let (runner, stage_jobs) = (runner.clone(), stage_jobs.clone());
                running.spawn(async move {
                    let _slot = stage_jobs.acquire_owned().await;
                    (index, runner.run(&planned).await)
                });
            }
        };
        for _ in 0..ITEMS_IN_FLIGHT {
            spawn_next(&mut running, &items.plan);
        }
        let mut stopped = false;
        // Items that ended in error in this run: key, why, last log.
        let mut errors: Vec<(String, Option<String>, Option<PathBuf>)> = Vec::new();
        while let Some(joined) = running.join_next().await {
            let (index, result) = joined.map_err(|e| ScheduleError::Task(e.to_string()))?;
            match result? {
                Some(end) => {
                    if end.class == ItemClass::Error {
                        errors.push((items.plan[index].item.key.clone(), end.why, end.log));
                    }
                    items.plan[index].outcome = Some((end.class, end.attempts));
                    items.plan[index].result = end.result;
                }
                None => stopped = true,
            }
            if !stopped {
                spawn_next(&mut running, &items.plan);
            }
        }

        release_windows(held_across).await;

        let counts = ItemCounts::of(&items.plan);
        let mut task = TaskResult {
            started: true,
            outcome: Outcome::Success,
            failure: None,
            published: None,
            partial: None,
            started_ms,
            failure_log: None,
            cancelled_orphans,
            last_attempt: None,
        };
        if stopped {
            task.failure = Some(format!(
                "stopped before every item ran ({})",
                counts.summary()
            ));
        } else if counts.error > items.spec.allow_errors {
            let mut failure = format!(
                "{} item(s) ended in error, {} allowed ({})",
                counts.error,
                items.spec.allow_errors,
                counts.summary()
            );
            // The first failing item (in key order) speaks for the rest.
            errors.sort_by(|a, b| a.0.cmp(&b.0));
            if let Some((key, why, log)) = errors.into_iter().next() {
                failure.push_str(&format!("; first: item `{key}`"));
                if let Some(why) = why {
                    failure.push_str(&format!(" ({why})"));
                }
                task.failure_log = log;
            }
            task.failure = Some(failure);
        } else if counts.infra > 0 {
            task.failure = Some(format!(
                "{} item(s) still failing on infrastructure after retries; a later run retries them ({})",
                counts.infra,
                counts.summary()
            ));
        } else if counts.pending > 0 {
            task.partial = Some(format!(
                "{} item(s) left for a later run ({})",
                counts.pending,
                counts.summary()
            ));
        }
        if task.failure.is_some() || task.partial.is_some() {
            return Ok(task);
        }

        // The merged results: the one output the items do not write into
        // (besides a sampled stage's summary).
        let samples = items.spec.samples.as_ref();
        let summary = samples.and_then(|s| s.summary.as_deref());
        let written = |name: &str| !items.outputs.contains(name);
        self.clear_outputs_where(written)?;
        let path_of = |wanted: &dyn Fn(&str) -> bool| {
            self.outputs
                .iter()
                .find(|(name, _, _)| wanted(name))
                .map(|(_, _, path)| path.clone())
                .ok_or_else(|| ScheduleError::Task("a per-item stage has no output".to_owned()))
        };
        let write = |path: PathBuf, bytes: Vec<u8>| {
            std::fs::write(&path, bytes).map_err(|source| ScheduleError::Io { path, source })
        };
        let merged = path_of(&|name| written(name) && Some(name) != summary)?;
        match samples {
            None => write(merged, aggregate(&items.plan))?,
            Some(samples) => {
                write(merged, super::super::samples::merged(&items.plan, samples))?;
                if let Some(summary) = summary {
                    let report = super::super::samples::summary(&items.name, &items.plan, samples);
                    let mut bytes = serde_json::to_vec_pretty(&report)
                        .map_err(|e| ScheduleError::Task(e.to_string()))?;
                    bytes.push(b'\n');
                    write(path_of(&|name| name == summary)?, bytes)?;
                }
            }
        }
        task.published = Some(self.store_outputs(&links, started).await?);
        Ok(task)
    }
}

/// Cancels the jobs `orphans` (left by a dead run for items no longer
/// wanted), each on its own engine; the handles it cancelled. One it cannot
/// cancel is left on record, to be tried again by the next run.
pub(super) async fn cancel_orphans(orphans: &[(String, Option<Arc<dyn Executor>>)]) -> Vec<String> {
    let mut cancelled = Vec::new();
    for (handle, engine) in orphans {
        let Some(engine) = engine else {
            tracing::warn!(
                job = %handle,
                "a dead run left this job, for an item no longer wanted, on an engine this run does not use: cancel it by hand"
            );
            continue;
        };
        match engine.cancel_handle(handle).await {
            Ok(true) => {
                tracing::info!(job = %handle, "cancelled a job a dead run left for an item no longer wanted");
                cancelled.push(handle.clone());
            }
            Ok(false) => tracing::warn!(job = %handle, "no engine of this run knows this job"),
            Err(error) => {
                tracing::warn!(job = %handle, error = %error, "could not cancel a job a dead run left")
            }
        }
    }
    cancelled
}

/// How many items of one stage are in flight (waiting for a slot or
/// running) at once.
const ITEMS_IN_FLIGHT: usize = 256;
