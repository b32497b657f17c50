//! `[executors.NAME]`: the engines stages run on, `executor = "NAME"` on a
//! stage, and `[profiles.P.executors.NAME]`, which replaces a definition
//! under profile `P` (so one manifest runs on this machine by default and
//! on a cluster with `--profile slurm`).

use std::collections::BTreeMap;
use std::time::Duration;

use super::super::model::{ExecutorSpec, SlurmSettings, Stage, is_per_item};
use super::super::raw::{Entry, Node};
use super::{Checker, find};
use crate::manifest::error::Problem;

const KINDS: &[&str] = &["local", "slurm", "kubernetes"];
const LOCAL_KEYS: &[&str] = &["kind"];
const SLURM_KEYS: &[&str] = &[
    "kind",
    "partition",
    "account",
    "time_limit",
    "cpus",
    "memory",
    "gres",
    "sbatch_args",
    "poll",
    "max_jobs",
    "batch",
];
/// How often a Slurm job's state is read at most, unless `poll` says.
const DEFAULT_POLL: Duration = Duration::from_secs(2);
/// Jobs queued or running at once on one Slurm executor, unless `max_jobs`
/// says: enough to fill a partition, few enough that 50,000 items do not
/// become 50,000 pending jobs at once.
const DEFAULT_MAX_JOBS: usize = 256;

