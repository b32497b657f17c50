//! The records a run makes as its stages end, written on a thread of its
//! own: the loop that starts stages hands each one over and goes on to
//! start the next stage. A write waits up to [`GROUP_WINDOW`] for others
//! to share its transaction (a group commit: each commit writes a dozen
//! pages, whether it holds one record or fifty), unless the run waits for
//! it ([`LedgerWriter::hurry`]). Every write is answered, in the order it
//! was sent.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedSender;

use super::*;

/// A successful result a run made, as it is recorded.
pub struct ResultRow {
    /// The result as it reads once recorded (its id is the writer's answer).
    pub record: ResultRecord,
    pub key: StageKey,
    /// The attempt of the command that made it (a plain stage's last).
    pub attempt: Option<ItemAttempt>,
    /// The small objects its outputs keep inline.
    pub inline: Vec<(Digest, Vec<u8>)>,
}

impl ResultRow {
    fn as_new(&self) -> NewResult<'_> {
        let record = &self.record;
        NewResult {
            run_id: record.run_id,
            stage: &record.stage,
            key: &self.key,
            status: record.status,
            outputs: &record.outputs,
            command: &record.command,
            started_ms: record.started_ms,
            finished_ms: record.finished_ms,
            exit_code: record.exit_code,
            log_path: record.log_path.as_deref(),
            error: record.error.as_deref(),
            attempt: self.attempt.as_ref(),
            origin: record.origin.as_deref(),
        }
    }
}

/// What the writer is sent to record.
pub enum Record {
    /// The result of stage `stage` (an index the answer carries back).
    Result { stage: usize, row: Box<ResultRow> },
    /// Attempts to put on record.
    Attempts(Vec<ItemAttempt>),
}

/// The answer to a [`Record`].
pub enum Recorded {
    /// The result's row back, with its id or why it was not recorded.
    Result {
        stage: usize,
        row: Box<ResultRow>,
        id: Result<i64, StoreError>,
    },
    Attempts(Result<(), StoreError>),
}

/// How long a write waits for others to join its transaction. A busy run
/// ends a stage every millisecond or so; a killed cairn loses at most
/// this much of what ended (those stages run again). At 4 ms the writer
/// took 92 ms of CPU over a cold run of 1,000 stages on two cores, at
/// 16 ms 59 (`perf sched timehist`), CPU the commands beside it lacked;
/// nothing waits on the window but a killed run's redone stages, since
/// the run's end hurries the writer.
const GROUP_WINDOW: Duration = Duration::from_millis(16);

/// How long the log may grow (in 4 KiB pages) before the writer, having
/// committed, copies it into the ledger so that it begins again. Every
/// command that opens the ledger first reads the whole log twice (cairn's
/// check for damage, then SQLite's recovery), so what a run leaves in it is
/// paid by the next command: a thousand pages (SQLite's default; a re-run of
/// fifty stages writes about that many) cost the next one 3.5 ms. The copy
/// is made on this thread, while commands run, once the commit that grew
/// the log is answered: made inside the commit (SQLite's own checkpoint),
/// its two `fsync`s (3 ms here) held up the answer the run's end waits for.
const CHECKPOINT_FRAMES: i64 = 256;

