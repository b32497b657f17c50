//! "Fresh" means fresh: the ways an output could be wrong while `status`
//! says fresh and `run` does nothing. An input edited while its stage runs,
//! names that are not UTF-8, links inside input directories, and a damaged
//! object two entries of one output share.

mod common;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::process::Stdio;

use common::{Project, wait_for};

/// Runs `cairn run`, which must fail (exit 1) saying each of `says`.
#[track_caller]
fn run_fails_saying(p: &Project, says: &[&str]) {
    let run = p.cairn(&["run"]);
    run.code_is(1);
    let missing: Vec<&&str> = says
        .iter()
        .filter(|s| !run.stderr().contains(**s))
        .collect();
    assert!(missing.is_empty(), "no {missing:?} in:\n{}", run.stderr());
}

/// A stage that waits for `go` before it reads its input: the test edits
/// the input while the command runs.
fn waiting_stage() -> Project {
    let p = Project::new();
    p.file("in.txt", "one\n");
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "midway"

[stages.copy]
run = "touch started; while [ ! -e go ]; do sleep 0.02; done; cat {in.l} > {out.o}"
inputs = { l = "in.txt" }
outputs = { o = "state/out.txt" }
"#,
    );
    p
}

#[test]
fn an_input_edited_while_its_stage_runs_is_not_recorded_under_its_old_content() {
    let p = waiting_stage();
    let child = p
        .command(&["run"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("the command to start", || p.exists("started"));
    // Same size: only the content and the times tell.
    p.file("in.txt", "two\n");
    p.file("go", "");
    let run = common::Run {
        output: child.wait_with_output().unwrap(),
    };
    run.code_is(1);
    assert!(
        run.stderr().contains("in.txt") && run.stderr().contains("changed while"),
        "the failure does not name the input that changed:\n{}",
        run.stderr()
    );
    // The old content back: the output made from the new one is not fresh.
    p.file("in.txt", "one\n");
    let status = p.cairn(&["status"]);
    assert!(
        !status.stdout().contains("fresh"),
        "status calls an output made from other input fresh:\n{}",
        status.stdout()
    );
    p.cairn(&["run"]).success();
    assert_eq!(p.read("state/out.txt"), "one\n");
    p.cairn(&["status"]).success();
    assert!(p.cairn(&["run"]).stderr().contains("0 ran"));
}

#[test]
fn an_item_input_edited_while_the_item_runs_is_not_recorded_under_its_old_content() {
    let p = Project::new();
    p.file("tasks/a.txt", "aaa\n");
    p.file("tasks/b.txt", "bbb\n");
    p.file(
        "list.jsonl",
        "{\"id\": \"a\", \"file\": \"tasks/a.txt\"}\n{\"id\": \"b\", \"file\": \"tasks/b.txt\"}\n",
    );
    // Item `a` rewrites its own input before it reads it: what it writes
    // comes from content its fingerprint never saw.
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "items"

[stages.check]
foreach = { items = "list.jsonl", key = "id" }
item_inputs = ["{item.file}"]
run = """
if [ {item.id} = a ] && [ ! -e edited ]; then touch edited; echo AAA > {item.file}; fi
mkdir -p seen && cat {item.file} > seen/{item.id}
"""
outputs = { results = "state/check.jsonl" }
"#,
    );
    run_fails_saying(&p, &["tasks/a.txt", "changed while"]);
    p.file("tasks/a.txt", "aaa\n");
    let status = p.cairn(&["status", "--json"]);
    assert!(
        !status.stdout().contains("\"fresh\""),
        "status calls a stage fresh whose item read other input:\n{}",
        status.stdout()
    );
    p.cairn(&["run"]).success();
    assert_eq!(p.read("seen/a"), "aaa\n");
    assert!(p.cairn(&["run"]).stderr().contains("0 ran"));
}

/// A stage that lists the names in `in/` (as bytes) into its output.
fn listing_stage() -> Project {
    let p = Project::new();
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "names"

[stages.list]
run = "ls in | od -c > {out.o}; echo ran >> runs.log"
inputs = { dir = "in" }
outputs = { o = "state/names.txt" }
"#,
    );
    p
}

