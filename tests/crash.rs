//! Crashes, interrupts and concurrent processes: real signals, real races.

mod common;

use std::process::{Child, Stdio};

use common::{Project, is_gone, wait_for};

fn spawn(p: &Project, args: &[&str]) -> Child {
    p.command(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Stage `slow` writes half its output, then waits for `release` to exist.
fn half_writer() -> Project {
    let p = Project::new();
    p.file("in.txt", "input\n");
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "crash"

[stages.first]
run = "cp {in.x} {out.o} && echo first >> runs.log"
inputs = { x = "in.txt" }
outputs = { o = "state/1.txt" }

[stages.slow]
run = "echo $$ > slow.pid; printf partial > {out.o}; while [ ! -f release ]; do sleep 0.02; done; printf -- -rest >> {out.o}; echo slow >> runs.log"
inputs = { x = "state/1.txt" }
outputs = { o = "state/2.txt" }

[stages.last]
run = "cat {in.x} > {out.o} && echo last >> runs.log"
inputs = { x = "state/2.txt" }
outputs = { o = "state/3.txt" }
"#,
    );
    p
}

#[test]
fn kill_9_mid_run_keeps_validated_work_and_never_accepts_a_half_written_output() {
    let p = half_writer();
    let mut cairn = spawn(&p, &["run", "-j", "1"]);
    wait_for("the slow stage to start", || p.exists("slow.pid"));
    // (A result is validated once it is on record: the ledger writer
    // commits within a few milliseconds of a stage's end.)
    let db = rusqlite::Connection::open(p.path("cache/ledger.db")).unwrap();
    wait_for("the slow stage to write half its output", || {
        std::fs::read_to_string(p.path("state/2.txt")).is_ok_and(|s| s == "partial")
            && db
                .query_row(
                    "SELECT count(*) FROM results WHERE stage = 'first' AND status = 'ok'",
                    [],
                    |row| row.get::<_, i64>(0),
                )
                .is_ok_and(|n| n == 1)
    });
    cairn.kill().unwrap(); // SIGKILL
    cairn.wait().unwrap();
    let orphan: i32 = p.read("slow.pid").trim().parse().unwrap();

    let status = p.cairn(&["status"]);
    status.code_is(1); // stages are left to run
    let out = status.stdout();
    assert!(
        out.lines()
            .any(|l| l.starts_with("first ") && l.contains("fresh")),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("slow ") && l.contains("never run")),
        "{out}"
    );

    // The next run first kills what the dead one left running, then re-runs
    // the unfinished stage from scratch.
    std::fs::remove_file(p.path("slow.pid")).unwrap();
    let rerun = spawn(&p, &["run"]);
    wait_for("the orphaned stage to be killed", || is_gone(orphan));
    wait_for("the stage to start again", || p.exists("slow.pid"));
    p.file("release", "");
    let output = rerun.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(p.lines("runs.log"), ["first", "slow", "last"]);
    assert_eq!(p.read("state/3.txt"), "partial-rest");
    let log = p.cairn(&["log"]);
    assert!(log.stdout().contains("killed"), "{}", log.stdout());
}

/// What ended and what started are on record while the run goes on (the
/// ledger writer commits as stages go, not when the run closes): the first
/// stage's result, and the slow stage's attempt, `running`, with its
/// process. A cairn killed then leaves that attempt behind, and the next
/// run closes it as abandoned.
#[test]
fn what_ended_and_what_started_are_on_record_while_the_run_goes_on() {
    let p = half_writer();
    let mut cairn = spawn(&p, &["run", "-j", "1"]);
    wait_for("the slow stage to start", || p.exists("slow.pid"));
    let db = rusqlite::Connection::open(p.path("cache/ledger.db")).unwrap();
    let count = |sql: &str| -> i64 { db.query_row(sql, [], |row| row.get(0)).unwrap() };
    wait_for("the first result and the slow start on record", || {
        count("SELECT count(*) FROM results WHERE stage = 'first' AND status = 'ok'") == 1
            && count(
                "SELECT count(*) FROM item_attempts
                 WHERE stage = 'slow' AND class = 'running' AND handle LIKE 'pid:%'",
            ) == 1
    });
    cairn.kill().unwrap(); // SIGKILL
    cairn.wait().unwrap();

    p.file("release", "");
    p.cairn(&["run"]).success();
    assert_eq!(
        count("SELECT count(*) FROM item_attempts WHERE stage = 'slow' AND class = 'abandoned'"),
        1
    );
    assert_eq!(
        count("SELECT count(*) FROM item_attempts WHERE stage = 'slow' AND class = 'ok'"),
        1
    );
    assert_eq!(p.read("state/3.txt"), "partial-rest");
}

