//! Starting a stage whose turn came: its task built and spawned with what
//! it reads, its image tags resolved first when they are not yet.

use super::*;

/// How many ready stages are weighed (found fresh, or started) before the
/// run looks at what its running commands did. Each takes some
/// microseconds: a thousand fresh ones weighed in one go would leave a
/// command that ended meanwhile unseen for milliseconds, and the stage
/// waiting on it unstarted.
const WEIGHED_AT_A_TIME: usize = 32;

/// Each stage's rank among the stages ready at once (lower first): its
/// place in the topological order, but the stages that read `changed` (a
/// file the last run's proof found changed) before every other.
pub(super) fn ranks(ctx: &Context<'_>, changed: Option<&Path>) -> Vec<usize> {
    let manifest = ctx.manifest;
    // (As the proof named it: an input's path resolved in the root.)
    let changed = changed.and_then(|path| path.strip_prefix(&manifest.root).ok());
    let reads_changed = |i: usize| {
        changed.is_some_and(|changed| {
            manifest.stages[i]
                .inputs
                .iter()
                .any(|input| changed.starts_with(input.path.as_str()))
        })
    };
    let (first, rest): (Vec<usize>, Vec<usize>) = ctx
        .dag
        .order()
        .iter()
        .copied()
        .partition(|&i| reads_changed(i));
    let mut rank = vec![0; manifest.stages.len()];
    for (r, &i) in first.iter().chain(&rest).enumerate() {
        rank[i] = r;
    }
    rank
}

