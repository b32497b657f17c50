//! What a run did with each stage it selected, and when: kept as the run
//! goes, written to the ledger's `stage_runs` when it closes.

use std::collections::HashMap;

use crate::manifest::Manifest;
use crate::store::{StageRun, now_ms};

/// What a run records of the manifest it ran: BLAKE3 of its text.
pub fn manifest_digest(manifest: &Manifest) -> String {
    crate::fingerprint::Digest::of(manifest.source.as_bytes()).hex()
}

/// How a selected stage ended in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StageState {
    /// Its command ran and its result was recorded.
    Ran,
    /// A valid result existed; nothing ran.
    Fresh,
    /// A valid result existed; its outputs were brought back from the store.
    Restored,
    /// A remote cache held a valid result; nothing ran.
    Remote,
    Failed,
    /// A per-item stage left items for a later run.
    Partial,
    /// An upstream stage did not complete.
    Blocked,
    /// The run stopped (a failure elsewhere) before it started.
    Stopped,
    /// It was running when the run was interrupted.
    Interrupted,
}

impl StageState {
    pub fn name(self) -> &'static str {
        match self {
            StageState::Ran => "ran",
            StageState::Fresh => "fresh",
            StageState::Restored => "restored",
            StageState::Remote => "remote",
            StageState::Failed => "failed",
            StageState::Partial => "partial",
            StageState::Blocked => "blocked",
            StageState::Stopped => "stopped",
            StageState::Interrupted => "interrupted",
        }
    }
}

/// The state of a stage not ended yet. None is written as it is: a run
/// that closes with stages still so (it stopped on an error) records them
/// `interrupted` if they had started, else `stopped`.
const RUNNING: &str = "running";

pub struct Timeline {
    /// Per stage index; `None` for stages the run did not select.
    spans: Vec<Option<StageRun>>,
    order: Vec<usize>,
    index: HashMap<String, usize>,
}

impl Timeline {
    /// A timeline of the `selected` stages, in `order` (topological).
    pub fn new(manifest: &Manifest, selected: &[bool], order: &[usize]) -> Self {
        let host = super::shared_cache::host_name();
        let spans = manifest
            .stages
            .iter()
            .zip(selected)
            .map(|(stage, &selected)| {
                selected.then(|| StageRun::new(&stage.name, RUNNING, &stage.executor_name(), &host))
            })
            .collect();
        let index = manifest
            .stages
            .iter()
            .enumerate()
            .map(|(i, stage)| (stage.name.clone(), i))
            .collect();
        Self {
            spans,
            order: order.to_vec(),
            index,
        }
    }

    fn span(&mut self, i: usize) -> Option<&mut StageRun> {
        self.spans.get_mut(i).and_then(Option::as_mut)
    }

    /// Every selected upstream stage of `i` has its outputs hashed (or was
    /// decided without running).
    pub fn ready(&mut self, i: usize) {
        if let Some(span) = self.span(i) {
            span.ready_ms.get_or_insert(now_ms());
        }
    }

    /// Stage `i` must run, for `reason`.
    pub fn must_run(&mut self, i: usize, reason: String) {
        if let Some(span) = self.span(i) {
            span.reason = Some(reason);
        }
    }

    /// Stage `i` started at `at_ms`, unless it is known to have started
    /// earlier.
    pub fn started(&mut self, i: usize, at_ms: i64) {
        if let Some(span) = self.span(i) {
            span.started_ms.get_or_insert(at_ms);
        }
    }

    /// A command of `stage` (its own, or one of its items') started its
    /// job at `at_ms`: the stage started then, if no earlier one did.
    pub fn command_started(&mut self, stage: &str, at_ms: i64) {
        if let Some(&i) = self.index.get(stage) {
            self.started(i, at_ms);
        }
    }

    /// Stage `i`'s outputs are hashed.
    pub fn hashed(&mut self, i: usize) {
        if let Some(span) = self.span(i) {
            span.hashed_ms = Some(now_ms());
        }
    }

    /// Stage `i` was decided without running: it starts and ends now.
    pub fn decided(&mut self, i: usize, state: StageState, reason: Option<String>) {
        let now = now_ms();
        if let Some(span) = self.span(i) {
            span.started_ms.get_or_insert(now);
            span.reason = reason.or(span.reason.take());
        }
        self.ended(i, state, None);
    }

    /// Stage `i` ended in `state`, for `message` (a failure, what blocked
    /// it) if any.
    pub fn ended(&mut self, i: usize, state: StageState, message: Option<String>) {
        if let Some(span) = self.span(i) {
            span.state = state.name().to_owned();
            span.message = message;
            if !matches!(state, StageState::Blocked | StageState::Stopped) {
                span.finished_ms = Some(now_ms());
            }
        }
    }

    /// The run was interrupted: every stage in `running` that has not
    /// ended is interrupted now.
    pub fn interrupted(&mut self, running: impl IntoIterator<Item = usize>) {
        for i in running {
            if self.span(i).is_some_and(|span| span.state == RUNNING) {
                self.ended(i, StageState::Interrupted, None);
            }
        }
    }

    /// The selected stages, in topological order.
    pub fn rows(&self) -> Vec<StageRun> {
        self.order
            .iter()
            .filter_map(|&i| self.spans.get(i).and_then(Option::clone))
            .map(|mut span| {
                if span.state == RUNNING {
                    let state = if span.started_ms.is_some() {
                        StageState::Interrupted
                    } else {
                        StageState::Stopped
                    };
                    span.state = state.name().to_owned();
                }
                span
            })
            .collect()
    }
}
