//! One stage's work once it must run: prepare its job, run the command and
//! the checks, then store the outputs. Runs as a tokio task; talks back to
//! the dispatcher through [`TaskLinks`].
//!
//! A plain stage runs its command as one implicit item ([`command`]); a
//! per-item stage runs its items in a bounded window ([`item_window`]), each
//! item through its attempts ([`attempt`]). Every attempt is classified
//! ([`classify`]) and retried by the stage's `retry`.

mod attempt;
mod classify;
mod command;
mod item_window;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use tokio::sync::mpsc::UnboundedSender;
use tokio::task::JoinSet;

use super::ScheduleError;
use super::context::Context;
use super::inputs_read::InputsRead;
use super::item_outputs::ItemOutputs;
use super::items::{Item, ItemCounts, PlannedItem, aggregate, file_name, fill, fill_command};
use super::limits::Limits;
use super::services::Services;
use super::shared_cache::Uploads;
use crate::exec::{Executor, HeldWindow, Job, Outcome, RUN_MARKER, base_environment, redact_text};
use crate::fingerprint::{Digest, StatCache, StatEntry};
use crate::manifest::{ClassifyRule, Command, EnvValue, Foreach, ItemClass, Retry, Stage};
use crate::store::shared_cache::{Producer, RemoteCache};
use crate::store::{ItemAttempt, ObjectStore, OutputRecord, Published, RUNNING, now_ms};
use attempt::ItemRunner;
use classify::classify;
use item_window::cancel_orphans;

/// How a stage's command, checks and output storage ended.
pub struct TaskResult {
    /// False if the run stopped before the command could start.
    pub started: bool,
    pub outcome: Outcome,
    /// Why the stage failed, if it did.
    pub failure: Option<String>,
    /// The stored outputs, when it succeeded.
    pub published: Option<Published>,
    /// A per-item stage that ran only some of its items (`--limit`,
    /// `--only`): not a failure, but not complete either.
    pub partial: Option<String>,
    pub started_ms: i64,
    /// The log that shows why it failed, when that is not the stage's own:
    /// a failing item's.
    pub failure_log: Option<PathBuf>,
    /// Jobs a dead run left for items no longer wanted, cancelled now
    /// (their handles).
    pub cancelled_orphans: Vec<String>,
    /// A plain stage's last attempt, to be recorded with its result.
    pub last_attempt: Option<ItemAttempt>,
    /// A per-item stage's stat entries of its item outputs, as the task
    /// found and wrote them.
    pub stat: Option<StatCache>,
}

impl TaskResult {
    fn not_started() -> Self {
        TaskResult {
            started: false,
            outcome: Outcome::Success,
            failure: None,
            published: None,
            partial: None,
            started_ms: now_ms(),
            failure_log: None,
            cancelled_orphans: Vec::new(),
            last_attempt: None,
            stat: None,
        }
    }
}

/// What a running task tells the dispatcher before it ends.
pub struct TaskLinks {
    pub stage: usize,
    /// Told the output digests as soon as they are final, so downstream
    /// stages can start while the objects are made durable.
    pub hashed: UnboundedSender<Hashed>,
    /// Told every finished attempt of an item, to be recorded at once.
    pub attempts: UnboundedSender<ItemAttempt>,
}

/// A stage's outputs, hashed: final for everything downstream.
pub struct Hashed {
    pub stage: usize,
    pub records: Vec<OutputRecord>,
    /// The stat entries of the files the store hashed as it copied them.
    pub seen: Vec<(PathBuf, StatEntry)>,
    pub elapsed: Duration,
}

/// Which unfinished items a run takes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Only {
    /// Never attempted under their current fingerprint.
    Pending,
    /// Last attempt failed on infrastructure.
    Infra,
    /// Last attempt ended in error.
    Error,
}

