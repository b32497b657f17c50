//! Making a proof: what a run's stages read and wrote, vouched for as the
//! run decided from it, gathered stage by stage.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use super::super::Context;
use super::super::context::Plan;
use super::kept_plans::{KeptItem, KeptPlan};
use super::record::{Proof, Watched};
use crate::fingerprint::{Digest, EntryKind, PathMap, StatEntry, Vouched, hash_file, now_ns};
use crate::manifest::Foreach;
use crate::store::{OutputKind, OutputRecord};

impl Proof {
    /// The proof of a run that used `used` (each stage's fingerprint and
    /// outputs) for every stage of `ctx`'s manifest, in `order`, with the
    /// item plans to keep beside it (`None`: those kept still hold);
    /// `None` if the pipeline cannot have one or the workspace is no longer
    /// what the run decided from (both logged at debug level).
    pub fn make(
        ctx: &Context<'_>,
        used: &HashMap<usize, (Digest, Vec<OutputRecord>)>,
        order: &[usize],
        lock: &str,
    ) -> Option<(Proof, Option<Vec<KeptPlan>>)> {
        match Self::try_make(ctx, used, order, lock) {
            Ok(proof) => Some(proof),
            Err(why) => {
                tracing::debug!("no fresh proof: {why}");
                None
            }
        }
    }

    fn try_make(
        ctx: &Context<'_>,
        used: &HashMap<usize, (Digest, Vec<OutputRecord>)>,
        order: &[usize],
        lock: &str,
    ) -> Result<(Proof, Option<Vec<KeptPlan>>), String> {
        let mut draft = ProofDraft::new(ctx, order);
        draft.add_used(ctx, order.iter().copied(), used)?;
        draft.finish(ctx, lock)
    }
}

/// What the items of per-item stage `i` were planned from: its item list
/// (unchanged since it was read, and not written within a tick before:
/// a later write then shows in its stat) and every item's inputs, each
/// vouched for with the digest its fingerprint hashed.
fn items_read(
    ctx: &Context<'_>,
    i: usize,
    foreach: &Foreach,
    keep_plan: bool,
    watching: &mut Watching<'_>,
) -> Result<Option<KeptPlan>, String> {
    let stage = &ctx.manifest.stages[i];
    let root = &ctx.manifest.root;
    if !super::super::item_outputs::ItemOutputs::of(stage, root).is_empty() {
        return Err(format!("`{}` has item outputs", stage.name));
    }
    let Some(items) = ctx.keyed(i).and_then(|keyed| keyed.items.as_ref()) else {
        return Err(format!("`{}`'s items were not planned", stage.name));
    };
    let Some((before, seen_ns)) = &items.list_seen else {
        return Err(format!(
            "`{}`'s item list changed as it was read",
            stage.name
        ));
    };
    let list = foreach.items.resolve(root);
    let now = std::fs::metadata(&list).map_err(|e| format!("{}: {e}", list.display()))?;
    let digest =
        hash_file(&list, now.len(), true).map_err(|e| format!("{}: {e}", list.display()))?;
    let entry = StatEntry::new(before, digest, *seen_ns);
    if !entry.matches(&now) || entry.racy() {
        return Err(format!("{} changed as it was read", list.display()));
    }
    watching.place(&list)?;
    watching.watched.push(Watched::File(list.clone(), entry));
    // (`\0image`, `\0sample`: no path; in the fingerprint, not on disk.)
    let mut vouch_all = |paths_read: &mut dyn Iterator<Item = (&String, &Digest)>| {
        for (path, digest) in paths_read.filter(|(path, _)| !path.starts_with('\0')) {
            watching.read(ctx, root.join(path), digest)?;
        }
        Ok::<_, String>(())
    };
    let kept_items: Vec<KeptItem> = match &items.plan {
        Plan::Held(plan) => {
            vouch_all(
                &mut plan
                    .iter()
                    .flat_map(|p| p.inputs.iter().map(|(path, d)| (path, d))),
            )?;
            if keep_plan {
                plan.iter().map(KeptItem::of).collect()
            } else {
                Vec::new()
            }
        }
        Plan::HandedOver(reads) => {
            vouch_all(
                &mut reads
                    .iter()
                    .flat_map(|(item, digests)| item.paths.iter().zip(digests)),
            )?;
            if keep_plan {
                reads.iter().map(|(item, _)| item.clone()).collect()
            } else {
                Vec::new()
            }
        }
    };
    // A sampled stage's units are not kept: they are drawn as planned.
    let kept = (keep_plan && foreach.samples.is_none()).then(|| KeptPlan {
        stage: stage.name.clone(),
        code: items.code,
        list,
        list_entry: entry,
        items: kept_items,
    });
    Ok(kept)
}

