//! What the scheduler knows about a workspace, and how it decides freshness.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::ScheduleError;
use super::item_fields::FieldCheck;
use super::items::{
    Fields, Item, PlanIndex, PlannedItem, fill, fill_fields, for_each_item, in_key_order,
    load_items,
};
use super::proof::kept_plans::{KeptItem, KeptPlan, OutcomesRead};
use crate::exec::{ImageResolver, PinnedImage};
use crate::file_stat::FileStat;
use crate::fingerprint::{
    Digest, EntryKind, StageKey, StatCache, TreeEntry, add_item_components, image_component,
    item_fingerprint, path_bytes, stage_key, tree_digest,
};
use crate::graph::Dag;
use crate::manifest::ItemClass;
use crate::manifest::{Manifest, OutputIndex, ProjectPath, is_per_item};
use crate::store::{
    COMMAND_ITEM, Draws, ItemOutcomes, Ledger, LockFile, ObjectStore, OrphanedJobs, OutputRecord,
    ResultRecord, StoreError, current_ok, key_hash,
};

/// How many items are listed before what they read is read (their files
/// `stat`ed side by side): enough to keep the threads busy, few enough
/// that their reads are not held for a million items at once.
const ITEM_BLOCK: usize = 16_384;

/// Everything needed to evaluate stages of one manifest.
pub struct Context<'m> {
    pub manifest: &'m Manifest,
    pub dag: &'m Dag,
    pub outputs: OutputIndex,
    pub store: ObjectStore,
    pub ledger: Option<Ledger>,
    pub stat: StatCache,
    /// The current successful result of each stage: the one the lock file
    /// names (what the workspace holds, even when a revert made it older
    /// than the newest), else the newest. Diffs and reports start here.
    pub latest_ok: HashMap<String, ResultRecord>,
    /// Inline objects of the newest results known to be in the ledger,
    /// found in one query: a no-op asks nothing per output.
    inline_held: std::collections::HashSet<Digest>,
    pub latest_failure: HashMap<String, ResultRecord>,
    /// The committed lock file, verified; `None` if there is none or it
    /// cannot be trusted...
    pub lock: Option<LockFile>,
    /// ...and then why (reported by commands; a run rewrites the lock).
    pub lock_problem: Option<StoreError>,
    /// Digest of each upstream output path as it stands in this session.
    pub produced: HashMap<String, Digest>,
    /// Per-item stages: their items, as of the last `key_of`.
    pub item_plans: HashMap<usize, Vec<PlannedItem>>,
    /// Per-item stages: the fingerprint of the stage's code (its template,
    /// before items), which every item's fingerprint builds on.
    pub item_codes: HashMap<usize, Digest>,
    /// Whether a dirty stage's reason lists the components that changed.
    pub explain: bool,
    /// Per-item stages: the handles of jobs a dead run left for items the
    /// current plan no longer wants (to cancel), as of the last `key_of`.
    pub orphans: HashMap<usize, Vec<String>>,
    /// Every stage's jobs that dead runs left, once a stage asked.
    orphaned: Option<OrphanedJobs>,
    /// Stages that run in one image: that image, pinned, as of the last
    /// `key_of` (per-item images are on each [`PlannedItem`]).
    pub images: HashMap<usize, PinnedImage>,
    /// Pins image references, asking a registry once per tag.
    resolver: Arc<ImageResolver>,
    /// Stored tree listings of upstream directory outputs, by digest
    /// (`None`: not in the store).
    listings: HashMap<Digest, Option<TreeListing>>,
    /// Each stage's input digests, as of its last `key_of` (what a fresh
    /// proof checks the workspace against).
    pub input_digests: HashMap<usize, Vec<Digest>>,
    /// The variables the keys read from cairn's environment: the digest
    /// of each value (`None`: unset). Never the values.
    pub env_read: BTreeMap<String, Option<Digest>>,
    /// Per-item stages: their item list as `stat` saw it just before it
    /// was read, and when (`None` if it changed while it was read).
    pub item_lists: HashMap<usize, Option<(std::fs::Metadata, i64)>>,
    /// Per-item stages a run handed their plan to: each item as a proof
    /// keeps it, with the digest its fingerprint hashed of each path.
    pub item_reads: HashMap<usize, Vec<(KeptItem, Vec<Digest>)>>,
    /// The item plans the last proof kept, by stage, when it failed: what
    /// a stage whose list is unchanged is planned from (see
    /// [`super::kept_plans`]).
    kept_plans: HashMap<String, KeptPlan>,
    /// The key of the last proof, when the plans kept beside it are read
    /// only once a per-item stage is planned (a command that only reads
    /// may plan none: `log`, `show STAGE/KEY`).
    kept_plans_key: Option<[u8; 32]>,
    /// Per-item stages planned from a kept plan.
    pub planned_from_kept: std::collections::HashSet<usize>,
    /// The outcomes of stages with a kept plan, read ahead while the
    /// manifest was parsed, by stage, under the code they were read for.
    outcomes_read: OutcomesRead,
    /// This checkout's part of every job name (see `task::job_prefix`),
    /// made when the first job is named.
    pub workspace_tag: std::sync::OnceLock<String>,
}

