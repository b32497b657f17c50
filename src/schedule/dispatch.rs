//! The dispatcher: runs the selected stages in dependency order, at most
//! `jobs` at a time, skipping what is validated and committing each result
//! as soon as it is complete. It owns the run's state; tasks (`task.rs`)
//! report back through channels, and reporters see [`Event`]s.
//!
//! The loop is here; deciding each stage as its turn comes is in
//! [`evaluate`], recording what ran (results, failures) in [`record`], the
//! run's end (the lock file, the fresh proof) in [`end`], and the signals
//! that interrupt a run in [`interrupts`].

mod end;
mod evaluate;
mod interrupts;
mod record;
mod remote;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio::task::JoinSet;

use super::ScheduleError;
use super::context::Context;
use super::decision::DirtyReason;
use super::decision::{Asked, Verdict, decide};
use super::events::{Done, Event, Reporter};
use super::executors::Executors;
use super::inputs_read::{InputsRead, Read, made};
use super::items::PlannedItem;
use super::limits::Limits;
use super::proof::kept_plans::KeptItem;
use super::remote::{UploadWorker, Uploads};
use super::services::Services;
use super::task::{Hashed, Holds, Only, StageTask, TaskLinks, TaskResult};
use super::timeline::{StageState, Timeline};
use crate::exec::kill_marked_processes;
use crate::fingerprint::{Digest, StageKey};
use crate::manifest::ItemClass;
use crate::store::remote::{Fetched, RemoteCache};
use crate::store::reserve;
use crate::store::{COMMAND_ITEM, KeptBeside, LedgerWriter, Record, Recorded, ResultRow};
use crate::store::{
    ItemAttempt, Ledger, LockFile, NewResult, OutputRecord, Published, RUNNING, ResultRecord,
    ResultStatus, RunCounts, StoreError, now_ms,
};
use interrupts::Interrupts;
pub(crate) use record::new_lock_file;

#[derive(Debug, Clone)]
pub struct RunOptions {
    pub jobs: usize,
    pub keep_going: bool,
    /// Stages `--force` named: they run even if fresh, and a per-item
    /// stage re-runs all its items...
    pub forced: HashSet<usize>,
    /// ...unless only some of its items were named (`--force STAGE/ITEM`):
    /// then just these re-run.
    pub forced_items: HashMap<usize, BTreeSet<String>>,
    pub selected: Vec<bool>,
    /// The command line, recorded with the run.
    pub invocation: String,
    /// Per-item stages run at most this many items each.
    pub limit: Option<usize>,
    /// Per-item stages run only items in this state.
    pub only: Option<Only>,
    /// `--locked`: never rewrite the lock file; report what would change.
    pub locked: bool,
    /// A cache shared across machines: looked up before a stage or an
    /// item runs, given what this run validates.
    pub remote: Option<Arc<RemoteCache>>,
    /// A manifest kept beside the proof was read and not taken up (see
    /// `manifest::kept`): the proof this run keeps gets the manifest anew.
    pub kept_manifest_refused: bool,
    /// The file the last run's proof found changed, when it failed: the
    /// stages that read it are weighed first (they are the likeliest to
    /// run), the others after their commands started.
    pub changed: Option<PathBuf>,
}

#[derive(Debug, Clone, Default)]
pub struct RunSummary {
    pub run_id: i64,
    pub counts: RunCounts,
    pub failed: Vec<String>,
    /// Stages not attempted because an upstream stage failed.
    pub blocked: Vec<String>,
    /// Stages not attempted because the run stopped first (a failure
    /// elsewhere without `--keep-going`, or an interrupt).
    pub stopped: Vec<String>,
    /// Stages running when the run was interrupted (their commands killed).
    pub cut_short: Vec<String>,
    /// Per-item stages that ran only some of their items.
    pub partial: Vec<String>,
    pub interrupted: bool,
    /// With `--locked`: stages whose lock-file entry this run would have
    /// changed (the lock file was left as it is).
    pub lock_differs: Vec<String>,
    /// Stages whose result came from the remote cache.
    pub from_remote: Vec<String>,
    /// Uploads to the remote cache still unfinished when the run ended.
    pub uploads_unfinished: usize,
}

