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
        // One pipe for stdout and stderr keeps their order; the log file is
        // created only when the first byte arrives, so quiet stages leave
        // no empty files behind.
        let (reader, writer) = std::io::pipe().map_err(|e| ExecError::Log {
            path: job.log.clone(),
            source: e,
        })?;
        let writer_err = writer.try_clone().map_err(|e| ExecError::Log {
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
            .stdout(Stdio::from(writer))
            .stderr(Stdio::from(writer_err))
            .process_group(0);
        let mut child = command.spawn().map_err(|source| ExecError::Spawn {
            program: match &job.command {
                Command::Shell(_) => "/bin/sh".to_owned(),
                Command::Exec(argv) => argv[0].clone(),
            },
            source,
        })?;
        let mut guard = GroupGuard(child.id().map(|pid| pid as i32));
        // Close our copies of the pipe's write end, so the reader sees EOF.
        drop(command);
        let log_path = job.log.clone();
        let receiver =
            tokio::net::unix::pipe::Receiver::from_owned_fd(std::os::fd::OwnedFd::from(reader))
                .map_err(|e| ExecError::Log {
                    path: job.log.clone(),
                    source: e,
                })?;
        let drain = tokio::spawn(copy_to_log(receiver, log_path));

        let status = match job.timeout {
            None => child.wait().await,
            Some(limit) => match tokio::time::timeout(limit, child.wait()).await {
                Ok(status) => status,
                Err(_) => {
                    guard.kill();
                    let _ = child.wait().await;
                    let _ = drain.await;
                    return Ok(Outcome::TimedOut(limit));
                }
            },
        }
        .map_err(ExecError::Wait)?;
        // Stragglers (background processes the command left) go too.
        guard.kill();
        drain
            .await
            .map_err(|e| ExecError::Wait(std::io::Error::other(e)))?
            .map_err(|e| ExecError::Log {
                path: job.log.clone(),
                source: e,
            })?;

        use std::os::unix::process::ExitStatusExt;
        Ok(match (status.code(), status.signal()) {
            (Some(0), _) => Outcome::Success,
            (Some(code), _) => Outcome::Exit(code),
            (None, Some(signal)) => Outcome::Signal(signal),
            (None, None) => Outcome::Exit(-1),
        })
    }
}

/// Appends everything read from `reader` to the log at `path`, creating the
/// file on the first byte.
async fn copy_to_log(
    mut reader: tokio::net::unix::pipe::Receiver,
    path: std::path::PathBuf,
) -> std::io::Result<()> {
    use std::io::Write;
    use tokio::io::AsyncReadExt;
    let mut buf = vec![0u8; 16 * 1024];
    let mut log: Option<std::fs::File> = None;
    loop {
        let n = reader.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        let file = match &mut log {
            Some(file) => file,
            None => log.insert(OpenOptions::new().create(true).append(true).open(&path)?),
        };
        file.write_all(&buf[..n])?;
    }
}
