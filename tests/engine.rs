//! The engine's guarantees, driven through the real binary.

mod common;

use common::Project;

/// Five stages in a chain; each appends its name to `runs.log` when it runs.
fn chain() -> Project {
    let p = Project::new();
    p.file("data/in.txt", "alpha\nbeta\n");
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "chain"

[stages.s1]
run = "cp {in.x} {out.y} && echo s1 >> runs.log"
inputs = { x = "data/in.txt" }
outputs = { y = "state/1.txt" }

[stages.s2]
run = "cp {in.x} {out.y} && echo s2 >> runs.log"
inputs = { x = "state/1.txt" }
outputs = { y = "state/2.txt" }

[stages.s3]
run = "test -f fixed.flag && cp {in.x} {out.y} && echo s3 >> runs.log"
inputs = { x = "state/2.txt" }
outputs = { y = "state/3.txt" }

[stages.s4]
run = "cp {in.x} {out.y} && echo s4 >> runs.log"
inputs = { x = "state/3.txt" }
outputs = { y = "state/4.txt" }

[stages.s5]
run = "cp {in.x} {out.y} && echo s5 >> runs.log"
inputs = { x = "state/4.txt" }
outputs = { y = "state/5.txt" }
"#,
    );
    p
}

/// A diamond plus an independent branch.
fn diamond() -> Project {
    let p = Project::new();
    p.file("data/a.txt", "a\n").file("data/b.txt", "b\n");
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "diamond"

[stages.left]
run = "cat {in.a} > {out.o}; echo left >> runs.log"
inputs = { a = "data/a.txt" }
outputs = { o = "state/left.txt" }

[stages.right]
run = "cat {in.a} {in.a} > {out.o}; echo right >> runs.log"
inputs = { a = "data/a.txt" }
outputs = { o = "state/right.txt" }

[stages.join]
run = "cat {in.l} {in.r} > {out.o}; echo join >> runs.log"
inputs = { l = "state/left.txt", r = "state/right.txt" }
outputs = { o = "state/join.txt" }

[stages.other]
run = "cat {in.b} > {out.o}; echo other >> runs.log"
inputs = { b = "data/b.txt" }
outputs = { o = "state/other.txt" }
"#,
    );
    p
}

#[test]
fn no_op_second_run_executes_no_command() {
    let p = diamond();
    p.cairn(&["run"]).success();
    assert_eq!(p.lines("runs.log").len(), 4);
    let second = p.cairn(&["run"]);
    second.success();
    assert_eq!(
        p.lines("runs.log").len(),
        4,
        "second run executed a command"
    );
    assert!(
        second.stderr().contains("0 ran, 4 fresh"),
        "{}",
        second.stderr()
    );
}

#[test]
fn editing_one_input_reruns_exactly_its_downstream_closure() {
    let p = diamond();
    p.cairn(&["run"]).success();
    p.file("data/a.txt", "a changed\n");
    p.cairn(&["run"]).success();
    let mut reran: Vec<String> = p.lines("runs.log")[4..].to_vec();
    reran.sort();
    assert_eq!(reran, ["join", "left", "right"]);
    assert_eq!(
        p.read("state/join.txt"),
        "a changed\na changed\na changed\n"
    );
}

#[test]
fn touch_without_content_change_reruns_nothing() {
    let p = diamond();
    p.cairn(&["run"]).success();
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
    for f in ["data/a.txt", "data/b.txt", "state/left.txt"] {
        let file = std::fs::File::options()
            .write(true)
            .open(p.path(f))
            .unwrap();
        file.set_modified(later).unwrap();
    }
    p.cairn(&["run"]).success();
    assert_eq!(p.lines("runs.log").len(), 4);
    let status = p.cairn(&["status"]);
    assert!(
        status.stdout().contains("all 4 stage(s) fresh"),
        "{}",
        status.stdout()
    );
}

