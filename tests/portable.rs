//! Fingerprints are portable: nothing of this machine's absolute paths
//! enters a key or a command, so a project moved elsewhere (with the
//! sibling directories it reads) is still fresh.

mod common;

use std::path::Path;
use std::process::Command;

fn cairn(root: &Path, args: &[&str]) -> std::process::Output {
    Command::new(common::bin())
        .args(args)
        .current_dir(root)
        .env_remove("RUST_LOG")
        .output()
        .expect("run cairn")
}

#[track_caller]
fn success(output: &std::process::Output) -> String {
    assert!(
        output.status.success(),
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn a_project_moved_with_its_sibling_input_stays_fresh() {
    let temp = tempfile::tempdir().unwrap();
    let before = temp.path().join("before");
    std::fs::create_dir_all(before.join("shared")).unwrap();
    std::fs::create_dir_all(before.join("proj")).unwrap();
    std::fs::write(before.join("shared/s.txt"), "shared\n").unwrap();
    std::fs::write(
        before.join("proj/cairn.toml"),
        r#"
[pipeline]
name = "moved"

[stages.copy]
run = "echo copy >> runs.log; cp {in.s} {out.o}"
inputs = { s = "../shared/s.txt" }
outputs = { o = "state/copy.txt" }

[stages.upper]
run = "echo upper >> runs.log; tr a-z A-Z < {in.c} > {out.o}"
inputs = { c = "state/copy.txt" }
outputs = { o = "state/upper.txt" }
"#,
    )
    .unwrap();
    success(&cairn(&before.join("proj"), &["run"]));
    let here = before.to_string_lossy().into_owned();
    let db = rusqlite::Connection::open(before.join("proj/cache/ledger.db")).unwrap();
    let keys: Vec<String> = db
        .prepare("SELECT key_json FROM results")
        .unwrap()
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    drop(db);
    assert_eq!(keys.len(), 2);
    for key in &keys {
        assert!(!key.contains(&here), "an absolute path in a key: {key}");
    }

    let after = temp.path().join("elsewhere/after");
    std::fs::create_dir_all(after.parent().unwrap()).unwrap();
    std::fs::rename(&before, &after).unwrap();
    let root = after.join("proj");

    let status = success(&cairn(&root, &["status", "--json"]));
    let json: serde_json::Value = serde_json::from_str(&status).unwrap();
    for stage in json["stages"].as_array().unwrap() {
        assert_eq!(stage["state"], "fresh", "{stage}");
    }
    success(&cairn(&root, &["run"]));
    let runs = std::fs::read_to_string(root.join("runs.log")).unwrap();
    assert_eq!(runs.lines().collect::<Vec<_>>(), ["copy", "upper"]);
    let why = success(&cairn(&root, &["why", "copy"]));
    assert!(!why.contains("removed"), "{why}");
}

#[test]
fn an_input_outside_the_root_reaches_the_command_relative_to_the_root() {
    let temp = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(temp.path().join("shared")).unwrap();
    std::fs::create_dir_all(temp.path().join("proj/sub")).unwrap();
    std::fs::write(temp.path().join("shared/s.txt"), "shared\n").unwrap();
    std::fs::write(
        temp.path().join("proj/cairn.toml"),
        r#"
[pipeline]
name = "relative"

[stages.say]
run = "echo {in.s} > {out.o}"
inputs = { s = "sub/../../shared/./s.txt" }
outputs = { o = "state/said.txt" }
"#,
    )
    .unwrap();
    let root = temp.path().join("proj");
    success(&cairn(&root, &["run"]));
    assert_eq!(
        std::fs::read_to_string(root.join("state/said.txt")).unwrap(),
        "../shared/s.txt\n"
    );
}
