//! A per-item stage's run: a bounded window of item tasks over the plan,
//! the stage's window resources held while they run, and the jobs of dead
//! runs for items no longer wanted cancelled first.

use super::*;
use std::collections::BTreeMap;

use crate::manifest::Isolate;

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
            let reused = super::super::shared_cache::reuse_items(
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
            let restored = items
                .outputs
                .prepare(&mut items.plan, &self.store, &mut items.stat)?;
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
                // A kept error (a sample's) runs again only when asked.
                (Some((class, _)), None) if items.spec.keeps(class) => false,
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
        if !todo.is_empty()
            && let Err(error) = self.reach_services().await
        {
            release_windows(held_across).await;
            return Err(error);
        }
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
            seen: std::sync::Mutex::default(),
            store: self.store.clone(),
            uploads: self.uploads.clone(),
            producer: self.producer.clone(),
            inputs_read: self.inputs_read.clone(),
            group_env: std::sync::Mutex::default(),
        });
        // With `isolate`, each group's smoke items run first; a group one
        // of them fails is marked, and its other items are not run. With
        // `one_at_a_time`, group after group (its smoke items, then the
        // rest); else every group's smoke items, then every group's rest.
        let isolate = items.spec.isolate.clone();
        // (Each phase with its group, when groups take turns.)
        let phases: Vec<(Option<String>, Vec<usize>)> = match &isolate {
            None => vec![(None, todo)],
            Some(isolate) if isolate.one_at_a_time => {
                let mut groups: BTreeMap<String, Vec<usize>> = BTreeMap::new();
                for i in todo {
                    groups
                        .entry(group_of(&items.plan[i].item, Some(isolate)))
                        .or_default()
                        .push(i);
                }
                groups
                    .into_iter()
                    .map(|(g, items)| (Some(g), items))
                    .collect()
            }
            Some(_) => vec![(None, todo)],
        };
        let group_jobs = GroupJobs::of(isolate.as_ref(), &items.plan);
        // Items that ended in error in this run: key, why, last log.
        let mut errors: Vec<(String, Option<String>, Option<PathBuf>)> = Vec::new();
        let mut marked = BTreeMap::new();
        let mut stopped = false;
        for (group, phase) in phases {
            // A per-group service comes up for its group (the previous
            // group's stopped first): one model served at a time.
            if let Some(group) = &group {
                match self.reach_group_services(group).await {
                    Ok(env) => {
                        if let Ok(mut group_env) = runner.group_env.lock() {
                            *group_env = env;
                        }
                    }
                    Err(error) => {
                        release_windows(held_across).await;
                        return Err(error);
                    }
                }
            }
            let (smoke, rest): (Vec<usize>, Vec<usize>) = match &isolate {
                None => (phase, Vec::new()),
                Some(isolate) => phase
                    .into_iter()
                    .partition(|&i| is_smoke(&items.plan[i].item, isolate)),
            };
            let window = Window {
                runner: &runner,
                stage_jobs: &stage_jobs,
                group_jobs: &group_jobs,
            };
            stopped = window.run(&mut items.plan, smoke, &mut errors).await?;
            if let Some(isolate) = &isolate {
                marked = failed_groups(&items.plan, isolate);
            }
            if stopped {
                break;
            }
            let rest = rest
                .into_iter()
                .filter(|&i| !marked.contains_key(&group_of(&items.plan[i].item, isolate.as_ref())))
                .collect();
            stopped = window.run(&mut items.plan, rest, &mut errors).await?;
            if stopped {
                break;
            }
        }
        let mut every_group_marked = false;
        if let Some(isolate) = &isolate {
            let groups: std::collections::BTreeSet<String> = items
                .plan
                .iter()
                .map(|p| group_of(&p.item, Some(isolate)))
                .collect();
            every_group_marked = !marked.is_empty() && marked.len() == groups.len();
            for (group, key) in &marked {
                let skipped = mark_group(&mut items.plan, isolate, group);
                let others = if every_group_marked {
                    "no group went on"
                } else {
                    "the other groups went on"
                };
                tracing::warn!(
                    "group `{group}` of `{}` is {}: smoke item `{key}` never completed (it ended in error); {skipped} of its items were not run, {others}",
                    items.name,
                    isolate.mark
                );
            }
            // A marked group's errors are its mark, not the stage's.
            errors.retain(|(key, _, _)| {
                items
                    .plan
                    .iter()
                    .find(|p| &p.item.key == key)
                    .is_none_or(|p| !marked.contains_key(&group_of(&p.item, Some(isolate))))
            });
        }

        release_windows(held_across).await;
        // What storing the entries hashed is remembered with what
        // preparing them looked at.
        if let Ok(mut seen) = runner.seen.lock() {
            for (path, entry) in seen.drain(..) {
                items.stat.learn(path, entry);
            }
        }

        // The counts that decide the stage leave marked groups out.
        let counts = ItemCounts::of(&items.plan);
        let judged = match &isolate {
            Some(isolate) if !marked.is_empty() => {
                let kept: Vec<PlannedItem> = items
                    .plan
                    .iter()
                    .filter(|p| !marked.contains_key(&group_of(&p.item, Some(isolate))))
                    .cloned()
                    .collect();
                ItemCounts::of(&kept)
            }
            _ => counts.clone(),
        };
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
            stat: None,
        };
        if stopped {
            task.failure = Some(format!(
                "stopped before every item ran ({})",
                counts.summary()
            ));
        } else if every_group_marked {
            task.failure = Some(format!(
                "every group is {}: no smoke item of any group completed ({})",
                isolate.as_ref().map_or("", |i| i.mark.as_str()),
                counts.summary()
            ));
        } else if judged.error > items.spec.allow_errors {
            let mut failure = format!(
                "{} item(s) ended in error, {} allowed ({})",
                judged.error,
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
            if items.spec.keeps_errors() {
                failure.push_str(&format!(
                    "; a sample in error counts as a fail and is kept as it ended: `cairn run --only error {}` draws the samples in error again",
                    items.name
                ));
            }
            task.failure = Some(failure);
        } else if let Some(why) = self.service_died().await {
            task.failure = Some(format!("{why} ({})", counts.summary()));
        } else if judged.infra > 0 {
            task.failure = Some(format!(
                "{} item(s) still failing on infrastructure after retries; a later run retries them ({})",
                judged.infra,
                counts.summary()
            ));
        } else if judged.pending > 0 {
            task.partial = Some(format!(
                "{} item(s) left for a later run ({})",
                judged.pending,
                counts.summary()
            ));
        }
        let stat = std::mem::take(&mut items.stat);
        if task.failure.is_some() || task.partial.is_some() {
            task.stat = Some(stat);
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
                let mark = items.spec.isolate.as_ref().map(|i| i.mark.as_str());
                write(
                    merged,
                    super::super::samples::merged(&items.plan, samples, mark),
                )?;
                if let Some(summary) = summary {
                    let report =
                        super::super::samples::summary(&items.name, &items.plan, samples, mark);
                    let mut bytes = serde_json::to_vec_pretty(&report)
                        .map_err(|e| ScheduleError::Task(e.to_string()))?;
                    bytes.push(b'\n');
                    write(path_of(&|name| name == summary)?, bytes)?;
                }
            }
        }
        let (published, stat) = self.store_outputs(&links, started, stat).await?;
        task.published = Some(published);
        task.stat = Some(stat);
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

