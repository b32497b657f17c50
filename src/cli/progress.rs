//! The human reporter: a line per stage on stderr, and a progress bar when
//! stderr is a terminal.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::render;
use crate::schedule::{Done, Event, Reporter};

/// The bar on screen, if any, so that log lines can be printed above it
/// instead of through it.
static ACTIVE_BAR: std::sync::OnceLock<ProgressBar> = std::sync::OnceLock::new();

/// A `tracing` writer for stderr that suspends the progress bar while it
/// writes. It never fails: a log line that cannot reach a closed stderr is
/// dropped (tracing would otherwise report the failure with a panicking
/// `eprintln!`), and the run goes on.
pub struct LogWriter;

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let write_all = || {
            let _ = std::io::stderr().write_all(buf);
        };
        match ACTIVE_BAR.get() {
            Some(bar) => bar.suspend(write_all),
            None => write_all(),
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}

pub struct HumanReporter {
    bar: ProgressBar,
    quiet: bool,
    /// Also list stages that were already fresh.
    verbose: bool,
    color: bool,
}

impl HumanReporter {
    pub fn new(quiet: bool, verbose: bool) -> Self {
        let tty = std::io::stderr().is_terminal();
        let bar = if tty && !quiet {
            let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template("{spinner} [{pos}/{len}] {wide_msg} {elapsed}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            bar.enable_steady_tick(std::time::Duration::from_millis(120));
            let _ = ACTIVE_BAR.set(bar.clone());
            bar
        } else {
            ProgressBar::hidden()
        };
        Self {
            bar,
            quiet,
            verbose,
            color: render::stderr_color(),
        }
    }

    fn line(&self, text: String) {
        if self.bar.is_hidden() {
            errln!("{text}");
        } else {
            self.bar.println(text);
        }
    }

    fn paint(&self, code: &str, text: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_owned()
        }
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

impl Reporter for HumanReporter {
    fn event(&mut self, event: Event<'_>) {
        match event {
            Event::RunStarted { stages, .. } => self.bar.set_length(stages as u64),
            Event::StageStarted { stage, reason } => {
                self.bar.set_message(stage.to_owned());
                if !self.quiet {
                    let tag = self.paint("36", "     run");
                    self.line(format!("{tag}  {stage} ({})", reason.summary()));
                }
            }
            Event::StageDone {
                stage,
                done,
                elapsed,
            } => {
                self.bar.inc(1);
                if self.quiet || (done == Done::Fresh && !self.verbose) {
                    return;
                }
                let text = match done {
                    Done::Fresh => format!("{}  {stage}", self.paint("2", "   fresh")),
                    Done::Restored => format!(
                        "{}  {stage} (outputs restored from the store)",
                        self.paint("33", "restored")
                    ),
                    Done::Remote => format!(
                        "{}  {stage} (from the remote cache)",
                        self.paint("36", "  remote")
                    ),
                    Done::Ran => format!(
                        "{}  {stage} in {}",
                        self.paint("32", "      ok"),
                        render::elapsed(elapsed)
                    ),
                };
                self.line(text);
            }
            Event::StageFailed {
                stage,
                message,
                log,
            } => {
                self.bar.inc(1);
                let mut text = format!("{}  {stage}: {message}", self.paint("31;1", "  FAILED"));
                if let Some(log) = log {
                    if let Some(tail) = render::log_tail(log, 20).filter(|t| !t.trim().is_empty()) {
                        text.push_str(&format!(
                            "\n          ── last lines of {} ──",
                            log.display()
                        ));
                        for line in tail.lines() {
                            text.push_str(&format!("\n          │ {line}"));
                        }
                    } else {
                        text.push_str(&format!("\n          (log {} is empty)", log.display()));
                    }
                }
                self.line(text);
            }
            Event::StagePartial { stage, message } => {
                self.bar.inc(1);
                self.line(format!(
                    "{}  {stage}: {message}",
                    self.paint("33", " partial")
                ));
            }
            Event::ItemFinished {
                stage,
                key,
                class,
                attempt,
            } => {
                self.bar.set_message(format!("{stage} {key}"));
                if key.is_empty() {
                    // A plain stage's command failed and is tried again.
                    if !self.quiet {
                        let tag = self.paint("33", "   retry");
                        self.line(format!("{tag}  {stage}: {class} (attempt {attempt})"));
                    }
                    return;
                }
                // Ok is the quiet case; everything else is worth a line.
                if !self.quiet && class != "ok" {
                    let tag = if class == "infra" || class == "error" {
                        self.paint("33", "    item")
                    } else {
                        self.paint("2", "    item")
                    };
                    self.line(format!("{tag}  {stage}/{key}: {class} (attempt {attempt})"));
                }
            }
            Event::StageBlocked { stage, by } => {
                self.bar.inc(1);
                if !self.quiet {
                    self.line(format!(
                        "{}  {stage} (upstream `{by}` did not complete)",
                        self.paint("33", " skipped")
                    ));
                }
            }
            Event::Interrupted => self.line(self.paint(
                "31;1",
                "interrupted: running commands were killed; finished stages are kept",
            )),
        }
    }
}
