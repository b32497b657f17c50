//! What the items of a per-item stage write (`item_outputs`): one entry per
//! item inside a directory output, e.g. `state/tasks/{item.id}`.
//!
//! Each item's entry is stored (in `objects/`, never inline) when the item
//! reaches a final outcome, and recorded with it. Before the stage's items
//! run, entries that belong to no current item are removed, and the entries
//! of items whose outcome is reused are checked against their records and
//! restored from the store if they changed; an entry that cannot be
//! restored makes its item run again. An item's entry is removed before
//! each attempt, so a retry starts clean.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use super::ScheduleError;
use super::items::{Item, PlannedItem, fill};
use crate::fingerprint::StatCache;
use crate::manifest::{ItemClass, Stage};
use crate::store::{ObjectStore, OutputRecord, Published, StoreError, remove_path};

/// One directory output the items write into.
#[derive(Debug, Clone)]
struct OutputDir {
    name: String,
    rel: String,
    abs: PathBuf,
    template: String,
}

#[derive(Debug, Clone, Default)]
pub struct ItemOutputs {
    dirs: Vec<OutputDir>,
    /// Errors are kept outcomes (see [`Foreach::keeps`]): their entries
    /// are stored and restored as a final outcome's.
    keeps_errors: bool,
}

impl ItemOutputs {
    pub fn of(stage: &Stage, root: &std::path::Path) -> Self {
        let Some(foreach) = &stage.foreach else {
            return Self::default();
        };
        let dirs = foreach
            .item_outputs
            .iter()
            .filter_map(|o| {
                let decl = stage.outputs.iter().find(|d| d.name == o.output)?;
                Some(OutputDir {
                    name: o.output.clone(),
                    rel: decl.path.to_string(),
                    abs: decl.path.resolve(root),
                    template: o.template.clone(),
                })
            })
            .collect();
        Self {
            dirs,
            keeps_errors: foreach.keeps_errors(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.dirs.is_empty()
    }

    /// The stat cache's entries of the directories the items write into.
    pub fn stat_subset(&self, stat: &StatCache) -> StatCache {
        if self.dirs.is_empty() {
            return StatCache::default();
        }
        let dirs: Vec<&Path> = self.dirs.iter().map(|d| d.abs.as_path()).collect();
        stat.subset_under(&dirs)
    }

    /// Whether `name` is a directory the items write into.
    pub fn contains(&self, name: &str) -> bool {
        self.dirs.iter().any(|d| d.name == name)
    }

    /// The item's entries: (name, path as written, absolute path).
    pub fn paths(&self, item: &Item) -> Result<Vec<(String, String, PathBuf)>, String> {
        self.dirs
            .iter()
            .map(|dir| {
                let entry = fill(&dir.template, item)?;
                if entry.is_empty() || entry == "." || entry == ".." || entry.contains('/') {
                    return Err(format!(
                        "item output `{}` gives `{entry}` for item `{}`: not one path component",
                        dir.template, item.key
                    ));
                }
                Ok((
                    format!("{}/{entry}", dir.name),
                    format!("{}/{entry}", dir.rel),
                    dir.abs.join(&entry),
                ))
            })
            .collect()
    }

    /// Removes the item's entries, so an attempt starts clean.
    pub fn clear(&self, item: &Item) -> Result<(), ScheduleError> {
        for (_, _, abs) in self.paths(item).unwrap_or_default() {
            remove_path(&abs).map_err(|source| ScheduleError::Io { path: abs, source })?;
        }
        Ok(())
    }

    /// Before the items run: removes entries of no current item, and brings
    /// back the entries of reused items. An item whose entries cannot be
    /// brought back loses its outcome (it runs again). Returns how many
    /// entries were restored. Entries are compared through `stat`, the
    /// project's stat cache (or [`Self::stat_subset`] of it).
    pub fn prepare(
        &self,
        plan: &mut [PlannedItem],
        store: &ObjectStore,
        stat: &mut StatCache,
    ) -> Result<usize, ScheduleError> {
        let mut expected: HashSet<PathBuf> = HashSet::new();
        for planned in plan.iter() {
            for (_, _, abs) in self.paths(&planned.item).unwrap_or_default() {
                expected.insert(abs);
            }
        }
        for dir in &self.dirs {
            std::fs::create_dir_all(&dir.abs).map_err(|source| ScheduleError::Io {
                path: dir.abs.clone(),
                source,
            })?;
            let entries = std::fs::read_dir(&dir.abs).map_err(|source| ScheduleError::Io {
                path: dir.abs.clone(),
                source,
            })?;
            for entry in entries.flatten() {
                let path = entry.path();
                if !expected.contains(&path) {
                    remove_path(&path).map_err(|source| ScheduleError::Io { path, source })?;
                }
            }
        }
        let mut restored = 0;
        for planned in plan.iter_mut() {
            let restore = match self.reuse(planned, stat) {
                Reuse::AsItIs => continue,
                Reuse::Never => {
                    planned.outcome = None;
                    continue;
                }
                Reuse::Restoring(restore) => restore,
            };
            for (record, abs) in restore {
                match store.restore(record, &abs, None) {
                    Ok(()) => restored += 1,
                    Err(StoreError::Corrupt { .. } | StoreError::Io { .. }) => {
                        tracing::warn!(
                            "cannot restore `{}` of item `{}`; running it again",
                            record.path,
                            planned.item.key
                        );
                        planned.outcome = None;
                        break;
                    }
                    Err(other) => return Err(other.into()),
                }
            }
        }
        Ok(restored)
    }

    /// Where a recorded entry lives in the workspace.
    fn entry_path(&self, record: &OutputRecord) -> Option<PathBuf> {
        let dir = self
            .dirs
            .iter()
            .find(|d| record.path.starts_with(&format!("{}/", d.rel)))?;
        Some(dir.abs.join(&record.path[dir.rel.len() + 1..]))
    }

    /// What becomes of `planned`'s entries if its outcome is reused: the
    /// one judgement [`Self::prepare`] acts on and [`Self::items_to_rerun`]
    /// predicts. Entries are compared through `stat`.
    fn reuse<'p>(&self, planned: &'p PlannedItem, stat: &mut StatCache) -> Reuse<'p> {
        let Some((class, _)) = &planned.outcome else {
            return Reuse::AsItIs;
        };
        if !class.is_kept(self.keeps_errors) {
            return Reuse::AsItIs;
        }
        let records = match &planned.outputs {
            Some(records) => &records[..],
            // Recorded without entries: an ok item must write them.
            None if *class == ItemClass::Ok => return Reuse::Never,
            None => &[],
        };
        let restore: Vec<(&OutputRecord, PathBuf)> = records
            .iter()
            .filter_map(|record| Some((record, self.entry_path(record)?)))
            .filter(|(record, abs)| {
                !stat
                    .content(abs)
                    .is_ok_and(|content| content.digest() == record.digest)
            })
            .collect();
        match restore.is_empty() {
            true => Reuse::AsItIs,
            false => Reuse::Restoring(restore),
        }
    }

