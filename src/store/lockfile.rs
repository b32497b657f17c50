//! `<manifest-stem>.lock`: the committed record of validated results.
//!
//! Deterministic TOML (stages and outputs sorted by name), rewritten
//! atomically only when its content changes, so it diffs cleanly in git.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::StoreError;
use super::objects::{OutputKind, OutputRecord};
use crate::fingerprint::Digest;

pub const LOCK_FORMAT_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockFile {
    pub version: u32,
    pub pipeline: String,
    #[serde(default)]
    pub stages: BTreeMap<String, LockedStage>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockedStage {
    pub fingerprint: Digest,
    #[serde(default)]
    pub outputs: BTreeMap<String, LockedOutput>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockedOutput {
    pub path: String,
    pub kind: OutputKind,
    pub digest: Digest,
    pub size: u64,
}

impl LockFile {
    pub fn new(pipeline: &str) -> Self {
        Self {
            version: LOCK_FORMAT_VERSION,
            pipeline: pipeline.to_owned(),
            stages: BTreeMap::new(),
        }
    }

    pub fn insert(&mut self, stage: &str, fingerprint: Digest, outputs: &[OutputRecord]) {
        self.stages.insert(
            stage.to_owned(),
            LockedStage {
                fingerprint,
                outputs: outputs
                    .iter()
                    .map(|o| {
                        (
                            o.name.clone(),
                            LockedOutput {
                                path: o.path.clone(),
                                kind: o.kind,
                                digest: o.digest,
                                size: o.size,
                            },
                        )
                    })
                    .collect(),
            },
        );
    }

    pub fn render(&self) -> String {
        let body = toml::to_string(self).expect("the lock file serialises");
        format!(
            "# Written by cairn: the validated fingerprint and output digests of each stage.\n# Commit this file; `cairn status` and a collaborator's checkout compare against it.\n\n{body}"
        )
    }

    /// Writes the lock file if its content changed (temp file + rename).
    pub fn write(&self, path: &Path) -> Result<(), StoreError> {
        let text = self.render();
        if std::fs::read_to_string(path).is_ok_and(|old| old == text) {
            return Ok(());
        }
        let temp = path.with_extension("lock.tmp");
        std::fs::write(&temp, text.as_bytes()).map_err(|e| StoreError::io(&temp, e))?;
        std::fs::rename(&temp, path).map_err(|e| StoreError::io(path, e))
    }
}