/// The handle to the writer's thread, which ends when this is dropped
/// (after what it was sent).
pub struct LedgerWriter {
    writes: Option<mpsc::Sender<Record>>,
    /// Set (and the thread woken) when the run waits for the answers.
    hurried: Arc<AtomicBool>,
    /// Set while the thread copies the log into the ledger.
    copying: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl LedgerWriter {
    /// Starts the thread, writing through `ledger` and answering on
    /// `answers`.
    pub fn start(mut ledger: Ledger, answers: UnboundedSender<Recorded>) -> std::io::Result<Self> {
        // The log's length after each commit (a hook of its own replaces
        // SQLite's checkpoint inside the commit).
        let frames = Arc::new(AtomicI64::new(0));
        let logged = Arc::clone(&frames);
        ledger
            .conn
            .wal_hook(Some(move |_: &mut rusqlite::hooks::Wal, pages| {
                logged.store(i64::from(pages), Ordering::Relaxed);
                Ok(())
            }))
            .map_err(std::io::Error::other)?;
        let (writes, received) = mpsc::channel();
        let hurried = Arc::new(AtomicBool::new(false));
        let hurry = Arc::clone(&hurried);
        let copying = Arc::new(AtomicBool::new(false));
        let log = Log {
            frames,
            copying: Arc::clone(&copying),
        };
        let thread = std::thread::Builder::new()
            .name("cairn-ledger".to_owned())
            .spawn(move || serve(&ledger, &received, &hurry, &answers, &log))?;
        Ok(Self {
            writes: Some(writes),
            hurried,
            copying,
            thread: Some(thread),
        })
    }

    /// Hands `write` over; `false` if the thread is gone. (The thread,
    /// waiting out a window, is not woken: it takes what came at its end.)
    pub fn send(&self, write: Record) -> bool {
        self.writes
            .as_ref()
            .is_some_and(|writes| writes.send(write).is_ok())
    }

    /// Has what is pending committed without waiting for more.
    pub fn hurry(&self) {
        self.hurried.store(true, Ordering::Release);
        if let Some(thread) = &self.thread {
            thread.thread().unpark();
        }
    }
}

impl Drop for LedgerWriter {
    /// Lets the thread end once it has written what it was sent; waits
    /// for it only while it copies the log into the ledger (a process that
    /// exited meanwhile would leave the copy to the next command, which
    /// reads the log whole). Waiting for an idle thread to close its
    /// connection and end took 1.5 ms of the run's end.
    fn drop(&mut self) {
        drop(self.writes.take());
        if self.copying.load(Ordering::Acquire)
            && let Some(thread) = self.thread.take()
        {
            let _ = thread.join();
        }
    }
}

/// What the writer knows of the ledger's log: its length after the last
/// commit, and whether it is being copied into the ledger now.
struct Log {
    frames: Arc<AtomicI64>,
    copying: Arc<AtomicBool>,
}

fn serve(
    ledger: &Ledger,
    writes: &mpsc::Receiver<Record>,
    hurried: &AtomicBool,
    answers: &UnboundedSender<Recorded>,
    log: &Log,
) {
    while let Ok(first) = writes.recv() {
        wait_for_company(hurried);
        let group: Vec<Record> = std::iter::once(first).chain(writes.try_iter()).collect();
        let outcomes: Vec<Result<Option<i64>, StoreError>> = match ledger.write_group(&group) {
            Ok(ids) => ids.into_iter().map(Ok).collect(),
            // Each alone: the answer says which write could not be made.
            Err(_) => group.iter().map(|write| ledger.write_one(write)).collect(),
        };
        // Known before the answers go: a run that has its last answer
        // then finds the copy under way, and waits for it.
        let copy = log.frames.load(Ordering::Relaxed) >= CHECKPOINT_FRAMES;
        log.copying.store(copy, Ordering::Release);
        for (write, outcome) in group.into_iter().zip(outcomes) {
            let written = match write {
                Record::Result { stage, row } => Recorded::Result {
                    stage,
                    row,
                    id: outcome.map(|id| id.unwrap_or_default()),
                },
                Record::Attempts(_) => Recorded::Attempts(outcome.map(|_| ())),
            };
            // (The run gone, nothing waits for the answer.)
            let _ = answers.send(written);
        }
        if copy {
            // Whatever a reader still needs stays in the log for a later
            // copy; a copy that fails is only a longer log.
            if let Err(error) = ledger
                .conn
                .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
            {
                tracing::debug!("the ledger's log was not copied into it: {error}");
            }
            log.frames.store(0, Ordering::Relaxed);
            log.copying.store(false, Ordering::Release);
        }
    }
}

/// Waits out [`GROUP_WINDOW`] for more writes, unless hurried.
fn wait_for_company(hurried: &AtomicBool) {
    let until = Instant::now() + GROUP_WINDOW;
    loop {
        // (A hurry left over from a group already written ends one window
        // early: no harm.)
        if hurried.swap(false, Ordering::AcqRel) {
            return;
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        std::thread::park_timeout(left);
    }
}

impl Ledger {
    /// Makes every write of `group` in one transaction: a result's id each.
    fn write_group(&self, group: &[Record]) -> Result<Vec<Option<i64>>, StoreError> {
        let ended = ended_later(group);
        let tx = self.conn.unchecked_transaction().map_err(|e| self.db(e))?;
        let ids = group
            .iter()
            .zip(&ended)
            .map(|(write, ended)| self.write_in(&tx, write, ended))
            .collect::<Result<Vec<_>, _>>()?;
        tx.commit().map_err(|e| self.db(e))?;
        Ok(ids)
    }

    /// Records `row` in a transaction of its own.
    pub fn record_row(&self, row: &ResultRow) -> Result<i64, StoreError> {
        self.record(&row.as_new(), &row.inline)
    }

    fn write_one(&self, write: &Record) -> Result<Option<i64>, StoreError> {
        self.write_group(std::slice::from_ref(write))
            .map(|ids| ids.into_iter().next().flatten())
    }

    /// Writes `write` within `tx`, leaving out the attempts in `ended`
    /// (by their place in it).
    fn write_in(
        &self,
        tx: &rusqlite::Transaction<'_>,
        write: &Record,
        ended: &[usize],
    ) -> Result<Option<i64>, StoreError> {
        match write {
            Record::Result { row, .. } => {
                self.insert_result(tx, &row.as_new(), &row.inline).map(Some)
            }
            Record::Attempts(attempts) => {
                let left = attempts
                    .iter()
                    .enumerate()
                    .filter(|(n, _)| !ended.contains(n))
                    .map(|(_, attempt)| attempt);
                self.insert_attempts(tx, left).map(|()| None)
            }
        }
    }
}

/// For each write of `group`, the places of its `running` attempts that a
/// later write of the group ends. Such a record would be inserted and
/// deleted again in one transaction, never seen: a command shorter than
/// the writer's window (nearly every one) starts and ends in one group,
/// and its start's row cost a row and four index entries written, then
/// deleted.
fn ended_later(group: &[Record]) -> Vec<Vec<usize>> {
    /// Which attempt of which command an attempt record is of.
    fn which(a: &ItemAttempt) -> (i64, &str, &str, Digest, u32) {
        (a.run_id, &a.stage, &a.key, a.fingerprint, a.attempt)
    }
    let mut ends = HashSet::new();
    let mut ended = vec![Vec::new(); group.len()];
    for (place, write) in group.iter().enumerate().rev() {
        match write {
            Record::Result { row, .. } => ends.extend(row.attempt.iter().map(which)),
            Record::Attempts(attempts) => {
                for (n, attempt) in attempts.iter().enumerate().rev() {
                    if attempt.class != RUNNING {
                        ends.insert(which(attempt));
                    } else if ends.contains(&which(attempt)) {
                        ended[place].push(n);
                    }
                }
            }
        }
    }
    ended
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The writer answers what it was sent, in order, and its answers end
    /// with its thread: a run waiting for them is never left waiting for a
    /// writer that is gone.
    #[test]
    fn answers_come_in_order_and_end_with_the_writer() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::new_for_tests(dir.path());
        let (answers, mut answered) = tokio::sync::mpsc::unbounded_channel();
        let writer = LedgerWriter::start(ledger.another_connection().unwrap(), answers).unwrap();
        let attempt = |stage: &str| ItemAttempt::started(1, stage, "", Digest::of(b"f"), 1, 0);
        for stage in ["a", "b", "c"] {
            assert!(writer.send(Record::Attempts(vec![attempt(stage)])));
        }
        drop(writer);
        let mut answers = 0;
        while let Some(answer) = answered.blocking_recv() {
            assert!(matches!(answer, Recorded::Attempts(Ok(()))));
            answers += 1;
        }
        assert_eq!(answers, 3);
        let stages: Vec<String> = ledger
            .run_attempts(1)
            .unwrap()
            .into_iter()
            .map(|attempt| attempt.stage)
            .collect();
        assert_eq!(stages, ["a", "b", "c"]);
    }

    /// A command's start and its end in one group: the start's record,
    /// which its end would delete in the same transaction, is not written
    /// at all; the end is recorded as when the two are written apart, by a
    /// retry's record or with the result.
    #[test]
    fn a_start_ended_in_the_same_group_is_not_written() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::new_for_tests(dir.path());
        let run = ledger.begin_run("run", None, "t", "m").unwrap();
        let fingerprint = Digest::of(b"f");
        let started = |stage: &str| ItemAttempt {
            handle: Some("pid:4242".to_owned()),
            ..ItemAttempt::started(run, stage, COMMAND_ITEM, fingerprint, 1, 10)
        };
        let ended = |stage: &str| ItemAttempt {
            class: "ok".to_owned(),
            finished_ms: 20,
            exit_code: Some(0),
            ..started(stage)
        };
        let result = |stage: &str| Record::Result {
            stage: 0,
            row: Box::new(ResultRow {
                record: ResultRecord {
                    id: 0,
                    run_id: run,
                    stage: stage.to_owned(),
                    fingerprint,
                    status: ResultStatus::Ok,
                    outputs: Vec::new(),
                    command: "true".to_owned(),
                    started_ms: 10,
                    finished_ms: 20,
                    exit_code: Some(0),
                    log_path: None,
                    error: None,
                    origin: None,
                },
                key: StageKey::default(),
                attempt: Some(ended(stage)),
                inline: Vec::new(),
            }),
        };
        let changes = |groups: Vec<Vec<Record>>| {
            let before = ledger.conn.total_changes();
            for group in groups {
                ledger.write_group(&group).unwrap();
            }
            ledger.conn.total_changes() - before
        };

        // A retry's end, apart and together.
        let apart = changes(vec![
            vec![Record::Attempts(vec![started("a")])],
            vec![Record::Attempts(vec![ended("a")])],
        ]);
        let together = changes(vec![vec![
            Record::Attempts(vec![started("b")]),
            Record::Attempts(vec![ended("b")]),
        ]]);
        assert_eq!(
            together + 2,
            apart,
            "the start's insert and delete are left out"
        );
        // The last attempt, with the result.
        let apart = changes(vec![
            vec![Record::Attempts(vec![started("c")])],
            vec![result("c")],
        ]);
        let together = changes(vec![vec![
            Record::Attempts(vec![started("d")]),
            result("d"),
        ]]);
        assert_eq!(together + 2, apart);

        // Each command has its end on record, once, as if written apart.
        let attempts = ledger.run_attempts(run).unwrap();
        let ends: Vec<(&str, &str, Option<&str>)> = attempts
            .iter()
            .map(|a| (a.stage.as_str(), a.class.as_str(), a.handle.as_deref()))
            .collect();
        assert_eq!(
            ends,
            ["a", "b", "c", "d"].map(|stage| (stage, "ok", Some("pid:4242")))
        );
        // A start no later write of its group ends stays on record.
        changes(vec![vec![
            Record::Attempts(vec![started("e")]),
            Record::Attempts(vec![ended("a")]),
        ]]);
        assert!(
            ledger
                .run_attempts(run)
                .unwrap()
                .iter()
                .any(|a| a.stage == "e" && a.class == RUNNING)
        );
    }