/// The per-item part of a task.
struct Items {
    name: String,
    spec: Foreach,
    outputs: ItemOutputs,
    /// The stat cache's entries of the item outputs, given back with the
    /// result.
    stat: StatCache,
    plan: Vec<PlannedItem>,
    only: Option<Only>,
    limit: Option<usize>,
    log_dir: PathBuf,
}

/// What a built-in stage's process is told of the pipeline it runs in: the
/// manifest's path and the profile applied.
pub const MANIFEST_VAR: &str = "CAIRN_MANIFEST";
pub const PROFILE_VAR: &str = "CAIRN_PROFILE";

/// A built-in stage's command (`cairn builtin …`) with the running cairn
/// binary in place of `cairn`, so that the same build runs it.
fn builtin_command(command: &Command) -> Command {
    match (command, std::env::current_exe()) {
        (Command::Exec(argv), Ok(exe)) if !argv.is_empty() => {
            let mut argv = argv.clone();
            argv[0] = exe.to_string_lossy().into_owned();
            Command::Exec(argv)
        }
        _ => command.clone(),
    }
}

/// The resources a stage holds (indices into `[resources]`).
#[derive(Debug, Clone, Default)]
pub struct Holds {
    /// Held by each command: the stage's, or each item's.
    pub per_command: Vec<usize>,
    /// Held once by a per-item stage for as long as its items run.
    pub per_stage: Vec<usize>,
}

/// The job named `job.name` if its engine has it (an earlier process
/// submitted it: adopted, and what it wrote is kept), else `job` submitted
/// once `before_submit` (clearing the outputs it will write) has run; or
/// the engine's refusal to take it.
async fn start_job(
    executor: &dyn Executor,
    job: &Job,
    before_submit: impl FnOnce() -> Result<(), ScheduleError>,
) -> Result<Started, ScheduleError> {
    if let Some(adopted) = executor.attach(job).await? {
        tracing::info!(job = %job.name, handle = %adopted.handle(), "adopted a job already submitted");
        return Ok(Started::Running(adopted));
    }
    before_submit()?;
    match executor.submit(job).await {
        Ok(running) => Ok(Started::Running(running)),
        // The engine would not take the job now (a busy or refusing
        // controller): an infrastructure failure of this attempt, said in
        // its log, never a verdict and never the stage's end.
        Err(crate::exec::ExecError::Engine {
            engine,
            action: "submit",
            detail,
        }) => {
            tracing::warn!(job = %job.name, "{engine} refused the job: {detail}");
            let line = format!("cairn: {engine} refused the job: {detail}\n");
            append(&job.log, line.as_bytes()).map_err(|source| ScheduleError::Io {
                path: job.log.clone(),
                source,
            })?;
            Ok(Started::Refused)
        }
        Err(other) => Err(other.into()),
    }
}

/// A job on its way, or refused by its engine.
enum Started {
    Running(Box<dyn crate::exec::Running>),
    Refused,
}

impl Started {
    /// The job's handle, and its outcome once it ends (a refused job's is
    /// an infrastructure failure at once). `on_record` runs as soon as the
    /// job has a handle, before it is waited for.
    async fn outcome(
        self,
        on_record: impl FnOnce(&str),
    ) -> Result<(Option<String>, Outcome), ScheduleError> {
        match self {
            Started::Running(running) => {
                let handle = running.handle();
                on_record(&handle);
                Ok((Some(handle), running.wait().await?))
            }
            Started::Refused => Ok((None, Outcome::Infra(crate::exec::InfraKind::SubmitFailed))),
        }
    }
}

fn append(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?
        .write_all(bytes)
}

/// Gives the windows back; one that cannot be is left to lapse on its own.
async fn release_windows(held: Vec<Box<dyn HeldWindow>>) {
    for window in held {
        if let Err(error) = window.release().await {
            tracing::warn!(error = %error, "could not release a window; it lapses on its own");
        }
    }
}

/// A declared output: (name, path as written, absolute path).
pub type Declared = (String, String, PathBuf);

