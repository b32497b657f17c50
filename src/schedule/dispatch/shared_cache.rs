//! A stage's remote lookup before it runs, and taking a remote hit as the
//! stage's result: recorded here with the remote as its origin, its
//! outputs restored, nothing run.

use super::*;

impl Dispatcher<'_, '_> {
    /// Whether stage `i`, which must run for `reason`, is looked up in the
    /// remote cache first: then the lookup goes to `lookups` and `None` is
    /// returned; the stage comes back when the remote has answered.
    /// Per-item stages are looked up item by item when they run; `--force`
    /// means run it here, and so does a built-in whose work reaches beyond
    /// its outputs (`register`), which no entry can bring back.
    pub(super) fn look_up_first(
        &mut self,
        i: usize,
        key: StageKey,
        reason: DirtyReason,
        lookups: &mut JoinSet<LookedUp>,
    ) -> Option<(StageKey, DirtyReason)> {
        let Some(remote) = self.options.remote.clone() else {
            return Some((key, reason));
        };
        let stage = &self.ctx.manifest.stages[i];
        if stage.foreach.is_some()
            || reason == DirtyReason::Forced
            || stage
                .uses
                .as_ref()
                .is_some_and(|uses| crate::builtins::effect_output(&uses.name).is_some())
            || !remote.is_up()
            || !self.looked_up.insert(i)
        {
            return Some((key, reason));
        }
        let store = self.ctx.store.clone();
        lookups.spawn(async move {
            let fetched = remote.fetch(&key.fingerprint(), &store).await;
            (i, key, reason, fetched)
        });
        None
    }

    /// Takes a verified remote entry as stage `i`'s result. `Ok(None)`: the
    /// stage is done; `Ok(Some(reason))`: its outputs could not be brought
    /// back after all, and it runs.
    pub(super) fn adopt_remote(
        &mut self,
        i: usize,
        key: &StageKey,
        fetched: Fetched,
    ) -> Result<Option<DirtyReason>, ScheduleError> {
        let started = Instant::now();
        let stage = &self.ctx.manifest.stages[i];
        let Fetched { entry, inline } = fetched;
        // Its outputs must be the stage's own, by name and path.
        if !matches!(entry.what, crate::store::shared_cache::What::Stage { .. })
            || !super::super::shared_cache::are_declared(stage, &entry.outputs)
        {
            tracing::warn!(
                "the remote cache's result for `{}` names outputs the stage does not declare; it runs here instead",
                stage.name
            );
            return Ok(Some(DirtyReason::NeverRun));
        }
        let origin = self
            .options
            .remote
            .as_ref()
            .map(|remote| format!("remote:{}", remote.url()));
        let producer = entry.producer.host.clone();
        let record = self.record_ok(
            i,
            key,
            super::record::Made {
                outputs: entry.outputs,
                inline,
                started_ms: entry.producer.started_ms,
                finished_ms: entry.producer.finished_ms,
                exit_code: entry.producer.exit_code,
                log_path: None,
                attempt: None,
                origin,
            },
        )?;
        match self.bring_back(&record.outputs) {
            Ok(Ok(_)) => {}
            Ok(Err(reason)) => return Ok(Some(reason)),
            // Its outputs cannot be written here (a full disk, say): the
            // stage runs, and fails or succeeds on its own.
            Err(error) => {
                tracing::warn!(
                    "cannot restore `{}` from the remote cache ({}); it runs here instead",
                    record.stage,
                    super::super::with_causes(&error)
                );
                return Ok(Some(DirtyReason::StoreIncomplete {
                    output: record
                        .outputs
                        .first()
                        .map(|o| o.name.clone())
                        .unwrap_or_default(),
                }));
            }
        }
        tracing::info!(stage = %record.stage, %producer, "from the remote cache");
        let producer = producer.to_string();
        self.became(
            i,
            Became::Remote {
                producer: &producer,
                elapsed: started.elapsed(),
            },
        );
        self.complete(i);
        Ok(None)
    }

    /// Queues the upload of a result this run made.
    pub(super) fn upload_result(
        &self,
        i: usize,
        key: &StageKey,
        record: &ResultRecord,
        inline: Vec<(Digest, Vec<u8>)>,
    ) {
        let Some(uploads) = &self.uploads else {
            return;
        };
        let stage = &self.ctx.manifest.stages[i];
        let producer = super::super::shared_cache::producer(
            self.ctx.manifest,
            stage,
            record.started_ms,
            record.finished_ms,
            record.exit_code,
        );
        let entry =
            super::super::shared_cache::stage_entry(&stage.name, key, &record.outputs, producer);
        uploads.send(entry, inline);
    }
}
