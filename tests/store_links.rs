//! `[cache] link`: stored files sharing the disk with their workspace
//! copies. A hard link is one read-only inode that a re-run never writes
//! through; a reflink falls back to a copy where the file system has none.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;

use common::Project;

fn project(link: &str) -> Project {
    project_in(link, None)
}

fn project_in(link: &str, parent: Option<&std::path::Path>) -> Project {
    let p = parent.map_or_else(Project::new, Project::new_in);
    p.file(
        "cairn.toml",
        &format!(
            r#"
[pipeline]
name = "links"

[cache]
link = "{link}"

[stages.make]
run = "seq 1 $(cat n.txt) > {{out.big}}; mkdir -p {{out.tree}}; seq 2 30000 > {{out.tree}}/a"
inputs = ["n.txt"]
outputs = {{ big = "build/big.txt", tree = "build/tree" }}
"#
        ),
    );
    p.file("n.txt", "20000\n");
    p
}

/// The store's object holding `bytes`.
fn object_of(p: &Project, bytes: &[u8]) -> PathBuf {
    let hex = blake3::hash(bytes).to_hex().to_string();
    p.path(&format!("cache/objects/{}/{}", &hex[..2], &hex[2..]))
}

#[test]
fn hard_linked_outputs_are_one_read_only_inode_that_a_rerun_never_writes_through() {
    let p = project("hardlink");
    p.cairn(&["run"]).success();
    let big = std::fs::read(p.path("build/big.txt")).unwrap();
    let object = object_of(&p, &big);
    let (file, stored) = (
        std::fs::metadata(p.path("build/big.txt")).unwrap(),
        std::fs::metadata(&object).unwrap(),
    );
    assert_eq!(file.ino(), stored.ino(), "one inode");
    assert_eq!(file.nlink(), 2);
    assert_eq!(file.permissions().mode() & 0o222, 0, "read-only");
    let tree_file = std::fs::read(p.path("build/tree/a")).unwrap();
    assert_eq!(
        std::fs::metadata(p.path("build/tree/a")).unwrap().ino(),
        std::fs::metadata(object_of(&p, &tree_file)).unwrap().ino()
    );

    // Deleted, it comes back as a link again.
    std::fs::remove_file(p.path("build/big.txt")).unwrap();
    std::fs::remove_dir_all(p.path("build/tree")).unwrap();
    let restored = p.cairn(&["run"]);
    restored.success();
    assert!(
        restored.stderr().contains("restored"),
        "{}",
        restored.stderr()
    );
    assert_eq!(
        std::fs::metadata(p.path("build/big.txt")).unwrap().ino(),
        std::fs::metadata(&object).unwrap().ino()
    );
    assert_eq!(std::fs::read(p.path("build/tree/a")).unwrap(), tree_file);

    // A re-run writes a new file; the old result's object is untouched...
    p.file("n.txt", "25000\n");
    p.cairn(&["run"]).success();
    assert_ne!(std::fs::read(p.path("build/big.txt")).unwrap(), big);
    assert_eq!(
        std::fs::read(&object).unwrap(),
        big,
        "the old object is whole"
    );
    // ...so reverting restores the old bytes without running anything.
    p.file("n.txt", "20000\n");
    let reverted = p.cairn(&["run"]);
    reverted.success();
    assert!(reverted.stderr().contains("0 ran"), "{}", reverted.stderr());
    assert_eq!(std::fs::read(p.path("build/big.txt")).unwrap(), big);
    p.cairn(&["audit"]).success();
}

#[test]
fn a_reflink_where_the_file_system_has_none_is_a_copy() {
    let p = project("reflink");
    p.cairn(&["run"]).success();
    let big = std::fs::read(p.path("build/big.txt")).unwrap();
    let object = object_of(&p, &big);
    assert_eq!(std::fs::read(&object).unwrap(), big);
    std::fs::remove_file(p.path("build/big.txt")).unwrap();
    p.cairn(&["run"]).success();
    assert_eq!(std::fs::read(p.path("build/big.txt")).unwrap(), big);
    p.cairn(&["audit"]).success();
}

#[test]
fn an_unknown_link_kind_is_located_in_the_manifest() {
    let p = project("symlink");
    let out = p.cairn(&["status"]);
    out.code_is(2);
    assert!(
        out.stderr()
            .contains("`link` must be \"copy\", \"reflink\" or \"hardlink\""),
        "{}",
        out.stderr()
    );
}

/// The file system `scripts/test` mounts for this (XFS with reflinks, in a
/// loop-mounted image), named by `CAIRN_TEST_REFLINK_DIR`.
fn reflink_dir() -> PathBuf {
    let dir = std::env::var_os("CAIRN_TEST_REFLINK_DIR").map(PathBuf::from);
    assert!(
        dir.as_ref().is_some_and(|d| d.is_dir()),
        "CAIRN_TEST_REFLINK_DIR names no directory: run the tests with `scripts/test`, which mounts a file system with reflinks"
    );
    dir.unwrap()
}

/// Whether every extent of `path` is shared with another file (FIEMAP,
/// through `filefrag -v`).
fn all_extents_shared(path: &std::path::Path) -> bool {
    common::require_tool("filefrag");
    let out = std::process::Command::new("filefrag")
        .arg("-v")
        .arg(path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let extents: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.trim_start()
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_digit())
                && l.contains(':')
        })
        .collect();
    !extents.is_empty() && extents.iter().all(|l| l.contains("shared"))
}

#[test]
fn reflinked_outputs_share_their_blocks_with_the_store_where_the_file_system_can() {
    let p = project_in("reflink", Some(&reflink_dir()));
    p.cairn(&["run"]).success();
    let big = p.path("build/big.txt");
    let bytes = std::fs::read(&big).unwrap();
    let object = object_of(&p, &bytes);
    assert!(all_extents_shared(&big), "the output shares its blocks");
    assert!(all_extents_shared(&object), "the stored object shares them");
    assert_ne!(
        std::fs::metadata(&big).unwrap().ino(),
        std::fs::metadata(&object).unwrap().ino(),
        "two files, not one"
    );
    // Restored, the copy shares the object's blocks again, and an edit of
    // it leaves the object as it was.
    std::fs::remove_file(&big).unwrap();
    p.cairn(&["run"]).success();
    assert!(all_extents_shared(&big));
    std::fs::write(&big, b"edited").unwrap();
    assert_eq!(std::fs::read(&object).unwrap(), bytes);
    let again = p.cairn(&["run"]);
    again.success();
    assert_eq!(std::fs::read(&big).unwrap(), bytes);
    p.cairn(&["audit"]).success();
}