/// Everything a task needs, detached from the dispatcher's borrows.
pub struct StageTask {
    job: Job,
    checks: Vec<Command>,
    store: ObjectStore,
    outputs: Vec<Declared>,
    limits: Limits,
    /// The resources the stage holds.
    holds: Holds,
    /// The stage's rank in the topological order: earlier goes first.
    priority: u64,
    /// Set for a per-item stage.
    items: Option<Items>,
    job_prefix: String,
    /// `JOB_PREFIX-FINGERPRINT`: the command's job name without its
    /// attempt number.
    job_name_stem: String,
    /// The stage's fingerprint.
    fingerprint: Digest,
    /// Attempts of the command under this fingerprint in earlier runs.
    attempts_before: u32,
    classify: Vec<ClassifyRule>,
    retry: Retry,
    run_id: i64,
    /// Jobs a dead run left that this run no longer wants (for items no
    /// longer planned, or for the command under another fingerprint):
    /// each handle, and an executor of its engine (if this run has one).
    orphans: Vec<(String, Option<Arc<dyn Executor>>)>,
    /// Windows held across a cluster while its items run: (resource, the
    /// executor whose cluster holds it).
    windows: Vec<(String, Arc<dyn Executor>)>,
    /// The remote cache items are looked up in, and the uploads of what
    /// they validate.
    remote: Option<Arc<RemoteCache>>,
    uploads: Option<Uploads>,
    /// Who runs its commands, for the entries it uploads.
    producer: Producer,
    /// The services its commands reach, and the run's services.
    services: Vec<String>,
    run_services: Option<Arc<Services>>,
    /// What its commands read, to look at again when each ends.
    inputs_read: Option<Arc<InputsRead>>,
    /// Its inputs fetched by URL, made present before anything runs.
    fetched: Vec<crate::manifest::Pin>,
}

/// The run a task is part of.
#[derive(Clone, Copy)]
pub struct ThisRun<'r> {
    pub id: i64,
    /// Marks the environment of every command of the run.
    pub token: &'r str,
    /// Where the run's logs are written.
    pub log_dir: &'r Path,
    /// Job slots and resources, shared by the run's tasks.
    pub limits: &'r Limits,
}

/// The start of every job name of `stage`: `cairn-STAGE-WORKSPACE`, where
/// WORKSPACE is 8 hex digits of the project root, the pipeline name and
/// the checkout's own id (`store::layout::workspace_id`), so two checkouts of one
/// pipeline sharing a cluster never adopt each other's jobs, even at the
/// same path on two machines.
fn job_prefix(ctx: &Context<'_>, stage: &Stage) -> String {
    let workspace = ctx.workspace_tag.get_or_init(|| {
        let id = crate::store::layout::workspace_id(&ctx.manifest.cache_dir());
        let digest = crate::fingerprint::Digest::of(
            format!(
                "{}\0{}\0{id}",
                ctx.manifest.root.display(),
                ctx.manifest.name
            )
            .as_bytes(),
        );
        digest.hex()[..8].to_owned()
    });
    format!("cairn-{}-{workspace}", stage.name)
}