impl RunSummary {
    /// Selected stages that were never attempted.
    pub fn not_attempted(&self) -> usize {
        self.blocked.len() + self.stopped.len()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Waiting,
    Running,
    Ok,
    Failed,
    /// A per-item stage with items left for a later run.
    Partial,
}

type Joined = (usize, StageKey, Result<TaskResult, ScheduleError>);
/// A stage's remote lookup: the stage, its key, why it must run if the
/// remote has nothing, what the remote had.
type LookedUp = (usize, StageKey, DirtyReason, Option<Fetched>);

/// Whether a task made its stage's outputs (its result is to be recorded).
fn succeeded(result: &Result<TaskResult, ScheduleError>) -> bool {
    matches!(result, Ok(task) if task.failure.is_none() && task.partial.is_none())
}

/// Every item attempt already sent and not yet recorded.
fn pending(attempts: &mut UnboundedReceiver<ItemAttempt>) -> Vec<ItemAttempt> {
    let mut batch = Vec::new();
    while let Ok(attempt) = attempts.try_recv() {
        batch.push(attempt);
    }
    batch
}

/// How long a run waits at its end for its uploads to the remote cache.
const UPLOADS_WAIT: Duration = Duration::from_secs(120);

/// Runs the selected stages; see the module documentation.
pub async fn run(
    ctx: &mut Context<'_>,
    options: &RunOptions,
    reporter: &mut dyn Reporter,
) -> Result<RunSummary, ScheduleError> {
    let (mut dispatcher, mut answered) = Dispatcher::begin(ctx, options, reporter)?;
    let driven = dispatcher.drive(&mut answered).await;
    dispatcher.services.stop_all().await;
    // Whatever a command or a service started that left its process group
    // (a daemon) and still carries this run's marker, looked for in all of
    // `/proc` while the run's end is made (half a millisecond). A run that
    // started no task (a no-op) has none, and is spared the search.
    let leaked = dispatcher.launched.then(|| {
        let token = dispatcher.token.clone();
        std::thread::Builder::new()
            .name("cairn-leftovers".to_owned())
            .spawn(move || kill_marked_processes(&token))
            .map_err(|_| kill_marked_processes(&dispatcher.token))
    });
    // A run that ended early (an error) dropped its tasks: their remote
    // jobs are being cancelled on this runtime; let that finish.
    if !crate::exec::remote_jobs_released(CANCEL_WAIT).await {
        tracing::warn!("some remote jobs could not be cancelled in time");
    }
    // What this run validated reaches the remote cache before it exits.
    dispatcher.uploads = None;
    if let Some(worker) = dispatcher.upload_worker.take() {
        // An interrupted run is not kept waiting long.
        let wait = if dispatcher.summary.interrupted {
            Duration::from_secs(5)
        } else {
            UPLOADS_WAIT
        };
        // Ctrl-C gives up on them at once.
        dispatcher.summary.uploads_unfinished = tokio::select! {
            left = worker.drain(wait) => left,
            _ = tokio::signal::ctrl_c() => usize::MAX,
        };
    }
    // The stale outputs cleared out of the way meanwhile are gone before
    // the run returns: their removal ends while the run's end is made.
    let cleared = crate::store::cleared();
    let ended = match driven {
        Ok(()) => dispatcher.end(),
        Err(error) => {
            // What the ledger writer was sent is written before the run is
            // closed (a command's start after its run's close would stay
            // `running` for good); its answers no longer matter.
            dispatcher.hurry_writer();
            while dispatcher.unanswered > 0 && answered.recv().await.is_some() {
                dispatcher.unanswered -= 1;
            }
            dispatcher.close_as_failed();
            Err(error)
        }
    };
    cleared.wait();
    let leaked = match leaked {
        Some(Ok(search)) => search.join().unwrap_or(0),
        Some(Err(killed)) => killed,
        None => 0,
    };
    if leaked > 0 {
        tracing::warn!("killed {leaked} process(es) this run left behind");
    }
    ended
}

struct Dispatcher<'a, 'm> {
    ctx: &'a mut Context<'m>,
    options: &'a RunOptions,
    reporter: &'a mut dyn Reporter,
    run_id: i64,
    /// Marks the environment of every command of this run.
    token: String,
    log_dir: PathBuf,
    /// Each stage's rank in the topological order (ready stages start in it).
    rank: Vec<usize>,
    slots: Vec<Slot>,
    /// How many selected stages are [`Slot::Waiting`].
    waiting: usize,
    /// The end of the run, made ahead while its last commands run.
    end_draft: Option<end::EndDraft<'m>>,
    /// Unfinished selected upstream stages, per stage.
    remaining: Vec<usize>,
    ready: BTreeSet<(usize, usize)>,
    /// Job slots and resources, shared with the running tasks.
    limits: Limits,
    /// Per stage: the resources it holds while it runs (indices).
    holds: Vec<Holds>,
    /// The result each stage used in this run (fingerprint, outputs).
    used: HashMap<usize, (Digest, Vec<OutputRecord>)>,
    /// Some stage used a result other than its newest one (or made one).
    lock_changed: bool,
    /// The lock file's text as this run leaves it: written, or under
    /// `--locked` the text it would write.
    lock_text: Option<String>,
    stop: bool,
    summary: RunSummary,
    /// The connection item attempts are written through, on the blocking
    /// pool: hundreds of items ending keep the event loop (remote waits,
    /// log streams, Ctrl-C) free while SQLite writes.
    /// (Opened by the first items to record: a run of plain stages has
    /// none.)
    attempts_ledger: Option<Arc<std::sync::Mutex<Ledger>>>,
    /// The thread results and a plain stage's attempts are written on
    /// (started by the first), answering on `answers`; how many of its
    /// answers are still to come.
    writer: Option<LedgerWriter>,
    /// The sender the writer takes when it starts: its thread then holds
    /// the only one, so its answers end when it does.
    answers: Option<UnboundedSender<Recorded>>,
    unanswered: usize,
    /// Stages whose image tags were resolved off the event loop in this
    /// run (each is resolved once; its fingerprint then reads the answers).
    tags_resolved: HashSet<usize>,
    /// Stages already looked up in the remote cache in this run.
    looked_up: HashSet<usize>,
    /// Uploads of what this run validates, and the worker doing them.
    uploads: Option<Uploads>,
    upload_worker: Option<UploadWorker>,
    /// The services stages reach: brought up for the first that runs,
    /// stopped when the last that needs one has ended.
    services: Arc<Services>,
    /// What became of each selected stage, and when.
    timeline: Timeline,
    /// Some stage's task was started: only then can a process carry this
    /// run's marker.
    launched: bool,
}

/// How long an interrupted run waits for its remote jobs to be cancelled
/// (each cancellation has its own, shorter, limit).
const CANCEL_WAIT: Duration = Duration::from_secs(30);

/// Each stage's rank among the stages ready at once (lower first): its
/// place in the topological order, but the stages that read `changed` (a
/// file the last run's proof found changed) before every other.
fn ranks(ctx: &Context<'_>, changed: Option<&Path>) -> Vec<usize> {
    let manifest = ctx.manifest;
    // (As the proof named it: an input's path resolved in the root.)
    let changed = changed.and_then(|path| path.strip_prefix(&manifest.root).ok());
    let reads_changed = |i: usize| {
        changed.is_some_and(|changed| {
            manifest.stages[i]
                .inputs
                .iter()
                .any(|input| changed.starts_with(input.path.as_str()))
        })
    };
    let (first, rest): (Vec<usize>, Vec<usize>) = ctx
        .dag
        .order()
        .iter()
        .copied()
        .partition(|&i| reads_changed(i));
    let mut rank = vec![0; manifest.stages.len()];
    for (r, &i) in first.iter().chain(&rest).enumerate() {
        rank[i] = r;
    }
    rank
}

/// How many ready stages are weighed (found fresh, or started) before the
/// run looks at what its running commands did. Each takes some
/// microseconds: a thousand fresh ones weighed in one go would leave a
/// command that ended meanwhile unseen for milliseconds, and the stage
/// waiting on it unstarted.
const WEIGHED_AT_A_TIME: usize = 32;

impl<'a, 'm> Dispatcher<'a, 'm> {
    /// Reaps what a killed cairn left running, opens a run in the ledger.
    /// The receiver is where the ledger writer's answers arrive.
    fn begin(
        ctx: &'a mut Context<'m>,
        options: &'a RunOptions,
        reporter: &'a mut dyn Reporter,
    ) -> Result<(Self, UnboundedReceiver<Recorded>), ScheduleError> {
        let ledger = ctx.ledger.as_ref().ok_or(ScheduleError::NoLedger)?;
        for token in ledger.close_abandoned_runs()? {
            let killed = kill_marked_processes(&token);
            if killed > 0 {
                tracing::warn!(
                    "killed {killed} process(es) left running by a cairn process that died"
                );
            }
        }
        let token = format!("{}-{}", std::process::id(), now_ms());
        tracing::info!(
            stages = options.selected.iter().filter(|s| **s).count(),
            jobs = options.jobs,
            "starting run"
        );
        let manifest_digest = super::timeline::manifest_digest(ctx.manifest);
        let run_id = ledger.begin_run(
            &options.invocation,
            ctx.manifest.profile.as_deref(),
            &token,
            &manifest_digest,
        )?;
        reserve::keep(&ctx.manifest.cache_dir());
        let (answers, answered) = unbounded_channel();
        let log_dir = ctx
            .manifest
            .cache_dir()
            .join("logs")
            .join(run_id.to_string());
        std::fs::create_dir_all(&log_dir).map_err(|source| ScheduleError::Io {
            path: log_dir.clone(),
            source,
        })?;

        let n = ctx.manifest.stages.len();
        let rank = ranks(ctx, options.changed.as_deref());
        let remaining: Vec<usize> = (0..n)
            .map(|i| {
                ctx.dag
                    .upstream(i)
                    .iter()
                    .filter(|&&u| options.selected[u])
                    .count()
            })
            .collect();
        let ready: BTreeSet<(usize, usize)> = (0..n)
            .filter(|&i| options.selected[i] && remaining[i] == 0)
            .map(|i| (rank[i], i))
            .collect();
        let mut timeline = Timeline::new(ctx.manifest, &options.selected, ctx.dag.order());
        for &(_, i) in &ready {
            timeline.ready(i);
        }
        let names: Vec<&String> = ctx.manifest.resources.keys().collect();
        let limits = Limits::new(
            options.jobs,
            ctx.manifest.resources.values().map(|r| r.capacity),
        );
        let holds = ctx
            .manifest
            .stages
            .iter()
            .map(|stage| {
                let mut holds = Holds::default();
                for held in &stage.resources {
                    let Some(index) = names.iter().position(|n| **n == held.name) else {
                        continue;
                    };
                    let resource = &ctx.manifest.resources[&held.name];
                    if resource.per_stage && stage.foreach.is_some() {
                        holds.per_stage.push(index);
                    } else {
                        holds.per_command.push(index);
                    }
                }
                holds
            })
            .collect();
        reporter.event(Event::RunStarted {
            run_id,
            stages: options.selected.iter().filter(|s| **s).count(),
            manifest_digest: &manifest_digest,
        });
        // A lock file that cannot be trusted is rewritten.
        let lock_changed = ctx.lock_problem.is_some();
        let (uploads, upload_worker) = match &options.remote {
            Some(remote) if remote.uploads() => {
                let (uploads, worker) = Uploads::start(remote.clone(), ctx.store.clone());
                (Some(uploads), Some(worker))
            }
            _ => (None, None),
        };
        let services = Arc::new(Services::new(
            &ctx.manifest.root,
            &log_dir,
            &token,
            &ctx.manifest.services,
        ));
        let dispatcher = Self {
            ctx,
            options,
            reporter,
            run_id,
            token,
            log_dir,
            rank,
            slots: vec![Slot::Waiting; n],
            waiting: options.selected.iter().filter(|s| **s).count(),
            end_draft: None,
            remaining,
            ready,
            limits,
            holds,
            used: HashMap::new(),
            lock_changed,
            lock_text: None,
            stop: false,
            summary: RunSummary {
                run_id,
                ..Default::default()
            },
            attempts_ledger: None,
            writer: None,
            answers: Some(answers),
            unanswered: 0,
            tags_resolved: HashSet::new(),
            looked_up: HashSet::new(),
            launched: false,
            uploads,
            upload_worker,
            services,
            timeline,
        };
        Ok((dispatcher, answered))
    }

