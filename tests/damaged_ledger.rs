//! A damaged ledger (`cache/ledger.db` truncated or overwritten, its
//! write-ahead log garbled) is reported as damaged, with what to do, and
//! nothing runs on a ledger that cannot be trusted; following the advice
//! gets the project going again.

mod common;

use std::io::{Seek, SeekFrom, Write};

use common::{Project, Run};

/// A project that ran once: stage `a` recorded, its command appends to
/// `runs.log`.
fn ran_once() -> Project {
    let p = Project::new();
    p.file("in.txt", "input\n");
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "ledger"

[stages.a]
run = "echo a >> runs.log; cp {in.x} {out.o}"
inputs = { x = "in.txt" }
outputs = { o = "state/a.txt" }
"#,
    );
    p.cairn(&["run"]).success();
    assert_eq!(p.lines("runs.log"), ["a"]);
    p
}

/// Moves everything the write-ahead log holds into `ledger.db` itself.
fn checkpoint(p: &Project) {
    let conn = rusqlite::Connection::open(p.path("cache/ledger.db")).unwrap();
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
}

fn overwrite(p: &Project, rel: &str, offset: u64, bytes: &[u8]) {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(p.path(rel))
        .unwrap();
    file.seek(SeekFrom::Start(offset)).unwrap();
    file.write_all(bytes).unwrap();
}

fn garbage(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 131 + 7) as u8).collect()
}

/// Says the ledger is damaged, names `file`, says how to go on; never the
/// schema-version message meant for a ledger from another cairn.
#[track_caller]
fn assert_reported_damaged(run: &Run, file: &str) {
    let stderr = run.stderr();
    assert_ne!(run.code(), 0, "{stderr}");
    assert_ne!(run.code(), 101, "cairn panicked: {stderr}");
    assert!(stderr.contains(file), "does not name `{file}`:\n{stderr}");
    assert!(stderr.contains("is damaged"), "{stderr}");
    assert!(stderr.contains("move"), "no way on:\n{stderr}");
    assert!(!stderr.contains("schema version"), "{stderr}");
    assert!(!stderr.contains("cairn that wrote it"), "{stderr}");
}

/// `status`, `log` and `run` all refuse; `run` runs nothing.
#[track_caller]
fn assert_every_command_refuses(p: &Project, file: &str) {
    assert_reported_damaged(&p.cairn(&["status"]), file);
    assert_reported_damaged(&p.cairn(&["log"]), file);
    assert_reported_damaged(&p.cairn(&["run"]), file);
    assert_eq!(
        p.lines("runs.log"),
        ["a"],
        "a stage ran on a damaged ledger"
    );
}

fn move_aside(p: &Project, names: &[&str]) {
    for name in names {
        let from = p.path(&format!("cache/{name}"));
        if from.exists() {
            std::fs::rename(&from, p.path(&format!("cache/{name}.damaged"))).unwrap();
        }
    }
}

#[test]
fn truncated_ledger_is_reported_as_damaged_not_as_another_schema() {
    let p = ran_once();
    checkpoint(&p);
    let len = std::fs::metadata(p.path("cache/ledger.db")).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(p.path("cache/ledger.db"))
        .unwrap()
        .set_len(len / 3)
        .unwrap();
    assert_every_command_refuses(&p, "ledger.db");

    // The advice works: a new ledger, the stage runs again.
    move_aside(&p, &["ledger.db", "ledger.db-wal", "ledger.db-shm"]);
    p.cairn(&["run"]).success();
    assert_eq!(p.lines("runs.log"), ["a", "a"]);
}

#[test]
fn garbage_ledger_header_is_reported_as_damaged() {
    let p = ran_once();
    checkpoint(&p);
    overwrite(&p, "cache/ledger.db", 0, &garbage(100));
    assert_every_command_refuses(&p, "ledger.db");
}

#[test]
fn garbage_write_ahead_log_is_reported_as_damaged_not_silently_forgotten() {
    // Everything the run recorded is still in the write-ahead log.
    let p = ran_once();
    let wal_len = std::fs::metadata(p.path("cache/ledger.db-wal"))
        .unwrap()
        .len();
    assert!(wal_len > 0);
    overwrite(&p, "cache/ledger.db-wal", 0, &garbage(wal_len as usize));
    assert_every_command_refuses(&p, "ledger.db-wal");

    // The advice works: on from the ledger's last checkpoint.
    move_aside(&p, &["ledger.db-wal", "ledger.db-shm"]);
    p.cairn(&["run"]).success();
    assert_eq!(p.lines("runs.log"), ["a", "a"]);
}

#[test]
fn damaged_frame_inside_the_write_ahead_log_is_reported_as_damaged() {
    // A bad sector inside the log: SQLite would stop reading there and
    // silently drop every result committed after it.
    let p = ran_once();
    let page = 4096;
    let second_frame_data = 32 + (24 + page) + 24;
    overwrite(
        &p,
        "cache/ledger.db-wal",
        second_frame_data + 100,
        &garbage(64),
    );
    assert_every_command_refuses(&p, "ledger.db-wal");
}