/// What a run reads of its past before it decides anything: the lock
/// file, the stat cache and each stage's current results. It needs no
/// parsed manifest (only where its lock file is and the pipeline's name),
/// so it can be read while the manifest is parsed.
pub struct History {
    ledger: Option<Ledger>,
    stat: StatCache,
    latest_ok: HashMap<String, ResultRecord>,
    inline_held: std::collections::HashSet<Digest>,
    latest_failure: HashMap<String, ResultRecord>,
    lock: Option<LockFile>,
    lock_problem: Option<StoreError>,
    kept_plans: Vec<KeptPlan>,
    outcomes_read: OutcomesRead,
}

impl History {
    /// Reads the lock file at `lock_path` (of pipeline `pipeline`) and,
    /// through `ledger`, what the pipeline recorded.
    pub fn read(
        lock_path: &Path,
        pipeline: &str,
        ledger: Option<Ledger>,
    ) -> Result<Self, ScheduleError> {
        let (lock, lock_problem) = match LockFile::read(lock_path, pipeline) {
            Ok(lock) => (lock, None),
            Err(problem) => (None, Some(problem)),
        };
        let (stat, latest_ok, latest_failure) = match &ledger {
            Some(ledger) => (
                StatCache::from_entries(ledger.load_stat_cache()?),
                current_ok(ledger, lock.as_ref())?,
                ledger.latest_failures()?,
            ),
            None => Default::default(),
        };
        let inline_held = match &ledger {
            Some(ledger) => {
                let wanted: Vec<Digest> = latest_ok
                    .values()
                    .flat_map(|record: &ResultRecord| &record.outputs)
                    .filter(|output| output.inline)
                    .map(|output| output.digest)
                    .collect();
                ledger.inline_objects_held(&wanted)?
            }
            None => Default::default(),
        };
        Ok(Self {
            ledger,
            stat,
            latest_ok,
            inline_held,
            latest_failure,
            lock,
            lock_problem,
            kept_plans: Vec::new(),
            outcomes_read: HashMap::new(),
        })
    }

    /// [`Self::read`], with the history a failed proof kept (see
    /// [`super::kept_history`]) taken up for all but the stat cache, if it
    /// was kept with the lock file as it is now.
    pub fn read_kept(
        lock_path: &Path,
        pipeline: &str,
        ledger: Ledger,
        kept: &[u8],
    ) -> Result<Self, ScheduleError> {
        // (The lock file's digest comes first: the rest is decoded only
        // if it is the one kept.)
        let lock_is_kept = std::fs::read(lock_path).is_ok_and(|text| {
            Some(Digest::of(&text)) == super::proof::kept_history::lock_digest(kept)
        });
        let refused = match lock_is_kept.then(|| super::proof::kept_history::decode(kept)) {
            None => Err("the lock file is not the one it was kept with"),
            Some(None) => Err("it cannot be read"),
            Some(Some(kept)) if kept.lock.pipeline != pipeline => Err("it is another pipeline's"),
            Some(Some(kept)) => Ok(kept),
        };
        let kept = match refused {
            Ok(kept) => kept,
            Err(why) => {
                tracing::debug!("the kept history was not taken up: {why}");
                return Self::read(lock_path, pipeline, Some(ledger));
            }
        };
        tracing::debug!("the history was taken up as it was kept");
        let stat = match std::env::var_os(super::proof::CHECK_VAR) {
            // Read as well, the history must be the kept one; the run goes
            // on from the kept one.
            Some(_) => {
                let read = Self::read(lock_path, pipeline, Some(ledger.another_connection()?))?;
                let as_read = super::proof::kept_history::KeptHistory {
                    lock_digest: kept.lock_digest,
                    lock: read.lock.unwrap_or_else(|| LockFile::new("")),
                    latest_ok: read.latest_ok,
                    latest_failure: read.latest_failure,
                    inline_held: read.inline_held,
                };
                if let Some(what) = super::proof::kept_history::difference(&kept, &as_read) {
                    return Err(ScheduleError::Internal(format!(
                        "the history kept beside the fresh proof is not the ledger's now: {what}"
                    )));
                }
                read.stat
            }
            None => StatCache::from_entries(ledger.load_stat_cache()?),
        };
        Ok(Self {
            stat,
            ledger: Some(ledger),
            latest_ok: kept.latest_ok,
            inline_held: kept.inline_held,
            latest_failure: kept.latest_failure,
            lock: Some(kept.lock),
            lock_problem: None,
            kept_plans: Vec::new(),
            outcomes_read: HashMap::new(),
        })
    }