#[test]
fn early_cutoff_stops_propagation_when_output_bytes_do_not_change() {
    let p = Project::new();
    p.file("words.txt", "b\na\n");
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "cutoff"

[stages.sort]
run = "sort {in.w} > {out.s}; echo sort >> runs.log"
inputs = { w = "words.txt" }
outputs = { s = "state/sorted.txt" }

[stages.count]
run = "wc -l < {in.s} > {out.n}; echo count >> runs.log"
inputs = { s = "state/sorted.txt" }
outputs = { n = "state/n.txt" }
"#,
    );
    p.cairn(&["run"]).success();
    p.file("words.txt", "a\nb\n");
    p.cairn(&["run"]).success();
    assert_eq!(p.lines("runs.log"), ["sort", "count", "sort"]);
}

#[test]
fn failure_at_stage_three_then_fixed_rerun_starts_at_stage_three() {
    let p = chain();
    let failed = p.cairn(&["run"]);
    failed.code_is(1);
    assert!(
        failed.stderr().contains("FAILED  s3"),
        "{}",
        failed.stderr()
    );
    assert!(
        failed.stderr().contains("skipped  s4"),
        "{}",
        failed.stderr()
    );
    assert_eq!(p.lines("runs.log"), ["s1", "s2"]);
    let status = p.cairn(&["status"]);
    assert!(
        status
            .stdout()
            .lines()
            .any(|l| l.starts_with("s3 ") && l.contains("failed")),
        "{}",
        status.stdout()
    );

    p.file("fixed.flag", "");
    p.cairn(&["run"]).success();
    assert_eq!(p.lines("runs.log"), ["s1", "s2", "s3", "s4", "s5"]);
    assert_eq!(p.read("state/5.txt"), "alpha\nbeta\n");
}

#[test]
fn edited_output_is_restored_from_the_store_without_rerunning() {
    let p = diamond();
    p.cairn(&["run"]).success();
    p.file("state/left.txt", "tampered\n");
    std::fs::remove_file(p.path("state/other.txt")).unwrap();
    let status = p.cairn(&["status"]);
    status.code_is(1);
    assert!(
        status.stdout().contains("will be restored"),
        "{}",
        status.stdout()
    );
    // The last line says what a run would do, not "all fresh".
    let last = status
        .stdout()
        .trim_end()
        .lines()
        .last()
        .unwrap_or("")
        .to_owned();
    assert!(
        last.contains("2 of 4 stage(s) would have outputs restored"),
        "{last}"
    );
    let run = p.cairn(&["run"]);
    run.success();
    assert!(run.stderr().contains("2 restored"), "{}", run.stderr());
    assert_eq!(p.lines("runs.log").len(), 4);
    assert_eq!(p.read("state/left.txt"), "a\n");
    assert_eq!(p.read("state/other.txt"), "b\n");
}

/// Flips the first byte of every stored object: files under
/// `cache/objects/` and the small objects kept inline in the ledger.
fn damage_every_stored_object(p: &Project) -> usize {
    let mut damaged = 0;
    if let Ok(shards) = std::fs::read_dir(p.path("cache/objects")) {
        for shard in shards {
            for object in std::fs::read_dir(shard.unwrap().path()).unwrap() {
                let path = object.unwrap().path();
                let mut bytes = std::fs::read(&path).unwrap();
                bytes[0] ^= 0x01;
                std::fs::write(&path, bytes).unwrap();
                damaged += 1;
            }
        }
    }
    let db = rusqlite::Connection::open(p.path("cache/ledger.db")).unwrap();
    let mut rows: Vec<(Vec<u8>, Vec<u8>)> = db
        .prepare("SELECT digest, bytes FROM objects")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    for (digest, bytes) in &mut rows {
        bytes[0] ^= 0x01;
        db.execute(
            "UPDATE objects SET bytes = ?1 WHERE digest = ?2",
            rusqlite::params![&*bytes, &*digest],
        )
        .unwrap();
        damaged += 1;
    }
    damaged
}

