//! CI gates: `status` exit codes, `--locked`, the verified lock file and
//! `verify --lock`.

mod common;

use common::Project;

fn project() -> Project {
    let p = Project::new();
    p.file("src.txt", "v1\n");
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "gated"

[stages.copy]
run = "echo run >> ran.log; cat {in.src} > {out.o}"
inputs = { src = "src.txt" }
outputs = { o = "out/copy.txt" }

[stages.tree]
run = "mkdir -p {out.d}; cat {in.c} > {out.d}/a; echo b > {out.d}/b"
inputs = { c = "out/copy.txt" }
outputs = { d = "out/tree" }
"#,
    );
    p
}

#[test]
fn status_exit_codes_let_ci_gate_on_it() {
    let p = project();
    p.cairn(&["status"]).code_is(1);
    p.cairn(&["run"]).success();
    p.cairn(&["status"]).success();
    p.cairn(&["status", "--json"]).success();
    // An output edited in the workspace would be restored: not settled.
    p.file("out/copy.txt", "edited\n");
    p.cairn(&["status"]).code_is(1);
    p.cairn(&["run"]).success();
    p.cairn(&["status"]).success();
    // An input edited: a stage would run.
    p.file("src.txt", "v2\n");
    p.cairn(&["status"]).code_is(1);
    p.cairn(&["status", "--json"]).code_is(1);
    // A stage that failed.
    let broken = p
        .read("cairn.toml")
        .replace("cat {in.src} >", "exit 1; cat {in.src} >");
    p.file("cairn.toml", &broken);
    p.cairn(&["run"]).code_is(1);
    let status = p.cairn(&["status"]);
    status.code_is(1);
    assert!(status.stdout().contains("failed"), "{}", status.stdout());
}

#[test]
fn locked_refuses_a_result_that_differs_from_the_committed_lock() {
    let p = project();
    // No lock file yet: nothing matches it.
    p.cairn(&["status", "--locked"]).code_is(3);
    p.cairn(&["run"]).success();
    let committed = p.read("cairn.lock");
    p.cairn(&["status", "--locked"]).success();
    p.cairn(&["run", "--locked"]).success();

    p.file("src.txt", "v2\n");
    let status = p.cairn(&["status", "--locked"]);
    status.code_is(3);
    assert!(
        status.stderr().contains("`copy` has fingerprint"),
        "{}",
        status.stderr()
    );
    let run = p.cairn(&["run", "--locked"]);
    run.code_is(3);
    assert!(run.stderr().contains("cairn.lock"), "{}", run.stderr());
    assert_eq!(p.lines("ran.log").len(), 1, "nothing may run");
    assert_eq!(p.read("cairn.lock"), committed);
    let dry = p.cairn(&["run", "-n", "--locked"]);
    dry.code_is(3);

    // Back to the committed inputs: a fresh machine (no cache) re-runs
    // and reproduces exactly what the lock records.
    p.file("src.txt", "v1\n");
    std::fs::remove_dir_all(p.path("cache")).unwrap();
    std::fs::remove_dir_all(p.path("out")).unwrap();
    p.cairn(&["run", "--locked"]).success();
    assert_eq!(p.lines("ran.log").len(), 2);
    assert_eq!(p.read("cairn.lock"), committed);
}

#[test]
fn locked_run_fails_when_a_rerun_does_not_reproduce_the_lock() {
    let p = project();
    p.cairn(&["run"]).success();
    let committed = p.read("cairn.lock");
    // Same fingerprint, different bytes: the store is gone and the stage
    // is not reproducible.
    std::fs::remove_dir_all(p.path("cache")).unwrap();
    let nondeterministic = p
        .read("cairn.toml")
        .replace("echo b > {out.d}/b", "date +%s%N > {out.d}/b");
    // The command enters the fingerprint, so write the lock for it first.
    p.file("cairn.toml", &nondeterministic);
    p.cairn(&["run"]).success();
    let committed_now = p.read("cairn.lock");
    assert_ne!(committed, committed_now);
    std::fs::remove_dir_all(p.path("cache")).unwrap();
    let run = p.cairn(&["run", "--locked"]);
    run.code_is(3);
    assert!(run.stderr().contains("`tree`"), "{}", run.stderr());
    assert_eq!(
        p.read("cairn.lock"),
        committed_now,
        "the lock is never rewritten"
    );
}

