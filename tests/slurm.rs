//! The Slurm executor against a real one-node Slurm cluster (munged,
//! slurmctld, slurmd), which `scripts/test` starts and names in
//! `SLURM_CONF`. The scenarios share the one node, so they take turns.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use cairn::exec::{InfraKind, Job, Outcome, SlurmExecutor};
use cairn::manifest::{Command, SlurmSettings};

static NODE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn cluster() -> tokio::sync::MutexGuard<'static, ()> {
    assert!(
        std::env::var_os("SLURM_CONF").is_some(),
        "no Slurm cluster: run the tests with `scripts/test`, which starts one"
    );
    let turn = NODE.lock().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !node_is_idle() {
        assert!(Instant::now() < deadline, "the Slurm node is not idle");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    turn
}

fn slurm() -> SlurmExecutor {
    SlurmExecutor::new(SlurmSettings {
        poll: Duration::from_millis(300),
        ..SlurmSettings::default()
    })
}

fn job(dir: &Path, name: &str, script: &str) -> Job {
    Job {
        name: name.to_owned(),
        token: format!("test-{}", std::process::id()),
        command: Command::Shell(script.to_owned()),
        cwd: dir.to_path_buf(),
        env: vec![
            ("PATH".to_owned(), "/usr/bin:/bin".to_owned()),
            ("GREETING".to_owned(), "hello from the job".to_owned()),
        ],
        timeout: None,
        log: dir.join(format!("{name}.log")),
        redact: Vec::new(),
        stage: "test".to_owned(),
        secrets: Vec::new(),
        image: None,
    }
}

fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

async fn within<T>(limit: Duration, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(limit, future)
        .await
        .expect("a Slurm scenario did not finish in time")
}

#[tokio::test]
async fn a_job_runs_in_the_root_with_its_environment_and_its_exit_code_comes_back() {
    let _node = cluster().await;
    let dir = tempfile::tempdir().unwrap();
    let slurm = slurm();
    let name = unique("exit");
    let job = job(
        dir.path(),
        &name,
        "echo \"$GREETING in $(pwd)\"; echo made > out.txt; exit 3",
    );
    let submitted = slurm.submit_job(&job).await.unwrap();
    let outcome = within(Duration::from_secs(60), slurm.wait_job(&submitted))
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Exit(3));
    let log = std::fs::read_to_string(&job.log).unwrap();
    assert!(
        log.contains(&format!("hello from the job in {}", dir.path().display())),
        "{log}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("out.txt")).unwrap(),
        "made\n"
    );
    // Success is success.
    let ok = slurm
        .submit_job(&self::job(dir.path(), &unique("ok"), "true"))
        .await
        .unwrap();
    assert_eq!(
        within(Duration::from_secs(60), slurm.wait_job(&ok))
            .await
            .unwrap(),
        Outcome::Success
    );
}

#[tokio::test]
async fn a_job_is_found_again_by_name_and_cancelled() {
    let _node = cluster().await;
    let dir = tempfile::tempdir().unwrap();
    let slurm = slurm();
    let name = unique("attach");
    let job = job(dir.path(), &name, "touch started; sleep 300");
    let submitted = slurm.submit_job(&job).await.unwrap();
    // As a restarted cairn would: by name alone.
    let found = slurm.find(&name).await.unwrap().expect("found by name");
    assert_eq!(found, submitted);
    assert_eq!(slurm.find(&unique("nobody")).await.unwrap(), None);
    // It carries this run's token: an orphan once the run is not live.
    let orphans = slurm.orphans(|_| false).await.unwrap();
    assert!(orphans.contains(&submitted), "{orphans:?}");
    let live = slurm.orphans(|token| token == job.token).await.unwrap();
    assert!(!live.contains(&submitted), "{live:?}");
    wait_for(&dir.path().join("started")).await;
    slurm.cancel_job(&found).await.unwrap();
    assert_eq!(
        within(Duration::from_secs(60), slurm.wait_job(&found))
            .await
            .unwrap(),
        Outcome::Cancelled
    );
}

