//! A full disk, for real: cairn runs in a private mount namespace (`unshare
//! --map-root-user --mount`) where one directory of the project is a tiny
//! tmpfs, so writes there fail with ENOSPC while the rest of the project
//! (and the ledger the test reads afterwards) lives on the real disk.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Project, Run, bin};

/// Runs `cairn ARGS` in the project with `dir` (relative, created here) a
/// tmpfs of `size` (as `mount -o size=`), with a deadline.
fn cairn_with_full(p: &Project, dir: &str, size: &str, args: &[&str]) -> Run {
    in_namespace_with_full(p, dir, size, &[&[bin()], args].concat())
}

/// Runs `argv` as [`cairn_with_full`] runs cairn.
fn in_namespace_with_full(p: &Project, dir: &str, size: &str, argv: &[&str]) -> Run {
    std::fs::create_dir_all(p.path(dir)).unwrap();
    let mounted = p.path(dir);
    let script = r#"mount -t tmpfs -o size="$1" tmpfs "$2" || exit 97; shift 2; exec "$@""#;
    let mut child = Command::new("unshare")
        .args(["--map-root-user", "--mount", "sh", "-c", script, "sh", size])
        .arg(&mounted)
        .args(argv)
        .current_dir(p.root())
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("unshare (util-linux) runs");
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("cairn hung on a full disk");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let run = Run {
        output: child.wait_with_output().unwrap(),
    };
    assert_ne!(
        run.code(),
        97,
        "this test needs user and mount namespaces to mount a small tmpfs: {}",
        run.stderr()
    );
    run
}

fn project(run: &str) -> Project {
    let p = Project::new();
    p.file(
        "cairn.toml",
        &format!(
            r#"
[pipeline]
name = "full"

[stages.fill]
run = "{run}"
outputs = {{ o = "state/out.bin" }}
"#
        ),
    );
    p
}

/// The newest run's status in the ledger, and stage `fill`'s newest error.
fn recorded(p: &Project) -> (String, String) {
    let runs: serde_json::Value =
        serde_json::from_str(&p.cairn(&["log", "--json"]).stdout()).unwrap();
    let results: serde_json::Value =
        serde_json::from_str(&p.cairn(&["log", "fill", "--json"]).stdout()).unwrap();
    (
        runs[0]["status"].as_str().unwrap_or_default().to_owned(),
        results[0]["error"].as_str().unwrap_or_default().to_owned()
            + results[0]["status"].as_str().unwrap_or_default(),
    )
}

#[track_caller]
fn assert_failed_for_lack_of_space(p: &Project, run: &Run) {
    run.code_is(1);
    assert!(
        run.stderr().contains("No space left on device"),
        "the out-of-space error is not reported:\n{}",
        run.stderr()
    );
    let (run_status, result) = recorded(p);
    assert_eq!(run_status, "failed", "{}", run.stderr());
    assert!(result.ends_with("failed"), "{result}");
}

#[test]
fn stage_whose_command_fills_the_disk_fails_with_its_own_error_and_the_run_is_recorded_failed() {
    let p = project("mkdir -p state && head -c 400000 /dev/zero > {out.o}");
    let run = cairn_with_full(&p, "state", "64k", &["run"]);
    assert_failed_for_lack_of_space(&p, &run);
}

#[test]
fn full_store_fails_the_stage_with_the_out_of_space_error_and_the_run_is_recorded_failed() {
    // The output (on the real disk) is fine; copying it into the store is not.
    let p = project("mkdir -p state && head -c 400000 /dev/zero > {out.o}");
    let run = cairn_with_full(&p, "cache/tmp", "64k", &["run"]);
    assert_failed_for_lack_of_space(&p, &run);
    // Nothing half-stored is taken for a result: the next run runs it again.
    let again = p.cairn(&["run"]);
    again.success();
    assert!(again.stderr().contains("1 ran"), "{}", again.stderr());
}

#[test]
fn full_log_directory_fails_the_stage_with_the_out_of_space_error_and_the_run_is_recorded_failed() {
    let p = project("mkdir -p state && head -c 400000 /dev/zero | od -v && echo done > {out.o}");
    let run = cairn_with_full(&p, "cache/logs", "64k", &["run"]);
    assert_failed_for_lack_of_space(&p, &run);
}

