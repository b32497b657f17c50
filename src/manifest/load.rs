//! Parse and validate a manifest, reporting every problem at once.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use super::error::{LoadError, ManifestErrors, Problem};
use super::model::{
    ClassifyRule, Command, Compare, Ended, EnvValue, ErrorsCount, Expect, Foreach, Isolate,
    ItemClass, ItemOutput, Link, Manifest, Named, OutputIndex, PathDecl, ProjectPath,
    RemoteCacheSpec, Resource, ResultCheck, Retry, Samples, Stage,
};
use super::raw::{self, Entry, Node, NodeKind, Span};

mod cache;
mod commands;
mod cross_stage;
mod executors;
mod foreach;
mod kubernetes;
mod output_places;
mod paths;
mod pipeline;
mod services;
mod uses;

use crate::file_stat::{OpenDir, Stated};
use cross_stage::input_missing;
use foreach::item_list_missing;
use output_places::OutputPlaces;
use paths::normalise;
use pipeline::{manifest_dir, resolve_root};
pub use services::{GROUP as SERVICE_GROUP, PORT as SERVICE_PORT};

const TOP_KEYS: &[&str] = &[
    "pipeline",
    "params",
    "profiles",
    "resources",
    "executors",
    "services",
    "cache",
    "stages",
];
const PIPELINE_KEYS: &[&str] = &["name", "root", "description"];
const PROFILE_KEYS: &[&str] = &["params", "executors", "services", "description"];
const STAGE_KEYS: &[&str] = &[
    "description",
    "run",
    "inputs",
    "outputs",
    "needs",
    "params",
    "env",
    "version",
    "checks",
    "timeout",
    "resources",
    "executor",
    "services",
    "foreach",
    "item_inputs",
    "classify",
    "retry",
    "allow_errors",
    "jobs",
    "item_result",
    "item_trajectory",
    "secrets",
    "uses",
    "with",
    "item_outputs",
    "samples",
    "isolate",
];
const FOREACH_KEYS: &[&str] = &["items", "key"];
const CLASSIFY_KEYS: &[&str] = &[
    "exit", "ended", "output", "result", "equals", "min", "exists", "as",
];
const RESULT_CHECK_KEYS: &[&str] = &["result", "equals", "min", "exists"];
const RETRY_KEYS: &[&str] = &["max", "on", "backoff"];
/// Stage keys that only mean something for a `foreach` stage.
const ITEM_ONLY_KEYS: &[&str] = &[
    "item_inputs",
    "item_outputs",
    "allow_errors",
    "jobs",
    "item_result",
    "item_trajectory",
    "samples",
    "isolate",
];
const ISOLATE_KEYS: &[&str] = &["by", "smoke", "mark", "one_at_a_time", "jobs"];
const SAMPLES_KEYS: &[&str] = &[
    "k", "seed", "pass_at", "split", "protocol", "errors", "summary", "compare",
];
const COMPARE_KEYS: &[&str] = &["by", "on"];
/// The most samples of one item: more is a typo, not an evaluation.
const MAX_SAMPLES: i64 = 10_000;

/// Reads, parses and validates the manifest at `path` under `profile`.
pub fn load(path: &Path, profile: Option<&str>) -> Result<Manifest, LoadError> {
    let bytes = std::fs::read(path).map_err(|source| LoadError::Read {
        path: path.to_owned(),
        source,
    })?;
    match String::from_utf8(bytes) {
        Ok(source) => load_str(path, source, profile),
        Err(error) => Err(not_utf8(path, error).into()),
    }
}

