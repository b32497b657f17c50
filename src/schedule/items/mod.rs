//! The items of a per-item (`foreach`) stage: reading the item list,
//! filling `{item.FIELD}` placeholders, and each item's state.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde::Serialize;

use crate::fingerprint::{Digest, DigestHashed};
use crate::manifest::ItemClass;

mod fill;
mod list;
#[cfg(test)]
mod tests;

pub(super) use fill::field;
pub use fill::*;
pub use list::*;

/// One item of the list; in a sampled stage, one sample of one item (a
/// unit of its own, keyed `KEY#INDEX`).
///
/// An item is held as its canonical JSON only (its samples share it), not
/// as a parsed value beside it: that would be most of the memory of a
/// large pool. [`Item::value`] parses it when its fields are needed.
#[derive(Debug, Clone)]
pub struct Item {
    pub key: String,
    /// Canonical JSON (sorted keys), which enters the item's fingerprint.
    pub canonical: Arc<str>,
    /// Boxed: most items are not samples, and a million of them are held.
    pub sample: Option<Box<Sample>>,
}

/// Which sample of which item a unit of a sampled stage is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// The item's own key.
    pub item: String,
    /// 0 to k − 1.
    pub index: u32,
    /// What it is drawn with: the stage's seed plus the index, or, once
    /// drawn anew, a seed derived from those and the draw.
    pub seed: u64,
    /// Times it was drawn anew (`cairn resample`): each draw is a unit of
    /// its own to the ledger.
    pub draw: u32,
}

impl Item {
    /// Sample `index` of this item, drawn for the `draw`-th time: first
    /// with `base_seed + index`, then with a seed of its own per re-draw
    /// (the same seed would draw the same sample from a seeded harness).
    pub fn sample(&self, index: u32, base_seed: u64, draw: u32) -> Item {
        let seed = if draw == 0 {
            base_seed.wrapping_add(u64::from(index))
        } else {
            let mut hasher = blake3::Hasher::new();
            hasher.update(b"cairn.redraw\0");
            hasher.update(&base_seed.to_le_bytes());
            hasher.update(&index.to_le_bytes());
            hasher.update(&draw.to_le_bytes());
            let bytes = hasher.finalize();
            // Below 2^31: every harness takes it (numpy, torch, random).
            u64::from(
                u32::from_le_bytes([
                    bytes.as_bytes()[0],
                    bytes.as_bytes()[1],
                    bytes.as_bytes()[2],
                    bytes.as_bytes()[3],
                ]) >> 1,
            )
        };
        Item {
            key: format!("{}#{index}", self.key),
            canonical: self.canonical.clone(),
            sample: Some(Box::new(Sample {
                item: self.key.clone(),
                index,
                seed,
                draw,
            })),
        }
    }

    /// The item's fields, parsed from its canonical text. That text is
    /// cairn's own writing of a value it parsed (floats read exactly, so it
    /// reads back as that value); should it ever not parse, the item has
    /// no fields (its placeholders then fail it) and the error is logged.
    pub fn value(&self) -> serde_json::Value {
        serde_json::from_str(&self.canonical).unwrap_or_else(|e| {
            tracing::error!(
                "item `{}`: its canonical text does not read back: {e}",
                self.key
            );
            serde_json::Value::Null
        })
    }

    /// The key of the item itself (a sample's item's).
    pub fn item_key(&self) -> &str {
        self.sample.as_ref().map_or(&self.key, |s| &s.item)
    }

    /// What a sample adds to what its item's fingerprint hashes: its
    /// index, seed and draw, under a name no path can have.
    pub fn sample_input(&self) -> Option<(String, Digest)> {
        let sample = self.sample.as_ref()?;
        let text = format!(
            "sample\0{}\0seed\0{}\0draw\0{}",
            sample.index, sample.seed, sample.draw
        );
        Some(("\0sample".to_owned(), Digest::of(text.as_bytes())))
    }
}

