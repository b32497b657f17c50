//! What the scheduler knows about a workspace, and how it decides freshness.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::Arc;

use super::ScheduleError;
use super::items::{fill, in_key_order, load_items};
use crate::exec::ImageResolver;
use crate::fingerprint::{
    Digest, EntryKind, StageKey, StatCache, TreeEntry, add_item_components, image_component,
    path_bytes, stage_key, tree_digest,
};
use crate::graph::Dag;
use crate::manifest::{Manifest, OutputIndex, is_per_item};
use crate::schedule::proof::kept_plans::{KeptPlan, OutcomesRead};
use crate::store::{
    COMMAND_ITEM, Ledger, LockFile, ObjectStore, OrphanedJobs, OutputRecord, ResultRecord,
    StoreError,
};

/// How many items are listed before what they read is read (their files
/// `stat`ed side by side): enough to keep the threads busy, few enough
/// that their reads are not held for a million items at once.
const ITEM_BLOCK: usize = 16_384;

mod history;
mod item_plans;
mod keyed;

pub use history::History;
pub use keyed::{Items, Keyed, Plan};

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
    /// What each stage's last `key_of` learned besides its key.
    keyed: keyed::ByStage,
    /// Whether a dirty stage's reason lists the components that changed.
    pub explain: bool,
    /// Every stage's jobs that dead runs left, once a stage asked.
    orphaned: Option<OrphanedJobs>,
    /// Pins image references, asking a registry once per tag.
    resolver: Arc<ImageResolver>,
    /// Stored tree listings of upstream directory outputs, by digest
    /// (`None`: not in the store).
    listings: HashMap<Digest, Option<TreeListing>>,
    /// The variables the keys read from cairn's environment: the digest
    /// of each value (`None`: unset). Never the values.
    pub env_read: BTreeMap<String, Option<Digest>>,
    /// The item plans the last proof kept, by stage, when it failed: what
    /// a stage whose list is unchanged is planned from (see
    /// [`super::kept_plans`]).
    kept_plans: HashMap<String, KeptPlan>,
    /// The key of the last proof, when the plans kept beside it are read
    /// only once a per-item stage is planned (a command that only reads
    /// may plan none: `log`, `show STAGE/KEY`).
    kept_plans_key: Option<[u8; 32]>,
    /// The outcomes of stages with a kept plan, read ahead while the
    /// manifest was parsed, by stage, under the code they were read for.
    outcomes_read: OutcomesRead,
    /// This checkout's part of every job name (see `task::job_prefix`),
    /// made when the first job is named.
    pub workspace_tag: std::sync::OnceLock<String>,
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
            keyed: HashMap::new(),
            explain: true,
            orphaned: None,
            resolver: Arc::default(),
            listings: HashMap::new(),
            env_read: BTreeMap::new(),
            kept_plans: kept_plans
                .into_iter()
                .map(|plan| (plan.stage.clone(), plan))
                .collect(),
            kept_plans_key: None,
            outcomes_read,
            workspace_tag: std::sync::OnceLock::new(),
        }
    }

    /// With the item plans kept beside the proof made under `key` (see
    /// [`crate::schedule::proof::key_of`]), read once a per-item stage is
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
    /// outputs known to this session count by their recorded digests. What
    /// making it learned is kept, as [`Keyed`], until it is acted on.
    pub fn key_of(&mut self, i: usize) -> Result<StageKey, ScheduleError> {
        self.keyed.remove(&i);
        let (key, keyed) = self.make_key(i)?;
        self.keyed.insert(i, keyed);
        Ok(key)
    }

    /// Stage `i`'s key, and all that making it learned.
    fn make_key(&mut self, i: usize) -> Result<(StageKey, Keyed), ScheduleError> {
        let manifest = self.manifest;
        let stage = &manifest.stages[i];
        let mut digests = Vec::with_capacity(stage.inputs.len());
        for (n, input) in stage.inputs.iter().enumerate() {
            if let Some(pin) = &input.pinned {
                // A fetched input is what its pin says, fetched or not.
                digests.push(pinned_digest(pin));
                continue;
            }
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
        let mut keyed = Keyed {
            inputs: digests,
            image: None,
            items: None,
        };
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
            keyed.image = Some(pinned);
        }
        if let Some(foreach) = &stage.foreach {
            // The stage as a whole is its template plus each item's
            // fingerprint: adding one item changes it, but each item is
            // judged by its own fingerprint.
            let code = key.fingerprint();
            let planned = self.plan_items(i, &code)?;
            // (Its merged output is in key order too.)
            let listing = in_key_order(&planned.plan)
                .map(|planned| (planned.item.key.as_str(), &planned.fingerprint));
            add_item_components(&mut key, foreach, listing, planned.plan.len());
            keyed.items = Some(Items {
                code,
                plan: Plan::Held(planned.plan),
                orphans: planned.orphans,
                list_seen: planned.list_seen,
                from_kept: planned.from_kept,
            });
        }
        Ok((key, keyed))
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
            let items = self.keyed.get_mut(&i).and_then(|k| k.items.as_mut());
            return Ok(items
                .map(|it| std::mem::take(&mut it.orphans))
                .unwrap_or_default());
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

/// What a stage's key holds for a fetched input: its pin, so that the key
/// is known without the bytes (a machine that never fetched them, a run
/// that finds the stage fresh and fetches nothing).
fn pinned_digest(pin: &crate::manifest::Pin) -> Digest {
    Digest::of(format!("fetched\0sha256:{}", pin.sha256).as_bytes())
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
