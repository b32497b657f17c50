//! The item plans a fresh proof keeps, for the run after it when the proof
//! fails, and for the commands that only read (`status`, `why`, `show` …).
//!
//! A per-item stage is planned by reading its whole item list: each item
//! parsed, its fields checked, its placeholders filled and its canonical
//! text written, before its inputs are `stat`ed. When one item's input is
//! edited, all of that is the same as in the run that made the proof: the
//! manifest is byte for byte the one the proof was kept under (its key),
//! and the list is unchanged if its `stat` is. So the proof keeps, for each
//! such stage, the stage's code, the list's stat entry and each item's key,
//! canonical text and the paths it read. A run whose proof failed, or a
//! `status` under the same manifest, plans the stage from them: every
//! input is `stat`ed and every fingerprint hashed as usual; only the list
//! is not read again (at a million items, 2.7 s of `status` become 2.0).
//!
//! With `CAIRN_CHECK_FRESH_PROOF` set (as the test suite does) a stage
//! planned from a kept plan is also planned the usual way, and a
//! difference is an error.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::super::items::{Item, PlannedItem};
use super::codec::{Decoder, Encoder};
use crate::fingerprint::{Digest, StatEntry};
use crate::store::{ItemOutcomes, Ledger};

/// One per-item stage's plan as a proof keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptPlan {
    pub stage: String,
    /// The fingerprint of the stage's code (its template) it was planned by.
    pub code: Digest,
    /// The item list, and the entry its digest was vouched for by.
    pub list: PathBuf,
    pub list_entry: StatEntry,
    pub items: Vec<KeptItem>,
}

/// One item of a kept plan: what its fingerprint hashes but its inputs'
/// digests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptItem {
    pub key: String,
    pub canonical: Arc<str>,
    /// The paths it reads (relative to the root), in order.
    pub paths: Vec<String>,
}

impl KeptItem {
    pub fn of(planned: &PlannedItem) -> Self {
        Self {
            key: planned.item.key.clone(),
            canonical: planned.item.canonical.clone(),
            paths: planned
                .inputs
                .iter()
                .map(|(path, _)| path.clone())
                .collect(),
        }
    }

    /// The item, and the paths it reads.
    pub fn into_item(self) -> (Item, Vec<String>) {
        let item = Item {
            key: self.key,
            canonical: self.canonical,
            sample: None,
        };
        (item, self.paths)
    }
}

impl KeptPlan {
    /// Whether this plan can stand for reading the list at `list` again
    /// for a stage whose code is `code`: the same code, the same list,
    /// unchanged since (and not written within a tick of being vouched
    /// for). With the list's stat now, for the proof the run may make.
    pub fn still_holds(&self, code: &Digest, list: &Path) -> Option<std::fs::Metadata> {
        if self.code != *code {
            return None;
        }
        self.list_as_seen(list)
    }

    /// `list`'s stat now, if it is this plan's list as the plan saw it
    /// (and was not written within a tick of being seen).
    fn list_as_seen(&self, list: &Path) -> Option<std::fs::Metadata> {
        if self.list != list || self.list_entry.racy() {
            return None;
        }
        let now = std::fs::metadata(list).ok()?;
        self.list_entry.matches(&now).then_some(now)
    }
}

/// Outcomes of stages' items read ahead, by stage, under the stage code
/// they were read for.
pub type OutcomesRead = HashMap<String, (Digest, ItemOutcomes)>;

/// The plans kept under a key, and the outcomes of their stages being read
/// meanwhile.
pub struct ReadAhead {
    /// The plans, encoded (decoded once the manifest is parsed)...
    pub plans: Vec<u8>,
    /// ...and their item lists, their items left unread.
    pub lists: Vec<KeptPlan>,
    /// The outcomes of each plan's stage under the plan's code, read on a
    /// thread of its own (`None`: no plan, or no thread).
    pub outcomes: Option<JoinHandle<OutcomesRead>>,
}