    /// With the item plans a failed proof kept, and the outcomes of their
    /// stages' items read ahead, by stage (under the code they were read
    /// for).
    pub fn with_kept_plans(self, kept_plans: Vec<KeptPlan>, outcomes_read: OutcomesRead) -> Self {
        Self {
            kept_plans,
            outcomes_read,
            ..self
        }
    }
}

/// A stored directory listing, by path, for looking up what lies inside.
struct TreeListing {
    /// By the path's bytes (so the paths inside a directory follow it).
    entries: BTreeMap<Vec<u8>, TreeEntry>,
}

impl TreeListing {
    fn new(entries: Vec<TreeEntry>) -> Self {
        Self {
            entries: entries
                .into_iter()
                .map(|e| (path_bytes(&e.path).to_vec(), e))
                .collect(),
        }
    }

    /// The content digest of `rel` inside the listed directory, as the
    /// stat cache would compute it from the restored copy; `None` if the
    /// listing cannot tell (absent, or a symbolic link on the way).
    fn digest_of(&self, rel: &str) -> Option<Digest> {
        let found = self.entries.get(rel.as_bytes())?;
        match found.kind {
            EntryKind::File | EntryKind::Executable => return Some(found.digest),
            EntryKind::Dir => {}
            EntryKind::Symlink => return None,
        }
        let prefix = [rel.as_bytes(), b"/"].concat();
        let mut inside = Vec::new();
        for (path, entry) in self.entries.range(prefix.clone()..) {
            let Some(sub) = path.strip_prefix(prefix.as_slice()) else {
                break;
            };
            if entry.kind == EntryKind::Symlink {
                return None;
            }
            inside.push(TreeEntry {
                path: PathBuf::from(std::ffi::OsStr::from_bytes(sub)),
                ..entry.clone()
            });
        }
        Some(tree_digest(&mut inside))
    }
}

impl<'m> Context<'m> {
    pub fn new(
        manifest: &'m Manifest,
        dag: &'m Dag,
        ledger: Option<Ledger>,
    ) -> Result<Self, ScheduleError> {
        let history = History::read(&manifest.lock_path(), &manifest.name, ledger)?;
        Ok(Self::with_history(manifest, dag, history))
    }

    /// The context of `manifest` with its `history` read already (see
    /// [`History`]): read for the same manifest's lock file and pipeline.
    pub fn with_history(manifest: &'m Manifest, dag: &'m Dag, history: History) -> Self {
        let History {
            ledger,
            stat,
            latest_ok,
            inline_held,
            latest_failure,
            lock,
            lock_problem,
            kept_plans,
            outcomes_read,
        } = history;
        Self {
            manifest,
            dag,
            outputs: OutputIndex::new(&manifest.stages),
            store: ObjectStore::new(&manifest.cache_dir()).with_link(manifest.link),
            ledger,
            stat,
            latest_ok,
            inline_held,
            latest_failure,
            lock,
            lock_problem,
            produced: HashMap::new(),
            item_plans: HashMap::new(),
            item_codes: HashMap::new(),
            explain: true,
            orphans: HashMap::new(),
            orphaned: None,
            images: HashMap::new(),
            resolver: Arc::default(),
            listings: HashMap::new(),
            input_digests: HashMap::new(),
            env_read: BTreeMap::new(),
            item_lists: HashMap::new(),
            item_reads: HashMap::new(),
            kept_plans: kept_plans
                .into_iter()
                .map(|plan| (plan.stage.clone(), plan))
                .collect(),
            kept_plans_key: None,
            planned_from_kept: Default::default(),
            outcomes_read,
            workspace_tag: std::sync::OnceLock::new(),
        }
    }