/// An item with its current fingerprint and what the ledger knows of it.
#[derive(Debug, Clone)]
pub struct PlannedItem {
    pub item: Item,
    pub fingerprint: Digest,
    /// The image it runs in, pinned (`REPO@sha256:…`), when its executor
    /// takes each item's image from the item.
    pub image: Option<Box<str>>,
    /// The fingerprint of the stage's code (its template) it is run by:
    /// one for all the stage's items, held once.
    pub code: Arc<Digest>,
    /// The newest outcome under this fingerprint, and how many attempts.
    pub outcome: Option<(ItemClass, u32)>,
    /// Attempts under this fingerprint that ended (those with an outcome
    /// and those cancelled); the next is this + 1. Unlike `outcome`, kept
    /// when `--force` forgets the outcome, so a forced attempt gets a name
    /// of its own.
    pub attempts_before: u32,
    /// The JSON result recorded with that outcome (`item_result`).
    /// (Boxed, as `sample` is: a million items are held at once.)
    pub result: Option<Box<serde_json::Value>>,
    /// What the item wrote (`item_outputs`), as recorded with that outcome.
    pub outputs: Option<Box<[crate::store::OutputRecord]>>,
    /// The digests of what it reads (with its image), as its fingerprint
    /// hashed them: the rest of the fingerprint's pre-image.
    pub inputs: Box<[(String, Digest)]>,
}

impl PlannedItem {
    /// Whether its outcome is kept by its stage (`foreach`): reused, not
    /// run again (see [`Foreach::keeps`]).
    pub fn is_kept(&self, foreach: Option<&crate::manifest::Foreach>) -> bool {
        let errors_kept = foreach.is_some_and(crate::manifest::Foreach::keeps_errors);
        self.outcome
            .as_ref()
            .is_some_and(|(class, _)| class.is_kept(errors_kept))
    }
}

/// A stage's planned items found by fingerprint, through the first eight
/// bytes of each (BLAKE3 output already): a million items' index takes
/// 36 MB where one keyed by whole digests took 86. Items whose first
/// eight bytes another shares are looked through one by one.
pub(super) struct PlanIndex {
    first: HashMap<u64, usize, DigestHashed>,
    shared: Vec<usize>,
}

impl PlanIndex {
    pub(super) fn of(planned: &[PlannedItem]) -> Self {
        let mut first = HashMap::with_capacity_and_hasher(planned.len(), DigestHashed);
        let mut shared = Vec::new();
        for (n, p) in planned.iter().enumerate() {
            // (Of two with one fingerprint, the later is found, as before.)
            if let Some(earlier) = first.insert(prefix(&p.fingerprint), n) {
                shared.push(earlier);
            }
        }
        Self { first, shared }
    }

    /// The place in `planned` (the items this was made of) of the item
    /// with `fingerprint`.
    pub(super) fn find(&self, planned: &[PlannedItem], fingerprint: &Digest) -> Option<usize> {
        let n = *self.first.get(&prefix(fingerprint))?;
        if planned[n].fingerprint == *fingerprint {
            return Some(n);
        }
        self.shared
            .iter()
            .copied()
            .find(|&n| planned[n].fingerprint == *fingerprint)
    }
}

fn prefix(digest: &Digest) -> u64 {
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest.as_bytes()[..8]);
    u64::from_le_bytes(first)
}

/// `planned` in the order of their keys (as `str` orders them). A million
/// keys compared whole, most of them sharing a long prefix (a repository's
/// name), took a quarter of a second: they are sorted eight bytes at a
/// time instead (a radix sort, most significant bytes first), each run of
/// keys alike so far by their next eight, and compared whole only in runs
/// of a few.
pub fn in_key_order(planned: &[PlannedItem]) -> impl Iterator<Item = &PlannedItem> {
    const FEW: usize = 16;
    let mut keyed: Vec<(u64, &PlannedItem)> = planned.iter().map(|p| (0, p)).collect();
    // (Runs still to sort, each alike in its first `depth` bytes.)
    let mut runs = vec![(0..keyed.len(), 0)];
    while let Some((range, depth)) = runs.pop() {
        let run = &mut keyed[range.clone()];
        if run.len() <= FEW || run.iter().all(|(_, p)| p.item.key.len() <= depth) {
            run.sort_unstable_by(|(_, p), (_, q)| p.item.key.cmp(&q.item.key));
            continue;
        }
        for (word, p) in run.iter_mut() {
            *word = eight_bytes_at(&p.item.key, depth);
        }
        run.sort_unstable_by_key(|(word, _)| *word);
        let mut start = range.start;
        for alike in run.chunk_by(|(a, _), (b, _)| a == b) {
            if alike.len() > 1 {
                runs.push((start..start + alike.len(), depth + 8));
            }
            start += alike.len();
        }
    }
    keyed.into_iter().map(|(_, p)| p)
}

