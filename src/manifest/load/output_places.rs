//! Where outputs may be: never the manifest or its lock file (`cache/` is
//! refused when paths are normalised), and never through a symbolic link.
//!
//! cairn removes an output before its stage runs, rewrites it, hashes it as
//! a project file and restores it from the store. Through a link that
//! leaves the root it would do all that to files outside the project; a
//! link as the output itself would be replaced by a file (or written
//! through, by the command). So an output that is a symbolic link, or lies
//! under a linked directory that resolves outside the root, is refused. A
//! linked directory that stays inside the root is the same project and is
//! allowed.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use super::super::model::{ProjectPath, Stage, lock_path_of};
use super::Checker;
use crate::file_stat::{OpenDir, Stated, lstat_in_dir};
use crate::manifest::error::Problem;

impl Checker<'_> {
    pub(super) fn check_output_places(&mut self, stages: &[Stage], root: &Path, manifest: &Path) {
        let mut places = OutputPlaces::new(root, manifest);
        for stage in stages {
            for output in &stage.outputs {
                if let Some((message, help)) = places.refused(&output.path) {
                    self.problems
                        .push(Problem::new(message, output.span.clone(), "this output").help(help));
                }
            }
        }
    }
}

/// Where the outputs of one manifest may not be, looked at output by
/// output.
pub(super) struct OutputPlaces<'r> {
    root: &'r Path,
    manifest: PathBuf,
    lock: PathBuf,
    /// Directories already found to be plain (not links): many outputs
    /// share them, and each is looked at once.
    plain_dirs: HashSet<PathBuf>,
    dir: OpenDir,
    /// Files found moments ago (see [`Stated`]): one found as a file
    /// itself is not a link, and is not looked at again.
    stated: Option<&'r Stated>,
}

impl<'r> OutputPlaces<'r> {
    pub(super) fn new(root: &'r Path, manifest: &Path) -> Self {
        let manifest = manifest
            .canonicalize()
            .unwrap_or_else(|_| manifest.to_owned());
        let lock = lock_path_of(&manifest);
        Self {
            root,
            manifest,
            lock,
            plain_dirs: HashSet::new(),
            dir: OpenDir::default(),
            stated: None,
        }
    }

    /// Takes the files in `stated` as found there.
    pub(super) fn found(self, stated: &'r Stated) -> Self {
        Self {
            stated: Some(stated),
            ..self
        }
    }

    /// Why `output` may not be written where it is (a message and a
    /// help), if it may not.
    pub(super) fn refused(&mut self, output: &ProjectPath) -> Option<(String, String)> {
        if output.is_external() {
            return None;
        }
        let abs = output.resolve(self.root);
        if abs == self.manifest {
            Some((
                format!("output `{output}` is the manifest itself"),
                "a stage may not overwrite the pipeline that runs it; write elsewhere".to_owned(),
            ))
        } else if abs == self.lock {
            Some((
                format!("output `{output}` is the manifest's lock file"),
                "cairn writes the lock file after each run; write elsewhere".to_owned(),
            ))
        } else {
            through_link(
                self.root,
                output.as_str(),
                &mut self.plain_dirs,
                &mut self.dir,
                self.stated,
            )
        }
    }
}

/// Why the output at `rel` (relative to `root`) would be written through a
/// symbolic link, if it would.
/// `plain_dirs`: directories (below `root`) known not to be links;
/// `stated`: files found moments ago (one found as a file itself is not a
/// link; the directories it lies in are looked at all the same).
fn through_link(
    root: &Path,
    rel: &str,
    plain_dirs: &mut HashSet<PathBuf>,
    dir: &mut OpenDir,
    stated: Option<&Stated>,
) -> Option<(String, String)> {
    let mut current = PathBuf::from(root);
    let parts: Vec<&str> = rel.split('/').collect();
    for (n, part) in parts.iter().enumerate() {
        current.push(part);
        let last = n + 1 == parts.len();
        if !last && plain_dirs.contains(&current) {
            continue;
        }
        if last && stated.is_some_and(|stated| stated.found_plain(&current)) {
            continue;
        }
        // (By name in its directory: the outputs of a thousand stages
        // are typically a few directories' files.)
        let Ok(stat) = lstat_in_dir(&current, dir) else {
            return None;
        };
        if !stat.is_symlink() {
            if !last && stat.is_dir() {
                plain_dirs.insert(current.clone());
            }
            continue;
        }
        let target = std::fs::read_link(&current)
            .map(|t| t.display().to_string())
            .unwrap_or_default();
        if n + 1 == parts.len() {
            return Some((
                format!("output `{rel}` is a symbolic link (to `{target}`)"),
                "cairn replaces its outputs on every run; remove the link and declare the path it points to, or let the stage create a real file".to_owned(),
            ));
        }
        let inside = current
            .canonicalize()
            .is_ok_and(|real| real.starts_with(root));
        if !inside {
            return Some((
                format!(
                    "output `{rel}` lies under `{}`, a symbolic link that leaves the project root (to `{target}`)",
                    parts[..=n].join("/")
                ),
                "cairn removes, rewrites and restores outputs; through this link it would change files outside the project. Set `[pipeline] root` to include the data, or declare outputs inside the project".to_owned(),
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::file_stat::{FileStat, Found};

    fn found(path: &Path, link: bool) -> Found {
        let meta = std::fs::metadata(path).unwrap();
        Found {
            stat: FileStat::from(&meta),
            seen_ns: 0,
            link,
        }
    }

    /// A file found moments ago as a file itself is not looked at again,
    /// but the directories it lies in are: one linked out of the root is
    /// refused all the same, and a file found as a link is refused.
    #[test]
    fn a_file_found_plain_is_not_looked_at_again_but_its_directories_are() {
        let outside = tempfile::tempdir().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::write(outside.path().join("1.txt"), "one").unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("out")).unwrap();
        std::fs::create_dir(root.join("plain")).unwrap();
        std::fs::write(root.join("plain/2.txt"), "two").unwrap();
        std::os::unix::fs::symlink(root.join("plain/2.txt"), root.join("plain/3.txt")).unwrap();
        let mut stated = Stated::default();
        stated.insert(
            root.join("out/1.txt"),
            found(&root.join("out/1.txt"), false),
        );
        stated.insert(
            root.join("plain/2.txt"),
            found(&root.join("plain/2.txt"), false),
        );
        stated.insert(
            root.join("plain/3.txt"),
            found(&root.join("plain/3.txt"), true),
        );
        let manifest = root.join("cairn.toml");
        let mut places = OutputPlaces::new(&root, &manifest).found(&stated);
        let path = |text: &str| ProjectPath::new(text.to_owned());
        let (message, _) = places.refused(&path("out/1.txt")).expect("refused");
        assert!(message.contains("leaves the project root"), "{message}");
        assert_eq!(places.refused(&path("plain/2.txt")), None);
        let (message, _) = places.refused(&path("plain/3.txt")).expect("refused");
        assert!(message.contains("is a symbolic link"), "{message}");
        // (What was found is what is taken: the link had it been found
        // plain is not looked at again.)
        let mut plain = Stated::default();
        plain.insert(
            root.join("plain/3.txt"),
            found(&root.join("plain/3.txt"), false),
        );
        let mut places = OutputPlaces::new(&root, &manifest).found(&plain);
        assert_eq!(places.refused(&path("plain/3.txt")), None);
    }
}