fn non_utf8(p: &Project, dir: &str, name: &[u8]) -> std::path::PathBuf {
    p.path(dir).join(OsStr::from_bytes(name))
}

#[test]
fn a_rename_between_two_non_utf8_names_in_an_input_directory_reruns_the_stage() {
    let p = listing_stage();
    std::fs::create_dir_all(p.path("in")).unwrap();
    std::fs::write(non_utf8(&p, "in", b"n\xff"), "x").unwrap();
    p.cairn(&["run"]).success();
    std::fs::rename(non_utf8(&p, "in", b"n\xff"), non_utf8(&p, "in", b"n\xfe")).unwrap();
    let status = p.cairn(&["status"]);
    assert!(
        status.stdout().contains("stale"),
        "a renamed input file is not seen:\n{}",
        status.stdout()
    );
    p.cairn(&["run"]).success();
    assert_eq!(p.lines("runs.log").len(), 2);
    // U+FFFD, which a lossy conversion would turn both names into.
    std::fs::rename(
        non_utf8(&p, "in", b"n\xfe"),
        non_utf8(&p, "in", "n\u{fffd}".as_bytes()),
    )
    .unwrap();
    p.cairn(&["run"]).success();
    assert_eq!(p.lines("runs.log").len(), 3);
}

#[test]
fn an_output_directory_with_non_utf8_names_is_stored_and_restored_byte_exact() {
    let p = Project::new();
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "names"

[stages.make]
run = "mkdir -p {out.d}/sub && printf one > {out.d}/$(printf 'a\\377') && printf two > {out.d}/sub/$(printf 'b\\376c')"
outputs = { d = "state/d" }

[stages.read]
run = "cat {in.d}/sub/* > {out.o}"
inputs = { d = "state/d" }
outputs = { o = "state/read.txt" }
"#,
    );
    p.cairn(&["run"]).success();
    assert_eq!(p.read("state/read.txt"), "two");
    std::fs::remove_dir_all(p.path("state/d")).unwrap();
    let again = p.cairn(&["run"]);
    again.success();
    assert!(again.stderr().contains("0 ran"), "{}", again.stderr());
    let first = std::fs::read(non_utf8(&p, "state/d", b"a\xff")).unwrap();
    let second = std::fs::read(non_utf8(&p, "state/d/sub", b"b\xfec")).unwrap();
    assert_eq!(
        (first.as_slice(), second.as_slice()),
        (&b"one"[..], &b"two"[..])
    );
    p.cairn(&["audit"]).success();
}

#[test]
fn editing_the_target_of_a_link_inside_an_input_directory_reruns_the_stage() {
    let p = listing_stage();
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "links"

[stages.read]
run = "cat {in.dir}/* > {out.o}; echo ran >> runs.log"
inputs = { dir = "in" }
outputs = { o = "state/read.txt" }
"#,
    );
    p.file("shared/target.txt", "first\n");
    p.file("in/own.txt", "own\n");
    std::os::unix::fs::symlink("../shared/target.txt", p.path("in/link.txt")).unwrap();
    p.cairn(&["run"]).success();
    assert_eq!(p.read("state/read.txt"), "first\nown\n");
    p.file("shared/target.txt", "second\n");
    let status = p.cairn(&["status"]);
    assert!(
        status.stdout().contains("stale"),
        "an edit behind a link is not seen:\n{}",
        status.stdout()
    );
    p.cairn(&["run"]).success();
    assert_eq!(p.read("state/read.txt"), "second\nown\n");
    assert_eq!(p.lines("runs.log").len(), 2);
}

/// The objects of the store, by path.
fn objects(p: &Project) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![p.path("cache/objects")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            if entry.file_type().unwrap().is_dir() {
                dirs.push(entry.path());
            } else {
                found.push(entry.path());
            }
        }
    }
    found
}