/// What a proof being made watches, gathered as the run's stages are gone
/// through: each path once it is sorted (see [`Watching::finish`]).
pub(super) struct Watching<'r> {
    root: &'r Path,
    pub(super) watched: Vec<Watched>,
    /// The directories the paths read lie in, below the root.
    pub(super) places: PathMap<Watched>,
    /// Directories read and vouched for entry by entry: read by many
    /// stages or items, they are watched once.
    dirs_read: PathMap<Digest>,
}

impl<'r> Watching<'r> {
    pub(super) fn new(root: &'r Path, capacity: usize) -> Self {
        Self {
            root,
            watched: Vec::with_capacity(capacity),
            places: PathMap::default(),
            dirs_read: PathMap::default(),
        }
    }

    /// `path`, which the run read (or wrote) as `expected`, with what the
    /// stat cache vouches for it by and the directories it lies in.
    pub(super) fn read(
        &mut self,
        ctx: &Context<'_>,
        path: PathBuf,
        expected: &Digest,
    ) -> Result<(), String> {
        self.place(&path)?;
        // A file this run hashed or found unchanged: the entry its digest
        // rests on, as it was then. A change since shows in its stat when
        // the proof is checked, so no `stat` is needed now.
        if let Some(entry) = ctx
            .stat
            .entry(&path)
            .filter(|entry| entry.digest == *expected)
        {
            self.watched.push(Watched::File(path, entry));
            return Ok(());
        }
        if let Some(digest) = self.dirs_read.get(&path) {
            return match digest == expected {
                true => Ok(()),
                false => Err(format!("{} changed during the run", path.display())),
            };
        }
        let vouched = ctx
            .stat
            .vouch(&path)
            .ok_or_else(|| format!("{} is not vouched for by the stat cache", path.display()))?;
        if vouched.digest != *expected {
            return Err(format!("{} changed during the run", path.display()));
        }
        let Vouched { files, dirs, .. } = vouched;
        if !dirs.is_empty() {
            self.dirs_read.insert(path, *expected);
        }
        self.watched.extend(
            files
                .into_iter()
                .map(|(file, entry)| Watched::File(file, entry)),
        );
        self.watched
            .extend(dirs.into_iter().map(|(dir, stat)| Watched::Dir(dir, stat)));
        Ok(())
    }

    /// The directories `path` lies in below the root (none for a path
    /// outside it).
    pub(super) fn place(&mut self, path: &Path) -> Result<(), String> {
        let places = &mut self.places;
        // A directory is placed with the ones it lies in.
        if path.parent().is_some_and(|dir| places.contains_key(dir)) {
            return Ok(());
        }
        let Ok(inside) = path.strip_prefix(self.root) else {
            return Ok(());
        };
        let mut dir = self.root.to_path_buf();
        let components: Vec<Component<'_>> = inside.components().collect();
        for component in components.iter().take(components.len().saturating_sub(1)) {
            dir.push(component);
            if places.contains_key(&dir) {
                continue;
            }
            let meta =
                std::fs::symlink_metadata(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            if !meta.is_dir() {
                return Err(format!("{} is not a directory", dir.display()));
            }
            let watched = Watched::Place {
                path: dir.clone(),
                dev: meta.dev(),
                ino: meta.ino(),
            };
            places.insert(dir.clone(), watched);
        }
        Ok(())
    }

    /// Everything watched, sorted by path bytes (the same run makes the
    /// same proof), each path once: a directory watched for its listing
    /// keeps that check (a place checks only that it is the same
    /// directory). A path seen two ways during the run (an item list
    /// rewritten after a stage that reads it was decided) gets no proof.
    pub(super) fn finish(self) -> Result<Vec<Watched>, String> {
        let mut watched = self.watched;
        watched.extend(self.places.into_values());
        sort_watched(&mut watched);
        if let Some(pair) = watched.windows(2).find(|pair| {
            pair[0].path().as_os_str() == pair[1].path().as_os_str()
                && !is_place(&pair[1])
                && !pair[0].same_state(&pair[1])
        }) {
            return Err(format!(
                "{} was seen two ways during the run",
                pair[0].path().display()
            ));
        }
        watched.dedup_by(|later, first| later.path().as_os_str() == first.path().as_os_str());
        Ok(watched)
    }
}

/// A proof being made stage by stage: a run adds the stages whose results
/// it knows while its last commands run, and the others at its end, when
/// the lock file is written (see [`ProofDraft::finish`]). What a stage
/// added early watches is as the run saw it then: a change after that
/// fails the proof when it is checked, as any change does.
pub struct ProofDraft<'m> {
    watching: Watching<'m>,
    /// Each stage added: its place in the order the run decided them, its
    /// name and where its commands run.
    stages: Vec<(usize, String, String)>,
    /// Each stage's place in that order.
    place_in_order: Vec<usize>,
    /// The item plans of the stages added, each with its stage's place.
    plans: Vec<(usize, KeptPlan)>,
    /// The item plans are kept anew unless every stage that can have one
    /// was planned from the one kept.
    keep_plans: bool,
    /// How many of the entries watched were drafted (see [`Self::sort`]).
    drafted: usize,
}

