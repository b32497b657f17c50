//! Per-item stages: `foreach`, result checks and the item lists each stage
//! reads (written by another stage or not); and the `classify` rules and
//! `retry` of every stage's attempts.

use super::*;

impl Checker<'_> {
    /// `foreach = { items, key }` and the per-item keys of a stage.
    pub(super) fn foreach(
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
        let allow_errors = find(table, "allow_errors")
            .and_then(|e| self.count(&e.value, "`allow_errors`", 0))
            .unwrap_or(0);
        let jobs = find(table, "jobs").and_then(|e| self.count(&e.value, "`jobs`", 1));
        let result =
            find(table, "item_result").and_then(|e| self.string(&e.value, "`item_result`"));
        let trajectory =
            find(table, "item_trajectory").and_then(|e| self.string(&e.value, "`item_trajectory`"));
        let samples = find(table, "samples").and_then(|e| self.samples(e));
        if samples.is_none() && find(table, "samples").is_some() {
            self.unread_samples.insert(name.to_owned());
        }
        let isolate = find(table, "isolate").and_then(|e| self.isolate(e));
        if let Some(e) = find(table, "samples").filter(|_| samples.is_some()) {
            // Two samples of one item must not write to one place.
            let unsampled = result
                .iter()
                .map(|r| ("item_result", r.as_str()))
                .chain(trajectory.iter().map(|t| ("item_trajectory", t.as_str())))
                .chain(
                    item_outputs
                        .iter()
                        .map(|o| ("an item output", o.template.as_str())),
                )
                .filter(|(_, template)| !template.contains("{sample.index}"))
                .map(|(what, template)| format!("{what} `{template}`"))
                .collect::<Vec<_>>();
            if !unsampled.is_empty() {
                self.problems.push(
                    Problem::new(
                        format!("stage `{name}` is sampled, but {} would be one path for every sample of an item", unsampled.join(" and ")),
                        e.key_span.clone(),
                        "sampled here",
                    )
                    .help("name the sample in the path, e.g. `item_result = \"results/{item.id}/{sample.index}.json\"`"),
                );
            }
        }
        for input in &item_inputs {
            if input.contains("{sample.") {
                let span =
                    find(table, "item_inputs").map_or(span.clone(), |e| e.value.span.clone());
                self.problems.push(
                    Problem::new(format!("item input `{input}` names a sample"), span, "here")
                        .help("what an item reads is the same for all its samples; `{sample.…}` belongs in `run`, `item_result` and `item_outputs`"),
                );
            }
        }
        let foreach = key.map(|key| Foreach {
            items: ProjectPath::new(String::new()),
            items_span: items
                .as_ref()
                .map(|(_, s)| s.clone())
                .unwrap_or(span.clone()),
            key,
            item_inputs,
            item_outputs,
            allow_errors,
            jobs,
            result,
            result_checks: Vec::new(),
            trajectory,
            samples,
            isolate,
        });
        (foreach, items)
    }

    /// `samples = { k = 8, seed = 0, pass_at = [1, 8], split = "FIELD",
    /// errors = "fail" | "exclude" }`.
    fn samples(&mut self, entry: &Entry) -> Option<Samples> {
        let table = self.expect_table(&entry.value, "`samples`")?;
        self.unknown_keys(table, SAMPLES_KEYS, "`samples`");
        let Some(k) = find(table, "k") else {
            self.problems.push(
                Problem::new("`samples` without `k`", entry.value.span.clone(), "here").help(
                    "say how many samples each item draws, e.g. `samples = { k = 8, seed = 0 }`",
                ),
            );
            return None;
        };
        let k = self.count(&k.value, "`samples.k`", 1)?;
        if k as i64 > MAX_SAMPLES {
            let span = find(table, "k").map_or(entry.value.span.clone(), |e| e.value.span.clone());
            self.problems.push(
                Problem::new(format!("`samples.k` is {k}, more than {MAX_SAMPLES}"), span, "too many")
                    .help("each sample is a unit of its own; pass@k is reported for k up to the samples drawn"),
            );
            return None;
        }
        let k = k as u32;
        let seed = match find(table, "seed") {
            None => 0,
            Some(e) => {
                match e.value.kind {
                    NodeKind::Integer(n) if n >= 0 => n as u64,
                    _ => {
                        self.problems.push(
                        Problem::new("`samples.seed` must be a whole number from 0 to 2⁶³ − 1", e.value.span.clone(), "here")
                            .help("e.g. `seed = 0`: sample `s` of every item is drawn with `seed + s`"),
                    );
                        return None;
                    }
                }
            }
        };
        let pass_at = match find(table, "pass_at") {
            None => {
                let mut at = vec![1, k];
                at.dedup();
                at
            }
            Some(e) => {
                let Some(values) = e.value.as_array() else {
                    self.type_error(
                        &e.value,
                        "`samples.pass_at`",
                        "a list of integers, e.g. `[1, 4, 8]`",
                    );
                    return None;
                };
                let mut at = Vec::new();
                for value in values {
                    let n = self.count(value, "a pass@k", 1)? as u32;
                    if n > k {
                        self.problems.push(
                            Problem::new(format!("pass@{n} of {k} samples"), value.span.clone(), "more than `k`")
                                .help(format!("pass@k needs at least k samples: raise `k` to {n}, or report at most pass@{k}")),
                        );
                        return None;
                    }
                    at.push(n);
                }
                if at.is_empty() {
                    self.problems.push(
                        Problem::new("`samples.pass_at` is empty", e.value.span.clone(), "here")
                            .help(format!("name the k of each pass@k to report, e.g. `pass_at = [1, {k}]`, or leave it out for that")),
                    );
                    return None;
                }
                at.sort_unstable();
                at.dedup();
                at
            }
        };
        let split = find(table, "split").and_then(|e| self.string(&e.value, "`samples.split`"));
        let protocol =
            find(table, "protocol").and_then(|e| self.string(&e.value, "`samples.protocol`"));
        let errors = match find(table, "errors") {
            None => ErrorsCount::AsFails,
            Some(e) => match self.string(&e.value, "`samples.errors`")?.as_str() {
                "fail" => ErrorsCount::AsFails,
                "exclude" => ErrorsCount::Excluded,
                other => {
                    self.problems.push(
                        Problem::new(format!("`samples.errors` is `{other}`"), e.value.span.clone(), "unknown")
                            .help("`fail` (the default: a sample that ended in error counts as a fail) or `exclude` (it leaves the denominator, and reports say so)"),
                    );
                    return None;
                }
            },
        };
        let summary =
            find(table, "summary").and_then(|e| self.string(&e.value, "`samples.summary`"));
        let compare = match find(table, "compare") {
            None => None,
            Some(e) => {
                let spec = self.expect_table(&e.value, "`samples.compare`")?;
                self.unknown_keys(spec, COMPARE_KEYS, "`samples.compare`");
                let by = find(spec, "by").and_then(|e| self.string(&e.value, "`compare.by`"));
                let on = find(spec, "on").and_then(|e| self.string(&e.value, "`compare.on`"));
                match (by, on) {
                    (Some(by), Some(on)) => Some(Compare { by, on }),
                    _ => {
                        self.problems.push(
                            Problem::new("`samples.compare` needs `by` and `on`", e.value.span.clone(), "here")
                                .help("name the field whose values are compared and the field that pairs their items, e.g. `compare = { by = \"model\", on = \"task_id\" }`"),
                        );
                        return None;
                    }
                }
            }
        };
        Some(Samples {
            k,
            seed,
            pass_at,
            split,
            protocol,
            errors,
            summary,
            compare,
        })
    }

    /// `isolate = { by = "FIELD", smoke = "FIELD", mark = "VERDICT" }`.
    fn isolate(&mut self, entry: &Entry) -> Option<Isolate> {
        let table = self.expect_table(&entry.value, "`isolate`")?;
        self.unknown_keys(table, ISOLATE_KEYS, "`isolate`");
        let Some(by) = find(table, "by").and_then(|e| self.string(&e.value, "`isolate.by`")) else {
            self.problems.push(
                Problem::new("`isolate` without `by`", entry.value.span.clone(), "here")
                    .help("name the item field that groups the items, e.g. `isolate = { by = \"model\", smoke = \"smoke\" }`"),
            );
            return None;
        };
        let smoke = find(table, "smoke")
            .and_then(|e| self.string(&e.value, "`isolate.smoke`"))
            .unwrap_or_else(|| "smoke".to_owned());
        let mark = match find(table, "mark") {
            None => "harness-incompatible".to_owned(),
            Some(e) => {
                let mark = self.string(&e.value, "`isolate.mark`")?;
                let verdict = !mark.is_empty()
                    && !matches!(mark.as_str(), "ok" | "error" | "infra" | "pending")
                    && mark
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
                if !verdict {
                    self.problems.push(
                        Problem::new(format!("`isolate.mark` is `{mark}`"), e.value.span.clone(), "not a verdict name")
                            .help("a marked group's skipped items are reported with a verdict of letters, digits, `-` and `_`, e.g. `harness-incompatible`"),
                    );
                    return None;
                }
                mark
            }
        };
        let one_at_a_time = match find(table, "one_at_a_time") {
            None => false,
            Some(e) => match e.value.kind {
                NodeKind::Boolean(b) => b,
                _ => {
                    self.type_error(&e.value, "`isolate.one_at_a_time`", "true or false");
                    false
                }
            },
        };
        let jobs = find(table, "jobs").and_then(|e| self.count(&e.value, "`isolate.jobs`", 1));
        Some(Isolate {
            by,
            smoke,
            mark,
            one_at_a_time,
            jobs,
        })
    }

    /// `classify` and `retry`: how any stage's attempts are classed and
    /// retried. A plain stage's attempt succeeds or fails, so its rules
    /// name no verdicts.
    pub(super) fn attempt_policy(
        &mut self,
        name: &str,
        table: &[Entry],
        per_item: bool,
    ) -> (Vec<ClassifyRule>, Retry) {
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
        if !per_item
            && let Some(rule) = classify
                .iter()
                .find(|r| matches!(r.class, ItemClass::Verdict(_)))
        {
            let span = find(table, "classify").map_or(0..0, |e| e.value.span.clone());
            self.problems.push(
                Problem::new(
                    format!("verdict `{}` in stage `{name}`, which is not a per-item stage", rule.class.name()),
                    span,
                    "in these rules",
                )
                .help("a plain stage's attempt is `ok`, `infra` (retried) or `error`; verdicts are the outcomes of items (`foreach`)"),
            );
        }
        if !per_item && classify.iter().any(|r| r.result.is_some()) {
            let span = find(table, "classify").map_or(0..0, |e| e.value.span.clone());
            self.problems.push(
                Problem::new(
                    format!("a `result` condition in stage `{name}`, which is not a per-item stage"),
                    span,
                    "in these rules",
                )
                .help("only an item has a JSON result (`item_result`); match a plain stage's `exit`, `ended` or `output`"),
            );
        }
        let retry = find(table, "retry")
            .map(|e| self.retry(&e.value))
            .unwrap_or_default();
        (classify, retry)
    }

    pub(super) fn classify_rule(&mut self, node: &Node) -> Option<ClassifyRule> {
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
        let ended = match find(table, "ended") {
            None => None,
            Some(e) => {
                let name = self.string(&e.value, "`ended`")?;
                let Some(ended) = Ended::parse(&name) else {
                    let help = self.did_you_mean(
                        &name,
                        Ended::NAMES.iter().copied(),
                        "`ended` is `timeout` or `out-of-memory`",
                    );
                    self.problems.push(
                        Problem::new(
                            format!("unknown end `{name}`"),
                            e.value.span.clone(),
                            "here",
                        )
                        .help(help),
                    );
                    return None;
                };
                if let Some(exit) = find(table, "exit") {
                    self.problems.push(
                        Problem::new(
                            "`exit` and `ended` in one rule",
                            exit.key_span.clone(),
                            "never matches with `ended`",
                        )
                        .help("a job that timed out or ran out of memory has no exit code: match `exit` and `ended` in two rules"),
                    );
                    return None;
                }
                Some(ended)
            }
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
        if exit.is_empty() && ended.is_none() && output.is_none() && result.is_none() {
            self.problems.push(
                Problem::new("a `classify` rule with nothing to match", node.span.clone(), "this rule")
                    .help("give `exit = CODE` or `ended = \"timeout\"`, `output = \"regex\"` (matched against stdout and stderr) and/or `result = \"/json/pointer\"` with `equals`"),
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
            ended,
            output,
            result,
            class,
            text,
        })
    }

    /// `{ result = "/pointer", equals = V | min = N | exists = B }`.
    pub(super) fn result_check(&mut self, table: &[Entry], node: &Node) -> Option<ResultCheck> {
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

    pub(super) fn retry(&mut self, node: &Node) -> Retry {
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

    /// Resolves each per-item stage's `items`: a path, or
    /// `{STAGE.out.NAME}` naming another stage's output.
    pub(super) fn resolve_items(
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
            if let Some(path) = &resolved
                && item_list_missing(path, &writers, root)
            {
                self.problems.push(
                    Problem::new(
                        format!("item list `{path}` does not exist and no stage produces it"),
                        span.clone(),
                        "missing",
                    )
                    .help("point `items` at a JSON array or JSONL file, or at `{STAGE.out.NAME}`"),
                );
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
                let summary = foreach.samples.as_ref().and_then(|s| s.summary.as_deref());
                if let Some(summary) = summary {
                    let declared = stage.outputs.iter().any(|o| o.name == summary);
                    let items_write = foreach.item_outputs.iter().any(|i| i.output == summary);
                    if !declared || items_write {
                        self.problems.push(
                            Problem::new(
                                format!("`samples.summary` of stage `{}` names `{summary}`, which is not an output of its own", stage.name),
                                stage.span.clone(),
                                "this stage",
                            )
                            .help("declare the file cairn writes the summary to, e.g. `outputs = { results = \"…/results.jsonl\", passk = \"…/passk.json\" }` with `summary = \"passk\"`"),
                        );
                    }
                }
                let merged = stage
                    .outputs
                    .iter()
                    .filter(|o| !foreach.item_outputs.iter().any(|i| i.output == o.name))
                    .filter(|o| Some(o.name.as_str()) != summary)
                    .count();
                if merged != 1 && !self.unread_samples.contains(&stage.name) {
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
}

/// Whether the item list at `path` neither exists nor is written by a stage.
pub(super) fn item_list_missing(path: &ProjectPath, writers: &OutputIndex, root: &Path) -> bool {
    writers.producer_of(path).is_none() && !path.resolve(root).exists()
}
