//! `cairn import`: outcomes a team made before cairn, taken into a
//! per-item stage, reused while each item is unchanged, shown as imported,
//! replaced by `run --reverify`; a bad file is refused whole.

mod common;

use common::Project;

/// An oracle over `n` tasks, each reading its own `tasks/tN.txt`: a task
/// whose file says `broken` is `gold-fails`, any other `ok` with a JSON
/// result that names it. Every command it runs is a line in `runs.log`.
fn oracle(n: usize) -> Project {
    let p = Project::new();
    for i in 0..n {
        p.file(&format!("tasks/t{i}.txt"), &format!("task {i}\n"));
    }
    let list: String = (0..n).map(|i| format!("{{\"id\": \"t{i}\"}}\n")).collect();
    p.file("tasks.jsonl", &list);
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "adopted"

[stages.oracle]
foreach = { items = "tasks.jsonl", key = "id" }
item_inputs = ["tasks/{item.id}.txt"]
run = """
echo {item.id} >> runs.log
grep -q broken tasks/{item.id}.txt && exit 4
mkdir -p results
echo '{"task": "{item.id}", "passed": true}' > results/{item.id}.json
"""
item_result = "results/{item.id}.json"
checks = [{ result = "/passed", equals = true }]
classify = [{ exit = 4, as = "gold-fails" }]
outputs = { results = "oracle.jsonl" }
"#,
    );
    p
}

/// The first `ok` tasks are `ok`, the next `terminal` are `gold-fails`,
/// as an earlier batch judged them.
fn earlier_batches(ok: usize, terminal: usize) -> String {
    let mut lines = String::new();
    for i in 0..ok {
        lines.push_str(&format!(
            "{{\"key\": \"t{i}\", \"class\": \"ok\", \"result\": {{\"task\": \"t{i}\", \"passed\": true}}, \"source\": \"batch-{}\"}}\n",
            i % 3
        ));
    }
    for i in ok..ok + terminal {
        lines.push_str(&format!(
            "{{\"key\": \"t{i}\", \"class\": \"gold-fails\", \"source\": \"batch-3\"}}\n"
        ));
    }
    lines
}

fn runs(p: &Project) -> Vec<String> {
    if !p.exists("runs.log") {
        return Vec::new();
    }
    let mut ran = p.lines("runs.log");
    ran.sort();
    ran
}

fn item_records(p: &Project) -> Vec<serde_json::Value> {
    let show = p.cairn(&["show", "oracle", "--items", "--json"]);
    show.success();
    serde_json::from_str(&show.stdout()).unwrap()
}

