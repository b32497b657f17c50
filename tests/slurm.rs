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
