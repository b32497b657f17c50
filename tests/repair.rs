//! Damage in the store is repaired: `cairn audit --repair` re-stores damaged
//! objects from workspace copies that still match, and sets aside the
//! results nothing can vouch for any more, so the next `run` re-runs exactly
//! those stages. Tamper tests flip real bytes in `cache/objects/`.

mod common;

use common::Project;

/// `big` writes a file too large to live inside the ledger; `tree` a
/// directory of three files. Each appends its name to `runs.log` when it runs.
fn project() -> Project {
    let p = Project::new();
    p.file("data/in.txt", "input\n");
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "repaired"

[stages.big]
run = "echo big >> runs.log; awk 'BEGIN {for (i = 0; i < 3000; i++) print \"a line of text\"}' > {out.o}; cat {in.x} >> {out.o}"
inputs = { x = "data/in.txt" }
outputs = { o = "state/big.txt" }

[stages.tree]
run = "echo tree >> runs.log; mkdir -p {out.d} && echo a > {out.d}/a.txt && echo b > {out.d}/b.txt && wc -l < {in.b} > {out.d}/c.txt"
inputs = { b = "state/big.txt" }
outputs = { d = "state/tree" }
"#,
    );
    p.cairn(&["run"]).success();
    assert_eq!(p.lines("runs.log"), ["big", "tree"]);
    p
}

fn flip(path: &std::path::Path) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[0] ^= 0x01;
    std::fs::write(path, bytes).unwrap();
}

/// Where the store keeps the object with the bytes of workspace file `rel`.
fn object_of(p: &Project, rel: &str) -> std::path::PathBuf {
    let hex = blake3::hash(&std::fs::read(p.path(rel)).unwrap())
        .to_hex()
        .to_string();
    let object = p.path("cache/objects").join(&hex[..2]).join(&hex[2..]);
    assert!(object.exists(), "no stored object for {rel}");
    object
}

fn mismatch_count(p: &Project) -> usize {
    let audit = p.cairn(&["audit", "--json"]);
    let json: serde_json::Value = serde_json::from_str(&audit.stdout())
        .unwrap_or_else(|e| panic!("audit --json: {e}\n{}", audit.stderr()));
    json["mismatches"].as_array().unwrap().len()
}

fn stage_status(p: &Project, stage: &str) -> serde_json::Value {
    let status = p.cairn(&["status", "--json"]);
    let json: serde_json::Value = serde_json::from_str(&status.stdout())
        .unwrap_or_else(|e| panic!("status --json: {e}\n{}", status.stderr()));
    json["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["stage"] == stage)
        .cloned()
        .unwrap()
}

#[test]
fn audit_repair_restores_a_damaged_object_from_the_workspace_copy() {
    let p = project();
    flip(&object_of(&p, "state/big.txt"));
    assert_eq!(mismatch_count(&p), 1);

    let repair = p.cairn(&["audit", "--repair"]);
    repair.success();
    assert!(repair.stdout().contains("re-stored"), "{}", repair.stdout());
    assert_eq!(mismatch_count(&p), 0);
    p.cairn(&["run"]).success();
    assert_eq!(p.lines("runs.log"), ["big", "tree"], "nothing re-ran");
}

#[test]
fn audit_repair_sets_aside_a_result_with_no_good_copy_left() {
    let p = project();
    flip(&object_of(&p, "state/big.txt"));
    flip(&p.path("state/big.txt"));

    p.cairn(&["audit", "--repair"]).success();
    let big = stage_status(&p, "big");
    assert_eq!(big["state"], "stale", "{big}");
    assert_eq!(big["reason"]["reason"], "store-incomplete", "{big}");

    p.cairn(&["run"]).success();
    // The re-run writes the same bytes: nothing downstream runs.
    assert_eq!(p.lines("runs.log"), ["big", "tree", "big"]);
    assert_eq!(mismatch_count(&p), 0);
}

#[test]
fn audit_repair_handles_three_damaged_files_of_a_directory_in_one_pass() {
    let p = project();
    for file in ["a.txt", "b.txt", "c.txt"] {
        flip(&object_of(&p, &format!("state/tree/{file}")));
    }
    std::fs::remove_dir_all(p.path("state/tree")).unwrap();
    assert!(mismatch_count(&p) >= 3);

    p.cairn(&["audit", "--repair"]).success();
    let tree = stage_status(&p, "tree");
    assert_eq!(tree["reason"]["reason"], "store-incomplete", "{tree}");
    p.cairn(&["run"]).success();
    assert_eq!(p.lines("runs.log"), ["big", "tree", "tree"], "one re-run");
    assert_eq!(mismatch_count(&p), 0);
    p.cairn(&["run"]).success();
    assert_eq!(p.lines("runs.log"), ["big", "tree", "tree"]);
}

#[test]
fn run_finds_every_damaged_file_of_a_directory_output_at_once() {
    let p = project();
    for file in ["a.txt", "b.txt", "c.txt"] {
        flip(&object_of(&p, &format!("state/tree/{file}")));
    }
    std::fs::remove_dir_all(p.path("state/tree")).unwrap();

    p.cairn(&["run"]).success();
    assert_eq!(p.lines("runs.log"), ["big", "tree", "tree"]);
    // The re-run stored every damaged file afresh, not only the first found.
    assert_eq!(mismatch_count(&p), 0);
    std::fs::remove_dir_all(p.path("state/tree")).unwrap();
    p.cairn(&["run"]).success();
    assert_eq!(p.lines("runs.log"), ["big", "tree", "tree"], "restored");
}

#[test]
fn an_unreadable_outputs_record_is_an_error_never_a_fresh_hit() {
    let p = project();
    let db = rusqlite::Connection::open(p.path("cache/ledger.db")).unwrap();
    db.execute(
        "UPDATE results SET outputs_json = '[{\"name\": ' WHERE stage = 'big'",
        [],
    )
    .unwrap();
    drop(db);

    for command in [&["status"][..], &["run"]] {
        let out = p.cairn(command);
        assert_ne!(out.code(), 0, "{command:?}: {}", out.stdout());
        assert!(
            out.stderr().contains("`big`") && out.stderr().contains("audit --repair"),
            "{command:?}: {}",
            out.stderr()
        );
    }
    assert_eq!(p.lines("runs.log"), ["big", "tree"]);

    let audit = p.cairn(&["audit"]);
    assert_eq!(audit.code(), 1, "{}", audit.stdout());
    assert!(audit.stdout().contains("record"), "{}", audit.stdout());
    p.cairn(&["audit", "--repair"]).success();
    let big = stage_status(&p, "big");
    assert_ne!(big["state"], "fresh", "{big}");
    assert!(
        big["reason"].to_string().contains("could not be read"),
        "{big}"
    );
    p.cairn(&["run"]).success();
    assert_eq!(p.lines("runs.log"), ["big", "tree", "big"]);
    assert_eq!(mismatch_count(&p), 0);
}

#[test]
fn a_damaged_inline_object_with_no_good_copy_makes_its_stage_run_again() {
    let p = Project::new();
    p.file("data/in.txt", "small input\n");
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "inline"

[stages.small]
run = "echo small >> runs.log; cp {in.x} {out.o}"
inputs = { x = "data/in.txt" }
outputs = { o = "state/small.txt" }
"#,
    );
    p.cairn(&["run"]).success();
    let db = rusqlite::Connection::open(p.path("cache/ledger.db")).unwrap();
    db.execute("UPDATE objects SET bytes = x'00'", []).unwrap();
    drop(db);
    std::fs::remove_file(p.path("state/small.txt")).unwrap();

    p.cairn(&["audit", "--repair"]).success();
    let small = stage_status(&p, "small");
    assert_eq!(small["reason"]["reason"], "store-incomplete", "{small}");
    p.cairn(&["run"]).success();
    assert_eq!(p.lines("runs.log"), ["small", "small"]);
    assert_eq!(p.read("state/small.txt"), "small input\n");
    assert_eq!(mismatch_count(&p), 0);
}

