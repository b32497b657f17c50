//! The stat cache: what a run hashed is trusted by the next run (racy-clean,
//! as git trusts its index), a file that was racy is hashed again, and
//! paths nothing reads or writes any more are forgotten.

mod common;

use std::process::Stdio;

use common::Project;

const MANIFEST: &str = r#"
[pipeline]
name = "stat"

[stages.a]
run = "cp in.txt a.txt"
inputs = ["in.txt"]
outputs = ["a.txt"]

[stages.b]
run = "cat a.txt > b.txt"
inputs = ["a.txt"]
outputs = ["b.txt"]

# Sleeps after writing, so that the last output is not written within a
# timestamp tick of the moment the cache is saved.
[stages.c]
run = "cat b.txt data/* > c.txt && sleep 0.05"
inputs = ["b.txt", "data"]
outputs = ["c.txt"]
"#;

fn project() -> Project {
    let p = Project::new();
    p.file("cairn.toml", MANIFEST)
        .file("in.txt", "input\n")
        .file("data/1.txt", "one\n")
        .file("data/2.txt", "two\n");
    p
}

/// The files `cairn ARGS` hashed (read), relative to the project, from its
/// trace log, each once. (A file written within a timestamp tick of its
/// hashing, as the files a test has just written are, is hashed again when
/// the command that read it ends: the stat cache cannot vouch it is
/// unchanged. Whether it was is a matter of milliseconds here.)
fn hashed(p: &Project, args: &[&str]) -> Vec<String> {
    let output = p
        .command(args)
        .env("RUST_LOG", "cairn=trace")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "cairn {args:?} failed:\n{stderr}");
    let root = p.root().canonicalize().unwrap();
    let mut files: Vec<String> = stderr
        .lines()
        .filter(|line| line.contains("hashed"))
        .filter_map(|line| line.split("path=").nth(1))
        .map(|path| {
            let path = path.split_whitespace().next().unwrap_or_default();
            let path = std::path::Path::new(path);
            let path = path.strip_prefix(&root).unwrap_or(path);
            path.to_string_lossy().into_owned()
        })
        .collect();
    files.sort();
    files.dedup();
    files
}

fn cached(p: &Project) -> Vec<String> {
    let db = rusqlite::Connection::open(p.path("cache/ledger.db")).unwrap();
    let root = p.root().canonicalize().unwrap();
    let mut stmt = db.prepare("SELECT path FROM stat_cache").unwrap();
    let mut paths: Vec<String> = stmt
        .query_map([], |row| row.get::<_, String>(0))
        .unwrap()
        .map(|path| {
            let path = std::path::PathBuf::from(path.unwrap());
            let path = path
                .strip_prefix(&root)
                .map(|p| p.to_owned())
                .unwrap_or(path);
            path.to_string_lossy().into_owned()
        })
        .collect();
    paths.sort();
    paths
}

