//! A window across a Slurm cluster, through a Slurm license.
//!
//! slurmctld counts licenses cluster-wide (`Licenses=NAME:1` in
//! slurm.conf): while a job holding one runs, no other job asking for it
//! starts. cairn takes the window by submitting a small *holder* job that
//! asks for the license `NAME` and does nothing but wait; once it runs,
//! the window is this run's, and the stage's own jobs (which ask for no
//! license) run beside it. Releasing the window cancels the holder.
//!
//! A cairn killed outright cannot cancel its holder, so the holder watches
//! a heartbeat: a file under the project root (which every node sees, as
//! the executor requires) that cairn touches every [`BEAT`]. A holder whose
//! heartbeat is older than [`LAPSE`] ends, and the window with it: the same
//! 60 s a Kubernetes Lease takes to lapse.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::{SlurmExecutor, SlurmJob, run_client, slurm_client_env};
use crate::exec::{BoxFuture, ExecError, HeldWindow, Job};
use crate::manifest::shell::quote_word;

/// How often cairn touches the heartbeat.
const BEAT: Duration = Duration::from_secs(20);
/// How old a heartbeat may be before the holder gives the window up.
const LAPSE: Duration = Duration::from_secs(60);

/// The window `window` held by a running holder job.
struct SlurmWindow {
    holder: Option<SlurmJob>,
    heartbeat: Heartbeat,
    /// Warns if the holder ends while the window is held.
    watching: Option<tokio::task::JoinHandle<()>>,
}

/// A thread of its own that touches the heartbeat file every [`BEAT`]
/// (the scheduler's thread may be busy for longer than that), until
/// dropped.
struct Heartbeat {
    path: PathBuf,
    _stop: std::sync::mpsc::Sender<()>,
}