#[test]
fn corrupt_store_object_is_not_a_cache_hit() {
    let p = diamond();
    // One output large enough to be stored as a file, the rest inline.
    p.file("data/a.txt", &"a".repeat(40_000));
    p.cairn(&["run"]).success();
    assert!(damage_every_stored_object(&p) >= 4);
    std::fs::remove_file(p.path("state/left.txt")).unwrap();
    std::fs::remove_file(p.path("state/right.txt")).unwrap();
    let run = p.cairn(&["run"]);
    run.success();
    // The damaged objects were refused and their stages re-ran.
    let runs = p.lines("runs.log");
    assert_eq!(runs.len(), 6, "{runs:?}");
    let mut reran = runs[4..].to_vec();
    reran.sort();
    assert_eq!(reran, ["left", "right"]);
    assert_eq!(p.read("state/left.txt"), "a".repeat(40_000));
    // Re-running healed the stored copies: the next restores need no run.
    std::fs::remove_file(p.path("state/left.txt")).unwrap();
    std::fs::remove_file(p.path("state/right.txt")).unwrap();
    p.cairn(&["run"]).success();
    assert_eq!(p.lines("runs.log").len(), 6);
    assert_eq!(p.read("state/right.txt"), "a".repeat(80_000));
}

#[test]
fn large_and_small_outputs_are_both_restored() {
    let p = diamond();
    p.file("data/a.txt", &"x".repeat(20_000));
    p.cairn(&["run"]).success();
    assert!(
        p.path("cache/objects").exists(),
        "a 20 kB output is stored as a file"
    );
    for f in [
        "state/left.txt",
        "state/right.txt",
        "state/join.txt",
        "state/other.txt",
    ] {
        std::fs::remove_file(p.path(f)).unwrap();
    }
    let run = p.cairn(&["run"]);
    assert!(run.stderr().contains("4 restored"), "{}", run.stderr());
    assert_eq!(p.lines("runs.log").len(), 4);
    assert_eq!(p.read("state/join.txt").len(), 60_000);
    assert_eq!(p.read("state/other.txt"), "b\n");
}

#[test]
fn directory_outputs_are_stored_and_restored() {
    let p = Project::new();
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "dirs"

[stages.make]
run = "mkdir -p {out.d}/sub && echo one > {out.d}/a.txt && echo two > {out.d}/sub/b.txt && echo make >> runs.log"
outputs = { d = "state/tree" }

[stages.read]
run = "cat {in.b} > {out.o}; echo read >> runs.log"
inputs = { b = "state/tree/sub/b.txt" }
outputs = { o = "state/b-copy.txt" }
"#,
    );
    p.cairn(&["run"]).success();
    std::fs::remove_dir_all(p.path("state/tree")).unwrap();
    p.cairn(&["run"]).success();
    assert_eq!(p.lines("runs.log"), ["make", "read"]);
    assert_eq!(p.read("state/tree/sub/b.txt"), "two\n");
    assert_eq!(p.read("state/tree/a.txt"), "one\n");
}

#[test]
fn run_with_targets_runs_only_their_upstream_closure() {
    let p = diamond();
    p.cairn(&["run", "left"]).success();
    assert_eq!(p.lines("runs.log"), ["left"]);
    p.cairn(&["run", "join"]).success();
    let mut all = p.lines("runs.log");
    all.sort();
    assert_eq!(all, ["join", "left", "right"]);
}

#[test]
fn force_reruns_a_fresh_stage_and_dry_run_changes_nothing() {
    let p = diamond();
    p.cairn(&["run"]).success();
    let dry = p.cairn(&["run", "--dry-run", "--force", "other"]);
    dry.success();
    assert!(
        dry.stdout().contains("would run  other (forced)"),
        "{}",
        dry.stdout()
    );
    assert_eq!(p.lines("runs.log").len(), 4);
    p.cairn(&["run", "--force", "other"]).success();
    assert_eq!(p.lines("runs.log").len(), 5);
}

