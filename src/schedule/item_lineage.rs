//! Provenance to the item: the outcomes of the items behind a file that a
//! per-item stage wrote (or that a freeze copied from one), back through
//! every per-item stage whose files each of them read.
//!
//! An item is found by the paths it writes: its `item_result` and its
//! entries under `item_outputs`. What it read is its `item_inputs`, with
//! the digests its fingerprint hashed today; its outcome is the one the
//! ledger holds under that fingerprint, so a chain that is shown is the
//! chain of the files as they are now. An item whose inputs changed since
//! it ran has no outcome under them, and says so.
//!
//! A chain also holds the items that judged the file's item: those that
//! read what it wrote (a static check, an oracle, each with its verdict),
//! since they decided that it is there as much as the item that made it.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet, VecDeque};

use super::ScheduleError;
use super::context::Context;
use super::items::{PlannedItem, fill};
use crate::manifest::{Manifest, OutputIndex, ProjectPath};
use crate::release::format::ITEMS_DIR;
use crate::store::{ItemInput, ItemStep};

/// Where each item's files are: path → (stage index, item index).
struct ItemFiles<'c> {
    owners: HashMap<String, (usize, usize)>,
    /// Each per-item stage's planned items, by stage (what `owners` points
    /// into).
    plans: HashMap<usize, &'c [PlannedItem]>,
}

impl<'c> ItemFiles<'c> {
    fn new(ctx: &'c Context<'c>) -> Self {
        let mut owners = HashMap::new();
        // In stage order: the first stage that writes a path owns it.
        let in_order = ctx.item_plans();
        for &(i, plan) in &in_order {
            let stage = &ctx.manifest.stages[i];
            let Some(foreach) = &stage.foreach else {
                continue;
            };
            for (j, planned) in plan.iter().enumerate() {
                if planned.item.sample.is_some() {
                    continue;
                }
                if let Some(result) = &foreach.result
                    && let Ok(path) = fill(result, &planned.item)
                {
                    owners.entry(normal(&path)).or_insert((i, j));
                }
                for entry in &foreach.item_outputs {
                    let Some(dir) = stage.outputs.iter().find(|o| o.name == entry.output) else {
                        continue;
                    };
                    if let Ok(name) = fill(&entry.template, &planned.item) {
                        owners
                            .entry(format!("{}/{name}", dir.path.as_str()))
                            .or_insert((i, j));
                    }
                }
            }
        }
        ItemFiles {
            owners,
            plans: in_order.into_iter().collect(),
        }
    }

    /// The item that wrote `path` (or the entry it lies in).
    fn owner_of(&self, path: &str) -> Option<(usize, usize)> {
        let path = ProjectPath::new(normal(path));
        path.self_and_ancestors()
            .find_map(|candidate| self.owners.get(candidate).copied())
    }

    fn planned(&self, (i, j): (usize, usize)) -> &PlannedItem {
        // (`owners` holds only places in `plans`.)
        &self.plans[&i][j]
    }
}

fn normal(path: &str) -> String {
    path.trim_start_matches("./")
        .trim_end_matches('/')
        .to_owned()
}

/// A file inside a freeze's `items/ID/` is the freeze's copy of its
/// `items` input's `ID/`: the path an item wrote.
fn through_freeze(manifest: &Manifest, path: &str) -> String {
    let path = normal(path);
    for stage in &manifest.stages {
        if stage.uses.as_ref().is_none_or(|u| u.name != "freeze") {
            continue;
        }
        let (Some(freeze), Some(items)) = (
            stage.outputs.iter().find(|o| o.name == "freeze"),
            stage.inputs.iter().find(|i| i.name == "items"),
        ) else {
            continue;
        };
        let prefix = format!("{}/{ITEMS_DIR}/", freeze.path.as_str());
        if let Some(rest) = path.strip_prefix(&prefix) {
            return format!("{}/{rest}", items.path.as_str());
        }
    }
    path
}

/// An item: (stage index, index in its stage's plan).
type At = (usize, usize);

/// Traces files to the items behind them; built once for many targets,
/// each item's step made once however many chains it is in (a
/// repository's fetch is behind every one of its tasks).
pub struct ItemTracer<'c> {
    ctx: &'c Context<'c>,
    files: ItemFiles<'c>,
    writers: OutputIndex,
    /// Each item's step, and the items that wrote what it read.
    made: RefCell<HashMap<At, (ItemStep, Vec<At>)>>,
    /// Each item's judges: the items that read what it wrote (made on
    /// first use).
    judges: RefCell<Option<HashMap<At, Vec<At>>>>,
}

impl<'c> ItemTracer<'c> {
    /// `ctx` has evaluated every stage.
    pub fn new(ctx: &'c Context<'c>) -> Self {
        ItemTracer {
            ctx,
            files: ItemFiles::new(ctx),
            writers: OutputIndex::new(&ctx.manifest.stages),
            made: RefCell::new(HashMap::new()),
            judges: RefCell::new(None),
        }
    }

