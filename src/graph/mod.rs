//! The stage DAG.
//!
//! Edges come from `needs` and from paths: a stage that reads a path another
//! stage writes (the output itself, a file inside an output directory, or a
//! directory that contains an output) runs after it. The graph is built
//! once and sealed: a [`Dag`] is known to be acyclic and carries a
//! deterministic topological order. petgraph stays inside this module;
//! stages are named by their index in [`Manifest::stages`].

use std::collections::{HashMap, HashSet};

use petgraph::algo::tarjan_scc;
use petgraph::graph::{DiGraph, NodeIndex};

use crate::manifest::{Manifest, ManifestErrors, OutputIndex, Problem};

/// Why one stage runs after another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EdgeKind {
    Needs,
    /// The downstream stage reads this path of the upstream's outputs.
    Path(String),
}

/// An acyclic stage graph.
#[derive(Debug)]
pub struct Dag {
    upstream: Vec<Vec<usize>>,
    downstream: Vec<Vec<usize>>,
    edges: Vec<(usize, usize, EdgeKind)>,
    order: Vec<usize>,
    /// `(stage, input)` for each input that is a stage's output or lies in
    /// one: the inputs a run may write before it reads them.
    made_inputs: FastSet<(usize, usize)>,
}

/// The graph's sets and maps are keyed by indices and paths of the
/// manifest: hashed with foldhash (a thousand-stage graph is built at the
/// start of every command, in about a millisecond).
type FastSet<T> = HashSet<T, foldhash::fast::RandomState>;
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

impl Dag {
    /// Builds the graph; a cycle is reported as a located manifest error.
    pub fn build(manifest: &Manifest) -> Result<Self, ManifestErrors> {
        let n = manifest.stages.len();
        let by_name: FastMap<&str, usize> = manifest
            .stages
            .iter()
            .enumerate()
            .map(|(i, s)| (s.name.as_str(), i))
            .collect();
        let outputs = OutputIndex::new(&manifest.stages);

        // Sized for an edge per input and need, the most there can be
        // (but for directories holding outputs).
        let reads: usize = manifest
            .stages
            .iter()
            .map(|s| s.inputs.len() + s.needs.len() + usize::from(s.foreach.is_some()))
            .sum();
        let mut edges: Vec<(usize, usize, EdgeKind)> = Vec::with_capacity(reads);
        let mut seen: FastSet<(usize, usize)> =
            FastSet::with_capacity_and_hasher(reads, Default::default());
        let mut add = |from: usize, to: usize, kind: EdgeKind, edges: &mut Vec<_>| {
            if seen.insert((from, to)) {
                edges.push((from, to, kind));
            }
        };
        let mut readers: FastMap<&str, Vec<usize>> =
            FastMap::with_capacity_and_hasher(reads, Default::default());
        let mut made_inputs = FastSet::with_capacity_and_hasher(reads, Default::default());
        for (i, stage) in manifest.stages.iter().enumerate() {
            for need in &stage.needs {
                if let Some(&j) = by_name.get(need.name.as_str()) {
                    add(j, i, EdgeKind::Needs, &mut edges);
                }
            }
            let items = stage.foreach.as_ref().map(|f| &f.items);
            let paths = stage.inputs.iter().map(|input| &input.path).chain(items);
            for (n, path) in paths.enumerate() {
                readers.entry(path.as_str()).or_default().push(i);
                if let Some((j, _)) = outputs.producer_of(path) {
                    add(j, i, EdgeKind::Path(path.to_string()), &mut edges);
                    made_inputs.insert((i, n));
                }
            }
        }
        // A stage that reads a directory holding another stage's output.
        for (j, stage) in manifest.stages.iter().enumerate() {
            for output in &stage.outputs {
                for ancestor in output.path.self_and_ancestors().skip(1) {
                    for &i in readers.get(ancestor).into_iter().flatten() {
                        add(j, i, EdgeKind::Path(ancestor.to_owned()), &mut edges);
                    }
                }
            }
        }

        let mut upstream = vec![Vec::new(); n];
        let mut downstream = vec![Vec::new(); n];
        for (from, to, _) in &edges {
            upstream[*to].push(*from);
            downstream[*from].push(*to);
        }
        for list in upstream.iter_mut().chain(downstream.iter_mut()) {
            list.sort_unstable();
        }
        let order = stable_topological_order(&upstream, &downstream);
        // Stages on a cycle never become ready: the order leaves them out.
        if order.len() < n {
            let mut graph: DiGraph<usize, ()> = DiGraph::with_capacity(n, edges.len());
            let nodes: Vec<NodeIndex> = (0..n).map(|i| graph.add_node(i)).collect();
            for (from, to, _) in &edges {
                graph.add_edge(nodes[*from], nodes[*to], ());
            }
            return Err(cycle_error(manifest, &graph, &edges));
        }
        Ok(Self {
            upstream,
            downstream,
            edges,
            order,
            made_inputs,
        })
    }

