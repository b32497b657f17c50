//! `cairn dag`.

use std::fmt::Write as _;

use super::args::{DagArgs, DagFormat, Global};
use super::error::CliError;
use super::workspace;
use crate::graph::EdgeKind;

pub fn dag(global: &Global, args: &DagArgs) -> Result<(), CliError> {
    let loaded = workspace::load(global)?;
    let stages = &loaded.manifest.stages;
    let name = |i: usize| stages[i].name.as_str();
    let mut out = String::new();
    match args.format {
        DagFormat::Text => {
            for &i in loaded.dag.order() {
                let ups: Vec<&str> = loaded.dag.upstream(i).iter().map(|&u| name(u)).collect();
                if ups.is_empty() {
                    let _ = writeln!(out, "{}", name(i));
                } else {
                    let _ = writeln!(out, "{} ← {}", name(i), ups.join(", "));
                }
            }
        }
        DagFormat::Dot => {
            let _ = writeln!(
                out,
                "digraph {:?} {{\n  rankdir=LR;\n  node [shape=box];",
                loaded.manifest.name
            );
            for &i in loaded.dag.order() {
                let _ = writeln!(out, "  {:?};", name(i));
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
            out.push_str("flowchart LR\n");
            let id = |i: usize| format!("s{i}");
            for &i in loaded.dag.order() {
                let _ = writeln!(out, "  {}[\"{}\"]", id(i), name(i).replace('"', "#quot;"));
            }
            for (from, to, kind) in loaded.dag.edges() {
                match kind {
                    EdgeKind::Needs => {
                        let _ = writeln!(out, "  {} --> {}", id(*from), id(*to));
                    }
                    EdgeKind::Path(p) => {
                        let _ = writeln!(
                            out,
                            "  {} -->|\"{}\"| {}",
                            id(*from),
                            p.replace('"', "#quot;"),
                            id(*to)
                        );
                    }
                }
            }
        }
    }
    out!("{out}");
    Ok(())
}
