//! What a stage-or-path argument on the command line names.
//!
//! `provenance`, `why` and `show` take a stage name or an output path. A
//! path is read the way a shell user means it: relative to the current
//! directory (absolute paths as they are), like `verify BUNDLE` — not
//! relative to the project root, which may be a parent of where cairn was
//! started (`cairn.toml` is found in parent directories). A file inside an
//! output directory names that output's stage.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Component, Path, PathBuf};

use super::error::CliError;
use super::workspace::Loaded;
use crate::manifest::ProjectPath;
use crate::schedule::load_items;

/// What `--force` names: stages to re-run (a per-item stage with all its
/// items), and of per-item stages, single items (`STAGE/ITEM`).
#[derive(Debug, Default)]
pub struct Forced {
    /// Every stage forced, whole or through some of its items.
    pub stages: HashSet<usize>,
    /// Per-item stages forced through these items only.
    pub items: HashMap<usize, BTreeSet<String>>,
}

/// An argument read as a path.
pub enum PathTarget {
    /// An output of `stage` (or a file inside one), relative to the root.
    Output { stage: usize, path: String },
    /// Inside the root, but no stage writes it.
    NotAnOutput { path: String },
    /// Outside the project root.
    Outside { path: PathBuf },
}

impl Loaded {
    /// Reads `--force` arguments: `STAGE` or `STAGE/ITEM`.
    pub fn forced(&self, args: &[String]) -> Result<Forced, CliError> {
        let mut forced = Forced::default();
        let mut whole = HashSet::new();
        for arg in args {
            if let Some(i) = self.manifest.stages.iter().position(|s| &s.name == arg) {
                forced.stages.insert(i);
                whole.insert(i);
                continue;
            }
            let Some((name, key)) = arg.split_once('/') else {
                return Err(self.unknown_stage(arg));
            };
            let i = self.stage_indices(&[name.to_owned()])?[0];
            let stage = &self.manifest.stages[i];
            let Some(foreach) = &stage.foreach else {
                return Err(CliError::usage(format!(
                    "stage `{name}` is not a per-item stage, so `--force {arg}` names nothing; use `--force {name}`"
                )));
            };
            // An item list an upstream stage has not written yet is
            // checked when the stage plans its items.
            let list = foreach.items.resolve(&self.manifest.root);
            // In a sampled stage, `ITEM#INDEX` names one sample.
            let item = match (&foreach.samples, key.rsplit_once('#')) {
                (Some(samples), Some((item, index))) => match index.parse::<u32>() {
                    Ok(index) if index < samples.k => item,
                    _ => {
                        return Err(CliError::Usage {
                            message: format!(
                                "`--force {arg}`: stage `{name}` draws {} samples, numbered 0 to {}",
                                samples.k,
                                samples.k - 1
                            ),
                            help: Some(format!(
                                "force one sample as `{name}/ITEM#INDEX`, or every sample of an item as `{name}/ITEM`"
                            )),
                        });
                    }
                },
                _ => key,
            };
            if list.exists()
                && let Ok(items) = load_items(&list, &foreach.key)
                && !items.iter().any(|i| i.key == item)
            {
                return Err(CliError::Usage {
                    message: format!(
                        "stage `{name}` has no item `{item}` in `{}`",
                        foreach.items.as_str()
                    ),
                    help: Some(format!("`cairn show {name} --items` lists its items")),
                });
            }
            forced.stages.insert(i);
            forced.items.entry(i).or_default().insert(key.to_owned());
        }
        // `--force STAGE` beside `--force STAGE/ITEM` forces every item.
        forced.items.retain(|i, _| !whole.contains(i));
        Ok(forced)
    }

    /// `arg` as a path from the current directory, placed in the project.
    pub fn path_target(&self, arg: &str) -> Result<PathTarget, CliError> {
        let cwd = std::env::current_dir().map_err(CliError::Output)?;
        let absolute = lexical_normal(&cwd.join(arg));
        let root = &self.manifest.root;
        let canonical_root = root.canonicalize().unwrap_or_else(|_| root.clone());
        let inside = absolute
            .strip_prefix(&canonical_root)
            .or_else(|_| absolute.strip_prefix(root));
        let Ok(inside) = inside else {
            return Ok(PathTarget::Outside { path: absolute });
        };
        let path = inside
            .components()
            .map(|c| c.as_os_str().to_string_lossy())
            .collect::<Vec<_>>()
            .join("/");
        let index = crate::manifest::OutputIndex::new(&self.manifest.stages);
        Ok(match index.producer_of(&ProjectPath::new(path.clone())) {
            Some((stage, _)) => PathTarget::Output { stage, path },
            None => PathTarget::NotAnOutput { path },
        })
    }

    /// The stage named `arg`, else the stage whose output the path `arg`
    /// is (or lies inside).
    pub fn stage_or_output(&self, arg: &str) -> Result<usize, CliError> {
        if let Some(i) = self.manifest.stages.iter().position(|s| s.name == arg) {
            return Ok(i);
        }
        match self.path_target(arg)? {
            PathTarget::Output { stage, .. } => Ok(stage),
            _ if !looks_like_a_path(arg) => Err(self.unknown_stage(arg)),
            other => Err(self.not_an_output(arg, &other)),
        }
    }

    /// The error for an argument that names no stage and no output.
    pub fn not_an_output(&self, arg: &str, target: &PathTarget) -> CliError {
        let message = match target {
            PathTarget::Outside { path } => format!(
                "`{arg}` (`{}`) is outside the project root `{}`",
                path.display(),
                self.manifest.root.display()
            ),
            PathTarget::NotAnOutput { path } => {
                format!("`{arg}` (`{path}` in the project) is neither a stage nor an output of one")
            }
            PathTarget::Output { .. } => format!("`{arg}` is an output"),
        };
        CliError::Usage {
            message,
            help: Some(
                "paths are relative to the current directory; `cairn dag` lists stages and their outputs"
                    .to_owned(),
            ),
        }
    }
}

fn looks_like_a_path(arg: &str) -> bool {
    arg.contains('/') || arg.contains('.') || Path::new(arg).exists()
}

/// `path` with `.` and `..` resolved without touching the file system.
fn lexical_normal(path: &Path) -> PathBuf {
    let mut normal = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                normal.pop();
            }
            other => normal.push(other.as_os_str()),
        }
    }
    normal
}
