//! A workspace's history, read while the manifest is parsed when a fresh
//! proof was read and failed: the run then decides every stage, and what
//! it decides from (the history, the item plans kept beside the proof) is
//! read ahead, under the workspace's lock.

use std::path::PathBuf;

use super::kept_plans::{self, KeptPlan, ReadAhead};
use crate::manifest::Manifest;
use crate::schedule::{History, ScheduleError};
use crate::store::{Ledger, PipelineId, WorkspaceLock};

/// A proof that was read and failed: the workspace's lock and the ledger
/// it was read from (the ledger speaking for the proof's pipeline), and
/// what the run takes on from it.
pub struct FailedProof {
    pub lock: WorkspaceLock,
    pub ledger: Ledger,
    /// The project root the proof was made for.
    pub root: PathBuf,
    /// The manifest's lock file, as the proof's manifest path names it.
    pub lock_path: PathBuf,
    /// The key of the proof, when it was checked and failed: what the
    /// item plans kept beside it are kept under.
    pub key: Option<[u8; 32]>,
    /// The history kept beside the proof, encoded (see
    /// [`super::kept_history`]).
    pub kept_history: Option<Vec<u8>>,
}

/// A workspace's history read on a thread of its own (see [`History`]),
/// for the pipeline and lock file of a proof that failed, with the item
/// plans kept beside that proof. The thread reads under the workspace's
/// lock: the lock is let go only after it is done.
pub struct EarlyHistory {
    /// What it was read for: a project root, a pipeline, a lock file, and
    /// the manifest's key (its bytes, path, profile: see
    /// [`proof::key`]).
    root: PathBuf,
    pipeline: PipelineId,
    lock_path: PathBuf,
    key: Option<[u8; 32]>,
    reading: Option<std::thread::JoinHandle<Result<History, ScheduleError>>>,
    kept: Option<ReadAhead>,
    /// Whether the plans were kept for the manifest as parsed (asked once).
    kept_for: std::cell::OnceCell<bool>,
    lock: Option<WorkspaceLock>,
}

impl EarlyHistory {
    /// `None` (the workspace let go, for the usual way to take) if no
    /// thread can be started.
    pub fn start(failed: FailedProof) -> Option<Self> {
        let FailedProof {
            lock,
            ledger,
            root,
            lock_path,
            key,
            kept_history,
        } = failed;
        let pipeline = ledger.pipeline().clone();
        let (name, path) = (pipeline.name.clone(), lock_path.clone());
        // The kept plans and their outcomes are read through a connection
        // of their own, the history starting first.
        let reader = key.and_then(|_| ledger.another_connection().ok());
        let reading = std::thread::Builder::new()
            .name("cairn-history".to_owned())
            .spawn(move || match kept_history {
                Some(kept) => History::read_kept(&path, &name, ledger, &kept),
                None => History::read(&path, &name, Some(ledger)),
            })
            .ok()?;
        let kept = reader
            .zip(key)
            .map(|(reader, key)| ReadAhead::start(reader, &key));
        Some(Self {
            root,
            pipeline,
            lock_path,
            key,
            reading: Some(reading),
            kept,
            kept_for: std::cell::OnceCell::new(),
            lock: Some(lock),
        })
    }

    /// The item lists the kept plans saw, if they were kept for `manifest`
    /// as it was parsed (it may have been edited since the proof's check).
    pub fn kept_lists(&self, manifest: &Manifest) -> &[KeptPlan] {
        match &self.kept {
            Some(kept) if self.kept_for(manifest) => &kept.lists,
            _ => &[],
        }
    }

    /// Whether the proof the plans were kept beside was kept for
    /// `manifest`, byte for byte.
    fn kept_for(&self, manifest: &Manifest) -> bool {
        *self.kept_for.get_or_init(|| {
            let key = super::key_of(manifest);
            key.is_some() && key == self.key
        })
    }

    /// The lock, and the history if it was read for `manifest`'s root,
    /// pipeline and lock file.
    pub fn finish(
        mut self,
        manifest: &Manifest,
    ) -> (
        Option<WorkspaceLock>,
        Option<Result<History, ScheduleError>>,
    ) {
        let fits = self.root == manifest.root
            && self.pipeline == PipelineId::of(manifest)
            && self.lock_path == manifest.lock_path();
        // (Decoded here while the threads read the rest.)
        let kept_for = fits && self.kept_for(manifest);
        let (kept_plans, outcomes) = match self.kept.take() {
            Some(mut kept) if kept_for => (
                kept_plans::decode_unchanged(&kept.plans).unwrap_or_default(),
                kept.outcomes(),
            ),
            Some(mut kept) => {
                kept.outcomes();
                Default::default()
            }
            None => Default::default(),
        };
        let read = self.reading.take().map(join);
        let read =
            read.map(|read| read.map(|history| history.with_kept_plans(kept_plans, outcomes)));
        (self.lock.take(), read.filter(|_| fits))
    }
}

/// What a thread returned, its panic raised here.
fn join<T>(thread: std::thread::JoinHandle<T>) -> T {
    thread
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

impl Drop for EarlyHistory {
    /// A run that stops before it decides (a bad manifest) waits for the
    /// thread before the lock is let go.
    fn drop(&mut self) {
        if let Some(reading) = self.reading.take() {
            let _ = reading.join();
        }
        if let Some(mut kept) = self.kept.take() {
            kept.outcomes();
        }
    }
}
