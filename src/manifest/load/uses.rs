//! Built-in stages: `uses = "NAME"` with a `with` table, checked against
//! the built-in's signature in [`catalog`].

use std::collections::BTreeMap;

use super::super::catalog::{self, BuiltinSpec, Port, SettingKind};
use super::super::model::{Command, PathDecl, Stage, Uses};
use super::super::raw::{Entry, Node, NodeKind};
use super::{Checker, find};
use crate::manifest::error::Problem;

impl Checker<'_> {
    /// Validates a built-in stage and builds its settings and command.
    pub(super) fn uses(
        &mut self,
        uses: &Entry,
        with: Option<&Node>,
        stage: &Stage,
        params: &BTreeMap<String, serde_json::Value>,
        referenced: &mut Vec<String>,
    ) -> Option<(Uses, Command)> {
        let name = self.string(&uses.value, "`uses`")?;
        let Some(spec) = catalog::builtin(&name) else {
            self.problems.push(
                Problem::new(
                    format!("unknown built-in `{name}`"),
                    uses.value.span.clone(),
                    "no such built-in",
                )
                .help(self.did_you_mean(
                    &name,
                    catalog::BUILTINS.iter().map(|b| b.name),
                    &format!(
                        "the built-ins are: {}",
                        catalog::BUILTINS
                            .iter()
                            .map(|b| b.name)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                )),
            );
            return None;
        };
        let ports_ok = self.ports(spec, uses, &stage.inputs, spec.inputs, "input")
            & self.ports(spec, uses, &stage.outputs, spec.outputs, "output");

        let with_node = with;
        let entries: &[Entry] = match with {
            None => &[],
            Some(node) => self.expect_table(node, "`with`")?,
        };
        let names: Vec<&str> = spec.settings.iter().map(|s| s.name).collect();
        self.unknown_keys(entries, &names, &format!("`with` of built-in `{name}`"));
        let mut settings = serde_json::Map::new();
        let mut settings_ok = true;
        for setting in spec.settings {
            match find(entries, setting.name) {
                None if setting.required => {
                    settings_ok = false;
                    self.problems.push(
                        Problem::new(
                            format!("built-in `{name}` needs `with.{}`", setting.name),
                            uses.key_span.clone(),
                            "this stage",
                        )
                        .help(format!(
                            "add `{}` ({}) to the stage's `with` table: {}",
                            setting.name,
                            setting.kind.describe(),
                            setting.about
                        )),
                    );
                }
                None => {}
                Some(entry) => match self.setting(setting.kind, entry, stage, params, referenced) {
                    Some(value) => {
                        settings.insert(setting.name.to_owned(), value);
                    }
                    None => settings_ok = false,
                },
            }
        }
        if !(ports_ok && settings_ok) {
            return None;
        }
        let with = serde_json::Value::Object(settings);
        if let Some(validate) = spec.validate {
            let inputs: Vec<&str> = stage.inputs.iter().map(|d| d.name.as_str()).collect();
            if let Err(message) = validate(&with, &inputs) {
                let span = with_node_span(with_node, uses);
                self.problems.push(
                    Problem::new(
                        format!("invalid `with` for built-in `{name}`: {message}"),
                        span,
                        "here",
                    )
                    .help(
                        spec.settings
                            .iter()
                            .map(|s| format!("`{}`: {}", s.name, s.about))
                            .collect::<Vec<_>>()
                            .join("; "),
                    ),
                );
                return None;
            }
        }
        let paths = |decls: &[PathDecl]| -> serde_json::Value {
            decls
                .iter()
                .map(|d| (d.name.clone(), serde_json::Value::from(d.path.to_string())))
                .collect::<serde_json::Map<_, _>>()
                .into()
        };
        let invocation = serde_json::json!({
            "with": with,
            "inputs": paths(&stage.inputs),
            "outputs": paths(&stage.outputs),
        });
        let encoded = crate::canonical_json::to_string(&invocation);
        let command = Command::Exec(vec![
            "cairn".to_owned(),
            "builtin".to_owned(),
            format!("{}@{}", spec.name, spec.version),
            encoded,
        ]);
        Some((
            Uses {
                name: spec.name.to_owned(),
                version: spec.version,
                with,
            },
            command,
        ))
    }

    /// Checks that the stage declares exactly the built-in's ports.
    fn ports(
        &mut self,
        spec: &BuiltinSpec,
        uses: &Entry,
        declared: &[PathDecl],
        wanted: &[Port],
        kind: &str,
    ) -> bool {
        let mut ok = true;
        for port in wanted {
            if port.required && !declared.iter().any(|d| d.name == port.name) {
                ok = false;
                self.problems.push(
                    Problem::new(
                        format!(
                            "built-in `{}` needs an {kind} named `{}`",
                            spec.name, port.name
                        ),
                        uses.value.span.clone(),
                        "this built-in",
                    )
                    .help(format!(
                        "declare it: `{kind}s = {{ {} = \"path\" }}` ({})",
                        port.name, port.about
                    )),
                );
            }
        }
        let open = kind == "input" && spec.open_inputs;
        for decl in declared {
            if !open && !wanted.iter().any(|p| p.name == decl.name) {
                ok = false;
                let names: Vec<&str> = wanted.iter().map(|p| p.name).collect();
                self.problems.push(
                    Problem::new(
                        format!(
                            "built-in `{}` has no {kind} named `{}`",
                            spec.name, decl.name
                        ),
                        decl.span.clone(),
                        "not one of its ports",
                    )
                    .help(self.did_you_mean(
                        &decl.name,
                        names.iter().copied(),
                        &format!("its {kind}s are named: {}", names.join(", ")),
                    )),
                );
            }
        }
        ok
    }

    /// One `with` value, checked against its kind. Strings are
    /// interpolated; a string that is exactly one `{params.NAME}` takes the
    /// param's typed value, so `target = "{params.size}"` is a number.
    fn setting(
        &mut self,
        kind: SettingKind,
        entry: &Entry,
        stage: &Stage,
        params: &BTreeMap<String, serde_json::Value>,
        referenced: &mut Vec<String>,
    ) -> Option<serde_json::Value> {
        let node = &entry.value;
        let what = format!("`with.{}`", entry.key);
        let value = self.typed(node, stage, params, referenced)?;
        let fits = match kind {
            SettingKind::String | SettingKind::Name => value.is_string(),
            SettingKind::Count => value.as_u64().is_some(),
            SettingKind::Level => value.as_u64().is_some_and(|n| (1..=19).contains(&n)),
            SettingKind::Bool => value.is_boolean(),
            SettingKind::Strings => value
                .as_array()
                .is_some_and(|items| items.iter().all(serde_json::Value::is_string)),
            SettingKind::Counts => value
                .as_object()
                .is_some_and(|map| map.values().all(|v| v.as_u64().is_some())),
            SettingKind::Json => true,
        };
        if !fits {
            self.problems.push(
                Problem::new(
                    format!("{what} must be {}, found {value}", kind.describe()),
                    node.span.clone(),
                    "here",
                )
                .help(format!("write {what} as {}", kind.describe())),
            );
            return None;
        }
        if kind == SettingKind::Name
            && let Some(text) = value.as_str()
            && !catalog::is_safe_name(text)
        {
            self.problems.push(
                Problem::new(
                    format!("{what} is `{text}`, which is not a safe name"),
                    node.span.clone(),
                    "here",
                )
                .help("it names files and directories: use letters, digits, `.`, `_` and `-`, not starting with `.`"),
            );
            return None;
        }
        Some(value)
    }

    /// A TOML value as JSON, its strings interpolated (see [`Self::setting`]).
    fn typed(
        &mut self,
        node: &Node,
        stage: &Stage,
        params: &BTreeMap<String, serde_json::Value>,
        referenced: &mut Vec<String>,
    ) -> Option<serde_json::Value> {
        match &node.kind {
            NodeKind::String(text) => {
                let whole = text
                    .strip_prefix("{params.")
                    .and_then(|t| t.strip_suffix('}'))
                    .filter(|name| !name.contains(['{', '}']));
                if let Some(value) = whole.and_then(|name| params.get(name)) {
                    referenced.push(whole.expect("matched").to_owned());
                    return Some(value.clone());
                }
                self.interpolate(text, node, stage, params, referenced)
                    .map(serde_json::Value::from)
            }
            NodeKind::Array(items) => {
                let mut values = Vec::with_capacity(items.len());
                for item in items {
                    values.push(self.typed(item, stage, params, referenced)?);
                }
                Some(serde_json::Value::Array(values))
            }
            NodeKind::Table(entries) => {
                let mut map = serde_json::Map::new();
                for e in entries {
                    let value = self.typed(&e.value, stage, params, referenced)?;
                    map.insert(e.key.clone(), value);
                }
                Some(serde_json::Value::Object(map))
            }
            _ => Some(super::param_value(node)),
        }
    }
}

fn with_node_span(with: Option<&Node>, uses: &Entry) -> crate::manifest::Span {
    with.map_or(uses.key_span.clone(), |node| node.span.clone())
}