#[test]
fn full_disk_under_the_ledger_fails_the_stage_and_the_run_is_recorded_failed() {
    // The stage fills the file system under `cache/` but for a few
    // kilobytes: its output is made (on the real disk), but its result, with
    // the output inline, does not fit into the ledger any more.
    let p = project(
        "mkdir -p state && head -c $(( $(stat -f -c %a*%S cache) - 12288 )) /dev/zero > cache/filler; head -c 16000 /dev/urandom > {out.o}",
    );
    // The ledger lives on the tmpfs: read it before the namespace goes.
    let cairn = bin();
    let script = format!(
        "{cairn} run > run.out 2> run.err; echo $? > run.code; {cairn} log --json > runs.json; {cairn} log fill --json > fill.json"
    );
    let run = in_namespace_with_full(&p, "cache", "1m", &["sh", "-c", &script]);
    assert_eq!(run.code(), 0, "{}", run.stderr());
    let stderr = p.read("run.err");
    assert_eq!(p.read("run.code").trim(), "1", "{stderr}");
    assert!(stderr.contains("disk is full"), "{stderr}");
    let runs: serde_json::Value = serde_json::from_str(&p.read("runs.json")).unwrap();
    assert_eq!(runs[0]["status"], "failed", "{stderr}");
}

#[test]
fn a_disk_full_to_the_last_byte_under_the_ledger_still_closes_the_run_as_failed() {
    // Not a byte left beside the ledger: recording the result fails, and
    // so would closing the run, but for the room cairn keeps for it.
    let p = project(
        "mkdir -p state && (head -c 2000000 /dev/zero > cache/filler || true); head -c 16000 /dev/urandom > {out.o}",
    );
    let cairn = bin();
    let script = format!(
        "{cairn} run > run.out 2> run.err; echo $? > run.code; {cairn} log --json > runs.json"
    );
    let run = in_namespace_with_full(&p, "cache", "1m", &["sh", "-c", &script]);
    assert_eq!(run.code(), 0, "{}", run.stderr());
    let stderr = p.read("run.err");
    assert_eq!(p.read("run.code").trim(), "1", "{stderr}");
    let runs: serde_json::Value = serde_json::from_str(&p.read("runs.json")).unwrap();
    assert_eq!(runs[0]["status"], "failed", "{stderr}");
}

/// Runs `cairn run` in a namespace where `dir` is a tmpfs of `size`, then
/// lists (inside it, before it goes) every file under `dir` whose name
/// says it is temporary, and every `.cairn-restore` left beside `state/`
/// outputs: what a full disk must not leave behind.
fn run_and_list_leftovers(p: &Project, dir: &str, size: &str) -> (String, String) {
    let cairn = bin();
    let script = format!(
        "{cairn} run > run.out 2> run.err; echo $? > run.code; \
         (ls -A cache/tmp 2>/dev/null; find state -name '.*cairn-restore*' 2>/dev/null) > left.txt"
    );
    let run = in_namespace_with_full(p, dir, size, &["sh", "-c", &script]);
    assert_eq!(run.code(), 0, "{}", run.stderr());
    let stderr = p.read("run.err");
    assert_eq!(p.read("run.code").trim(), "1", "{stderr}");
    (stderr, p.read("left.txt"))
}

#[test]
fn a_store_that_fills_up_mid_run_keeps_no_temporary_file_and_the_stage_fails_saying_so() {
    // A 20 MB cache; the output (on the real disk) is 24 MB: its copy into
    // the store fills the cache part way.
    let p = project("mkdir -p state && head -c 24000000 /dev/urandom > {out.o}");
    let (stderr, left) = run_and_list_leftovers(&p, "cache", "20m");
    assert!(
        stderr.contains("FAILED  fill") && stderr.contains("No space left on device"),
        "the stage's own line does not say the disk is full:\n{stderr}"
    );
    assert_eq!(left, "", "a full disk left temporary files behind");
}

#[test]
fn a_restore_that_fills_up_the_disk_fails_its_stage_and_leaves_nothing_half_written() {
    // Stored on the real disk; inside the namespace `state` is a 20 MB
    // tmpfs holding 10 MB already, so restoring the 12 MB output fails.
    let p = project("mkdir -p state && head -c 12000000 /dev/urandom > {out.o}");
    p.cairn(&["run"]).success();
    let cairn = bin();
    let script = format!(
        "head -c 10000000 /dev/zero > state/filler; {cairn} run > run.out 2> run.err; echo $? > run.code; \
         (ls -A cache/tmp 2>/dev/null; find state -name '.*cairn-restore*') > left.txt"
    );
    let run = in_namespace_with_full(&p, "state", "20m", &["sh", "-c", &script]);
    assert_eq!(run.code(), 0, "{}", run.stderr());
    let stderr = p.read("run.err");
    assert_eq!(p.read("run.code").trim(), "1", "{stderr}");
    assert!(
        stderr.contains("FAILED  fill")
            && stderr.contains("state/out.bin")
            && stderr.contains("No space left on device"),
        "the restore's stage does not fail saying the disk is full:\n{stderr}"
    );
    assert_eq!(
        p.read("left.txt"),
        "",
        "a full disk left a half-restored file"
    );
}
