//! Which result of each stage is "current": the one its lock-file entry
//! names (what the last run left in the workspace, which after a revert is
//! older than the newest result), else its newest successful one. `status`,
//! `why`, `show`, `audit`, `provenance` and `gc` all speak about these.

use std::collections::HashMap;

use super::StoreError;
use super::ledger::{Ledger, ResultRecord};
use super::lockfile::LockFile;
use crate::fingerprint::Digest;
use crate::manifest::Manifest;

pub enum Current {
    Found(ResultRecord),
    /// The lock file names a fingerprint the ledger holds no result for.
    LockedButMissing(Digest),
}

/// The current result of every stage that has one, by stage name.
pub fn current_results(
    manifest: &Manifest,
    ledger: &Ledger,
) -> Result<HashMap<String, Current>, StoreError> {
    // A lock that cannot be trusted names nothing; `audit` reports it.
    let lock = read_lock(manifest).ok().flatten();
    let latest = ledger.latest_ok_all()?;
    let mut current = HashMap::new();
    for stage in &manifest.stages {
        let locked = lock.as_ref().and_then(|l| l.stages.get(&stage.name));
        let found = match locked {
            Some(entry) => match ledger.lookup(&latest, &stage.name, &entry.fingerprint)? {
                Some(record) => Current::Found(record.into_owned()),
                None => Current::LockedButMissing(entry.fingerprint),
            },
            None => match latest.get(&stage.name) {
                Some(record) => Current::Found(record.clone()),
                None => continue,
            },
        };
        current.insert(stage.name.clone(), found);
    }
    Ok(current)
}

/// The current successful result of every stage that has one: the
/// lock file's when the ledger holds it, else the newest.
/// (`lock`: the verified lock file, if there is one that can be trusted.)
pub fn current_ok(
    ledger: &Ledger,
    lock: Option<&LockFile>,
) -> Result<HashMap<String, ResultRecord>, StoreError> {
    let mut current = ledger.latest_ok_all()?;
    let Some(lock) = lock else {
        return Ok(current);
    };
    for (stage, entry) in &lock.stages {
        let newest_is_locked = current
            .get(stage)
            .is_some_and(|newest| newest.fingerprint == entry.fingerprint);
        if !newest_is_locked && let Some(record) = ledger.find_ok(stage, &entry.fingerprint)? {
            current.insert(stage.clone(), record);
        }
    }
    Ok(current)
}

/// The manifest's lock file, verified: `Ok(None)` if there is none, an
/// error naming the problem if it cannot be trusted (unparsable, edited
/// by hand, another pipeline's, a newer format).
pub fn read_lock(manifest: &Manifest) -> Result<Option<LockFile>, StoreError> {
    LockFile::read(&manifest.lock_path(), &manifest.name)
}
