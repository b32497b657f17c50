//! A small builder for driving the real `cairn` binary in a temp dir.

#![allow(dead_code)]

pub mod browser;
pub mod http_cache;
pub mod kube;
pub mod registry;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

pub struct Project {
    dir: tempfile::TempDir,
}

pub struct Run {
    pub output: Output,
}

impl Run {
    pub fn code(&self) -> i32 {
        self.output.status.code().unwrap_or(-1)
    }

    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.output.stdout).into_owned()
    }

    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.output.stderr).into_owned()
    }

    #[track_caller]
    pub fn success(&self) -> &Self {
        assert_eq!(
            self.code(),
            0,
            "expected success\n--- stdout\n{}\n--- stderr\n{}",
            self.stdout(),
            self.stderr()
        );
        self
    }

    #[track_caller]
    pub fn code_is(&self, code: i32) -> &Self {
        assert_eq!(
            self.code(),
            code,
            "unexpected exit code\n--- stdout\n{}\n--- stderr\n{}",
            self.stdout(),
            self.stderr()
        );
        self
    }
}

/// Stops the test with one line saying how to get `tool` when it is not on
/// PATH: `scripts/test` installs everything the tests need.
#[track_caller]
pub fn require_tool(tool: &str) {
    let found = std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| {
            std::fs::metadata(dir.join(tool)).is_ok_and(|m| {
                use std::os::unix::fs::PermissionsExt as _;
                m.is_file() && m.permissions().mode() & 0o111 != 0
            })
        })
    });
    assert!(
        found,
        "`{tool}` is not installed: run the tests with `scripts/test`, which installs what they need"
    );
}

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_cairn")
}

impl Drop for Project {
    /// Kills any process still working in this project (e.g. a stage
    /// orphaned by a test that failed half-way), so nothing outlives it.
    fn drop(&mut self) {
        let Ok(root) = self.dir.path().canonicalize() else {
            return;
        };
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return;
        };
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<i32>().ok())
            else {
                continue;
            };
            if std::fs::read_link(entry.path().join("cwd")).is_ok_and(|cwd| cwd.starts_with(&root))
            {
                // SAFETY: kill(2) has no memory-safety preconditions.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
        }
    }
}