#[test]
fn dry_run_on_a_fresh_checkout_writes_no_cache() {
    let p = diamond();
    let dry = p.cairn(&["run", "--dry-run"]);
    dry.success();
    assert!(
        dry.stdout().contains("would run  left (never run)"),
        "{}",
        dry.stdout()
    );
    assert!(!p.exists("cache"));
    assert!(!p.exists("runs.log"));
}

#[test]
fn keep_going_runs_independent_stages_after_a_failure() {
    let p = chain();
    p.file(
        "extra.toml",
        &(p.read("cairn.toml")
            .replace("name = \"chain\"", "name = \"chain2\"")
            + "\n[stages.side]\nrun = \"echo side >> runs.log\"\n"),
    );
    let run = p.cairn(&["-f", "extra.toml", "run", "-j", "1", "--keep-going"]);
    run.code_is(1);
    assert!(p.lines("runs.log").contains(&"side".to_owned()));
}

#[test]
fn a_check_that_fails_rejects_the_result() {
    let p = Project::new();
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "checks"

[stages.empty]
run = "touch {out.o}"
outputs = { o = "state/o.txt" }
checks = ["test -s {out.o}"]
"#,
    );
    let run = p.cairn(&["run"]);
    run.code_is(1);
    assert!(
        run.stderr()
            .contains("check `test -s state/o.txt` exited with status 1"),
        "{}",
        run.stderr()
    );
    // Not recorded as valid: the next run tries again.
    p.cairn(&["run"]).code_is(1);
    let log = p.cairn(&["log", "empty"]);
    assert_eq!(
        log.stdout().matches("failed").count(),
        2,
        "{}",
        log.stdout()
    );
}

#[test]
fn a_missing_declared_output_fails_the_stage() {
    let p = Project::new();
    p.file(
        "cairn.toml",
        "[pipeline]\nname = \"x\"\n[stages.lazy]\nrun = \"true\"\noutputs = { o = \"state/o.txt\" }\n",
    );
    let run = p.cairn(&["run"]);
    run.code_is(1);
    assert!(
        run.stderr().contains("did not create declared output `o`"),
        "{}",
        run.stderr()
    );
}

#[test]
fn timeout_kills_the_command() {
    let p = Project::new();
    p.file(
        "cairn.toml",
        "[pipeline]\nname = \"x\"\n[stages.slow]\nrun = \"sleep 30\"\ntimeout = \"300ms\"\n",
    );
    let started = std::time::Instant::now();
    let run = p.cairn(&["run"]);
    run.code_is(1);
    assert!(
        run.stderr().contains("timed out after 300ms"),
        "{}",
        run.stderr()
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
}

#[test]
fn environment_is_declared_vars_plus_a_minimal_base() {
    let p = Project::new();
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "env"

[stages.env]
run = "env | sort > {out.e}"
outputs = { e = "state/env.txt" }
env = { GREETING = "hi", PASSED = true }
"#,
    );
    let run = p
        .command(&["run"])
        .env("PASSED", "through")
        .env("LEAKED", "no")
        .output()
        .unwrap();
    assert!(run.status.success());
    let env = p.read("state/env.txt");
    assert!(env.contains("GREETING=hi\n"), "{env}");
    assert!(env.contains("PASSED=through\n"), "{env}");
    assert!(!env.contains("LEAKED"), "{env}");
    // A pass-through variable's value enters the fingerprint.
    let why = p
        .command(&["why", "env"])
        .env("PASSED", "changed")
        .output()
        .unwrap();
    let why = String::from_utf8_lossy(&why.stdout);
    assert!(why.contains("env:PASSED"), "{why}");
}

#[test]
fn outputs_of_a_rerun_stage_are_removed_before_it_runs() {
    let p = Project::new();
    p.file("n.txt", "1\n");
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "stale"

[stages.append]
run = "cat {in.n} >> {out.o}"
inputs = { n = "n.txt" }
outputs = { o = "state/o.txt" }
"#,
    );
    p.cairn(&["run"]).success();
    p.file("n.txt", "2\n");
    p.cairn(&["run"]).success();
    assert_eq!(p.read("state/o.txt"), "2\n");
}

