//! A validated manifest kept beside the fresh proof of the run that used
//! it (see `schedule::proof`), for the next run of the same manifest
//! to take up without parsing and checking it again.
//!
//! Validation reads the manifest's bytes, its path, the working directory
//! and the profile (all in the proof's key, with the cairn binary that
//! encoded it), and the disk: which inputs and item lists exist, which
//! outputs would be written through a symbolic link, and where the root
//! resolves. A kept manifest is taken up only under the same key, and only
//! after the checks on disk are made again and pass, its root resolved
//! again from `[pipeline] root` as written
//! ([`super::load::holds_on_disk`]); anything else is loaded the usual
//! way, which reports what fails.
//!
//! Encoded with postcard, which is not self-describing: the binary that
//! reads a kept manifest is the one that wrote it (the key says so), and
//! JSON values and regular expressions travel as their text.

use std::path::Path;

use super::model::Manifest;
use crate::file_stat::Stated;

/// The manifest's encoding; `None` if it cannot be encoded (then nothing
/// is kept).
pub fn encode(manifest: &Manifest) -> Option<Vec<u8>> {
    postcard::to_allocvec(manifest).ok()
}

/// The manifest kept as `bytes`, if it was kept for the manifest at
/// `path` under `profile`, and what it found on disk (its root among it)
/// still holds; `stated`: files found there moments ago.
pub fn take_up(
    bytes: &[u8],
    path: &Path,
    profile: Option<&str>,
    stated: &Stated,
) -> Option<Manifest> {
    let manifest: Manifest = postcard::from_bytes(bytes).ok()?;
    let same = manifest.path == path && manifest.profile.as_deref() == profile;
    (same && super::load::holds_on_disk(&manifest, stated)).then_some(manifest)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::manifest::load;

    /// The shipped pipeline: executors, services, profiles, params, JSON
    /// settings, `classify` patterns, per-item and sampled stages.
    fn shipped() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("pipelines/swesmith-curation.toml")
    }

    #[test]
    fn a_kept_manifest_is_taken_up_as_it_was_loaded_and_only_for_its_own_key() {
        let path = shipped();
        for profile in [None, Some("cluster"), Some("gpu,ci"), Some("slurm")] {
            let manifest = load(&path, profile).unwrap();
            let kept = encode(&manifest).unwrap();
            let taken = take_up(&kept, &path, profile, &Stated::default()).expect("taken up");
            assert_eq!(format!("{taken:?}"), format!("{manifest:?}"), "{profile:?}");
            assert!(take_up(&kept, Path::new("other.toml"), profile, &Stated::default()).is_none());
            assert!(take_up(&kept, &path, Some("local"), &Stated::default()).is_none());
            assert!(take_up(&kept[..kept.len() / 2], &path, profile, &Stated::default()).is_none());
        }
    }

    #[test]
    fn a_kept_manifest_is_not_taken_up_where_the_checks_on_disk_now_fail() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let path = root.join("cairn.toml");
        std::fs::write(
            &path,
            r#"
[pipeline]
name = "kept"

[stages.a]
run = "cat in.txt > out/a.txt"
inputs = ["in.txt"]
outputs = ["out/a.txt"]

[stages.b]
foreach = { items = "items.jsonl", key = "id" }
run = "echo {item.id}"
inputs = ["out/a.txt"]
outputs = { results = "results.jsonl" }
"#,
        )
        .unwrap();
        std::fs::write(root.join("in.txt"), "in\n").unwrap();
        std::fs::write(root.join("items.jsonl"), "{\"id\": \"x\"}\n").unwrap();
        std::fs::create_dir(root.join("out")).unwrap();
        let kept = encode(&load(&path, None).unwrap()).unwrap();
        let taken_up = || take_up(&kept, &path, None, &Stated::default()).is_some();
        assert!(taken_up());

        // Each change is refused by the usual load as by the kept
        // manifest's checks, and undone.
        let refused = |what: &str| {
            let error = load(&path, None).unwrap_err().to_string();
            assert!(!taken_up(), "{what}: {error}");
        };
        std::fs::rename(root.join("in.txt"), root.join("in.old")).unwrap();
        refused("an input removed");
        std::fs::rename(root.join("in.old"), root.join("in.txt")).unwrap();
        std::fs::remove_file(root.join("items.jsonl")).unwrap();
        refused("the item list removed");
        std::fs::write(root.join("items.jsonl"), "{\"id\": \"x\"}\n").unwrap();
        std::os::unix::fs::symlink(root.join("in.txt"), root.join("out/a.txt")).unwrap();
        refused("an output made a symbolic link");
        std::fs::remove_file(root.join("out/a.txt")).unwrap();
        std::fs::remove_dir(root.join("out")).unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), root.join("out")).unwrap();
        refused("an output's directory made a link out of the root");
        std::fs::remove_file(root.join("out")).unwrap();
        assert!(taken_up());
    }

    #[test]
    fn a_kept_manifest_is_not_taken_up_where_its_root_resolves_elsewhere_now() {
        let dir = tempfile::tempdir().unwrap();
        let top = dir.path().canonicalize().unwrap();
        for data in ["one", "two"] {
            std::fs::create_dir(top.join(data)).unwrap();
        }
        std::os::unix::fs::symlink("one", top.join("data")).unwrap();
        let path = top.join("cairn.toml");
        // (A literal string: the fresh proof's reading of the root does
        // not see it; the kept manifest resolves it as the loader does.)
        std::fs::write(
            &path,
            "[pipeline]\nname = \"kept\"\nroot = 'data'\n\n[stages.a]\nrun = \"echo a > a.txt\"\noutputs = [\"a.txt\"]\n",
        )
        .unwrap();
        let manifest = load(&path, None).unwrap();
        assert_eq!(manifest.root, top.join("one"));
        let kept = encode(&manifest).unwrap();
        assert!(take_up(&kept, &path, None, &Stated::default()).is_some());
        std::fs::remove_file(top.join("data")).unwrap();
        std::os::unix::fs::symlink("two", top.join("data")).unwrap();
        assert_eq!(load(&path, None).unwrap().root, top.join("two"));
        assert!(take_up(&kept, &path, None, &Stated::default()).is_none());
    }
}