impl Heartbeat {
    fn start(path: PathBuf) -> std::io::Result<Self> {
        touch(&path)?;
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let beating = path.clone();
        std::thread::spawn(move || {
            // Ends when the sender is dropped.
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(BEAT) {
                if let Err(error) = touch(&beating) {
                    tracing::warn!(path = %beating.display(), error = %error, "could not renew a window's heartbeat");
                }
            }
        });
        Ok(Heartbeat { path, _stop: stop })
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl SlurmExecutor {
    /// Takes the window `window` for `job`'s run, waiting while another
    /// run's holder job has the license.
    pub(super) async fn hold_license(
        &self,
        window: &str,
        job: &Job,
    ) -> Result<Box<dyn HeldWindow>, ExecError> {
        let heartbeat = heartbeat_path(&job.cwd, window, &job.token);
        if let Some(dir) = heartbeat.parent() {
            remove_lapsed(dir);
        }
        // From here on, dropping `held` (the run stopped while waiting)
        // cancels the holder and stops the heartbeat.
        let mut held = SlurmWindow {
            holder: None,
            heartbeat: Heartbeat::start(heartbeat).map_err(ExecError::Wait)?,
            watching: None,
        };
        let holder = self
            .submit_holder(window, job, &held.heartbeat.path)
            .await?;
        held.holder = Some(holder.clone());
        tracing::info!(window, job = %holder.id, "waiting for the license that holds the window");
        self.wait_running(&holder)
            .await
            .map_err(|error| match error {
                ExecError::Engine { detail, .. } => ExecError::Engine {
                    engine: "slurm",
                    action: "hold the window",
                    detail: format!("the holder job of window `{window}` {detail}"),
                },
                other => other,
            })?;
        held.watching = Some(tokio::spawn(
            self.clone().watch_holder(holder, window.to_owned()),
        ));
        Ok(Box::new(held))
    }

    /// Submits the job that holds license `window` while `heartbeat` is
    /// fresh.
    async fn submit_holder(
        &self,
        window: &str,
        job: &Job,
        heartbeat: &Path,
    ) -> Result<SlurmJob, ExecError> {
        let name = format!("cairn-window-{window}");
        let mut args = vec![
            "--parsable".to_owned(),
            format!("--job-name={name}"),
            format!("--licenses={window}:1"),
            format!("--chdir={}", job.cwd.display()),
            "--output=/dev/null".to_owned(),
            "--no-requeue".to_owned(),
            "--cpus-per-task=1".to_owned(),
            format!("--comment=cairn-run={}", job.token),
        ];
        let s = &self.settings;
        args.extend(s.partition.iter().map(|p| format!("--partition={p}")));
        args.extend(s.account.iter().map(|a| format!("--account={a}")));
        // The executor's time limit, if it has one, else the partition's
        // default: a holder that reaches it ends, and the watcher says so.
        args.extend(
            s.time_limit
                .map(|d| format!("--time={}", d.as_secs().div_ceil(60).max(1))),
        );
        // What the site asks of every job (a QOS, a reservation).
        args.extend(s.sbatch_args.iter().cloned());
        let script = holder_script(heartbeat);
        let out = sbatch(window, &args, &script).await?;
        let id = out.trim().split(';').next().unwrap_or_default();
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
            return Err(ExecError::Engine {
                engine: "slurm",
                action: "hold the window",
                detail: format!("sbatch printed no job id: {out}"),
            });
        }
        Ok(SlurmJob {
            id: id.to_owned(),
            name,
        })
    }

    /// Waits until `job` runs; an error if it ends first.
    async fn wait_running(&self, job: &SlurmJob) -> Result<(), ExecError> {
        let (mut seen, _waiting) = self.watch(&job.id);
        let ended = |detail: String| ExecError::Engine {
            engine: "slurm",
            action: "hold the window",
            detail,
        };
        loop {
            match seen.borrow_and_update().clone() {
                super::Seen::Unknown => {}
                super::Seen::State(state) if state.state == "RUNNING" => return Ok(()),
                super::Seen::State(state) if !super::has_ended(&state.state) => {}
                super::Seen::State(state) => {
                    return Err(ended(format!("ended ({}) before it ran", state.state)));
                }
                super::Seen::Forgotten => return Err(ended("vanished before it ran".to_owned())),
                super::Seen::Failed(detail) => return Err(ended(detail)),
            }
            let _ = seen.changed().await;
        }
    }

    /// Warns if `holder` ends while its window is held (a time limit, a
    /// lost node): another run may then take the window.
    async fn watch_holder(self, holder: SlurmJob, window: String) {
        let (mut seen, _waiting) = self.watch(&holder.id);
        loop {
            let lost = match seen.borrow_and_update().clone() {
                super::Seen::State(state) if super::has_ended(&state.state) => Some(state.state),
                super::Seen::Forgotten => Some("forgotten".to_owned()),
                _ => None,
            };
            if let Some(state) = lost {
                tracing::warn!(
                    window = %window,
                    job = %holder.id,
                    "the job holding the window ended ({state}) while the window was held: another run may take it"
                );
                return;
            }
            if seen.changed().await.is_err() {
                return;
            }
        }
    }
}

impl Drop for SlurmWindow {
    fn drop(&mut self) {
        if let Some(watching) = self.watching.take() {
            watching.abort();
        }
        if let Some(holder) = self.holder.take() {
            // Blocking, and brief: a window dropped unreleased belongs to a
            // run that is stopping.
            let _ = std::process::Command::new("scancel")
                .arg(&holder.id)
                .envs(slurm_client_env())
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}

impl HeldWindow for SlurmWindow {
    fn release(mut self: Box<Self>) -> BoxFuture<'static, Result<(), ExecError>> {
        Box::pin(async move {
            if let Some(watching) = self.watching.take() {
                watching.abort();
            }
            let Some(holder) = self.holder.take() else {
                return Ok(());
            };
            // A slurmctld busy for a moment may refuse once; the holder
            // also ends on its own once the heartbeat (dropped with `self`)
            // is gone.
            let mut last = Ok(String::new());
            for _ in 0..3 {
                last = run_client("scancel", &[&holder.id]).await;
                if last.is_ok() {
                    break;
                }
            }
            last.map(drop)
        })
    }
}

/// Where the heartbeat of `token`'s hold on `window` lies under `root`:
/// one file per hold, so a holder left by an earlier hold of the same run
/// (whose cancellation failed) never sees this one's beat as its own.
fn heartbeat_path(root: &Path, window: &str, token: &str) -> PathBuf {
    static HOLDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let hold = HOLDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let token: String = token
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(16)
        .collect();
    crate::store::layout::windows(root).join(format!("{window}.{token}.{hold}.alive"))
}

/// Removes the heartbeats in `dir` that lapsed long ago (of runs killed
/// outright, whose holders have ended).
fn remove_lapsed(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.path().extension().is_none_or(|e| e != "alive") {
            continue;
        }
        let lapsed = entry
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|at| at.elapsed().is_ok_and(|age| age > LAPSE * 2));
        if lapsed {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Creates `path` (and its folder), or sets its time to now.
fn touch(path: &Path) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)?
        .set_modified(SystemTime::now())
}

/// The holder's script: wait while the heartbeat exists and is fresh.
fn holder_script(heartbeat: &Path) -> String {
    let path = quote_word(&heartbeat.to_string_lossy());
    format!(
        "#!/bin/sh\n\
         # Holds a cairn window while the run that took it is alive.\n\
         while [ -f {path} ] && [ $(( $(date +%s) - $(stat -c %Y {path}) )) -lt {lapse} ]; do sleep 2; done\n",
        lapse = LAPSE.as_secs()
    )
}

/// Runs `sbatch ARGS` with `script` on stdin; its stdout.
async fn sbatch(window: &str, args: &[String], script: &str) -> Result<String, ExecError> {
    let mut child = tokio::process::Command::new("sbatch")
        .args(args)
        .env_clear()
        .envs(slurm_client_env())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| ExecError::Spawn {
            program: "sbatch".to_owned(),
            source,
        })?;
    super::feed(&mut child, script.as_bytes()).await?;
    let out = child.wait_with_output().await.map_err(ExecError::Wait)?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let help = if stderr.contains("icense") {
            format!(" (is the license configured? `Licenses={window}:1` in slurm.conf)")
        } else {
            String::new()
        };
        return Err(ExecError::Engine {
            engine: "slurm",
            action: "hold the window",
            detail: format!("sbatch: {}{help}", stderr.trim()),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_holder_waits_on_a_quoted_heartbeat() {
        let script = holder_script(Path::new("/data/my root/cache/windows/w.abc.alive"));
        assert!(
            script.contains("[ -f '/data/my root/cache/windows/w.abc.alive' ]"),
            "{script}"
        );
        assert!(script.contains("-lt 60 ]"), "{script}");
    }

    #[test]
    fn a_heartbeat_is_named_by_window_and_token() {
        let first = heartbeat_path(Path::new("/r"), "cluster-window", "tok/en-1234");
        let second = heartbeat_path(Path::new("/r"), "cluster-window", "tok/en-1234");
        let name = first.file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.starts_with("cluster-window.token1234."), "{name}");
        assert!(name.ends_with(".alive"), "{name}");
        assert_eq!(first.parent(), Some(Path::new("/r/cache/windows")));
        assert_ne!(first, second, "each hold beats on a file of its own");
    }
}