#[test]
fn why_and_status_json_name_the_changed_component() {
    let p = diamond();
    p.cairn(&["run"]).success();
    p.file("data/b.txt", "b2\n");
    let why = p.cairn(&["why", "other", "--json"]);
    why.success();
    let json: serde_json::Value = serde_json::from_str(&why.stdout()).unwrap();
    assert_eq!(json["state"], "stale");
    assert_eq!(json["reason"]["reason"], "changed");
    assert_eq!(json["changes"][0]["component"], "input:data/b.txt");
    let status = p.cairn(&["status", "--json"]);
    let json: serde_json::Value = serde_json::from_str(&status.stdout()).unwrap();
    let states: Vec<&str> = json["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["fresh", "fresh", "fresh", "stale"]);
}

#[test]
fn lock_file_is_deterministic_and_records_outputs() {
    let p = diamond();
    p.cairn(&["run"]).success();
    let first = p.read("cairn.lock");
    assert!(first.contains("[stages.join.outputs.o]"), "{first}");
    std::fs::remove_dir_all(p.path("cache")).unwrap();
    std::fs::remove_file(p.path("cairn.lock")).unwrap();
    p.cairn(&["run"]).success();
    assert_eq!(p.read("cairn.lock"), first);
}

#[test]
fn gc_drops_only_unreferenced_objects() {
    let p = diamond();
    p.cairn(&["run"]).success();
    p.file("data/b.txt", "b2\n");
    p.cairn(&["run"]).success();
    let dry = p.cairn(&["gc", "--dry-run"]);
    dry.success();
    assert!(
        dry.stdout()
            .contains("would free 0 file(s) and 1 inline object(s)"),
        "{}",
        dry.stdout()
    );
    p.cairn(&["gc"]).success();
    // Everything current is still restorable.
    std::fs::remove_dir_all(p.path("state")).unwrap();
    p.cairn(&["run"]).success();
    assert_eq!(p.lines("runs.log").len(), 5);
    assert_eq!(p.read("state/other.txt"), "b2\n");
}

/// A run killed while it cleared a stale output directory out of the way
/// leaves it in the store's temporary area: `gc` removes it.
#[test]
fn gc_removes_a_directory_left_in_the_temporary_area() {
    let p = diamond();
    p.cairn(&["run"]).success();
    p.file("cache/tmp/999-0/deep/part.txt", "stale\n");
    p.file("cache/tmp/999-1", "stale\n");
    let gc = p.cairn(&["gc"]);
    gc.success();
    assert!(!p.exists("cache/tmp/999-0"), "{}", gc.stderr());
    assert!(!p.exists("cache/tmp/999-1"));
}

/// A file made immutable (`chattr +i`) for as long as it lives: not even
/// root can remove it.
struct Immutable(std::path::PathBuf);

impl Immutable {
    fn set(path: &std::path::Path) -> Self {
        let set = std::process::Command::new("chattr")
            .arg("+i")
            .arg(path)
            .status()
            .unwrap();
        assert!(set.success(), "chattr +i {} failed", path.display());
        Self(path.to_owned())
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = std::process::Command::new("chattr")
            .arg("-i")
            .arg(&self.0)
            .status();
    }
}

/// What `gc` cannot remove from the temporary area (a file another user
/// owns in a directory a stale output held, say; here an immutable one)
/// is reported and passed over: the rest is collected, and `gc` does not
/// fail on it every time after.
#[test]
fn gc_passes_over_what_it_cannot_remove_from_the_temporary_area() {
    let p = diamond();
    p.cairn(&["run"]).success();
    p.file("cache/tmp/cleared-999-0/stuck.txt", "stale\n");
    p.file("cache/tmp/999-1", "stale\n");
    let _stuck = Immutable::set(&p.path("cache/tmp/cleared-999-0/stuck.txt"));
    let gc = p.cairn(&["gc"]);
    gc.success();
    assert!(!p.exists("cache/tmp/999-1"));
    assert!(
        gc.stderr().contains("could not remove") && gc.stderr().contains("cleared-999-0"),
        "{}",
        gc.stderr()
    );
}

#[test]
fn dag_renders_dot_and_mermaid() {
    let p = diamond();
    let dot = p.cairn(&["dag", "--format", "dot"]);
    dot.success();
    assert!(
        dot.stdout()
            .contains("\"left\" -> \"join\" [label=\"state/left.txt\"]"),
        "{}",
        dot.stdout()
    );
    let mermaid = p.cairn(&["dag", "--format", "mermaid"]);
    assert!(
        mermaid.stdout().starts_with("flowchart TD"),
        "{}",
        mermaid.stdout()
    );
    assert!(!p.exists("cache"));
}

#[test]
fn exec_form_runs_without_a_shell() {
    let p = Project::new();
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "exec"

[stages.argv]
run = ["/bin/sh", "-c", "printf '%s' \"$0\" > state/arg.txt", "a b;c"]
outputs = { o = "state/arg.txt" }
"#,
    );
    p.cairn(&["run"]).success();
    assert_eq!(p.read("state/arg.txt"), "a b;c");
}