/// Whether what validating `manifest` found on disk still holds: its
/// root resolves where it did, each input that no stage writes exists
/// (or has an output inside it), each item list exists or is written, and
/// no output is the manifest, its lock file or a path through a symbolic
/// link. The checks [`load`] makes, without their
/// messages: a kept manifest ([`super::kept`]) is taken up only where they
/// pass, and else loaded again to report what fails. An input in
/// `stated` was found moments ago: it is not looked for again.
pub(super) fn holds_on_disk(manifest: &Manifest, stated: &Stated) -> bool {
    let (stages, root) = (&manifest.stages, manifest.root.as_path());
    let written = manifest.root_as_written.as_deref();
    if resolve_root(manifest_dir(&manifest.path), written).as_deref() != Some(root) {
        return false;
    }
    let index = OutputIndex::new(stages);
    let mut dir = OpenDir::default();
    let mut places = OutputPlaces::new(root, &manifest.path).found(stated);
    stages.iter().all(|stage| {
        stage.inputs.iter().all(|input| {
            // (One another stage writes holds as it is: no path is made
            // for it.)
            index.producer_of(&input.path).is_some()
                || stated.contains(&input.path.resolve(root))
                || !input_missing(&input.path, stages, &index, root, &mut dir)
        }) && stage
            .foreach
            .as_ref()
            .is_none_or(|foreach| !item_list_missing(&foreach.items, &index, root))
            && stage
                .outputs
                .iter()
                .all(|output| places.refused(&output.path).is_none())
    })
}

/// A manifest that is not UTF-8, located at its first bad byte.
fn not_utf8(path: &Path, error: std::string::FromUtf8Error) -> ManifestErrors {
    let at = error.utf8_error().valid_up_to();
    let bytes = error.as_bytes();
    let bad = bytes[at..]
        .iter()
        .take(error.utf8_error().error_len().unwrap_or(bytes.len() - at))
        .map(|b| format!("0x{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ");
    let source_text = String::from_utf8_lossy(bytes).into_owned();
    let problem = Problem::new(
        format!("the manifest is not UTF-8 (byte {at}: {bad})"),
        // The lossy text holds U+FFFD where the bad bytes were.
        at..at + '\u{fffd}'.len_utf8(),
        "not UTF-8",
    )
    .help("save the manifest as UTF-8");
    ManifestErrors {
        path: path.to_owned(),
        source_text,
        problems: vec![problem],
    }
}

/// Validates manifest text as if read from `path`.
pub fn load_str(path: &Path, source: String, profile: Option<&str>) -> Result<Manifest, LoadError> {
    let tree = match raw::parse(&source) {
        Ok(tree) => tree,
        Err(error) => {
            let problem = Problem::new(
                format!("invalid TOML: {}", error.message),
                error.span,
                "here",
            )
            .help("see https://toml.io for the syntax");
            return Err(ManifestErrors {
                path: path.to_owned(),
                source_text: source,
                problems: vec![problem],
            }
            .into());
        }
    };
    let mut checker = Checker {
        source: &source,
        problems: Vec::new(),
        acrosses: Vec::new(),
        unread_samples: HashSet::new(),
        refused_paths: HashSet::new(),
    };
    let manifest = checker.manifest(path, &tree, profile)?;
    let mut problems = std::mem::take(&mut checker.problems);
    if problems.is_empty() {
        // Without a problem, only a project root that cannot be resolved
        // (its directory gone meanwhile) leaves no manifest.
        manifest.ok_or_else(|| LoadError::Read {
            path: path.to_owned(),
            source: std::io::Error::other("its directory cannot be resolved"),
        })
    } else {
        problems.sort_by_key(|p| p.span.start);
        Err(ManifestErrors {
            path: path.to_owned(),
            source_text: source,
            problems,
        }
        .into())
    }
}

struct Checker<'s> {
    source: &'s str,
    problems: Vec<Problem>,
    /// `across = "EXECUTOR"` of each resource (resource, executor, where),
    /// checked once the executors are known.
    acrosses: Vec<(String, String, Span)>,
    /// Stages whose `samples` could not be read (already reported): their
    /// outputs are not counted against a summary nobody could name.
    unread_samples: HashSet<String>,
    /// Declared paths refused (already reported), as (stage, `in` or
    /// `out`, name): a `{in.NAME}` or `{out.NAME}` of theirs is not
    /// reported again as undefined.
    refused_paths: HashSet<(String, &'static str, String)>,
}

/// A stage before interpolation.
struct Draft<'n> {
    stage: Stage,
    /// `foreach.items` as written, resolved once every stage is known.
    items: Option<(String, Span)>,
    run: Option<&'n Node>,
    /// `uses = "NAME"` and its `with` table, for a built-in stage.
    uses: Option<(&'n Entry, Option<&'n Node>)>,
    checks: Vec<&'n Node>,
    referenced_params: Vec<String>,
}