impl StageTask {
    /// Builds stage `i`'s job for `run`: the command, the project root,
    /// the environment; it holds `holds` while it runs, and goes before
    /// the ready tasks of a greater `priority`.
    pub fn prepare(
        ctx: &Context<'_>,
        i: usize,
        fingerprint: &Digest,
        run: &ThisRun<'_>,
        holds: Holds,
        priority: u64,
    ) -> Result<Self, ScheduleError> {
        let ThisRun {
            id: run_id,
            token: run_token,
            log_dir,
            limits,
        } = *run;
        let limits = limits.clone();
        let stage = &ctx.manifest.stages[i];
        // The same fingerprint and attempt give the same job name in every
        // run: a job an earlier cairn process submitted for this attempt
        // (it was killed meanwhile) is adopted, not submitted again.
        let attempts_before = match (&ctx.ledger, &stage.foreach) {
            (Some(ledger), None) => ledger.command_attempts(&stage.name, fingerprint)?,
            _ => 0,
        };
        let job_prefix = job_prefix(ctx, stage);
        let job_name_stem = format!("{job_prefix}-{}", &fingerprint.hex()[..16]);
        let outputs = stage
            .outputs
            .iter()
            .map(|output| {
                (
                    output.name.clone(),
                    output.path.to_string(),
                    output.path.resolve(&ctx.manifest.root),
                )
            })
            .collect();
        let mut env = base_environment();
        env.push((RUN_MARKER.to_owned(), run_token.to_owned()));
        if let Some(uses) = &stage.uses {
            // A built-in that reads the workspace (`lineage`) finds it here:
            // it runs in the project root, so the path is absolute.
            let manifest = std::path::absolute(&ctx.manifest.path)
                .unwrap_or_else(|_| ctx.manifest.path.clone());
            env.push((
                MANIFEST_VAR.to_owned(),
                manifest.to_string_lossy().into_owned(),
            ));
            if let Some(profile) = &ctx.manifest.profile {
                env.push((PROFILE_VAR.to_owned(), profile.clone()));
            }
            if uses.name == "lineage" {
                // It fingerprints the stages as this run did: with the
                // variables they pass through (hashed, never shown).
                for (name, _) in ctx
                    .manifest
                    .stages
                    .iter()
                    .flat_map(|s| &s.env)
                    .filter(|(_, value)| matches!(value, EnvValue::PassThrough))
                {
                    if let Ok(value) = std::env::var(name) {
                        env.retain(|(k, _)| k != name);
                        env.push((name.clone(), value));
                    }
                }
            }
        }
        for (name, value) in &stage.env {
            let value = match value {
                EnvValue::Literal(text) => Some(text.clone()),
                EnvValue::PassThrough => std::env::var(name).ok(),
            };
            env.retain(|(k, _)| k != name);
            if let Some(value) = value {
                env.push((name.clone(), value));
            }
        }
        let mut redact = Vec::new();
        for name in &stage.secrets {
            if let Ok(value) = std::env::var(name) {
                env.retain(|(k, _)| k != name);
                env.push((name.clone(), value.clone()));
                // Too short a value would redact ordinary text.
                if value.len() >= 4 {
                    redact.push((name.clone(), value));
                }
            }
        }
        Ok(Self {
            job: Job {
                // Named per attempt (items' jobs by the item's fingerprint).
                name: format!("{job_name_stem}-{}", attempts_before + 1),
                token: run_token.to_owned(),
                stage: stage.name.clone(),
                command: match &stage.uses {
                    Some(_) => builtin_command(&stage.run),
                    None => stage.run.clone(),
                },
                cwd: ctx.manifest.root.clone(),
                env,
                timeout: stage.timeout,
                log: log_dir.join(format!("{}.log", stage.name)),
                redact,
                secrets: stage.secrets.clone(),
                // Pinned when the stage was fingerprinted (per-item images
                // are set on each item's job).
                image: (ctx.keyed(i))
                    .and_then(|keyed| keyed.image.as_ref())
                    .map(|pinned| pinned.reference.clone()),
            },
            checks: stage.checks.clone(),
            store: ctx.store.clone(),
            outputs,
            limits,
            holds,
            priority,
            items: None,
            job_prefix,
            job_name_stem,
            fingerprint: *fingerprint,
            attempts_before,
            classify: stage.classify.clone(),
            retry: stage.retry.clone(),
            run_id,
            orphans: Vec::new(),
            windows: Vec::new(),
            remote: None,
            uploads: None,
            producer: super::shared_cache::producer(ctx.manifest, stage, 0, 0, None),
            services: stage.services.iter().map(|s| s.name.clone()).collect(),
            run_services: None,
            inputs_read: None,
            fetched: (stage.inputs.iter())
                .filter_map(|input| input.pinned.clone())
                .collect(),
        })
    }

