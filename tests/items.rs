//! Per-item (`foreach`) stages: the incremental oracle.

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::Project;

/// An oracle over `n` tasks. An item's command:
/// - fails once with exit 75 (infra) if `flaky-KEY` exists (and removes it),
///   or always while `down-KEY` exists;
/// - exits 1 (a `rejected` verdict) if its test file says `broken`;
/// - prints nothing for `empty-KEY` (a false success the check catches).
fn oracle(n: usize) -> Project {
    let p = Project::new();
    for i in 1..=n {
        p.file(&format!("tasks/t{i}/test.txt"), &format!("task {i}\n"));
    }
    let list: String = (1..=n)
        .map(|i| format!("{{\"task_id\": \"t{i}\", \"dir\": \"tasks/t{i}\"}}\n"))
        .collect();
    p.file("state/tasks.jsonl", &list);
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "oracle"

[stages.oracle]
foreach = { items = "state/tasks.jsonl", key = "task_id" }
item_inputs = ["{item.dir}"]
run = """
echo {item.task_id} >> runs.log
if [ -f flaky-{item.task_id} ]; then rm flaky-{item.task_id}; echo PodReadyTimeout >&2; exit 75; fi
if [ -f down-{item.task_id} ]; then echo 'cluster out of cpu' >&2; exit 1; fi
mkdir -p trajectories
if [ -f empty-{item.task_id} ]; then : > trajectories/{item.task_id}; else echo turn > trajectories/{item.task_id}; fi
grep -q broken {item.dir}/test.txt && exit 1
exit 0
"""
checks = ["test -s trajectories/{item.task_id}"]
classify = [
  { exit = 75, as = "infra" },
  { exit = 1, output = "out of cpu", as = "infra" },
  { exit = 1, as = "rejected" },
]
retry = { max = 2, on = ["infra"] }
outputs = { results = "state/oracle.jsonl" }
"#,
    );
    p
}

fn runs_of(p: &Project, key: &str) -> usize {
    p.lines("runs.log").iter().filter(|l| *l == key).count()
}

fn attempts(p: &Project, item: &str) -> serde_json::Value {
    let show = p.cairn(&["show", item, "--json"]);
    show.success();
    serde_json::from_str(&show.stdout()).unwrap()
}

#[test]
fn an_infra_failure_is_retried_and_then_recorded_ok_with_two_attempts() {
    let p = oracle(3);
    p.file("flaky-t2", "");
    p.cairn(&["run"]).success();
    let t2 = attempts(&p, "oracle/t2");
    let classes: Vec<&str> = t2
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["class"].as_str().unwrap())
        .collect();
    assert_eq!(classes, ["infra", "ok"]);
    assert_eq!(t2[0]["exit_code"], 75);
    assert!(
        p.read("state/oracle.jsonl")
            .contains(r#""class":"ok","item":{"dir":"tasks/t2","task_id":"t2"},"key":"t2""#)
    );
}

