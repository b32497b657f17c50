//! The layers depend only on the layers to their left:
//! manifest → graph → fingerprint → store → release → builtins → exec →
//! schedule → cli; and no import runs in a circle between the modules
//! within them.

const LAYERS: &[&str] = &[
    "manifest",
    "graph",
    "fingerprint",
    "store",
    "release",
    "builtins",
    "exec",
    "schedule",
    "cli",
];

#[test]
fn no_layer_uses_a_layer_to_its_right() {
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/src");
    let mut violations = Vec::new();
    for (i, layer) in LAYERS.iter().enumerate() {
        let dir = std::path::Path::new(src).join(layer);
        let mut files = vec![];
        collect(&dir, &mut files);
        assert!(!files.is_empty(), "no sources under {}", dir.display());
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for later in &LAYERS[i + 1..] {
                for needle in [
                    format!("crate::{later}::"),
                    format!("crate::{later};"),
                    format!("crate::{later}::{{"),
                ] {
                    if text.contains(&needle) {
                        violations.push(format!("{} uses `{needle}`", file.display()));
                    }
                }
            }
        }
    }
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

/// How deep modules are told apart: `schedule::proof::check` is one,
/// its own submodules are part of it.
const MODULE_DEPTH: usize = 3;

#[test]
fn no_import_runs_in_a_circle_between_modules() {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::Path;

    let src = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src"));
    let mut files = vec![];
    collect(src, &mut files);
    let reference = regex::Regex::new(
        r"\b(crate|super)((?:::super)*)::(\{[^}]*\}|[a-z_][a-z0-9_]*(?:::[a-z_][a-z0-9_]*)*)",
    )
    .unwrap();
    let mut uses: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let here = module_of(src, file);
        let from = module_at(src, &here);
        let text = std::fs::read_to_string(file).unwrap();
        for line in text.lines() {
            let code = line.split("//").next().unwrap_or("");
            for found in reference.captures_iter(code) {
                let base: Vec<String> = match &found[1] {
                    "crate" => vec![],
                    // `super` names the parent of the file's module.
                    _ => {
                        let up = 1 + found[2].matches("super").count();
                        here[..here.len().saturating_sub(up)].to_vec()
                    }
                };
                for item in found[3].trim_matches(|c| c == '{' || c == '}').split(',') {
                    let mut path = base.clone();
                    path.extend(
                        item.trim()
                            .split("::")
                            .take_while(|s| {
                                s.chars().all(|c| {
                                    c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'
                                }) && !s.is_empty()
                            })
                            .map(str::to_owned),
                    );
                    let to = module_at(src, &path);
                    // A module and the modules inside it are one room.
                    let nested = |a: &str, b: &str| a == b || a.starts_with(&format!("{b}::"));
                    if !nested(&to, &from) && !nested(&from, &to) {
                        uses.entry(from.clone()).or_default().insert(to);
                    }
                }
            }
        }
    }
    let circles = circles(&uses);
    assert!(
        circles.is_empty(),
        "modules whose imports run in a circle (each line: one circle's modules):\n{}",
        circles
            .iter()
            .map(|circle| circle.join(", "))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// The module path of a source file (`src/schedule/proof/mod.rs`:
/// `schedule`, `proof`).
fn module_of(src: &std::path::Path, file: &std::path::Path) -> Vec<String> {
    let relative = file.strip_prefix(src).unwrap().with_extension("");
    let mut path: Vec<String> = relative
        .iter()
        .map(|part| part.to_string_lossy().into_owned())
        .collect();
    if matches!(
        path.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        path.pop();
    }
    path
}

/// The module a path names, told apart to [`MODULE_DEPTH`]: the longest
/// prefix of it that is a module (the rest names items in it).
fn module_at(src: &std::path::Path, path: &[String]) -> String {
    let mut module = src.to_path_buf();
    let mut parts = vec![];
    for part in path.iter().take(MODULE_DEPTH) {
        module.push(part);
        if !(module.is_dir() || module.with_extension("rs").is_file()) {
            break;
        }
        parts.push(part.as_str());
    }
    if parts.is_empty() {
        "crate".to_owned()
    } else {
        parts.join("::")
    }
}

/// Each circle among `uses`: the modules of every strongly connected
/// component of more than one (petgraph's Tarjan).
fn circles(
    uses: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
) -> Vec<Vec<String>> {
    let mut graph = petgraph::graph::DiGraph::<&str, ()>::new();
    let mut node = std::collections::BTreeMap::new();
    for (from, tos) in uses {
        for name in std::iter::once(from).chain(tos) {
            node.entry(name.as_str())
                .or_insert_with(|| graph.add_node(name.as_str()));
        }
    }
    for (from, tos) in uses {
        for to in tos {
            graph.add_edge(node[from.as_str()], node[to.as_str()], ());
        }
    }
    petgraph::algo::tarjan_scc(&graph)
        .into_iter()
        .filter(|component| component.len() > 1)
        .map(|component| {
            let mut names: Vec<String> = component.iter().map(|&n| graph[n].to_owned()).collect();
            names.sort();
            names
        })
        .collect()
}

fn collect(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}