impl<'m> ProofDraft<'m> {
    /// A draft of the proof of `ctx`'s run, whose stages were decided in
    /// `order`.
    pub fn new(ctx: &Context<'m>, order: &[usize]) -> Self {
        let manifest = ctx.manifest;
        // (Gathered as read, sorted at the end; sized for every path read.)
        let reads: usize = manifest
            .stages
            .iter()
            .map(|stage| 2 * (stage.inputs.len() + stage.outputs.len()))
            .sum::<usize>()
            + ctx.item_paths_read();
        let mut place_in_order = vec![0; manifest.stages.len()];
        for (place, &i) in order.iter().enumerate() {
            place_in_order[i] = place;
        }
        let keep_plans = manifest.stages.iter().enumerate().any(|(i, stage)| {
            stage.foreach.as_ref().is_some_and(|f| f.samples.is_none())
                && !(ctx.keyed(i))
                    .and_then(|keyed| keyed.items.as_ref())
                    .is_some_and(|items| items.from_kept)
        });
        Self {
            watching: Watching::new(&manifest.root, reads + 16),
            stages: Vec::with_capacity(order.len()),
            place_in_order,
            plans: Vec::new(),
            keep_plans,
            drafted: 0,
        }
    }

    /// Adds each stage of `stages` with the result this run used for it
    /// (`used`).
    pub fn add_used(
        &mut self,
        ctx: &Context<'_>,
        stages: impl Iterator<Item = usize>,
        used: &HashMap<usize, (Digest, Vec<OutputRecord>)>,
    ) -> Result<(), String> {
        for i in stages {
            let (_, outputs) = used.get(&i).ok_or_else(|| {
                format!(
                    "`{}` has no result of this run",
                    ctx.manifest.stages[i].name
                )
            })?;
            self.add(ctx, i, outputs)?;
        }
        Ok(())
    }

    /// Adds stage `i`, whose result this run used (`outputs`): every path
    /// it read and wrote, and the stored objects it rests on.
    fn add(&mut self, ctx: &Context<'_>, i: usize, outputs: &[OutputRecord]) -> Result<(), String> {
        let manifest = ctx.manifest;
        let root = &manifest.root;
        let watching = &mut self.watching;
        let stage = &manifest.stages[i];
        if manifest.image_of(stage).is_some() {
            return Err(format!("`{}` runs in an image", stage.name));
        }
        if let Some(uses) = &stage.uses
            && crate::builtins::effect_output(&uses.name).is_some()
        {
            return Err(format!("`{}` does work beyond its outputs", stage.name));
        }
        let inputs = &ctx
            .keyed(i)
            .ok_or_else(|| format!("`{}` was not fingerprinted", stage.name))?
            .inputs;
        // (A fetched input counts by its pin, which is in the manifest.)
        for (input, expected) in
            (stage.inputs.iter().zip(inputs)).filter(|(i, _)| i.pinned.is_none())
        {
            watching.read(ctx, input.path.resolve(root), expected)?;
        }
        for output in outputs {
            watching.read(ctx, root.join(&output.path), &output.digest)?;
            if output.kind == OutputKind::Dir {
                // The listing is read and checked against its digest
                // when the stage is decided: watched as a file, so an
                // edit in place is seen too.
                let listing = ctx.store.tree_path(&output.digest);
                let seen_ns = now_ns();
                let meta = std::fs::metadata(&listing)
                    .map_err(|e| format!("{}: {e}", listing.display()))?;
                let bytes =
                    std::fs::read(&listing).map_err(|e| format!("{}: {e}", listing.display()))?;
                let entry = StatEntry::new(&meta, Digest::of(&bytes), seen_ns);
                watching.watched.push(Watched::File(listing, entry));
            }
            for (path, size) in stored_objects(ctx, output)? {
                let meta =
                    std::fs::metadata(&path).map_err(|e| format!("{}: {e}", path.display()))?;
                if meta.len() != size {
                    return Err(format!("{} is not {size} bytes", path.display()));
                }
                watching.watched.push(Watched::Object {
                    path,
                    dev: meta.dev(),
                    ino: meta.ino(),
                    size,
                });
            }
        }
        let place = self.place_in_order[i];
        if let Some(foreach) = &stage.foreach {
            let plan = items_read(ctx, i, foreach, self.keep_plans, watching)?;
            self.plans.extend(plan.map(|plan| (place, plan)));
        }
        self.stages
            .push((place, stage.name.clone(), stage.executor_name()));
        Ok(())
    }