    /// With the item plans kept beside the proof made under `key` (see
    /// [`super::proof::key_of`]), read once a per-item stage is
    /// planned: a stage whose list is unchanged since is planned from its
    /// plan, as a run after a failed proof does.
    pub fn with_plans_kept_under(self, key: [u8; 32]) -> Self {
        Self {
            kept_plans_key: Some(key),
            ..self
        }
    }

    pub fn abs(&self, path: &str) -> PathBuf {
        self.manifest.root.join(path)
    }

    /// The key of stage `i` from the current content of its inputs; upstream
    /// outputs known to this session count by their recorded digests.
    pub fn key_of(&mut self, i: usize) -> Result<StageKey, ScheduleError> {
        let manifest = self.manifest;
        let stage = &manifest.stages[i];
        let mut digests = Vec::with_capacity(stage.inputs.len());
        for (n, input) in stage.inputs.iter().enumerate() {
            if let Some(digest) = self.upstream_digest(input.path.as_str()) {
                digests.push(digest);
                continue;
            }
            let abs = input.path.resolve(&self.manifest.root);
            // The `stat` the failed proof took stands for one of a path
            // inside the root (whose directories the proof saw were no
            // links) that no stage writes (see `content_with_stated`).
            let content = if self.dag.input_is_made(i, n) || !abs.starts_with(&manifest.root) {
                self.stat.content(&abs)
            } else {
                self.stat.content_with_stated(&abs)
            }
            .map_err(|source| ScheduleError::Input {
                stage: stage.name.clone(),
                path: abs.clone(),
                source,
            })?;
            digests.push(content.digest());
        }
        let env_read = &mut self.env_read;
        let mut key = stage_key(stage, &digests, |name| {
            let value = std::env::var(name).ok();
            let digest = value.as_deref().map(|v| Digest::of(v.as_bytes()));
            env_read.insert(name.to_owned(), digest);
            value
        });
        self.input_digests.insert(i, digests);
        if let Some((image, require_digest)) = manifest.image_of(stage)
            && !is_per_item(image)
        {
            // What the command runs in is part of what it computes: by
            // content, so a moved tag re-runs the stage and the same image
            // mirrored under another name does not.
            let pinned = self
                .resolver
                .pin(image, require_digest)
                .map_err(|message| ScheduleError::Image {
                    stage: stage.name.clone(),
                    message,
                })?;
            key.insert("image", image_component(&pinned.digest, &pinned.reference));
            self.images.insert(i, pinned);
        }
        if let Some(foreach) = &stage.foreach {
            // The stage as a whole is its template plus each item's
            // fingerprint: adding one item changes it, but each item is
            // judged by its own fingerprint.
            let code = key.fingerprint();
            self.item_codes.insert(i, code);
            let items = self.plan_items(i, &code)?;
            // (Its merged output is in key order too.)
            let listing = in_key_order(&items)
                .map(|planned| (planned.item.key.as_str(), &planned.fingerprint));
            add_item_components(&mut key, foreach, listing, items.len());
            self.item_plans.insert(i, items);
        }
        Ok(key)
    }

    /// The image tags stage `i` names that are not resolved yet (its
    /// executor's image, or its items' images): what fingerprinting it
    /// would wait for the registry for. A list that cannot be read yields
    /// none; planning reports it.
    pub fn tags_to_resolve(&self, i: usize) -> Vec<String> {
        let stage = &self.manifest.stages[i];
        let Some((image, require_digest)) = self.manifest.image_of(stage) else {
            return Vec::new();
        };
        if require_digest {
            return Vec::new();
        }
        if !is_per_item(image) {
            return self.resolver.unresolved([image], false);
        }
        let Some(foreach) = &stage.foreach else {
            return Vec::new();
        };
        let list = foreach.items.resolve(&self.manifest.root);
        let Ok(items) = load_items(&list, &foreach.key) else {
            return Vec::new();
        };
        let texts: Vec<String> = items
            .iter()
            .filter_map(|item| fill(image, item).ok())
            .collect();
        self.resolver
            .unresolved(texts.iter().map(String::as_str), false)
    }

