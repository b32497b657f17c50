//! The dispatcher: runs the selected stages in dependency order, at most
//! `jobs` at a time, skipping what is validated and committing each result
//! as soon as it is complete. It owns the run's state; tasks (`task.rs`)
//! report back through channels, and reporters see [`Event`]s.
//!
//! The loop is here; acting on each stage's decision as its turn comes is
//! in [`evaluate`], starting a stage's task in [`start`], taking in what it
//! did in [`finish`], recording what ran (results, failures) in
//! [`record`] through the ledger writer ([`writer`]), a remote cache's
//! hits in [`remote`], the run's end (the lock file, the fresh proof) in
//! [`end`], and the signals that interrupt a run in [`interrupts`].

mod end;
mod evaluate;
mod finish;
mod interrupts;
mod record;
mod shared_cache;
mod start;
mod tally;
mod writer;

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
use super::services::Services;
use super::shared_cache::{UploadWorker, Uploads};
use super::task::{Hashed, Holds, Only, StageTask, TaskLinks, TaskResult, ThisRun};
use super::timeline::{StageState, Timeline};
use crate::exec::kill_marked_processes;
use crate::fingerprint::{Digest, StageKey};
use crate::manifest::ItemClass;
use crate::store::reserve;
use crate::store::shared_cache::{Fetched, RemoteCache};
use crate::store::{COMMAND_ITEM, KeptBeside, LedgerWriter, Record, Recorded, ResultRow};
use crate::store::{
    ItemAttempt, Ledger, LockFile, NewResult, OutputRecord, Published, RUNNING, ResultRecord,
    ResultStatus, RunCounts, StoreError, now_ms,
};
use interrupts::Interrupts;
use record::Failure;
pub(crate) use record::new_lock_file;
use tally::Became;
use writer::Writing;

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
    /// Per-item stages `--reverify` named: their imported items run again
    /// (the others are reused as ever).
    pub reverify: HashSet<usize>,
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

/// What the run has under way, and the senders its tasks report through.
struct UnderWay {
    executors: Executors,
    /// The stages' tasks.
    running: JoinSet<Joined>,
    /// Stages waiting for their image tags to be resolved (off this
    /// thread): each comes back ready when its registry has answered.
    resolving: JoinSet<usize>,
    /// Stages being looked up in the remote cache.
    lookups: JoinSet<LookedUp>,
    hashed: UnboundedSender<Hashed>,
    attempts: UnboundedSender<ItemAttempt>,
}

/// Where what happens arrives, besides [`UnderWay`]'s tasks ending.
struct Inbox<'r> {
    /// A task's outputs, hashed.
    hashed: UnboundedReceiver<Hashed>,
    /// An item's attempt, started or ended.
    attempts: UnboundedReceiver<ItemAttempt>,
    /// The ledger writer's answers.
    answered: &'r mut UnboundedReceiver<Recorded>,
    interrupt: Interrupts,
}

/// What the event loop waited for; each is handled in one place
/// ([`Dispatcher::handle`]).
enum Happened {
    Hashed(Hashed),
    Attempt(ItemAttempt),
    Joined(Joined),
    LookedUp(LookedUp),
    Answered(Recorded),
    /// A stage's image tags are resolved: it is ready again. (`None`:
    /// the task failed, which it cannot: it only waits for its thread.)
    Resolved(Option<usize>),
    Interrupted,
    /// The loop let a command just started get its process.
    Yielded,
    /// Nothing is left to start: the run's end is drafted meanwhile.
    DraftDue,
}