fn touch(p: &Project, when: &str, file: &str) {
    let status = std::process::Command::new("touch")
        .args(["-d", when, file])
        .current_dir(p.root())
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn what_a_run_hashed_is_trusted_by_the_next_run() {
    let p = project();
    // Inputs are hashed through the cache; outputs by the store as it
    // copies them in, which hands the cache what it saw.
    assert_eq!(hashed(&p, &["run"]), ["data/1.txt", "data/2.txt", "in.txt"]);
    // Every file the run read or wrote is remembered, outputs written
    // moments before they were hashed included.
    assert_eq!(
        cached(&p),
        [
            "a.txt",
            "b.txt",
            "c.txt",
            "data/1.txt",
            "data/2.txt",
            "in.txt"
        ]
    );
    assert_eq!(hashed(&p, &["run"]), Vec::<String>::new(), "first no-op");
    assert_eq!(hashed(&p, &["status"]), Vec::<String>::new(), "then status");

    // The control: an edited file is hashed again (and what it changes
    // downstream is learnt from the store, not read twice).
    std::fs::write(p.path("in.txt"), "edited\n").unwrap();
    assert_eq!(hashed(&p, &["run"]), ["in.txt"]);
    assert_eq!(hashed(&p, &["run"]), Vec::<String>::new());
}

#[test]
fn a_file_racy_when_remembered_is_hashed_again_until_it_settles() {
    let p = project();
    // Stamped an hour ahead: when the cache is saved, a later write could
    // still land in the same tick as far as the stamps can tell.
    touch(&p, "+1 hour", "in.txt");
    assert!(hashed(&p, &["run"]).contains(&"in.txt".to_owned()));
    // Re-checked on every look while it stays racy, and only it.
    assert_eq!(hashed(&p, &["run"]), ["in.txt"]);
    assert_eq!(hashed(&p, &["status"]), ["in.txt"]);

    // Stamped in the past, it settles: hashed once more, then trusted.
    // (Touching it stamps its ctime now: a run saving within a tick of
    // that would rightly find it racy still.)
    touch(&p, "-1 hour", "in.txt");
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert_eq!(hashed(&p, &["run"]), ["in.txt"]);
    assert_eq!(hashed(&p, &["run"]), Vec::<String>::new());
}

#[test]
fn a_run_of_every_stage_forgets_what_nothing_reads_any_more() {
    let p = project();
    p.cairn(&["run"]).success();
    assert!(cached(&p).contains(&"data/2.txt".to_owned()));

    // A file gone from an input directory, and a stage removed.
    std::fs::remove_file(p.path("data/2.txt")).unwrap();
    let without_c = MANIFEST[..MANIFEST.find("# Sleeps").unwrap()].to_owned();
    p.file("cairn.toml", &without_c);
    // Running one stage looks at only part of the pipeline: nothing is
    // forgotten yet.
    p.cairn(&["run", "a"]).success();
    assert!(cached(&p).contains(&"data/2.txt".to_owned()));

    p.cairn(&["run"]).success();
    assert_eq!(cached(&p), ["a.txt", "b.txt", "in.txt"]);
}

/// Items that each write a directory (`item_outputs`), sleeping after
/// writing so that no entry is racy when the cache is saved.
const MATERIALIZE: &str = r#"
[pipeline]
name = "materialize"

[stages.materialize]
foreach = { items = "list.jsonl", key = "id" }
item_inputs = ["src/{item.id}.txt"]
item_outputs = { tasks = "{item.id}" }
run = "mkdir -p {out.tasks}/{item.id} && cp src/{item.id}.txt {out.tasks}/{item.id}/task.txt && sleep 0.05"
outputs = { results = "state/materialize.jsonl", tasks = "state/tasks" }
"#;

#[test]
fn the_entries_items_wrote_are_trusted_by_the_next_run() {
    let p = Project::new();
    p.file("cairn.toml", MATERIALIZE).file(
        "list.jsonl",
        "{\"id\": \"t1\"}\n{\"id\": \"t2\"}\n{\"id\": \"t3\"}\n",
    );
    for i in 1..=3 {
        p.file(&format!("src/t{i}.txt"), &format!("task {i}\n"));
    }
    p.cairn(&["run"]).success();
    assert!(cached(&p).contains(&"state/tasks/t1/task.txt".to_owned()));

    // One item changes: the entries of the two reused items are checked
    // against their records (and listed into the stage's output) through
    // the cache; only the new entry is read, as the output is stored.
    p.file("src/t2.txt", "task 2, edited\n");
    assert_eq!(
        hashed(&p, &["run"]),
        ["src/t2.txt", "state/tasks/t2/task.txt"]
    );
    assert_eq!(p.read("state/tasks/t2/task.txt"), "task 2, edited\n");
    let entries = |hashed: Vec<String>| -> Vec<String> {
        hashed
            .into_iter()
            .filter(|path| path.starts_with("state/tasks/"))
            .collect()
    };
    assert_eq!(entries(hashed(&p, &["status"])), Vec::<String>::new());

    // The control: an entry changed behind cairn's back is read, found
    // different and restored; the untouched one is still not read.
    p.file("state/tasks/t3/task.txt", "tampered\n");
    p.file("src/t1.txt", "task 1, edited\n");
    let read = entries(hashed(&p, &["run"]));
    assert!(
        read.contains(&"state/tasks/t3/task.txt".to_owned()),
        "{read:?}"
    );
    assert!(
        !read.contains(&"state/tasks/t2/task.txt".to_owned()),
        "{read:?}"
    );
    assert_eq!(p.read("state/tasks/t3/task.txt"), "task 3\n");
}