    /// The reused items [`Self::prepare`] will make run again: recorded
    /// `ok` without entries, or with an entry that differs from its record
    /// and whose stored copy is not intact. Reads only (for `status`).
    pub fn items_to_rerun(
        &self,
        plan: &[PlannedItem],
        store: &ObjectStore,
        stat: &mut StatCache,
    ) -> Vec<usize> {
        let mut lost = Vec::new();
        for (n, planned) in plan.iter().enumerate() {
            let unrestorable = match self.reuse(planned, stat) {
                Reuse::AsItIs => false,
                Reuse::Never => true,
                Reuse::Restoring(restore) => restore
                    .iter()
                    .any(|(record, _)| !store.verify(record, None).unwrap_or(false)),
            };
            if unrestorable {
                lost.push(n);
            }
        }
        lost
    }

    /// After an attempt with a final outcome: stores the item's entries,
    /// and gives their records and the stat entries of the files hashed.
    /// `Err(message)` if an `ok` item did not write one.
    pub async fn store(
        &self,
        item: &Item,
        class: &ItemClass,
        store: &ObjectStore,
    ) -> Result<Result<Published, String>, ScheduleError> {
        let paths = match self.paths(item) {
            Ok(paths) => paths,
            Err(message) => return Ok(Err(message)),
        };
        let present: Vec<(String, String, PathBuf)> = paths
            .iter()
            .filter(|(_, _, abs)| abs.exists())
            .cloned()
            .collect();
        if *class == ItemClass::Ok
            && let Some((_, rel, _)) = paths.iter().find(|(_, _, abs)| !abs.exists())
        {
            return Ok(Err(format!("the item did not write its output `{rel}`")));
        }
        if present.is_empty() {
            return Ok(Ok(Published::default()));
        }
        let store = store.clone();
        let published = tokio::task::spawn_blocking(move || {
            let staged = store.stage_in_objects(&present)?;
            store.publish(staged)
        })
        .await
        .map_err(|e| ScheduleError::Task(e.to_string()))??;
        Ok(Ok(published))
    }
}

/// What becomes of a reused item's entries before the items run.
enum Reuse<'p> {
    /// Nothing to do: its outcome is not reused, or its entries match.
    AsItIs,
    /// It runs again: recorded `ok` without entries.
    Never,
    /// These entries differ from their records: restored from the store
    /// (the item runs again if one cannot be).
    Restoring(Vec<(&'p OutputRecord, PathBuf)>),
}