/// Whether the loop goes on.
enum Flow {
    Going,
    Ended,
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
    if !crate::exec::cluster_jobs_released(CANCEL_WAIT).await {
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
            dispatcher.writing.hurry();
            while dispatcher.writing.unanswered > 0 && answered.recv().await.is_some() {
                dispatcher.writing.unanswered -= 1;
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
    /// What the run writes to the ledger off the event loop.
    writing: Writing,
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
        let log_dir = crate::store::layout::run_logs(&ctx.manifest.cache_dir(), run_id);
        std::fs::create_dir_all(&log_dir).map_err(|source| ScheduleError::Io {
            path: log_dir.clone(),
            source,
        })?;

        let n = ctx.manifest.stages.len();
        let rank = start::ranks(ctx, options.changed.as_deref());
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
        let timeline = Timeline::new(ctx.manifest, &options.selected, ctx.dag.order());
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
        let mut dispatcher = Self {
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
            writing: Writing::new(answers),
            tags_resolved: HashSet::new(),
            looked_up: HashSet::new(),
            launched: false,
            uploads,
            upload_worker,
            services,
            timeline,
        };
        for (_, i) in dispatcher.ready.clone() {
            dispatcher.became(i, Became::Ready);
        }
        Ok((dispatcher, answered))
    }

    /// The event loop: start what is ready, then wait for what happens
    /// next (a task reports or ends, the ledger writer answers, Ctrl-C) and
    /// handle it ([`Self::handle`]).
    async fn drive(
        &mut self,
        answered: &mut UnboundedReceiver<Recorded>,
    ) -> Result<(), ScheduleError> {
        let (hashed, hashed_rx) = unbounded_channel::<Hashed>();
        let (attempts, attempts_rx) = unbounded_channel::<ItemAttempt>();
        let mut under_way = UnderWay {
            executors: Executors::of(self.ctx.manifest),
            running: JoinSet::new(),
            resolving: JoinSet::new(),
            lookups: JoinSet::new(),
            hashed,
            attempts,
        };
        let mut inbox = Inbox {
            hashed: hashed_rx,
            attempts: attempts_rx,
            answered,
            // Ctrl-C, SIGTERM and SIGHUP (a closed terminal or ssh
            // session) all interrupt the run.
            interrupt: Interrupts::listen()?,
        };
        loop {
            // A stage that turned out fresh may have been the last to
            // need a service.
            self.release_services().await;
            let more_ready = self.start_ready(&mut under_way)?;
            let UnderWay {
                running,
                resolving,
                lookups,
                ..
            } = &mut under_way;
            if running.is_empty()
                && self.writing.unanswered == 0
                && ((resolving.is_empty() && lookups.is_empty()) || self.stop)
            {
                return Ok(());
            }
            if running.is_empty() {
                // Nothing ends meanwhile to share the writer's commit.
                self.writing.hurry();
            }
            // Nothing is left to start: the end is drafted while the last
            // commands run, once they have started.
            let draft_due =
                !running.is_empty() && self.waiting == 0 && self.end_draft.is_none() && !self.stop;
            // In this order: releasing downstream stages first keeps the
            // critical path moving; recording results can wait a moment.
            let happened = tokio::select! {
                biased;
                Some(hashed) = inbox.hashed.recv() => Happened::Hashed(hashed),
                Some(attempt) = inbox.attempts.recv() => Happened::Attempt(attempt),
                Some(joined) = running.join_next(), if !running.is_empty() => {
                    Happened::Joined(joined.map_err(|e| ScheduleError::Task(e.to_string()))?)
                }
                Some(looked) = lookups.join_next(), if !lookups.is_empty() => {
                    Happened::LookedUp(looked.map_err(|e| ScheduleError::Task(e.to_string()))?)
                }
                answer = inbox.answered.recv(), if self.writing.unanswered > 0 => {
                    Happened::Answered(answer.ok_or_else(|| {
                        ScheduleError::Task("the ledger writer stopped".to_owned())
                    })?)
                }
                Some(resolved) = resolving.join_next(), if !resolving.is_empty() => {
                    Happened::Resolved(resolved.ok())
                }
                () = inbox.interrupt.recv() => Happened::Interrupted,
                // A command just started gets its process before the
                // next ready stage is weighed (this loop and the tasks
                // share one thread).
                () = tokio::task::yield_now(), if more_ready => Happened::Yielded,
                () = tokio::task::yield_now(), if draft_due => Happened::DraftDue,
            };
            if let Flow::Ended = self.handle(happened, &mut under_way, &mut inbox).await? {
                return Ok(());
            }
        }
    }

    /// Handles what the loop waited for.
    async fn handle(
        &mut self,
        happened: Happened,
        under_way: &mut UnderWay,
        inbox: &mut Inbox<'_>,
    ) -> Result<Flow, ScheduleError> {
        match happened {
            Happened::Hashed(hashed) => {
                // A per-item stage's attempts were all sent before its
                // outputs were hashed: they are recorded (and shown)
                // before the stage is done.
                self.item_attempts(pending(&mut inbox.attempts)).await?;
                self.outputs_known(hashed);
                // Its commands are done: a service only it needed stops
                // before the stages it releases start.
                self.release_services().await;
            }
            Happened::Attempt(attempt) => {
                // Whatever else has finished meanwhile goes into the same
                // transaction.
                let mut batch = vec![attempt];
                batch.extend(pending(&mut inbox.attempts));
                self.item_attempts(batch).await?;
            }
            Happened::Joined((i, key, result)) => {
                // A task reports its attempts and digests before it ends.
                self.item_attempts(pending(&mut inbox.attempts)).await?;
                self.drain_hashed(&mut inbox.hashed);
                // The stages its digests released start their commands
                // before its result is recorded (tasks run only when this
                // loop waits).
                tokio::task::yield_now().await;
                // A failure is recorded here, after what the writer has of
                // the stage (its attempt's start).
                if !succeeded(&result) {
                    self.all_answered(inbox.answered).await?;
                }
                self.finished(i, &key, result)?;
                self.release_services().await;
            }
            Happened::LookedUp((i, key, reason, fetched)) => {
                let reason = match fetched {
                    Some(fetched) => match self.adopt_remote(i, &key, fetched)? {
                        None => return Ok(Flow::Going),
                        Some(reason) => reason,
                    },
                    None => reason,
                };
                if !self.stop {
                    self.start(i, key, reason, under_way);
                }
            }
            Happened::Answered(answer) => self.answered(answer)?,
            Happened::Resolved(Some(i)) => {
                self.ready.insert((self.rank[i], i));
            }
            Happened::Resolved(None) => {}
            Happened::Interrupted => {
                self.interrupt(under_way, inbox).await?;
                return Ok(Flow::Ended);
            }
            Happened::Yielded => {}
            Happened::DraftDue => self.draft_end(),
        }
        Ok(Flow::Going)
    }

    /// Ends the run on an interrupt: what was running ends now, however
    /// long cancelling takes.
    async fn interrupt(
        &mut self,
        under_way: &mut UnderWay,
        inbox: &mut Inbox<'_>,
    ) -> Result<(), ScheduleError> {
        self.interrupting();
        under_way.resolving.abort_all();
        under_way.lookups.abort_all();
        under_way.running.abort_all();
        while under_way.running.join_next().await.is_some() {}
        // The items' tasks are dropped after their stages' (each cancels
        // its remote job as it goes): wait for them while the runtime
        // still runs.
        let released = crate::exec::cluster_jobs_released(CANCEL_WAIT).await;
        if !released {
            tracing::warn!("some remote jobs could not be cancelled in time");
        }
        // Items that finished before the interrupt are kept.
        self.item_attempts(pending(&mut inbox.attempts)).await?;
        self.all_answered(inbox.answered).await?;
        // Those that did not are cancelled, or left running for the next
        // run to adopt or cancel (`--detach`, or a cancellation not
        // confirmed in time).
        if let Some(ledger) = &self.ctx.ledger {
            let left_running = crate::exec::cluster_jobs_detached() || !released;
            ledger.close_running_attempts(self.run_id, left_running)?;
        }
        self.interrupted();
        Ok(())
    }

    fn drain_hashed(&mut self, hashed_rx: &mut UnboundedReceiver<Hashed>) {
        while let Ok(hashed) = hashed_rx.try_recv() {
            self.outputs_known(hashed);
        }
    }
}