impl ReadAhead {
    /// The plans kept under `key`, read through `reader`, which then reads
    /// their stages' outcomes on a thread of its own.
    pub fn start(reader: Ledger, key: &[u8]) -> Self {
        let plans = reader.kept_plans(key).ok().flatten().unwrap_or_default();
        let lists = self::lists(&plans).unwrap_or_default();
        let wanted: Vec<(String, Digest)> = lists
            .iter()
            .map(|plan| (plan.stage.clone(), plan.code))
            .collect();
        // (What is not read ahead is read when the stage is planned.)
        let outcomes = (!wanted.is_empty())
            .then(|| {
                std::thread::Builder::new()
                    .name("cairn-outcomes".to_owned())
                    .spawn(move || {
                        wanted
                            .into_iter()
                            .filter_map(|(stage, code)| {
                                let outcomes = reader.item_outcomes(&stage, &code).ok()?;
                                Some((stage, (code, outcomes)))
                            })
                            .collect()
                    })
                    .ok()
            })
            .flatten();
        Self {
            plans,
            lists,
            outcomes,
        }
    }

    /// The outcomes read ahead (none if their thread failed: they are read
    /// when the stages are planned).
    pub fn outcomes(&mut self) -> OutcomesRead {
        self.outcomes
            .take()
            .and_then(|thread| thread.join().ok())
            .unwrap_or_default()
    }
}

/// Kept plans as the ledger holds them: each stage's items in a block of
/// their own, so that the lists can be read without them.
pub fn encode(plans: &[KeptPlan]) -> Vec<u8> {
    let mut out = Encoder(Vec::new());
    out.u64(plans.len() as u64);
    for plan in plans {
        out.text(&plan.stage);
        out.0.extend_from_slice(plan.code.as_bytes());
        out.path(&plan.list);
        out.stat_entry(&plan.list_entry);
        let mut items = Encoder(Vec::new());
        items.u64(plan.items.len() as u64);
        for item in &plan.items {
            items.text(&item.key);
            items.text(&item.canonical);
            items.u64(item.paths.len() as u64);
            for path in &item.paths {
                items.text(path);
            }
        }
        out.bytes(&items.0);
    }
    out.0
}

/// The plans `bytes` encode; `None` for anything else.
#[cfg(test)]
pub fn decode(bytes: &[u8]) -> Option<Vec<KeptPlan>> {
    read_plans(bytes)?.into_iter().map(with_items).collect()
}

/// The plans `bytes` encode whose item lists are as they saw them (and
/// not written within a tick of it): the only ones that can serve. The
/// others' items are not decoded. `None` if `bytes` are not plans.
pub fn decode_unchanged(bytes: &[u8]) -> Option<Vec<KeptPlan>> {
    read_plans(bytes)?
        .into_iter()
        .filter(|(plan, _)| plan.list_as_seen(&plan.list).is_some())
        .map(with_items)
        .collect()
}

/// The item lists of the plans `bytes` encode, their items left unread;
/// `None` for anything else.
pub fn lists(bytes: &[u8]) -> Option<Vec<KeptPlan>> {
    let plans = read_plans(bytes)?;
    Some(plans.into_iter().map(|(plan, _)| plan).collect())
}

/// The plans `bytes` encode, each with its items left undecoded in the
/// block beside it.
fn read_plans(bytes: &[u8]) -> Option<Vec<(KeptPlan, &[u8])>> {
    let mut d = Decoder(bytes);
    let plans = (0..d.count()?)
        .map(|_| {
            let plan = KeptPlan {
                stage: d.text()?,
                code: d.digest()?,
                list: d.path()?,
                list_entry: d.stat_entry()?,
                items: Vec::new(),
            };
            Some((plan, d.bytes()?))
        })
        .collect::<Option<Vec<_>>>()?;
    d.0.is_empty().then_some(plans)
}

