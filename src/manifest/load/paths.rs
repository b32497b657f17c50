//! Paths as manifests write them, normalised against the project root:
//! relative, inside the root (or named from it, `../x`), never `cache/`.

use super::*;
use crate::manifest::Pin;

impl Checker<'_> {
    pub(super) fn paths(
        &mut self,
        stage: &str,
        node: &Node,
        root: Option<&Path>,
        output: bool,
    ) -> Vec<PathDecl> {
        let what = if output { "`outputs`" } else { "`inputs`" };
        let pairs: Vec<(String, &Node)> = match &node.kind {
            NodeKind::Array(items) => items
                .iter()
                .enumerate()
                .map(|(i, n)| (i.to_string(), n))
                .collect(),
            NodeKind::Table(entries) => entries.iter().map(|e| (e.key.clone(), &e.value)).collect(),
            _ => {
                self.type_error(node, what, "a list of paths or a table of NAME = \"path\"");
                return Vec::new();
            }
        };
        let mut decls = Vec::new();
        for (name, value) in pairs {
            if let (false, Some(table)) = (output, value.as_table()) {
                if let Some(pin) = self.pin(table, value) {
                    decls.push(PathDecl {
                        name,
                        path: pin.path(),
                        span: value.span.clone(),
                        pinned: Some(pin),
                    });
                }
                continue;
            }
            let Some(raw) = self.string(value, &format!("a path in {what}")) else {
                continue;
            };
            let Some(root) = root else { continue };
            match normalise(root, &raw, output) {
                Ok(path) => decls.push(PathDecl {
                    name,
                    path,
                    span: value.span.clone(),
                    pinned: None,
                }),
                Err((message, help)) => {
                    self.problems
                        .push(Problem::new(message, value.span.clone(), "this path").help(help));
                    let namespace = if output { "out" } else { "in" };
                    self.refused_paths
                        .insert((stage.to_owned(), namespace, name));
                }
            }
        }
        decls
    }

    /// An input fetched by URL: `{ url = "https://…", sha256 = "HEX" }`.
    fn pin(&mut self, table: &[Entry], node: &Node) -> Option<Pin> {
        self.unknown_keys(table, &["url", "sha256"], "a fetched input");
        let url = find(table, "url").and_then(|e| self.string(&e.value, "`url`"));
        let sha256 = find(table, "sha256").and_then(|e| self.string(&e.value, "`sha256`"));
        let (Some(url), Some(sha256)) = (url, sha256) else {
            self.problems.push(
                Problem::new("a fetched input needs both `url` and `sha256`", node.span.clone(), "this input")
                    .help("e.g. `sdist = { url = \"https://files.example.org/pkg-1.0.tar.gz\", sha256 = \"<64 hex digits>\" }`: cairn fetches it once, checks its SHA-256 and keeps it"),
            );
            return None;
        };
        if !(url.starts_with("https://") || url.starts_with("http://")) {
            self.problems.push(
                Problem::new(format!("`{url}` is not an http(s) URL"), node.span.clone(), "this `url`")
                    .help("a fetched input is downloaded over HTTP(S); a file on this machine is a plain path"),
            );
            return None;
        }
        if sha256.len() != 64
            || !sha256
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        {
            self.problems.push(
                Problem::new(
                    format!("`{sha256}` is not a SHA-256 (64 lowercase hex digits)"),
                    node.span.clone(),
                    "this `sha256`",
                )
                .help("`sha256sum FILE` (or the index's `sha256` field) gives it"),
            );
            return None;
        }
        Some(Pin { url, sha256 })
    }
}