    /// The resolver of image tags, to resolve some off the scheduler's
    /// thread.
    pub fn resolver(&self) -> Arc<ImageResolver> {
        self.resolver.clone()
    }

    /// The items of a per-item stage, each with its fingerprint and the
    /// outcome the ledger holds for it. The outcomes recorded under the
    /// stage's code are read on a thread of their own while the list is.
    fn plan_items(
        &mut self,
        i: usize,
        template: &Digest,
    ) -> Result<Vec<PlannedItem>, ScheduleError> {
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

    /// Stage `i`'s planned items with the outcomes recorded for them, and
    /// the jobs a dead run left that the plan does not want.
    fn with_outcomes(
        &mut self,
        i: usize,
        mut planned: Vec<PlannedItem>,
        outcomes: ItemOutcomes,
    ) -> Result<Vec<PlannedItem>, ScheduleError> {
        let stage = &self.manifest.stages[i];
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
        if let Some(ledger) = &self.ledger {
            // A job is still wanted while its item is planned under the same
            // fingerprint and has no final outcome: the run adopts it.
            let wanted: std::collections::HashSet<(&str, Digest)> = planned
                .iter()
                .filter(|p| !p.is_kept(stage.foreach.as_ref()))
                .map(|p| (p.item.key.as_str(), p.fingerprint))
                .collect();
            let orphans = orphaned_jobs(&mut self.orphaned, ledger, &stage.name)?
                .into_iter()
                .filter(|(key, fingerprint, _)| !wanted.contains(&(key.as_str(), *fingerprint)))
                .map(|(_, _, handle)| handle)
                .collect();
            self.orphans.insert(i, orphans);
        }
        Ok(planned)
    }

    /// The items of per-item stage `i`, each with its fingerprint: from the
    /// plan the last proof kept when it still holds, else from the list.
    fn fingerprint_items(
        &mut self,
        i: usize,
        template: &Digest,
        cancelled: &HashMap<(String, Digest), u32>,
        draws: &Draws,
    ) -> Result<Vec<PlannedItem>, ScheduleError> {
        let Some(kept) = self.plan_from_kept(i, template, cancelled) else {
            return self.list_items(i, template, cancelled, draws);
        };
        if std::env::var_os(super::proof::CHECK_VAR).is_some()
            && let Ok(kept) = &kept
        {
            let usual = self.list_items(i, template, cancelled, draws)?;
            if let Some(difference) = super::proof::kept_plans::difference(kept, &usual) {
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
    ) -> Option<Result<Vec<PlannedItem>, ScheduleError>> {
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
        self.item_lists.insert(i, Some((meta, seen_ns)));
        self.planned_from_kept.insert(i);
        Some(Ok(planned))
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
                .and_then(|plans| super::proof::kept_plans::decode_unchanged(&plans))
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
    ) -> Result<Vec<PlannedItem>, ScheduleError> {
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
        self.item_lists
            .insert(i, read_as_seen.map(|meta| (meta, seen_ns)));
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
        Ok(planned)
    }

    /// Jobs a dead run left that stage `i`, about to run under
    /// `fingerprint`, does not want: for items no longer planned (found
    /// when its items were), or for its command under another fingerprint.
    pub fn unwanted_jobs(
        &mut self,
        i: usize,
        fingerprint: &Digest,
    ) -> Result<Vec<String>, ScheduleError> {
        let stage = &self.manifest.stages[i];
        if stage.foreach.is_some() {
            return Ok(self.orphans.remove(&i).unwrap_or_default());
        }
        let Some(ledger) = &self.ledger else {
            return Ok(Vec::new());
        };
        // One under the same fingerprint is the attempt this run adopts.
        Ok(orphaned_jobs(&mut self.orphaned, ledger, &stage.name)?
            .into_iter()
            .filter(|(key, orphan, _)| key == COMMAND_ITEM && orphan != fingerprint)
            .map(|(_, _, handle)| handle)
            .collect())
    }

    /// The successful result recorded for `stage` under `fingerprint`.
    pub fn lookup(
        &self,
        stage: &str,
        fingerprint: &Digest,
    ) -> Result<Option<Cow<'_, ResultRecord>>, ScheduleError> {
        match &self.ledger {
            Some(ledger) => Ok(ledger.lookup(&self.latest_ok, stage, fingerprint)?),
            None => Ok(None),
        }
    }

    /// Whether the inline object `digest` was found in the ledger when the
    /// history was read.
    pub(super) fn held_inline(&self, digest: &Digest) -> bool {
        self.inline_held.contains(digest)
    }

    /// Whether every object `output` needs is stored (present with its
    /// size; restores verify the bytes). An inline object removed as
    /// damaged counts as missing.
    pub(super) fn stored_completely(&self, output: &OutputRecord) -> Result<bool, ScheduleError> {
        if !self.store.is_complete(output) {
            return Ok(false);
        }
        match &self.ledger {
            Some(_) if output.inline && self.inline_held.contains(&output.digest) => Ok(true),
            Some(ledger) if output.inline => Ok(ledger.has_inline_object(&output.digest)?),
            _ => Ok(true),
        }
    }

    /// Whether every stored byte of `output` hashes to its name (what a
    /// restore needs).
    pub fn stored_intact(&self, output: &OutputRecord) -> Result<bool, ScheduleError> {
        Ok(self.store.verify(output, self.ledger.as_ref())?)
    }

    /// The key recorded with a result.
    pub fn recorded_key(&self, record: &ResultRecord) -> Result<StageKey, ScheduleError> {
        match &self.ledger {
            Some(ledger) => Ok(ledger.key(record.id)?),
            None => Ok(StageKey::default()),
        }
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

    /// The digest `path` has once the upstream outputs known to this
    /// session are in place: an output itself, or a file or directory
    /// inside an output directory, read from the stored tree listing. So a
    /// stage reading inside an output that a fresh upstream stage will
    /// restore is judged by the restored bytes, not the workspace copy the
    /// restore replaces. `None`: no known output holds it (read the
    /// workspace).
    fn upstream_digest(&mut self, path: &str) -> Option<Digest> {
        if let Some(digest) = self.produced.get(path) {
            return Some(*digest);
        }
        let mut end = path.len();
        while let Some(slash) = path[..end].rfind('/') {
            end = slash;
            let Some(digest) = self.produced.get(&path[..slash]).copied() else {
                continue;
            };
            let store = &self.store;
            let listing = self
                .listings
                .entry(digest)
                .or_insert_with(|| store.tree(&digest).ok().map(TreeListing::new));
            return listing.as_ref()?.digest_of(&path[slash + 1..]);
        }
        None
    }

    /// Records the outputs of a stage as this session's upstream digests.
    pub fn note_outputs(&mut self, outputs: &[OutputRecord]) {
        for output in outputs {
            self.produced.insert(output.path.clone(), output.digest);
        }
    }

    /// True if the workspace copy of `output` matches its recorded digest.
    /// (Asked of a fresh stage's outputs, which this run does not write
    /// before: see `content_with_stated`.)
    pub fn workspace_matches(&mut self, output: &OutputRecord) -> bool {
        let abs = self.abs(&output.path);
        self.stat
            .content_with_stated(&abs)
            .is_ok_and(|c| c.digest() == output.digest)
    }

    /// Persists new stat-cache entries (when this process may write).
    /// With `prune`, when every stage was looked at, it also forgets the
    /// files no stage read or wrote this time: paths of removed stages and
    /// items, and files gone from input directories.
    pub fn save_stat_cache(&mut self, prune: bool) -> Result<(), ScheduleError> {
        let forgotten = if prune {
            self.stat.untouched()
        } else {
            Vec::new()
        };
        let updates = self.stat.take_updates(crate::fingerprint::now_ns());
        if let Some(ledger) = &mut self.ledger {
            ledger.save_stat_cache(&updates, &forgotten)?;
        }
        Ok(())
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

/// The jobs dead runs left for stage `stage`, from every stage's, read from
/// `ledger` the first time a stage asks (see [`Ledger::orphaned_jobs`]).
/// What was read stays true for each stage when it asks: a stage adopts or
/// cancels only its own jobs, after it asked, and no other run writes while
/// this one holds the workspace.
fn orphaned_jobs(
    orphaned: &mut Option<OrphanedJobs>,
    ledger: &Ledger,
    stage: &str,
) -> Result<Vec<(String, Digest, String)>, StoreError> {
    let all = match orphaned {
        Some(all) => all,
        None => orphaned.insert(ledger.orphaned_jobs()?),
    };
    Ok(all.get(stage).cloned().unwrap_or_default())
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
            ctx.item_plans[&0][0].inputs.to_vec()
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
        let inputs: Vec<_> = ctx.item_plans[&copy]
            .iter()
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