/// The slots of each group, with `isolate.jobs`: at most that many items of
/// one group at once.
struct GroupJobs {
    isolate: Option<Isolate>,
    slots: std::collections::HashMap<String, Arc<Semaphore>>,
}

impl GroupJobs {
    fn of(isolate: Option<&Isolate>, plan: &[PlannedItem]) -> Self {
        let mut slots = std::collections::HashMap::new();
        if let Some(isolate) = isolate
            && let Some(jobs) = isolate.jobs
        {
            for planned in plan {
                slots
                    .entry(group_of(&planned.item, Some(isolate)))
                    .or_insert_with(|| Arc::new(Semaphore::new(jobs)));
            }
        }
        Self {
            isolate: isolate.cloned(),
            slots,
        }
    }

    /// `todo` with its groups taking turns (the first item of each group,
    /// then the second, …), if groups are capped; else as it is.
    fn interleaved(&self, todo: Vec<usize>, plan: &[PlannedItem]) -> Vec<usize> {
        if self.slots.is_empty() {
            return todo;
        }
        let mut groups: BTreeMap<String, std::collections::VecDeque<usize>> = BTreeMap::new();
        for i in todo {
            groups
                .entry(group_of(&plan[i].item, self.isolate.as_ref()))
                .or_default()
                .push_back(i);
        }
        let mut turns = Vec::new();
        while groups.values().any(|g| !g.is_empty()) {
            for group in groups.values_mut() {
                turns.extend(group.pop_front());
            }
        }
        turns
    }

    /// The slots of `item`'s group, if its groups are capped.
    fn of_item(&self, item: &Item) -> Option<Arc<Semaphore>> {
        self.slots
            .get(&group_of(item, self.isolate.as_ref()))
            .cloned()
    }
}

/// What a window of items runs with: the runner, the stage's job slots
/// and each group's.
struct Window<'w> {
    runner: &'w Arc<ItemRunner>,
    stage_jobs: &'w Arc<Semaphore>,
    group_jobs: &'w GroupJobs,
}

