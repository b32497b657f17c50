//! `[cache] link`: stored files sharing the disk with their workspace
//! copies. A hard link is one read-only inode that a re-run never writes
//! through; a reflink falls back to a copy where the file system has none.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;

use common::Project;

fn project(link: &str) -> Project {
    let p = Project::new();
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
