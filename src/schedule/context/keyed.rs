//! What making a stage's key learns besides the key: the digest of each
//! input, the image it runs in, and a per-item stage's items. One value
//! per stage, made by [`Context::key_of`] and read from here alone, by the
//! start of the stage's run (what its commands read, its image, its plan,
//! the jobs to cancel), by the fresh proof (what to check the workspace
//! against) and by the commands that report items.

use std::collections::HashMap;

use super::Context;
use crate::exec::PinnedImage;
use crate::fingerprint::{Digest, StatCache};
use crate::schedule::items::PlannedItem;
use crate::schedule::proof::kept_plans::KeptItem;
use crate::store::ObjectStore;

/// Stage `i`'s key, and what making it learned.
pub struct Keyed {
    /// The digest of each of its inputs, in the manifest's order: what
    /// its commands and a fresh proof check the workspace against.
    pub inputs: Vec<Digest>,
    /// A stage that runs in one image: that image, pinned (per-item
    /// images are on each [`PlannedItem`]).
    pub image: Option<PinnedImage>,
    /// A per-item stage: its items.
    pub items: Option<Items>,
}

/// A per-item stage's items, as its key planned them.
pub struct Items {
    /// The fingerprint of the stage's code (its template, before items),
    /// which every item's fingerprint builds on.
    pub code: Digest,
    pub plan: Plan,
    /// The handles of jobs a dead run left for items this plan does not
    /// want (to cancel before the stage runs).
    pub orphans: Vec<String>,
    /// The item list as `stat` saw it just before it was read, and when
    /// (`None` if it changed while it was read): what a proof keeps.
    pub list_seen: Option<(std::fs::Metadata, i64)>,
    /// Whether they were planned from the plan the last proof kept, not
    /// from the list.
    pub from_kept: bool,
}

/// Where a stage's planned items are.
pub enum Plan {
    /// Here, each with its fingerprint and recorded outcome.
    Held(Vec<PlannedItem>),
    /// Handed to the run that acts on them: each item as a proof keeps it,
    /// with the digest its fingerprint hashed of each path it reads.
    HandedOver(Vec<(KeptItem, Vec<Digest>)>),
}

impl Context<'_> {
    /// What stage `i`'s last [`key_of`](Context::key_of) learned.
    pub fn keyed(&self, i: usize) -> Option<&Keyed> {
        self.keyed.get(&i)
    }

    /// Per-item stage `i`'s items, as its last key planned them, while
    /// they are held here.
    pub fn item_plan(&self, i: usize) -> Option<&[PlannedItem]> {
        match &self.keyed(i)?.items.as_ref()?.plan {
            Plan::Held(plan) => Some(plan),
            Plan::HandedOver(_) => None,
        }
    }

    /// Per-item stage `i`'s items, held here, beside the store and the
    /// stat cache that judge what they wrote.
    pub(in crate::schedule) fn item_plan_with_store(
        &mut self,
        i: usize,
    ) -> Option<(&mut Vec<PlannedItem>, &ObjectStore, &mut StatCache)> {
        match &mut self.keyed.get_mut(&i)?.items.as_mut()?.plan {
            Plan::Held(plan) => Some((plan, &self.store, &mut self.stat)),
            Plan::HandedOver(_) => None,
        }
    }

    /// The fingerprint of per-item stage `i`'s code, as of its last key.
    pub fn item_code(&self, i: usize) -> Option<Digest> {
        Some(self.keyed(i)?.items.as_ref()?.code)
    }

    /// The items of every per-item stage whose items are held here, in
    /// stage order.
    pub fn item_plans(&self) -> Vec<(usize, &[PlannedItem])> {
        let mut plans: Vec<(usize, &[PlannedItem])> = (self.keyed.keys())
            .filter_map(|&i| Some((i, self.item_plan(i)?)))
            .collect();
        plans.sort_unstable_by_key(|(i, _)| *i);
        plans
    }

    /// Hands per-item stage `i`'s items to the run that acts on them,
    /// keeping what a fresh proof needs of them.
    pub(in crate::schedule) fn hand_over_plan(&mut self, i: usize) -> Vec<PlannedItem> {
        let Some(items) = self.keyed.get_mut(&i).and_then(|k| k.items.as_mut()) else {
            return Vec::new();
        };
        let Plan::Held(plan) = &mut items.plan else {
            return Vec::new();
        };
        let plan = std::mem::take(plan);
        let reads = plan
            .iter()
            .map(|planned| {
                let digests = planned.inputs.iter().map(|(_, digest)| *digest).collect();
                (KeptItem::of(planned), digests)
            })
            .collect();
        items.plan = Plan::HandedOver(reads);
        plan
    }

    /// Per-item stage `i`'s items, taken with all its key learned of them.
    pub(in crate::schedule) fn take_item_plan(&mut self, i: usize) -> Option<Vec<PlannedItem>> {
        match self.keyed.get_mut(&i)?.items.take()?.plan {
            Plan::Held(plan) => Some(plan),
            Plan::HandedOver(_) => None,
        }
    }

    /// Every stage's items, held or handed over: how many paths they read.
    pub(in crate::schedule) fn item_paths_read(&self) -> usize {
        (self.keyed.values())
            .filter_map(|keyed| keyed.items.as_ref())
            .map(|items| match &items.plan {
                Plan::Held(plan) => plan.iter().map(|p| p.inputs.len()).sum::<usize>(),
                Plan::HandedOver(reads) => reads.iter().map(|(item, _)| item.paths.len()).sum(),
            })
            .sum()
    }

    #[cfg(test)]
    pub(in crate::schedule) fn keep(&mut self, i: usize, keyed: Keyed) {
        self.keyed.insert(i, keyed);
    }
}

/// Keyed values by stage.
pub(super) type ByStage = HashMap<usize, Keyed>;