    /// The event loop: start what is ready, then wait for a task to report,
    /// a task to end, the ledger writer to answer, or Ctrl-C.
    async fn drive(
        &mut self,
        answered: &mut UnboundedReceiver<Recorded>,
    ) -> Result<(), ScheduleError> {
        let executors = Executors::of(self.ctx.manifest);
        let mut running: JoinSet<Joined> = JoinSet::new();
        let (hashed_tx, mut hashed_rx) = unbounded_channel::<Hashed>();
        let (attempts_tx, mut attempts_rx) = unbounded_channel::<ItemAttempt>();
        // Ctrl-C, SIGTERM and SIGHUP (a closed terminal or ssh session)
        // all interrupt the run.
        let mut interrupt = Interrupts::listen()?;

        // Stages waiting for their image tags to be resolved (off this
        // thread): each comes back ready when its registry has answered.
        let mut resolving: JoinSet<usize> = JoinSet::new();
        // Stages being looked up in the remote cache.
        let mut lookups: JoinSet<LookedUp> = JoinSet::new();

        loop {
            // A stage that turned out fresh may have been the last to
            // need a service.
            self.release_services().await;
            let more_ready = self.start_ready(
                &executors,
                &mut running,
                &mut resolving,
                &mut lookups,
                &hashed_tx,
                &attempts_tx,
            )?;
            if running.is_empty()
                && self.unanswered == 0
                && ((resolving.is_empty() && lookups.is_empty()) || self.stop)
            {
                return Ok(());
            }
            if running.is_empty() {
                // Nothing ends meanwhile to share the writer's commit.
                self.hurry_writer();
            }
            // Nothing is left to start: the end is drafted while the last
            // commands run, once they have started.
            let draft_due =
                !running.is_empty() && self.waiting == 0 && self.end_draft.is_none() && !self.stop;
            // In this order: releasing downstream stages first keeps the
            // critical path moving; recording results can wait a moment.
            tokio::select! {
                biased;
                Some(hashed) = hashed_rx.recv() => {
                    // A per-item stage's attempts were all sent before its
                    // outputs were hashed: they are recorded (and shown)
                    // before the stage is done.
                    self.item_attempts(pending(&mut attempts_rx)).await?;
                    self.outputs_known(hashed);
                    // Its commands are done: a service only it needed
                    // stops before the stages it releases start.
                    self.release_services().await;
                }
                Some(attempt) = attempts_rx.recv() => {
                    // Whatever else has finished meanwhile goes into the
                    // same transaction.
                    let mut batch = vec![attempt];
                    batch.extend(pending(&mut attempts_rx));
                    self.item_attempts(batch).await?;
                }
                joined = running.join_next(), if !running.is_empty() => {
                    let Some(joined) = joined else { continue };
                    let (i, key, result) = joined.map_err(|e| ScheduleError::Task(e.to_string()))?;
                    // A task reports its attempts and digests before it ends.
                    self.item_attempts(pending(&mut attempts_rx)).await?;
                    self.drain_hashed(&mut hashed_rx);
                    // The stages its digests released start their commands
                    // before its result is recorded (tasks run only when
                    // this loop waits).
                    tokio::task::yield_now().await;
                    // A failure is recorded here, after what the writer
                    // has of the stage (its attempt's start).
                    if !succeeded(&result) {
                        self.all_answered(answered).await?;
                    }
                    self.finished(i, &key, result)?;
                    self.release_services().await;
                }
                Some(looked) = lookups.join_next(), if !lookups.is_empty() => {
                    let (i, key, reason, fetched) = looked.map_err(|e| ScheduleError::Task(e.to_string()))?;
                    let reason = match fetched {
                        Some(fetched) => match self.adopt_remote(i, &key, fetched)? {
                            None => continue,
                            Some(reason) => reason,
                        },
                        None => reason,
                    };
                    if !self.stop {
                        self.start(i, key, reason, &executors, &mut running, &hashed_tx, &attempts_tx);
                    }
                }
                answer = answered.recv(), if self.unanswered > 0 => {
                    let Some(answer) = answer else {
                        return Err(ScheduleError::Task("the ledger writer stopped".to_owned()));
                    };
                    self.answered(answer)?;
                }
                Some(resolved) = resolving.join_next(), if !resolving.is_empty() => {
                    // The task cannot panic: it only waits for its thread.
                    if let Ok(i) = resolved {
                        self.ready.insert((self.rank[i], i));
                    }
                }
                () = interrupt.recv() => {
                    // What was running ends now, however long cancelling takes.
                    let cut_short = (0..self.slots.len()).filter(|&i| self.slots[i] == Slot::Running);
                    self.timeline.interrupted(cut_short);
                    resolving.abort_all();
                    lookups.abort_all();
                    running.abort_all();
                    while running.join_next().await.is_some() {}
                    // The items' tasks are dropped after their stages'
                    // (each cancels its remote job as it goes): wait for
                    // them while the runtime still runs.
                    let released = crate::exec::remote_jobs_released(CANCEL_WAIT).await;
                    if !released {
                        tracing::warn!("some remote jobs could not be cancelled in time");
                    }
                    // Items that finished before the interrupt are kept.
                    self.item_attempts(pending(&mut attempts_rx)).await?;
                    self.all_answered(answered).await?;
                    // Those that did not are cancelled, or left running
                    // for the next run to adopt or cancel (`--detach`, or
                    // a cancellation not confirmed in time).
                    if let Some(ledger) = &self.ctx.ledger {
                        let left_running = crate::exec::remote_jobs_detached() || !released;
                        ledger.close_running_attempts(self.run_id, left_running)?;
                    }
                    self.summary.interrupted = true;
                    self.reporter.event(Event::Interrupted);
                    return Ok(());
                }
                // A command just started gets its process before the
                // next ready stage is weighed (this loop and the tasks
                // share one thread).
                () = tokio::task::yield_now(), if more_ready => {}
                () = tokio::task::yield_now(), if draft_due => self.draft_end(),
            }
        }
    }

