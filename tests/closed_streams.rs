//! A terminal or pipe that goes away mid-run (`cairn run 2>&1 | head -1`, a
//! dead `tee`, a dropped ssh session) must not kill cairn or lose a stage
//! that has just finished.

mod common;

use std::process::{Child, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use common::{Project, wait_for};

/// Waits for `child` to exit; kills it and fails if it does not in time.
fn exit_within_deadline(child: &mut Child) -> ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("cairn did not exit in time");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Stage `gated` appends to `runs.log`, then waits for `release` to exist
/// before writing its output.
fn gated() -> Project {
    let p = Project::new();
    p.file("in.txt", "input\n");
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "closed"

[stages.gated]
run = "echo gated >> runs.log; while [ ! -f release ]; do sleep 0.02; done; cp {in.x} {out.o}"
inputs = { x = "in.txt" }
outputs = { o = "state/out.txt" }
"#,
    );
    p
}

#[derive(Clone, Copy)]
enum Closed {
    Stdout,
    Stderr,
    /// Both streams into one pipe, as `2>&1 | head -1`.
    Both,
}

/// Runs `cairn run ARGS` with the chosen stream(s) a pipe whose reading end
/// is closed while the stage runs, then lets the stage finish.
fn run_with_closed_reader(p: &Project, closed: Closed, args: &[&str]) -> ExitStatus {
    let (reader, writer) = std::io::pipe().unwrap();
    let mut child = {
        let mut command = p.command(&[&["run"], args].concat());
        command.stdin(Stdio::null());
        match closed {
            Closed::Stdout => {
                command.stdout(writer).stderr(Stdio::null());
            }
            Closed::Stderr => {
                command.stdout(Stdio::null()).stderr(writer);
            }
            Closed::Both => {
                command.stdout(writer.try_clone().unwrap()).stderr(writer);
            }
        }
        command.spawn().unwrap()
        // `command` (and with it this process's writing end) is dropped here.
    };
    wait_for("the stage to start", || p.exists("runs.log"));
    drop(reader);
    p.file("release", "");
    exit_within_deadline(&mut child)
}

fn assert_finished_stage_was_recorded(p: &Project, status: ExitStatus) {
    assert_ne!(status.code(), Some(101), "cairn panicked: {status:?}");
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert_eq!(p.read("state/out.txt"), "input\n");
    let again = p.cairn(&["run"]);
    again.success();
    assert_eq!(p.lines("runs.log"), ["gated"], "{}", again.stderr());
    assert!(
        again.stderr().contains("0 ran, 1 fresh"),
        "{}",
        again.stderr()
    );
}

#[test]
fn closed_stderr_mid_run_neither_panics_nor_loses_the_finished_stage() {
    let p = gated();
    let status = run_with_closed_reader(&p, Closed::Stderr, &[]);
    assert_finished_stage_was_recorded(&p, status);
}

#[test]
fn closed_stderr_mid_run_with_log_lines_neither_panics_nor_loses_the_finished_stage() {
    // `-vv` makes the run write tracing lines too, after the pipe is gone.
    let p = gated();
    let status = run_with_closed_reader(&p, Closed::Stderr, &["-vv"]);
    assert_finished_stage_was_recorded(&p, status);
}

#[test]
fn closed_stdout_mid_run_neither_panics_nor_loses_the_finished_stage() {
    let p = gated();
    let status = run_with_closed_reader(&p, Closed::Stdout, &["-v"]);
    assert_finished_stage_was_recorded(&p, status);
}

#[test]
fn closed_pipe_for_both_streams_mid_run_neither_panics_nor_loses_the_finished_stage() {
    let p = gated();
    let status = run_with_closed_reader(&p, Closed::Both, &["-v"]);
    assert_finished_stage_was_recorded(&p, status);
}

/// `cairn status --json | head -c1`: a reader that leaves after the first
/// byte ends a JSON report quietly, as it ends a table (the report is
/// larger than a pipe holds, so the write meets the closed end).
#[test]
fn a_json_report_whose_reader_leaves_ends_quietly() {
    use std::io::Read as _;
    let p = Project::new();
    let mut manifest = String::from("[pipeline]\nname = \"many\"\n");
    for i in 0..2000 {
        manifest.push_str(&format!(
            "[stages.s{i:04}]\nrun = \"echo {i} > {{out.o}}\"\noutputs = {{ o = \"state/{i}.txt\" }}\n"
        ));
    }
    p.file("cairn.toml", &manifest);
    let mut child = p
        .command(&["status", "--json"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 1];
    child.stdout.take().unwrap().read_exact(&mut first).unwrap();
    let status = exit_within_deadline(&mut child);
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert_eq!(first, *b"{");
    assert!(status.success(), "{status}: {stderr}");
    assert!(stderr.is_empty(), "{stderr}");
}
