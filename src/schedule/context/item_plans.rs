//! A per-item stage's items planned: the list read (or taken from a kept
//! plan), each item's inputs read side by side, its fingerprint, and the
//! outcome the ledger holds for it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::super::ScheduleError;
use super::super::item_fields::FieldCheck;
use super::super::items::{Fields, Item, PlanIndex, PlannedItem, fill_fields, for_each_item};
use super::*;
use crate::file_stat::FileStat;
use crate::fingerprint::{Digest, item_fingerprint};
use crate::manifest::ItemClass;
use crate::manifest::{ProjectPath, is_per_item};
use crate::schedule::proof::kept_plans::KeptPlan;
use crate::store::{Draws, ItemOutcomes, key_hash};

/// A per-item stage's items, planned, and what planning them learned (see
/// [`super::Items`]).
pub(super) struct Planned {
    pub plan: Vec<PlannedItem>,
    pub orphans: Vec<String>,
    pub list_seen: Option<(std::fs::Metadata, i64)>,
    pub from_kept: bool,
}

/// The items of a per-item stage, each with its fingerprint, before their
/// outcomes are known: from the list as read (`stat`ed just before, and
/// when: `None` if it changed while it was read), or from a kept plan.
struct Listed {
    plan: Vec<PlannedItem>,
    list_seen: Option<(std::fs::Metadata, i64)>,
    from_kept: bool,
}

