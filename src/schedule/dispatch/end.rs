//! The run's end: the stages never finished accounted for, the stat cache
//! and the lock file kept, the run closed, and the fresh proof kept. What
//! of it can be made before the last commands end is made while they run
//! ([`Dispatcher::draft_end`]): nothing is left to start then, and for a
//! thousand stages the lock file and the proof took longer than a short
//! command.

use super::*;
use crate::schedule::proof::kept_history;
use crate::schedule::proof::kept_plans::{self, KeptPlan};
use crate::schedule::proof::{self, ProofDraft};
use crate::store::RenderedStages;

/// The end of a run made ahead (see [`Dispatcher::draft_end`]).
pub(super) struct EndDraft<'m> {
    /// The stages whose results were known then.
    drafted: Vec<bool>,
    /// Their entries in the lock file (until it is taken), with their lines
    /// rendered.
    lock: Option<LockFile>,
    rendered: RenderedStages,
    /// Their part of the proof, if this run may keep one and it could be
    /// drafted.
    proof: Option<ProofDraft<'m>>,
}

impl Dispatcher<'_, '_> {
    /// Settles the run (see [`Self::settle`]) and closes it (as failed if
    /// settling fails).
    pub(super) fn end(mut self) -> Result<RunSummary, ScheduleError> {
        if let Err(error) = self.settle() {
            self.close_as_failed();
            return Err(error);
        }
        let status = if self.summary.interrupted {
            "interrupted"
        } else if self.summary.failed.is_empty() {
            "ok"
        } else {
            "failed"
        };
        self.close_run(status)?;
        if status == "ok" {
            self.keep_fresh_proof();
        }
        // Every stage's record is left for the process's exit to free, as
        // `cli::run` leaves the context: freed one by one it took half a
        // millisecond.
        std::mem::forget(std::mem::take(&mut self.used));
        Ok(self.summary)
    }

    /// Keeps what this run saw, if it left every stage valid, for the next
    /// no-op to check by `stat` alone (see [`proof`]). Written
    /// after everything else the run wrote; a proof is an optimisation, so
    /// one that cannot be made or kept is only logged.
    fn keep_fresh_proof(&mut self) {
        let clean = self.summary.failed.is_empty()
            && self.summary.partial.is_empty()
            && self.summary.blocked.is_empty()
            && self.summary.stopped.is_empty()
            && self.summary.cut_short.is_empty()
            && self.summary.lock_differs.is_empty();
        if !clean || !self.may_keep_proof() {
            return;
        }
        let lock = match self.lock_text.take() {
            Some(text) => text,
            None => self.lock_to_leave().1,
        };
        let Some((proof, plans)) = self.proof(&lock) else {
            return;
        };
        let options = self.options;
        let ctx = &*self.ctx;
        let (Some(ledger), Some(key)) = (&ctx.ledger, proof::key_of(ctx.manifest)) else {
            return;
        };
        let plans = plans.map(|plans| kept_plans::encode(&plans));
        // (One kept under this key is kept, unless it was refused.)
        let manifest = match ledger.keeps_manifest(&key) {
            Ok(true) if !options.kept_manifest_refused => None,
            _ => crate::manifest::kept::encode(ctx.manifest),
        };
        let history = self.kept_history(&lock);
        let beside = KeptBeside {
            plans: plans.as_deref(),
            manifest: manifest.as_deref(),
            history: history.as_deref(),
        };
        if let Err(error) = ledger.keep_fresh_proof(&key, &proof.encode(), beside) {
            tracing::debug!("the fresh proof was not kept: {error}");
        }
    }

    /// Whether a proof may be kept of this run, if it leaves every stage
    /// valid (see [`proof::Policy`]; a manifest that names a remote cache
    /// gets none even when a run goes without it).
    fn may_keep_proof(&self) -> bool {
        let options = self.options;
        proof::Policy {
            every_stage: options.selected.iter().all(|s| *s),
            remote_cache: options.remote.is_some() || self.ctx.manifest.remote_cache.is_some(),
            only: options.only.is_some(),
            asks_more: false,
        }
        .may_keep()
    }