#[test]
fn verdicts_are_final_and_never_retried() {
    let p = oracle(3);
    p.file("tasks/t3/test.txt", "broken\n");
    p.cairn(&["run"]).success();
    assert_eq!(runs_of(&p, "t3"), 1, "a verdict is not retried");
    assert!(
        p.read("state/oracle.jsonl")
            .contains(r#""class":"rejected""#)
    );
    // Nor re-run later: the verdict is reused...
    p.cairn(&["run"]).success();
    assert_eq!(runs_of(&p, "t3"), 1);
    // ...unless the item is forced.
    p.cairn(&["run", "--force", "oracle/t3"]).success();
    assert_eq!(runs_of(&p, "t3"), 2);
}

#[test]
fn infra_that_exhausts_its_retries_stays_infra_and_a_later_run_retries_it() {
    let p = oracle(3);
    p.file("down-t1", "");
    let run = p.cairn(&["run"]);
    run.code_is(1);
    assert!(
        run.stderr().contains("still failing on infrastructure"),
        "{}",
        run.stderr()
    );
    assert_eq!(runs_of(&p, "t1"), 3, "1 attempt + 2 retries");
    let status = p.cairn(&["status", "--json"]);
    let json: serde_json::Value = serde_json::from_str(&status.stdout()).unwrap();
    let items = &json["stages"][0]["items"];
    assert_eq!(items["infra"], 1, "{json}");
    assert_eq!(items["ok"], 2);
    assert!(
        items["verdicts"].as_object().unwrap().is_empty(),
        "infra is never a verdict: {json}"
    );

    std::fs::remove_file(p.path("down-t1")).unwrap();
    p.cairn(&["run"]).success();
    assert_eq!(runs_of(&p, "t1"), 4);
    assert_eq!(runs_of(&p, "t2"), 1, "finished items are not re-run");
}

#[test]
fn a_false_success_caught_by_a_check_is_an_error() {
    let p = oracle(2);
    p.file("empty-t2", "");
    let run = p.cairn(&["run"]);
    run.code_is(1);
    assert!(
        run.stderr().contains("1 item(s) ended in error"),
        "{}",
        run.stderr()
    );
    let t2 = attempts(&p, "oracle/t2");
    assert_eq!(t2[0]["class"], "error");
    assert!(
        t2[0]["rule"]
            .as_str()
            .unwrap()
            .contains("test -s trajectories/t2"),
        "{t2}"
    );
}

#[test]
fn editing_one_items_input_reruns_that_item_only() {
    let p = oracle(4);
    p.cairn(&["run"]).success();
    p.file("tasks/t3/test.txt", "task 3, edited\n");
    let why = p.cairn(&["why", "oracle"]);
    assert!(
        why.stdout().contains("to run: t3 (pending)"),
        "{}",
        why.stdout()
    );
    p.cairn(&["run"]).success();
    for (key, runs) in [("t1", 1), ("t2", 1), ("t3", 2), ("t4", 1)] {
        assert_eq!(runs_of(&p, key), runs, "{key}");
    }
}

#[test]
fn added_items_run_alone_and_removed_items_leave_the_results() {
    let p = oracle(3);
    p.cairn(&["run"]).success();
    p.file("tasks/t9/test.txt", "task 9\n");
    let list = p
        .read("state/tasks.jsonl")
        .replace("{\"task_id\": \"t1\", \"dir\": \"tasks/t1\"}\n", "")
        + "{\"task_id\": \"t9\", \"dir\": \"tasks/t9\"}\n";
    p.file("state/tasks.jsonl", &list);
    p.cairn(&["run"]).success();
    let mut runs = p.lines("runs.log");
    runs.sort();
    assert_eq!(runs, ["t1", "t2", "t3", "t9"]);
    let results = p.read("state/oracle.jsonl");
    assert!(
        !results.contains("\"t1\"") && results.contains("\"t9\""),
        "{results}"
    );
    // The removed item's history is kept.
    assert_eq!(attempts(&p, "oracle/t1").as_array().unwrap().len(), 1);
}

#[test]
fn limit_batches_converge_to_zero_pending() {
    let p = oracle(7);
    let mut batches = 0;
    loop {
        batches += 1;
        assert!(batches <= 4, "did not converge");
        let run = p.cairn(&["run", "--limit", "3"]);
        run.success();
        let status = p.cairn(&["status", "--json"]);
        let json: serde_json::Value = serde_json::from_str(&status.stdout()).unwrap();
        if json["stages"][0]["state"] == "fresh" {
            assert_eq!(json["stages"][0]["items"]["pending"], 0);
            break;
        }
        assert!(run.stderr().contains("partial"), "{}", run.stderr());
    }
    assert_eq!(batches, 3, "7 items in batches of 3");
    assert_eq!(p.lines("runs.log").len(), 7, "every item ran exactly once");
}

#[test]
fn the_merged_results_do_not_depend_on_completion_order() {
    let run_with = |jobs: &str, delays: &[(&str, &str)]| {
        let p = oracle(6);
        for (key, delay) in delays {
            p.file(&format!("tasks/{key}/delay"), delay);
        }
        let manifest = p.read("cairn.toml").replace(
            "echo {item.task_id} >> runs.log\n",
            "echo {item.task_id} >> runs.log\nsleep $(cat {item.dir}/delay 2>/dev/null || echo 0)\necho {item.task_id} >> done.log\n",
        );
        p.file("cairn.toml", &manifest);
        p.cairn(&["run", "-j", jobs]).success();
        (
            p.lines("done.log"),
            std::fs::read(p.path("state/oracle.jsonl")).unwrap(),
        )
    };
    let (order_a, bytes_a) = run_with("1", &[]);
    let (order_b, bytes_b) = run_with("6", &[("t1", "0.3"), ("t2", "0.2"), ("t3", "0.1")]);
    assert_ne!(
        order_a, order_b,
        "the items must finish in different orders for this test to mean anything"
    );
    assert_eq!(bytes_a, bytes_b);
}

#[test]
fn kill_9_mid_batch_keeps_every_finished_item() {
    let p = oracle(6);
    // t4 blocks until released; the others finish first.
    let manifest = p.read("cairn.toml").replace(
        "echo {item.task_id} >> runs.log\n",
        "echo {item.task_id} >> runs.log\nif [ {item.task_id} = t4 ]; then while [ ! -f release ]; do sleep 0.02; done; fi\n",
    );
    p.file("cairn.toml", &manifest);
    let mut cairn = p
        .command(&["run", "-j", "2"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while p.lines("runs.log").len() < 6 {
        assert!(Instant::now() < deadline, "items did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Every item but t4 has finished; wait for their records to land.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = p.cairn(&["status", "--json"]);
        let json: serde_json::Value = serde_json::from_str(&status.stdout()).unwrap_or_default();
        if json["stages"][0]["items"]["ok"] == 5 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "finished items were not recorded"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    cairn.kill().unwrap();
    cairn.wait().unwrap();

    p.file("release", "");
    p.cairn(&["run"]).success();
    assert_eq!(runs_of(&p, "t4"), 2, "the interrupted item runs again");
    for key in ["t1", "t2", "t3", "t5", "t6"] {
        assert_eq!(runs_of(&p, key), 1, "{key} was finished and kept");
    }
}

#[test]
fn items_read_from_an_upstream_output() {
    let p = oracle(2);
    let manifest = p.read("cairn.toml").replace(
        "foreach = { items = \"state/tasks.jsonl\", key = \"task_id\" }",
        "foreach = { items = \"{plan.out.list}\", key = \"task_id\" }",
    ) + "\n[stages.plan]\nrun = \"cp tasks.in {out.list}\"\ninputs = [\"tasks.in\"]\noutputs = { list = \"state/planned.jsonl\" }\n";
    p.file("tasks.in", &p.read("state/tasks.jsonl"));
    p.file("cairn.toml", &manifest);
    let dag = p.cairn(&["dag"]);
    assert!(dag.stdout().contains("oracle ← plan"), "{}", dag.stdout());
    p.cairn(&["run"]).success();
    assert_eq!(p.lines("runs.log").len(), 2);
}

/// A canary-like stage whose items write a JSON result.
fn canary() -> Project {
    let p = Project::new();
    let list: String = ["c1", "c2", "c3", "c4"]
        .iter()
        .map(|k| format!("{{\"id\": \"{k}\"}}\n"))
        .collect();
    p.file("list.jsonl", &list);
    // c1 passes with 3 turns; c2 fails its tests; c3 "passes" with an empty
    // trajectory; c4 writes no result at all.
    p.file("answers/c1", r#"{"reward": 1, "turns": 3}"#);
    p.file("answers/c2", r#"{"reward": 0, "turns": 5}"#);
    p.file("answers/c3", r#"{"reward": 1, "turns": 0}"#);
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "canary"

[stages.canary]
foreach = { items = "list.jsonl", key = "id" }
run = "mkdir -p results && if [ -f answers/{item.id} ]; then cp answers/{item.id} results/{item.id}.json; fi"
item_result = "results/{item.id}.json"
checks = [ { result = "/turns", min = 1 } ]
classify = [ { result = "/reward", equals = 0, as = "failed-tests" } ]
allow_errors = 2
outputs = { results = "state/canary.jsonl" }
"#,
    );
    p
}

#[test]
fn json_results_classify_items_and_checks_catch_false_successes() {
    let p = canary();
    p.cairn(&["run"]).success();
    let results = p.read("state/canary.jsonl");
    let class = |key: &str| -> String {
        results
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .find(|v| v["key"] == key)
            .map(|v| v["class"].as_str().unwrap().to_owned())
            .unwrap()
    };
    assert_eq!(class("c1"), "ok");
    assert_eq!(
        class("c2"),
        "failed-tests",
        "a verdict from the JSON result"
    );
    assert_eq!(
        class("c3"),
        "error",
        "an empty trajectory is an error, not a pass"
    );
    assert_eq!(class("c4"), "error", "no result is an error");
    assert!(
        results.contains(r#""result":{"reward":1,"turns":3}"#),
        "{results}"
    );
    let c3 = attempts(&p, "canary/c3");
    assert!(c3[0]["rule"].as_str().unwrap().contains("/turns"), "{c3}");
    let c4 = attempts(&p, "canary/c4");
    assert!(
        c4[0]["rule"].as_str().unwrap().contains("was not written"),
        "{c4}"
    );
}

#[test]
fn only_infra_retries_just_the_infra_items() {
    let p = oracle(4);
    p.file("down-t2", "");
    p.file("tasks/t4/test.txt", "broken\n");
    p.cairn(&["run"]).code_is(1);
    std::fs::remove_file(p.path("down-t2")).unwrap();
    // Make t3 pending again (edited) — `--only infra` must leave it alone.
    p.file("tasks/t3/test.txt", "task 3, edited\n");
    let run = p.cairn(&["run", "--only", "infra"]);
    run.success();
    assert!(run.stderr().contains("partial"), "{}", run.stderr());
    assert_eq!(runs_of(&p, "t2"), 4, "3 attempts, then the retry");
    assert_eq!(runs_of(&p, "t3"), 1, "the pending item waits");
    assert_eq!(runs_of(&p, "t4"), 1, "a verdict is never retried");
}

#[test]
fn a_broken_item_list_is_named_by_status_and_fails_the_run() {
    let p = oracle(2);
    p.file(
        "state/tasks.jsonl",
        "{\"task_id\": \"t1\", \"dir\": \"tasks/t1\"}\n{\"dir\": \"tasks/t2\"}\n",
    );
    let status = p.cairn(&["status"]);
    status.code_is(1);
    assert!(
        status.stdout().contains("cannot be fingerprinted: item 2"),
        "{}",
        status.stdout()
    );
    // A list no stage writes is read before anything runs: bad input.
    let run = p.cairn(&["run"]);
    run.code_is(2);
    assert!(
        run.stderr()
            .contains("has no string or number field `task_id`"),
        "{}",
        run.stderr()
    );
    p.file("state/tasks.jsonl", "{\"task_id\": \"t1\", \"dir\": \"tasks/t1\"}\n{\"task_id\": \"t1\", \"dir\": \"tasks/t2\"}\n");
    let run = p.cairn(&["run"]);
    run.code_is(2);
    assert!(
        run.stderr().contains("share the key `t1`"),
        "{}",
        run.stderr()
    );
}

#[test]
fn each_item_records_the_stage_code_that_produced_it() {
    let p = oracle(3);
    p.cairn(&["run"]).success();
    let code = |p: &Project| -> String {
        let show = p.cairn(&["show", "oracle", "--json"]);
        show.success();
        let json: serde_json::Value = serde_json::from_str(&show.stdout()).unwrap();
        json["code"].as_str().unwrap().to_owned()
    };
    let first = code(&p);
    // A new version of the stage's code, run on one item only.
    let manifest = p.read("cairn.toml").replace("echo turn", "echo turn v2");
    p.file("cairn.toml", &manifest);
    let second = code(&p);
    assert_ne!(first, second);
    p.cairn(&["run", "--limit", "1"]).success();

    let produced_by = |code: &str| -> Vec<String> {
        let out = p.cairn(&["show", "oracle", "--items", "--code", code, "--json"]);
        out.success();
        let json: serde_json::Value = serde_json::from_str(&out.stdout()).unwrap();
        json.as_array()
            .unwrap()
            .iter()
            .map(|r| r["key"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(produced_by(&first), ["t1", "t2", "t3"]);
    assert_eq!(produced_by(&second), ["t1"]);
    // A prefix without `blake3:` works too.
    let prefix = &second["blake3:".len().."blake3:".len() + 12];
    assert_eq!(produced_by(prefix), ["t1"]);
    // And each attempt carries its code.
    let attempts = attempts(&p, "oracle/t1");
    let codes: Vec<&str> = attempts
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["code"].as_str().unwrap())
        .collect();
    assert_eq!(codes, [first.as_str(), second.as_str()]);
}

#[test]
fn a_schema_3_ledger_is_migrated_and_keeps_its_history() {
    let p = oracle(2);
    p.cairn(&["run"]).success();
    {
        let db = rusqlite::Connection::open(p.path("cache/ledger.db")).unwrap();
        common::downgrade_to_schema_5(&db);
        db.execute_batch(
            "ALTER TABLE items DROP COLUMN code; ALTER TABLE items DROP COLUMN outputs; ALTER TABLE item_attempts DROP COLUMN code; PRAGMA user_version = 3;",
        )
        .unwrap();
    }
    let out = p.cairn(&["run"]);
    out.success();
    assert!(out.stderr().contains("0 ran, 1 fresh"), "{}", out.stderr());
    let out = p.cairn(&["show", "oracle", "--items", "--json"]);
    out.success();
    let records: serde_json::Value = serde_json::from_str(&out.stdout()).unwrap();
    assert_eq!(records.as_array().unwrap().len(), 2);
    assert!(records[0]["code"].is_null(), "{records}");
    let version: i64 = rusqlite::Connection::open(p.path("cache/ledger.db"))
        .unwrap()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, cairn::store::LEDGER_SCHEMA_VERSION);
}

/// A per-item stage whose items each write a directory (`item_outputs`).
fn materializer(n: usize) -> Project {
    let p = Project::new();
    for i in 1..=n {
        p.file(&format!("src/t{i}.txt"), &format!("task {i}\n"));
    }
    let list: String = (1..=n).map(|i| format!("{{\"id\": \"t{i}\"}}\n")).collect();
    p.file("list.jsonl", &list);
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "materialize"

[stages.materialize]
foreach = { items = "list.jsonl", key = "id" }
item_inputs = ["src/{item.id}.txt"]
item_outputs = { tasks = "{item.id}" }
run = "echo {item.id} >> runs.log; mkdir -p {out.tasks}/{item.id} && cp src/{item.id}.txt {out.tasks}/{item.id}/task.txt"
outputs = { results = "state/materialize.jsonl", tasks = "state/tasks" }

[stages.count]
run = "ls {in.tasks} | wc -l > {out.n}"
inputs = { tasks = "state/tasks" }
outputs = { n = "state/n.txt" }
"#,
    );
    p
}

#[test]
fn item_outputs_are_kept_per_item_restored_and_pruned() {
    let p = materializer(4);
    p.cairn(&["run"]).success();
    assert_eq!(p.read("state/n.txt").trim(), "4");
    assert_eq!(p.read("state/tasks/t2/task.txt"), "task 2\n");

    // One item's input changes, and another item's output is tampered
    // with meanwhile: only the first item runs, the second is restored.
    p.file("src/t3.txt", "task 3, edited\n");
    p.file("state/tasks/t1/task.txt", "tampered\n");
    std::fs::write(p.path("runs.log"), "").unwrap();
    p.cairn(&["run"]).success();
    assert_eq!(p.lines("runs.log"), ["t3"]);
    assert_eq!(p.read("state/tasks/t3/task.txt"), "task 3, edited\n");
    assert_eq!(p.read("state/tasks/t1/task.txt"), "task 1\n");

    // An item leaves the list: its directory leaves the output.
    p.file(
        "list.jsonl",
        "{\"id\": \"t1\"}\n{\"id\": \"t2\"}\n{\"id\": \"t3\"}\n",
    );
    p.file("state/tasks/stray/junk.txt", "junk\n");
    std::fs::write(p.path("runs.log"), "").unwrap();
    p.cairn(&["run"]).success();
    assert!(p.lines("runs.log").is_empty(), "{:?}", p.lines("runs.log"));
    assert!(!p.exists("state/tasks/t4"));
    assert!(!p.exists("state/tasks/stray"));
    assert_eq!(p.read("state/n.txt").trim(), "3");

    // The whole directory deleted: the fresh stage is restored, not re-run.
    std::fs::remove_dir_all(p.path("state/tasks")).unwrap();
    p.cairn(&["run"]).success();
    assert!(p.lines("runs.log").is_empty());
    assert_eq!(p.read("state/tasks/t2/task.txt"), "task 2\n");
}

#[test]
fn an_ok_item_that_writes_no_output_is_an_error() {
    let p = materializer(2);
    let manifest = p.read("cairn.toml").replace(
        "mkdir -p {out.tasks}/{item.id} && cp",
        "test {item.id} = t2 || exit 0; mkdir -p {out.tasks}/{item.id} && cp",
    );
    p.file("cairn.toml", &manifest);
    let out = p.cairn(&["run"]);
    out.code_is(1);
    let show = p.cairn(&["show", "materialize/t1", "--json"]);
    let attempts: serde_json::Value = serde_json::from_str(&show.stdout()).unwrap();
    assert_eq!(attempts[0]["class"], "error");
    assert!(
        attempts[0]["rule"]
            .as_str()
            .unwrap()
            .contains("did not write its output `state/tasks/t1`"),
        "{attempts}"
    );
}

#[test]
fn gc_keeps_what_items_wrote_restorable() {
    let p = materializer(3);
    p.cairn(&["run"]).success();
    p.cairn(&["gc"]).success();
    // An item re-runs while another's entry must come back from the store.
    p.file("src/t2.txt", "task 2, edited\n");
    std::fs::remove_dir_all(p.path("state/tasks/t1")).unwrap();
    std::fs::write(p.path("runs.log"), "").unwrap();
    p.cairn(&["run"]).success();
    assert_eq!(p.lines("runs.log"), ["t2"]);
    assert_eq!(p.read("state/tasks/t1/task.txt"), "task 1\n");
}

#[test]
fn commands_see_which_attempt_they_are() {
    let p = Project::new();
    p.file("list.jsonl", "{\"id\": \"a\"}\n");
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "attempts"

[stages.flaky]
foreach = { items = "list.jsonl", key = "id" }
run = "echo $CAIRN_ITEM $CAIRN_ATTEMPT >> attempts.log; test $CAIRN_ATTEMPT -ge 2 || exit 75"
classify = [{ exit = 75, as = "infra" }]
retry = { max = 1, on = ["infra"] }
outputs = { results = "state/flaky.jsonl" }
"#,
    );
    p.cairn(&["run"]).success();
    assert_eq!(p.lines("attempts.log"), ["a 1", "a 2"]);
}

/// A per-item stage whose first attempt of every item outlives its 1 s
/// timeout, classified by `rules`.
fn slow_first_attempt(rules: &str) -> Project {
    let p = Project::new();
    p.file("list.jsonl", "{\"id\": \"a\"}\n");
    p.file(
        "cairn.toml",
        &format!(
            r#"
[pipeline]
name = "timeouts"

[stages.slow]
foreach = {{ items = "list.jsonl", key = "id" }}
run = "echo $CAIRN_ATTEMPT >> attempts.log; test $CAIRN_ATTEMPT -ge 2 || sleep 30"
timeout = "1s"
classify = [{rules}]
retry = {{ max = 1, on = ["infra"] }}
outputs = {{ results = "state/slow.jsonl" }}
"#
        ),
    );
    p
}

#[test]
fn a_timeout_is_an_error_unless_classify_claims_it() {
    // By default a timeout is the command's failure: an error, not retried.
    let p = slow_first_attempt("");
    p.cairn(&["run"]).code_is(1);
    assert_eq!(p.lines("attempts.log"), ["1"]);
    assert_eq!(attempts(&p, "slow/a")[0]["class"], "error");

    // `ended = "timeout"` makes it infrastructure: retried, then ok.
    let p = slow_first_attempt(r#"{ ended = "timeout", as = "infra" }"#);
    p.cairn(&["run"]).success();
    assert_eq!(p.lines("attempts.log"), ["1", "2"]);
    let classes: Vec<String> = attempts(&p, "slow/a")
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["class"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(classes, ["infra", "ok"]);
}

#[test]
fn force_on_a_per_item_stage_reruns_all_its_items() {
    let p = oracle(3);
    p.cairn(&["run"]).success();
    assert_eq!(p.lines("runs.log").len(), 3);
    let run = p.cairn(&["run", "--force", "oracle"]);
    run.success();
    assert!(run.stderr().contains("1 ran"), "{}", run.stderr());
    for key in ["t1", "t2", "t3"] {
        assert_eq!(runs_of(&p, key), 2, "{key}: {:?}", p.lines("runs.log"));
    }
    // Forcing is for one run: the next one reuses everything.
    p.cairn(&["run"]).success();
    assert_eq!(p.lines("runs.log").len(), 6);
}

#[test]
fn force_stage_slash_item_reruns_that_item_only() {
    let p = oracle(3);
    p.cairn(&["run"]).success();
    let run = p.cairn(&["run", "--force", "oracle/t2"]);
    run.success();
    assert_eq!(runs_of(&p, "t1"), 1, "{:?}", p.lines("runs.log"));
    assert_eq!(runs_of(&p, "t2"), 2, "{:?}", p.lines("runs.log"));
    assert_eq!(runs_of(&p, "t3"), 1, "{:?}", p.lines("runs.log"));
    let dry = p.cairn(&["run", "-n", "--force", "oracle/t3"]);
    dry.success();
    assert!(
        dry.stdout().contains("would run  oracle (forced)"),
        "{}",
        dry.stdout()
    );
    // An item the stage does not have, or an item of a stage without
    // items, is refused before anything runs.
    let unknown = p.cairn(&["run", "--force", "oracle/t9"]);
    unknown.code_is(2);
    assert!(unknown.stderr().contains("t9"), "{}", unknown.stderr());
    let unknown = p.cairn(&["run", "--force", "orcle/t1"]);
    unknown.code_is(2);
    assert!(
        unknown.stderr().contains("did you mean `oracle`"),
        "{}",
        unknown.stderr()
    );
    assert_eq!(p.lines("runs.log").len(), 4);
}

#[test]
fn a_failed_per_item_stage_shows_a_failing_items_output() {
    let p = Project::new();
    p.file(
        "items.jsonl",
        "{\"id\": \"t2\"}\n{\"id\": \"t1\"}\n{\"id\": \"t3\"}\n",
    );
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "failing"

[stages.each]
foreach = { items = "items.jsonl", key = "id" }
run = "if [ {item.id} = t3 ]; then exit 0; fi; echo 'traceback: no module named harness' >&2; exit 1"
outputs = { results = "state/results.jsonl" }
"#,
    );
    let run = p.cairn(&["run"]);
    run.code_is(1);
    let stderr = run.stderr();
    let failed = &stderr[stderr.find("FAILED").expect("a FAILED block")..];
    assert!(
        failed.contains("first: item `t1` (exit status 1)")
            && failed.contains("traceback: no module named harness")
            && !failed.contains("is empty"),
        "{stderr}"
    );
}

#[test]
fn a_schema_6_ledger_gains_job_handles_and_keeps_its_history() {
    let p = oracle(2);
    p.cairn(&["run"]).success();
    {
        let db = rusqlite::Connection::open(p.path("cache/ledger.db")).unwrap();
        common::downgrade_to_schema_6(&db);
    }
    let out = p.cairn(&["run"]);
    out.success();
    assert!(out.stderr().contains("0 ran, 1 fresh"), "{}", out.stderr());
    // Attempts recorded before have no job; new ones name theirs.
    let before = attempts(&p, "oracle/t1");
    assert!(before[0]["handle"].is_null(), "{before}");
    p.cairn(&["run", "--force", "oracle"]).success();
    let after = attempts(&p, "oracle/t1");
    let last = after.as_array().unwrap().last().unwrap();
    assert!(
        last["handle"]
            .as_str()
            .is_some_and(|h| h.starts_with("pid:")),
        "{after}"
    );
    assert_eq!(last["class"], "ok");
}