impl Context<'_> {
    /// The items of a per-item stage, each with its fingerprint and the
    /// outcome the ledger holds for it. The outcomes recorded under the
    /// stage's code are read on a thread of their own while the list is.
    pub(super) fn plan_items(
        &mut self,
        i: usize,
        template: &Digest,
    ) -> Result<Planned, ScheduleError> {
        let stage = &self.manifest.stages[i];
        let foreach = stage.foreach.as_ref().expect("a per-item stage");
        let (cancelled, draws) = match &self.ledger {
            Some(ledger) => (
                ledger.cancelled_attempts(&stage.name)?,
                match &foreach.samples {
                    Some(_) => ledger.draws(&stage.name)?,
                    None => Draws::default(),
                },
            ),
            None => (HashMap::new(), Draws::default()),
        };
        let read_ahead = self
            .outcomes_read
            .remove(&stage.name)
            .filter(|(code, _)| code == template);
        if let Some((_, outcomes)) = read_ahead {
            let listed = self.fingerprint_items(i, template, &cancelled, &draws)?;
            return self.with_outcomes(i, listed, outcomes);
        }
        // Read through a connection of their own, on a thread of their own,
        // while the list is read (here, if no thread can be started).
        let reader = self
            .ledger
            .as_ref()
            .and_then(|ledger| ledger.another_connection().ok());
        let stage_name = &stage.name;
        let (listed, outcomes) = std::thread::scope(|scope| {
            let reading = reader.map(|reader| {
                std::thread::Builder::new()
                    .name("cairn-outcomes".to_owned())
                    .spawn_scoped(scope, move || reader.item_outcomes(stage_name, template))
            });
            let listed = self.fingerprint_items(i, template, &cancelled, &draws);
            let outcomes = match reading {
                Some(Ok(thread)) => Some(
                    thread
                        .join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                ),
                _ => self
                    .ledger
                    .as_ref()
                    .map(|ledger| ledger.item_outcomes(stage_name, template)),
            };
            (listed, outcomes)
        });
        let outcomes = outcomes.transpose()?.unwrap_or_default();
        self.with_outcomes(i, listed?, outcomes)
    }

    /// Stage `i`'s listed items with the outcomes recorded for them, and
    /// the jobs a dead run left that the plan does not want.
    fn with_outcomes(
        &mut self,
        i: usize,
        listed: Listed,
        outcomes: ItemOutcomes,
    ) -> Result<Planned, ScheduleError> {
        let stage = &self.manifest.stages[i];
        let Listed {
            plan: mut planned,
            list_seen,
            from_kept,
        } = listed;
        if !outcomes.is_empty() {
            // Matched by fingerprint (with none recorded, no index of the
            // plan is built).
            let by_fingerprint = PlanIndex::of(&planned);
            for outcome in outcomes.iter() {
                let Some(n) = by_fingerprint
                    .find(&planned, &outcome.fingerprint)
                    .filter(|&n| key_hash(&planned[n].item.key) == outcome.key)
                else {
                    continue;
                };
                let p = &mut planned[n];
                p.outcome = Some((ItemClass::parse(outcome.class), outcome.attempts));
                p.attempts_before += outcome.attempts;
                p.result = outcome
                    .result
                    .and_then(|text| serde_json::from_str(text).ok());
                p.outputs = outcome
                    .outputs
                    .and_then(|text| serde_json::from_str(text).ok());
            }
        }
        let mut orphans = Vec::new();
        if let Some(ledger) = &self.ledger {
            // A job is still wanted while its item is planned under the same
            // fingerprint and has no final outcome: the run adopts it.
            let wanted: std::collections::HashSet<(&str, Digest)> = planned
                .iter()
                .filter(|p| !p.is_kept(stage.foreach.as_ref()))
                .map(|p| (p.item.key.as_str(), p.fingerprint))
                .collect();
            orphans = orphaned_jobs(&mut self.orphaned, ledger, &stage.name)?
                .into_iter()
                .filter(|(key, fingerprint, _)| !wanted.contains(&(key.as_str(), *fingerprint)))
                .map(|(_, _, handle)| handle)
                .collect();
        }
        Ok(Planned {
            plan: planned,
            orphans,
            list_seen,
            from_kept,
        })
    }

    /// The items of per-item stage `i`, each with its fingerprint: from the
    /// plan the last proof kept when it still holds, else from the list.
    fn fingerprint_items(
        &mut self,
        i: usize,
        template: &Digest,
        cancelled: &HashMap<(String, Digest), u32>,
        draws: &Draws,
    ) -> Result<Listed, ScheduleError> {
        let Some(kept) = self.plan_from_kept(i, template, cancelled) else {
            return self.list_items(i, template, cancelled, draws);
        };
        if std::env::var_os(crate::schedule::proof::CHECK_VAR).is_some()
            && let Ok(kept) = &kept
        {
            let usual = self.list_items(i, template, cancelled, draws)?;
            if let Some(difference) =
                crate::schedule::proof::kept_plans::difference(&kept.plan, &usual.plan)
            {
                return Err(ScheduleError::Items {
                    stage: self.manifest.stages[i].name.clone(),
                    message: format!(
                        "internal error: the item plan the proof kept differs from the list at {difference}; please report this as a cairn bug"
                    ),
                });
            }
        }
        kept
    }

    /// Stage `i`'s items planned from the plan the last proof kept, if it
    /// still holds (see [`super::kept_plans`]): what each item reads is
    /// read as usual, the list is not read again.
    fn plan_from_kept(
        &mut self,
        i: usize,
        template: &Digest,
        cancelled: &HashMap<(String, Digest), u32>,
    ) -> Option<Result<Listed, ScheduleError>> {
        let manifest = self.manifest;
        let stage = &manifest.stages[i];
        let foreach = stage.foreach.as_ref()?;
        let kept = self.take_kept_plan(&stage.name)?;
        if foreach.samples.is_some() || manifest.image_of(stage).is_some() {
            return None;
        }
        let list = foreach.items.resolve(&self.manifest.root);
        let seen_ns = crate::fingerprint::now_ns();
        let meta = kept.still_holds(template, &list)?;
        tracing::debug!(stage = %stage.name, "items planned from the plan the last proof kept");
        // A block at a time, as the list is read: what is held beside the
        // plan is one block's reads, not a million items'.
        let mut planned = Vec::with_capacity(kept.items.len());
        let code = Arc::new(*template);
        let mut listed = kept.items.into_iter().map(|kept| {
            let (item, paths) = kept.into_item();
            ListedItem {
                item,
                paths,
                tag: None,
            }
        });
        loop {
            let block: Vec<ListedItem> = listed.by_ref().take(ITEM_BLOCK).collect();
            if block.is_empty() {
                break;
            }
            match self.read_item_inputs(i, block) {
                Ok(read) => planned.extend(
                    read.into_iter()
                        .map(|read| planned_item(&code, read.item, read.inputs, None, cancelled)),
                ),
                Err(error) => return Some(Err(error)),
            }
        }
        Some(Ok(Listed {
            plan: planned,
            list_seen: Some((meta, seen_ns)),
            from_kept: true,
        }))
    }

    /// The plan kept for `stage`, if any, the plans read from the ledger
    /// first if they are still to be (only those whose list is unchanged:
    /// no other can serve).
    fn take_kept_plan(&mut self, stage: &str) -> Option<KeptPlan> {
        if let Some(key) = self.kept_plans_key.take() {
            let plans = self
                .ledger
                .as_ref()
                .and_then(|ledger| ledger.kept_plans(&key).ok().flatten())
                .and_then(|plans| crate::schedule::proof::kept_plans::decode_unchanged(&plans))
                .unwrap_or_default();
            let by_stage = plans.into_iter().map(|plan| (plan.stage.clone(), plan));
            self.kept_plans.extend(by_stage);
        }
        self.kept_plans.remove(stage)
    }

    /// The items of per-item stage `i`, each with its fingerprint. The list
    /// is read as a stream: each item is checked and its placeholders
    /// filled while its parsed value is at hand, and only its canonical
    /// text is kept; what the items read is read a block at a time (so a
    /// problem listing a block is reported before one reading what an
    /// earlier item of the block reads).
    fn list_items(
        &mut self,
        i: usize,
        template: &Digest,
        cancelled: &HashMap<(String, Digest), u32>,
        draws: &Draws,
    ) -> Result<Listed, ScheduleError> {
        let manifest = self.manifest;
        let stage = &manifest.stages[i];
        let foreach = stage.foreach.as_ref().expect("a per-item stage");
        let bad = |message: String| ScheduleError::Items {
            stage: stage.name.clone(),
            message,
        };
        let list = foreach.items.resolve(&self.manifest.root);
        let fields = FieldCheck::new(manifest, stage, Path::new(foreach.items.as_str()));
        let image = manifest
            .image_of(stage)
            .filter(|(image, _)| is_per_item(image));
        let code = Arc::new(*template);
        // An item's units (its samples, in a sampled stage), planned once
        // everything it reads is known.
        let plan = |planned: &mut Vec<PlannedItem>,
                    item: Item,
                    inputs: Vec<(String, Digest)>,
                    image: Option<String>| {
            // A sampled stage's units are its items' samples, each with
            // its index, seed and draw hashed into its fingerprint.
            let units = match &foreach.samples {
                None => vec![(item, inputs)],
                Some(samples) => (0..samples.k)
                    .map(|index| {
                        let unit = item.sample(index, samples.seed, draws.of(&item.key, index));
                        let mut inputs = inputs.clone();
                        inputs.extend(unit.sample_input());
                        (unit, inputs)
                    })
                    .collect(),
            };
            for (item, inputs) in units {
                planned.push(planned_item(&code, item, inputs, image.clone(), cancelled));
            }
        };
        let mut planned = Vec::new();
        // With a per-item image, each item with what it reads and the tag
        // it names, pinned once every tag is asked for.
        struct Tagged {
            item: Item,
            inputs: Vec<(String, Digest)>,
            tag: String,
        }
        let mut tagged: Vec<Tagged> = Vec::new();
        let mut place = |item: Item, inputs: Vec<(String, Digest)>, tag: Option<String>| match tag {
            Some(tag) => tagged.push(Tagged { item, inputs, tag }),
            None => plan(&mut planned, item, inputs, None),
        };
        // Items are listed a block at a time, then what the block reads is
        // read (its files `stat`ed side by side).
        let mut block: Vec<ListedItem> = Vec::new();
        let mut failed = None;
        let seen_ns = crate::fingerprint::now_ns();
        let before = std::fs::metadata(&list).ok();
        let listed = for_each_item(&list, &foreach.key, |item, value| {
            if foreach.samples.is_some() && item.key.contains('#') {
                // `KEY#INDEX` names a sample: `a#1` would be two things.
                return Err(format!(
                    "item `{}` of `{}` has a `#` in its key, which in a sampled stage names a sample (`ITEM#INDEX`)",
                    item.key,
                    foreach.items.as_str()
                ));
            }
            fields.check(&item.key, value)?;
            let item_fields = Fields {
                value,
                sample: None,
            };
            let fill = |template: &str| {
                fill_fields(template, item_fields)
                    .map_err(|message| format!("item `{}`: {message}", item.key))
            };
            let paths = foreach
                .item_inputs
                .iter()
                .map(|template| fill(template))
                .collect::<Result<_, _>>()?;
            let tag = image.map(|(template, _)| fill(template)).transpose()?;
            block.push(ListedItem { item, paths, tag });
            if block.len() == ITEM_BLOCK {
                let read = self.read_item_inputs(i, std::mem::take(&mut block));
                match read {
                    Ok(read) => read
                        .into_iter()
                        .for_each(|read| place(read.item, read.inputs, read.tag)),
                    Err(error) => {
                        failed = Some(error);
                        return Err(String::new());
                    }
                }
            }
            Ok(())
        });
        if let Some(error) = failed {
            return Err(error);
        }
        listed.map_err(bad)?;
        for read in self.read_item_inputs(i, block)? {
            place(read.item, read.inputs, read.tag);
        }
        let after = std::fs::metadata(&list).ok();
        let read_as_seen = before.filter(|before| {
            after
                .as_ref()
                .is_some_and(|after| crate::fingerprint::unchanged(before, after))
        });
        if let Some((_, require_digest)) = image {
            // Many distinct tags are asked for side by side, not in turn.
            self.resolver
                .prefetch(tagged.iter().map(|t| t.tag.as_str()), require_digest);
            for Tagged {
                item,
                mut inputs,
                tag,
            } in tagged
            {
                let pinned = self
                    .resolver
                    .pin(&tag, require_digest)
                    .map_err(|message| bad(format!("item `{}`: {message}", item.key)))?;
                // The image enters as one more thing the item reads (a
                // name no path can have), by its digest.
                inputs.push((
                    "\0image".to_owned(),
                    Digest::of(format!("image\0{}", pinned.digest).as_bytes()),
                ));
                plan(&mut planned, item, inputs, Some(pinned.reference));
            }
        }
        Ok(Listed {
            plan: planned,
            list_seen: read_as_seen.map(|meta| (meta, seen_ns)),
            from_kept: false,
        })
    }

    /// What each listed item of `stage` reads, by digest: a path an
    /// upstream stage wrote by the digest it recorded, any other as the
    /// stat cache vouches for it, by the `stat` a failed proof took of it
    /// or else `stat`ed first, side by side.
    fn read_item_inputs(
        &mut self,
        i: usize,
        listed: Vec<ListedItem>,
    ) -> Result<Vec<ItemRead>, ScheduleError> {
        let manifest = self.manifest;
        let stage = manifest.stages[i].name.as_str();
        // (A stage with none upstream reads nothing a stage writes before
        // it is planned.)
        let after_writers = !self.dag.upstream(i).is_empty();
        enum Read {
            Upstream(Digest),
            /// `stat`ed earlier in this run (by a fresh proof's check):
            /// the path, its `stat` and when it was taken.
            Stated(PathBuf, FileStat, i64),
            /// Its place among the paths stat'ed.
            Stat(usize),
        }
        let mut reads = Vec::new();
        let mut to_stat = Vec::new();
        for path in listed.iter().flat_map(|listed| &listed.paths) {
            reads.push(match self.upstream_digest(path) {
                Some(digest) => Read::Upstream(digest),
                None => {
                    let abs = self.manifest.root.join(path);
                    // The `stat` the failed proof took stands for one of a
                    // path no stage writes before it is read, as the key's
                    // inputs take it: here only of a plain path below the
                    // root (an item's path is as the item spells it) that
                    // no output is or holds, where a stage may have run
                    // before.
                    let plain = path.split('/').all(|part| !matches!(part, "" | "." | ".."));
                    let written = || {
                        let path = ProjectPath::new(path.clone());
                        self.outputs.producer_of(&path).is_some()
                    };
                    let stated = match plain && !(after_writers && written()) {
                        true => self.stat.take_stated(&abs),
                        false => None,
                    };
                    match stated {
                        Some((stat, seen_ns)) => Read::Stated(abs, stat, seen_ns),
                        None => {
                            to_stat.push(abs);
                            Read::Stat(to_stat.len() - 1)
                        }
                    }
                }
            });
        }
        let seen_ns = crate::fingerprint::now_ns();
        let mut stats: Vec<_> = crate::fingerprint::stat_side_by_side(&to_stat)
            .into_iter()
            .map(Some)
            .collect();
        let mut reads = reads.into_iter();
        let mut out = Vec::with_capacity(listed.len());
        for ListedItem { item, paths, tag } in listed {
            let mut inputs = Vec::with_capacity(paths.len());
            for (path, read) in paths.into_iter().zip(&mut reads) {
                let (abs, content) = match read {
                    Read::Upstream(digest) => {
                        inputs.push((path, digest));
                        continue;
                    }
                    Read::Stated(abs, stat, seen_ns) => {
                        let content = self.stat.content_as_stated(&abs, &stat, seen_ns);
                        (abs, content)
                    }
                    Read::Stat(n) => {
                        let abs = std::mem::take(&mut to_stat[n]);
                        let stat = stats[n].take().expect("each path is stat'ed for one read");
                        let content =
                            stat.and_then(|meta| self.stat.content_as_stated(&abs, &meta, seen_ns));
                        (abs, content)
                    }
                };
                let digest = content
                    .map_err(|source| ScheduleError::Input {
                        stage: format!("{stage} (item `{}`)", item.key),
                        path: abs,
                        source,
                    })?
                    .digest();
                inputs.push((path, digest));
            }
            out.push(ItemRead { item, inputs, tag });
        }
        Ok(out)
    }
}

