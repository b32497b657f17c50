//! Runs a job as a local process.
//!
//! The child gets its own process group, the project root as working
//! directory, a cleared environment plus what the job declares, `/dev/null`
//! as stdin, and its stdout and stderr appended (interleaved, in order) to
//! the job's log file. When the job ends, times out or is dropped (Ctrl-C,
//! `--keep-going` off and another stage failed), the whole process group is
//! killed, so no grandchild outlives its stage.

use std::fs::OpenOptions;
use std::process::Stdio;

use super::{ExecError, Executor, Job, Outcome};
use crate::manifest::Command;

#[derive(Debug, Default, Clone)]
pub struct LocalExecutor;

/// Kills a process group when dropped.
struct GroupGuard(Option<i32>);

impl GroupGuard {
    fn kill(&mut self) {
        if let Some(pgid) = self.0.take() {
            // SAFETY: kill(2) with a negative pid signals that process group;
            // it has no memory-safety preconditions.
            unsafe {
                libc::kill(-pgid, libc::SIGKILL);
            }
        }
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

impl Executor for LocalExecutor {
    async fn run(&self, job: &Job) -> Result<Outcome, ExecError> {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&job.log)
            .map_err(|e| ExecError::Log {
                path: job.log.clone(),
                source: e,
            })?;
        let log_err = log.try_clone().map_err(|e| ExecError::Log {
            path: job.log.clone(),
            source: e,
        })?;

        let mut command = match &job.command {
            Command::Shell(script) => {
                let mut c = tokio::process::Command::new("/bin/sh");
                c.arg("-c").arg(script);
                c
            }
            Command::Exec(argv) => {
                let mut c = tokio::process::Command::new(&argv[0]);
                c.args(&argv[1..]);
                c
            }
        };
        command
            .env_clear()
            .envs(job.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&job.cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err))
            .process_group(0);
        // If cairn itself dies (even by SIGKILL), its direct child is killed
        // too rather than left running unsupervised.
        #[cfg(target_os = "linux")]
        // SAFETY: the closure runs in the forked child before exec and only
        // calls prctl(2), which is async-signal-safe.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }

        let mut child = command.spawn().map_err(|source| ExecError::Spawn {
            program: match &job.command {
                Command::Shell(_) => "/bin/sh".to_owned(),
                Command::Exec(argv) => argv[0].clone(),
            },
            source,
        })?;
        let mut guard = GroupGuard(child.id().map(|pid| pid as i32));

        let status = match job.timeout {
            None => child.wait().await,
            Some(limit) => match tokio::time::timeout(limit, child.wait()).await {
                Ok(status) => status,
                Err(_) => {
                    guard.kill();
                    let _ = child.wait().await;
                    return Ok(Outcome::TimedOut(limit));
                }
            },
        }
        .map_err(ExecError::Wait)?;
        // Stragglers (background processes the command left) go too.
        guard.kill();

        use std::os::unix::process::ExitStatusExt;
        Ok(match (status.code(), status.signal()) {
            (Some(0), _) => Outcome::Success,
            (Some(code), _) => Outcome::Exit(code),
            (None, Some(signal)) => Outcome::Signal(signal),
            (None, None) => Outcome::Exit(-1),
        })
    }
}