fn oracle_lines(p: &Project) -> Vec<serde_json::Value> {
    p.lines("oracle.jsonl")
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn imported_outcomes_are_reused_and_only_the_new_items_run() {
    let p = oracle(300);
    p.file("earlier.jsonl", &earlier_batches(177, 103));
    let import = p.cairn(&["import", "oracle", "earlier.jsonl"]);
    import.success();
    assert!(
        import.stdout().contains("imported 280 outcome(s)")
            && import.stdout().contains("103 gold-fails, 177 ok"),
        "{}",
        import.stdout()
    );
    let status = p.cairn(&["status"]);
    assert!(
        status
            .stdout()
            .contains("300 items, 177 ok, 103 gold-fails, 20 pending; 280 outcome(s) imported"),
        "{}",
        status.stdout()
    );

    p.cairn(&["run"]).success();
    let expected: Vec<String> = {
        let mut keys: Vec<String> = (280..300).map(|i| format!("t{i}")).collect();
        keys.sort();
        keys
    };
    assert_eq!(
        runs(&p),
        expected,
        "only the items nothing was imported for"
    );
    // The merged output holds the imported verdicts and results as if
    // cairn had made them.
    let merged = oracle_lines(&p);
    assert_eq!(merged.len(), 300);
    let t5 = merged.iter().find(|r| r["key"] == "t5").unwrap();
    assert_eq!(t5["class"], "ok");
    assert_eq!(t5["result"]["task"], "t5");
    let t200 = merged.iter().find(|r| r["key"] == "t200").unwrap();
    assert_eq!(t200["class"], "gold-fails");

    // Each imported outcome says where it came from; cairn's own do not.
    let records = item_records(&p);
    let origin_of = |key: &str| {
        records.iter().find(|r| r["key"] == key).unwrap()["origin"]
            .as_str()
            .map(str::to_owned)
    };
    let imported = origin_of("t5").expect("an origin");
    assert!(imported.starts_with("import:sha256:"), "{imported}");
    assert_eq!(origin_of("t290"), None);
    let show = p.cairn(&["show", "oracle/t5"]);
    assert!(show.stdout().contains("batch-2"), "{}", show.stdout());

    // A no-op after it runs nothing.
    let again = p.cairn(&["run"]);
    again.success();
    assert_eq!(runs(&p).len(), 20, "{}", again.stderr());
}

#[test]
fn an_item_whose_inputs_or_code_changed_since_its_import_runs_and_says_why() {
    let p = oracle(4);
    p.file("earlier.jsonl", &earlier_batches(3, 1));
    p.cairn(&["import", "oracle", "earlier.jsonl"]).success();
    p.cairn(&["run"]).success();
    assert_eq!(runs(&p), Vec::<String>::new(), "every item was imported");

    // One task's file changed: only it runs, judged anew.
    p.file("tasks/t1.txt", "task 1, broken\n");
    let why = p.cairn(&["why", "oracle"]);
    assert!(why.stdout().contains("1 pending"), "{}", why.stdout());
    p.cairn(&["run"]).success();
    assert_eq!(runs(&p), ["t1"]);
    let t1 = oracle_lines(&p)
        .into_iter()
        .find(|r| r["key"] == "t1")
        .unwrap();
    assert_eq!(t1["class"], "gold-fails");

    // The stage's command changed: the import vouched for the old one, so
    // every item runs.
    let manifest = p.read("cairn.toml").replace("exit 4", "exit 4 # v2");
    p.file("cairn.toml", &manifest);
    let why = p.cairn(&["why", "oracle"]);
    assert!(
        why.stdout().contains("would run: changed: command"),
        "{}",
        why.stdout()
    );
    assert!(why.stdout().contains("4 pending"), "{}", why.stdout());
    p.cairn(&["run"]).success();
    assert_eq!(runs(&p), ["t0", "t1", "t1", "t2", "t3"]);
}

#[test]
fn reverify_runs_the_imported_items_again_and_their_outcomes_become_cairns() {
    let p = oracle(5);
    p.file("earlier.jsonl", &earlier_batches(2, 1));
    p.cairn(&["import", "oracle", "earlier.jsonl"]).success();
    p.cairn(&["run"]).success();
    assert_eq!(runs(&p), ["t3", "t4"]);

    let reverified = p.cairn(&["run", "--reverify", "oracle"]);
    reverified.success();
    assert_eq!(
        runs(&p),
        ["t0", "t1", "t2", "t3", "t4"],
        "the imported items, and only they, ran again: {}",
        reverified.stderr()
    );
    // What the earlier batch called `gold-fails`, cairn found `ok`.
    let t2 = oracle_lines(&p)
        .into_iter()
        .find(|r| r["key"] == "t2")
        .unwrap();
    assert_eq!(t2["class"], "ok");
    assert!(item_records(&p).iter().all(|r| r.get("origin").is_none()));
    let status = p.cairn(&["status"]);
    assert!(!status.stdout().contains("imported"), "{}", status.stdout());
    // The item's history keeps both: the import, then cairn's attempt.
    let show = p.cairn(&["show", "oracle/t2", "--json"]);
    let attempts: Vec<serde_json::Value> = serde_json::from_str(&show.stdout()).unwrap();
    assert_eq!(attempts.len(), 2);
    assert!(
        attempts[0]["origin"]
            .as_str()
            .is_some_and(|o| o.starts_with("import:")),
        "{attempts:?}"
    );
    assert!(attempts[1].get("origin").is_none(), "{attempts:?}");

    // Nothing imported is left: `--reverify` runs nothing more.
    p.cairn(&["run", "--reverify", "oracle"]).success();
    assert_eq!(runs(&p).len(), 5);
}

#[test]
fn a_file_with_a_bad_line_is_refused_whole_and_nothing_is_recorded() {
    let p = oracle(3);
    let before = p.cairn(&["log", "--json"]);
    let bad = [
        r#"{"key": "t0", "class": "ok", "result": {"task": "t0", "passed": true}}"#,
        r#"{"key": "t9", "class": "ok"}"#,
        r#"{"key": "t1", "class": "flaky"}"#,
        r#"{"key": "t0", "class": "gold-fails"}"#,
        r#"{"key": "t2", "class": "ok", "result": {"passed": false}}"#,
        r#"{"key": "t2", "verdict": "ok"}"#,
        "not json",
    ]
    .join("\n");
    p.file("bad.jsonl", &bad);
    let refused = p.cairn(&["import", "oracle", "bad.jsonl"]);
    refused.code_is(2);
    let err = refused.stderr();
    for expected in [
        "nothing was imported",
        "line 2: `oracle` plans no item `t9`",
        "line 3: class `flaky` is not one `oracle` can end in (it declares `ok`, `gold-fails`)",
        "line 4: item `t0` is on line 1 already",
        "line 5: its result fails the stage's check",
        "line 6, column",
        "unknown field `verdict`",
        "line 7, column 2",
    ] {
        assert!(err.contains(expected), "missing {expected:?} in:\n{err}");
    }
    // The good first line was not recorded either.
    assert!(item_records(&p).is_empty());
    assert_eq!(p.cairn(&["log", "--json"]).stdout(), before.stdout());
    p.cairn(&["run"]).success();
    assert_eq!(runs(&p), ["t0", "t1", "t2"]);

    // A stage that is not per-item, and a file that is not there, are
    // refused as clearly.
    let missing = p.cairn(&["import", "oracle", "absent.jsonl"]);
    missing.code_is(2);
    assert!(
        missing.stderr().contains("cannot import `absent.jsonl`"),
        "{}",
        missing.stderr()
    );
}