    /// The writer checkpoints as it goes, so the log the next command
    /// opens (and reads whole, twice) holds a few hundred frames, not all
    /// a run wrote: here 60 commits of an item whose key (in the table
    /// and two indexes) takes pages of its own.
    #[test]
    fn the_writer_keeps_the_log_short() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::new_for_tests(dir.path());
        let (answers, mut answered) = tokio::sync::mpsc::unbounded_channel();
        let writer = LedgerWriter::start(ledger.another_connection().unwrap(), answers).unwrap();
        for n in 0..60 {
            let stage = format!("stage-{n}");
            let key = format!("{n}").repeat(4000 / (1 + n.to_string().len()));
            let attempt = ItemAttempt::started(1, &stage, &key, Digest::of(stage.as_bytes()), 1, 0);
            assert!(writer.send(Record::Attempts(vec![attempt])));
            writer.hurry();
            assert!(matches!(
                answered.blocking_recv(),
                Some(Recorded::Attempts(Ok(())))
            ));
        }
        drop(writer);
        assert_eq!(ledger.run_attempts(1).unwrap().len(), 60);
        // (The second column: the frames in the log since it last began
        // again.)
        let frames: i64 = ledger
            .conn
            .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| row.get(1))
            .unwrap();
        assert!(
            frames <= CHECKPOINT_FRAMES + 16,
            "{frames} frames in the log"
        );
    }
}
