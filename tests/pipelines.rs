//! Several pipelines in one project root: one `cache/` (one object store,
//! one ledger file), but each pipeline sees only its own history.

mod common;

use common::Project;

/// Two manifests in one root, each with a stage named `build` (different
/// commands, different outputs) and a stage of its own.
fn two_pipelines() -> Project {
    let p = Project::new();
    p.file("src.txt", "source\n");
    p.file(
        "a.toml",
        r#"
[pipeline]
name = "alpha"

[stages.build]
run = "echo building alpha; echo a >> ran-a.log; tr a-z A-Z < {in.src} > {out.o}"
inputs = { src = "src.txt" }
outputs = { o = "out/alpha.txt" }

[stages.only-alpha]
run = "echo only >> ran-a.log; (cat {in.x}; seq 1 5000) > {out.o}"
inputs = { x = "out/alpha.txt" }
outputs = { o = "out/alpha2.txt" }
"#,
    );
    p.file(
        "b.toml",
        r#"
[pipeline]
name = "beta"

[stages.build]
run = "echo building beta; echo b >> ran-b.log; rev < {in.src} > {out.o}"
inputs = { src = "src.txt" }
outputs = { o = "out/beta.txt" }
"#,
    );
    p
}

#[test]
fn a_second_pipeline_does_not_see_the_first_ones_stage_of_the_same_name() {
    let p = two_pipelines();
    p.cairn(&["-f", "a.toml", "run"]).success();
    // beta never ran: its `build` has no history, whatever alpha did.
    let why = p.cairn(&["-f", "b.toml", "why", "build"]);
    why.success();
    assert!(why.stdout().contains("never run"), "{}", why.stdout());
    p.cairn(&["-f", "b.toml", "run"]).success();
    // alpha's `build` is fresh, and `why` compares it with alpha's own result.
    let why = p.cairn(&["-f", "a.toml", "why", "build"]);
    why.success();
    assert!(why.stdout().contains("is fresh"), "{}", why.stdout());
    // An edit to alpha's command is diffed against alpha's command, not beta's.
    let edited = p.read("a.toml").replace("tr a-z A-Z", "tr a-y A-Y");
    p.file("a.toml", &edited);
    let why = p.cairn(&["-f", "a.toml", "why", "build"]);
    why.success();
    assert!(why.stdout().contains("tr a-z A-Z"), "{}", why.stdout());
    assert!(!why.stdout().contains("rev <"), "{}", why.stdout());
    let status = p.cairn(&["-f", "b.toml", "status", "--json"]);
    let parsed: serde_json::Value = serde_json::from_str(&status.stdout()).unwrap();
    let stages = parsed["stages"].as_array().unwrap();
    assert_eq!(stages.len(), 1, "{parsed}");
    assert_eq!(stages[0]["state"], "fresh", "{parsed}");
    // `show` lists only the pipeline's own results.
    let show = p.cairn(&["-f", "b.toml", "show", "build", "--json"]);
    let shown: serde_json::Value = serde_json::from_str(&show.stdout()).unwrap();
    assert_eq!(shown["last_ok"]["outputs"][0]["path"], "out/beta.txt");
}

#[test]
fn gc_from_one_pipeline_keeps_the_other_pipelines_results() {
    let p = two_pipelines();
    p.cairn(&["-f", "a.toml", "run"]).success();
    p.cairn(&["-f", "b.toml", "run"]).success();
    p.cairn(&["-f", "b.toml", "gc"]).success();
    p.cairn(&["-f", "a.toml", "audit"]).success();
    // alpha's outputs, removed from the workspace, come back from the
    // store without running anything.
    std::fs::remove_file(p.path("out/alpha.txt")).unwrap();
    std::fs::remove_file(p.path("out/alpha2.txt")).unwrap();
    let run = p.cairn(&["-f", "a.toml", "run"]);
    run.success();
    assert!(run.stderr().contains("0 ran"), "{}", run.stderr());
    assert_eq!(p.lines("ran-a.log").len(), 2, "alpha ran again");
    p.cairn(&["-f", "a.toml", "gc"]).success();
    p.cairn(&["-f", "b.toml", "audit"]).success();
    let run = p.cairn(&["-f", "b.toml", "run"]);
    assert!(run.stderr().contains("0 ran"), "{}", run.stderr());
    assert_eq!(p.lines("ran-b.log").len(), 1, "beta ran again");
}

#[test]
fn runs_of_two_pipelines_keep_their_logs_apart() {
    let p = two_pipelines();
    p.cairn(&["-f", "a.toml", "run"]).success();
    p.cairn(&["-f", "b.toml", "run"]).success();
    let logs = |file: &str| -> serde_json::Value {
        let out = p.cairn(&["-f", file, "log", "build", "--json"]);
        out.success();
        serde_json::from_str(&out.stdout()).unwrap()
    };
    let (a, b) = (logs("a.toml"), logs("b.toml"));
    assert_eq!(a.as_array().unwrap().len(), 1, "{a}");
    assert_eq!(b.as_array().unwrap().len(), 1, "{b}");
    assert_ne!(a[0]["log_path"], b[0]["log_path"]);
}

#[test]
fn two_manifests_with_the_same_pipeline_name_are_refused() {
    let p = two_pipelines();
    p.file("c.toml", &p.read("b.toml").replace("rev <", "cat"));
    p.cairn(&["-f", "b.toml", "run"]).success();
    for args in [&["-f", "c.toml", "run"][..], &["-f", "c.toml", "status"]] {
        let out = p.cairn(args);
        out.code_is(2);
        let err = out.stderr();
        assert!(
            err.contains("beta") && err.contains("b.toml") && err.contains("c.toml"),
            "{err}"
        );
    }
    assert!(!p.exists("out/beta.txt") || p.read("out/beta.txt") == "ecruos\n");
    // Once `b.toml` is renamed to another pipeline, the name is free.
    p.file(
        "b.toml",
        &p.read("b.toml").replace("\"beta\"", "\"beta-old\""),
    );
    p.cairn(&["-f", "c.toml", "status"]).code_is(1);
    p.file(
        "b.toml",
        &p.read("b.toml").replace("\"beta-old\"", "\"beta\""),
    );
    p.file("c.toml", &p.read("c.toml").replace("\"beta\"", "\"gamma\""));
    // A manifest that was moved keeps its pipeline's history.
    std::fs::rename(p.path("b.toml"), p.path("b2.toml")).unwrap();
    let run = p.cairn(&["-f", "b2.toml", "run"]);
    run.success();
    assert!(run.stderr().contains("0 ran"), "{}", run.stderr());
}

#[test]
fn a_schema_5_ledger_belongs_to_the_pipeline_that_opens_it_first() {
    let p = two_pipelines();
    p.cairn(&["-f", "a.toml", "run"]).success();
    common::downgrade_to_schema_5(&rusqlite::Connection::open(p.path("cache/ledger.db")).unwrap());
    let status = p.cairn(&["-f", "a.toml", "status"]);
    status.success();
    let run = p.cairn(&["-f", "a.toml", "run"]);
    assert!(run.stderr().contains("0 ran, 2 fresh"), "{}", run.stderr());
    let why = p.cairn(&["-f", "b.toml", "why", "build"]);
    assert!(why.stdout().contains("never run"), "{}", why.stdout());
    let version: i64 = rusqlite::Connection::open(p.path("cache/ledger.db"))
        .unwrap()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, cairn::store::LEDGER_SCHEMA_VERSION);
}
