//! A stage's turn: its [`decision`](crate::schedule::decision) acted on,
//! a fresh stage's outputs brought back from the store when the workspace
//! lost or changed them.

use super::*;

impl Dispatcher<'_, '_> {
    /// Makes the items `--force` named look never run, so that they run
    /// again: all of a forced stage's, or the ones named `STAGE/ITEM`;
    /// under `--reverify`, the ones whose outcome was imported.
    pub(super) fn forget_forced_items(
        &self,
        i: usize,
        plan: &mut [PlannedItem],
    ) -> Result<(), String> {
        if !self.options.forced.contains(&i) {
            if self.options.reverify.contains(&i) {
                return self.forget_imported_items(i, plan);
            }
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

    /// Makes the items of stage `i` whose outcome under their fingerprint
    /// was imported look never run.
    fn forget_imported_items(&self, i: usize, plan: &mut [PlannedItem]) -> Result<(), String> {
        let Some(ledger) = &self.ctx.ledger else {
            return Ok(());
        };
        let stage = &self.ctx.manifest.stages[i].name;
        let imported: HashSet<(String, Digest)> = ledger
            .imported_items(stage)
            .map_err(|error| super::super::with_causes(&error))?
            .into_iter()
            .collect();
        for planned in plan.iter_mut().filter(|p| {
            p.outcome.is_some() && imported.contains(&(p.item.key.clone(), p.fingerprint))
        }) {
            planned.outcome = None;
            planned.result = None;
            planned.outputs = None;
        }
        Ok(())
    }

    /// The stage's key and why it must run, or `None` if it is fresh (its
    /// outputs then match the store, restored if need be).
    pub(super) fn evaluate(
        &mut self,
        i: usize,
    ) -> Result<Option<(StageKey, DirtyReason)>, ScheduleError> {
        let started = Instant::now();
        let asked = Asked {
            forced: self.options.forced.contains(&i) || self.options.reverify.contains(&i),
            only: self.options.only,
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
        let restored = match brought {
            Err(reason) => return Ok(Some(self.must_run(i, key, reason))),
            Ok(restored) => restored,
        };
        self.became(i, Became::Evaluated { reason: None });
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
        let elapsed = started.elapsed();
        self.became(
            i,
            match restored {
                true => Became::Restored { elapsed },
                false => Became::Fresh { elapsed },
            },
        );
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
        self.became(
            i,
            Became::Evaluated {
                reason: Some(&reason),
            },
        );
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
        if outputs.is_empty() {
            return Ok(Ok(false));
        }
        let ledger = self.ctx.ledger.as_ref().ok_or(ScheduleError::NoLedger)?;
        // (The decision compared each with its workspace copy already.)
        for output in outputs {
            match self
                .ctx
                .store
                .restore(output, &self.ctx.abs(&output.path), Some(ledger))
            {
                Ok(()) => {}
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
        Ok(Ok(true))
    }
}
