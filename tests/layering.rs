//! The layers depend only on the layers to their left:
//! manifest → graph → fingerprint → store → release → builtins → exec →
//! schedule → cli.

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