impl Window<'_> {
    /// Runs the items `todo` of `plan` in a bounded window, each with its
    /// own retries, and notes each outcome in `plan` (and each error in
    /// `errors`). `true` if the run stopped first.
    async fn run(
        &self,
        plan: &mut [PlannedItem],
        todo: Vec<usize>,
        errors: &mut Vec<(String, Option<String>, Option<PathBuf>)>,
    ) -> Result<bool, ScheduleError> {
        // A bounded window of item tasks: tens of thousands of waiting
        // futures would cost memory and buy nothing. With a cap per group,
        // the groups take turns in the queue, so a window full of one
        // group's items waiting for its slots never idles the others.
        let todo = self.group_jobs.interleaved(todo, plan);
        let mut queue = todo.into_iter();
        let mut running = JoinSet::new();
        let mut spawn_next = |running: &mut JoinSet<_>, plan: &[PlannedItem]| {
            if let Some(index) = queue.next() {
                let planned = plan[index].clone();
                let (runner, stage_jobs) = (self.runner.clone(), self.stage_jobs.clone());
                let group_jobs = self.group_jobs.of_item(&planned.item);
                running.spawn(async move {
                    // The group's slot first: an item waiting for its
                    // group holds none of the stage's.
                    let _group_slot = match group_jobs {
                        Some(slots) => Some(slots.acquire_owned().await),
                        None => None,
                    };
                    let _slot = stage_jobs.acquire_owned().await;
                    (index, runner.run(&planned).await)
                });
            }
        };
        for _ in 0..ITEMS_IN_FLIGHT {
            spawn_next(&mut running, plan);
        }
        let mut stopped = false;
        while let Some(joined) = running.join_next().await {
            let (index, result) = joined.map_err(|e| ScheduleError::Task(e.to_string()))?;
            match result? {
                Some(end) => {
                    if end.class == ItemClass::Error {
                        errors.push((plan[index].item.key.clone(), end.why, end.log));
                    }
                    plan[index].outcome = Some((end.class, end.attempts));
                    plan[index].result = end.result.map(Box::new);
                }
                None => stopped = true,
            }
            if !stopped {
                spawn_next(&mut running, plan);
            }
        }
        Ok(stopped)
    }
}

/// Whether `item` is a smoke item of its group (its `smoke` field true).
fn is_smoke(item: &Item, isolate: &Isolate) -> bool {
    item.value().get(&isolate.smoke) == Some(&serde_json::Value::Bool(true))
}

/// The group `item` belongs to (its `by` field as text).
fn group_of(item: &Item, isolate: Option<&Isolate>) -> String {
    isolate
        .and_then(|isolate| super::super::items::field(&item.value(), &isolate.by).ok())
        .unwrap_or_default()
}

/// The groups a smoke item failed: one none of whose samples (the item
/// itself, unsampled) ended `ok` or with a verdict, and one of which ended
/// in error — the harness never completed it. A smoke item failing only on
/// infrastructure marks nothing. Group → the item's key.
fn failed_groups(plan: &[PlannedItem], isolate: &Isolate) -> BTreeMap<String, String> {
    // item → (group, completed once, ended in error once)
    let mut smoke: BTreeMap<&str, (String, bool, bool)> = BTreeMap::new();
    for unit in plan.iter().filter(|p| is_smoke(&p.item, isolate)) {
        let entry = smoke
            .entry(unit.item.item_key())
            .or_insert_with(|| (group_of(&unit.item, Some(isolate)), false, false));
        match &unit.outcome {
            Some((ItemClass::Ok | ItemClass::Verdict(_), _)) => entry.1 = true,
            Some((ItemClass::Error, _)) => entry.2 = true,
            // Infrastructure says nothing of the harness: the group is
            // not marked, its items stay to be retried.
            Some((ItemClass::Infra, _)) | None => {}
        }
    }
    let mut failed = BTreeMap::new();
    // In key order: the first failing smoke item speaks for its group.
    for (key, (group, completed, errored)) in smoke {
        if errored && !completed {
            failed.entry(group).or_insert_with(|| key.to_owned());
        }
    }
    failed
}

/// Reports the items of a marked group that did not run as its mark (in
/// this run's output only: nothing is recorded for what did not run, so a
/// later run tries the group again); how many, as `N` or `N (M samples)`.
fn mark_group(plan: &mut [PlannedItem], isolate: &Isolate, group: &str) -> String {
    let mut units = 0;
    let mut items = std::collections::BTreeSet::new();
    for planned in plan.iter_mut() {
        if group_of(&planned.item, Some(isolate)) == group && planned.outcome.is_none() {
            planned.outcome = Some((ItemClass::Verdict(isolate.mark.clone()), 0));
            units += 1;
            items.insert(planned.item.item_key().to_owned());
        }
    }
    if units == items.len() {
        units.to_string()
    } else {
        format!("{} ({units} samples)", items.len())
    }
}

/// How many items of one stage are in flight (waiting for a slot or
/// running) at once.
const ITEMS_IN_FLIGHT: usize = 256;
