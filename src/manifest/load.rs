//! Parse and validate a manifest, reporting every problem at once.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use super::error::{LoadError, ManifestErrors, Problem};
use super::model::{
    ClassifyRule, Command, EnvValue, Expect, Foreach, ItemClass, ItemOutput, Manifest, Named,
    OutputIndex, PathDecl, ProjectPath, Resource, ResultCheck, Retry, Stage,
};
use super::raw::{self, Entry, Node, NodeKind, Span};

mod commands;
mod executors;
mod kubernetes;
mod output_places;
mod uses;

const TOP_KEYS: &[&str] = &[
    "pipeline",
    "params",
    "profiles",
    "resources",
    "executors",
    "stages",
];
const PIPELINE_KEYS: &[&str] = &["name", "root", "description"];
const PROFILE_KEYS: &[&str] = &["params", "executors", "description"];
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
    "foreach",
    "item_inputs",
    "classify",
    "retry",
    "allow_errors",
    "jobs",
    "item_result",
    "secrets",
    "uses",
    "with",
    "item_outputs",
];
const FOREACH_KEYS: &[&str] = &["items", "key"];
const CLASSIFY_KEYS: &[&str] = &["exit", "output", "result", "equals", "min", "exists", "as"];
const RESULT_CHECK_KEYS: &[&str] = &["result", "equals", "min", "exists"];
const RETRY_KEYS: &[&str] = &["max", "on", "backoff"];
/// Stage keys that only mean something for a `foreach` stage.
const ITEM_ONLY_KEYS: &[&str] = &[
    "item_inputs",
    "item_outputs",
    "classify",
    "retry",
    "allow_errors",
    "jobs",
    "item_result",
];

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

        let manifest_dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let (name, root) = self.pipeline(entries, tree, manifest_dir);
        let mut params = self.params(entries);
        let resources = self.resources(entries);
        // `--profile ci,cluster`: each applied in turn, a later one winning.
        let selected: Vec<&str> = profile.map_or_else(Vec::new, |p| p.split(',').collect());
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

        let mut drafts = Vec::new();
        match find(entries, "stages") {
            None => self.problems.push(
                Problem::new("the manifest defines no stages", 0..0, "expected `[stages.NAME]` tables")
                    .help("add a stage, e.g. `[stages.hello]` with `run = \"echo hello > {out.greeting}\"`"),
            ),
            Some(stages) => {
                if let Some(table) = self.expect_table(&stages.value, "`stages`") {
                    for entry in table {
                        if let Some(draft) = self.stage(entry, root.as_deref(), &params) {
                            drafts.push(draft);
                        }
                    }
                }
            }
        }

        let mut stages: Vec<Stage> = Vec::new();
        let mut items_refs = Vec::new();
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

        let (Some(name), Some(root)) = (name, root) else {
            return Ok(None);
        };
        Ok(Some(Manifest {
            path: path.to_owned(),
            source: self.source.to_owned(),
            name,
            root,
            profile: profile.map(str::to_owned),
            params,
            resources,
            executors,
            stages,
        }))
    }

    /// `foreach = { items, key }` and the per-item keys of a stage.
    fn foreach(
        &mut self,
        name: &str,
        table: &[Entry],
        span: &Span,
    ) -> (Option<Foreach>, Option<(String, Span)>) {
        let Some(entry) = find(table, "foreach") else {
            for key in ITEM_ONLY_KEYS {
                if let Some(e) = find(table, key) {
                    self.problems.push(
                        Problem::new(format!("`{key}` in stage `{name}`, which is not a per-item stage"), e.key_span.clone(), "needs `foreach`")
                            .help("add `foreach = { items = \"path/to/items.jsonl\", key = \"id\" }`, or remove this key"),
                    );
                }
            }
            return (None, None);
        };
        let Some(spec) = self.expect_table(&entry.value, "`foreach`") else {
            return (None, None);
        };
        self.unknown_keys(spec, FOREACH_KEYS, "`foreach`");
        let items = match find(spec, "items") {
            Some(e) => self
                .string(&e.value, "`foreach.items`")
                .map(|s| (s, e.value.span.clone())),
            None => {
                self.problems.push(
                    Problem::new(format!("`foreach` of stage `{name}` has no `items`"), entry.key_span.clone(), "here")
                        .help("name the item list: `items = \"path.jsonl\"` or `items = \"{STAGE.out.NAME}\"`"),
                );
                None
            }
        };
        let key = match find(spec, "key") {
            Some(e) => self.string(&e.value, "`foreach.key`"),
            None => {
                self.problems.push(
                    Problem::new(
                        format!("`foreach` of stage `{name}` has no `key`"),
                        entry.key_span.clone(),
                        "here",
                    )
                    .help("name the field that identifies an item, e.g. `key = \"task_id\"`"),
                );
                None
            }
        };
        let item_inputs = match find(table, "item_inputs") {
            Some(e) => self
                .named_list(&e.value, "`item_inputs`")
                .into_iter()
                .map(|n| n.name)
                .collect(),
            None => Vec::new(),
        };
        let item_outputs = match find(table, "item_outputs") {
            None => Vec::new(),
            Some(e) => match e.value.as_table() {
                Some(entries) => entries
                    .iter()
                    .filter_map(|entry| {
                        let template = self.string(&entry.value, "an item output")?;
                        let ok = !template.is_empty()
                            && !template.contains('/')
                            && template.contains("{item.");
                        if !ok {
                            self.problems.push(
                                Problem::new(format!("item output `{template}` must be one path component naming the item"), entry.value.span.clone(), "here")
                                    .help("each item writes one entry of the output directory, e.g. `item_outputs = { tasks = \"{item.id}\" }`"),
                            );
                            return None;
                        }
                        Some(ItemOutput {
                            output: entry.key.clone(),
                            template,
                            span: entry.key_span.clone(),
                        })
                    })
                    .collect(),
                None => {
                    self.type_error(&e.value, "`item_outputs`", "a table of OUTPUT = \"{item.FIELD}\"");
                    Vec::new()
                }
            },
        };
        let classify = match find(table, "classify") {
            None => Vec::new(),
            Some(e) => match e.value.as_array() {
                Some(rules) => rules
                    .iter()
                    .filter_map(|rule| self.classify_rule(rule))
                    .collect(),
                None => {
                    self.type_error(
                        &e.value,
                        "`classify`",
                        "an array of rules like `{ exit = 75, as = \"infra\" }`",
                    );
                    Vec::new()
                }
            },
        };
        let retry = find(table, "retry")
            .map(|e| self.retry(&e.value))
            .unwrap_or_default();
        let allow_errors = find(table, "allow_errors")
            .and_then(|e| self.count(&e.value, "`allow_errors`", 0))
            .unwrap_or(0);
        let jobs = find(table, "jobs").and_then(|e| self.count(&e.value, "`jobs`", 1));
        let result =
            find(table, "item_result").and_then(|e| self.string(&e.value, "`item_result`"));
        let foreach = key.map(|key| Foreach {
            items: ProjectPath::new(String::new()),
            items_span: items
                .as_ref()
                .map(|(_, s)| s.clone())
                .unwrap_or(span.clone()),
            key,
            item_inputs,
            item_outputs,
            classify,
            retry,
            allow_errors,
            jobs,
            result,
            result_checks: Vec::new(),
        });
        (foreach, items)
    }

    fn classify_rule(&mut self, node: &Node) -> Option<ClassifyRule> {
        let table = self.expect_table(node, "a `classify` rule")?;
        self.unknown_keys(table, CLASSIFY_KEYS, "a `classify` rule");
        let text = self.source.get(node.span.clone()).unwrap_or("").to_owned();
        let exit = match find(table, "exit").map(|e| &e.value) {
            None => Vec::new(),
            Some(Node {
                kind: NodeKind::Integer(code),
                ..
            }) => vec![*code as i32],
            Some(other) => match other.as_array() {
                Some(codes) => codes
                    .iter()
                    .filter_map(|c| match c.kind {
                        NodeKind::Integer(code) => Some(code as i32),
                        _ => {
                            self.type_error(c, "an exit code", "an integer");
                            None
                        }
                    })
                    .collect(),
                None => {
                    self.type_error(other, "`exit`", "an exit code or a list of exit codes");
                    return None;
                }
            },
        };
        let output = match find(table, "output") {
            None => None,
            Some(e) => {
                let pattern = self.string(&e.value, "`output`")?;
                match regex::Regex::new(&pattern) {
                    Ok(re) => Some(re),
                    Err(error) => {
                        self.problems.push(
                            Problem::new(
                                format!("invalid regular expression `{pattern}`"),
                                e.value.span.clone(),
                                "here",
                            )
                            .help(
                                error
                                    .to_string()
                                    .lines()
                                    .last()
                                    .unwrap_or("")
                                    .trim()
                                    .to_owned(),
                            ),
                        );
                        return None;
                    }
                }
            }
        };
        let result = if find(table, "result").is_some() {
            let condition: Vec<Entry> = table
                .iter()
                .filter(|e| RESULT_CHECK_KEYS.contains(&e.key.as_str()))
                .cloned()
                .collect();
            Some(self.result_check(&condition, node)?)
        } else {
            None
        };
        if exit.is_empty() && output.is_none() && result.is_none() {
            self.problems.push(
                Problem::new("a `classify` rule with nothing to match", node.span.clone(), "this rule")
                    .help("give `exit = CODE`, `output = \"regex\"` (matched against stdout and stderr) and/or `result = \"/json/pointer\"` with `equals`"),
            );
            return None;
        }
        let class = match find(table, "as") {
            Some(e) => {
                let name = self.string(&e.value, "`as`")?;
                if name.is_empty()
                    || !name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
                {
                    self.problems.push(
                        Problem::new(format!("invalid class `{name}`"), e.value.span.clone(), "here")
                            .help("use `ok`, `infra`, `error`, or a verdict name of letters, digits, `-` and `_`"),
                    );
                    return None;
                }
                ItemClass::parse(&name)
            }
            None => {
                self.problems.push(
                    Problem::new("a `classify` rule without `as`", node.span.clone(), "this rule")
                        .help("say what it means: `as = \"infra\"`, `as = \"ok\"`, or a verdict such as `as = \"rejected\"`"),
                );
                return None;
            }
        };
        Some(ClassifyRule {
            exit,
            output,
            result,
            class,
            text,
        })
    }

    /// `{ result = "/pointer", equals = V | min = N | exists = B }`.
    fn result_check(&mut self, table: &[Entry], node: &Node) -> Option<ResultCheck> {
        let text = self.source.get(node.span.clone()).unwrap_or("").to_owned();
        let pointer_entry = find(table, "result")?;
        let pointer = self.string(&pointer_entry.value, "`result`")?;
        if !pointer.is_empty() && !pointer.starts_with('/') {
            self.problems.push(
                Problem::new(
                    format!("`{pointer}` is not a JSON pointer"),
                    pointer_entry.value.span.clone(),
                    "here",
                )
                .help(format!("JSON pointers start with `/`: `/{pointer}`")),
            );
            return None;
        }
        let expect = match (
            find(table, "equals"),
            find(table, "min"),
            find(table, "exists"),
        ) {
            (Some(e), None, None) => Expect::Equals(param_value(&e.value)),
            (None, Some(e), None) => match e.value.kind {
                NodeKind::Integer(n) => Expect::Min(n as f64),
                NodeKind::Float(f) => Expect::Min(f),
                _ => {
                    self.type_error(&e.value, "`min`", "a number");
                    return None;
                }
            },
            (None, None, Some(e)) => match e.value.kind {
                NodeKind::Boolean(b) => Expect::Exists(b),
                _ => {
                    self.type_error(&e.value, "`exists`", "true or false");
                    return None;
                }
            },
            _ => {
                self.problems.push(
                    Problem::new("a result condition needs exactly one of `equals`, `min`, `exists`", node.span.clone(), "this condition")
                        .help("e.g. `{ result = \"/turns\", min = 1 }` or `{ result = \"/status\", equals = \"pass\" }`"),
                );
                return None;
            }
        };
        Some(ResultCheck {
            pointer,
            expect,
            text,
        })
    }

    fn retry(&mut self, node: &Node) -> Retry {
        let mut retry = Retry::default();
        let Some(table) = self.expect_table(node, "`retry`") else {
            return retry;
        };
        self.unknown_keys(table, RETRY_KEYS, "`retry`");
        if let Some(e) = find(table, "max") {
            retry.max = self.count(&e.value, "`retry.max`", 0).unwrap_or(0) as u32;
        }
        if let Some(e) = find(table, "on") {
            retry.on = self
                .named_list(&e.value, "`retry.on`")
                .into_iter()
                .filter_map(|n| match n.name.as_str() {
                    "infra" => Some(ItemClass::Infra),
                    "error" => Some(ItemClass::Error),
                    other => {
                        self.problems.push(
                            Problem::new(
                                format!("cannot retry on `{other}`"),
                                n.span.clone(),
                                "here",
                            )
                            .help(
                                "only `infra` and `error` are retried; ok and verdicts are final",
                            ),
                        );
                        None
                    }
                })
                .collect();
        }
        if let Some(e) = find(table, "backoff") {
            retry.backoff = self.timeout(&e.value).unwrap_or_default();
        }
        retry
    }

    pub(super) fn count(&mut self, node: &Node, what: &str, min: i64) -> Option<usize> {
        match node.kind {
            NodeKind::Integer(n) if n >= min && n <= u32::MAX as i64 => Some(n as usize),
            _ => {
                self.type_error(node, what, &format!("an integer of at least {min}"));
                None
            }
        }
    }

    /// Resolves each per-item stage's `items`: a path, or
    /// `{STAGE.out.NAME}` naming another stage's output.
    fn resolve_items(
        &mut self,
        stages: &mut [Stage],
        refs: Vec<Option<(String, Span)>>,
        root: &Path,
    ) {
        let writers = OutputIndex::new(stages);
        for (i, reference) in refs.into_iter().enumerate() {
            let Some((text, span)) = reference else {
                continue;
            };
            let resolved = match text
                .strip_prefix('{')
                .and_then(|t| t.strip_suffix('}'))
                .and_then(|t| t.split_once(".out."))
            {
                Some((stage, output)) => {
                    match stages
                        .iter()
                        .find(|s| s.name == stage)
                        .and_then(|s| s.outputs.iter().find(|o| o.name == output))
                    {
                        Some(decl) => Some(decl.path.clone()),
                        None => {
                            self.problems.push(
                                Problem::new(format!("`{text}` names no output"), span.clone(), "here")
                                    .help(format!("stage `{stage}` must exist and declare an output named `{output}`")),
                            );
                            None
                        }
                    }
                }
                None => match normalise(root, &text, false) {
                    Ok(path) => Some(path),
                    Err((message, help)) => {
                        self.problems
                            .push(Problem::new(message, span.clone(), "this path").help(help));
                        None
                    }
                },
            };
            if let Some(path) = &resolved {
                let produced = writers.producer_of(path).is_some();
                if !produced && !path.resolve(root).exists() {
                    self.problems.push(
                        Problem::new(
                            format!("item list `{path}` does not exist and no stage produces it"),
                            span.clone(),
                            "missing",
                        )
                        .help(
                            "point `items` at a JSON array or JSONL file, or at `{STAGE.out.NAME}`",
                        ),
                    );
                }
            }
            let stage = &mut stages[i];
            if let (Some(path), Some(foreach)) = (resolved, stage.foreach.as_mut()) {
                foreach.items = path;
                foreach.items_span = span;
            }
            if let Some(foreach) = &stage.foreach {
                for item_output in &foreach.item_outputs {
                    if !stage.outputs.iter().any(|o| o.name == item_output.output) {
                        self.problems.push(
                            Problem::new(
                                format!("item output `{}` names no output of stage `{}`", item_output.output, stage.name),
                                item_output.span.clone(),
                                "not in `outputs`",
                            )
                            .help("declare the directory the items write into: `outputs = { results = \"…\", tasks = \"state/tasks\" }`"),
                        );
                    }
                }
                let merged = stage
                    .outputs
                    .iter()
                    .filter(|o| !foreach.item_outputs.iter().any(|i| i.output == o.name))
                    .count();
                if merged != 1 {
                    self.problems.push(
                        Problem::new(
                            format!("per-item stage `{}` must declare exactly one output besides its item outputs", stage.name),
                            stage.span.clone(),
                            "this stage",
                        )
                        .help("cairn writes the merged item results there, e.g. `outputs = { results = \"state/oracle/results.jsonl\" }`"),
                    );
                }
            }
        }
    }

    /// `[resources]`: named capacities (positive integers).
    fn resources(&mut self, entries: &[Entry]) -> BTreeMap<String, Resource> {
        let mut resources = BTreeMap::new();
        let Some(entry) = find(entries, "resources") else {
            return resources;
        };
        let Some(table) = self.expect_table(&entry.value, "`resources`") else {
            return resources;
        };
        for resource in table {
            let capacity = |node: &Node| match node.kind {
                NodeKind::Integer(n) if n >= 1 && n <= u32::MAX as i64 => Some(n as u32),
                _ => None,
            };
            let (count, per_stage) = match &resource.value.kind {
                NodeKind::Table(spec) => {
                    self.unknown_keys(
                        spec,
                        &["capacity", "hold"],
                        &format!("resource `{}`", resource.key),
                    );
                    let per_stage = match find(spec, "hold").map(|e| (&e.value, e.value.as_str())) {
                        None | Some((_, Some("command"))) => false,
                        Some((_, Some("stage"))) => true,
                        Some((node, _)) => {
                            self.problems.push(
                                Problem::new("`hold` must be \"command\" or \"stage\"", node.span.clone(), "here")
                                    .help("\"command\": each command (each item) holds a unit; \"stage\": a per-item stage holds one unit while all its items run"),
                            );
                            false
                        }
                    };
                    (
                        find(spec, "capacity").and_then(|e| capacity(&e.value)),
                        per_stage,
                    )
                }
                _ => (capacity(&resource.value), false),
            };
            match count {
                Some(capacity) => {
                    resources.insert(resource.key.clone(), Resource { capacity, per_stage });
                }
                None => self.problems.push(
                    Problem::new(
                        format!("resource `{}` needs a capacity of at least 1", resource.key),
                        resource.value.span.clone(),
                        "not a positive integer",
                    )
                    .help("write how many holders may use it at once, e.g. `cluster-window = 1` or `cluster-window = { capacity = 1, hold = \"stage\" }`"),
                ),
            }
        }
        resources
    }

    fn check_resource_names(&mut self, stages: &[Stage], resources: &BTreeMap<String, Resource>) {
        for stage in stages {
            for held in &stage.resources {
                if !resources.contains_key(&held.name) {
                    let help = self.did_you_mean(
                        &held.name,
                        resources.keys().map(String::as_str),
                        &format!("declare it under `[resources]`, e.g. `{} = 1`", held.name),
                    );
                    self.problems.push(
                        Problem::new(
                            format!(
                                "stage `{}` holds undeclared resource `{}`",
                                stage.name, held.name
                            ),
                            held.span.clone(),
                            "not in `[resources]`",
                        )
                        .help(help),
                    );
                }
            }
        }
    }

    fn pipeline(
        &mut self,
        entries: &[Entry],
        tree: &Node,
        manifest_dir: &Path,
    ) -> (Option<String>, Option<PathBuf>) {
        let Some(pipeline) = find(entries, "pipeline") else {
            self.problems.push(
                Problem::new(
                    "missing `[pipeline]` table",
                    tree.span.start..tree.span.start,
                    "expected here",
                )
                .help("start the manifest with `[pipeline]` and `name = \"…\"`"),
            );
            return (None, manifest_dir.canonicalize().ok());
        };
        let Some(table) = self.expect_table(&pipeline.value, "`pipeline`") else {
            return (None, manifest_dir.canonicalize().ok());
        };
        self.unknown_keys(table, PIPELINE_KEYS, "`[pipeline]`");
        let name = match find(table, "name") {
            Some(entry) => self.string(&entry.value, "`pipeline.name`"),
            None => {
                self.problems.push(
                    Problem::new(
                        "`[pipeline]` has no `name`",
                        pipeline.key_span.clone(),
                        "in this table",
                    )
                    .help("add `name = \"my-pipeline\"`"),
                );
                None
            }
        };
        let root = match find(table, "root") {
            None => manifest_dir.canonicalize().ok(),
            Some(entry) => self
                .string(&entry.value, "`pipeline.root`")
                .and_then(|raw| {
                    let joined = manifest_dir.join(&raw);
                    match joined.canonicalize() {
                        Ok(root) if root.is_dir() => Some(root),
                        _ => {
                            self.problems.push(
                                Problem::new(
                                    format!("pipeline root `{raw}` is not a directory"),
                                    entry.value.span.clone(),
                                    "resolved against the manifest's directory",
                                )
                                .help("create the directory, or point `root` at an existing one"),
                            );
                            None
                        }
                    }
                }),
        };
        if root.is_none() && find(table, "root").is_none() {
            self.problems.push(Problem::new(
                format!(
                    "the manifest's directory `{}` cannot be resolved",
                    manifest_dir.display()
                ),
                pipeline.key_span.clone(),
                "here",
            ));
        }
        (name, root)
    }

    fn params(&mut self, entries: &[Entry]) -> BTreeMap<String, serde_json::Value> {
        let mut params = BTreeMap::new();
        if let Some(entry) = find(entries, "params")
            && let Some(table) = self.expect_table(&entry.value, "`params`")
        {
            for param in table {
                params.insert(param.key.clone(), param_value(&param.value));
            }
        }
        params
    }

    fn profiles(
        &mut self,
        entries: &[Entry],
        params: &BTreeMap<String, serde_json::Value>,
    ) -> BTreeMap<String, BTreeMap<String, serde_json::Value>> {
        let mut profiles = BTreeMap::new();
        let Some(entry) = find(entries, "profiles") else {
            return profiles;
        };
        let Some(table) = self.expect_table(&entry.value, "`profiles`") else {
            return profiles;
        };
        for profile in table {
            let Some(body) =
                self.expect_table(&profile.value, &format!("profile `{}`", profile.key))
            else {
                continue;
            };
            self.unknown_keys(body, PROFILE_KEYS, &format!("`[profiles.{}]`", profile.key));
            let mut overrides = BTreeMap::new();
            if let Some(p) = find(body, "params")
                && let Some(table) = self.expect_table(&p.value, "profile params")
            {
                for param in table {
                    if !params.contains_key(&param.key) {
                        self.problems.push(
                            Problem::new(
                                format!(
                                    "profile `{}` overrides undefined param `{}`",
                                    profile.key, param.key
                                ),
                                param.key_span.clone(),
                                "not in `[params]`",
                            )
                            .help(self.did_you_mean(
                                &param.key,
                                params.keys().map(String::as_str),
                                "declare it in `[params]` first",
                            )),
                        );
                    } else {
                        overrides.insert(param.key.clone(), param_value(&param.value));
                    }
                }
            }
            profiles.insert(profile.key.clone(), overrides);
        }
        profiles
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
            .map(|e| self.paths(&e.value, root, false))
            .unwrap_or_default();
        let outputs = find(table, "outputs")
            .map(|e| self.paths(&e.value, root, true))
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
        let (foreach, items) = self.foreach(name, table, &span);

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

    fn paths(&mut self, node: &Node, root: Option<&Path>, output: bool) -> Vec<PathDecl> {
        let what = if output { "`outputs`" } else { "`inputs`" };
        let pairs: Vec<(String, &Node)> = match &node.kind {
            NodeKind::Array(items) => items
                .iter()
                .enumerate()
                .map(|(i, n)| (i.to_string(), n))
                .collect(),
            NodeKind::Table(entries) => entries.iter().map(|e| (e.key.clone(), &e.value)).collect(),
            _ => {
                self.type_error(node, what, "a list of paths or a table of NAME = \"path\"");
                return Vec::new();
            }
        };
        let mut decls = Vec::new();
        for (name, value) in pairs {
            let Some(raw) = self.string(value, &format!("a path in {what}")) else {
                continue;
            };
            let Some(root) = root else { continue };
            match normalise(root, &raw, output) {
                Ok(path) => decls.push(PathDecl {
                    name,
                    path,
                    span: value.span.clone(),
                }),
                Err((message, help)) => self
                    .problems
                    .push(Problem::new(message, value.span.clone(), "this path").help(help)),
            }
        }
        decls
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

    /// Checks that span several stages: duplicate or nested outputs,
    /// `needs` naming unknown stages, inputs nothing provides.
    fn cross_stage(&mut self, stages: &[Stage], root: &Path) {
        let names: HashSet<&str> = stages.iter().map(|s| s.name.as_str()).collect();
        for stage in stages {
            for need in &stage.needs {
                if !names.contains(need.name.as_str()) {
                    self.problems.push(
                        Problem::new(
                            format!("stage `{}` needs unknown stage `{}`", stage.name, need.name),
                            need.span.clone(),
                            "no such stage",
                        )
                        .help(self.did_you_mean(
                            &need.name,
                            names.iter().copied(),
                            "check the stage names under `[stages]`",
                        )),
                    );
                }
            }
        }

        let mut writers: HashMap<&str, (&Stage, &PathDecl)> = HashMap::new();
        for stage in stages {
            for output in &stage.outputs {
                if let Some((other, first)) = writers.get(output.path.as_str()) {
                    self.problems.push(
                        Problem::new(
                            format!(
                                "stages `{}` and `{}` both write `{}`",
                                other.name, stage.name, output.path
                            ),
                            output.span.clone(),
                            "written a second time here",
                        )
                        .help(format!(
                            "each path has one producer; `{}` declares it at {}",
                            other.name,
                            self.line_of(first.span.start)
                        )),
                    );
                } else {
                    writers.insert(output.path.as_str(), (stage, output));
                }
            }
        }
        for stage in stages {
            for output in &stage.outputs {
                for ancestor in output.path.self_and_ancestors().skip(1) {
                    if let Some((other, _)) = writers.get(ancestor) {
                        self.problems.push(
                            Problem::new(
                                format!("output `{}` of stage `{}` lies inside output directory `{ancestor}` of stage `{}`", output.path, stage.name, other.name),
                                output.span.clone(),
                                "nested output",
                            )
                            .help("outputs must not overlap; write to a path outside the other stage's directory"),
                        );
                    }
                }
            }
        }

        let index = OutputIndex::new(stages);
        for stage in stages {
            for input in &stage.inputs {
                if index.producer_of(&input.path).is_some() || input.path.resolve(root).exists() {
                    continue;
                }
                let produced_inside = stages.iter().any(|s| {
                    s.outputs.iter().any(|o| {
                        o.path
                            .self_and_ancestors()
                            .skip(1)
                            .any(|a| a == input.path.as_str())
                    })
                });
                if produced_inside {
                    continue;
                }
                self.problems.push(
                    Problem::new(
                        format!(
                            "input `{}` of stage `{}` does not exist and no stage produces it",
                            input.path, stage.name
                        ),
                        input.span.clone(),
                        "missing",
                    )
                    .help(
                        self.did_you_mean(
                            input.path.as_str(),
                            stages
                                .iter()
                                .flat_map(|s| s.outputs.iter().map(|o| o.path.as_str())),
                            &format!(
                                "create `{}`, or add a stage whose `outputs` include it",
                                input.path.resolve(root).display()
                            ),
                        ),
                    ),
                );
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

/// Normalises a manifest path against the project root, lexically.
fn normalise(root: &Path, raw: &str, output: bool) -> Result<ProjectPath, (String, String)> {
    if raw.trim().is_empty() {
        return Err((
            "empty path".to_owned(),
            "write a path relative to the project root".to_owned(),
        ));
    }
    let path = Path::new(raw);
    let relative: PathBuf = if path.is_absolute() {
        match path.strip_prefix(root) {
            Ok(inside) => inside.to_owned(),
            Err(_) if output => {
                return Err((
                    format!(
                        "output `{raw}` is outside the project root `{}`",
                        root.display()
                    ),
                    "outputs must live inside the project; use a relative path".to_owned(),
                ));
            }
            Err(_) => {
                return Ok(ProjectPath::new(
                    lexical(path).to_string_lossy().into_owned(),
                ));
            }
        }
    } else {
        path.to_owned()
    };
    let mut parts: Vec<String> = Vec::new();
    for component in relative.components() {
        match component {
            Component::CurDir => {}
            Component::Normal(part) => parts.push(part.to_string_lossy().into_owned()),
            Component::ParentDir => {
                if parts.last().is_some_and(|p| p != "..") {
                    parts.pop();
                } else {
                    parts.push("..".to_owned());
                }
            }
            Component::RootDir | Component::Prefix(_) => {}
        }
    }
    if parts.first().is_some_and(|p| p == "..") {
        // `../proj/x` from inside `proj` is `x`.
        if let Ok(inside) = lexical(&root.join(parts.join("/"))).strip_prefix(root) {
            return normalise(root, &inside.to_string_lossy(), output);
        }
        if output {
            return Err((
                format!("output `{raw}` escapes the project root"),
                "outputs must stay inside the project root; remove the leading `..`".to_owned(),
            ));
        }
        // Outside the root: kept relative to it (commands run in the
        // root), so that moving the project with its neighbours changes
        // no fingerprint.
        return Ok(ProjectPath::new(parts.join("/")));
    }
    if parts.is_empty() {
        return Err((
            format!("path `{raw}` is the project root itself"),
            "name a file or directory inside the project".to_owned(),
        ));
    }
    if output && parts[0] == "cache" {
        return Err((
            format!("output `{raw}` is inside cairn's `cache/` directory"),
            "cairn owns `cache/`; write outputs elsewhere".to_owned(),
        ));
    }
    Ok(ProjectPath::new(parts.join("/")))
}

fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
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
