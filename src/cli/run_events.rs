//! `cairn run --json`: the run's events as JSON lines on stdout, one object
//! per line, each with the format's version `v` (docs/cli.md). What the
//! ledger records of a run, as it happens, for CI systems and wrappers.

use std::io::Write as _;

use serde_json::{Value, json};

use crate::schedule::{Done, Event, Reporter, RunSummary};
use crate::store::now_ms;

/// The version of the event format; bumped when a field changes meaning
/// or goes away (new fields and events may appear within a version).
pub const EVENTS_VERSION: u32 = 1;

#[derive(Default)]
pub struct JsonReporter {
    /// stdout was closed: the run goes on, unreported.
    closed: bool,
}

impl JsonReporter {
    fn emit(&mut self, event: &str, mut fields: Value) {
        if self.closed {
            return;
        }
        if let Value::Object(map) = &mut fields {
            map.insert("v".into(), EVENTS_VERSION.into());
            map.insert("event".into(), event.into());
            map.insert("at_ms".into(), now_ms().into());
        }
        let mut out = std::io::stdout().lock();
        let written = serde_json::to_writer(&mut out, &fields)
            .map_err(std::io::Error::other)
            .and_then(|()| writeln!(out))
            .and_then(|()| out.flush());
        if written.is_err() {
            self.closed = true;
        }
    }

    /// The last event of a run that could not go on: what stopped it.
    pub fn failed(&mut self, error: &str) {
        self.emit(
            "run_finished",
            json!({ "status": "error", "message": error }),
        );
    }

    /// The last event: how the run ended.
    pub fn finished(&mut self, summary: &RunSummary) {
        let status = if summary.interrupted {
            "interrupted"
        } else if summary.failed.is_empty() {
            "ok"
        } else {
            "failed"
        };
        let c = summary.counts;
        self.emit(
            "run_finished",
            json!({
                "run": summary.run_id,
                "status": status,
                "ran": c.executed,
                "fresh": c.fresh,
                "restored": c.restored,
                "failed": c.failed,
                "partial": summary.partial,
                "blocked": summary.blocked,
                "not_attempted": summary.not_attempted(),
            }),
        );
    }
}

impl Reporter for JsonReporter {
    fn event(&mut self, event: Event<'_>) {
        match event {
            Event::RunStarted {
                run_id,
                stages,
                manifest_digest,
            } => self.emit(
                "run_started",
                json!({
                    "run": run_id,
                    "stages": stages,
                    "manifest_digest": manifest_digest,
                    "cairn_version": env!("CARGO_PKG_VERSION"),
                }),
            ),
            Event::StageEvaluated { stage, reason } => self.emit(
                "stage_selected",
                json!({
                    "stage": stage,
                    "state": if reason.is_some() { "stale" } else { "fresh" },
                    "reason": reason.map(|r| r.summary()),
                }),
            ),
            Event::StageStarted {
                stage,
                reason,
                items,
            } => self.emit(
                "stage_started",
                json!({
                    "stage": stage,
                    "reason": reason.summary(),
                    "items": items.map(|(total, _)| total),
                    "items_done": items.map(|(_, done)| done),
                }),
            ),
            Event::StageDone {
                stage,
                done,
                elapsed,
            } => {
                let state = match done {
                    Done::Fresh => "fresh",
                    Done::Restored => "restored",
                    Done::Remote => "remote",
                    Done::Ran => "ran",
                };
                self.emit(
                    "stage_finished",
                    json!({ "stage": stage, "state": state, "elapsed_ms": elapsed.as_millis() as u64 }),
                );
            }
            Event::StageFailed {
                stage,
                message,
                log,
            } => self.emit(
                "stage_finished",
                json!({
                    "stage": stage,
                    "state": "failed",
                    "message": message,
                    "log": log.map(|l| l.display().to_string()),
                }),
            ),
            Event::StagePartial { stage, message } => self.emit(
                "stage_finished",
                json!({ "stage": stage, "state": "partial", "message": message }),
            ),
            Event::StageBlocked { stage, by } => self.emit(
                "stage_finished",
                json!({ "stage": stage, "state": "blocked", "blocked_by": by }),
            ),
            Event::ItemStarted {
                stage,
                key,
                attempt,
            } => self.emit(
                "item_started",
                json!({ "stage": stage, "item": key, "attempt": attempt }),
            ),
            Event::ItemFinished {
                stage,
                key,
                class,
                attempt,
            } => self.emit(
                "item_finished",
                json!({ "stage": stage, "item": key, "attempt": attempt, "class": class }),
            ),
            Event::StageCutShort { stage, interrupted } => self.emit(
                "stage_finished",
                json!({
                    "stage": stage,
                    "state": if interrupted { "interrupted" } else { "stopped" },
                }),
            ),
            Event::Interrupted => self.emit("interrupted", json!({})),
        }
    }
}