/// Normalises a manifest path against the project root, lexically.
pub(super) fn normalise(
    root: &Path,
    raw: &str,
    output: bool,
) -> Result<ProjectPath, (String, String)> {
    if raw.trim().is_empty() {
        return Err((
            "empty path".to_owned(),
            "write a path relative to the project root".to_owned(),
        ));
    }
    let path = Path::new(raw);
    let relative: PathBuf = if path.is_absolute() {
        match path.strip_prefix(root) {
            Ok(inside) => inside.to_owned(),
            Err(_) if output => {
                return Err((
                    format!(
                        "output `{raw}` is outside the project root `{}`",
                        root.display()
                    ),
                    "outputs must live inside the project; use a relative path".to_owned(),
                ));
            }
            Err(_) => {
                return Ok(ProjectPath::new(
                    lexical(path).to_string_lossy().into_owned(),
                ));
            }
        }
    } else {
        path.to_owned()
    };
    let mut parts: Vec<String> = Vec::new();
    for component in relative.components() {
        match component {
            Component::CurDir => {}
            Component::Normal(part) => parts.push(part.to_string_lossy().into_owned()),
            Component::ParentDir => {
                if parts.last().is_some_and(|p| p != "..") {
                    parts.pop();
                } else {
                    parts.push("..".to_owned());
                }
            }
            Component::RootDir | Component::Prefix(_) => {}
        }
    }
    if parts.first().is_some_and(|p| p == "..") {
        // `../proj/x` from inside `proj` is `x`.
        if let Ok(inside) = lexical(&root.join(parts.join("/"))).strip_prefix(root) {
            return normalise(root, &inside.to_string_lossy(), output);
        }
        if output {
            return Err((
                format!("output `{raw}` escapes the project root"),
                "outputs must stay inside the project root; remove the leading `..`".to_owned(),
            ));
        }
        // Outside the root: kept relative to it (commands run in the
        // root), so that moving the project with its neighbours changes
        // no fingerprint.
        return Ok(ProjectPath::new(parts.join("/")));
    }
    if parts.is_empty() {
        return Err((
            format!("path `{raw}` is the project root itself"),
            "name a file or directory inside the project".to_owned(),
        ));
    }
    if output && parts[0] == "cache" {
        return Err((
            format!("output `{raw}` is inside cairn's `cache/` directory"),
            "cairn owns `cache/`; write outputs elsewhere".to_owned(),
        ));
    }
    Ok(ProjectPath::new(parts.join("/")))
}

pub(super) fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOT: &str = "/work/project";

    fn input(raw: &str) -> Result<String, String> {
        normalise(Path::new(ROOT), raw, false)
            .map(|p| p.as_str().to_owned())
            .map_err(|(message, _)| message)
    }

    fn output(raw: &str) -> Result<String, String> {
        normalise(Path::new(ROOT), raw, true)
            .map(|p| p.as_str().to_owned())
            .map_err(|(message, _)| message)
    }

    #[test]
    fn paths_are_normalised_lexically_against_the_root() {
        assert_eq!(input("data/./raw/../book.txt").unwrap(), "data/book.txt");
        assert_eq!(
            input("/work/project/data/book.txt").unwrap(),
            "data/book.txt"
        );
        // Out of the root and back in is inside.
        assert_eq!(input("../project/data").unwrap(), "data");
    }

    #[test]
    fn inputs_outside_the_root_stay_relative_to_it_and_outputs_may_not_leave_it() {
        assert_eq!(input("../shared/x.csv").unwrap(), "../shared/x.csv");
        assert_eq!(input("/etc/hosts").unwrap(), "/etc/hosts");
        assert!(
            output("../shared/x.csv")
                .unwrap_err()
                .contains("escapes the project root")
        );
        assert!(
            output("/etc/hosts")
                .unwrap_err()
                .contains("outside the project root")
        );
    }

    #[test]
    fn the_root_itself_an_empty_path_and_cache_are_refused() {
        assert!(input("").unwrap_err().contains("empty path"));
        assert!(
            input("a/..")
                .unwrap_err()
                .contains("the project root itself")
        );
        assert!(output("cache/objects/x").unwrap_err().contains("`cache/`"));
        // Reading from cache/ is a user's business; writing into it is not.
        assert_eq!(input("cache/notes.txt").unwrap(), "cache/notes.txt");
    }
}