impl Dispatcher<'_, '_> {
    /// Starts ready stages, in rank order: fresh ones complete on the
    /// spot, the others become tasks that wait for a job slot and their
    /// resources. Returns after the first task it starts, `true` if stages
    /// are still ready: that task's command starts before the rest are
    /// weighed, which for a thousand ready stages takes tens of
    /// milliseconds. While commands run it also returns after
    /// [`WEIGHED_AT_A_TIME`] stages.
    pub(super) fn start_ready(&mut self, under_way: &mut UnderWay) -> Result<bool, ScheduleError> {
        let mut weighed = 0;
        while !self.stop {
            // While commands run, the rest are weighed a few at a time: a
            // command that ends meanwhile is seen (and what it releases
            // started) between them, not after them all.
            if weighed >= WEIGHED_AT_A_TIME
                && !under_way.running.is_empty()
                && !self.ready.is_empty()
            {
                return Ok(true);
            }
            weighed += 1;
            let Some((_, i)) = self.ready.pop_first() else {
                return Ok(false);
            };
            if self.resolve_tags_first(i, &mut under_way.resolving) {
                continue;
            }
            let Some((key, reason)) = self.evaluate(i)? else {
                continue;
            };
            let Some((key, reason)) = self.look_up_first(i, key, reason, &mut under_way.lookups)
            else {
                continue;
            };
            let tasks = under_way.running.len();
            self.start(i, key, reason, under_way);
            if under_way.running.len() > tasks && !self.ready.is_empty() {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Starts stage `i`, which must run: its task waits for a job slot and
    /// its resources.
    pub(super) fn start(
        &mut self,
        i: usize,
        key: StageKey,
        reason: DirtyReason,
        under_way: &mut UnderWay,
    ) {
        let executors = &under_way.executors;
        self.became(i, Became::MustRun { reason: &reason });
        let stage = &self.ctx.manifest.stages[i];
        // A per-item stage's plan, the items `--force` names made pending.
        let mut plan = None;
        if stage.foreach.is_some() {
            let mut items = self.ctx.hand_over_plan(i);
            if let Err(message) = self.forget_forced_items(i, &mut items) {
                self.fail(i, &message, None);
                return;
            }
            plan = Some(items);
        }
        let foreach = self.ctx.manifest.stages[i].foreach.as_ref();
        let items = plan.as_ref().map(|plan| {
            let done = plan.iter().filter(|p| p.is_kept(foreach)).count();
            (plan.len(), done)
        });
        self.became(
            i,
            Became::Started {
                reason: &reason,
                items,
            },
        );
        // Windows held across a cluster, in one order everywhere (two
        // runs taking two windows in opposite orders would wait for each
        // other forever).
        let mut windows: Vec<(String, std::sync::Arc<dyn crate::exec::Executor>)> = stage
            .resources
            .iter()
            .filter_map(|held| {
                let across = self
                    .ctx
                    .manifest
                    .resources
                    .get(&held.name)?
                    .across
                    .as_ref()?;
                Some((held.name.clone(), executors.named(across)?))
            })
            .collect();
        windows.sort_by(|a, b| a.0.cmp(&b.0));
        // Each orphan is cancelled on its own engine, which a profile
        // switch may have made another than the stage's.
        let orphans = match self.ctx.unwanted_jobs(i, &key.fingerprint()) {
            Ok(handles) => handles
                .into_iter()
                .map(|handle| {
                    let engine = executors.for_handle(&handle);
                    (handle, engine)
                })
                .collect(),
            Err(error) => {
                self.fail(i, &crate::schedule::with_causes(&error), None);
                return;
            }
        };
        let inputs_read = self.inputs_read(i, plan.as_deref());
        let run = ThisRun {
            id: self.run_id,
            token: &self.token,
            log_dir: &self.log_dir,
            limits: &self.limits,
        };
        let task = match StageTask::prepare(
            self.ctx,
            i,
            &key.fingerprint(),
            &run,
            self.holds[i].clone(),
            self.rank[i] as u64,
        ) {
            Ok(task) => match plan {
                Some(plan) => task.with_items(
                    stage,
                    plan,
                    self.options.only,
                    self.options.limit,
                    &self.ctx.stat,
                ),
                None => task,
            },
            Err(error) => {
                self.fail(i, &crate::schedule::with_causes(&error), None);
                return;
            }
        }
        .with_inputs_read(inputs_read)
        .with_orphans(orphans)
        .with_windows(windows)
        .with_services(&self.services)
        .with_remote(
            // `--force` means here: nothing of the stage is looked up.
            self.options
                .remote
                .clone()
                .filter(|_| !self.options.forced.contains(&i)),
            self.uploads.clone(),
        );
        self.set_slot(i, Slot::Running);
        let links = TaskLinks {
            stage: i,
            hashed: under_way.hashed.clone(),
            attempts: under_way.attempts.clone(),
        };
        let executor = executors.of_stage(i);
        self.launched = true;
        // The stage's run is boxed: as a future of its own it is some 12 KiB
        // (all it may wait on, items included), and the task that spawns it
        // moves what it holds into place several times.
        under_way
            .running
            .spawn(async move { (i, key, Box::pin(task.run(executor, links)).await) });
    }

    /// What stage `i`'s commands read (its inputs, and the items' of
    /// `plan`), as its key hashed them, to be looked at again as each
    /// command ends (see [`super::inputs_read`]).
    pub(super) fn inputs_read(&self, i: usize, plan: Option<&[PlannedItem]>) -> InputsRead {
        let root = &self.ctx.manifest.root;
        let digests = self.ctx.keyed(i).map_or(&[][..], |k| k.inputs.as_slice());
        let stage: Vec<Read> = self.ctx.manifest.stages[i]
            .inputs
            .iter()
            .zip(digests)
            // (A fetched input's key holds its pin, checked as it is
            // fetched; its copy is kept read-only.)
            .filter(|(input, _)| input.pinned.is_none())
            .map(|(input, digest)| Read {
                shown: input.path.to_string(),
                abs: input.path.resolve(root),
                digest: *digest,
                made: made(input.path.as_str(), |p| self.ctx.produced.contains_key(p)),
            })
            .collect();
        let foreach = self.ctx.manifest.stages[i].foreach.as_ref();
        let items = plan
            .unwrap_or_default()
            .iter()
            .filter(|p| !p.is_kept(foreach));
        let item_paths: Vec<PathBuf> = items
            .flat_map(|planned| planned.inputs.iter())
            .filter(|(path, _)| !path.starts_with('\0'))
            .map(|(path, _)| root.join(path))
            .collect();
        let paths: Vec<&Path> = stage
            .iter()
            .map(|read| read.abs.as_path())
            .chain(item_paths.iter().map(PathBuf::as_path))
            .collect();
        let stat = self.ctx.stat.subset_of(&paths);
        // (Only items need them all: a plain stage's are decided above.)
        let produced = match plan {
            Some(_) => self.ctx.produced.keys().cloned().collect(),
            None => Default::default(),
        };
        InputsRead::new(stage, root.clone(), produced, stat)
    }

    /// Whether stage `i` names image tags not resolved yet: they are then
    /// resolved on a thread of their own (a slow registry holds up neither
    /// the other stages nor Ctrl-C), and the stage is ready again once its
    /// registry has answered, errors included (fingerprinting reports them).
    pub(super) fn resolve_tags_first(&mut self, i: usize, resolving: &mut JoinSet<usize>) -> bool {
        if self.tags_resolved.contains(&i) {
            return false;
        }
        let tags = self.ctx.tags_to_resolve(i);
        if tags.is_empty() {
            return false;
        }
        self.tags_resolved.insert(i);
        let resolver = self.ctx.resolver();
        let (done, resolved) = tokio::sync::oneshot::channel::<()>();
        // A thread, not the blocking pool: an interrupted run exits
        // without waiting for a registry that does not answer.
        std::thread::spawn(move || {
            resolver.prefetch(tags.iter().map(String::as_str), false);
            let _ = done.send(());
        });
        resolving.spawn(async move {
            let _ = resolved.await;
            i
        });
        true
    }
}
