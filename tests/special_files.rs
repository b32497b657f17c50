//! FIFOs, sockets and devices where cairn expects files or directories: each
//! is a clear error naming the path, never a hang or a panic.

mod common;

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::{Project, Run};

/// Runs `cairn ARGS`; kills it and fails if it has not exited in time (a
/// hang is the bug these tests guard against).
fn cairn_within_deadline(p: &Project, args: &[&str]) -> Run {
    let mut child: Child = p
        .command(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let output = child.wait_with_output().unwrap();
            panic!(
                "`cairn {}` hung\n--- stderr\n{}",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Run {
        output: child.wait_with_output().unwrap(),
    }
}

fn mkfifo(p: &Project, rel: &str) {
    let path = std::ffi::CString::new(p.path(rel).into_os_string().into_encoded_bytes()).unwrap();
    // SAFETY: `path` is a valid NUL-terminated string.
    let rc = unsafe { libc::mkfifo(path.as_ptr(), 0o644) };
    assert_eq!(rc, 0, "mkfifo {rel}: {}", std::io::Error::last_os_error());
}

fn with_input(p: &Project, input: &str) {
    p.file(
        "cairn.toml",
        &format!(
            r#"
[pipeline]
name = "special"

[stages.read]
run = "echo ran >> runs.log; cat {{in.x}} > {{out.o}} 2>/dev/null || true"
inputs = {{ x = "{input}" }}
outputs = {{ o = "state/out.txt" }}
"#
        ),
    );
}

/// A non-zero exit whose message names `path` and says what it is.
#[track_caller]
fn assert_located_error(run: &Run, path: &str, kind: &str) {
    assert_ne!(run.code(), 0, "{}", run.stderr());
    assert_ne!(run.code(), 101, "cairn panicked: {}", run.stderr());
    let stderr = run.stderr();
    assert!(
        stderr.contains(path) && stderr.contains(kind),
        "expected an error naming `{path}` as {kind}:\n{stderr}"
    );
}

#[test]
fn fifo_as_an_input_is_a_located_error_not_a_hang() {
    let p = Project::new();
    mkfifo(&p, "pipe");
    with_input(&p, "pipe");
    let run = cairn_within_deadline(&p, &["run"]);
    assert_located_error(&run, "pipe", "FIFO");
    assert!(!p.exists("runs.log"), "the stage ran anyway");
    let status = cairn_within_deadline(&p, &["status"]);
    assert_ne!(status.code(), 101, "cairn panicked: {}", status.stderr());
    let said = status.stdout() + &status.stderr();
    assert!(said.contains("pipe") && said.contains("FIFO"), "{said}");
}

#[test]
fn dev_zero_as_an_input_is_a_located_error_not_a_hang() {
    let p = Project::new();
    std::os::unix::fs::symlink("/dev/zero", p.path("zero")).unwrap();
    with_input(&p, "zero");
    let run = cairn_within_deadline(&p, &["run"]);
    assert_located_error(&run, "zero", "device");
    assert!(!p.exists("runs.log"), "the stage ran anyway");
}

#[test]
fn fifo_inside_an_input_directory_is_a_located_error_not_a_panic() {
    let p = Project::new();
    p.file("data/a.txt", "a\n");
    mkfifo(&p, "data/pipe");
    with_input(&p, "data");
    let run = cairn_within_deadline(&p, &["run"]);
    assert_located_error(&run, "data/pipe", "FIFO");
    assert!(!p.exists("runs.log"), "the stage ran anyway");
}

#[test]
fn stage_that_makes_its_output_a_fifo_fails_with_a_located_error_not_a_hang() {
    let p = Project::new();
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "special"

[stages.make]
run = "mkdir -p state && mkfifo {out.o}"
outputs = { o = "state/out.fifo" }
"#,
    );
    let run = cairn_within_deadline(&p, &["run"]);
    assert_located_error(&run, "state/out.fifo", "FIFO");
    let log = cairn_within_deadline(&p, &["log", "--json"]);
    let runs: serde_json::Value = serde_json::from_str(&log.stdout()).unwrap();
    assert_eq!(runs[0]["status"], "failed", "{}", log.stdout());
}

#[test]
fn socket_inside_an_output_directory_fails_with_a_located_error_not_a_panic() {
    let p = Project::new();
    // The stage moves a socket made here into its output directory.
    drop(std::os::unix::net::UnixListener::bind(p.path("made.sock")).unwrap());
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "special"

[stages.make]
run = "mkdir -p {out.d} && echo a > {out.d}/a.txt && mv made.sock {out.d}/s.sock"
outputs = { d = "state/dir" }
"#,
    );
    let run = cairn_within_deadline(&p, &["run"]);
    assert_located_error(&run, "state/dir/s.sock", "socket");
    let log = cairn_within_deadline(&p, &["log", "--json"]);
    let runs: serde_json::Value = serde_json::from_str(&log.stdout()).unwrap();
    assert_eq!(runs[0]["status"], "failed", "{}", log.stdout());
}
