//! Events the scheduler emits; reporters (human progress, JSON) consume
//! them. The library never prints.

use std::path::Path;
use std::time::Duration;

use super::decision::DirtyReason;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Done {
    /// A valid result existed; nothing ran.
    Fresh,
    /// A valid result existed; its outputs were rewritten from the store.
    Restored,
    /// The command ran and its result was recorded.
    Ran,
    /// A remote cache held a valid result made elsewhere; its outputs were
    /// brought here and nothing ran.
    Remote,
}

#[derive(Debug)]
pub enum Event<'a> {
    RunStarted {
        run_id: i64,
        /// Selected stages.
        stages: usize,
        /// BLAKE3 of the manifest's text.
        manifest_digest: &'a str,
    },
    /// A selected stage's turn came: it is fresh (`reason` none) or must
    /// run (a fresh stage may still be restored; one that must run may
    /// still come from the remote cache).
    StageEvaluated {
        stage: &'a str,
        reason: Option<&'a DirtyReason>,
    },
    /// A stage that must run was handed to its task (which waits for a job
    /// slot). For a per-item stage: its items, and how many of them are
    /// already done.
    StageStarted {
        stage: &'a str,
        reason: &'a DirtyReason,
        items: Option<(usize, usize)>,
    },
    StageDone {
        stage: &'a str,
        done: Done,
        elapsed: Duration,
    },
    StageFailed {
        stage: &'a str,
        message: &'a str,
        log: Option<&'a Path>,
    },
    /// A per-item stage left items for a later run (`--limit`, `--only`).
    StagePartial {
        stage: &'a str,
        message: &'a str,
    },
    /// One attempt of one item started its job (`key` empty: a plain
    /// stage's command).
    ItemStarted {
        stage: &'a str,
        key: &'a str,
        attempt: u32,
    },
    /// One attempt of one item ended (`key` empty: a plain stage's
    /// command, to be retried).
    ItemFinished {
        stage: &'a str,
        key: &'a str,
        class: &'a str,
        attempt: u32,
    },
    /// The run ended before this stage did: it was running when the run was
    /// interrupted (`interrupted`), or never started because the run
    /// stopped first (not `interrupted`).
    StageCutShort {
        stage: &'a str,
        interrupted: bool,
    },
    /// An upstream stage failed, so this one was not attempted.
    StageBlocked {
        stage: &'a str,
        by: &'a str,
    },
    Interrupted,
}

pub trait Reporter {
    fn event(&mut self, event: Event<'_>);
}