    /// Puts what the stages added so far watch in order, as a draft: the
    /// stages added after it are sorted in among them at the end for
    /// little more than their own number.
    pub fn sort(&mut self) {
        sort_watched(&mut self.watching.watched);
        self.drafted = self.watching.watched.len();
    }

    /// Takes, for each file the draft watches, the moment the stat cache
    /// knows it as it was by now: the run's end saves the cache, and a
    /// saved entry is seen as of then (see `StatCache::take_updates`), so
    /// a file written moments before the draft is not racy in the proof.
    fn seen_as_saved(&mut self, ctx: &Context<'_>) {
        let unseen = |entry: StatEntry| StatEntry {
            seen_ns: 0,
            ..entry
        };
        let drafted = &mut self.watching.watched[..self.drafted];
        for watched in drafted {
            let Watched::File(path, entry) = watched else {
                continue;
            };
            let Some(now) = ctx.stat.entry(path) else {
                continue;
            };
            if unseen(now) == unseen(*entry) {
                entry.seen_ns = entry.seen_ns.max(now.seen_ns);
            }
        }
    }

    /// The proof, once every stage is added and the lock file written as
    /// `lock` (which it checks), with the item plans to keep beside it
    /// (`None`: those kept still hold).
    pub fn finish(
        mut self,
        ctx: &Context<'_>,
        lock: &str,
    ) -> Result<(Proof, Option<Vec<KeptPlan>>), String> {
        let manifest = ctx.manifest;
        // The lock file says what this run would write.
        let lock_path = manifest.lock_path();
        let seen_ns = now_ns();
        let meta = std::fs::metadata(&lock_path).map_err(|e| format!("the lock file: {e}"))?;
        let text = std::fs::read(&lock_path).map_err(|e| format!("the lock file: {e}"))?;
        let after = std::fs::metadata(&lock_path).map_err(|e| format!("the lock file: {e}"))?;
        if text != lock.as_bytes() || !crate::fingerprint::unchanged(&meta, &after) {
            return Err("the lock file is not what this run would write".to_owned());
        }
        let entry = StatEntry::new(&after, Digest::of(&text), seen_ns);
        self.seen_as_saved(ctx);
        self.watching.watched.push(Watched::File(lock_path, entry));
        // (In the order the stages were decided, however they were added.)
        self.stages.sort_unstable_by_key(|(place, ..)| *place);
        self.plans.sort_unstable_by_key(|(place, _)| *place);
        let plans = self.plans.into_iter().map(|(_, plan)| plan).collect();
        let proof = Proof {
            root: manifest.root.clone(),
            stages: self
                .stages
                .into_iter()
                .map(|(_, name, executor)| (name, executor))
                .collect(),
            env: ctx.env_read.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            watched: self.watching.finish()?,
        };
        Ok((proof, self.keep_plans.then_some(plans)))
    }
}

/// Sorts `watched` by path, a directory's place after what is watched of
/// the directory itself. (A stable sort: a part sorted before costs little
/// more to sort again with more added.)
fn sort_watched(watched: &mut [Watched]) {
    watched.sort_by(|a, b| {
        a.path()
            .as_os_str()
            .cmp(b.path().as_os_str())
            .then_with(|| is_place(a).cmp(&is_place(b)))
    });
}

/// Whether `watched` is the place of a directory paths lie in.
fn is_place(watched: &Watched) -> bool {
    matches!(watched, Watched::Place { .. })
}

/// The stored objects `output` needs, with their sizes (as the freshness
/// check finds them: `ObjectStore::is_complete`); a directory's listing is
/// watched apart.
fn stored_objects(ctx: &Context<'_>, output: &OutputRecord) -> Result<Vec<(PathBuf, u64)>, String> {
    let store = &ctx.store;
    Ok(match output.kind {
        OutputKind::File if output.inline => Vec::new(),
        OutputKind::File => vec![(store.object_path(&output.digest), output.size)],
        OutputKind::Dir => {
            let listing = store.tree_path(&output.digest);
            let entries = store
                .tree(&output.digest)
                .map_err(|e| format!("{}: {e}", listing.display()))?;
            let mut objects = Vec::new();
            objects.extend(
                entries
                    .iter()
                    .filter(|e| matches!(e.kind, EntryKind::File | EntryKind::Executable))
                    .map(|e| (store.object_path(&e.digest), e.size)),
            );
            objects
        }
    })
}
