//! `[services.NAME]`: servers stages reach while they run, `services =
//! ["NAME"]` on a stage, and `[profiles.P.services.NAME]`, which replaces a
//! definition under profile `P` (a fixture server by default, a real model
//! server's URL with `--profile gpu`).

use std::collections::BTreeMap;
use std::time::Duration;

use super::super::interpolate::walk;
use super::super::model::{Command, GpuNeed, Service, Stage};
use super::super::raw::{Entry, Node, NodeKind};
use super::super::shell::{self, Context};
use super::{Checker, find, scalar};
use crate::manifest::error::Problem;

const KEYS: &[&str] = &[
    "description",
    "run",
    "url",
    "env",
    "ready",
    "check",
    "secrets",
    "start_timeout",
    "per_group",
    "gpus",
];
const GPU_KEYS: &[&str] = &["count", "memory_gib"];
/// How long a service may take to come up unless `start_timeout` says.
const DEFAULT_START_TIMEOUT: Duration = Duration::from_secs(120);
/// The placeholder a service's `run` and `url` are given its port in.
pub const PORT: &str = "{service.port}";
/// The placeholder a per-group service's `run`, `url`, `ready` and
/// `check` are given the group it serves in.
pub const GROUP: &str = "{service.group}";

impl Checker<'_> {
    /// `[services]`, with the selected profiles' replacements applied in
    /// their order. Every profile's replacements are checked, selected or
    /// not.
    pub(super) fn services(
        &mut self,
        entries: &[Entry],
        selected: &[&str],
        params: &BTreeMap<String, serde_json::Value>,
    ) -> BTreeMap<String, Service> {
        let mut services = BTreeMap::new();
        if let Some(entry) = find(entries, "services")
            && let Some(table) = self.expect_table(&entry.value, "`services`")
        {
            for service in table {
                if let Some(spec) = self.service(&service.key, &service.value, params) {
                    services.insert(service.key.clone(), spec);
                }
            }
        }
        let replacements = self.profile_replacements(
            entries,
            "service",
            "services",
            selected,
            |name| services.contains_key(name),
            |checker, entry| checker.service(&entry.key, &entry.value, params),
        );
        for (replacement, mut spec) in replacements {
            // The stages find it where they always did unless the
            // replacement says otherwise.
            let names_env = replacement
                .value
                .as_table()
                .is_some_and(|t| find(t, "env").is_some());
            if !names_env {
                spec.env = services[&replacement.key].env.clone();
            }
            services.insert(replacement.key.clone(), spec);
        }
        services
    }

    fn service(
        &mut self,
        name: &str,
        node: &Node,
        params: &BTreeMap<String, serde_json::Value>,
    ) -> Option<Service> {
        let context = format!("service `{name}`");
        let table = self.expect_table(node, &context)?;
        let valid_name = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !valid_name {
            self.problems.push(
                Problem::new(format!("invalid service name `{name}`"), node.span.clone(), "here")
                    .help("a service is named with letters, digits, `-` and `_`, starting with a letter (its log and its variable are named after it)"),
            );
            return None;
        }
        self.unknown_keys(table, KEYS, &context);
        let text = |checker: &mut Self, key: &str| {
            find(table, key).and_then(|e| checker.string(&e.value, &format!("`{key}`")))
        };
        let description = text(self, "description");
        let run = find(table, "run").and_then(|e| self.service_command(name, &e.value, params));
        let check = find(table, "check").and_then(|e| self.service_command(name, &e.value, params));
        let Some(url_entry) = find(table, "url") else {
            self.problems.push(
                Problem::new(format!("service `{name}` has no `url`"), node.span.clone(), "here")
                    .help("say where stages reach it, e.g. `url = \"http://127.0.0.1:{service.port}/v1\"` with a `run` that serves it, or the address of a server already running"),
            );
            return None;
        };
        let url = self.string(&url_entry.value, "`url`")?;
        let url = self.service_text(name, &url, &url_entry.value, params, false)?;
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            self.problems.push(
                Problem::new(
                    format!("service `{name}` has a `url` that is not http(s): `{url}`"),
                    url_entry.value.span.clone(),
                    "here",
                )
                .help("write an http:// or https:// address"),
            );
            return None;
        }
        if url
            .split_once("://")
            .is_some_and(|(_, rest)| rest.split('/').next().unwrap_or("").contains('@'))
        {
            self.problems.push(
                Problem::new(
                    format!("service `{name}` has credentials in its `url`"),
                    url_entry.value.span.clone(),
                    "here",
                )
                .help("the address is handed to every command and may be logged; pass a key through `secrets` (e.g. `secrets = [\"OPENAI_API_KEY\"]`) instead"),
            );
            return None;
        }
        if url.contains(PORT) && find(table, "run").is_none() {
            self.problems.push(
                Problem::new(
                    format!("service `{name}` has `{PORT}` in its `url` but no `run`"),
                    url_entry.value.span.clone(),
                    "here",
                )
                .help("cairn picks the port only for a service it starts; give the running server's address, or a `run` that serves it"),
            );
            return None;
        }
        let env = match find(table, "env") {
            None => format!(
                "CAIRN_SERVICE_{}",
                name.to_ascii_uppercase().replace('-', "_")
            ),
            Some(entry) => {
                let env = self.string(&entry.value, "`env`")?;
                let valid = env
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                    && env.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                if !valid {
                    self.problems.push(
                        Problem::new(
                            format!("invalid environment variable name `{env}`"),
                            entry.value.span.clone(),
                            "here",
                        )
                        .help("letters, digits and `_`, not starting with a digit, e.g. `OPENAI_BASE_URL`"),
                    );
                    return None;
                }
                env
            }
        };
        let secrets = find(table, "secrets")
            .map(|e| self.named_list(&e.value, "`secrets`"))
            .unwrap_or_default()
            .into_iter()
            .map(|n| n.name)
            .collect();
        let ready = match find(table, "ready") {
            None => String::new(),
            Some(entry) => {
                let ready = self.string(&entry.value, "`ready`")?;
                self.service_text(name, &ready, &entry.value, params, false)?
            }
        };
        let check_text = match &check {
            Some(Command::Shell(script)) => script.clone(),
            Some(Command::Exec(argv)) => argv.join(" "),
            None => String::new(),
        };
        if run.is_none() && (ready.contains(PORT) || check_text.contains(PORT)) {
            self.problems.push(
                Problem::new(
                    format!("service `{name}` has `{PORT}` in its `ready` or `check` but no `run`"),
                    node.span.clone(),
                    "here",
                )
                .help("cairn picks the port only for a service it starts; write the running server's address"),
            );
            return None;
        }
        let start_timeout = find(table, "start_timeout")
            .and_then(|e| self.timeout(&e.value))
            .unwrap_or(DEFAULT_START_TIMEOUT);
        let per_group = match find(table, "per_group") {
            None => false,
            Some(e) => match e.value.kind {
                NodeKind::Boolean(b) => b,
                _ => {
                    self.type_error(&e.value, "`per_group`", "true or false");
                    false
                }
            },
        };
        let gpus = match find(table, "gpus") {
            None => None,
            Some(entry) => self.gpu_need(name, entry, run.is_some())?,
        };
        let run_text = match &run {
            Some(Command::Shell(script)) => script.clone(),
            Some(Command::Exec(argv)) => argv.join(" "),
            None => String::new(),
        };
        if !per_group
            && [&run_text, &url, &ready, &check_text]
                .iter()
                .any(|t| t.contains(GROUP))
        {
            self.problems.push(
                Problem::new(
                    format!("service `{name}` has `{GROUP}` but serves every group at once"),
                    node.span.clone(),
                    "here",
                )
                .help("with `per_group = true` cairn starts one server per group of the stage's `isolate` groups, one at a time, and fills in the group"),
            );
            return None;
        }
        Some(Service {
            name: name.to_owned(),
            description,
            run,
            url,
            env,
            ready,
            check,
            secrets,
            start_timeout,
            per_group,
            gpus,
        })
    }

    /// `gpus = { count, memory_gib }` of service `name` (`Some(None)` for
    /// none given; `None` if it is wrong, the problem recorded).
    fn gpu_need(&mut self, name: &str, entry: &Entry, starts: bool) -> Option<Option<GpuNeed>> {
        let table = self.expect_table(&entry.value, "`gpus`")?;
        self.unknown_keys(table, GPU_KEYS, "`gpus`");
        if !starts {
            self.problems.push(
                Problem::new(
                    format!("service `{name}` has `gpus` but no `run`"),
                    entry.value.span.clone(),
                    "here",
                )
                .help("`gpus` is checked on this machine before cairn starts the server; a server already running at `url` has its GPUs where it runs"),
            );
            return None;
        }
        let Some(count) = find(table, "count") else {
            self.problems.push(
                Problem::new(
                    format!("service `{name}` has `gpus` without `count`"),
                    entry.value.span.clone(),
                    "here",
                )
                .help("say how many GPUs the server needs, e.g. `gpus = { count = 2, memory_gib = 40 }`"),
            );
            return None;
        };
        let count = self.count(&count.value, "`gpus.count`", 1)?;
        let memory_gib = find(table, "memory_gib")
            .map_or(Some(0), |e| self.count(&e.value, "`gpus.memory_gib`", 0))?;
        Some(Some(GpuNeed {
            count: count as u32,
            memory_gib: memory_gib as u32,
        }))
    }

    /// A service's `run` or `check`: a shell script or an argv, with
    /// `{params.X}` filled (quoted for where it stands) and
    /// `{service.port}` kept for when the port is known.
    fn service_command(
        &mut self,
        name: &str,
        node: &Node,
        params: &BTreeMap<String, serde_json::Value>,
    ) -> Option<Command> {
        match &node.kind {
            NodeKind::String(script) if !script.trim().is_empty() => self
                .service_text(name, script, node, params, true)
                .map(Command::Shell),
            NodeKind::Array(items) if !items.is_empty() => {
                let mut argv = Vec::new();
                for item in items {
                    let arg = self.string(item, "an argument")?;
                    argv.push(self.service_text(name, &arg, item, params, false)?);
                }
                Some(Command::Exec(argv))
            }
            _ => {
                self.type_error(
                    node,
                    &format!("a command of service `{name}`"),
                    "a non-empty string (run by /bin/sh) or array of strings (executed directly)",
                );
                None
            }
        }
    }

    /// `text` with its `{params.X}` filled (for a shell script, quoted for
    /// where each stands) and `{service.port}` kept; any other placeholder
    /// is a located error.
    fn service_text(
        &mut self,
        name: &str,
        text: &str,
        node: &Node,
        params: &BTreeMap<String, serde_json::Value>,
        is_shell: bool,
    ) -> Option<String> {
        let contexts = if is_shell {
            shell::contexts(text)
        } else {
            Default::default()
        };
        let filled = walk(text, true, |p| {
            let whole = &text[p.range.clone()];
            if whole == PORT || whole == GROUP {
                return Ok(None);
            }
            let value = match p.namespace {
                "params" => params.get(p.name).and_then(scalar),
                _ => None,
            };
            let Some(value) = value else {
                return Err((
                    whole,
                    format!(
                        "service `{name}` cannot fill `{whole}`: a service has `{{params.NAME}}` (a string, number or boolean), `{PORT}` and, serving one group at a time, `{GROUP}`"
                    ),
                ));
            };
            if !is_shell {
                return Ok(Some(value));
            }
            match contexts.get(&p.range.start) {
                Some(Ok(Context::Comment)) => Ok(None),
                Some(Ok(context)) => shell::quote(*context, shell::Value::One(&value))
                    .map(Some)
                    .map_err(|why| (whole, format!("`{whole}` cannot stand here: {why}"))),
                _ => Err((
                    whole,
                    format!("`{whole}` stands where no quoting keeps its value data"),
                )),
            }
        });
        match filled {
            Ok(filled) => Some(filled),
            Err(errors) => {
                for (whole, message) in errors {
                    let span = self.sub_span(node, whole);
                    self.problems.push(Problem::new(message, span, "here"));
                }
                None
            }
        }
    }

    /// Every `services = [..]` of a stage names a declared service, and no
    /// built-in stage names one.
    pub(super) fn check_service_names(
        &mut self,
        stages: &[Stage],
        services: &BTreeMap<String, Service>,
    ) {
        for stage in stages {
            for used in &stage.services {
                if let Some(service) = services.get(&used.name) {
                    let by_groups = stage
                        .foreach
                        .as_ref()
                        .and_then(|f| f.isolate.as_ref())
                        .is_some_and(|i| i.one_at_a_time);
                    if service.per_group && !by_groups {
                        self.problems.push(
                            Problem::new(
                                format!(
                                    "stage `{}` uses `{}`, which serves one group at a time, but does not run its items group by group",
                                    stage.name, used.name
                                ),
                                used.span.clone(),
                                "here",
                            )
                            .help("give the stage `isolate = { by = \"model\", one_at_a_time = true }`: each group's items then run with its own server"),
                        );
                    }
                    continue;
                }
                let help = self.did_you_mean(
                    &used.name,
                    services.keys().map(String::as_str),
                    &format!(
                        "declare it, e.g. `[services.{}]` with `url` (and `run` to have cairn start it)",
                        used.name
                    ),
                );
                self.problems.push(
                    Problem::new(
                        format!(
                            "stage `{}` uses undeclared service `{}`",
                            stage.name, used.name
                        ),
                        used.span.clone(),
                        "not in `[services]`",
                    )
                    .help(help),
                );
            }
        }
    }
}