impl<'s> Checker<'s> {
    fn manifest(
        &mut self,
        path: &Path,
        tree: &Node,
        profile: Option<&str>,
    ) -> Result<Option<Manifest>, LoadError> {
        let entries = tree.as_table().unwrap_or_default();
        self.unknown_keys(entries, TOP_KEYS, "top level of the manifest");

        let (name, root, root_as_written) = self.pipeline(entries, tree, manifest_dir(path));
        let mut params = self.params(entries);
        let resources = self.resources(entries);
        let (link, remote_cache) = self.cache(entries);
        // `--profile ci,cluster`: each applied in turn, a later one winning.
        let selected: Vec<&str> =
            profile.map_or_else(Vec::new, |p| p.split(',').map(str::trim).collect());
        let executors = self.executors(entries, &selected);
        let profiles = self.profiles(entries, &params);
        for wanted in &selected {
            match profiles.get(*wanted) {
                Some(overrides) => params.extend(overrides.clone()),
                None => {
                    return Err(LoadError::UnknownProfile {
                        name: (*wanted).to_owned(),
                        known: profiles.keys().cloned().collect(),
                    });
                }
            }
        }
        let services = self.services(entries, &selected, &params);

        let mut drafts = Vec::new();
        match find(entries, "stages") {
            None => self.problems.push(
                Problem::new("the manifest defines no stages", 0..0, "expected `[stages.NAME]` tables")
                    .help("add a stage, e.g. `[stages.hello]` with `run = \"echo hello > {out.greeting}\"`"),
            ),
            Some(stages) => {
                if let Some(table) = self.expect_table(&stages.value, "`stages`") {
                    drafts.reserve(table.len());
                    for entry in table {
                        if let Some(draft) = self.stage(entry, root.as_deref(), &params) {
                            drafts.push(draft);
                        }
                    }
                }
            }
        }

        // Sized once: a stage is large, and growing a vector of a thousand
        // of them copied each one several times.
        let mut stages: Vec<Stage> = Vec::with_capacity(drafts.len());
        let mut items_refs = Vec::with_capacity(drafts.len());
        for mut draft in drafts {
            let items = draft.items.take();
            if let Some(stage) = self.interpolate_stage(draft, &params) {
                items_refs.push(items);
                stages.push(stage);
            }
        }
        if let Some(root) = &root {
            self.resolve_items(&mut stages, items_refs, root);
        }
        if let Some(root) = &root {
            self.cross_stage(&stages, root);
            self.check_output_places(&stages, root, path);
        }
        self.check_resource_names(&stages, &resources);
        self.check_executor_names(&stages, &executors);
        self.check_service_names(&stages, &services);
        self.check_acrosses(&executors);

        let (Some(name), Some(root)) = (name, root) else {
            return Ok(None);
        };
        Ok(Some(Manifest {
            path: path.to_owned(),
            source: self.source.to_owned(),
            name,
            root,
            root_as_written,
            profile: profile.map(str::to_owned),
            params,
            resources,
            executors,
            remote_cache,
            link,
            services,
            stages,
        }))
    }

    pub(super) fn count(&mut self, node: &Node, what: &str, min: i64) -> Option<usize> {
        match node.kind {
            NodeKind::Integer(n) if n >= min && n <= u32::MAX as i64 => Some(n as usize),
            NodeKind::Integer(n) => {
                let expected = format!("an integer of at least {min}");
                self.problems.push(
                    Problem::new(
                        format!("{what} must be {expected}, found {n}"),
                        node.span.clone(),
                        "out of range",
                    )
                    .help(format!("write {what} as {expected}")),
                );
                None
            }
            _ => {
                self.type_error(node, what, &format!("an integer of at least {min}"));
                None
            }
        }
    }