    /// Hands `record` to the ledger writer (started by the first).
    fn send_record(&mut self, record: Record) -> Result<(), ScheduleError> {
        if let Some(answers) = self.answers.take() {
            let ledger = self.ctx.ledger.as_ref().ok_or(ScheduleError::NoLedger)?;
            let writer =
                LedgerWriter::start(ledger.another_connection()?, answers).map_err(|e| {
                    ScheduleError::Task(format!("could not start the ledger writer: {e}"))
                })?;
            self.writer = Some(writer);
        }
        let sent = self
            .writer
            .as_ref()
            .is_some_and(|writer| writer.send(record));
        if !sent {
            return Err(ScheduleError::Task("the ledger writer stopped".to_owned()));
        }
        self.unanswered += 1;
        Ok(())
    }

    /// Has the ledger writer commit what it holds without waiting for
    /// more: the run waits for its answers.
    fn hurry_writer(&self) {
        if self.unanswered > 0
            && let Some(writer) = &self.writer
        {
            writer.hurry();
        }
    }

    /// Waits for the ledger writer to answer everything it was sent.
    async fn all_answered(
        &mut self,
        answered: &mut UnboundedReceiver<Recorded>,
    ) -> Result<(), ScheduleError> {
        self.hurry_writer();
        while self.unanswered > 0 {
            let Some(answer) = answered.recv().await else {
                return Err(ScheduleError::Task("the ledger writer stopped".to_owned()));
            };
            self.answered(answer)?;
        }
        Ok(())
    }

