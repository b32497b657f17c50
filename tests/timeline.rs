//! What a run leaves to be seen: every selected stage in the ledger with
//! its state, reason and times (`cairn log RUN`), the same events as JSON
//! lines while it runs (`cairn run --json`), the DAG coloured by state, and
//! the live view on a terminal.

mod common;

use std::process::Command;

use common::{Project, bin};

/// `a` → `b`; `items` (per item, 12 items) → `sum`; `bad` fails and blocks
/// `after`.
fn project() -> Project {
    let p = Project::new();
    p.file("src.txt", "one\n");
    let items: Vec<String> = (1..=12).map(|i| format!("{{\"id\": \"t{i}\"}}")).collect();
    p.file("items.jsonl", &(items.join("\n") + "\n"));
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "seen"

[stages.a]
run = "cat {in.src} > {out.o}"
inputs = { src = "src.txt" }
outputs = { o = "a.txt" }

[stages.b]
run = "cat {in.a} {in.a} > {out.o}"
inputs = { a = "a.txt" }
outputs = { o = "b.txt" }

[stages.items]
foreach = { items = "items.jsonl", key = "id" }
run = "sleep 0.05; echo {item.id} > {out.tasks}/{item.id}"
inputs = { list = "items.jsonl" }
outputs = { tasks = "tasks/", results = "results.jsonl" }
item_outputs = { tasks = "{item.id}" }

[stages.sum]
run = "ls {in.tasks} | wc -l > {out.n}"
inputs = { tasks = "tasks/" }
outputs = { n = "n.txt" }

[stages.bad]
run = "echo broken >&2; exit 3"
outputs = { o = "bad.txt" }

[stages.after]
run = "cat {in.bad} > {out.o}"
inputs = { bad = "bad.txt" }
outputs = { o = "after.txt" }
"#,
    );
    p
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// Run `run`'s stages from `cairn log RUN --json`, by name.
fn stage_runs(p: &Project, run: i64) -> serde_json::Map<String, serde_json::Value> {
    let out = p.cairn(&["log", &run.to_string(), "--json"]);
    out.success();
    json(&out.stdout())["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["stage"].as_str().unwrap().to_owned(), s.clone()))
        .collect()
}

#[test]
fn every_selected_stage_of_a_run_is_recorded_with_its_state_reason_and_times() {
    let p = project();
    p.cairn(&["run", "-k"]).code_is(1);
    let first = stage_runs(&p, 1);
    assert_eq!(first.len(), 6, "{first:?}");
    for (stage, state) in [
        ("a", "ran"),
        ("b", "ran"),
        ("items", "ran"),
        ("sum", "ran"),
        ("bad", "failed"),
        ("after", "blocked"),
    ] {
        assert_eq!(first[stage]["state"], state, "{stage}: {:?}", first[stage]);
    }
    assert_eq!(first["a"]["reason"], "never run");
    assert!(
        first["bad"]["message"]
            .as_str()
            .unwrap()
            .contains("exited with status 3"),
        "{:?}",
        first["bad"]
    );
    assert!(
        first["after"]["message"]
            .as_str()
            .unwrap()
            .contains("`bad`"),
        "{:?}",
        first["after"]
    );
    // A stage is ready, starts, has its outputs hashed and ends in order;
    // a downstream stage is ready only once its upstream stage's outputs
    // are hashed.
    let ms = |stage: &str, field: &str| first[stage][field].as_i64().unwrap();
    for stage in ["a", "b", "items", "sum"] {
        assert!(ms(stage, "ready_ms") <= ms(stage, "started_ms"), "{stage}");
        assert!(ms(stage, "started_ms") <= ms(stage, "hashed_ms"), "{stage}");
        assert!(
            ms(stage, "hashed_ms") <= ms(stage, "finished_ms"),
            "{stage}"
        );
        assert_eq!(first[stage]["executor"], "local");
        assert!(!first[stage]["host"].as_str().unwrap().is_empty());
    }
    assert!(ms("a", "hashed_ms") <= ms("b", "ready_ms"));
    assert!(ms("items", "hashed_ms") <= ms("sum", "ready_ms"));
    // The 12 items took at least 50 ms each, two at a time at most.
    assert!(ms("items", "finished_ms") - ms("items", "started_ms") >= 12 / 2 * 50);
    assert!(first["after"]["started_ms"].is_null());

    // The run records the manifest it ran and the cairn that ran it.
    let log = json(&p.cairn(&["log", "1", "--json"]).stdout());
    let manifest = std::fs::read(p.path("cairn.toml")).unwrap();
    assert_eq!(
        log["run"]["manifest_digest"],
        blake3::hash(&manifest).to_hex().as_str()
    );
    assert_eq!(log["run"]["cairn_version"], env!("CARGO_PKG_VERSION"));

    // Fixed and run again: what was validated is fresh, the rest runs.
    p.file(
        "cairn.toml",
        &p.read("cairn.toml").replace("exit 3", "echo ok > {out.o}"),
    );
    p.cairn(&["run"]).success();
    let second = stage_runs(&p, 2);
    for (stage, state) in [
        ("a", "fresh"),
        ("b", "fresh"),
        ("items", "fresh"),
        ("sum", "fresh"),
        ("bad", "ran"),
        ("after", "ran"),
    ] {
        assert_eq!(
            second[stage]["state"], state,
            "{stage}: {:?}",
            second[stage]
        );
    }
    // It never succeeded before.
    assert_eq!(second["bad"]["reason"], "never run");
    // A target selects only what it needs.
    std::fs::remove_file(p.path("a.txt")).unwrap();
    p.cairn(&["run", "b"]).success();
    let third = stage_runs(&p, 3);
    assert_eq!(
        third.keys().cloned().collect::<Vec<_>>(),
        ["a", "b"],
        "{third:?}"
    );
    assert_eq!(third["a"]["state"], "restored");
    assert_eq!(third["b"]["state"], "fresh");

    // The text timeline says the same.
    let text = p.cairn(&["log", "1"]);
    text.success();
    let out = text.stdout();
    assert!(out.starts_with("run 1 failed"), "{out}");
    for (stage, state) in [("items", "ran"), ("bad", "failed"), ("after", "blocked")] {
        assert!(
            out.lines()
                .any(|l| l.starts_with(stage) && l.split_whitespace().nth(1) == Some(state)),
            "{stage} {state}: {out}"
        );
    }
    // Stages in the order they started; one that never did last.
    let rows: Vec<&str> = out.lines().skip(3).collect();
    assert!(rows.last().unwrap().starts_with("after "), "{out}");
    let missing = p.cairn(&["log", "99"]);
    missing.code_is(2);
    assert!(
        missing.stderr().contains("no run 99") && missing.stderr().contains("newest is run 3"),
        "{}",
        missing.stderr()
    );
}

#[test]
fn run_json_streams_the_events_the_ledger_records() {
    let p = project();
    let out = p.cairn(&["run", "-k", "--json"]);
    out.code_is(1);
    let events: Vec<serde_json::Value> = out.stdout().lines().map(json).collect();
    assert!(events.iter().all(|e| e["v"] == 1 && e["at_ms"].is_i64()));
    assert_eq!(events[0]["event"], "run_started", "{:?}", events[0]);
    assert_eq!(events[0]["stages"], 6);
    let last = events.last().unwrap();
    assert_eq!(last["event"], "run_finished");
    assert_eq!(last["status"], "failed");
    assert_eq!(last["ran"], 4);
    assert_eq!(last["blocked"], serde_json::json!(["after"]));
    let of = |kind: &str| -> Vec<&serde_json::Value> {
        events.iter().filter(|e| e["event"] == kind).collect()
    };
    // Every stage but the blocked one was decided, as stale, with why.
    let selected = of("stage_selected");
    assert_eq!(selected.len(), 5, "{selected:?}");
    assert!(
        selected
            .iter()
            .all(|e| e["state"] == "stale" && e["reason"] == "never run")
    );
    // Each of the 12 items started and finished, ok, under its stage.
    let started = of("item_started");
    let finished = of("item_finished");
    let keys = |list: &[&serde_json::Value]| -> std::collections::BTreeSet<String> {
        list.iter()
            .filter(|e| e["stage"] == "items")
            .map(|e| e["item"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(keys(&started).len(), 12);
    assert_eq!(keys(&finished), keys(&started));
    assert!(
        finished
            .iter()
            .filter(|e| e["stage"] == "items")
            .all(|e| e["class"] == "ok")
    );
    let items_started = of("stage_started")
        .into_iter()
        .find(|e| e["stage"] == "items")
        .unwrap();
    assert_eq!(items_started["items"], 12);
    assert_eq!(items_started["items_done"], 0);
    // Each item finished after it started, and before its stage did.
    let at = |e: &serde_json::Value| e["at_ms"].as_i64().unwrap();
    let stage_done = of("stage_finished")
        .into_iter()
        .find(|e| e["stage"] == "items")
        .unwrap();
    for end in finished.iter().filter(|e| e["stage"] == "items") {
        let start = started
            .iter()
            .find(|s| s["stage"] == "items" && s["item"] == end["item"])
            .unwrap();
        assert!(at(start) <= at(end) && at(end) <= at(stage_done));
    }
    // Each stage finished once; its final state is the one the ledger holds.
    let finishes = of("stage_finished");
    assert_eq!(finishes.len(), 6, "{finishes:?}");
    let recorded = stage_runs(&p, 1);
    let streamed: std::collections::BTreeMap<String, String> = of("stage_finished")
        .iter()
        .map(|e| {
            (
                e["stage"].as_str().unwrap().to_owned(),
                e["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(streamed.len(), 6);
    for (stage, state) in &streamed {
        assert_eq!(recorded[stage]["state"], state.as_str(), "{stage}");
    }
    // Nothing but JSON reached stdout; a second run streams fresh stages.
    let again = p.cairn(&["run", "a", "--json"]);
    again.success();
    let events: Vec<serde_json::Value> = again.stdout().lines().map(json).collect();
    assert!(events.iter().any(|e| e["event"] == "stage_selected"
        && e["stage"] == "a"
        && e["state"] == "fresh"
        && e["reason"].is_null()));
    assert!(
        events
            .iter()
            .any(|e| e["event"] == "stage_finished" && e["stage"] == "a" && e["state"] == "fresh")
    );
}

#[test]
fn a_forced_stage_starts_with_none_of_its_items_done() {
    let p = project();
    p.cairn(&["run", "items"]).success();
    let started = |args: &[&str]| -> serde_json::Value {
        let out = p.cairn(args);
        out.success();
        out.stdout()
            .lines()
            .map(json)
            .find(|e| e["event"] == "stage_started" && e["stage"] == "items")
            .unwrap()
    };
    let all = started(&["run", "items", "--force", "items", "--json"]);
    assert_eq!(
        (all["items"].clone(), all["items_done"].clone()),
        (12.into(), 0.into())
    );
    let one = started(&["run", "items", "--force", "items/t3", "--json"]);
    assert_eq!(
        (one["items"].clone(), one["items_done"].clone()),
        (12.into(), 11.into())
    );
}

#[test]
fn a_schema_5_ledger_gains_a_timeline_and_keeps_its_runs() {
    let p = project();
    p.cairn(&["run", "-k"]).code_is(1);
    {
        let db = rusqlite::Connection::open(p.path("cache/ledger.db")).unwrap();
        common::downgrade_to_schema_5(&db);
    }
    p.cairn(&["run", "-k"]).code_is(1);
    let db = rusqlite::Connection::open(p.path("cache/ledger.db")).unwrap();
    let version: i64 = db
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, cairn::store::LEDGER_SCHEMA_VERSION);
    // The old run is there, without what schema 5 did not record.
    let old = json(&p.cairn(&["log", "1", "--json"]).stdout());
    assert_eq!(old["run"]["status"], "failed");
    assert!(old["run"]["manifest_digest"].is_null());
    assert_eq!(old["stages"], serde_json::json!([]));
    let text = p.cairn(&["log", "1"]).stdout();
    assert!(text.contains("no stage timeline"), "{text}");
    // The new one has its timeline: the validated stages fresh.
    let new = stage_runs(&p, 2);
    assert_eq!(new["a"]["state"], "fresh");
    assert_eq!(new["bad"]["state"], "failed");
    assert_eq!(new.len(), 6);
}

#[test]
fn the_dag_is_coloured_by_state_now_or_as_a_run_left_it() {
    let p = project();
    p.cairn(&["run", "-k"]).code_is(1);
    let dot = p.cairn(&["dag", "--format", "dot", "--run", "1"]);
    dot.success();
    let dot = dot.stdout();
    assert!(dot.contains("rankdir=TB"), "{dot}");
    assert!(
        dot.contains(r##""bad" [fillcolor="#e57373", tooltip="failed: "##),
        "{dot}"
    );
    assert!(
        dot.contains(
            r##""after" [fillcolor="#bdbdbd", tooltip="blocked: upstream `bad` did not complete"]"##
        ),
        "{dot}"
    );
    let mermaid = p.cairn(&["dag", "--format", "mermaid", "--state"]);
    mermaid.success();
    let mermaid = mermaid.stdout();
    assert!(mermaid.starts_with("flowchart TD"), "{mermaid}");
    assert!(
        mermaid.contains(":::fresh") && mermaid.contains(":::failed"),
        "{mermaid}"
    );
    assert!(mermaid.contains("classDef never_run"), "{mermaid}");
    let text = p.cairn(&["dag", "--state"]).stdout();
    assert!(text.contains("sum [fresh] ← items"), "{text}");
    assert!(text.contains("after [never run] ← bad"), "{text}");
    p.cairn(&["dag", "--run", "7"]).code_is(2);
}

/// `cairn ARGS` on a pseudo-terminal (util-linux `script`); what the
/// terminal showed.
fn on_a_terminal(p: &Project, args: &str) -> String {
    common::require_tool("script");
    let out = Command::new("script")
        .args(["-qec", &format!("{} {args}", bin()), "/dev/null"])
        .current_dir(p.root())
        .env("TERM", "xterm")
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_live_view_counts_a_stages_items_up_to_its_total() {
    let p = project();
    p.cairn(&["run", "a"]).success();
    let shown = on_a_terminal(&p, "run -j 2 items");
    // The stage's bar reached its total, with the items' classes, and the
    // footer counted the run's stages.
    assert!(shown.contains("12/12"), "{shown:?}");
    assert!(shown.contains("ok 12"), "{shown:?}");
    assert!(shown.contains("stages]"), "{shown:?}");
    assert!(shown.contains("items ok 12"), "{shown:?}");
    // Off a terminal: the plain lines only, no bar.
    p.cairn(&["run", "--force", "items", "items"]).success();
    let plain = p.cairn(&["run", "--force", "items", "items"]);
    plain.success();
    assert!(!plain.stderr().contains("12/12"), "{}", plain.stderr());
    assert!(plain.stderr().contains("1 ran"), "{}", plain.stderr());
}

#[test]
fn an_interrupted_run_records_what_was_running_and_what_never_started() {
    let p = Project::new();
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "cut"

[stages.slow]
run = "echo $$ > slow.pid; sleep 30; echo done > {out.o}"
outputs = { o = "slow.txt" }

[stages.later]
run = "cat {in.slow} > {out.o}"
inputs = { slow = "slow.txt" }
outputs = { o = "later.txt" }
"#,
    );
    let cairn = p
        .command(&["run", "--json"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    common::wait_for("the slow stage to start", || {
        p.exists("slow.pid") && !p.read("slow.pid").is_empty()
    });
    let interrupted_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    common::signal(cairn.id(), libc::SIGINT);
    let out = common::output_within(cairn, std::time::Duration::from_secs(60), "cairn run");
    assert_eq!(out.status.code(), Some(130));
    let stages = stage_runs(&p, 1);
    let slow = &stages["slow"];
    assert_eq!(slow["state"], "interrupted", "{slow:?}");
    // It started, and ended when the interrupt came (not 30 s later).
    let (started, finished) = (
        slow["started_ms"].as_i64().unwrap(),
        slow["finished_ms"].as_i64().unwrap(),
    );
    assert!(started <= interrupted_at && interrupted_at <= finished + 1000);
    assert!(finished - started < 20_000, "{slow:?}");
    assert_eq!(stages["later"]["state"], "stopped", "{:?}", stages["later"]);
    assert!(stages["later"]["started_ms"].is_null());
    // The stream says the same, and ends with the run's end.
    let events: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(json)
        .collect();
    let finished_as = |stage: &str| {
        events
            .iter()
            .find(|e| e["event"] == "stage_finished" && e["stage"] == stage)
            .map(|e| e["state"].clone())
    };
    assert_eq!(finished_as("slow"), Some("interrupted".into()));
    assert_eq!(finished_as("later"), Some("stopped".into()));
    assert!(events.iter().any(|e| e["event"] == "interrupted"));
    assert_eq!(events.last().unwrap()["status"], "interrupted");
}

#[test]
fn the_report_shows_what_items_are_named_as_text_never_as_markup() {
    let p = Project::new();
    let hostile = "<img src=x onerror=console.error(7)>";
    p.file(
        "items.jsonl",
        &format!(
            "{}\n{{\"id\": \"fine\"}}\n",
            serde_json::json!({ "id": hostile })
        ),
    );
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "hostile"

[stages.judge]
foreach = { items = "items.jsonl", key = "id" }
run = "echo {item.id}; [ {item.id} = fine ]"
inputs = { list = "items.jsonl" }
outputs = { results = "results.jsonl" }
"#,
    );
    p.cairn(&["run"]).code_is(1);
    p.cairn(&["report", "-o", "report.html"]).success();
    let html = p.read("report.html");
    assert!(html.contains("&lt;img src=x onerror=console.error(7)&gt;"));
    assert!(!html.contains("<img"), "markup from an item's key");
    // In a browser: nothing of it ran, and its text is on the page.
    let opened = common::browser::open(&p.path("browser"), &p.path("report.html"));
    assert!(opened.console.is_empty(), "{:?}", opened.console);
    assert!(!opened.dom.contains("<img"));
    assert!(opened.dom.contains("data-script=\"ran\""));
    assert!(
        opened
            .dom
            .contains("<g class=\"node\" data-stage=\"judge\" data-state=\"failed\"")
    );
}