#[test]
fn a_hand_edited_or_unparsable_lock_is_reported() {
    let p = project();
    p.cairn(&["run"]).success();
    let lock = p.read("cairn.lock");
    let digest = lock
        .lines()
        .find(|l| l.starts_with("digest = "))
        .unwrap()
        .to_owned();
    p.file(
        "cairn.lock",
        &lock.replacen(
            &digest,
            "digest = \"blake3:0000000000000000000000000000000000000000000000000000000000000000\"",
            1,
        ),
    );
    let status = p.cairn(&["status"]);
    assert!(
        status.stderr().contains("edited by hand"),
        "{}",
        status.stderr()
    );
    p.cairn(&["status", "--locked"]).code_is(3);
    let audit = p.cairn(&["audit"]);
    audit.code_is(1);
    assert!(audit.stdout().contains("cairn.lock"), "{}", audit.stdout());
    p.cairn(&["verify", "--lock"]).code_is(2);
    // A run rewrites it from the ledger.
    p.cairn(&["run"]).success();
    assert_eq!(p.read("cairn.lock"), lock);
    let status = p.cairn(&["status"]);
    assert!(!status.stderr().contains("warning"), "{}", status.stderr());

    p.file("cairn.lock", "version = 2\npipeline = [\n");
    let status = p.cairn(&["status"]);
    assert!(
        status.stderr().contains("cannot be parsed"),
        "{}",
        status.stderr()
    );
    let verify = p.cairn(&["verify", "--lock"]);
    verify.code_is(2);
    assert!(
        verify.stderr().contains("cairn.lock"),
        "{}",
        verify.stderr()
    );
}

#[test]
fn verify_lock_rehashes_a_checkout_without_a_cache() {
    let p = project();
    p.cairn(&["run"]).success();
    // A collaborator's checkout: the manifest, the lock and the outputs,
    // no cache.
    std::fs::remove_dir_all(p.path("cache")).unwrap();
    let ok = p.cairn(&["verify", "--lock"]);
    ok.success();
    assert!(
        ok.stdout().contains("3 output(s)") || ok.stdout().contains("2 output(s)"),
        "{}",
        ok.stdout()
    );
    assert!(!p.exists("cache"), "verify --lock writes nothing");
    // Named explicitly, from another directory.
    std::fs::create_dir_all(p.path("elsewhere")).unwrap();
    let lock = p.path("cairn.lock").display().to_string();
    let output = p
        .command(&["verify", "--lock", &lock, "--json"])
        .current_dir(p.path("elsewhere"))
        .output()
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        report["mismatches"].as_array().unwrap().len(),
        0,
        "{report}"
    );
    // A file changed inside an output directory, and one removed.
    p.file("out/tree/b", "changed\n");
    std::fs::remove_file(p.path("out/copy.txt")).unwrap();
    let bad = p.cairn(&["verify", "--lock", "--json"]);
    bad.code_is(1);
    let report: serde_json::Value = serde_json::from_str(&bad.stdout()).unwrap();
    let paths: Vec<&str> = report["mismatches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["out/copy.txt", "out/tree"], "{report}");
    assert_eq!(report["mismatches"][0]["actual"], "missing");
}

#[test]
fn the_shipped_lock_files_pass_their_checksums() {
    for name in ["mini-curation", "swesmith-curation"] {
        let lock = format!("{}/pipelines/{name}.lock", env!("CARGO_MANIFEST_DIR"));
        let p = Project::new();
        let out = p.cairn(&["verify", "--lock", &lock, "--json"]);
        // The outputs are not built here (exit 1); the file itself must be
        // trusted (a merge that left a stale checksum is exit 2).
        assert!(
            !out.stderr().contains("cannot be trusted"),
            "{name}: {}",
            out.stderr()
        );
        let report: serde_json::Value = serde_json::from_str(&out.stdout()).unwrap();
        assert_eq!(report["pipeline"], name);
    }
}