    /// The ledger writer's answer: a result on record is the one its stage
    /// uses; one that could not be recorded fails its stage.
    fn answered(&mut self, answer: Recorded) -> Result<(), ScheduleError> {
        self.unanswered -= 1;
        let (i, row, id) = match answer {
            Recorded::Attempts(outcome) => return outcome.map_err(ScheduleError::from),
            Recorded::Result { stage, row, id } => (stage, *row, id),
        };
        match id {
            Ok(id) => {
                self.result_recorded(i, id, row);
                self.summary.counts.executed += 1;
                self.timeline.ended(i, StageState::Ran, None);
            }
            // A full disk under the ledger, typically: the outputs are
            // made and stored but their result is not recorded, so the
            // stage failed (and runs again next time).
            Err(error) => {
                let message = format!(
                    "its outputs were made but could not be recorded: {}",
                    super::with_causes(&error)
                );
                let log = self
                    .log_dir
                    .join(format!("{}.log", self.ctx.manifest.stages[i].name));
                // The attempt failed after all.
                let attempt = row.attempt.map(|attempt| ItemAttempt {
                    class: ItemClass::Error.name().to_owned(),
                    rule: Some(message.clone()),
                    ..attempt
                });
                if let Err(also) = self.record_failure(
                    i,
                    &row.key,
                    Some(0),
                    row.record.started_ms,
                    &log,
                    &message,
                    attempt.as_ref(),
                ) {
                    tracing::warn!(
                        "could not record that stage `{}` failed either: {}",
                        self.ctx.manifest.stages[i].name,
                        super::with_causes(&also)
                    );
                }
                self.fail(i, &message, Some(log));
            }
        }
        Ok(())
    }

    fn drain_hashed(&mut self, hashed_rx: &mut UnboundedReceiver<Hashed>) {
        while let Ok(hashed) = hashed_rx.try_recv() {
            self.outputs_known(hashed);
        }
    }

