//! What the run writes to the ledger off the event loop ([`Writing`]), and
//! the loop's side of it: records handed to the thread that writes them,
//! its answers taken in.

use super::*;

/// The ledger's writers besides the loop itself, each opened by the first
/// that needs it (a run with nothing to record opens neither).
pub(super) struct Writing {
    /// The thread results and a plain stage's attempts are written on,
    /// answering on `answers`.
    writer: Option<LedgerWriter>,
    /// The sender the writer takes when it starts: its thread then holds
    /// the only one, so its answers end when it does.
    answers: Option<UnboundedSender<Recorded>>,
    /// How many of the writer's answers are still to come.
    pub unanswered: usize,
    /// The connection item attempts are written through, on the blocking
    /// pool: hundreds of items ending keep the event loop (remote waits,
    /// log streams, Ctrl-C) free while SQLite writes.
    attempts: Option<Arc<std::sync::Mutex<Ledger>>>,
}

impl Writing {
    /// Nothing open yet; the writer will answer through `answers`.
    pub fn new(answers: UnboundedSender<Recorded>) -> Self {
        Self {
            writer: None,
            answers: Some(answers),
            unanswered: 0,
            attempts: None,
        }
    }

    /// Hands `record` to the ledger writer, started on a connection of
    /// its own to `ledger` by the first.
    pub fn send(&mut self, ledger: &Ledger, record: Record) -> Result<(), ScheduleError> {
        if let Some(answers) = self.answers.take() {
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
    pub fn hurry(&self) {
        if self.unanswered > 0
            && let Some(writer) = &self.writer
        {
            writer.hurry();
        }
    }

    /// The connection item attempts are written through, opened to
    /// `ledger` by the first.
    pub fn attempts(
        &mut self,
        ledger: &Ledger,
    ) -> Result<Arc<std::sync::Mutex<Ledger>>, ScheduleError> {
        if let Some(ledger) = &self.attempts {
            return Ok(Arc::clone(ledger));
        }
        let ledger = Arc::new(std::sync::Mutex::new(ledger.another_connection()?));
        Ok(self.attempts.insert(ledger).clone())
    }
}

impl Dispatcher<'_, '_> {
    /// Hands `record` to the ledger writer.
    pub(super) fn send_record(&mut self, record: Record) -> Result<(), ScheduleError> {
        let ledger = self.ctx.ledger.as_ref().ok_or(ScheduleError::NoLedger)?;
        self.writing.send(ledger, record)
    }

    /// Waits for the ledger writer to answer everything it was sent.
    pub(super) async fn all_answered(
        &mut self,
        answered: &mut UnboundedReceiver<Recorded>,
    ) -> Result<(), ScheduleError> {
        self.writing.hurry();
        while self.writing.unanswered > 0 {
            let Some(answer) = answered.recv().await else {
                return Err(ScheduleError::Task("the ledger writer stopped".to_owned()));
            };
            self.answered(answer)?;
        }
        Ok(())
    }

    /// The ledger writer's answer: a result on record is the one its stage
    /// uses; one that could not be recorded fails its stage.
    pub(super) fn answered(&mut self, answer: Recorded) -> Result<(), ScheduleError> {
        self.writing.unanswered -= 1;
        let (i, row, id) = match answer {
            Recorded::Attempts(outcome) => return outcome.map_err(ScheduleError::from),
            Recorded::Result { stage, row, id } => (stage, *row, id),
        };
        match id {
            Ok(id) => {
                self.result_recorded(i, id, row);
                self.became(i, Became::Recorded);
            }
            // A full disk under the ledger, typically: the outputs are
            // made and stored but their result is not recorded, so the
            // stage failed (and runs again next time).
            Err(error) => {
                let message = format!(
                    "its outputs were made but could not be recorded: {}",
                    crate::schedule::with_causes(&error)
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
                let failure = Failure {
                    message: &message,
                    exit_code: Some(0),
                    started_ms: row.record.started_ms,
                    log: &log,
                    attempt: attempt.as_ref(),
                };
                if let Err(also) = self.record_failure(i, &row.key, &failure) {
                    tracing::warn!(
                        "could not record that stage `{}` failed either: {}",
                        self.ctx.manifest.stages[i].name,
                        crate::schedule::with_causes(&also)
                    );
                }
                self.fail(i, &message, Some(log));
            }
        }
        Ok(())
    }
}