impl Project {
    pub fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    /// A project in a temp dir under `parent` (another file system).
    pub fn new_in(parent: &Path) -> Self {
        Self {
            dir: tempfile::tempdir_in(parent).expect("temp dir"),
        }
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    pub fn file(&self, rel: &str, contents: &str) -> &Self {
        let path = self.path(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(path, contents).unwrap();
        self
    }

    pub fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.path(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
    }

    pub fn exists(&self, rel: &str) -> bool {
        self.path(rel).exists()
    }

    /// Lines in a side-effect file that commands append to.
    pub fn lines(&self, rel: &str) -> Vec<String> {
        std::fs::read_to_string(self.path(rel))
            .map(|s| s.lines().map(str::to_owned).collect())
            .unwrap_or_default()
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(bin());
        command
            .args(args)
            .current_dir(self.root())
            .env_remove("RUST_LOG")
            // Every run a fresh proof answers is also decided the slow way:
            // a proof that says fresh when a stage is not fails the test.
            .env("CAIRN_CHECK_FRESH_PROOF", "1");
        command
    }

    pub fn cairn(&self, args: &[&str]) -> Run {
        let output = self
            .command(args)
            .stdin(Stdio::null())
            .output()
            .expect("run cairn");
        Run { output }
    }
}

/// Where `statement` breaks the in-toto Statement v1 / SLSA Provenance v1
/// schema shipped as a fixture (empty if it validates).
pub fn intoto_errors(statement: &serde_json::Value) -> Vec<String> {
    let schema: serde_json::Value = serde_json::from_str(include_str!(
        "../fixtures/intoto-statement-v1-slsa-provenance-v1.schema.json"
    ))
    .unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    validator
        .iter_errors(statement)
        .map(|e| format!("{e} at {}", e.instance_path()))
        .collect()
}

/// Turns a current ledger back into schema 6: attempts without job handles.
pub fn downgrade_to_schema_6(db: &rusqlite::Connection) {
    downgrade_to_schema_7(db);
    db.execute_batch(
        "ALTER TABLE item_attempts DROP COLUMN handle;
         PRAGMA user_version = 6;",
    )
    .unwrap();
}

/// Turns a current ledger back into schema 10: a stat cache with hex
/// digests and no time each entry was seen (its entries kept), attempts
/// not indexed by fingerprint.
pub fn downgrade_to_schema_10(db: &rusqlite::Connection) {
    db.execute_batch(
        "DROP INDEX items_imported;
         DROP INDEX item_attempts_by_fingerprint;
         DROP INDEX item_attempts_stopped;
         CREATE TABLE stat_cache_v10 (path TEXT PRIMARY KEY, dev INTEGER NOT NULL,
             ino INTEGER NOT NULL, size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL,
             ctime_ns INTEGER NOT NULL, digest TEXT NOT NULL);
         INSERT INTO stat_cache_v10 SELECT path, dev, ino, size, mtime_ns, ctime_ns,
             'blake3:' || lower(hex(digest)) FROM stat_cache;
         DROP TABLE stat_cache;
         ALTER TABLE stat_cache_v10 RENAME TO stat_cache;
         PRAGMA user_version = 10;",
    )
    .unwrap();
}

/// Turns a current ledger back into schema 9: no stage timeline, runs
/// without their manifest digest and cairn version, attempts not indexed
/// by run.
pub fn downgrade_to_schema_9(db: &rusqlite::Connection) {
    downgrade_to_schema_10(db);
    db.execute_batch(
        "DROP TABLE stage_runs;
         DROP INDEX item_attempts_by_run;
         ALTER TABLE runs DROP COLUMN manifest_digest;
         ALTER TABLE runs DROP COLUMN cairn_version;
         PRAGMA user_version = 9;",
    )
    .unwrap();
}

/// Turns a current ledger back into schema 7: no origins, no redraws.
pub fn downgrade_to_schema_7(db: &rusqlite::Connection) {
    downgrade_to_schema_9(db);
    db.execute_batch(
        "DROP TABLE redraws;
         ALTER TABLE results DROP COLUMN origin;
         ALTER TABLE items DROP COLUMN origin;
         PRAGMA user_version = 7;",
    )
    .unwrap();
}

/// Turns a current ledger back into schema 5: no pipeline columns, heads
/// and items keyed without one, no `pipelines` table.
pub fn downgrade_to_schema_5(db: &rusqlite::Connection) {
    downgrade_to_schema_6(db);
    db.execute_batch(
        "BEGIN;
         DROP INDEX results_by_stage;
         DROP INDEX item_attempts_by_item;
         ALTER TABLE runs DROP COLUMN pipeline;
         ALTER TABLE results DROP COLUMN pipeline;
         ALTER TABLE item_attempts DROP COLUMN pipeline;
         CREATE TABLE heads_old (stage TEXT PRIMARY KEY, ok_id INTEGER, attempt_id INTEGER NOT NULL);
         INSERT INTO heads_old SELECT stage, ok_id, attempt_id FROM heads;
         DROP TABLE heads;
         ALTER TABLE heads_old RENAME TO heads;
         CREATE TABLE items_old (stage TEXT NOT NULL, key TEXT NOT NULL, fingerprint TEXT NOT NULL,
             class TEXT NOT NULL, attempts INTEGER NOT NULL, run_id INTEGER NOT NULL,
             finished_ms INTEGER NOT NULL, result TEXT, code TEXT, outputs TEXT,
             PRIMARY KEY (stage, key, fingerprint)) WITHOUT ROWID;
         INSERT INTO items_old SELECT stage, key, fingerprint, class, attempts, run_id, finished_ms, result, code, outputs FROM items;
         DROP TABLE items;
         ALTER TABLE items_old RENAME TO items;
         CREATE INDEX results_by_stage ON results(stage, fingerprint, status);
         CREATE INDEX item_attempts_by_item ON item_attempts(stage, key, id);
         DROP TABLE pipelines;
         PRAGMA user_version = 5;
         COMMIT;",
    )
    .unwrap();
}

/// Waits for `child` at most `limit` and returns its output; a child still
/// running then is killed and the test fails, naming `what`, instead of
/// hanging. Its stdout and stderr, if piped, should stay small.
pub fn output_within(
    mut child: std::process::Child,
    limit: std::time::Duration,
    what: &str,
) -> Output {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if child
            .try_wait()
            .expect("the child can be waited for")
            .is_some()
        {
            return child.wait_with_output().expect("its output can be read");
        }
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not end within {limit:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// A child process that is killed and reaped when dropped, so a test that
/// fails midway leaves nothing running.
pub struct Reaped(pub std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// From a log of `TIME ITEM` lines written by two projects' commands (items
/// named `p-…` and `q-…`, three each, a line at the start and the end of
/// each), the span of time each project's commands ran in.
pub fn spans_of_two_projects(log: &Path) -> Vec<(f64, f64)> {
    let lines = std::fs::read_to_string(log).unwrap();
    ["p-", "q-"]
        .iter()
        .map(|prefix| {
            let times: Vec<f64> = lines
                .lines()
                .filter(|l| l.split(' ').nth(1).is_some_and(|id| id.starts_with(prefix)))
                .map(|l| l.split(' ').next().unwrap().parse().unwrap())
                .collect();
            assert_eq!(times.len(), 6, "{lines}");
            let first = times.iter().copied().fold(f64::MAX, f64::min);
            let last = times.iter().copied().fold(f64::MIN, f64::max);
            (first, last)
        })
        .collect()
}

/// Whether two spans of time overlap.
pub fn overlap(spans: &[(f64, f64)]) -> bool {
    spans[0].0 < spans[1].1 && spans[1].0 < spans[0].1
}

/// Polls `condition` until it holds; panics after a generous deadline.
pub fn wait_for(what: &str, condition: impl FnMut() -> bool) {
    wait_for_within(what, Duration::from_secs(60), condition);
}

/// Polls `condition` until it holds; panics after `limit`.
pub fn wait_for_within(what: &str, limit: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends `signal` (`libc::SIGKILL`, …) to process `pid`.
#[allow(dead_code)]
pub fn signal(pid: u32, signal: i32) {
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe {
        libc::kill(pid as i32, signal);
    }
}

/// Whether process `pid` has ended (a zombie has: only its parent has not
/// reaped it yet).
pub fn is_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

/// Copies the tree `from` to `to`, leaving out entries named in `skip`.
pub fn copy_tree(from: &Path, to: &Path, skip: &[&str]) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        if skip.contains(&name.to_str().unwrap_or("")) {
            continue;
        }
        let target = to.join(&name);
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target, skip);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// A shipped pipeline copied into `p`: its directory of scripts and its
/// manifest, both under `pipelines/`; the manifest's text.
pub fn copy_shipped_pipeline(p: &Project, name: &str) -> String {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::create_dir_all(p.path("pipelines")).unwrap();
    copy_tree(
        &repo.join(format!("pipelines/{name}")),
        &p.path(&format!("pipelines/{name}")),
        &["__pycache__"],
    );
    let manifest = std::fs::read_to_string(repo.join(format!("pipelines/{name}.toml"))).unwrap();
    p.file(&format!("pipelines/{name}.toml"), &manifest);
    manifest
}

/// A Python server `script` started with `args`, which prints the port it
/// listens on as its first line: the process, and that port.
#[allow(dead_code)]
pub fn python_server(script: &str, args: &[String]) -> (std::process::Child, u16) {
    use std::io::BufRead as _;
    require_tool("python3");
    let mut child = Command::new("python3")
        .args(["-c", script])
        .args(args)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line.trim().parse().expect("the server prints its port");
    (child, port)
}