    fn stage<'n>(
        &mut self,
        entry: &'n Entry,
        root: Option<&Path>,
        params: &BTreeMap<String, serde_json::Value>,
    ) -> Option<Draft<'n>> {
        let name = &entry.key;
        let span = entry.key_span.clone();
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
            || name.starts_with('.')
        {
            self.problems.push(
                Problem::new(
                    format!("invalid stage name `{name}`"),
                    span.clone(),
                    "stage names name files too",
                )
                .help("use letters, digits, `-`, `_` and `.` only"),
            );
        }
        let table = self.expect_table(&entry.value, &format!("stage `{name}`"))?;
        self.unknown_keys(table, STAGE_KEYS, &format!("`[stages.{name}]`"));

        let run = find(table, "run").map(|e| &e.value);
        let uses = find(table, "uses");
        let with = find(table, "with");
        if let Some(with) = with
            && uses.is_none()
        {
            self.problems.push(
                Problem::new("`with` in a stage without `uses`", with.key_span.clone(), "here")
                    .help("`with` configures a built-in stage: add `uses = \"freeze\"` (or `export`, `register`), or remove `with`"),
            );
        }
        if let (Some(uses), Some(_)) = (uses, run) {
            self.problems.push(
                Problem::new(
                    format!("stage `{name}` has both `run` and `uses`"),
                    uses.key_span.clone(),
                    "here",
                )
                .help("a stage runs either a command (`run`) or a built-in (`uses`); remove one"),
            );
        }
        if let (Some(uses), Some(_)) = (uses, find(table, "foreach")) {
            self.problems.push(
                Problem::new(
                    format!("built-in stage `{name}` cannot be a per-item stage"),
                    uses.key_span.clone(),
                    "here",
                )
                .help("built-ins run once over their inputs; remove `foreach`"),
            );
        }
        if run.is_none() && uses.is_none() {
            self.problems.push(
                Problem::new(
                    format!("stage `{name}` has no `run`"),
                    span.clone(),
                    "this stage",
                )
                .help("add `run = \"shell command\"` or `run = [\"program\", \"arg\"]`, or `uses = \"BUILTIN\"` for a built-in stage"),
            );
        }
        let description =
            find(table, "description").and_then(|e| self.string(&e.value, "`description`"));
        let inputs = find(table, "inputs")
            .map(|e| self.paths(name, &e.value, root, false))
            .unwrap_or_default();
        let outputs = find(table, "outputs")
            .map(|e| self.paths(name, &e.value, root, true))
            .unwrap_or_default();
        let needs = find(table, "needs")
            .map(|e| self.named_list(&e.value, "`needs`"))
            .unwrap_or_default();

        let mut stage_params = BTreeMap::new();
        for declared in find(table, "params")
            .map(|e| self.named_list(&e.value, "`params`"))
            .unwrap_or_default()
        {
            match params.get(&declared.name) {
                Some(value) => {
                    stage_params.insert(declared.name.clone(), value.clone());
                }
                None => self.problems.push(
                    Problem::new(
                        format!(
                            "stage `{name}` declares undefined param `{}`",
                            declared.name
                        ),
                        declared.span.clone(),
                        "not in `[params]`",
                    )
                    .help(self.did_you_mean(
                        &declared.name,
                        params.keys().map(String::as_str),
                        "declare it in `[params]`",
                    )),
                ),
            }
        }

        let env = find(table, "env")
            .map(|e| self.env(&e.value))
            .unwrap_or_default();
        let secrets: Vec<String> = find(table, "secrets")
            .map(|e| self.named_list(&e.value, "`secrets`"))
            .unwrap_or_default()
            .into_iter()
            .filter_map(|n| {
                if env.contains_key(&n.name) {
                    self.problems.push(
                        Problem::new(format!("`{}` is both in `env` and in `secrets`", n.name), n.span.clone(), "here")
                            .help("a secret is passed through from cairn's environment; list it in `secrets` only"),
                    );
                    None
                } else {
                    Some(n.name)
                }
            })
            .collect();
        let version = find(table, "version").and_then(|e| match &e.value.kind {
            NodeKind::String(s) => Some(s.clone()),
            NodeKind::Integer(i) => Some(i.to_string()),
            _ => {
                self.type_error(&e.value, "`version`", "a string or an integer");
                None
            }
        });
        let checks = match find(table, "checks") {
            None => Vec::new(),
            Some(e) => match e.value.as_array() {
                Some(items) => items.iter().collect(),
                None => {
                    self.type_error(&e.value, "`checks`", "an array of commands");
                    Vec::new()
                }
            },
        };
        let timeout = find(table, "timeout").and_then(|e| self.timeout(&e.value));
        let resources = find(table, "resources")
            .map(|e| self.named_list(&e.value, "`resources`"))
            .unwrap_or_default();
        let executor = find(table, "executor").and_then(|e| {
            Some(Named {
                name: self.string(&e.value, "`executor`")?,
                span: e.value.span.clone(),
            })
        });
        let services = find(table, "services")
            .map(|e| self.named_list(&e.value, "`services`"))
            .unwrap_or_default();
        let (foreach, items) = self.foreach(name, table, &span);
        let (classify, retry) = self.attempt_policy(name, table, find(table, "foreach").is_some());

        Some(Draft {
            stage: Stage {
                name: name.clone(),
                span,
                description,
                run: Command::Shell(String::new()),
                uses: None,
                inputs,
                outputs,
                needs,
                params: stage_params,
                env,
                secrets,
                version,
                checks: Vec::new(),
                timeout,
                resources,
                executor,
                services,
                classify,
                retry,
                foreach,
            },
            items,
            run,
            uses: uses.map(|u| (u, with.map(|w| &w.value))),
            checks,
            referenced_params: Vec::new(),
        })
    }

    fn interpolate_stage(
        &mut self,
        mut draft: Draft<'_>,
        params: &BTreeMap<String, serde_json::Value>,
    ) -> Option<Stage> {
        let run = draft.run.and_then(|node| {
            self.command(
                node,
                &draft.stage,
                params,
                &mut draft.referenced_params,
                "run",
            )
        });
        let mut checks = Vec::new();
        for node in &draft.checks {
            if let Some(table) = node.as_table() {
                self.unknown_keys(table, RESULT_CHECK_KEYS, "a result check");
                let has_result = draft
                    .stage
                    .foreach
                    .as_ref()
                    .is_some_and(|f| f.result.is_some());
                if !has_result {
                    self.problems.push(
                        Problem::new("a result check in a stage without `item_result`", node.span.clone(), "this check")
                            .help("result checks look at the JSON each item writes: declare it with `item_result = \"results/{item.id}.json\"`"),
                    );
                    continue;
                }
                if let Some(check) = self.result_check(table, node)
                    && let Some(foreach) = draft.stage.foreach.as_mut()
                {
                    foreach.result_checks.push(check);
                }
                continue;
            }
            if let Some(check) = self.command(
                node,
                &draft.stage,
                params,
                &mut draft.referenced_params,
                "check",
            ) {
                checks.push(check);
            }
        }
        let built_in = draft.uses.and_then(|(uses, with)| {
            self.uses(
                uses,
                with,
                &draft.stage,
                params,
                &mut draft.referenced_params,
            )
        });
        let mut stage = draft.stage;
        if let Some((uses, run)) = built_in {
            stage.uses = Some(uses);
            stage.run = run;
        }
        for param in draft.referenced_params {
            if let Some(value) = params.get(&param) {
                stage.params.insert(param, value.clone());
            }
        }
        // A stage whose command is broken is kept (with an empty command) so
        // that cross-stage checks still see its inputs and outputs; the
        // problem already recorded rejects the manifest.
        if let Some(run) = run {
            stage.run = run;
        }
        stage.checks = checks;
        Some(stage)
    }

    fn named_list(&mut self, node: &Node, what: &str) -> Vec<Named> {
        match node.as_array() {
            Some(items) => items
                .iter()
                .filter_map(|item| {
                    self.string(item, &format!("an entry of {what}"))
                        .map(|name| Named {
                            name,
                            span: item.span.clone(),
                        })
                })
                .collect(),
            None => {
                self.type_error(node, what, "an array of strings");
                Vec::new()
            }
        }
    }

    fn env(&mut self, node: &Node) -> BTreeMap<String, EnvValue> {
        let mut env = BTreeMap::new();
        match &node.kind {
            NodeKind::Array(items) => {
                for item in items {
                    if let Some(name) = self.string(item, "an entry of `env`") {
                        env.insert(name, EnvValue::PassThrough);
                    }
                }
            }
            NodeKind::Table(entries) => {
                for entry in entries {
                    match &entry.value.kind {
                        NodeKind::String(value) => {
                            env.insert(entry.key.clone(), EnvValue::Literal(value.clone()));
                        }
                        NodeKind::Boolean(true) => {
                            env.insert(entry.key.clone(), EnvValue::PassThrough);
                        }
                        _ => self.type_error(&entry.value, &format!("`env.{}`", entry.key), "a string value, or `true` to pass the variable through from cairn's environment"),
                    }
                }
            }
            _ => self.type_error(
                node,
                "`env`",
                "a table NAME = \"value\" or a list of variable names to pass through",
            ),
        }
        for name in env.keys() {
            if name.is_empty() || name.contains('=') || name.contains('\0') {
                self.problems.push(Problem::new(
                    format!("invalid environment variable name `{name}`"),
                    node.span.clone(),
                    "here",
                ));
            }
        }
        env
    }

    fn timeout(&mut self, node: &Node) -> Option<Duration> {
        match &node.kind {
            NodeKind::Integer(seconds) if *seconds > 0 => {
                Some(Duration::from_secs(*seconds as u64))
            }
            NodeKind::String(text) => match humantime::parse_duration(text) {
                Ok(duration) if !duration.is_zero() => Some(duration),
                _ => {
                    self.problems.push(
                        Problem::new(format!("invalid timeout `{text}`"), node.span.clone(), "not a duration")
                            .help("write a duration such as \"90s\", \"10m\" or \"2h 30m\", or a number of seconds"),
                    );
                    None
                }
            },
            _ => {
                self.type_error(
                    node,
                    "`timeout`",
                    "a positive number of seconds or a duration string like \"10m\"",
                );
                None
            }
        }
    }

    fn line_of(&self, offset: usize) -> String {
        let (line, col) = super::error::line_col(self.source, offset);
        format!("line {line}, column {col}")
    }

    fn unknown_keys(&mut self, entries: &[Entry], allowed: &[&str], context: &str) {
        for entry in entries {
            if !allowed.contains(&entry.key.as_str()) {
                let help = self.did_you_mean(
                    &entry.key,
                    allowed.iter().copied(),
                    &format!("allowed keys: {}", allowed.join(", ")),
                );
                self.problems.push(
                    Problem::new(
                        format!("unknown key `{}` in {context}", entry.key),
                        entry.key_span.clone(),
                        "unknown key",
                    )
                    .help(help),
                );
            }
        }
    }

    fn did_you_mean<'a>(
        &self,
        wrong: &str,
        candidates: impl Iterator<Item = &'a str>,
        otherwise: &str,
    ) -> String {
        candidates
            .map(|c| (strsim::levenshtein(wrong, c), c))
            .filter(|(distance, c)| *distance <= 2.max(c.len() / 3))
            .min()
            .map(|(_, c)| format!("did you mean `{c}`?"))
            .unwrap_or_else(|| otherwise.to_owned())
    }

    fn expect_table<'n>(&mut self, node: &'n Node, what: &str) -> Option<&'n [Entry]> {
        let table = node.as_table();
        if table.is_none() {
            self.type_error(node, what, "a table");
        }
        table
    }

    fn string(&mut self, node: &Node, what: &str) -> Option<String> {
        let s = node.as_str().map(str::to_owned);
        if s.is_none() {
            self.type_error(node, what, "a string");
        }
        s
    }

    fn type_error(&mut self, node: &Node, what: &str, expected: &str) {
        self.problems.push(
            Problem::new(
                format!("{what} must be {expected}, found {}", node.type_name()),
                node.span.clone(),
                format!("{} here", node.type_name()),
            )
            .help(format!("write {what} as {expected}")),
        );
    }
}

fn find<'e>(entries: &'e [Entry], key: &str) -> Option<&'e Entry> {
    entries.iter().find(|e| e.key == key)
}

fn scalar(value: &serde_json::Value) -> Option<String> {
    match value {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        serde_json::Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// A TOML value as JSON (params are hashed as canonical JSON).
fn param_value(node: &Node) -> serde_json::Value {
    match &node.kind {
        NodeKind::String(s) => serde_json::Value::from(s.clone()),
        NodeKind::Integer(i) => serde_json::Value::from(*i),
        NodeKind::Float(f) => serde_json::Value::from(*f),
        NodeKind::Boolean(b) => serde_json::Value::from(*b),
        NodeKind::Datetime(d) => serde_json::Value::from(d.clone()),
        NodeKind::Array(items) => serde_json::Value::Array(items.iter().map(param_value).collect()),
        NodeKind::Table(entries) => serde_json::Value::Object(
            entries
                .iter()
                .map(|e| (e.key.clone(), param_value(&e.value)))
                .collect(),
        ),
    }
}