#[test]
fn audit_repair_reruns_only_the_item_whose_entry_has_no_good_copy() {
    let p = Project::new();
    for i in 1..=3 {
        p.file(&format!("src/t{i}.txt"), &format!("task {i}\n"));
    }
    p.file(
        "list.jsonl",
        "{\"id\": \"t1\"}\n{\"id\": \"t2\"}\n{\"id\": \"t3\"}\n",
    );
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "items"

[stages.materialize]
foreach = { items = "list.jsonl", key = "id" }
item_inputs = ["src/{item.id}.txt"]
item_outputs = { tasks = "{item.id}" }
run = "echo {item.id} >> runs.log; mkdir -p {out.tasks}/{item.id} && cp src/{item.id}.txt {out.tasks}/{item.id}/task.txt"
outputs = { results = "state/materialize.jsonl", tasks = "state/tasks" }
"#,
    );
    p.cairn(&["run"]).success();
    assert_eq!(p.lines("runs.log").len(), 3);
    flip(&object_of(&p, "state/tasks/t2/task.txt"));
    flip(&p.path("state/tasks/t2/task.txt"));

    p.cairn(&["audit", "--repair"]).success();
    let stage = stage_status(&p, "materialize");
    assert_eq!(stage["reason"]["reason"], "store-incomplete", "{stage}");
    p.cairn(&["run"]).success();
    assert_eq!(p.lines("runs.log")[3..], ["t2"], "only the damaged item");
    assert_eq!(p.read("state/tasks/t2/task.txt"), "task 2\n");
    assert_eq!(mismatch_count(&p), 0);
}

#[test]
fn an_inline_object_of_the_wrong_type_is_damage_not_a_ledger_error() {
    let p = Project::new();
    p.file("data/in.txt", "small input\n");
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "inline"

[stages.small]
run = "echo small >> runs.log; cp {in.x} {out.o}"
inputs = { x = "data/in.txt" }
outputs = { o = "state/small.txt" }
"#,
    );
    p.cairn(&["run"]).success();
    let db = rusqlite::Connection::open(p.path("cache/ledger.db")).unwrap();
    db.execute("UPDATE objects SET bytes = 'text, not bytes'", [])
        .unwrap();
    drop(db);
    std::fs::remove_file(p.path("state/small.txt")).unwrap();

    p.cairn(&["run"]).success();
    assert_eq!(p.lines("runs.log"), ["small", "small"]);
    assert_eq!(p.read("state/small.txt"), "small input\n");
}
