//! The human reporter: a line per stage on stderr and, when stderr is a
//! terminal, a live view: a bar per running stage (a per-item stage's items
//! done of its total, this run's outcomes by class, rate and ETA) above a
//! footer with the run's totals.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::render;
use crate::schedule::{Done, Event, Reporter};

/// The live view on screen, if any, so that log lines can be printed above
/// it instead of through it.
static ACTIVE_VIEW: std::sync::OnceLock<MultiProgress> = std::sync::OnceLock::new();

/// A `tracing` writer for stderr that suspends the live view while it
/// writes. It never fails: a log line that cannot reach a closed stderr is
/// dropped (tracing would otherwise report the failure with a panicking
/// `eprintln!`), and the run goes on.
pub struct LogWriter;

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let write_all = || {
            let _ = std::io::stderr().write_all(buf);
        };
        match ACTIVE_VIEW.get() {
            Some(view) => view.suspend(write_all),
            None => write_all(),
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}

/// A running stage's bar and what this run saw of its items.
struct StageBar {
    bar: ProgressBar,
    /// The latest class of each item whose attempt in this run did not end
    /// `ok`, so that a retried item counts once (an `ok` is final: those
    /// are not kept).
    not_ok: HashMap<String, String>,
    /// Items by that class.
    classes: BTreeMap<String, usize>,
}

/// The run's totals, for the footer.
#[derive(Default)]
struct Totals {
    ran: usize,
    fresh: usize,
    restored: usize,
    failed: usize,
    items: BTreeMap<String, usize>,
}

impl Totals {
    /// `21 ran · 1 fresh │ items ok 160 · failed 14`: zero counts left out,
    /// `ok` first.
    fn line(&self) -> String {
        let mut parts = vec![format!("{} ran", self.ran), format!("{} fresh", self.fresh)];
        if self.restored > 0 {
            parts.push(format!("{} restored", self.restored));
        }
        if self.failed > 0 {
            parts.push(format!("{} failed", self.failed));
        }
        let mut line = parts.join(" · ");
        let items = class_counts(&self.items);
        if !items.is_empty() {
            line.push_str(&format!(" │ items {items}"));
        }
        line
    }
}

/// `ok 57 · infra 2 · fail 1`: the classes with a count, `ok` first.
fn class_counts(classes: &BTreeMap<String, usize>) -> String {
    let mut parts: Vec<(&String, &usize)> = classes.iter().filter(|(_, n)| **n > 0).collect();
    parts.sort_by_key(|(class, _)| class.as_str() != "ok");
    parts
        .iter()
        .map(|(class, n)| format!("{class} {n}"))
        .collect::<Vec<_>>()
        .join(" · ")
}

pub struct HumanReporter {
    view: Option<MultiProgress>,
    footer: ProgressBar,
    /// Stages handed to their task, waiting for a job slot: their items
    /// (`(total, done)`) if per item. A stage gets its bar when its first
    /// command starts.
    waiting: HashMap<String, Option<(usize, usize)>>,
    running: HashMap<String, StageBar>,
    /// Stages done with (a stage whose outputs were hashed but whose
    /// result could not be recorded is reported done, then failed).
    ended: HashSet<String>,
    totals: Totals,
    quiet: bool,
    /// Also list stages that were already fresh.
    verbose: bool,
    color: bool,
}

impl HumanReporter {
    pub fn new(quiet: bool, verbose: bool) -> Self {
        let color = render::stderr_color();
        let (view, footer) = if std::io::stderr().is_terminal() && !quiet {
            let view = MultiProgress::with_draw_target(ProgressDrawTarget::stderr());
            let footer = view.add(ProgressBar::new(0));
            footer.set_style(style(
                color,
                "{spinner:.cyan} {elapsed:>4} [{pos}/{len} stages] {wide_msg}",
                "{spinner} {elapsed:>4} [{pos}/{len} stages] {wide_msg}",
            ));
            footer.enable_steady_tick(Duration::from_millis(120));
            let _ = ACTIVE_VIEW.set(view.clone());
            (Some(view), footer)
        } else {
            (None, ProgressBar::hidden())
        };
        Self {
            view,
            footer,
            waiting: HashMap::new(),
            running: HashMap::new(),
            ended: HashSet::new(),
            totals: Totals::default(),
            quiet,
            verbose,
            color,
        }
    }