/// `plan` with its items decoded from `items`; `None` if they cannot be.
fn with_items((plan, items): (KeptPlan, &[u8])) -> Option<KeptPlan> {
    let mut d = Decoder(items);
    let items = (0..d.count()?)
        .map(|_| {
            let key = d.text()?;
            let canonical = Arc::from(d.text()?);
            let paths = (0..d.count()?)
                .map(|_| d.text())
                .collect::<Option<Vec<_>>>()?;
            Some(KeptItem {
                key,
                canonical,
                paths,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    d.0.is_empty().then_some(KeptPlan { items, ..plan })
}

/// Whether `list`, the item list of `stage`, is as a kept plan of `kept`
/// saw it: checked then (by the run that kept it, under the same
/// manifest), it need not be checked again.
pub fn list_unchanged(kept: &[KeptPlan], stage: &str, list: &Path) -> bool {
    kept.iter()
        .find(|plan| plan.stage == stage)
        .is_some_and(|plan| plan.list_as_seen(list).is_some())
}

/// Where a stage planned from a kept plan differs from the same stage
/// planned the usual way, if it does (for `CAIRN_CHECK_FRESH_PROOF`).
pub fn difference(kept: &[PlannedItem], usual: &[PlannedItem]) -> Option<String> {
    if kept.len() != usual.len() {
        return Some(format!("{} items kept, {} listed", kept.len(), usual.len()));
    }
    kept.iter().zip(usual).find_map(|(a, b)| {
        let same = a.item.key == b.item.key
            && a.item.canonical == b.item.canonical
            && a.inputs == b.inputs
            && a.fingerprint == b.fingerprint
            && a.attempts_before == b.attempts_before;
        (!same).then(|| format!("item `{}` (listed: `{}`)", a.item.key, b.item.key))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_plans_read_back_as_they_were_written_and_a_cut_body_as_nothing() {
        let plans = vec![KeptPlan {
            stage: "oracle".to_owned(),
            code: Digest::of(b"code"),
            list: PathBuf::from("/w/items.jsonl"),
            list_entry: StatEntry {
                dev: 1,
                ino: 2,
                size: 3,
                mtime_ns: 4,
                ctime_ns: 5,
                digest: Digest::of(b"list"),
                seen_ns: 6,
            },
            items: vec![
                KeptItem {
                    key: "a".to_owned(),
                    canonical: Arc::from(r#"{"id":"a","src":"in/a"}"#),
                    paths: vec!["in/a".to_owned(), "shared.json".to_owned()],
                },
                KeptItem {
                    key: "b".to_owned(),
                    canonical: Arc::from(r#"{"id":"b"}"#),
                    paths: Vec::new(),
                },
            ],
        }];
        let bytes = encode(&plans);
        assert_eq!(decode(&bytes), Some(plans.clone()));
        let mut without_items = plans.clone();
        without_items[0].items.clear();
        assert_eq!(lists(&bytes), Some(without_items));
        for cut in [1, bytes.len() / 2, bytes.len() - 1] {
            assert_eq!(decode(&bytes[..cut]), None, "cut at {cut}");
        }
        assert_eq!(decode(&encode(&[])), Some(Vec::new()));
    }

    #[test]
    fn only_the_plans_whose_list_is_unchanged_are_decoded() {
        let dir = tempfile::tempdir().unwrap();
        let list = dir.path().join("items.jsonl");
        std::fs::write(&list, "{\"id\":\"a\"}\n").unwrap();
        let meta = std::fs::metadata(&list).unwrap();
        let seen = |after_ns: i64| {
            let entry = StatEntry::new(&meta, Digest::of(b"list"), 0);
            StatEntry {
                seen_ns: entry.mtime_ns.max(entry.ctime_ns) + after_ns,
                ..entry
            }
        };
        let plan = |stage: &str, list_entry: StatEntry| KeptPlan {
            stage: stage.to_owned(),
            code: Digest::of(b"code"),
            list: list.clone(),
            list_entry,
            items: vec![KeptItem {
                key: "a".to_owned(),
                canonical: Arc::from(r#"{"id":"a"}"#),
                paths: Vec::new(),
            }],
        };
        let plans = vec![
            plan("held", seen(3_000_000_000)),
            // Seen within a tick of being written: a later write could
            // have kept its stat.
            plan("racy", seen(0)),
            // Seen at another size.
            plan(
                "edited",
                StatEntry {
                    size: meta.len() + 1,
                    ..seen(3_000_000_000)
                },
            ),
        ];
        let mut bytes = encode(&plans);
        assert_eq!(decode_unchanged(&bytes), Some(vec![plans[0].clone()]));
        // The items of a plan that cannot serve are not read: damaged,
        // they do not matter...
        let last = bytes
            .windows(10)
            .rposition(|w| w == br#"{"id":"a"}"#)
            .unwrap();
        bytes[last] = 0xff;
        assert_eq!(decode_unchanged(&bytes), Some(vec![plans[0].clone()]));
        assert_eq!(decode(&bytes), None);
        // ...but the items of one that can serve are.
        let first = bytes
            .windows(10)
            .position(|w| w == br#"{"id":"a"}"#)
            .unwrap();
        bytes[first + 1] = 0xff;
        assert_eq!(decode_unchanged(&bytes), None);
        // Once the list is written again, none serves.
        std::fs::write(&list, "{\"id\":\"bb\"}\n").unwrap();
        assert_eq!(decode_unchanged(&encode(&plans)), Some(Vec::new()));
    }
}