    /// Makes ahead what the run's end can be made of while its last
    /// commands run (nothing is left to start): the lock file's entries of
    /// the stages whose results are known, their lines rendered, and their
    /// part of the proof.
    pub(super) fn draft_end(&mut self) {
        let ctx = &*self.ctx;
        let drafted: Vec<bool> = (0..ctx.manifest.stages.len())
            .map(|i| self.used.contains_key(&i))
            .collect();
        let mut lock = LockFile::new(&ctx.manifest.name);
        record::enter_in_lock(&mut lock, ctx, &self.used, |i| drafted[i]);
        let rendered = RenderedStages::of(&lock);
        let proof = self
            .may_keep_proof()
            .then(|| {
                let order = ctx.dag.order();
                let mut proof = ProofDraft::new(ctx, order);
                let known = order.iter().copied().filter(|&i| drafted[i]);
                match proof.add_used(ctx, known, &self.used) {
                    Ok(()) => {
                        proof.sort();
                        Some(proof)
                    }
                    Err(why) => {
                        tracing::debug!("no proof drafted: {why}");
                        None
                    }
                }
            })
            .flatten();
        self.end_draft = Some(EndDraft {
            drafted,
            lock: Some(lock),
            rendered,
            proof,
        });
    }

    /// The lock file this run leaves ([`new_lock_file`]), and its text:
    /// where the end was drafted, the stages drafted are taken from the
    /// draft, their lines as they were rendered then (a stage's result
    /// used is known once, so they are still its entries).
    fn lock_to_leave(&mut self) -> (LockFile, String) {
        let ctx = &*self.ctx;
        let drafted = self
            .end_draft
            .as_mut()
            .and_then(|draft| Some((draft.lock.take()?, &draft.drafted, &draft.rendered)));
        let Some((mut lock, drafted, rendered)) = drafted else {
            let lock = new_lock_file(ctx, &self.used);
            let text = lock.render();
            return (lock, text);
        };
        record::enter_in_lock(&mut lock, ctx, &self.used, |i| !drafted[i]);
        let others: Vec<&str> = (ctx.manifest.stages.iter().enumerate())
            .filter(|(i, _)| !drafted[*i])
            .map(|(_, stage)| stage.name.as_str())
            .collect();
        let text = rendered.render_with(&lock, &others);
        (lock, text)
    }

    /// The proof of this run, whose lock file says `lock`, with the item
    /// plans to keep beside it (see [`proof::Proof::make`]); made of
    /// the draft and the stages done since, where the end was drafted.
    fn proof(&mut self, lock: &str) -> Option<(proof::Proof, Option<Vec<KeptPlan>>)> {
        let ctx = &*self.ctx;
        let order = ctx.dag.order();
        // (Without a draft, or with one that failed, perhaps for what held
        // no more by the end, the proof is made whole.)
        let Some(EndDraft {
            proof: Some(mut proof),
            drafted,
            ..
        }) = self.end_draft.take()
        else {
            return proof::Proof::make(ctx, &self.used, order, lock);
        };
        let rest = order.iter().copied().filter(|&i| !drafted[i]);
        proof
            .add_used(ctx, rest, &self.used)
            .and_then(|()| proof.finish(ctx, lock))
            .map_err(|why| tracing::debug!("no fresh proof: {why}"))
            .ok()
    }