#[test]
fn ctrl_c_kills_running_commands_and_records_the_run_as_interrupted() {
    interrupt_with(libc::SIGINT);
}

#[test]
fn sigterm_interrupts_like_ctrl_c() {
    interrupt_with(libc::SIGTERM);
}

#[test]
fn sighup_from_a_closed_terminal_interrupts_like_ctrl_c() {
    interrupt_with(libc::SIGHUP);
}

fn interrupt_with(sig: i32) {
    let p = half_writer();
    let cairn = spawn(&p, &["run"]);
    wait_for("the slow stage to start", || {
        p.exists("slow.pid") && !p.read("slow.pid").is_empty()
    });
    common::signal(cairn.id(), sig);
    let output = cairn.wait_with_output().unwrap();
    assert_eq!(
        output.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let slow: i32 = p.read("slow.pid").trim().parse().unwrap();
    wait_for("the stage's process group to be killed", || is_gone(slow));

    let log = p.cairn(&["log", "--json"]);
    let runs: serde_json::Value = serde_json::from_str(&log.stdout()).unwrap();
    assert_eq!(runs[0]["status"], "interrupted");
    assert_eq!(runs[0]["executed"], 1);
    let first = p.cairn(&["log", "first", "--json"]);
    let results: serde_json::Value = serde_json::from_str(&first.stdout()).unwrap();
    assert_eq!(results[0]["status"], "ok");
}

#[test]
fn two_concurrent_runs_never_corrupt_each_other() {
    let p = half_writer();
    let mut a = spawn(&p, &["run"]);
    wait_for("the first run to hold the workspace", || {
        p.exists("slow.pid")
    });

    let refused = p.cairn(&["run", "--no-wait"]);
    refused.code_is(2);
    assert!(
        refused.stderr().contains("holds the workspace lock"),
        "{}",
        refused.stderr()
    );
    assert!(
        refused.stderr().contains(&format!("pid {}", a.id())),
        "{}",
        refused.stderr()
    );

    let mut b = spawn(&p, &["run"]);
    let b_err = b.stderr.take().unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let reader = {
        let seen = seen.clone();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(b_err).lines() {
                let line = line.unwrap();
                let mut text = seen.lock().unwrap();
                text.push_str(&line);
                text.push('\n');
            }
        })
    };
    // Release the first run only once the second says it is waiting.
    wait_for("the second run to say it waits", || {
        seen.lock()
            .unwrap()
            .contains("waiting for another cairn process")
    });
    p.file("release", "");
    assert!(a.wait().unwrap().success());
    assert!(b.wait().unwrap().success());
    reader.join().unwrap();
    let b_stderr = seen.lock().unwrap().clone();
    // The second run found everything validated by the first.
    assert_eq!(p.lines("runs.log"), ["first", "slow", "last"]);
    assert!(b_stderr.contains("0 ran, 3 fresh"), "{b_stderr}");
}

#[test]
fn audit_during_a_run_waits_for_it_instead_of_reporting_half_written_outputs() {
    let p = half_writer();
    p.file("release", "");
    p.cairn(&["run"]).success();
    std::fs::remove_file(p.path("release")).unwrap();
    std::fs::remove_file(p.path("slow.pid")).unwrap();
    // A changed input: `slow` runs again and stops half-way.
    p.file("in.txt", "changed\n");
    let mut run = spawn(&p, &["run"]);
    wait_for("the slow stage to write half its output", || {
        p.exists("slow.pid")
            && std::fs::read_to_string(p.path("state/2.txt")).is_ok_and(|s| s == "partial")
    });

    let refused = p.cairn(&["audit", "--no-wait"]);
    refused.code_is(2);
    assert!(
        refused.stderr().contains("run is in progress")
            && refused.stderr().contains(&format!("pid {}", run.id())),
        "{}",
        refused.stderr()
    );
    assert!(
        !refused.stdout().contains("mismatch ("),
        "{}",
        refused.stdout()
    );

    let mut audit = spawn(&p, &["audit"]);
    let audit_err = audit.stderr.take().unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let reader = {
        let seen = seen.clone();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(audit_err).lines() {
                let mut text = seen.lock().unwrap();
                text.push_str(&line.unwrap());
                text.push('\n');
            }
        })
    };
    wait_for("the audit to say it waits for the run", || {
        seen.lock()
            .unwrap()
            .contains("waiting for the run in progress")
    });
    p.file("release", "");
    assert!(run.wait().unwrap().success());
    let audited = audit.wait_with_output().unwrap();
    reader.join().unwrap();
    let stdout = String::from_utf8_lossy(&audited.stdout);
    assert!(
        audited.status.success(),
        "{stdout}\n{}",
        seen.lock().unwrap()
    );
    assert!(stdout.contains("0 mismatch(es)"), "{stdout}");
}