#[test]
fn a_damaged_object_two_entries_share_reruns_only_its_stage_and_a_sibling_finishes() {
    let p = Project::new();
    let big = "x".repeat(100_000);
    p.file("big.txt", &big);
    p.file("s.txt", "first\n");
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "shared"

[stages.twins]
run = "mkdir -p {out.d} && cp {in.b} {out.d}/one && cp {in.b} {out.d}/two; echo twins >> runs.log"
inputs = { b = "big.txt" }
outputs = { d = "state/twins" }

[stages.sibling]
run = "while [ ! -e release ]; do sleep 0.02; done; cat {in.s} > {out.o}; echo sibling >> runs.log"
inputs = { s = "s.txt" }
outputs = { o = "state/sibling.txt" }
"#,
    );
    p.file("release", "");
    p.cairn(&["run"]).success();
    std::fs::remove_file(p.path("release")).unwrap();
    // The sibling must re-run; the twins' one object (both entries hold the
    // same bytes) is damaged, and their copy in the workspace gone.
    p.file("s.txt", "second\n");
    let damaged = objects(&p)
        .into_iter()
        .filter(|object| std::fs::metadata(object).unwrap().len() == big.len() as u64)
        .collect::<Vec<_>>();
    assert_eq!(damaged.len(), 1, "the two entries share one object");
    let mut flipped = std::fs::read(&damaged[0]).unwrap();
    flipped[500] ^= 0x01;
    std::fs::write(&damaged[0], flipped).unwrap();
    std::fs::remove_dir_all(p.path("state/twins")).unwrap();
    let child = p
        .command(&["run", "--jobs", "2"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The twins are re-run while the sibling waits, then the sibling is let go.
    wait_for("the twins to re-run", || p.lines("runs.log").len() == 3);
    p.file("release", "");
    let run = common::Run {
        output: child.wait_with_output().unwrap(),
    };
    run.success();
    assert_eq!(p.read("state/twins/one"), big);
    assert_eq!(p.read("state/twins/two"), big);
    assert_eq!(p.read("state/sibling.txt"), "second\n");
    // (The first run ran the two in either order.)
    let mut ran = p.lines("runs.log");
    ran[..2].sort();
    assert_eq!(
        ran,
        ["sibling", "twins", "twins", "sibling"],
        "{}",
        run.stderr()
    );
    p.cairn(&["audit"]).success();
}

#[test]
fn an_output_the_command_makes_a_symbolic_link_fails_the_stage_and_the_manifest_still_loads() {
    let p = Project::new();
    p.file("in.txt", "one\n");
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "linked"

[stages.link]
run = "ln -s in.txt {out.o}"
inputs = { i = "in.txt" }
outputs = { o = "out.txt" }
"#,
    );
    run_fails_saying(&p, &["FAILED  link", "a symbolic link"]);
    assert!(std::fs::symlink_metadata(p.path("out.txt")).is_err());
    // The manifest loads: the stage is only failed.
    let status = p.cairn(&["status"]);
    status.code_is(1);
    assert!(status.stdout().contains("failed"), "{}", status.stdout());
    p.file("cairn.toml", &p.read("cairn.toml").replace("ln -s", "cp"));
    p.cairn(&["run"]).success();
    assert_eq!(p.read("out.txt"), "one\n");
}

#[test]
fn a_tree_holding_a_link_that_points_nowhere_is_run_again_not_called_damaged() {
    let p = Project::new();
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "dangling"

[stages.make]
run = "mkdir -p {out.d} && echo x > {out.d}/file && ln -s /nowhere/at/all {out.d}/gone; echo ran >> runs.log"
outputs = { d = "state/d" }
"#,
    );
    p.cairn(&["run"]).success();
    std::fs::remove_dir_all(p.path("state/d")).unwrap();
    let again = p.cairn(&["run"]);
    again.success();
    assert!(
        !again.stderr().contains("is damaged") && again.stderr().contains("points nowhere"),
        "{}",
        again.stderr()
    );
    assert_eq!(p.lines("runs.log").len(), 2);
    assert_eq!(
        std::fs::read_link(p.path("state/d/gone")).unwrap(),
        std::path::Path::new("/nowhere/at/all")
    );
}
