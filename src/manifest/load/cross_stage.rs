//! What no one stage can check alone: two stages writing one output, a
//! stage reading what a later one writes, `needs` naming unknown stages.

use super::*;
use crate::file_stat::{OpenDir, stat_in_dir};

impl Checker<'_> {
    /// Checks that span several stages: duplicate or nested outputs,
    /// `needs` naming unknown stages, inputs nothing provides.
    pub(super) fn cross_stage(&mut self, stages: &[Stage], root: &Path) {
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
        // (`stat`ed by name in their directory: a thousand inputs are
        // typically a few directories' files, one after another.)
        let mut dir = OpenDir::default();
        for stage in stages {
            // (A fetched input is fetched when its stage runs.)
            for input in stage.inputs.iter().filter(|input| input.pinned.is_none()) {
                if !input_missing(&input.path, stages, &index, root, &mut dir) {
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
}

/// Whether `input` neither exists nor is written by a stage (as an output,
/// inside one, or as a directory an output lies in).
pub(super) fn input_missing(
    input: &ProjectPath,
    stages: &[Stage],
    index: &OutputIndex,
    root: &Path,
    dir: &mut OpenDir,
) -> bool {
    if index.producer_of(input).is_some() || stat_in_dir(&input.resolve(root), dir).is_ok() {
        return false;
    }
    let produced_inside = stages.iter().any(|s| {
        s.outputs.iter().any(|o| {
            o.path
                .self_and_ancestors()
                .skip(1)
                .any(|a| a == input.as_str())
        })
    });
    !produced_inside
}
