//! What a run reads of its past before it decides anything.

use std::collections::HashMap;
use std::path::Path;

use super::super::ScheduleError;
use crate::fingerprint::{Digest, StatCache};
use crate::schedule::proof::kept_plans::{KeptPlan, OutcomesRead};
use crate::store::{Ledger, LockFile, ResultRecord, StoreError, current_ok};

/// What a run reads of its past before it decides anything: the lock
/// file, the stat cache and each stage's current results. It needs no
/// parsed manifest (only where its lock file is and the pipeline's name),
/// so it can be read while the manifest is parsed.
pub struct History {
    pub(super) ledger: Option<Ledger>,
    pub(super) stat: StatCache,
    pub(super) latest_ok: HashMap<String, ResultRecord>,
    pub(super) inline_held: std::collections::HashSet<Digest>,
    pub(super) latest_failure: HashMap<String, ResultRecord>,
    pub(super) lock: Option<LockFile>,
    pub(super) lock_problem: Option<StoreError>,
    pub(super) kept_plans: Vec<KeptPlan>,
    pub(super) outcomes_read: OutcomesRead,
}

impl History {
    /// Reads the lock file at `lock_path` (of pipeline `pipeline`) and,
    /// through `ledger`, what the pipeline recorded.
    pub fn read(
        lock_path: &Path,
        pipeline: &str,
        ledger: Option<Ledger>,
    ) -> Result<Self, ScheduleError> {
        let (lock, lock_problem) = match LockFile::read(lock_path, pipeline) {
            Ok(lock) => (lock, None),
            Err(problem) => (None, Some(problem)),
        };
        let (stat, latest_ok, latest_failure) = match &ledger {
            Some(ledger) => (
                StatCache::from_entries(ledger.load_stat_cache()?),
                current_ok(ledger, lock.as_ref())?,
                ledger.latest_failures()?,
            ),
            None => Default::default(),
        };
        let inline_held = match &ledger {
            Some(ledger) => {
                let wanted: Vec<Digest> = latest_ok
                    .values()
                    .flat_map(|record: &ResultRecord| &record.outputs)
                    .filter(|output| output.inline)
                    .map(|output| output.digest)
                    .collect();
                ledger.inline_objects_held(&wanted)?
            }
            None => Default::default(),
        };
        Ok(Self {
            ledger,
            stat,
            latest_ok,
            inline_held,
            latest_failure,
            lock,
            lock_problem,
            kept_plans: Vec::new(),
            outcomes_read: HashMap::new(),
        })
    }

    /// [`Self::read`], with the history a failed proof kept (see
    /// [`super::kept_history`]) taken up for all but the stat cache, if it
    /// was kept with the lock file as it is now.
    pub fn read_kept(
        lock_path: &Path,
        pipeline: &str,
        ledger: Ledger,
        kept: &[u8],
    ) -> Result<Self, ScheduleError> {
        // (The lock file's digest comes first: the rest is decoded only
        // if it is the one kept.)
        let lock_is_kept = std::fs::read(lock_path).is_ok_and(|text| {
            Some(Digest::of(&text)) == crate::schedule::proof::kept_history::lock_digest(kept)
        });
        let refused = match lock_is_kept.then(|| crate::schedule::proof::kept_history::decode(kept))
        {
            None => Err("the lock file is not the one it was kept with"),
            Some(None) => Err("it cannot be read"),
            Some(Some(kept)) if kept.lock.pipeline != pipeline => Err("it is another pipeline's"),
            Some(Some(kept)) => Ok(kept),
        };
        let kept = match refused {
            Ok(kept) => kept,
            Err(why) => {
                tracing::debug!("the kept history was not taken up: {why}");
                return Self::read(lock_path, pipeline, Some(ledger));
            }
        };
        tracing::debug!("the history was taken up as it was kept");
        let stat = match std::env::var_os(crate::schedule::proof::CHECK_VAR) {
            // Read as well, the history must be the kept one; the run goes
            // on from the kept one.
            Some(_) => {
                let read = Self::read(lock_path, pipeline, Some(ledger.another_connection()?))?;
                let as_read = crate::schedule::proof::kept_history::KeptHistory {
                    lock_digest: kept.lock_digest,
                    lock: read.lock.unwrap_or_else(|| LockFile::new("")),
                    latest_ok: read.latest_ok,
                    latest_failure: read.latest_failure,
                    inline_held: read.inline_held,
                };
                if let Some(what) =
                    crate::schedule::proof::kept_history::difference(&kept, &as_read)
                {
                    return Err(ScheduleError::Internal(format!(
                        "the history kept beside the fresh proof is not the ledger's now: {what}"
                    )));
                }
                read.stat
            }
            None => StatCache::from_entries(ledger.load_stat_cache()?),
        };
        Ok(Self {
            stat,
            ledger: Some(ledger),
            latest_ok: kept.latest_ok,
            inline_held: kept.inline_held,
            latest_failure: kept.latest_failure,
            lock: Some(kept.lock),
            lock_problem: None,
            kept_plans: Vec::new(),
            outcomes_read: HashMap::new(),
        })
    }

    /// With the item plans a failed proof kept, and the outcomes of their
    /// stages' items read ahead, by stage (under the code they were read
    /// for).
    pub fn with_kept_plans(self, kept_plans: Vec<KeptPlan>, outcomes_read: OutcomesRead) -> Self {
        Self {
            kept_plans,
            outcomes_read,
            ..self
        }
    }
}