#[test]
fn a_closed_stdout_pipe_is_not_an_error() {
    let p = diamond();
    p.cairn(&["run"]).success();
    let mut child = p
        .command(&["status"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Close the read end at once: every write to stdout fails with EPIPE.
    drop(child.stdout.take());
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn switching_profiles_back_restores_outputs_and_the_lock_file() {
    let p = Project::new();
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "profiles"

[params]
n = 3

[profiles.small]
params = { n = 1 }

[stages.numbers]
run = "seq {params.n} > {out.o}; echo numbers >> runs.log"
outputs = { o = "state/numbers.txt" }
"#,
    );
    p.cairn(&["run"]).success();
    let default_lock = p.read("cairn.lock");
    p.cairn(&["--profile", "small", "run"]).success();
    assert_eq!(p.read("state/numbers.txt"), "1\n");
    assert_ne!(p.read("cairn.lock"), default_lock);

    let back = p.cairn(&["run"]);
    back.success();
    assert!(back.stderr().contains("1 restored"), "{}", back.stderr());
    assert_eq!(p.lines("runs.log").len(), 2, "nothing re-ran");
    assert_eq!(p.read("state/numbers.txt"), "1\n2\n3\n");
    assert_eq!(p.read("cairn.lock"), default_lock);
}

#[test]
fn a_damaged_object_of_a_directory_output_is_refused_and_healed() {
    let p = Project::new();
    p.file(
        "cairn.toml",
        "[pipeline]\nname = \"tree\"\n\n[stages.tree]\nrun = \"echo ran >> runs.log; mkdir -p {out.d} && printf 'leaf of a tree\\\\n' > {out.d}/leaf.txt\"\noutputs = { d = \"state/tree\" }\n",
    );
    p.cairn(&["run"]).success();
    let objects: Vec<std::path::PathBuf> = walk_files(&p.path("cache/objects"));
    assert_eq!(objects.len(), 1, "{objects:?}");
    let mut bytes = std::fs::read(&objects[0]).unwrap();
    bytes[0] ^= 0x01;
    std::fs::write(&objects[0], bytes).unwrap();
    std::fs::remove_dir_all(p.path("state/tree")).unwrap();
    p.cairn(&["run"]).success();
    assert_eq!(p.lines("runs.log").len(), 2, "the damaged copy was used");
    // The re-run stored a good copy: a restore needs no run now.
    std::fs::remove_dir_all(p.path("state/tree")).unwrap();
    p.cairn(&["run"]).success();
    assert_eq!(p.lines("runs.log").len(), 2);
    assert_eq!(p.read("state/tree/leaf.txt"), "leaf of a tree\n");
}

fn walk_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk_files(&path));
        } else {
            out.push(path);
        }
    }
    out
}
