//! The one place that says whether a run may be answered by a fresh proof,
//! and whether one may be kept of it.

/// What of a run decides whether a fresh proof may answer it or be kept
/// of it.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    /// Every stage is selected (no targets named).
    pub every_stage: bool,
    /// A remote cache is used, named by the run or the manifest: a run
    /// with one prints what the remote did. (A proof is never kept of a
    /// manifest that names one, so none is found for it.)
    pub remote_cache: bool,
    /// `--only`: only items in one state run.
    pub only: bool,
    /// The run asks for more than bringing everything up to date quietly,
    /// which only deciding every stage gives: a line per stage (`-v`), a
    /// forced stage, a dry run, a comparison with the lock file
    /// (`--locked`), JSON, `--detach`, a batch (`--limit`), `-j 0`.
    pub asks_more: bool,
}

impl Policy {
    /// Whether a proof kept earlier may answer the run, no stage decided.
    pub fn may_answer(&self) -> bool {
        self.may_keep() && !self.asks_more
    }

    /// Whether a proof may be kept of the run, if it leaves every stage
    /// valid: it must have decided every stage, as a plain run does.
    pub fn may_keep(&self) -> bool {
        self.every_stage && !self.remote_cache && !self.only
    }
}
