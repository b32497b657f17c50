//! Commands (`run`, string `checks`) and the placeholders in them.
//!
//! A string command is a shell script: each value is quoted for where its
//! placeholder stands ([`shell`]), and a placeholder where no quoting is
//! safe is a located error. An argv command and a built-in's settings reach
//! no shell, so their values are pasted as they are. In a per-item stage
//! the result is still a template: `{item.X}` stays for each item to fill
//! (quoted then, by the same rules), and literal braces stay escaped.

use std::collections::BTreeMap;

use super::super::interpolate::{Placeholder, unclosed, walk};
use super::super::model::{Command, Stage};
use super::super::raw::{Node, NodeKind, Span};
use super::super::shell::{self, Context};
use super::{Checker, scalar};
use crate::manifest::error::Problem;

/// A problem with one placeholder: message, where, help.
type Located = (String, Span, Option<String>);

/// What a placeholder stands for.
enum Resolved {
    One(String),
    /// A param that is a TOML array: one word per element.
    List(Vec<String>),
    /// `{item.X}`, filled per item later.
    Item,
}

impl Checker<'_> {
    pub(super) fn command(
        &mut self,
        node: &Node,
        stage: &Stage,
        params: &BTreeMap<String, serde_json::Value>,
        referenced: &mut Vec<String>,
        what: &str,
    ) -> Option<Command> {
        match &node.kind {
            NodeKind::String(script) => {
                if script.trim().is_empty() {
                    self.problems.push(
                        Problem::new(
                            format!("stage `{}` has an empty {what} command", stage.name),
                            node.span.clone(),
                            "empty",
                        )
                        .help("write the shell command to run"),
                    );
                    return None;
                }
                self.interpolate_shell(script, node, stage, params, referenced)
                    .map(Command::Shell)
            }
            NodeKind::Array(items) if !items.is_empty() => {
                let mut argv = Vec::new();
                for item in items {
                    let arg = self.string(item, &format!("an argument of `{what}`"))?;
                    argv.push(self.interpolate(&arg, item, stage, params, referenced)?);
                }
                Some(Command::Exec(argv))
            }
            NodeKind::Array(_) => {
                self.problems.push(
                    Problem::new(
                        format!("stage `{}` has an empty {what} command", stage.name),
                        node.span.clone(),
                        "empty array",
                    )
                    .help("give the program and its arguments, e.g. [\"python3\", \"tool.py\"]"),
                );
                None
            }
            _ => {
                self.type_error(
                    node,
                    &format!("`{what}`"),
                    "a string (run by /bin/sh) or an array of strings (executed directly)",
                );
                None
            }
        }
    }

    /// Text that reaches no shell (an argument of an argv command, a
    /// built-in's setting): values are pasted as they are.
    pub(super) fn interpolate(
        &mut self,
        text: &str,
        node: &Node,
        stage: &Stage,
        params: &BTreeMap<String, serde_json::Value>,
        referenced: &mut Vec<String>,
    ) -> Option<String> {
        if !self.all_closed(text, node) {
            return None;
        }
        let keep_escapes = stage.foreach.is_some();
        let result = walk(text, keep_escapes, |p| {
            match self.resolve(text, p, node, stage, params, referenced)? {
                Resolved::One(value) => Ok(Some(value)),
                Resolved::Item => Ok(None),
                Resolved::List(_) => Err((
                    format!(
                        "param `{}` is a list and cannot be part of one argument",
                        p.name
                    ),
                    self.sub_span(node, &text[p.range.clone()]),
                    Some(
                        "in a string `run`, a list param becomes one shell word per element"
                            .to_owned(),
                    ),
                )),
            }
        });
        self.report(result)
    }

    /// A shell script: each value is quoted for where it stands.
    fn interpolate_shell(
        &mut self,
        script: &str,
        node: &Node,
        stage: &Stage,
        params: &BTreeMap<String, serde_json::Value>,
        referenced: &mut Vec<String>,
    ) -> Option<String> {
        if !self.all_closed(script, node) {
            return None;
        }
        let keep_escapes = stage.foreach.is_some();
        let result = shell::expand(script, keep_escapes, |p, context| {
            let whole = &script[p.range.clone()];
            let resolved = self.resolve(script, p, node, stage, params, referenced)?;
            let locate = |checker: &Self| checker.sub_span(node, whole);
            let context = context.map_err(|why| {
                let (place, help) = why.split_once("; ").unwrap_or((why.as_str(), ""));
                let help = if help.is_empty() {
                    "move the placeholder outside quotes, or into `'…'` or `\"…\"`".to_owned()
                } else {
                    help.to_owned()
                };
                (
                    format!("`{whole}` stands {place}, where no quoting keeps its value data"),
                    locate(self),
                    Some(help),
                )
            })?;
            if context == Context::Comment {
                return Ok(Some(whole.to_owned()));
            }
            let quoted = match &resolved {
                Resolved::Item => return Ok(None),
                Resolved::One(value) => shell::quote(context, shell::Value::One(value)),
                Resolved::List(values) => shell::quote(context, shell::Value::List(values)),
            };
            quoted.map(Some).map_err(|why| {
                (
                    format!("`{whole}` cannot stand here: {why}"),
                    locate(self),
                    Some("see \"Placeholders in shell commands\" in docs/manifest.md".to_owned()),
                )
            })
        });
        self.report(result)
    }

    /// Reports every placeholder `text` opens and never closes.
    fn all_closed(&mut self, text: &str, node: &Node) -> bool {
        let open = unclosed(text);
        for range in &open {
            let written = &text[range.clone()];
            self.problems.push(
                Problem::new(
                    format!("unclosed placeholder `{written}`"),
                    self.sub_span(node, written),
                    "no closing `}`",
                )
                .help(format!(
                    "write `{written}}}`, or `{{{{` for a literal brace"
                )),
            );
        }
        open.is_empty()
    }

    fn report(&mut self, result: Result<String, Vec<Located>>) -> Option<String> {
        match result {
            Ok(text) => Some(text),
            Err(errors) => {
                for (message, span, help) in errors {
                    let mut problem = Problem::new(message, span, "here");
                    problem.help = help;
                    self.problems.push(problem);
                }
                None
            }
        }
    }

    /// The value of one placeholder of `text`.
    fn resolve(
        &self,
        text: &str,
        p: &Placeholder<'_>,
        node: &Node,
        stage: &Stage,
        params: &BTreeMap<String, serde_json::Value>,
        referenced: &mut Vec<String>,
    ) -> Result<Resolved, Located> {
        let whole = &text[p.range.clone()];
        let locate = || self.sub_span(node, whole);
        match p.namespace {
            "params" => {
                let Some(value) = params.get(p.name) else {
                    return Err((
                        format!("undefined param `{}` in `{whole}`", p.name),
                        locate(),
                        Some(self.did_you_mean(
                            p.name,
                            params.keys().map(String::as_str),
                            "declare it in `[params]`",
                        )),
                    ));
                };
                let resolved = match value {
                    serde_json::Value::Array(items) => {
                        items.iter().map(scalar).collect::<Option<Vec<_>>>().map(Resolved::List)
                    }
                    other => scalar(other).map(Resolved::One),
                };
                let Some(resolved) = resolved else {
                    return Err((
                        format!("param `{}` is not a string, number, boolean or list of them and cannot be interpolated", p.name),
                        locate(),
                        None,
                    ));
                };
                referenced.push(p.name.to_owned());
                Ok(resolved)
            }
            "in" | "out" => {
                let decls = if p.namespace == "in" { &stage.inputs } else { &stage.outputs };
                if let Some(decl) = decls.iter().find(|d| d.name == p.name) {
                    return Ok(Resolved::One(decl.path.to_string()));
                }
                let namespace = if p.namespace == "in" { "in" } else { "out" };
                if self.refused_paths.contains(&(stage.name.clone(), namespace, p.name.to_owned())) {
                    // Its path was refused, and said so.
                    return Ok(Resolved::One(String::new()));
                }
                let kind = if p.namespace == "in" { "input" } else { "output" };
                let names: Vec<&str> = decls.iter().map(|d| d.name.as_str()).collect();
                let help = if names.is_empty() {
                    format!("stage `{}` declares no {kind}s; add `{kind}s = {{ {} = \"path\" }}`", stage.name, p.name)
                } else {
                    self.did_you_mean(p.name, names.iter().copied(), &format!("declared {kind}s: {}", names.join(", ")))
                };
                Err((format!("undefined {kind} `{}` in `{whole}`", p.name), locate(), Some(help)))
            }
            "item" if stage.foreach.is_some() => Ok(Resolved::Item),
            // A `samples` that could not be read is reported already.
            "sample" if self.unread_samples.contains(&stage.name) => Ok(Resolved::Item),
            "sample" if stage.foreach.as_ref().is_some_and(|f| f.samples.is_some()) => {
                if matches!(p.name, "index" | "seed") {
                    Ok(Resolved::Item)
                } else {
                    Err((
                        format!("unknown sample field `{}` in `{whole}`", p.name),
                        locate(),
                        Some("a sample has `{sample.index}` (0 to k − 1) and `{sample.seed}` (the seed it is drawn with)".to_owned()),
                    ))
                }
            }
            "sample" => Err((
                format!("`{whole}` outside a sampled stage"),
                locate(),
                Some("`{sample.index}` and `{sample.seed}` are filled in per sample; add `samples = { k = 8 }` to a per-item stage".to_owned()),
            )),
            "item" => Err((
                format!("`{whole}` outside a per-item stage"),
                locate(),
                Some("`{item.FIELD}` is filled in per item; add `foreach = { items = \"…\", key = \"…\" }` to the stage".to_owned()),
            )),
            "service" => Err((
                format!("`{whole}` in stage `{}`", stage.name),
                locate(),
                Some("`{service.…}` is filled only in a service's own `run`, `url`, `ready` and `check`; a stage's commands reach a service it names in `services` through the service's `env` variable (e.g. `$OPENAI_BASE_URL`)".to_owned()),
            )),
            other => Err((
                format!("unknown placeholder namespace `{other}` in `{whole}`"),
                locate(),
                Some("placeholders are `{params.NAME}`, `{in.NAME}`, `{out.NAME}` and, in per-item stages, `{item.FIELD}` (and `{sample.index}`, `{sample.seed}` when sampled); write `{{` for a literal brace".to_owned()),
            )),
        }
    }

    /// The span of `needle` inside `node`'s source text, or the whole node.
    pub(super) fn sub_span(&self, node: &Node, needle: &str) -> Span {
        self.source
            .get(node.span.clone())
            .and_then(|raw| raw.find(needle))
            .map(|offset| node.span.start + offset..node.span.start + offset + needle.len())
            .unwrap_or(node.span.clone())
    }
}
