//! The fresh proof: a run that left every stage valid keeps what it saw,
//! and the next `cairn run` with nothing to do is answered by `stat`ing it
//! (the manifest hashed, not parsed; nothing decided). Every change a run
//! would see must make it decide again, and only then.

mod common;

use std::process::Stdio;

use common::Project;

const MANIFEST: &str = r#"
[pipeline]
name = "proof"

[stages.a]
run = "echo a >> log.txt; cat in.txt > a.txt"
inputs = ["in.txt"]
outputs = ["a.txt"]

[stages.b]
run = "echo b >> log.txt; cat a.txt data/* > b.txt; head -c 40000 /dev/zero >> b.txt"
inputs = ["a.txt", "data"]
outputs = ["b.txt"]

[stages.c]
run = "echo c >> log.txt; printf '%s' \"$GREETING\" > c.txt; mkdir -p tree && cp b.txt tree/"
inputs = ["b.txt"]
outputs = ["c.txt", "tree"]
env = { GREETING = true }
"#;

fn project() -> Project {
    let p = Project::new();
    p.file("cairn.toml", MANIFEST)
        .file("in.txt", "input\n")
        .file("data/1.txt", "one\n")
        .file("data/2.txt", "two\n");
    p
}

/// What `cairn run` did: whether the proof answered it, which stages ran
/// (from the side-effect log), and its stderr.
struct Ran {
    by_proof: bool,
    stages: Vec<String>,
    stderr: String,
}

fn run(p: &Project, extra_env: &[(&str, &str)]) -> Ran {
    let before = p.lines("log.txt").len();
    let mut command = p.command(&["run"]);
    command
        .env("RUST_LOG", "cairn=debug")
        .env("GREETING", "hello")
        .stdin(Stdio::null());
    for (name, value) in extra_env {
        command.env(name, value);
    }
    let output = command.output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "cairn run failed:\n{stderr}");
    Ran {
        by_proof: stderr.contains("the fresh proof holds"),
        stages: p.lines("log.txt")[before..].to_vec(),
        stderr,
    }
}

impl Ran {
    /// Asserts that the run's log says `what`.
    fn says(&self, what: &str) {
        assert!(self.stderr.contains(what), "{}", self.stderr);
    }
}

/// The stderr of a `cairn run` that must fail.
fn failing_run(p: &Project, extra_env: &[(&str, &str)]) -> String {
    let mut command = p.command(&["run"]);
    command.stdin(Stdio::null());
    for (name, value) in extra_env {
        command.env(name, value);
    }
    let output = command.output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "cairn run succeeded:\n{stderr}");
    stderr
}

/// Puts `body` in place of the one manifest kept beside the proof, as
/// another writer (no cairn) would.
fn replace_kept_manifest(p: &Project, body: &[u8]) {
    let db = rusqlite::Connection::open(p.path("cache/ledger.db")).unwrap();
    let replaced = db
        .execute("UPDATE kept_manifests SET body = ?1", [body])
        .unwrap();
    assert_eq!(replaced, 1);
}

/// Runs until a run is answered by the proof again: the first decides,
/// and keeps a new proof unless a file it read was written within a
/// timestamp tick (20 ms) of being read, as happens in these tests; the
/// runs that follow keep one once that tick is over.
fn settle(p: &Project) {
    for _ in 0..100 {
        if run(p, &[]).by_proof {
            return;
        }
    }
    panic!("no run was answered by a proof");
}

fn proofs(p: &Project) -> i64 {
    let db = rusqlite::Connection::open(p.path("cache/ledger.db")).unwrap();
    db.query_row("SELECT count(*) FROM fresh_proofs", [], |row| row.get(0))
        .unwrap()
}