    /// Starts ready stages, in rank order: fresh ones complete on the
    /// spot, the others become tasks that wait for a job slot and their
    /// resources. Returns after the first task it starts, `true` if stages
    /// are still ready: that task's command starts before the rest are
    /// weighed, which for a thousand ready stages takes tens of
    /// milliseconds. While commands run it also returns after
    /// [`WEIGHED_AT_A_TIME`] stages.
    fn start_ready(
        &mut self,
        executors: &Executors,
        running: &mut JoinSet<Joined>,
        resolving: &mut JoinSet<usize>,
        lookups: &mut JoinSet<LookedUp>,
        hashed: &UnboundedSender<Hashed>,
        attempts: &UnboundedSender<ItemAttempt>,
    ) -> Result<bool, ScheduleError> {
        let mut weighed = 0;
        while !self.stop {
            // While commands run, the rest are weighed a few at a time: a
            // command that ends meanwhile is seen (and what it releases
            // started) between them, not after them all.
            if weighed >= WEIGHED_AT_A_TIME && !running.is_empty() && !self.ready.is_empty() {
                return Ok(true);
            }
            weighed += 1;
            let Some((_, i)) = self.ready.pop_first() else {
                return Ok(false);
            };
            if self.resolve_tags_first(i, resolving) {
                continue;
            }
            let Some((key, reason)) = self.evaluate(i)? else {
                continue;
            };
            let Some((key, reason)) = self.look_up_first(i, key, reason, lookups) else {
                continue;
            };
            let tasks = running.len();
            self.start(i, key, reason, executors, running, hashed, attempts);
            if running.len() > tasks && !self.ready.is_empty() {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Starts stage `i`, which must run: its task waits for a job slot and
    /// its resources.
    #[allow(clippy::too_many_arguments)]
    fn start(
        &mut self,
        i: usize,
        key: StageKey,
        reason: DirtyReason,
        executors: &Executors,
        running: &mut JoinSet<Joined>,
        hashed: &UnboundedSender<Hashed>,
        attempts: &UnboundedSender<ItemAttempt>,
    ) {
        let stage = &self.ctx.manifest.stages[i];
        self.timeline.must_run(i, reason.summary());
        // A per-item stage's plan, the items `--force` names made pending.
        let mut plan = None;
        if stage.foreach.is_some() {
            let mut items = self.ctx.item_plans.remove(&i).unwrap_or_default();
            // (Kept for the fresh proof this run may make.)
            let reads = items
                .iter()
                .map(|planned| {
                    let digests = planned.inputs.iter().map(|(_, digest)| *digest).collect();
                    (KeptItem::of(planned), digests)
                })
                .collect();
            self.ctx.item_reads.insert(i, reads);
            if let Err(message) = self.forget_forced_items(i, &mut items) {
                self.fail(i, &message, None);
                return;
            }
            plan = Some(items);
        }
        let foreach = self.ctx.manifest.stages[i].foreach.as_ref();
        let items = plan.as_ref().map(|plan| {
            let done = plan.iter().filter(|p| p.is_kept(foreach)).count();
            (plan.len(), done)
        });
        self.reporter.event(Event::StageStarted {
            stage: &stage.name,
            reason: &reason,
            items,
        });
        // Windows held across a cluster, in one order everywhere (two
        // runs taking two windows in opposite orders would wait for each
        // other forever).
        let mut windows: Vec<(String, std::sync::Arc<dyn crate::exec::Executor>)> = stage
            .resources
            .iter()
            .filter_map(|held| {
                let across = self
                    .ctx
                    .manifest
                    .resources
                    .get(&held.name)?
                    .across
                    .as_ref()?;
                Some((held.name.clone(), executors.named(across)?))
            })
            .collect();
        windows.sort_by(|a, b| a.0.cmp(&b.0));
        // Each orphan is cancelled on its own engine, which a profile
        // switch may have made another than the stage's.
        let orphans = match self.ctx.unwanted_jobs(i, &key.fingerprint()) {
            Ok(handles) => handles
                .into_iter()
                .map(|handle| {
                    let engine = executors.for_handle(&handle);
                    (handle, engine)
                })
                .collect(),
            Err(error) => {
                self.fail(i, &super::with_causes(&error), None);
                return;
            }
        };
        let inputs_read = self.inputs_read(i, plan.as_deref());
        let task = match StageTask::prepare(
            self.ctx,
            i,
            &key.fingerprint(),
            &self.log_dir,
            &self.token,
            self.run_id,
            self.limits.clone(),
            self.holds[i].clone(),
            self.rank[i] as u64,
        ) {
            Ok(task) => match plan {
                Some(plan) => task.with_items(
                    stage,
                    plan,
                    self.options.only,
                    self.options.limit,
                    &self.ctx.stat,
                ),
                None => task,
            },
            Err(error) => {
                self.fail(i, &super::with_causes(&error), None);
                return;
            }
        }
        .with_inputs_read(inputs_read)
        .with_orphans(orphans)
        .with_windows(windows)
        .with_services(&self.services)
        .with_remote(
            // `--force` means here: nothing of the stage is looked up.
            self.options
                .remote
                .clone()
                .filter(|_| !self.options.forced.contains(&i)),
            self.uploads.clone(),
        );
        self.set_slot(i, Slot::Running);
        let links = TaskLinks {
            stage: i,
            hashed: hashed.clone(),
            attempts: attempts.clone(),
        };
        let executor = executors.of_stage(i);
        self.launched = true;
        // The stage's run is boxed: as a future of its own it is some 12 KiB
        // (all it may wait on, items included), and the task that spawns it
        // moves what it holds into place several times.
        running.spawn(async move { (i, key, Box::pin(task.run(executor, links)).await) });
    }

    /// What stage `i`'s commands read (its inputs, and the items' of
    /// `plan`), as its key hashed them, to be looked at again as each
    /// command ends (see [`super::inputs_read`]).
    fn inputs_read(&self, i: usize, plan: Option<&[PlannedItem]>) -> InputsRead {
        let root = &self.ctx.manifest.root;
        let digests = self
            .ctx
            .input_digests
            .get(&i)
            .map_or(&[][..], Vec::as_slice);
        let stage: Vec<Read> = self.ctx.manifest.stages[i]
            .inputs
            .iter()
            .zip(digests)
            .map(|(input, digest)| Read {
                shown: input.path.to_string(),
                abs: input.path.resolve(root),
                digest: *digest,
                made: made(input.path.as_str(), |p| self.ctx.produced.contains_key(p)),
            })
            .collect();
        let foreach = self.ctx.manifest.stages[i].foreach.as_ref();
        let items = plan
            .unwrap_or_default()
            .iter()
            .filter(|p| !p.is_kept(foreach));
        let item_paths: Vec<PathBuf> = items
            .flat_map(|planned| planned.inputs.iter())
            .filter(|(path, _)| !path.starts_with('\0'))
            .map(|(path, _)| root.join(path))
            .collect();
        let paths: Vec<&Path> = stage
            .iter()
            .map(|read| read.abs.as_path())
            .chain(item_paths.iter().map(PathBuf::as_path))
            .collect();
        let stat = self.ctx.stat.subset_of(&paths);
        // (Only items need them all: a plain stage's are decided above.)
        let produced = match plan {
            Some(_) => self.ctx.produced.keys().cloned().collect(),
            None => Default::default(),
        };
        InputsRead::new(stage, root.clone(), produced, stat)
    }

    /// A task's output digests are final: the stage is done for everything
    /// downstream (its result is recorded when its objects are durable).
    fn outputs_known(&mut self, hashed: Hashed) {
        let Hashed {
            stage: i,
            records,
            seen,
            elapsed,
        } = hashed;
        self.ctx.note_outputs(&records);
        // What the store saw of them, for the stages that read them to be
        // looked at again by (see `inputs_read`).
        for (path, entry) in seen {
            self.ctx.stat.learn(path, entry);
        }
        self.timeline.hashed(i);
        self.reporter.event(Event::StageDone {
            stage: &self.ctx.manifest.stages[i].name,
            done: Done::Ran,
            elapsed,
        });
        self.complete(i);
    }

    /// A task ended: record its result, or its failure.
    fn finished(
        &mut self,
        i: usize,
        key: &StageKey,
        mut result: Result<TaskResult, ScheduleError>,
    ) -> Result<(), ScheduleError> {
        let log = self
            .log_dir
            .join(format!("{}.log", self.ctx.manifest.stages[i].name));
        if let Ok(task) = &mut result
            && let Some(stat) = task.stat.take()
        {
            self.ctx.stat.absorb(stat);
        }
        if let Ok(task) = &result
            && !task.cancelled_orphans.is_empty()
            && let Some(ledger) = &self.ctx.ledger
        {
            ledger.orphans_cancelled(&self.ctx.manifest.stages[i].name, &task.cancelled_orphans)?;
        }
        let task = match result {
            // The run stopped before this stage got a job slot.
            Ok(task) if !task.started => {
                self.set_slot(i, Slot::Waiting);
                return Ok(());
            }
            Ok(task) => {
                self.timeline.started(i, task.started_ms);
                task
            }
            Err(error) => {
                let message = super::with_causes(&error);
                self.record_failure(i, key, None, now_ms(), &log, &message, None)?;
                // A service that did not come up ran nothing of the
                // stage: the message quotes the service's log.
                let log = (!matches!(error, ScheduleError::Service(_))).then_some(log);
                self.fail(i, &message, log);
                return Ok(());
            }
        };
        if let Some(message) = task.partial {
            self.set_slot(i, Slot::Partial);
            let name = &self.ctx.manifest.stages[i].name;
            self.summary.partial.push(name.clone());
            self.timeline
                .ended(i, StageState::Partial, Some(message.clone()));
            self.reporter.event(Event::StagePartial {
                stage: name,
                message: &message,
            });
            return Ok(());
        }
        match (task.failure, task.published) {
            (Some(message), _) => {
                self.record_failure(
                    i,
                    key,
                    task.outcome.exit_code(),
                    task.started_ms,
                    &log,
                    &message,
                    task.last_attempt.as_ref(),
                )?;
                self.fail(i, &message, Some(task.failure_log.unwrap_or(log)));
            }
            (None, Some(published)) => {
                // Recorded by the ledger writer: its answer completes it.
                self.commit(i, key, published, task.started_ms, &log, task.last_attempt)?;
            }
            (None, None) => {
                return Err(ScheduleError::Task(
                    "a successful task stored no outputs".to_owned(),
                ));
            }
        }
        Ok(())
    }

    /// Whether stage `i` names image tags not resolved yet: they are then
    /// resolved on a thread of their own (a slow registry holds up neither
    /// the other stages nor Ctrl-C), and the stage is ready again once its
    /// registry has answered, errors included (fingerprinting reports them).
    fn resolve_tags_first(&mut self, i: usize, resolving: &mut JoinSet<usize>) -> bool {
        if self.tags_resolved.contains(&i) {
            return false;
        }
        let tags = self.ctx.tags_to_resolve(i);
        if tags.is_empty() {
            return false;
        }
        self.tags_resolved.insert(i);
        let resolver = self.ctx.resolver();
        let (done, resolved) = tokio::sync::oneshot::channel::<()>();
        // A thread, not the blocking pool: an interrupted run exits
        // without waiting for a registry that does not answer.
        std::thread::spawn(move || {
            resolver.prefetch(tags.iter().map(String::as_str), false);
            let _ = done.send(());
        });
        resolving.spawn(async move {
            let _ = resolved.await;
            i
        });
        true
    }

    /// Records items' attempts the moment they end, so a crash loses no
    /// finished item.
    async fn item_attempts(&mut self, attempts: Vec<ItemAttempt>) -> Result<(), ScheduleError> {
        if attempts.is_empty() {
            return Ok(());
        }
        // A plain stage's attempts go to the ledger writer, in order with
        // its result; items' are written before the loop goes on.
        let (mut attempts, items): (Vec<_>, Vec<_>) = attempts
            .into_iter()
            .partition(|attempt| attempt.key == COMMAND_ITEM);
        if !attempts.is_empty() {
            // A job a remote engine now runs is on record at once: a cairn
            // killed meanwhile would leave the next run a job it cannot
            // adopt or cancel. (A local process carries cairn's mark and is
            // found without its record.)
            let remote_job = attempts.iter().any(|attempt| {
                attempt.class == RUNNING
                    && attempt
                        .handle
                        .as_deref()
                        .is_some_and(|handle| !crate::exec::is_local_handle(handle))
            });
            self.send_record(Record::Attempts(attempts.clone()))?;
            if remote_job {
                self.hurry_writer();
            }
        }
        if !items.is_empty() {
            let ledger = match &self.attempts_ledger {
                Some(ledger) => Arc::clone(ledger),
                None => {
                    let ledger = self.ctx.ledger.as_ref().ok_or(ScheduleError::NoLedger)?;
                    let ledger = Arc::new(std::sync::Mutex::new(ledger.another_connection()?));
                    self.attempts_ledger.insert(ledger).clone()
                }
            };
            let items = tokio::task::spawn_blocking(move || {
                let ledger = ledger
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                ledger.record_item_attempts(&items).map(|()| items)
            })
            .await
            .map_err(|e| ScheduleError::Task(e.to_string()))??;
            attempts.extend(items);
        }
        // A plain stage's attempts that end here are those it retries (its
        // last is recorded with its result).
        for attempt in &attempts {
            if attempt.class == RUNNING {
                self.timeline
                    .command_started(&attempt.stage, attempt.started_ms);
                self.reporter.event(Event::ItemStarted {
                    stage: &attempt.stage,
                    key: &attempt.key,
                    attempt: attempt.attempt,
                });
            } else {
                self.reporter.event(Event::ItemFinished {
                    stage: &attempt.stage,
                    key: &attempt.key,
                    class: &attempt.class,
                    attempt: attempt.attempt,
                });
            }
        }
        Ok(())
    }

    /// Puts stage `i` in `slot`, counting the selected stages still
    /// waiting.
    fn set_slot(&mut self, i: usize, slot: Slot) {
        let selected = self.options.selected[i];
        match (
            selected && self.slots[i] == Slot::Waiting,
            selected && slot == Slot::Waiting,
        ) {
            (true, false) => self.waiting -= 1,
            (false, true) => self.waiting += 1,
            _ => {}
        }
        self.slots[i] = slot;
    }

    /// Marks a stage done and readies the downstream stages it unblocks.
    fn complete(&mut self, i: usize) {
        self.set_slot(i, Slot::Ok);
        for &d in self.ctx.dag.downstream(i) {
            if self.options.selected[d] {
                self.remaining[d] -= 1;
                if self.remaining[d] == 0 {
                    self.ready.insert((self.rank[d], d));
                    self.timeline.ready(d);
                }
            }
        }
    }

    /// Stops each service no stage of this run needs any more: every
    /// selected stage that uses it has ended (or, the run stopping, never
    /// will start).
    async fn release_services(&self) {
        for name in self.services.up() {
            let needed = self
                .ctx
                .manifest
                .stages
                .iter()
                .enumerate()
                .any(|(i, stage)| {
                    let pending = match self.slots[i] {
                        Slot::Running => true,
                        Slot::Waiting => !self.stop,
                        Slot::Ok | Slot::Failed | Slot::Partial => false,
                    };
                    self.options.selected[i]
                        && pending
                        && stage.services.iter().any(|s| s.name == name)
                });
            if !needed {
                self.services.stop(&name).await;
            }
        }
    }

    fn fail(&mut self, i: usize, message: &str, log: Option<PathBuf>) {
        self.set_slot(i, Slot::Failed);
        self.timeline
            .ended(i, StageState::Failed, Some(message.to_owned()));
        self.summary.counts.failed += 1;
        if !self.options.keep_going {
            self.stop = true;
            self.limits.stop();
        }
        let name = &self.ctx.manifest.stages[i].name;
        self.summary.failed.push(name.clone());
        self.reporter.event(Event::StageFailed {
            stage: name,
            message,
            log: log.as_deref(),
        });
    }
}
