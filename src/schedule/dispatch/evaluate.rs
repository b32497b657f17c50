//! A stage's turn: its [`decision`](crate::schedule::decision) acted on,
//! a fresh stage's outputs brought back from the store when the workspace
//! lost or changed them.

use super::*;

impl Dispatcher<'_, '_> {
    /// Makes the items `--force` named look never run, so that they run
    /// again: all of a forced stage's, or the ones named `STAGE/ITEM`.
    pub(super) fn forget_forced_items(
        &self,
        i: usize,
        plan: &mut [PlannedItem],
    ) -> Result<(), String> {
        if !self.options.forced.contains(&i) {
            return Ok(());
        }
        let named = self.options.forced_items.get(&i);
        // `ITEM` names an item (all its samples, in a sampled stage);
        // `ITEM#INDEX` one sample.
        let names = |key: &str, p: &PlannedItem| p.item.key == key || p.item.item_key() == key;
        if let Some(missing) =
            named.and_then(|keys| keys.iter().find(|k| !plan.iter().any(|p| names(k, p))))
        {
            return Err(format!(
                "`--force {}/{missing}` names no item of the stage",
                self.ctx.manifest.stages[i].name
            ));
        }
        for planned in plan
            .iter_mut()
            .filter(|p| named.is_none_or(|keys| keys.iter().any(|k| names(k, p))))
        {
            planned.outcome = None;
            planned.result = None;
            planned.outputs = None;
        }
        Ok(())
    }

    /// Whether `--only STATE` asks for units of per-item stage `i` that
    /// are kept in that state (a sampled stage's errors): the stage runs
    /// for them, though its result is fresh.
    fn has_units_only_wants(&self, i: usize) -> bool {
        let Some(only) = self.options.only else {
            return false;
        };
        self.ctx.item_plans.get(&i).is_some_and(|plan| {
            plan.iter().any(|p| {
                matches!(
                    (&p.outcome, only),
                    (None, Only::Pending)
                        | (Some((ItemClass::Infra, _)), Only::Infra)
                        | (Some((ItemClass::Error, _)), Only::Error)
                )
            })
        })
    }

    /// The stage's key and why it must run, or `None` if it is fresh (its
    /// outputs then match the store, restored if need be).
    pub(super) fn evaluate(
        &mut self,
        i: usize,
    ) -> Result<Option<(StageKey, DirtyReason)>, ScheduleError> {
        let started = Instant::now();
        let asked = Asked {
            forced: self.options.forced.contains(&i) || self.has_units_only_wants(i),
            upstream_pending: Vec::new(),
            predicting: false,
        };
        let decision = decide(self.ctx, i, asked)?;
        let key = match decision.key {
            Ok(key) => key,
            Err(error) => {
                self.fail(i, &error, None);
                return Ok(None);
            }
        };
        let name = &self.ctx.manifest.stages[i].name;
        tracing::debug!(stage = %name, fingerprint = %key.fingerprint(), "evaluated");
        let (record, restore) = match decision.verdict {
            Verdict::Run(reason) => {
                tracing::debug!(stage = %name, reason = %reason.summary(), "must run");
                return Ok(Some(self.must_run(i, key, reason)));
            }
            Verdict::Fresh { record, restore } => (record, restore),
        };
        // A restore that cannot be made (a full disk) fails this stage,
        // not the run: the others go on.
        let brought = match self.bring_back(&restore) {
            Ok(brought) => brought,
            Err(error) => {
                let message = format!(
                    "failed to restore its outputs: {}",
                    super::super::with_causes(&error)
                );
                self.fail(i, &message, None);
                return Ok(None);
            }
        };
        let done = match brought {
            Err(reason) => return Ok(Some(self.must_run(i, key, reason))),
            Ok(true) => {
                self.summary.counts.restored += 1;
                let restored = "outputs restored from the store".to_owned();
                self.timeline
                    .decided(i, StageState::Restored, Some(restored));
                Done::Restored
            }
            Ok(false) => {
                self.summary.counts.fresh += 1;
                self.timeline.decided(i, StageState::Fresh, None);
                Done::Fresh
            }
        };
        self.reporter.event(Event::StageEvaluated {
            stage: &self.ctx.manifest.stages[i].name,
            reason: None,
        });
        self.ctx.note_outputs(&record.outputs);
        let name = &self.ctx.manifest.stages[i].name;
        if self
            .ctx
            .latest_ok
            .get(name)
            .is_none_or(|newest| newest.id != record.id)
        {
            self.lock_changed = true;
        }
        self.used
            .insert(i, (record.fingerprint, record.outputs.clone()));
        self.reporter.event(Event::StageDone {
            stage: &self.ctx.manifest.stages[i].name,
            done,
            elapsed: started.elapsed(),
        });
        self.complete(i);
        Ok(None)
    }

    /// Stage `i` must run, for `reason`: reported as decided.
    fn must_run(
        &mut self,
        i: usize,
        key: StageKey,
        reason: DirtyReason,
    ) -> (StageKey, DirtyReason) {
        self.reporter.event(Event::StageEvaluated {
            stage: &self.ctx.manifest.stages[i].name,
            reason: Some(&reason),
        });
        (key, reason)
    }

    /// Makes the workspace copies of a fresh stage's `outputs` match the
    /// store. `Ok(true)` if anything was restored; `Err(reason)` if a stored
    /// object is damaged (found so as it is restored), so the result cannot
    /// be trusted and must be rebuilt.
    pub(super) fn bring_back(
        &mut self,
        outputs: &[OutputRecord],
    ) -> Result<Result<bool, DirtyReason>, ScheduleError> {
        let mut restored = false;
        for output in outputs {
            if self.ctx.workspace_matches(output) {
                continue;
            }
            let ledger = self.ctx.ledger.as_ref().ok_or(ScheduleError::NoLedger)?;
            match self
                .ctx
                .store
                .restore(output, &self.ctx.abs(&output.path), Some(ledger))
            {
                Ok(()) => restored = true,
                Err(StoreError::Corrupt { path, detail }) => {
                    tracing::warn!(
                        "the stored copy of `{}` cannot be restored ({}: {detail}); re-running",
                        output.path,
                        path.display()
                    );
                    return Ok(Err(DirtyReason::StoreIncomplete {
                        output: output.name.clone(),
                    }));
                }
                Err(other) => return Err(other.into()),
            }
        }
        Ok(Ok(restored))
    }
}