    /// A bar for `stage` above the footer: its items (`(total, done)`) if
    /// it runs per item, else its elapsed time.
    fn open_bar(&mut self, stage: &str, items: Option<(usize, usize)>) {
        let Some(view) = &self.view else {
            return;
        };
        let bar = match items {
            Some((total, done)) => {
                let bar = ProgressBar::new(total as u64).with_position(done as u64);
                bar.set_style(style(
                    self.color,
                    "  {prefix:.bold} [{bar:20.cyan/blue}] {pos}/{len} {per_sec:.dim} ETA {eta} {wide_msg}",
                    "  {prefix} [{bar:20}] {pos}/{len} {per_sec} ETA {eta} {wide_msg}",
                ));
                bar
            }
            None => {
                let bar = ProgressBar::new_spinner();
                bar.set_style(style(
                    self.color,
                    "  {prefix:.bold} {spinner} {elapsed}",
                    "  {prefix} {spinner} {elapsed}",
                ));
                bar.enable_steady_tick(Duration::from_millis(120));
                bar
            }
        };
        bar.set_prefix(stage.to_owned());
        let bar = view.insert_before(&self.footer, bar);
        // Rate and ETA count this run's items only.
        bar.reset_eta();
        self.running.insert(
            stage.to_owned(),
            StageBar {
                bar,
                not_ok: HashMap::new(),
                classes: BTreeMap::new(),
            },
        );
    }

    /// A stage ended: its bar shows its last state once, then leaves.
    fn close_bar(&mut self, stage: &str) {
        self.waiting.remove(stage);
        if let Some(done) = self.running.remove(stage) {
            done.bar.finish();
            if let Some(view) = &self.view {
                view.remove(&done.bar);
            }
        }
        // (Without a view the footer shows nothing: nothing to count.)
        if self.ended.insert(stage.to_owned()) && self.view.is_some() {
            self.footer.inc(1);
        }
        self.show_totals();
    }

    /// The footer's totals, where there is a footer to show them.
    fn show_totals(&self) {
        if self.view.is_some() {
            self.footer.set_message(self.totals.line());
        }
    }

    fn item_finished(&mut self, stage: &str, key: &str, class: &str) {
        // An item from the remote cache ends without a command starting.
        if let Some(items) = self.waiting.remove(stage) {
            self.open_bar(stage, items);
        }
        *self.totals.items.entry(class.to_owned()).or_default() += 1;
        if let Some(running) = self.running.get_mut(stage) {
            let before = if class == "ok" {
                running.not_ok.remove(key)
            } else {
                running.not_ok.insert(key.to_owned(), class.to_owned())
            };
            match before {
                None => running.bar.inc(1),
                Some(before) => {
                    if let Some(n) = running.classes.get_mut(&before) {
                        *n -= 1;
                    }
                    if let Some(n) = self.totals.items.get_mut(&before) {
                        *n -= 1;
                    }
                }
            }
            *running.classes.entry(class.to_owned()).or_default() += 1;
            running.bar.set_message(class_counts(&running.classes));
        }
        self.show_totals();
    }

    fn line(&self, text: String) {
        match &self.view {
            None => errln!("{text}"),
            Some(view) => {
                if view.println(&text).is_err() {
                    errln!("{text}");
                }
            }
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
        for running in self.running.values() {
            running.bar.finish_and_clear();
        }
        self.footer.finish_and_clear();
    }
}

impl Reporter for HumanReporter {
    fn event(&mut self, event: Event<'_>) {
        match event {
            Event::RunStarted { stages, .. } => self.footer.set_length(stages as u64),
            Event::StageEvaluated { .. } | Event::StageCutShort { .. } => {}
            Event::StageStarted {
                stage,
                reason,
                items,
            } => {
                self.waiting.insert(stage.to_owned(), items);
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
                match done {
                    Done::Ran => self.totals.ran += 1,
                    Done::Fresh => self.totals.fresh += 1,
                    Done::Restored | Done::Remote => self.totals.restored += 1,
                }
                self.close_bar(stage);
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
                self.totals.failed += 1;
                if self.ended.contains(stage) {
                    self.totals.ran = self.totals.ran.saturating_sub(1);
                }
                self.close_bar(stage);
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
                self.close_bar(stage);
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
                if key.is_empty() {
                    // A plain stage's command failed and is tried again.
                    if !self.quiet {
                        let tag = self.paint("33", "   retry");
                        self.line(format!("{tag}  {stage}: {class} (attempt {attempt})"));
                    }
                    return;
                }
                self.item_finished(stage, key, class);
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
            Event::ItemStarted { stage, .. } => {
                if let Some(items) = self.waiting.remove(stage) {
                    self.open_bar(stage, items);
                }
            }
            Event::StageBlocked { stage, by } => {
                self.close_bar(stage);
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

/// `colored` when colours are on, else `plain`.
fn style(color: bool, colored: &str, plain: &str) -> ProgressStyle {
    ProgressStyle::with_template(if color { colored } else { plain })
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ")
}