    /// Looks at what its commands read again through `inputs_read` when
    /// each ends, before anything of it is recorded.
    pub fn with_inputs_read(mut self, inputs_read: InputsRead) -> Self {
        self.inputs_read = Some(Arc::new(inputs_read));
        self
    }

    /// Why the stage's command cannot be recorded: an input it read
    /// changed while it ran (see [`super::inputs_read`]).
    fn input_changed(&self) -> Option<String> {
        self.inputs_read.as_ref()?.changed_for_stage()
    }

    /// Brings up the services its commands reach (through `services`,
    /// the run's) before the first of them runs.
    pub fn with_services(mut self, services: &Arc<Services>) -> Self {
        self.run_services = Some(services.clone());
        self
    }

    /// Why the stage's commands cannot be trusted if a service they used
    /// died while they ran (whatever they made of its silence).
    async fn service_died(&self) -> Option<String> {
        let services = self.run_services.as_ref()?;
        services.still_up(&self.services).await.err()
    }

    /// Each service the stage uses, up and checked, in its commands'
    /// environment; or why one could not be. Called once the stage holds
    /// what it needs to run (a job slot, its resources) and has something
    /// to run.
    async fn reach_services(&mut self) -> Result<(), ScheduleError> {
        let Some(services) = self.run_services.clone() else {
            return Ok(());
        };
        for name in &self.services {
            if services.is_per_group(name) {
                // Reached group by group, as each group's items run.
                continue;
            }
            let (variable, url) = tokio::select! {
                reached = services.reach(name) => reached.map_err(ScheduleError::Service)?,
                () = self.limits.stopped() => return Ok(()),
            };
            self.job.env.retain(|(k, _)| *k != variable);
            self.job.env.push((variable, url));
        }
        Ok(())
    }

    /// The per-group services the stage uses, up for `group` (another
    /// group's stopped first): the variables and URLs its items get.
    async fn reach_group_services(
        &self,
        group: &str,
    ) -> Result<Vec<(String, String)>, ScheduleError> {
        let Some(services) = self.run_services.clone() else {
            return Ok(Vec::new());
        };
        let mut env = Vec::new();
        for name in self.services.iter().filter(|n| services.is_per_group(n)) {
            let reached = tokio::select! {
                reached = services.reach_for(name, Some(group)) => reached.map_err(ScheduleError::Service)?,
                () = self.limits.stopped() => return Ok(env),
            };
            env.push(reached);
        }
        Ok(env)
    }

    /// Looks its items up in `remote` before they run, and uploads what
    /// they validate through `uploads`.
    pub fn with_remote(
        mut self,
        remote: Option<Arc<RemoteCache>>,
        uploads: Option<Uploads>,
    ) -> Self {
        self.remote = remote;
        self.uploads = uploads;
        self
    }

    /// Cancels `orphans`, jobs a dead run left that this run does not want,
    /// before anything runs.
    pub fn with_orphans(mut self, orphans: Vec<(String, Option<Arc<dyn Executor>>)>) -> Self {
        self.orphans = orphans;
        self
    }

    /// Holds `windows` across their clusters while the command (or the
    /// items) run, taken in the order given.
    pub fn with_windows(mut self, windows: Vec<(String, Arc<dyn Executor>)>) -> Self {
        self.windows = windows;
        self
    }

    /// Takes every window across its cluster (waiting while another run
    /// holds one); `None` if this run stopped first.
    async fn hold_windows(&self) -> Result<Option<Vec<Box<dyn HeldWindow>>>, ScheduleError> {
        let mut held = Vec::new();
        for (resource, executor) in &self.windows {
            let window = tokio::select! {
                window = executor.hold_window(resource, &self.job) => window?,
                () = self.limits.stopped() => {
                    release_windows(held).await;
                    return Ok(None);
                }
            };
            held.extend(window);
        }
        Ok(Some(held))
    }