impl Checker<'_> {
    /// `[executors]`, with the selected profiles' replacements applied in
    /// their order. Every profile's replacements are checked, selected or
    /// not.
    pub(super) fn executors(
        &mut self,
        entries: &[Entry],
        selected: &[&str],
    ) -> BTreeMap<String, ExecutorSpec> {
        let mut executors = BTreeMap::new();
        if let Some(entry) = find(entries, "executors")
            && let Some(table) = self.expect_table(&entry.value, "`executors`")
        {
            for executor in table {
                if let Some(spec) = self.executor_spec(&executor.key, &executor.value) {
                    executors.insert(executor.key.clone(), spec);
                }
            }
        }
        for (replacement, spec) in self.profile_replacements(
            entries,
            "executor",
            "executors",
            selected,
            |name| executors.contains_key(name),
            |checker, entry| checker.executor_spec(&entry.key, &entry.value),
        ) {
            executors.insert(replacement.key.clone(), spec);
        }
        executors
    }

    /// `[profiles.P.SECTION.NAME]` of every profile, each checked (it must
    /// replace a NAME that `[SECTION]` declares, and `parse` must take it):
    /// the replacements of the selected profiles, in the order they were
    /// selected. A replacement is a whole table.
    pub(super) fn profile_replacements<'n, T>(
        &mut self,
        entries: &'n [Entry],
        what: &str,
        section: &str,
        selected: &[&str],
        declared: impl Fn(&str) -> bool,
        mut parse: impl FnMut(&mut Self, &'n Entry) -> Option<T>,
    ) -> Vec<(&'n Entry, T)> {
        let Some(profiles) = find(entries, "profiles").and_then(|e| e.value.as_table()) else {
            return Vec::new();
        };
        let declared_names: Vec<&str> = find(entries, section)
            .and_then(|e| e.value.as_table())
            .map(|t| t.iter().map(|e| e.key.as_str()).collect())
            .unwrap_or_default();
        let mut replacements = Vec::new();
        for body in profiles {
            let Some(table) = body
                .value
                .as_table()
                .and_then(|t| find(t, section))
                .and_then(|e| self.expect_table(&e.value, &format!("profile {section}")))
            else {
                continue;
            };
            for replacement in table {
                if !declared(&replacement.key) {
                    // A declaration that could not be read is reported
                    // already.
                    if declared_names.contains(&replacement.key.as_str()) {
                        continue;
                    }
                    let help = self.did_you_mean(
                        &replacement.key,
                        declared_names.iter().copied(),
                        &format!(
                            "declare `[{section}.{}]` first; a profile replaces {} {what}, it does not add one",
                            replacement.key,
                            if what.starts_with('e') { "an" } else { "a" },
                        ),
                    );
                    self.problems.push(
                        Problem::new(
                            format!(
                                "profile `{}` replaces undeclared {what} `{}`",
                                body.key, replacement.key
                            ),
                            replacement.key_span.clone(),
                            format!("not in `[{section}]`"),
                        )
                        .help(help),
                    );
                    continue;
                }
                if let Some(spec) = parse(self, replacement)
                    && let Some(rank) = selected.iter().position(|p| *p == body.key)
                {
                    replacements.push((rank, replacement, spec));
                }
            }
        }
        replacements.sort_by_key(|(rank, ..)| *rank);
        replacements
            .into_iter()
            .map(|(_, replacement, spec)| (replacement, spec))
            .collect()
    }

    fn executor_spec(&mut self, name: &str, node: &Node) -> Option<ExecutorSpec> {
        let table = self.expect_table(node, &format!("executor `{name}`"))?;
        let Some(kind) = find(table, "kind") else {
            self.problems.push(
                Problem::new(
                    format!("executor `{name}` has no `kind`"),
                    node.span.clone(),
                    "here",
                )
                .help(
                    "say where its stages run: `kind = \"local\"`, `\"slurm\"` or `\"kubernetes\"`",
                ),
            );
            return None;
        };
        let kind_name = self.string(&kind.value, "`kind`")?;
        let context = format!("executor `{name}`");
        match kind_name.as_str() {
            "local" => {
                self.unknown_keys(table, LOCAL_KEYS, &context);
                Some(ExecutorSpec::Local)
            }
            "slurm" => {
                self.unknown_keys(table, SLURM_KEYS, &context);
                Some(ExecutorSpec::Slurm(self.slurm_settings(table)))
            }
            "kubernetes" => {
                self.unknown_keys(table, super::kubernetes::KEYS, &context);
                self.kubernetes_settings(name, node, table)
                    .map(ExecutorSpec::Kubernetes)
            }
            other => {
                let help = self.did_you_mean(
                    other,
                    KINDS.iter().copied(),
                    "the kinds are: local, slurm, kubernetes",
                );
                self.problems.push(
                    Problem::new(
                        format!("unknown executor kind `{other}`"),
                        kind.value.span.clone(),
                        "no such kind",
                    )
                    .help(help),
                );
                None
            }
        }
    }

    fn slurm_settings(&mut self, table: &[Entry]) -> SlurmSettings {
        let text = |checker: &mut Self, key: &str| {
            find(table, key).and_then(|e| checker.string(&e.value, &format!("`{key}`")))
        };
        let cpus = find(table, "cpus")
            .and_then(|e| self.count(&e.value, "`cpus`", 1))
            .map(|n| n as u32);
        let max_jobs = find(table, "max_jobs")
            .and_then(|e| self.count(&e.value, "`max_jobs`", 1))
            .unwrap_or(DEFAULT_MAX_JOBS);
        let batch = find(table, "batch")
            .and_then(|e| self.count(&e.value, "`batch`", 1))
            .unwrap_or(1);
        let sbatch_args = match find(table, "sbatch_args") {
            None => Vec::new(),
            Some(e) => match e.value.as_array() {
                Some(items) => items
                    .iter()
                    .filter_map(|item| self.string(item, "an `sbatch_args` entry"))
                    .collect(),
                None => {
                    self.type_error(&e.value, "`sbatch_args`", "an array of strings");
                    Vec::new()
                }
            },
        };
        SlurmSettings {
            partition: text(self, "partition"),
            account: text(self, "account"),
            time_limit: find(table, "time_limit").and_then(|e| self.timeout(&e.value)),
            cpus,
            memory: text(self, "memory"),
            gres: text(self, "gres"),
            sbatch_args,
            poll: find(table, "poll")
                .and_then(|e| self.timeout(&e.value))
                .unwrap_or(DEFAULT_POLL),
            max_jobs,
            batch,
        }
    }

    /// Every resource's `across` names a declared executor.
    pub(super) fn check_acrosses(&mut self, executors: &BTreeMap<String, ExecutorSpec>) {
        for (resource, executor, span) in std::mem::take(&mut self.acrosses) {
            if executors.contains_key(&executor) {
                continue;
            }
            let help = self.did_you_mean(
                &executor,
                executors.keys().map(String::as_str),
                "name the `[executors]` entry whose cluster the window spans",
            );
            self.problems.push(
                Problem::new(
                    format!(
                        "resource `{resource}` is held across undeclared executor `{executor}`"
                    ),
                    span,
                    "not in `[executors]`",
                )
                .help(help),
            );
        }
    }

    /// Every `executor = "NAME"` names a declared executor, and no built-in
    /// stage names one (built-ins run inside cairn, on this machine).
    pub(super) fn check_executor_names(
        &mut self,
        stages: &[Stage],
        executors: &BTreeMap<String, ExecutorSpec>,
    ) {
        for stage in stages {
            let Some(executor) = &stage.executor else {
                continue;
            };
            if stage.uses.is_some() {
                self.problems.push(
                    Problem::new(
                        format!("built-in stage `{}` names an executor", stage.name),
                        executor.span.clone(),
                        "here",
                    )
                    .help("built-in stages run inside cairn, on this machine; remove `executor`"),
                );
            } else if let Some(ExecutorSpec::Kubernetes(settings)) = executors.get(&executor.name)
                && stage.foreach.is_none()
                && is_per_item(&settings.image)
            {
                self.problems.push(
                    Problem::new(
                        format!(
                            "stage `{}` is not per-item, but executor `{}` takes its image from `{{item.…}}`",
                            stage.name, executor.name
                        ),
                        executor.span.clone(),
                        "here",
                    )
                    .help("give the stage `foreach`, or run it on an executor with one image"),
                );
            } else if !executors.contains_key(&executor.name) {
                let help = self.did_you_mean(
                    &executor.name,
                    executors.keys().map(String::as_str),
                    &format!(
                        "declare it, e.g. `[executors.{}]` with `kind = \"slurm\"`",
                        executor.name
                    ),
                );
                self.problems.push(
                    Problem::new(
                        format!(
                            "stage `{}` runs on undeclared executor `{}`",
                            stage.name, executor.name
                        ),
                        executor.span.clone(),
                        "not in `[executors]`",
                    )
                    .help(help),
                );
            }
        }
    }
}
