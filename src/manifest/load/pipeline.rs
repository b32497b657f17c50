//! The pipeline as a whole: `[pipeline]` (name and root), `[params]`,
//! `[profiles]` and `[resources]`.

use super::*;

impl Checker<'_> {
    /// `[resources]`: named capacities (positive integers).
    pub(super) fn resources(&mut self, entries: &[Entry]) -> BTreeMap<String, Resource> {
        let mut resources = BTreeMap::new();
        let Some(entry) = find(entries, "resources") else {
            return resources;
        };
        let Some(table) = self.expect_table(&entry.value, "`resources`") else {
            return resources;
        };
        for resource in table {
            let capacity = |node: &Node| match node.kind {
                NodeKind::Integer(n) if n >= 1 && n <= u32::MAX as i64 => Some(n as u32),
                _ => None,
            };
            let (count, per_stage, across) = match &resource.value.kind {
                NodeKind::Table(spec) => {
                    self.unknown_keys(
                        spec,
                        &["capacity", "hold", "across"],
                        &format!("resource `{}`", resource.key),
                    );
                    let across = find(spec, "across").and_then(|e| {
                        let name = self.string(&e.value, "`across`")?;
                        Some((name, e.value.span.clone()))
                    });
                    let per_stage = match find(spec, "hold").map(|e| (&e.value, e.value.as_str())) {
                        None | Some((_, Some("command"))) => false,
                        Some((_, Some("stage"))) => true,
                        Some((node, _)) => {
                            self.problems.push(
                                Problem::new("`hold` must be \"command\" or \"stage\"", node.span.clone(), "here")
                                    .help("\"command\": each command (each item) holds a unit; \"stage\": a per-item stage holds one unit while all its items run"),
                            );
                            false
                        }
                    };
                    let count = find(spec, "capacity").and_then(|e| capacity(&e.value));
                    let plain_name = !resource.key.is_empty()
                        && resource
                            .key
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
                    if across.is_some() && !plain_name {
                        // The name travels to the cluster: a Lease's name,
                        // a Slurm license, a heartbeat file's name.
                        self.problems.push(
                            Problem::new(
                                format!("resource `{}` is held `across` a cluster, but its name is not plain", resource.key),
                                resource.key_span.clone(),
                                "this name",
                            )
                            .help("a window held across a cluster is named with letters, digits, `-` and `_` (it names a Lease or a Slurm license)"),
                        );
                    }
                    if let Some((_, span)) = &across
                        && (count != Some(1) || !per_stage)
                    {
                        self.problems.push(
                            Problem::new(
                                format!("resource `{}` is held `across` a cluster, but not by one stage at a time", resource.key),
                                span.clone(),
                                "here",
                            )
                            .help("a window shared across machines has `capacity = 1` and `hold = \"stage\"`"),
                        );
                    }
                    (count, per_stage, across)
                }
                _ => (capacity(&resource.value), false, None),
            };
            if let Some((executor, span)) = &across {
                self.acrosses
                    .push((resource.key.clone(), executor.clone(), span.clone()));
            }
            match count {
                Some(capacity) => {
                    resources.insert(
                        resource.key.clone(),
                        Resource {
                            capacity,
                            per_stage,
                            across: across.map(|(executor, _)| executor),
                        },
                    );
                }
                None => self.problems.push(
                    Problem::new(
                        format!("resource `{}` needs a capacity of at least 1", resource.key),
                        resource.value.span.clone(),
                        "not a positive integer",
                    )
                    .help("write how many holders may use it at once, e.g. `cluster-window = 1` or `cluster-window = { capacity = 1, hold = \"stage\" }`"),
                ),
            }
        }
        resources
    }

    pub(super) fn check_resource_names(
        &mut self,
        stages: &[Stage],
        resources: &BTreeMap<String, Resource>,
    ) {
        for stage in stages {
            for held in &stage.resources {
                if !resources.contains_key(&held.name) {
                    let help = self.did_you_mean(
                        &held.name,
                        resources.keys().map(String::as_str),
                        &format!("declare it under `[resources]`, e.g. `{} = 1`", held.name),
                    );
                    self.problems.push(
                        Problem::new(
                            format!(
                                "stage `{}` holds undeclared resource `{}`",
                                stage.name, held.name
                            ),
                            held.span.clone(),
                            "not in `[resources]`",
                        )
                        .help(help),
                    );
                }
            }
        }
    }

    pub(super) fn pipeline(
        &mut self,
        entries: &[Entry],
        tree: &Node,
        manifest_dir: &Path,
    ) -> (Option<String>, Option<PathBuf>, Option<String>) {
        let Some(pipeline) = find(entries, "pipeline") else {
            self.problems.push(
                Problem::new(
                    "missing `[pipeline]` table",
                    tree.span.start..tree.span.start,
                    "expected here",
                )
                .help("start the manifest with `[pipeline]` and `name = \"…\"`"),
            );
            return (None, resolve_root(manifest_dir, None), None);
        };
        let Some(table) = self.expect_table(&pipeline.value, "`pipeline`") else {
            return (None, resolve_root(manifest_dir, None), None);
        };
        self.unknown_keys(table, PIPELINE_KEYS, "`[pipeline]`");
        let name = match find(table, "name") {
            Some(entry) => self.string(&entry.value, "`pipeline.name`"),
            None => {
                self.problems.push(
                    Problem::new(
                        "`[pipeline]` has no `name`",
                        pipeline.key_span.clone(),
                        "in this table",
                    )
                    .help("add `name = \"my-pipeline\"`"),
                );
                None
            }
        };
        let written = find(table, "root").map(|entry| {
            (
                self.string(&entry.value, "`pipeline.root`"),
                entry.value.span.clone(),
            )
        });
        let root = match &written {
            None => resolve_root(manifest_dir, None),
            Some((raw, span)) => raw.as_deref().and_then(|raw| {
                let root = resolve_root(manifest_dir, Some(raw));
                if root.is_none() {
                    self.problems.push(
                        Problem::new(
                            format!("pipeline root `{raw}` is not a directory"),
                            span.clone(),
                            "resolved against the manifest's directory",
                        )
                        .help("create the directory, or point `root` at an existing one"),
                    );
                }
                root
            }),
        };
        if root.is_none() && written.is_none() {
            self.problems.push(Problem::new(
                format!(
                    "the manifest's directory `{}` cannot be resolved",
                    manifest_dir.display()
                ),
                pipeline.key_span.clone(),
                "here",
            ));
        }
        (name, root, written.and_then(|(raw, _)| raw))
    }

    pub(super) fn params(&mut self, entries: &[Entry]) -> BTreeMap<String, serde_json::Value> {
        let mut params = BTreeMap::new();
        if let Some(entry) = find(entries, "params")
            && let Some(table) = self.expect_table(&entry.value, "`params`")
        {
            for param in table {
                params.insert(param.key.clone(), param_value(&param.value));
            }
        }
        params
    }

    pub(super) fn profiles(
        &mut self,
        entries: &[Entry],
        params: &BTreeMap<String, serde_json::Value>,
    ) -> BTreeMap<String, BTreeMap<String, serde_json::Value>> {
        let mut profiles = BTreeMap::new();
        let Some(entry) = find(entries, "profiles") else {
            return profiles;
        };
        let Some(table) = self.expect_table(&entry.value, "`profiles`") else {
            return profiles;
        };
        for profile in table {
            let Some(body) =
                self.expect_table(&profile.value, &format!("profile `{}`", profile.key))
            else {
                continue;
            };
            self.unknown_keys(body, PROFILE_KEYS, &format!("`[profiles.{}]`", profile.key));
            let mut overrides = BTreeMap::new();
            if let Some(p) = find(body, "params")
                && let Some(table) = self.expect_table(&p.value, "profile params")
            {
                for param in table {
                    if !params.contains_key(&param.key) {
                        self.problems.push(
                            Problem::new(
                                format!(
                                    "profile `{}` overrides undefined param `{}`",
                                    profile.key, param.key
                                ),
                                param.key_span.clone(),
                                "not in `[params]`",
                            )
                            .help(self.did_you_mean(
                                &param.key,
                                params.keys().map(String::as_str),
                                "declare it in `[params]` first",
                            )),
                        );
                    } else {
                        overrides.insert(param.key.clone(), param_value(&param.value));
                    }
                }
            }
            profiles.insert(profile.key.clone(), overrides);
        }
        profiles
    }
}

/// The directory of the manifest at `path` (`.` for a bare file name).
pub(super) fn manifest_dir(path: &Path) -> &Path {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// The project root: `written` (`[pipeline] root`) resolved against the
/// manifest's directory, else that directory; `None` if it does not
/// resolve to a directory.
pub(super) fn resolve_root(manifest_dir: &Path, written: Option<&str>) -> Option<PathBuf> {
    match written {
        None => manifest_dir.canonicalize().ok(),
        Some(raw) => manifest_dir
            .join(raw)
            .canonicalize()
            .ok()
            .filter(|root| root.is_dir()),
    }
}