    /// Makes this the task of a per-item stage over `plan`; `stat` is the
    /// project's stat cache.
    pub fn with_items(
        mut self,
        stage: &Stage,
        plan: Vec<PlannedItem>,
        only: Option<Only>,
        limit: Option<usize>,
        stat: &StatCache,
    ) -> Self {
        let log_dir = self.job.log.with_file_name(&stage.name);
        let spec = stage.foreach.clone().expect("a per-item stage");
        let outputs = ItemOutputs::of(stage, &self.job.cwd);
        self.items = Some(Items {
            name: stage.name.clone(),
            spec,
            stat: outputs.stat_subset(stat),
            outputs,
            plan,
            only,
            limit,
            log_dir,
        });
        self
    }

    /// Removes the stage's stale outputs and creates their parent
    /// directories.
    fn clear_outputs(&self) -> Result<(), ScheduleError> {
        self.clear_outputs_where(|_| true)
    }

    /// [`Self::clear_outputs`] for the outputs whose name passes `wanted`.
    fn clear_outputs_where(&self, wanted: impl Fn(&str) -> bool) -> Result<(), ScheduleError> {
        for (_, _, abs) in self.outputs.iter().filter(|(name, _, _)| wanted(name)) {
            self.store
                .clear_away(abs)
                .map_err(|source| ScheduleError::Io {
                    path: abs.clone(),
                    source,
                })?;
            // (Looked at first: `create_dir_all` tries `mkdir` first, and
            // the directory is nearly always there.)
            if let Some(parent) = abs.parent()
                && !parent.is_dir()
            {
                std::fs::create_dir_all(parent).map_err(|source| ScheduleError::Io {
                    path: parent.to_owned(),
                    source,
                })?;
            }
        }
        Ok(())
    }

    /// Runs the command, then the checks; then stores the outputs.
    pub async fn run(
        self,
        executor: Arc<dyn Executor>,
        links: TaskLinks,
    ) -> Result<TaskResult, ScheduleError> {
        crate::store::fetched::ensure(&self.job.cwd, &self.fetched)
            .await
            .map_err(|message| ScheduleError::Fetch {
                stage: self.job.stage.clone(),
                message,
            })?;
        if self.items.is_some() {
            return self.run_items(executor, links).await;
        }
        self.run_command(executor, links).await
    }

    /// Stages the outputs, announces their digests, then publishes them.
    /// Stores the outputs; directories are listed through `listing` (see
    /// [`ObjectStore::stage_listed`]), given back with what it learned
    /// taken out into the published entries.
    async fn store_outputs(
        self,
        links: &TaskLinks,
        started: Instant,
        mut listing: StatCache,
    ) -> Result<(Published, StatCache), ScheduleError> {
        // Small files go inline into the ledger: a read of a few kilobytes,
        // not worth a trip to the blocking pool. Anything bigger is copied
        // and fsynced there.
        let store = self.store;
        let outputs = self.outputs;
        let small = store.stage_small(&outputs)?;
        let in_place = small.is_some();
        let (staged, listing) = if let Some(staged) = small {
            (staged, listing)
        } else {
            let staging_store = store.clone();
            tokio::task::spawn_blocking(move || {
                staging_store
                    .stage_listed(&outputs, &mut listing)
                    .map(|staged| (staged, listing))
            })
            .await
            .map_err(|e| ScheduleError::Task(e.to_string()))??
        };
        let _ = links.hashed.send(Hashed {
            stage: links.stage,
            records: staged.records.clone(),
            seen: staged.seen().to_vec(),
            elapsed: started.elapsed(),
        });
        let published = if in_place {
            store.publish(staged)?
        } else {
            tokio::task::spawn_blocking(move || store.publish(staged))
                .await
                .map_err(|e| ScheduleError::Task(e.to_string()))??
        };
        Ok((published, listing))
    }
}

pub use crate::exec::{ATTEMPT_MARKER, ITEM_MARKER, SAMPLE_MARKER, SEED_MARKER};
