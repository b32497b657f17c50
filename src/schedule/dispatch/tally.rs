//! What became of each stage, written once: [`Dispatcher::became`] takes
//! each change of a stage's state and derives from it the run's timeline
//! (the ledger's `stage_runs`), its summary (what `run` returns) and the
//! event the reporters see. Nothing else writes what became of a stage
//! (the summary's run-wide figures, the lock file's and the uploads', are
//! the run's end's).

use super::*;

/// A change of a stage's state.
pub(super) enum Became<'e> {
    /// Every selected upstream stage of it completed (or none has).
    Ready,
    /// Its turn came: it is fresh (`reason` none) or must run.
    Evaluated { reason: Option<&'e DirtyReason> },
    /// It was decided fresh: nothing ran, nothing was restored.
    Fresh { elapsed: Duration },
    /// It was decided fresh and its outputs were restored from the store.
    Restored { elapsed: Duration },
    /// The remote cache held its result, made on `producer`.
    Remote {
        producer: &'e str,
        elapsed: Duration,
    },
    /// It must run, for `reason`...
    MustRun { reason: &'e DirtyReason },
    /// ...and its task starts (with its items and how many of them are
    /// done, for a per-item stage).
    Started {
        reason: &'e DirtyReason,
        items: Option<(usize, usize)>,
    },
    /// Its task, which ended, started at `at_ms` (unless a command of it
    /// was seen starting earlier).
    Began { at_ms: i64 },
    /// Its commands ended and its outputs are hashed: the stages that
    /// read them may start.
    Hashed { elapsed: Duration },
    /// Its result is recorded.
    Recorded,
    Failed {
        message: &'e str,
        log: Option<&'e Path>,
    },
    /// It left items for a later run.
    Partial { message: &'e str },
    /// It was running when the run was interrupted: it ends now...
    Interrupted,
    /// ...and the run, closing, counts it cut short.
    CutShort,
    /// The run stopped before it started.
    Stopped,
    /// It was not attempted: upstream `by` did not complete.
    Blocked { by: &'e str },
}

impl Dispatcher<'_, '_> {
    /// Stage `i` became what `change` says: see the module documentation.
    pub(super) fn became(&mut self, i: usize, change: Became<'_>) {
        let manifest = self.ctx.manifest;
        let stage = manifest.stages[i].name.as_str();
        let (timeline, summary) = (&mut self.timeline, &mut self.summary);
        let event = match change {
            Became::Ready => {
                timeline.ready(i);
                None
            }
            Became::Evaluated { reason } => Some(Event::StageEvaluated { stage, reason }),
            Became::Began { at_ms } => {
                timeline.started(i, at_ms);
                None
            }
            Became::Interrupted => {
                timeline.interrupted([i]);
                None
            }
            Became::Fresh { elapsed } => {
                summary.counts.fresh += 1;
                timeline.decided(i, StageState::Fresh, None);
                done(stage, Done::Fresh, elapsed)
            }
            Became::Restored { elapsed } => {
                summary.counts.restored += 1;
                let reason = "outputs restored from the store".to_owned();
                timeline.decided(i, StageState::Restored, Some(reason));
                done(stage, Done::Restored, elapsed)
            }
            Became::Remote { producer, elapsed } => {
                summary.counts.restored += 1;
                summary.from_remote.push(stage.to_owned());
                let reason = format!("from the remote cache, made on {producer}");
                timeline.decided(i, StageState::Remote, Some(reason));
                done(stage, Done::Remote, elapsed)
            }
            Became::MustRun { reason } => {
                timeline.must_run(i, reason.summary());
                None
            }
            Became::Started { reason, items } => Some(Event::StageStarted {
                stage,
                reason,
                items,
            }),
            Became::Hashed { elapsed } => {
                timeline.hashed(i);
                done(stage, Done::Ran, elapsed)
            }
            Became::Recorded => {
                summary.counts.executed += 1;
                timeline.ended(i, StageState::Ran, None);
                None
            }
            Became::Failed { message, log } => {
                summary.counts.failed += 1;
                summary.failed.push(stage.to_owned());
                timeline.ended(i, StageState::Failed, Some(message.to_owned()));
                Some(Event::StageFailed {
                    stage,
                    message,
                    log,
                })
            }
            Became::Partial { message } => {
                summary.partial.push(stage.to_owned());
                timeline.ended(i, StageState::Partial, Some(message.to_owned()));
                Some(Event::StagePartial { stage, message })
            }
            Became::CutShort => {
                // (Its timeline says so since the interrupt.)
                summary.cut_short.push(stage.to_owned());
                Some(Event::StageCutShort {
                    stage,
                    interrupted: true,
                })
            }
            Became::Stopped => {
                summary.stopped.push(stage.to_owned());
                timeline.ended(i, StageState::Stopped, None);
                Some(Event::StageCutShort {
                    stage,
                    interrupted: false,
                })
            }
            Became::Blocked { by } => {
                summary.blocked.push(stage.to_owned());
                let message = format!("upstream `{by}` did not complete");
                timeline.ended(i, StageState::Blocked, Some(message));
                Some(Event::StageBlocked { stage, by })
            }
        };
        if let Some(event) = event {
            self.reporter.event(event);
        }
    }
}

impl Dispatcher<'_, '_> {
    /// An attempt of an item (or of a plain stage's command) started or
    /// ended: a start is the stage's, if none was seen earlier.
    pub(super) fn attempt_seen(&mut self, attempt: &ItemAttempt) {
        if attempt.class == RUNNING {
            self.timeline
                .command_started(&attempt.stage, attempt.started_ms);
            self.reporter.event(Event::ItemStarted {
                stage: &attempt.stage,
                key: &attempt.key,
                attempt: attempt.attempt,
            });
        } else {
            self.reporter.event(Event::ItemFinished {
                stage: &attempt.stage,
                key: &attempt.key,
                class: &attempt.class,
                attempt: attempt.attempt,
            });
        }
    }

    /// The run is interrupted: the stages running end now.
    pub(super) fn interrupting(&mut self) {
        for i in 0..self.slots.len() {
            if self.slots[i] == Slot::Running {
                self.became(i, Became::Interrupted);
            }
        }
    }

    /// The run was interrupted: what ran was cancelled or left to adopt.
    pub(super) fn interrupted(&mut self) {
        self.summary.interrupted = true;
        self.reporter.event(Event::Interrupted);
    }
}

fn done(stage: &str, done: Done, elapsed: Duration) -> Option<Event<'_>> {
    Some(Event::StageDone {
        stage,
        done,
        elapsed,
    })
}