    /// The history this run leaves, as the next run would read it (see
    /// [`kept_history`]), encoded, with the lock file's text
    /// (`lock`); `None` where that is not known here: some stage used a
    /// result other than its current one, or the lock file read before the
    /// run named a stage the manifest no longer has (whose current result
    /// was the one it named, and is now its newest).
    fn kept_history(&self, lock: &str) -> Option<Vec<u8>> {
        let ctx = &*self.ctx;
        let names: HashSet<&str> = ctx
            .manifest
            .stages
            .iter()
            .map(|s| s.name.as_str())
            .collect();
        if ctx.lock.as_ref().is_some_and(|lock| {
            lock.stages
                .keys()
                .any(|name| !names.contains(name.as_str()))
        }) {
            return None;
        }
        for (i, stage) in ctx.manifest.stages.iter().enumerate() {
            let (fingerprint, outputs) = self.used.get(&i)?;
            let current = ctx.latest_ok.get(&stage.name)?;
            if current.fingerprint != *fingerprint || current.outputs != *outputs {
                return None;
            }
        }
        // The inline objects of the current results held when the history
        // was read, and those this run recorded (in the same transaction).
        let inline_held = ctx
            .latest_ok
            .values()
            .flat_map(|record| {
                let recorded_now = record.run_id == self.run_id;
                record
                    .outputs
                    .iter()
                    .filter(move |o| o.inline && (recorded_now || ctx.held_inline(&o.digest)))
            })
            .map(|output| output.digest)
            .collect();
        // (The lock file names every stage: each used a result.)
        Some(kept_history::encode(
            lock,
            &ctx.manifest.name,
            ctx.manifest.stages.iter().map(|stage| stage.name.as_str()),
            &ctx.latest_ok,
            &ctx.latest_failure,
            &inline_held,
        ))
    }

    /// Accounts for every selected stage never finished (blocked by a
    /// failure, stopped before it started, or cut short by an interrupt),
    /// persists the stat cache and the lock file.
    fn settle(&mut self) -> Result<(), ScheduleError> {
        let manifest = self.ctx.manifest;
        for &i in self.ctx.dag.order() {
            if !self.options.selected[i] {
                continue;
            }
            let name = &manifest.stages[i].name;
            match self.slots[i] {
                Slot::Ok | Slot::Failed | Slot::Partial => continue,
                Slot::Running => {
                    self.became(i, Became::CutShort);
                    continue;
                }
                Slot::Waiting => {}
            }
            let blocked_by = self.ctx.dag.upstream(i).iter().copied().find(|&u| {
                matches!(self.slots[u], Slot::Failed | Slot::Partial)
                    || self.summary.blocked.contains(&manifest.stages[u].name)
            });
            match blocked_by {
                Some(by) if !self.summary.interrupted => {
                    let by = &manifest.stages[by].name;
                    self.became(i, Became::Blocked { by });
                }
                // Not started because a failure or an interrupt stopped the run.
                _ if self.stop || self.summary.interrupted => {
                    self.became(i, Became::Stopped);
                }
                _ => {
                    return Err(ScheduleError::Task(format!(
                        "scheduler stopped before stage `{name}` could run"
                    )));
                }
            }
        }

        // A run of every stage that looked at each of them knows every
        // path the pipeline reads and writes now.
        let looked_at_all = self.options.selected.iter().all(|s| *s)
            && self.summary.blocked.is_empty()
            && self.summary.stopped.is_empty()
            && !self.summary.interrupted;
        self.ctx.save_stat_cache(looked_at_all)?;
        // When every stage used its newest result and the lock file is
        // there, it already says what it would say now: a no-op run does not
        // rewrite it.
        if self.lock_changed || !self.ctx.manifest.lock_path().exists() {
            let (lock, text) = self.lock_to_leave();
            if self.options.locked {
                // `--locked`: the committed lock file stays as it is; the
                // stages whose entry would change are reported.
                let committed = self.ctx.lock.as_ref().map(|l| &l.stages);
                self.summary.lock_differs = lock
                    .stages
                    .iter()
                    .filter(|(name, entry)| committed.and_then(|c| c.get(*name)) != Some(*entry))
                    .map(|(name, _)| name.clone())
                    .collect();
                self.lock_text = Some(text);
            } else {
                let path = self.ctx.manifest.lock_path();
                self.lock_text = Some(LockFile::write_text(&path, text)?);
            }
            // Left for the process's exit to free: a thousand stages'
            // entries, freed one by one, took a quarter of a millisecond.
            std::mem::forget(lock);
        }
        Ok(())
    }
}
