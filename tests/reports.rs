//! What `show`, `why` and `provenance` report is what the workspace holds.

mod common;

use common::Project;

fn copier() -> Project {
    let p = Project::new();
    p.file("src.txt", "v1\n");
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "revert"

[stages.freeze]
run = "echo run >> ran.log; cat {in.src} > {out.o}"
inputs = { src = "src.txt" }
outputs = { o = "out/frozen.txt" }
"#,
    );
    p
}

fn json(p: &Project, args: &[&str]) -> serde_json::Value {
    let out = p.cairn(args);
    out.success();
    serde_json::from_str(&out.stdout()).unwrap_or_else(|e| panic!("{e}: {}", out.stdout()))
}

#[test]
fn after_a_revert_show_why_and_provenance_describe_the_restored_result() {
    let p = copier();
    p.cairn(&["run"]).success();
    let first = json(&p, &["show", "freeze", "--json"])["last_ok"].clone();
    p.file("src.txt", "v2\n");
    p.cairn(&["run"]).success();
    // Reverting the input brings the first result back from the store.
    p.file("src.txt", "v1\n");
    let run = p.cairn(&["run"]);
    run.success();
    assert!(run.stderr().contains("0 ran"), "{}", run.stderr());
    assert_eq!(p.read("out/frozen.txt"), "v1\n");

    let shown = json(&p, &["show", "freeze", "--json"]);
    assert_eq!(shown["last_ok"]["run_id"], first["run_id"], "{shown}");
    assert_eq!(
        shown["last_ok"]["outputs"][0]["digest"], first["outputs"][0]["digest"],
        "{shown}"
    );
    let text = p.cairn(&["show", "freeze"]).stdout();
    let digest = first["outputs"][0]["digest"].as_str().unwrap();
    assert!(text.contains(digest), "{text}");
    assert!(
        text.contains(&format!("run {} at", first["run_id"])),
        "{text}"
    );

    let lineage = json(&p, &["provenance", "out/frozen.txt", "--json"]);
    assert_eq!(lineage["stages"][0]["run_id"], first["run_id"], "{lineage}");

    // An edit is diffed against what the workspace holds (v1), not
    // against the newest result in the ledger (v2).
    p.file("src.txt", "v3\n");
    let why = json(&p, &["why", "freeze", "--json"]);
    let change = why["changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["component"] == "input:src.txt")
        .unwrap_or_else(|| panic!("{why}"))
        .clone();
    assert_eq!(change["old"]["digest"], digest, "{why}");
}

/// The numbers of a run's summary line (`1 ran, 0 fresh, … (run N)`), by label.
fn summary_counts(stderr: &str) -> Vec<(usize, String)> {
    let line = stderr
        .lines()
        .rev()
        .find(|l| l.contains(" ran, ") && l.contains("(run "))
        .unwrap_or_else(|| panic!("no summary line in:\n{stderr}"));
    let counts = line.split(" (run ").next().unwrap();
    counts
        .split(", ")
        .map(|part| {
            let (n, label) = part.split_once(' ').unwrap();
            (n.parse().unwrap(), label.to_owned())
        })
        .collect()
}

#[test]
fn a_fail_fast_run_accounts_for_every_selected_stage() {
    let p = Project::new();
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "failfast"

[stages.broken]
run = "exit 3"
outputs = { o = "broken.txt" }

[stages.one]
run = "echo 1 > {out.o}"
outputs = { o = "one.txt" }

[stages.two]
run = "echo 2 > {out.o}"
outputs = { o = "two.txt" }

[stages.after]
run = "cat {in.b} > {out.o}"
inputs = { b = "broken.txt" }
outputs = { o = "after.txt" }
"#,
    );
    let run = p.cairn(&["run", "-j", "1"]);
    run.code_is(1);
    let counts = summary_counts(&run.stderr());
    let total: usize = counts.iter().map(|(n, _)| n).sum();
    assert_eq!(total, 4, "{counts:?}\n{}", run.stderr());
    assert!(counts.contains(&(1, "failed".to_owned())), "{counts:?}");
    // `after` at least is never attempted; which of the others started
    // before the failure stopped the run depends on the order.
    assert!(
        counts
            .iter()
            .any(|(n, label)| label == "not attempted" && *n >= 1),
        "{counts:?}"
    );

    // With --keep-going the independent stages run; only `after` is left.
    let run = p.cairn(&["run", "-j", "1", "--keep-going"]);
    run.code_is(1);
    let counts = summary_counts(&run.stderr());
    assert_eq!(
        counts.iter().map(|(n, _)| n).sum::<usize>(),
        4,
        "{counts:?}"
    );
    let done: usize = counts
        .iter()
        .filter(|(_, label)| label == "ran" || label == "fresh")
        .map(|(n, _)| n)
        .sum();
    assert_eq!(done, 2, "{counts:?}");
    assert!(
        counts.contains(&(1, "not attempted".to_owned())),
        "{counts:?}"
    );
}

/// `cairn ARGS` run in `dir` (a subdirectory of the project).
fn cairn_in(p: &Project, dir: &str, args: &[&str]) -> common::Run {
    let output = p
        .command(args)
        .current_dir(p.path(dir))
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    common::Run { output }
}

#[test]
fn paths_on_the_command_line_resolve_from_the_current_directory() {
    let p = copier();
    p.file("sub/notes.txt", "not an output\n");
    p.cairn(&["run"]).success();
    let absolute = p.path("out/frozen.txt").display().to_string();
    for (dir, path) in [
        ("sub", "../out/frozen.txt"),
        ("out", "frozen.txt"),
        ("out", "./frozen.txt"),
        ("sub", absolute.as_str()),
        (".", absolute.as_str()),
    ] {
        let lineage = cairn_in(&p, dir, &["provenance", path, "--json"]);
        lineage.success();
        let parsed: serde_json::Value = serde_json::from_str(&lineage.stdout()).unwrap();
        assert_eq!(parsed["stages"][0]["stage"], "freeze", "{dir} {path}");
        let why = cairn_in(&p, dir, &["why", path]);
        why.success();
        assert!(
            why.stdout().contains("`freeze` is fresh"),
            "{dir} {path}: {}",
            why.stdout()
        );
        let show = cairn_in(&p, dir, &["show", path, "--json"]);
        show.success();
        let parsed: serde_json::Value = serde_json::from_str(&show.stdout()).unwrap();
        assert_eq!(parsed["stage"], "freeze", "{dir} {path}");
    }
    // From `sub/`, `out/frozen.txt` is `sub/out/frozen.txt`: no output.
    let wrong = cairn_in(&p, "sub", &["provenance", "out/frozen.txt"]);
    wrong.code_is(2);
    assert!(
        wrong.stderr().contains("sub/out/frozen.txt"),
        "{}",
        wrong.stderr()
    );
    // A path outside the project is named as such.
    let outside = cairn_in(&p, ".", &["why", "/etc/hostname"]);
    outside.code_is(2);
    assert!(
        outside.stderr().contains("/etc/hostname"),
        "{}",
        outside.stderr()
    );
}