/// The eight bytes of `key` from `depth` on, as a number that orders as
/// they do; a byte past the end counts as 0 (below any a key may hold: a
/// key that ends first sorts first, as it does whole).
fn eight_bytes_at(key: &str, depth: usize) -> u64 {
    let mut bytes = [0u8; 8];
    let rest = key.as_bytes().get(depth..).unwrap_or_default();
    let n = rest.len().min(8);
    bytes[..n].copy_from_slice(&rest[..n]);
    u64::from_be_bytes(bytes)
}

/// Counts of a per-item stage's items by state.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct ItemCounts {
    pub total: usize,
    /// In a sampled stage, how many items the `total` samples are of.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sampled_items: Option<usize>,
    pub ok: usize,
    /// Items with a final verdict, by verdict.
    pub verdicts: BTreeMap<String, usize>,
    /// Items whose last attempt failed on infrastructure (retried later).
    pub infra: usize,
    pub error: usize,
    /// Items never attempted under their current fingerprint.
    pub pending: usize,
    /// Of the items with an outcome, those whose outcome was imported
    /// (`cairn import`), not made by cairn.
    #[serde(skip_serializing_if = "is_zero")]
    pub imported: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl ItemCounts {
    pub fn of(items: &[PlannedItem]) -> Self {
        let mut counts = ItemCounts {
            total: items.len(),
            ..Default::default()
        };
        if items.iter().any(|p| p.item.sample.is_some()) {
            let keys: std::collections::HashSet<&str> =
                items.iter().map(|p| p.item.item_key()).collect();
            counts.sampled_items = Some(keys.len());
        }
        for item in items {
            match &item.outcome {
                None => counts.pending += 1,
                Some((ItemClass::Ok, _)) => counts.ok += 1,
                Some((ItemClass::Verdict(v), _)) => {
                    *counts.verdicts.entry(v.clone()).or_default() += 1
                }
                Some((ItemClass::Infra, _)) => counts.infra += 1,
                Some((ItemClass::Error, _)) => counts.error += 1,
            }
        }
        counts
    }

    /// Items without a final outcome.
    pub fn unfinished(&self) -> usize {
        self.infra + self.error + self.pending
    }

    pub fn summary(&self) -> String {
        let total = match self.sampled_items {
            Some(items) => format!("{} samples of {items} items", self.total),
            None => format!("{} items", self.total),
        };
        let mut parts = vec![total, format!("{} ok", self.ok)];
        for (verdict, n) in &self.verdicts {
            parts.push(format!("{n} {verdict}"));
        }
        if self.infra > 0 {
            parts.push(format!("{} infra", self.infra));
        }
        if self.error > 0 {
            parts.push(format!("{} error", self.error));
        }
        if self.pending > 0 {
            parts.push(format!("{} pending", self.pending));
        }
        let mut summary = parts.join(", ");
        if self.imported > 0 {
            summary.push_str(&format!("; {} outcome(s) imported", self.imported));
        }
        summary
    }
}

/// The merged results, one JSON line per item in key order: the same
/// results give the same bytes, whatever order the items finished in.
/// Each line is the canonical JSON of `{"class", "item", "key",
/// "result"}`, written from the item's canonical text as it is.
pub fn aggregate(items: &[PlannedItem]) -> Vec<u8> {
    use crate::canonical_json::{write, write_string};
    let mut out = Vec::with_capacity(items.len() * 160);
    for planned in in_key_order(items) {
        let class = planned
            .outcome
            .as_ref()
            .map_or("pending", |(c, _)| c.name());
        out.extend_from_slice(b"{\"class\":");
        write_string(class, &mut out);
        out.extend_from_slice(b",\"item\":");
        out.extend_from_slice(planned.item.canonical.as_bytes());
        out.extend_from_slice(b",\"key\":");
        write_string(&planned.item.key, &mut out);
        if let Some(result) = &planned.result {
            out.extend_from_slice(b",\"result\":");
            write(result, &mut out);
        }
        out.extend_from_slice(b"}\n");
    }
    out
}
