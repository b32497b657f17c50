//! `cairn dag`: the stage graph as text, DOT or Mermaid, laid out top-down,
//! its stages coloured by state on request.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use super::args::{DagArgs, DagFormat, Global};
use super::error::CliError;
use super::report::palette;
use super::workspace::{self, Loaded};
use crate::graph::EdgeKind;
use crate::schedule;

/// A stage's state and why, by stage name.
type States = HashMap<String, (String, Option<String>)>;

pub fn dag(global: &Global, args: &DagArgs) -> Result<(), CliError> {
    let loaded = workspace::load(global)?;
    let states = states(&loaded, args)?;
    let stages = &loaded.manifest.stages;
    let name = |i: usize| stages[i].name.as_str();
    let state = |i: usize| states.as_ref().and_then(|s| s.get(name(i)));
    let mut out = String::new();
    match args.format {
        DagFormat::Text => {
            for &i in loaded.dag.order() {
                let ups: Vec<&str> = loaded.dag.upstream(i).iter().map(|&u| name(u)).collect();
                let _ = write!(out, "{}", name(i));
                if let Some((state, _)) = state(i) {
                    let _ = write!(out, " [{state}]");
                }
                if !ups.is_empty() {
                    let _ = write!(out, " ← {}", ups.join(", "));
                }
                out.push('\n');
            }
        }
        DagFormat::Dot => {
            let _ = writeln!(
                out,
                "digraph {:?} {{\n  rankdir=TB;\n  node [shape=box, style=\"rounded,filled\", fillcolor=\"#ffffff\"];",
                loaded.manifest.name
            );
            for &i in loaded.dag.order() {
                match state(i) {
                    Some((state, reason)) => {
                        let tooltip = match reason {
                            Some(reason) => format!("{state}: {reason}"),
                            None => state.clone(),
                        };
                        let _ = writeln!(
                            out,
                            "  {:?} [fillcolor={:?}, tooltip={tooltip:?}];",
                            name(i),
                            palette::fill(state)
                        );
                    }
                    None => {
                        let _ = writeln!(out, "  {:?};", name(i));
                    }
                }
            }
            for (from, to, kind) in loaded.dag.edges() {
                let label = match kind {
                    EdgeKind::Needs => "needs".to_owned(),
                    EdgeKind::Path(p) => p.clone(),
                };
                let _ = writeln!(
                    out,
                    "  {:?} -> {:?} [label={label:?}];",
                    name(*from),
                    name(*to)
                );
            }
            out.push_str("}\n");
        }
        DagFormat::Mermaid => {
            out.push_str("flowchart TD\n");
            let id = |i: usize| format!("s{i}");
            let quote = |text: &str| text.replace('"', "#quot;");
            let mut used = HashSet::new();
            for &i in loaded.dag.order() {
                match state(i) {
                    Some((state, _)) => {
                        let class = state.replace(' ', "_");
                        let _ = writeln!(
                            out,
                            "  {}[\"{}<br/><small>{}</small>\"]:::{class}",
                            id(i),
                            quote(name(i)),
                            quote(state)
                        );
                        used.insert((class, palette::fill(state)));
                    }
                    None => {
                        let _ = writeln!(out, "  {}[\"{}\"]", id(i), quote(name(i)));
                    }
                }
            }
            for (from, to, kind) in loaded.dag.edges() {
                match kind {
                    EdgeKind::Needs => {
                        let _ = writeln!(out, "  {} --> {}", id(*from), id(*to));
                    }
                    EdgeKind::Path(p) => {
                        let _ = writeln!(out, "  {} -->|\"{}\"| {}", id(*from), quote(p), id(*to));
                    }
                }
            }
            let mut used: Vec<_> = used.into_iter().collect();
            used.sort();
            for (class, fill) in used {
                let _ = writeln!(out, "  classDef {class} fill:{fill},stroke:#555");
            }
        }
    }
    out!("{out}");
    Ok(())
}

/// The states to colour by: now (`--state`), or as run N left them.
fn states(loaded: &Loaded, args: &DagArgs) -> Result<Option<States>, CliError> {
    if args.state {
        let mut ctx = loaded.read_context()?;
        let all = vec![true; loaded.manifest.stages.len()];
        let statuses = schedule::evaluate(&mut ctx, &all, &HashSet::new())?;
        return Ok(Some(
            statuses
                .into_iter()
                .map(|s| {
                    let reason = s.reason.as_ref().map(|r| r.summary());
                    (s.stage, (s.state.as_str().to_owned(), reason))
                })
                .collect(),
        ));
    }
    let Some(run) = args.run else {
        return Ok(None);
    };
    let ctx = loaded.read_context()?;
    let stages = match &ctx.ledger {
        Some(ledger) if ledger.run(run)?.is_some() => ledger.stage_runs(run)?,
        Some(ledger) => return Err(super::log::no_such_run(ledger, run)?),
        None => {
            return Err(CliError::usage(
                "no run is recorded yet; `cairn run` records one",
            ));
        }
    };
    Ok(Some(
        stages
            .into_iter()
            .map(|s| {
                let why = s.message.or(s.reason);
                (s.stage, (s.state, why))
            })
            .collect(),
    ))
}