    /// Whether input `input` of stage `stage` is (or lies in) an output of
    /// a stage: one no stage writes is the same all run long, but for
    /// what the run's commands write undeclared.
    pub fn input_is_made(&self, stage: usize, input: usize) -> bool {
        self.made_inputs.contains(&(stage, input))
    }

    /// Every stage, dependencies first; ties broken by manifest order.
    pub fn order(&self) -> &[usize] {
        &self.order
    }

    pub fn upstream(&self, stage: usize) -> &[usize] {
        &self.upstream[stage]
    }

    pub fn downstream(&self, stage: usize) -> &[usize] {
        &self.downstream[stage]
    }

    /// `(from, to, why)` for every edge.
    pub fn edges(&self) -> &[(usize, usize, EdgeKind)] {
        &self.edges
    }

    /// The targets and everything they transitively depend on.
    pub fn upstream_closure(&self, targets: &[usize]) -> Vec<bool> {
        let mut selected = vec![false; self.upstream.len()];
        let mut stack: Vec<usize> = targets.to_vec();
        while let Some(stage) = stack.pop() {
            if !std::mem::replace(&mut selected[stage], true) {
                stack.extend(&self.upstream[stage]);
            }
        }
        selected
    }
}

/// Kahn's algorithm with the lowest manifest index first, so the order is
/// the same on every run.
fn stable_topological_order(upstream: &[Vec<usize>], downstream: &[Vec<usize>]) -> Vec<usize> {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let mut remaining: Vec<usize> = upstream.iter().map(Vec::len).collect();
    let mut ready: BinaryHeap<Reverse<usize>> = (0..upstream.len())
        .filter(|&i| remaining[i] == 0)
        .map(Reverse)
        .collect();
    let mut order = Vec::with_capacity(upstream.len());
    while let Some(Reverse(stage)) = ready.pop() {
        order.push(stage);
        for &next in &downstream[stage] {
            remaining[next] -= 1;
            if remaining[next] == 0 {
                ready.push(Reverse(next));
            }
        }
    }
    order
}

fn cycle_error(
    manifest: &Manifest,
    graph: &DiGraph<usize, ()>,
    edges: &[(usize, usize, EdgeKind)],
) -> ManifestErrors {
    let mut problems = Vec::new();
    for component in tarjan_scc(graph) {
        let members: HashSet<usize> = component.iter().map(|n| graph[*n]).collect();
        let self_loop = component.len() == 1 && {
            let i = graph[component[0]];
            edges.iter().any(|(f, t, _)| *f == i && *t == i)
        };
        if component.len() < 2 && !self_loop {
            continue;
        }
        let cycle = find_cycle(&members, edges);
        let names: Vec<&str> = cycle
            .iter()
            .map(|&i| manifest.stages[i].name.as_str())
            .collect();
        let first = cycle[0];
        let reasons: Vec<String> = cycle
            .windows(2)
            .filter_map(|pair| {
                edges
                    .iter()
                    .find(|(f, t, _)| *f == pair[0] && *t == pair[1])
                    .map(|(f, t, kind)| {
                        let (from, to) = (&manifest.stages[*f].name, &manifest.stages[*t].name);
                        match kind {
                            EdgeKind::Needs => format!("`{to}` needs `{from}`"),
                            EdgeKind::Path(path) => {
                                format!("`{to}` reads `{path}` written by `{from}`")
                            }
                        }
                    })
            })
            .collect();
        problems.push(
            Problem::new(
                format!("dependency cycle: {}", names.join(" → ")),
                manifest.stages[first].span.clone(),
                "this stage depends on itself",
            )
            .help(format!("break the cycle: {}", reasons.join("; "))),
        );
    }
    ManifestErrors {
        path: manifest.path.clone(),
        source_text: manifest.source.clone(),
        problems,
    }
}

/// A closed walk through `members`, starting and ending at its lowest stage.
fn find_cycle(members: &HashSet<usize>, edges: &[(usize, usize, EdgeKind)]) -> Vec<usize> {
    let start = *members.iter().min().expect("a cycle has members");
    let mut path = vec![start];
    let mut visited = HashSet::from([start]);
    fn walk(
        at: usize,
        start: usize,
        members: &HashSet<usize>,
        edges: &[(usize, usize, EdgeKind)],
        path: &mut Vec<usize>,
        visited: &mut HashSet<usize>,
    ) -> bool {
        let mut next: Vec<usize> = edges
            .iter()
            .filter(|(f, t, _)| *f == at && members.contains(t))
            .map(|(_, t, _)| *t)
            .collect();
        next.sort_unstable();
        for t in next {
            if t == start {
                path.push(start);
                return true;
            }
            if visited.insert(t) {
                path.push(t);
                if walk(t, start, members, edges, path, visited) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    walk(start, start, members, edges, &mut path, &mut visited);
    path
}