#[test]
fn a_no_op_is_answered_by_the_proof_and_recorded_like_any_run() {
    let p = project();
    let first = run(&p, &[]);
    assert_eq!(first.stages, ["a", "b", "c"]);
    assert!(!first.by_proof);
    assert_eq!(proofs(&p), 1, "the run keeps a proof");

    settle(&p);
    let noop = run(&p, &[]);
    assert!(noop.by_proof, "{}", noop.stderr);
    assert!(noop.stages.is_empty());
    noop.says("0 ran, 3 fresh (run");

    // Recorded as a no-op decided the usual way is: a run, every stage fresh.
    let log = p.cairn(&["log"]);
    log.success();
    let newest = log.stdout().lines().nth(1).unwrap().to_owned();
    let columns: Vec<&str> = newest.split_whitespace().collect();
    assert_eq!(&columns[2..6], ["ok", "0", "3", "0"], "{newest}");
    // (A run's fresh stages are one row: `fresh_stage_runs`.)
    let db = rusqlite::Connection::open(p.path("cache/ledger.db")).unwrap();
    let (rows, fresh): (i64, i64) = db
        .query_row(
            "SELECT (SELECT count(*) FROM stage_runs WHERE run_id = r.id),
                    (SELECT json_array_length(stages) FROM fresh_stage_runs WHERE run_id = r.id)
             FROM runs r ORDER BY r.id DESC LIMIT 1",
            [],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .unwrap();
    assert_eq!((rows, fresh), (0, 3));
}

#[test]
fn every_change_a_run_would_see_makes_it_decide_again() {
    let p = project();
    run(&p, &[]);
    settle(&p);

    // (what changes, the stages that must run)
    type Change = (&'static str, fn(&Project), &'static [&'static str]);
    let changes: &[Change] = &[
        (
            "an input edited, its size and mtime kept",
            |p| {
                let path = p.path("in.txt");
                let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
                std::fs::write(&path, "INPUT\n").unwrap();
                let file = std::fs::File::options().write(true).open(&path).unwrap();
                file.set_modified(mtime).unwrap();
            },
            &["a", "b", "c"],
        ),
        (
            "a file added to an input directory",
            |p| {
                p.file("data/3.txt", "three\n");
            },
            &["b", "c"],
        ),
        (
            "a file inside an output directory removed",
            |p| std::fs::remove_file(p.path("tree/b.txt")).unwrap(),
            &[],
        ),
        (
            "an output edited",
            |p| {
                p.file("c.txt", "tampered");
            },
            &[],
        ),
        (
            "the manifest's command edited",
            |p| {
                let text = p.read("cairn.toml").replace("cat in.txt", "cat  in.txt");
                p.file("cairn.toml", &text);
            },
            &["a"],
        ),
        (
            "the lock file removed",
            |p| std::fs::remove_file(p.path("cairn.lock")).unwrap(),
            &[],
        ),
        (
            "a stored object removed",
            |p| {
                // b.txt is over 16 KiB: stored as a file, not in the ledger.
                let digest = blake3::hash(&std::fs::read(p.path("b.txt")).unwrap()).to_hex();
                let object = p.path(&format!("cache/objects/{}/{}", &digest[..2], &digest[2..]));
                std::fs::remove_file(object).unwrap();
            },
            // (`tree` holds the same bytes: its stored copy is gone too,
            // until `b`'s run stores them again; `c` may be decided either
            // side of that, and runs or not — see below.)
            &["b", "c"],
        ),
    ];
    let mut handed_on = 0;
    for (what, change, must_run) in changes {
        change(&p);
        let decided = run(&p, &[]);
        assert!(
            !decided.by_proof,
            "{what}: the proof answered\n{}",
            decided.stderr
        );
        let ran = &decided.stages;
        if *what == "a stored object removed" && ran == &["b"] {
            // `c` was decided after `b` had stored the bytes again: its own
            // stored copy was complete by then.
        } else {
            assert_eq!(ran, must_run, "{what}\n{}", decided.stderr);
        }
        // A proof read and found wrong hands its workspace on: the history
        // is read beside the manifest, and decides as well.
        if decided.stderr.contains("the fresh proof does not hold") {
            handed_on += 1;
            assert!(
                decided
                    .stderr
                    .contains("the history was read while the manifest was parsed"),
                "{what}\n{}",
                decided.stderr
            );
        }
        settle(&p);
    }
    // (Every change but the manifest's leaves the proof to be read.)
    assert_eq!(handed_on, changes.len() - 1);
    // The restores put the outputs back.
    assert_eq!(p.read("c.txt"), "hello");
    assert!(p.exists("tree/b.txt"));

    let other = run(&p, &[("GREETING", "bonjour")]);
    assert!(!other.by_proof, "a variable a stage reads changed");
    assert_eq!(other.stages, ["c"]);
    assert_eq!(p.read("c.txt"), "bonjour");
}

#[test]
fn a_run_after_a_proof_takes_up_the_manifest_kept_beside_it_while_its_checks_on_disk_pass() {
    let p = project();
    run(&p, &[]);
    settle(&p);

    // An input edited: the proof fails, and the manifest is taken up as
    // the run that made the proof validated it (under the suite's check,
    // it is also loaded again and must be alike).
    p.file("data/1.txt", "uno\n");
    let edited = run(&p, &[]);
    assert!(!edited.by_proof);
    assert_eq!(edited.stages, ["b", "c"]);
    edited.says("the manifest was taken up as it was kept");
    settle(&p);

    // An input no stage writes removed: the kept manifest's check on disk
    // fails, and the manifest loaded again says where.
    std::fs::remove_file(p.path("in.txt")).unwrap();
    let output = p
        .command(&["run"])
        .env("RUST_LOG", "cairn=debug")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("the kept manifest was not taken up")
            && stderr
                .contains("input `in.txt` of stage `a` does not exist and no stage produces it"),
        "{stderr}"
    );
}

#[test]
fn a_kept_manifest_that_cannot_be_read_is_loaded_again_and_kept_anew() {
    let p = project();
    run(&p, &[]);
    settle(&p);
    replace_kept_manifest(&p, &[0x00, 0xff, 0x00, 0xff]);

    p.file("data/1.txt", "uno\n");
    let refused = run(&p, &[]);
    assert_eq!(refused.stages, ["b", "c"]);
    refused.says("the kept manifest was not taken up");
    settle(&p);
    p.file("data/1.txt", "eins\n");
    let taken_up = run(&p, &[]);
    assert_eq!(taken_up.stages, ["b", "c"]);
    taken_up.says("the manifest was taken up as it was kept");
}

#[test]
fn a_run_after_a_proof_takes_up_the_history_kept_beside_it_while_the_lock_file_is_the_one_kept() {
    let p = project();
    run(&p, &[]);
    settle(&p);

    // An input edited: the proof fails, and the history is taken up as the
    // run that made the proof left it (under the suite's check, it is also
    // read again and must be alike).
    p.file("data/1.txt", "uno\n");
    let edited = run(&p, &[]);
    assert_eq!(edited.stages, ["b", "c"]);
    edited.says("the history was taken up as it was kept");
    settle(&p);

    // The lock file given a comment (it still verifies): its bytes are not
    // the ones the history was kept with, so the ledger is read again.
    let lock = p.read("cairn.lock");
    p.file("cairn.lock", &format!("# reviewed\n{lock}"));
    p.file("data/1.txt", "eins\n");
    let refused = run(&p, &[]);
    assert_eq!(refused.stages, ["b", "c"]);
    refused
        .says("the kept history was not taken up: the lock file is not the one it was kept with");
    assert!(
        !refused
            .stderr
            .contains("the history was taken up as it was kept")
    );
    settle(&p);
    assert_eq!(kept_histories(&p), 1);

    // Back to an earlier input: `b` and `c` are restored from their
    // earlier results, which the lock file now names rather than their
    // newest. A run that uses them keeps no history; one that decides from
    // the ledger after it keeps one that says so. Whichever the next edit
    // finds, under the suite's check it must be the ledger's.
    p.file("data/1.txt", "uno\n");
    let reverted = run(&p, &[]);
    assert!(reverted.stages.is_empty(), "{}", reverted.stderr);
    settle(&p);
    p.file("in.txt", "another input\n");
    assert_eq!(run(&p, &[]).stages, ["a", "b", "c"]);
}

/// A proof that fails is checked to its end, and hands the run the `stat`
/// of each file it found as it saw it, for the run to take instead of its
/// own (which files, and how they are taken: the unit tests of
/// `fresh_proof`, `StatCache` and `OutputPlaces`). Two files changed, the
/// second after the first difference in the proof's order (`data/1.txt`
/// before `in.txt`): the run sees both.
#[test]
fn a_proof_that_fails_is_checked_to_its_end_and_the_run_sees_every_change() {
    let p = project();
    run(&p, &[]);
    settle(&p);
    p.file("data/1.txt", "uno\n");
    p.file("in.txt", "another input\n");
    let edited = run(&p, &[]);
    edited.says(&format!(
        "{} changed (",
        p.path("data/1.txt").canonicalize().unwrap().display()
    ));
    edited.says(" files found as it saw them)");
    assert_eq!(edited.stages, ["a", "b", "c"]);
    assert!(run(&p, &[]).stages.is_empty());
}

/// A stage taken out of the manifest whose current result was an earlier
/// one (its lock entry named it): the ledger's current result for it is
/// then its newest, which the run that drops it does not hold. The history
/// that run keeps must not say otherwise.
#[test]
fn a_stage_dropped_while_it_used_an_earlier_result_leaves_no_history_the_ledger_disagrees_with() {
    let p = project();
    let with_t = format!(
        "{MANIFEST}\n[stages.t]\nrun = \"echo t >> log.txt; cat t.txt > t.out\"\ninputs = [\"t.txt\"]\noutputs = [\"t.out\"]\n"
    );
    p.file("cairn.toml", &with_t).file("t.txt", "first\n");
    run(&p, &[]);
    p.file("t.txt", "second\n");
    assert_eq!(run(&p, &[]).stages, ["t"]);
    // Back to the first: `t` is restored from its earlier result, which
    // the lock file now names.
    p.file("t.txt", "first\n");
    assert!(run(&p, &[]).stages.is_empty());

    // `t` dropped, and an input edited, in one step; then the history
    // kept since is taken up (and checked against the ledger) by an edit.
    p.file("cairn.toml", MANIFEST).file("in.txt", "changed\n");
    assert_eq!(run(&p, &[]).stages, ["a", "b", "c"]);
    settle(&p);
    p.file("data/1.txt", "uno\n");
    assert_eq!(run(&p, &[]).stages, ["b", "c"]);
}

/// How many histories are kept beside proofs.
fn kept_histories(p: &Project) -> usize {
    let db = rusqlite::Connection::open(p.path("cache/ledger.db")).unwrap();
    db.query_row("SELECT count(*) FROM kept_histories", [], |row| {
        row.get::<_, i64>(0)
    })
    .unwrap() as usize
}

#[test]
fn a_kept_history_the_ledger_disagrees_with_is_an_internal_error_under_the_check() {
    use cairn::schedule::proof::kept_history;
    let p = project();
    run(&p, &[]);
    settle(&p);
    // Another writer (as no cairn is) keeps a history in which `b`'s
    // current result is another: the check must catch it before any stage
    // is decided from it.
    let db = rusqlite::Connection::open(p.path("cache/ledger.db")).unwrap();
    let body: Vec<u8> = db
        .query_row("SELECT body FROM kept_histories", [], |row| row.get(0))
        .unwrap();
    let mut kept = kept_history::decode(&body).unwrap();
    kept.latest_ok.get_mut("b").unwrap().command = "echo tampered".to_owned();
    let tampered = kept_history::encode(
        &p.read("cairn.lock"),
        "proof",
        kept.lock.stages.keys().map(String::as_str),
        &kept.latest_ok,
        &kept.latest_failure,
        &kept.inline_held,
    );
    db.execute("UPDATE kept_histories SET body = ?1", [tampered])
        .unwrap();
    drop(db);
    let before = p.lines("log.txt").len();
    p.file("data/1.txt", "uno\n");
    let stderr = failing_run(&p, &[("GREETING", "hello")]);
    assert!(
        stderr.contains(
            "the history kept beside the fresh proof is not the ledger's now: the current results differ"
        ),
        "{stderr}"
    );
    assert_eq!(p.lines("log.txt").len(), before, "no stage ran");
}

/// A proof that holds while a run that died is still open on record is
/// not enough: the run is decided the usual way, from the workspace and
/// ledger the proof's check held, and closes the dead run.
#[test]
fn a_run_left_open_by_a_dead_cairn_is_closed_by_a_run_the_proof_would_answer() {
    let p = project();
    run(&p, &[]);
    settle(&p);
    let db = rusqlite::Connection::open(p.path("cache/ledger.db")).unwrap();
    db.execute(
        "INSERT INTO runs (started_ms, status, command, token, pipeline)
         VALUES (1, 'running', 'cairn run', 'dead-1', 'proof')",
        [],
    )
    .unwrap();
    assert_eq!(proofs(&p), 1, "a run row voids no proof");

    // (The proof holds, and says so; the run is decided all the same.)
    let decided = run(&p, &[]);
    assert!(decided.stages.is_empty(), "{}", decided.stderr);
    decided.says("the history was read while the manifest was parsed");
    let status: String = db
        .query_row(
            "SELECT status FROM runs WHERE token = 'dead-1'",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(status, "killed");
    assert!(run(&p, &[]).by_proof, "the next no-op is answered again");
}

#[test]
fn a_write_to_the_results_voids_the_proof_in_its_own_transaction() {
    let p = project();
    run(&p, &[]);
    assert_eq!(proofs(&p), 1);
    let db = rusqlite::Connection::open(p.path("cache/ledger.db")).unwrap();
    db.execute("DELETE FROM heads WHERE stage = 'c'", [])
        .unwrap();
    assert_eq!(proofs(&p), 0, "the trigger deleted the proof");
    drop(db);
    let decided = run(&p, &[]);
    assert!(!decided.by_proof);
    // The next run keeps a proof again, and it answers the one after.
    assert_eq!(proofs(&p), 1);
    assert!(run(&p, &[]).by_proof);
}

#[test]
fn a_run_of_some_stages_or_with_flags_is_decided_as_usual() {
    let p = project();
    run(&p, &[]);
    settle(&p);
    for args in [
        &["run", "a"][..],
        &["run", "--dry-run"],
        &["run", "--json"],
        &["run", "--force", "a"],
        &["--profile", "nothing", "run"],
    ] {
        let output = p
            .command(args)
            .env("RUST_LOG", "cairn=debug")
            .env("GREETING", "hello")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !stderr.contains("the fresh proof holds"),
            "{args:?} was answered by the proof:\n{stderr}"
        );
    }
}

#[test]
fn a_proof_the_slow_way_disagrees_with_is_an_internal_error_under_the_check() {
    let p = project();
    run(&p, &[]);
    settle(&p);
    // Another writer that bypasses the triggers (as no cairn does) makes
    // the proof wrong: the check must catch it.
    let db = rusqlite::Connection::open(p.path("cache/ledger.db")).unwrap();
    db.execute_batch(
        "DROP TRIGGER void_proofs_heads_DELETE; DROP TRIGGER void_proofs_results_DELETE;
         DELETE FROM heads WHERE stage = 'c'; DELETE FROM results WHERE stage = 'c';",
    )
    .unwrap();
    drop(db);
    let stderr = failing_run(&p, &[("GREETING", "hello")]);
    assert!(
        stderr.contains("the fresh proof held, but these stages are not fresh: `c`"),
        "{stderr}"
    );
}

#[test]
fn a_kept_manifest_the_usual_load_disagrees_with_is_an_internal_error_under_the_check() {
    let p = project();
    run(&p, &[]);
    settle(&p);
    // Another writer (as no cairn is) puts a manifest with another command
    // for `a` under the proof's key: the check must catch it.
    let mut manifest = cairn::manifest::load(&p.path("cairn.toml"), None).unwrap();
    manifest.stages[0].run = cairn::manifest::Command::Shell("echo tampered > a.txt".to_owned());
    let tampered = cairn::manifest::kept::encode(&manifest).unwrap();
    replace_kept_manifest(&p, &tampered);
    p.file("data/1.txt", "uno\n");
    let stderr = failing_run(&p, &[("GREETING", "hello")]);
    assert!(
        stderr.contains("is not the manifest as loaded now"),
        "{stderr}"
    );
    assert!(!p.read("a.txt").contains("tampered"));
}

const ITEMS: &str = r#"
[pipeline]
name = "items"

[stages.work]
foreach = { items = "items.jsonl", key = "id" }
item_inputs = ["{item.src}"]
run = "echo {item.id} >> log.txt"
outputs = { results = "state/results.jsonl" }
"#;

/// Two items, `one` and `two`, each reading a file of its own.
fn items_project() -> Project {
    let p = Project::new();
    p.file("cairn.toml", ITEMS)
        .file(
            "items.jsonl",
            "{\"id\": \"one\", \"src\": \"in/1.txt\"}\n{\"id\": \"two\", \"src\": \"in/2.txt\"}\n",
        )
        .file("in/1.txt", "1\n")
        .file("in/2.txt", "2\n");
    p
}

#[test]
fn a_per_item_stage_is_proven_by_its_item_list_and_each_items_inputs() {
    let p = items_project();
    assert_eq!(run(&p, &[]).stages.len(), 2);
    settle(&p);

    // One item's input edited: that item alone runs, planned from the
    // plan the proof kept (the list is not read again; under the check
    // the test suite runs with, it is, and must agree).
    let kept = "items planned from the plan the last proof kept";
    p.file("in/2.txt", "two\n");
    let decided = run(&p, &[]);
    assert!(!decided.by_proof);
    assert_eq!(decided.stages, ["two"]);
    assert!(decided.stderr.contains(kept), "{}", decided.stderr);
    let unchecked = "the item list is as a kept plan saw it: not checked again";
    assert!(decided.stderr.contains(unchecked), "{}", decided.stderr);
    settle(&p);

    // An item added to the list, its size and mtime kept by the edit.
    let list = p.path("items.jsonl");
    let mtime = std::fs::metadata(&list).unwrap().modified().unwrap();
    let text = p.read("items.jsonl").replace("\"two\"", "\"owt\"");
    p.file("items.jsonl", &text);
    std::fs::File::options()
        .write(true)
        .open(&list)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    let decided = run(&p, &[]);
    assert!(!decided.by_proof, "{}", decided.stderr);
    assert_eq!(decided.stages, ["owt"]);
    assert!(!decided.stderr.contains(kept), "{}", decided.stderr);
    assert!(!decided.stderr.contains(unchecked), "{}", decided.stderr);
    settle(&p);
    assert_eq!(proofs(&p), 1);

    // A write to an item's outcome voids the proof in the same
    // transaction: the next run decides (the stage's own result stands).
    let db = rusqlite::Connection::open(p.path("cache/ledger.db")).unwrap();
    db.execute("UPDATE items SET attempts = 2 WHERE key = 'one'", [])
        .unwrap();
    drop(db);
    assert_eq!(proofs(&p), 0);
    let decided = run(&p, &[]);
    assert!(!decided.by_proof, "{}", decided.stderr);
    assert!(decided.stages.is_empty());
    settle(&p);
}

/// Rewrites the kept plan (as no cairn does) to say that item `two` reads
/// `in/1.txt`, not `in/2.txt`.
fn misstate_what_two_reads(p: &Project) {
    let db = rusqlite::Connection::open(p.path("cache/ledger.db")).unwrap();
    let body: Vec<u8> = db
        .query_row("SELECT body FROM kept_plans", [], |row| row.get(0))
        .unwrap();
    // (The last `in/2.txt` is the path `two` reads; the first is in its
    // canonical text.)
    let at = body.windows(8).rposition(|w| w == b"in/2.txt").unwrap();
    let mut wrong = body.clone();
    wrong[at..at + 8].copy_from_slice(b"in/1.txt");
    db.execute("UPDATE kept_plans SET body = ?1", [&wrong])
        .unwrap();
    drop(db);
}

#[test]
fn an_item_plan_the_list_disagrees_with_is_an_internal_error_under_the_check() {
    let p = items_project();
    run(&p, &[]);
    settle(&p);
    // The kept plan rewritten (as no cairn does) to say that item `two`
    // reads `in/1.txt`: planned from it, an edit of `in/1.txt` would run
    // `two` too. The check must catch it.
    misstate_what_two_reads(&p);
    p.file("in/1.txt", "one\n");
    let stderr = failing_run(&p, &[]);
    assert!(
        stderr.contains("the item plan the proof kept differs from the list at item `two`"),
        "{stderr}"
    );
}

/// `cairn status ARGS` with debug logging: its exit code, stdout and
/// stderr.
fn status(p: &Project, args: &[&str]) -> (i32, String, String) {
    let mut command = p.command(&[&["status"], args].concat());
    command.env("RUST_LOG", "cairn=debug").stdin(Stdio::null());
    let output = command.output().unwrap();
    (
        output.status.code().unwrap(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn status_plans_items_from_the_kept_plan_while_their_list_is_unchanged() {
    let p = items_project();
    run(&p, &[]);
    settle(&p);
    let kept = "items planned from the plan the last proof kept";

    // One item's input edited: `status` plans the items as the run would,
    // from the kept plan (under the check the suite runs with, the list is
    // read too, and must agree), and finds that item alone to run.
    p.file("in/2.txt", "two\n");
    let (code, stdout, stderr) = status(&p, &[]);
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(stderr.contains(kept), "{stderr}");
    assert!(stdout.contains("[2 items, 1 ok, 1 pending]"), "{stdout}");
    let (code, stdout, stderr) = status(&p, &["--json"]);
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(stderr.contains(kept), "{stderr}");

    // The list edited: read again, and the new item seen.
    p.file(
        "items.jsonl",
        &format!(
            "{}{{\"id\": \"three\", \"src\": \"in/1.txt\"}}\n",
            p.read("items.jsonl")
        ),
    );
    let (code, stdout, stderr) = status(&p, &[]);
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(!stderr.contains(kept), "{stderr}");
    assert!(stdout.contains("[3 items, 1 ok, 2 pending]"), "{stdout}");
}

#[test]
fn a_kept_plan_the_list_disagrees_with_fails_status_under_the_check() {
    let p = items_project();
    run(&p, &[]);
    settle(&p);
    // The kept plan rewritten (as no cairn does) to say that item `two`
    // reads `in/1.txt`.
    misstate_what_two_reads(&p);
    p.file("in/1.txt", "one\n");
    for args in [&["status"][..], &["why", "work"]] {
        let output = p
            .command(args)
            .env("RUST_LOG", "cairn=debug")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        if args[0] == "status" {
            assert_eq!(
                output.status.code(),
                Some(1),
                "a stage that cannot be decided is stale"
            );
        }
        // (Both show it as why the stage cannot be decided.)
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(
            said.contains("the item plan the proof kept differs from the list at item `two`"),
            "{args:?}: {said}"
        );
    }
}

const NESTED: &str = r#"
[pipeline]
name = "nested"

[stages.gen]
run = "echo gen >> log.txt; mkdir -p gen && echo x > gen/x.h"
outputs = ["gen"]

[stages.use]
run = "echo use >> log.txt; cat gen/x.h > use.txt"
inputs = ["gen/x.h"]
outputs = ["use.txt"]

[stages.all]
run = "echo all >> log.txt; ls data > all.txt"
inputs = ["data", "data/1.txt"]
outputs = ["all.txt"]
"#;

#[test]
fn a_directory_with_a_watched_path_inside_keeps_its_own_check() {
    let p = Project::new();
    p.file("cairn.toml", NESTED).file("data/1.txt", "one\n");
    run(&p, &[]);
    settle(&p);

    // A stray file in an output directory another stage reads inside.
    p.file("gen/stray", "stray\n");
    let decided = run(&p, &[]);
    assert!(!decided.by_proof, "{}", decided.stderr);
    assert!(decided.stages.is_empty());
    assert!(!p.exists("gen/stray"), "the output directory is restored");
    settle(&p);

    // A file added to an input directory a file of which is also an input.
    p.file("data/2.txt", "two\n");
    let decided = run(&p, &[]);
    assert!(!decided.by_proof, "{}", decided.stderr);
    assert_eq!(decided.stages, ["all"]);
}

#[test]
fn a_pipeline_name_claimed_by_another_manifest_meanwhile_is_not_proven() {
    let p = project();
    run(&p, &[]);
    settle(&p);
    // Another manifest of the same name takes it while this one is away.
    std::fs::rename(p.path("cairn.toml"), p.path("away.txt")).unwrap();
    std::fs::copy(p.path("away.txt"), p.path("ci.toml")).unwrap();
    p.cairn(&["-f", "ci.toml", "gc", "--dry-run"]).success();
    std::fs::rename(p.path("away.txt"), p.path("cairn.toml")).unwrap();
    let output = p
        .command(&["run"])
        .env("RUST_LOG", "cairn=debug")
        .env("GREETING", "hello")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("the fresh proof holds"), "{stderr}");
    assert!(!output.status.success(), "the name is taken:\n{stderr}");
}

/// A proof rests on the stat-cache entries the run's digests came from.
/// An input a later stage of the same run rewrites (as no manifest should,
/// but a command can) is no longer what its reader fingerprinted: the next
/// run must see it and run that reader again, not answer from the proof.
#[test]
fn an_input_rewritten_later_in_the_same_run_is_seen_by_the_next_run() {
    let p = Project::new();
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "rewrite"

[stages.a]
run = "echo a >> log.txt; cat in.txt > a.txt"
inputs = ["in.txt"]
outputs = ["a.txt"]

[stages.b]
run = "echo b >> log.txt; cat a.txt > b.txt; if [ -f rewrite ]; then echo again >> in.txt; rm rewrite; fi"
inputs = ["a.txt"]
outputs = ["b.txt"]
"#,
    )
    .file("in.txt", "input\n");
    run(&p, &[]);
    settle(&p);

    // `b` rewrites `a`'s input once, after `a` hashed it in this run.
    p.file("rewrite", "");
    p.file("in.txt", "input, edited\n");
    let rewriting = run(&p, &[]);
    assert_eq!(rewriting.stages, ["a", "b"], "{}", rewriting.stderr);
    assert_eq!(p.read("a.txt"), "input, edited\n");

    let next = run(&p, &[]);
    assert!(!next.by_proof, "the proof answered:\n{}", next.stderr);
    assert_eq!(next.stages, ["a", "b"], "{}", next.stderr);
    assert_eq!(p.read("a.txt"), "input, edited\nagain\n");
    settle(&p);
}

/// The file a failed proof found changed is the first thing the run
/// weighs: the stages that read it start before the others, in whatever
/// order they rank. Here `late` (last in the manifest) reads `m.txt`,
/// which sorts before `z.txt`, so the proof finds it changed first.
#[test]
fn the_stages_reading_the_file_found_changed_start_first() {
    let p = Project::new();
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "first"

[stages.early]
run = "echo early >> log.txt; cat z.txt > early.txt"
inputs = ["z.txt"]
outputs = ["early.txt"]

[stages.late]
run = "echo late >> log.txt; cat m.txt > late.txt"
inputs = ["m.txt"]
outputs = ["late.txt"]
"#,
    )
    .file("z.txt", "z\n")
    .file("m.txt", "m\n");
    let first = run(&p, &[]);
    // (Side by side: their lines come in either order.)
    let mut ran = first.stages.clone();
    ran.sort();
    assert_eq!(ran, ["early", "late"], "{}", first.stderr);
    settle(&p);
    p.file("z.txt", "z, edited\n").file("m.txt", "m, edited\n");
    let before = p.lines("log.txt").len();
    let mut command = p.command(&["run", "-j", "1"]);
    command.stdin(Stdio::null()).env("RUST_LOG", "cairn=debug");
    let output = command.output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("m.txt changed"), "{stderr}");
    assert_eq!(p.lines("log.txt")[before..], ["late", "early"], "{stderr}");
}