#[tokio::test]
async fn a_node_that_fails_under_a_job_is_an_infrastructure_failure() {
    let _node = cluster().await;
    let dir = tempfile::tempdir().unwrap();
    let slurm = slurm();
    let job = job(dir.path(), &unique("nodefail"), "touch started; sleep 300");
    let submitted = slurm.submit_job(&job).await.unwrap();
    wait_for(&dir.path().join("started")).await;
    let node = hostname();
    scontrol(&[
        "update",
        &format!("nodename={node}"),
        "state=down",
        "reason=cairn-test",
    ]);
    let outcome = within(Duration::from_secs(60), slurm.wait_job(&submitted)).await;
    // Back in service for the other scenarios (Slurm may already have
    // returned it, which makes `resume` an invalid transition: the node's
    // state is what counts).
    let _ = std::process::Command::new("scontrol")
        .args(["update", &format!("nodename={node}"), "state=resume"])
        .stderr(std::process::Stdio::null())
        .status();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !node_is_idle() {
        assert!(Instant::now() < deadline, "the node did not come back");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(outcome.unwrap(), Outcome::Infra(InfraKind::NodeLost));
}

async fn wait_for(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn hostname() -> String {
    let out = std::process::Command::new("hostname")
        .arg("-s")
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

fn node_is_idle() -> bool {
    std::process::Command::new("sinfo")
        .args(["-h", "-o", "%T"])
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "idle")
}

fn scontrol(args: &[&str]) {
    let status = std::process::Command::new("scontrol")
        .args(args)
        .status()
        .unwrap();
    assert!(status.success(), "scontrol {args:?} {status}");
}

// ---- cairn itself, running a per-item stage on the cluster ----------------

const PIPELINE: &str = r#"
[pipeline]
name = "on-slurm"

[executors.cluster]
kind = "local"

[profiles.slurm.executors.cluster]
kind = "slurm"
poll = "300ms"

[profiles.arrays.executors.cluster]
kind = "slurm"
poll = "300ms"
batch = 8

# `&&`: a job cancelled in its sleep writes nothing (scancel signals every
# process of the job; the shell may outlive its `sleep` by a moment).
[stages.work]
executor = "cluster"
foreach = { items = "items.jsonl", key = "id" }
run = "echo {item.id} >> runs/{item.id}; echo working on {item.id}; touch started/{item.id}; sleep {item.sleep} && echo '{item.id} done' > out/{item.id}"
classify = [{ exit = 3, as = "rejected" }]
retry = { max = 2, on = ["infra"], backoff = "100ms" }
outputs = { results = "state/work.jsonl" }
"#;

/// A project with `n` items, each sleeping `sleep` seconds.
fn project(n: usize, sleep: u32) -> common::Project {
    let p = common::Project::new();
    p.file("cairn.toml", PIPELINE);
    let items: String = (0..n)
        .map(|i| format!("{{\"id\": \"task-{i:02}\", \"sleep\": {sleep}}}\n"))
        .collect();
    p.file("items.jsonl", &items);
    for dir in ["runs", "started", "out"] {
        p.file(&format!("{dir}/.keep"), "");
    }
    // `sbatch` and `squeue` on PATH count their calls before handing them on.
    for (tool, log) in [("sbatch", "sbatch-calls"), ("squeue", "squeue-calls")] {
        p.file(
            &format!("shim/{tool}"),
            &format!(
                "#!/bin/sh\necho \"$*\" >> '{}'\nexec /usr/bin/{tool} \"$@\"\n",
                p.path(log).display()
            ),
        );
        std::fs::set_permissions(
            p.path(&format!("shim/{tool}")),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
    }
    p
}

fn cairn_on_slurm(p: &common::Project, args: &[&str]) -> std::process::Command {
    let mut command = p.command(args);
    let path = std::env::var("PATH").unwrap_or_default();
    command.env("PATH", format!("{}:{path}", p.path("shim").display()));
    command
}

fn run_on_slurm(p: &common::Project, args: &[&str]) -> common::Run {
    let output = cairn_on_slurm(p, args)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    common::Run { output }
}

fn sbatch_calls(p: &common::Project) -> usize {
    p.lines("sbatch-calls").len()
}

fn files_in(p: &common::Project, dir: &str) -> usize {
    std::fs::read_dir(p.path(dir))
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name() != ".keep")
        .count()
}

/// The jobs of this project still queued or running.
fn live_jobs(p: &common::Project) -> Vec<String> {
    let out = std::process::Command::new("squeue")
        .args(["--noheader", "--format=%j|%Z"])
        .output()
        .unwrap();
    let root = p.root().canonicalize().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|line| {
            line.split('|')
                .nth(1)
                .is_some_and(|dir| Path::new(dir) == root)
        })
        .map(|line| line.split('|').next().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn twenty_items_run_as_slurm_jobs_and_are_reused_item_by_item() {
    let _node = cluster().await;
    let p = project(20, 0);
    let first = run_on_slurm(&p, &["--profile", "slurm", "run"]);
    first.success();
    assert_eq!(sbatch_calls(&p), 20);
    assert_eq!(files_in(&p, "out"), 20);
    assert_eq!(p.read("out/task-07"), "task-07 done\n");
    let merged = p.lines("state/work.jsonl");
    assert_eq!(merged.len(), 20);
    assert!(
        merged.iter().all(|l| l.contains("\"class\":\"ok\"")),
        "{merged:?}"
    );

    // Nothing changed: nothing is submitted.
    let again = run_on_slurm(&p, &["--profile", "slurm", "run"]);
    again.success();
    assert!(again.stderr().contains("0 ran"), "{}", again.stderr());
    assert_eq!(sbatch_calls(&p), 20);

    // One more item: one more job.
    let mut items = p.read("items.jsonl");
    items.push_str("{\"id\": \"task-20\", \"sleep\": 0}\n");
    p.file("items.jsonl", &items);
    run_on_slurm(&p, &["--profile", "slurm", "run"]).success();
    assert_eq!(sbatch_calls(&p), 21);
    assert_eq!(p.lines("runs/task-20").len(), 1);

    // Where a stage runs is not what it computes: the same items on this
    // machine are fresh.
    let local = p.cairn(&["run"]);
    local.success();
    assert!(local.stderr().contains("0 ran"), "{}", local.stderr());
}

/// Jobs are waited for with one `squeue` for all of them per interval, not
/// one per job.
#[tokio::test]
async fn one_squeue_reads_the_state_of_every_waiting_job() {
    let _node = cluster().await;
    let p = project(24, 2);
    run_on_slurm(&p, &["--profile", "slurm", "run"]).success();
    assert_eq!(sbatch_calls(&p), 24);
    let polls: Vec<String> = p
        .lines("squeue-calls")
        .into_iter()
        .filter(|call| call.contains("--jobs"))
        .collect();
    let most_ids = polls
        .iter()
        .map(|call| {
            call.split("--jobs ")
                .nth(1)
                .unwrap()
                .split(' ')
                .next()
                .unwrap()
                .split(',')
                .count()
        })
        .max()
        .unwrap();
    assert!(
        most_ids >= 8,
        "no query read a whole wave of jobs: {polls:?}"
    );
    // Polling each job on its own made about ten queries a job here.
    assert!(
        polls.len() < 2 * 24,
        "{} state queries for 24 jobs: {polls:?}",
        polls.len()
    );
}

#[tokio::test]
async fn a_killed_cairn_leaves_its_jobs_running_and_the_next_run_adopts_them() {
    let _node = cluster().await;
    let p = project(6, 6);
    let mut child = cairn_on_slurm(&p, &["--profile", "slurm", "run"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    common::wait_for_within("six submissions", Duration::from_secs(60), || {
        sbatch_calls(&p) == 6
    });
    // Each attempt is on record, with its job, before it ends.
    common::wait_for_within("the attempts on record", Duration::from_secs(30), || {
        (0..6).all(|i| {
            attempts_of(&p, &format!("work/task-{i:02}"))
                .first()
                .is_some_and(|a| a["class"] == "running")
        })
    });
    common::signal(child.id(), libc::SIGKILL);
    child.wait().unwrap();
    assert!(!live_jobs(&p).is_empty(), "the jobs died with cairn");
    let before = attempts_of(&p, "work/task-00");
    assert_eq!(before.len(), 1, "{before:?}");
    assert_eq!(before[0]["class"], "running");
    let job = before[0]["handle"].as_str().unwrap().to_owned();
    assert!(job.starts_with("slurm:"), "{job}");

    let resumed = run_on_slurm(&p, &["--profile", "slurm", "run"]);
    resumed.success();
    // Every job ran once, none was submitted twice.
    assert_eq!(sbatch_calls(&p), 6, "{}", resumed.stderr());
    for i in 0..6 {
        assert_eq!(
            p.lines(&format!("runs/task-{i:02}")).len(),
            1,
            "task-{i:02}"
        );
    }
    assert_eq!(files_in(&p, "out"), 6);
    assert_eq!(p.lines("state/work.jsonl").len(), 6);
    // The killed run's attempt is abandoned; the next run's adopted the
    // very same job.
    let after = attempts_of(&p, "work/task-00");
    let classes: Vec<&str> = after.iter().map(|a| a["class"].as_str().unwrap()).collect();
    assert_eq!(classes, ["abandoned", "ok"], "{after:?}");
    assert_eq!(after[1]["handle"], job.as_str());
    // The adopted job wrote to the killed run's log; its output reaches the
    // attempt's own log, which `classify` reads.
    let log = after[1]["log_path"]
        .as_str()
        .expect("the adopted attempt has a log");
    let text = std::fs::read_to_string(log).unwrap();
    assert!(text.contains("working on task-00"), "{log}: {text:?}");
}

/// `cairn show STAGE/ITEM --json`: the item's attempts.
fn attempts_of(p: &common::Project, item: &str) -> Vec<serde_json::Value> {
    let show = p.cairn(&["show", item, "--json"]);
    show.success();
    serde_json::from_str(&show.stdout()).unwrap()
}

#[tokio::test]
async fn ctrl_c_cancels_the_runs_jobs() {
    let _node = cluster().await;
    // Fewer than the node's CPUs, so that all of them start.
    let p = project(2, 300);
    let mut child = cairn_on_slurm(&p, &["--profile", "slurm", "run"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    common::wait_for_within("two jobs started", Duration::from_secs(60), || {
        files_in(&p, "started") == 2
    });
    assert_eq!(live_jobs(&p).len(), 2);
    common::signal(child.id(), libc::SIGINT);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    common::wait_for_within("the jobs to be cancelled", Duration::from_secs(30), || {
        live_jobs(&p).is_empty()
    });
    assert_eq!(files_in(&p, "out"), 0);
}

#[tokio::test]
async fn a_node_failure_is_infrastructure_and_the_item_is_retried() {
    let _node = cluster().await;
    let p = project(2, 4);
    let child = cairn_on_slurm(&p, &["--profile", "slurm", "run"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    common::wait_for_within("two jobs started", Duration::from_secs(60), || {
        files_in(&p, "started") == 2
    });
    let node = hostname();
    scontrol(&[
        "update",
        &format!("nodename={node}"),
        "state=down",
        "reason=cairn-test",
    ]);
    let _ = std::process::Command::new("scontrol")
        .args(["update", &format!("nodename={node}"), "state=resume"])
        .stderr(std::process::Stdio::null())
        .status();
    let out = child.wait_with_output().unwrap();
    let run = common::Run { output: out };
    run.success();
    assert!(
        run.stderr().contains("infra (attempt 1)"),
        "{}",
        run.stderr()
    );
    // Each item ran twice (the first killed with its node), and ended ok.
    for i in 0..2 {
        assert_eq!(
            p.lines(&format!("runs/task-{i:02}")).len(),
            2,
            "task-{i:02}"
        );
    }
    assert_eq!(sbatch_calls(&p), 4);
    assert_eq!(files_in(&p, "out"), 2);
}

/// A submission Slurm refuses (a busy slurmctld times out) fails that
/// attempt as infrastructure, which is retried; it is no verdict and does
/// not end the stage.
#[tokio::test]
async fn a_refused_submission_is_an_infrastructure_failure_and_retried() {
    let _node = cluster().await;
    let p = project(2, 0);
    // The first `sbatch` call fails as a busy controller's does.
    p.file(
        "shim/sbatch",
        &format!(
            "#!/bin/sh\necho \"$*\" >> '{calls}'\nif mkdir '{refused}' 2>/dev/null; then\n  echo 'sbatch: error: Batch job submission failed: Socket timed out on send/recv operation' >&2\n  exit 1\nfi\nexec /usr/bin/sbatch \"$@\"\n",
            calls = p.path("sbatch-calls").display(),
            refused = p.path("refused").display(),
        ),
    );
    let run = run_on_slurm(&p, &["--profile", "slurm", "run"]);
    run.success();
    assert!(
        run.stderr().contains("infra (attempt 1)"),
        "{}",
        run.stderr()
    );
    assert_eq!(sbatch_calls(&p), 3);
    let attempts: Vec<Vec<serde_json::Value>> = (0..2)
        .map(|i| attempts_of(&p, &format!("work/task-{i:02}")))
        .collect();
    let refused = attempts
        .iter()
        .find(|a| a.len() == 2)
        .unwrap_or_else(|| panic!("no item was retried: {attempts:?}"));
    assert_eq!(refused[0]["class"], "infra");
    assert_eq!(refused[1]["class"], "ok");
    assert!(refused[0]["handle"].is_null(), "{refused:?}");
    let log = std::fs::read_to_string(refused[0]["log_path"].as_str().unwrap()).unwrap();
    assert!(
        log.contains("slurm refused the job") && log.contains("Socket timed out"),
        "{log:?}"
    );
    assert_eq!(files_in(&p, "out"), 2);
}

// ---- items in job arrays -------------------------------------------------

/// The task counts of the job arrays submitted (`--array=0-N`).
fn array_sizes(p: &common::Project) -> Vec<usize> {
    p.lines("sbatch-calls")
        .iter()
        .map(|call| {
            let last = call
                .split_whitespace()
                .find_map(|arg| arg.strip_prefix("--array=0-"))
                .unwrap_or_else(|| panic!("not a job array: {call}"));
            last.parse::<usize>().unwrap() + 1
        })
        .collect()
}

/// The job array and index of an attempt's handle (`slurm:1234_3`).
fn array_task(attempt: &serde_json::Value) -> (String, usize) {
    let handle = attempt["handle"].as_str().unwrap();
    let task = handle.strip_prefix("slurm:").unwrap();
    let (array, index) = task
        .split_once('_')
        .unwrap_or_else(|| panic!("not an array task: {handle}"));
    (array.to_owned(), index.parse().unwrap())
}

#[tokio::test]
async fn items_run_as_job_arrays_and_each_index_is_its_items_own_attempt() {
    let _node = cluster().await;
    let p = project(20, 0);
    let first = run_on_slurm(&p, &["--profile", "arrays", "run"]);
    first.success();
    let sizes = array_sizes(&p);
    assert!(
        sizes.iter().all(|&n| n <= 8) && sizes.iter().sum::<usize>() == 20,
        "{sizes:?}"
    );
    // Items ready together go together: far fewer submissions than items.
    assert!(sizes.len() < 10, "{} submissions: {sizes:?}", sizes.len());
    assert_eq!(files_in(&p, "out"), 20);
    let merged = p.lines("state/work.jsonl");
    assert_eq!(merged.len(), 20);
    assert!(merged.iter().all(|l| l.contains("\"class\":\"ok\"")));
    // Each item is recorded as its own attempt, on its own array task,
    // with its own log holding its own output only.
    let mut tasks = std::collections::BTreeSet::new();
    for i in 0..20 {
        let attempts = attempts_of(&p, &format!("work/task-{i:02}"));
        assert_eq!(attempts.len(), 1, "task-{i:02}: {attempts:?}");
        assert_eq!(attempts[0]["class"], "ok");
        assert!(tasks.insert(array_task(&attempts[0])), "{attempts:?}");
        let log = std::fs::read_to_string(attempts[0]["log_path"].as_str().unwrap()).unwrap();
        assert_eq!(log, format!("working on task-{i:02}\n"), "task-{i:02}");
        assert_eq!(p.lines(&format!("runs/task-{i:02}")).len(), 1);
    }

    // Nothing changed: nothing is submitted. Batching is not what a
    // stage computes: one job per item, or on this machine, is fresh too.
    for profile in [
        &["--profile", "arrays", "run"][..],
        &["--profile", "slurm", "run"],
        &["run"],
    ] {
        let again = run_on_slurm(&p, profile);
        again.success();
        assert!(
            again.stderr().contains("0 ran"),
            "{profile:?}: {}",
            again.stderr()
        );
    }
    assert_eq!(sbatch_calls(&p), sizes.len());
}

#[tokio::test]
async fn an_array_task_cancelled_under_its_item_is_retried_alone() {
    let _node = cluster().await;
    let p = project(6, 3);
    let child = cairn_on_slurm(&p, &["--profile", "arrays", "run"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    common::wait_for_within("task-02 running", Duration::from_secs(60), || {
        p.path("started/task-02").exists()
            && attempts_of(&p, "work/task-02")
                .first()
                .is_some_and(|a| a["class"] == "running")
    });
    let running = attempts_of(&p, "work/task-02");
    let (array, index) = array_task(&running[0]);
    let status = std::process::Command::new("scancel")
        .arg(format!("{array}_{index}"))
        .status()
        .unwrap();
    assert!(status.success());
    let run = common::Run {
        output: child.wait_with_output().unwrap(),
    };
    run.success();
    // The cancelled index is infrastructure, retried in a batch of its own;
    // the others ended ok in the first array.
    let attempts = attempts_of(&p, "work/task-02");
    let classes: Vec<&str> = attempts
        .iter()
        .map(|a| a["class"].as_str().unwrap())
        .collect();
    assert_eq!(classes, ["infra", "ok"], "{attempts:?}");
    assert_ne!(array_task(&attempts[1]).0, array);
    let sizes = array_sizes(&p);
    assert_eq!(sizes.iter().sum::<usize>(), 7, "{sizes:?}");
    assert_eq!(sizes.last(), Some(&1), "{sizes:?}");
    for i in [0, 1, 3, 4, 5] {
        let attempts = attempts_of(&p, &format!("work/task-{i:02}"));
        assert_eq!(attempts.len(), 1, "task-{i:02}: {attempts:?}");
    }
    assert_eq!(files_in(&p, "out"), 6);
}

#[tokio::test]
async fn a_cairn_killed_as_it_submits_an_array_leaves_it_to_the_next_run() {
    let _node = cluster().await;
    let p = project(6, 4);
    let mut child = cairn_on_slurm(&p, &["--profile", "arrays", "run"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Killed as soon as `sbatch` is called: before its attempts can be on
    // record, so only the batch's own record can say where they run.
    common::wait_for_within("the array's submission", Duration::from_secs(60), || {
        sbatch_calls(&p) == 1
    });
    common::signal(child.id(), libc::SIGKILL);
    child.wait().unwrap();
    // `sbatch` outlives cairn and submits the array.
    common::wait_for_within("the array queued", Duration::from_secs(30), || {
        !live_jobs(&p).is_empty()
    });

    let resumed = run_on_slurm(&p, &["--profile", "arrays", "run"]);
    resumed.success();
    assert_eq!(sbatch_calls(&p), 1, "{}", resumed.stderr());
    let mut arrays = std::collections::BTreeSet::new();
    for i in 0..6 {
        assert_eq!(
            p.lines(&format!("runs/task-{i:02}")).len(),
            1,
            "task-{i:02}"
        );
        let attempts = attempts_of(&p, &format!("work/task-{i:02}"));
        let last = attempts.last().unwrap();
        assert_eq!(last["class"], "ok", "{attempts:?}");
        arrays.insert(array_task(last).0);
        let log = std::fs::read_to_string(last["log_path"].as_str().unwrap()).unwrap();
        assert!(log.contains(&format!("working on task-{i:02}")), "{log:?}");
    }
    assert_eq!(arrays.len(), 1, "{arrays:?}");
    assert_eq!(files_in(&p, "out"), 6);
}

// ---- a window across the cluster, through a Slurm license ---------------

const WINDOWED: &str = r#"
[pipeline]
name = "windowed"

[executors.cluster]
kind = "slurm"
poll = "300ms"

[resources]
window = { capacity = 1, hold = "stage" ACROSS }

[stages.work]
executor = "cluster"
foreach = { items = "items.jsonl", key = "id" }
run = "echo $(date +%s.%N) {item.id} >> LOG; sleep 1; echo $(date +%s.%N) {item.id} >> LOG"
resources = ["window"]
outputs = { results = "state/work.jsonl" }
"#;

/// Two projects (two cairn processes, as on two machines) run a stage
/// holding `window` at once, on the one cluster; the span of time each
/// project's commands ran in, from the shared log.
fn two_runs_holding_a_window(across: bool) -> Vec<(f64, f64)> {
    let shared = tempfile::tempdir().unwrap();
    let log = shared.path().join("window.log");
    let projects: Vec<common::Project> = ["p", "q"]
        .iter()
        .map(|name| {
            let p = common::Project::new();
            let manifest = WINDOWED
                .replace("ACROSS", if across { ", across = \"cluster\"" } else { "" })
                .replace("LOG", &log.display().to_string());
            p.file("cairn.toml", &manifest);
            let items: String = (0..3)
                .map(|i| format!("{{\"id\": \"{name}-{i}\"}}\n"))
                .collect();
            p.file("items.jsonl", &items);
            p
        })
        .collect();
    let children: Vec<std::process::Child> = projects
        .iter()
        .map(|p| {
            p.command(&["run"])
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in children {
        let out =
            common::output_within(child, Duration::from_secs(120), "a run holding the window");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for p in &projects {
        assert!(
            std::fs::read_dir(p.path("cache/windows")).map_or(true, |d| d.count() == 0),
            "a heartbeat was left behind"
        );
    }
    common::spans_of_two_projects(&log)
}

/// The jobs named `name` that Slurm still has queued or running.
fn jobs_named(name: &str) -> usize {
    let out = std::process::Command::new("squeue")
        .args(["--noheader", "--name", name, "--format=%i"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).lines().count()
}

#[tokio::test]
async fn a_window_across_the_cluster_is_held_through_a_license_by_one_run_at_a_time() {
    let _node = cluster().await;
    let spans = two_runs_holding_a_window(true);
    assert!(
        !common::overlap(&spans),
        "two runs held the window at once: {spans:?}"
    );
    // Cancelled when the window was released (scancel returns before the
    // job has left the queue).
    common::wait_for_within("the holder jobs to end", Duration::from_secs(30), || {
        jobs_named("cairn-window-window") == 0
    });
    // Control: held within each process only, the two runs overlap.
    let spans = two_runs_holding_a_window(false);
    assert!(
        common::overlap(&spans),
        "the runs did not run side by side: {spans:?}"
    );
}

#[tokio::test]
async fn a_window_on_a_license_the_cluster_lacks_is_a_clear_error() {
    let _node = cluster().await;
    let p = common::Project::new();
    p.file(
        "cairn.toml",
        &WINDOWED
            .replace("ACROSS", ", across = \"cluster\"")
            .replace("LOG", "log.txt")
            .replace("window", "no-such-license"),
    );
    p.file("items.jsonl", "{\"id\": \"a\"}\n");
    let run = p.cairn(&["run"]);
    run.code_is(1);
    assert!(
        run.stderr().contains("Licenses=no-such-license:1")
            && run.stderr().contains("hold the window"),
        "{}",
        run.stderr()
    );
    assert!(!p.exists("log.txt"), "nothing ran without the window");
}

#[tokio::test]
async fn a_window_held_by_a_killed_cairn_is_given_up_once_its_heartbeat_is_old() {
    let _node = cluster().await;
    let shared = tempfile::tempdir().unwrap();
    let log = shared.path().join("window.log");
    let manifest = WINDOWED
        .replace("ACROSS", ", across = \"cluster\"")
        .replace("LOG", &log.display().to_string());
    let first = common::Project::new();
    first.file("cairn.toml", &manifest.replace("sleep 1", "sleep 300"));
    first.file("items.jsonl", "{\"id\": \"first\"}\n");
    let mut child = first
        .command(&["run"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    common::wait_for_within(
        "the first run's command to start",
        Duration::from_secs(60),
        || std::fs::read_to_string(&log).is_ok_and(|l| l.contains("first")),
    );
    common::signal(child.id(), libc::SIGKILL);
    child.wait().unwrap();
    assert_eq!(
        jobs_named("cairn-window-window"),
        1,
        "the holder outlives cairn"
    );

    // Another run waits for the window until the dead run's heartbeat is
    // a minute old, then takes it.
    let second = common::Project::new();
    second.file("cairn.toml", &manifest);
    second.file("items.jsonl", "{\"id\": \"second\"}\n");
    let started = Instant::now();
    let waiting = second
        .command(&["run"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let run = common::Run {
        output: common::output_within(
            waiting,
            Duration::from_secs(180),
            "the run waiting for the lapse",
        ),
    };
    run.success();
    let waited = started.elapsed();
    assert!(
        // At least 60 s after the last beat (every 20 s), less the
        // second `stat` rounds down.
        waited >= Duration::from_secs(35),
        "the window was taken while its holder's heartbeat was fresh ({waited:?})"
    );
    assert!(
        std::fs::read_to_string(&log).unwrap().contains("second"),
        "the second run's command ran"
    );
    // The first run's item job is still running: cancel it, as a later
    // run of that project would.
    let _ = std::process::Command::new("scancel")
        .args(["--name", &live_jobs(&first).join(",")])
        .status();
    common::wait_for_within("the jobs to end", Duration::from_secs(30), || {
        live_jobs(&first).is_empty() && jobs_named("cairn-window-window") == 0
    });
}