/// An item of a per-item stage as listed: the paths it reads, and the tag
/// of the image it names (with a per-item image).
struct ListedItem {
    item: Item,
    paths: Vec<String>,
    tag: Option<String>,
}

/// A listed item with what it reads read: each path with its digest.
struct ItemRead {
    item: Item,
    inputs: Vec<(String, Digest)>,
    tag: Option<String>,
}

/// An item (or sample) reading `inputs` as stage code `template` plans it,
/// before its outcome is known.
fn planned_item(
    template: &Arc<Digest>,
    item: Item,
    inputs: Vec<(String, Digest)>,
    image: Option<String>,
    cancelled: &HashMap<(String, Digest), u32>,
) -> PlannedItem {
    let fingerprint = item_fingerprint(template, &item.canonical, &inputs);
    let attempts_before = if cancelled.is_empty() {
        0
    } else {
        cancelled
            .get(&(item.key.clone(), fingerprint))
            .copied()
            .unwrap_or(0)
    };
    PlannedItem {
        item,
        fingerprint,
        attempts_before,
        image: image.map(String::into_boxed_str),
        code: template.clone(),
        outputs: None,
        outcome: None,
        result: None,
        inputs: inputs.into_boxed_slice(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::file_stat::{Found, Stated};
    use crate::fingerprint::StatEntry;

    /// An item's input that a failed proof's check found as it saw it is
    /// read by that `stat`, not looked at again: here a file rewritten
    /// since reads as what it held then. Once: the next look `stat`s it.
    #[test]
    fn an_item_input_a_failed_proof_found_is_read_by_its_stat_once() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::create_dir(root.join("in")).unwrap();
        std::fs::write(
            root.join("items.jsonl"),
            "{\"id\": \"a\", \"src\": \"in/a.txt\"}\n",
        )
        .unwrap();
        let input = root.join("in/a.txt");
        std::fs::write(&input, "before").unwrap();
        let source = "[pipeline]\nname = \"items\"\n[stages.copy]\n\
            foreach = { items = \"items.jsonl\", key = \"id\" }\n\
            item_inputs = [\"{item.src}\"]\nrun = \"cat {item.src}\"\n\
            outputs = { results = \"state/results.jsonl\" }\n";
        let path = root.join("cairn.toml");
        std::fs::write(&path, source).unwrap();
        let manifest = crate::manifest::load_str(&path, source.to_owned(), None).unwrap();
        let dag = Dag::build(&manifest).unwrap();
        let mut ctx = Context::new(&manifest, &dag, None).unwrap();
        let seen = FileStat::from(&std::fs::metadata(&input).unwrap());
        // (Seen long after it was written: not racy.)
        let seen_ns = seen.mtime_ns.max(seen.ctime_ns) + 60_000_000_000;
        let before = Digest::of(b"before");
        ctx.stat =
            StatCache::from_entries([(input.clone(), StatEntry::of(&seen, before, seen_ns))]);
        std::fs::write(&input, "after, longer").unwrap();
        let mut stated = Stated::default();
        let found = Found {
            stat: seen,
            seen_ns,
            link: false,
        };
        stated.insert(input.clone(), found);
        ctx.stat.use_stated(stated);
        let read = |ctx: &mut Context<'_>| {
            ctx.key_of(0).unwrap();
            ctx.item_plan(0).unwrap()[0].inputs.to_vec()
        };
        assert_eq!(read(&mut ctx), vec![("in/a.txt".to_owned(), before)]);
        let after = Digest::of(b"after, longer");
        assert_eq!(read(&mut ctx), vec![("in/a.txt".to_owned(), after)]);
    }

    /// One a stage that may have run before writes (`chunk`, which makes
    /// the item list too), or that the item spells otherwise than plainly,
    /// is looked at anew.
    #[test]
    fn an_item_input_a_stage_writes_is_looked_at_anew() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::create_dir(root.join("chunks")).unwrap();
        let items = "{\"id\": \"a\", \"src\": \"chunks/a.txt\"}\n\
            {\"id\": \"b\", \"src\": \"./in.txt\"}\n";
        std::fs::write(root.join("items.jsonl"), items).unwrap();
        let (chunk, input) = (root.join("chunks/a.txt"), root.join("in.txt"));
        std::fs::write(&chunk, "before").unwrap();
        std::fs::write(&input, "before").unwrap();
        let source = "[pipeline]\nname = \"items\"\n\
            [stages.chunk]\nrun = \"true\"\noutputs = [\"chunks\", \"items.jsonl\"]\n\
            [stages.copy]\nforeach = { items = \"items.jsonl\", key = \"id\" }\n\
            item_inputs = [\"{item.src}\"]\n\
            run = \"cat {item.src}\"\noutputs = { results = \"state/results.jsonl\" }\n";
        let path = root.join("cairn.toml");
        std::fs::write(&path, source).unwrap();
        let manifest = crate::manifest::load_str(&path, source.to_owned(), None).unwrap();
        let dag = Dag::build(&manifest).unwrap();
        let mut ctx = Context::new(&manifest, &dag, None).unwrap();
        let before = Digest::of(b"before");
        let mut stated = Stated::default();
        let mut entries = Vec::new();
        for file in [&chunk, &input] {
            let seen = FileStat::from(&std::fs::metadata(file).unwrap());
            let seen_ns = seen.mtime_ns.max(seen.ctime_ns) + 60_000_000_000;
            entries.push((file.clone(), StatEntry::of(&seen, before, seen_ns)));
            let found = Found {
                stat: seen,
                seen_ns,
                link: false,
            };
            stated.insert(file.clone(), found);
        }
        ctx.stat = StatCache::from_entries(entries);
        ctx.stat.use_stated(stated);
        std::fs::write(&chunk, "after, longer").unwrap();
        std::fs::write(&input, "after, longer").unwrap();
        let copy = manifest
            .stages
            .iter()
            .position(|s| s.name == "copy")
            .unwrap();
        ctx.key_of(copy).unwrap();
        let after = Digest::of(b"after, longer");
        let inputs: Vec<_> = (ctx.item_plan(copy).unwrap().iter())
            .map(|planned| planned.inputs.to_vec())
            .collect();
        assert_eq!(
            inputs,
            [
                vec![("chunks/a.txt".to_owned(), after)],
                vec![("./in.txt".to_owned(), after)]
            ]
        );
    }
}