    /// The items (not samples) that read a file `at` wrote, in stage and
    /// plan order.
    fn judges_of(&self, at: At) -> Vec<At> {
        let mut judges = self.judges.borrow_mut();
        let judges = judges.get_or_insert_with(|| {
            let mut by_item: HashMap<At, Vec<At>> = HashMap::new();
            for (i, plan) in self.ctx.item_plans() {
                for (j, planned) in plan.iter().enumerate() {
                    if planned.item.sample.is_some() {
                        continue;
                    }
                    let mut read: Vec<At> = planned
                        .inputs
                        .iter()
                        .filter(|(path, _)| !path.starts_with('\0'))
                        .filter_map(|(path, _)| self.files.owner_of(path))
                        .filter(|&owner| owner != (i, j))
                        .collect();
                    read.sort_unstable();
                    read.dedup();
                    for owner in read {
                        by_item.entry(owner).or_default().push((i, j));
                    }
                }
            }
            by_item
        });
        judges.get(&at).cloned().unwrap_or_default()
    }

    /// The chain of items behind `target` (a path), the item that wrote it
    /// first; empty when no item wrote it.
    pub fn trace(&self, target: &str) -> Result<Vec<ItemStep>, ScheduleError> {
        let Some(start) = self
            .files
            .owner_of(&through_freeze(self.ctx.manifest, target))
        else {
            return Ok(Vec::new());
        };
        let mut steps = Vec::new();
        let mut queue = VecDeque::from([start]);
        let mut seen = HashSet::from([start]);
        // The verdicts on the item itself; not those on its upstream (a
        // repository's fetch is read by every task of it).
        for judge in self.judges_of(start) {
            if seen.insert(judge) {
                queue.push_back(judge);
            }
        }
        while let Some(at) = queue.pop_front() {
            if !self.made.borrow().contains_key(&at) {
                let made = self.step(at)?;
                self.made.borrow_mut().insert(at, made);
            }
            let made = self.made.borrow();
            let (step, upstream) = &made[&at];
            for &u in upstream {
                if seen.insert(u) {
                    queue.push_back(u);
                }
            }
            steps.push(step.clone());
        }
        Ok(steps)
    }

    /// Item `at`'s step, and the items that wrote what it read.
    fn step(&self, at: At) -> Result<(ItemStep, Vec<At>), ScheduleError> {
        let ctx = self.ctx;
        let files = &self.files;
        let stage = &ctx.manifest.stages[at.0];
        let planned = files.planned(at);
        let mut inputs = Vec::new();
        let mut upstream = Vec::new();
        for (path, digest) in &planned.inputs {
            if path.starts_with('\0') {
                continue;
            }
            let item = files.owner_of(path);
            upstream.extend(item);
            let from = match item {
                Some((u, _)) => Some(ctx.manifest.stages[u].name.clone()),
                None => self
                    .writers
                    .producer_of(&ProjectPath::new(path.clone()))
                    .map(|(s, _)| ctx.manifest.stages[s].name.clone()),
            };
            inputs.push(ItemInput {
                path: path.clone(),
                digest: *digest,
                from,
                item: item.map(|u| files.planned(u).item.key.clone()),
            });
        }
        let attempt = match &ctx.ledger {
            Some(ledger) => ledger
                .item_attempts(&stage.name, &planned.item.key)?
                .into_iter()
                .rfind(|a| a.fingerprint == planned.fingerprint && a.class != "running"),
            None => None,
        };
        let step = ItemStep {
            stage: stage.name.clone(),
            key: planned.item.key.clone(),
            fingerprint: planned.fingerprint,
            code: *planned.code,
            class: planned
                .outcome
                .as_ref()
                .map(|(class, _)| class.name().to_owned()),
            attempts: planned.outcome.as_ref().map_or(0, |(_, n)| *n),
            run_id: attempt.as_ref().map(|a| a.run_id),
            started_ms: attempt.as_ref().map(|a| a.started_ms),
            finished_ms: attempt.as_ref().map(|a| a.finished_ms),
            origin: attempt.as_ref().and_then(|a| a.origin.clone()),
            source: (attempt.as_ref())
                .filter(|a| {
                    a.origin
                        .as_deref()
                        .is_some_and(|o| o.starts_with("import:"))
                })
                .and_then(|a| a.rule.clone()),
            log: attempt.and_then(|a| a.log_path),
            image: planned.image.as_deref().map(str::to_owned),
            fields: planned.item.value(),
            inputs,
            result: planned.result.as_deref().cloned(),
            outputs: planned
                .outputs
                .as_deref()
                .map(<[_]>::to_vec)
                .unwrap_or_default(),
        };
        Ok((step, upstream))
    }
}
