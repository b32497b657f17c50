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

use super::{BoxFuture, ExecError, Executor, Job, Outcome, Running, redact_log};
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

impl LocalExecutor {
    /// Starts the job's process; see the module documentation.
    fn spawn(&self, job: &Job) -> Result<LocalRunning, ExecError> {
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
            Command::Shell(script) => match simple_command(script, &job.env, &job.cwd) {
                // What the shell would do, without starting a shell.
                Some((program, argv)) => {
                    let mut c = tokio::process::Command::new(program);
                    c.args(&argv[1..]);
                    c
                }
                None => {
                    let mut c = tokio::process::Command::new("/bin/sh");
                    c.arg("-c").arg(script);
                    c
                }
            },
            Command::Exec(argv) => {
                let Some((first, args)) = argv.split_first() else {
                    return Err(ExecError::Spawn {
                        program: String::new(),
                        source: std::io::Error::new(
                            std::io::ErrorKind::InvalidInput,
                            "the command has no program",
                        ),
                    });
                };
                let program = resolve_program(first, &job.env, &job.cwd)
                    .unwrap_or_else(|| first.clone().into());
                let mut c = tokio::process::Command::new(program);
                c.args(args);
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
        let child = command.spawn().map_err(|source| ExecError::Spawn {
            program: match &job.command {
                Command::Shell(_) => "/bin/sh".to_owned(),
                Command::Exec(argv) => argv.first().cloned().unwrap_or_default(),
            },
            source,
        })?;
        let guard = GroupGuard(child.id().map(|pid| pid as i32));
        // Close our copies of the pipe's write end, so the reader sees EOF.
        drop(command);
        let log_path = job.log.clone();
        // Our end of the pipe is known to be a pipe's read end: it need
        // only stop blocking (and its access mode not be asked for).
        let reader = std::os::fd::OwnedFd::from(reader);
        let receiver = rustix::fs::fcntl_setfl(&reader, rustix::fs::OFlags::NONBLOCK)
            .map_err(std::io::Error::from)
            .and_then(|()| tokio::net::unix::pipe::Receiver::from_owned_fd_unchecked(reader))
            .map_err(|e| ExecError::Log {
                path: job.log.clone(),
                source: e,
            })?;
        let drain = tokio::spawn(copy_to_log(receiver, log_path));

        Ok(LocalRunning {
            child,
            guard,
            drain,
            job: job.clone(),
        })
    }
}

impl Executor for LocalExecutor {
    fn kind(&self) -> &'static str {
        "local"
    }

    fn uses_local_slots(&self) -> bool {
        true
    }

    /// A dead run's processes (`pid:N`) were killed when this run began
    /// (`kill_marked_processes`): nothing is left to cancel.
    fn cancel_handle<'a>(&'a self, handle: &'a str) -> BoxFuture<'a, Result<bool, ExecError>> {
        Box::pin(async move { Ok(is_local_handle(handle)) })
    }

    fn submit<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, Result<Box<dyn Running>, ExecError>> {
        Box::pin(async move { Ok(Box::new(self.spawn(job)?) as Box<dyn Running>) })
    }

    /// A local job never outlives its run: what a killed cairn left running
    /// is killed when the next run begins (`kill_marked_processes`).
    fn attach<'a>(
        &'a self,
        _job: &'a Job,
    ) -> BoxFuture<'a, Result<Option<Box<dyn Running>>, ExecError>> {
        Box::pin(async { Ok(None) })
    }
}

/// Whether a job handle names a process on this machine (`pid:N`), which
/// carries cairn's mark and is found by it, not by its record.
pub fn is_local_handle(handle: &str) -> bool {
    handle.starts_with(LOCAL_HANDLE)
}

/// What a local job's handle starts with; its process id follows.
const LOCAL_HANDLE: &str = "pid:";

/// A process started by [`LocalExecutor`]: dropping it kills its group.
struct LocalRunning {
    child: tokio::process::Child,
    guard: GroupGuard,
    drain: tokio::task::JoinHandle<std::io::Result<()>>,
    job: Job,
}

impl Running for LocalRunning {
    fn handle(&self) -> String {
        format!("{LOCAL_HANDLE}{}", self.guard.0.unwrap_or_default())
    }

    fn wait(self: Box<Self>) -> BoxFuture<'static, Result<Outcome, ExecError>> {
        Box::pin(self.finish())
    }
}

impl LocalRunning {
    async fn finish(self) -> Result<Outcome, ExecError> {
        let LocalRunning {
            mut child,
            mut guard,
            drain,
            job,
        } = self;
        let log_error = |source| ExecError::Log {
            path: job.log.clone(),
            source,
        };
        let status = match job.timeout {
            None => child.wait().await,
            Some(limit) => match tokio::time::timeout(limit, child.wait()).await {
                Ok(status) => status,
                Err(_) => {
                    guard.kill();
                    let _ = child.wait().await;
                    let _ = drain.await;
                    redact_log(&job.log, &job.redact).await.map_err(log_error)?;
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
            .map_err(log_error)?;
        redact_log(&job.log, &job.redact).await.map_err(log_error)?;

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

/// The words of a shell command that needs no shell: only plain words
/// (no quotes, variables, globs, redirections, pipes, separators or
/// escapes), a program that is not a shell builtin or keyword, found on the
/// command's `PATH`. For such a command `sh -c` would do exactly this exec,
/// so cairn skips the shell, as make does: one process per command, not
/// two.
fn simple_command(
    script: &str,
    env: &[(String, String)],
    cwd: &std::path::Path,
) -> Option<(std::path::PathBuf, Vec<String>)> {
    let plain = |c: char| {
        c.is_ascii_alphanumeric()
            || matches!(c, '_' | '.' | '/' | '-' | '+' | ',' | ':' | '@' | '%')
    };
    if !script.chars().all(|c| plain(c) || c == ' ' || c == '\t') {
        return None;
    }
    let argv: Vec<String> = script.split_whitespace().map(str::to_owned).collect();
    let program = argv.first()?;
    const SHELL_WORDS: &[&str] = &[
        ".", ":", "alias", "bg", "break", "cd", "command", "continue", "eval", "exec", "exit",
        "export", "fc", "fg", "getopts", "hash", "jobs", "read", "readonly", "return", "set",
        "shift", "times", "trap", "type", "ulimit", "umask", "unalias", "unset", "wait", "if",
        "then", "else", "elif", "fi", "for", "while", "until", "do", "done", "case", "esac",
        "function", "select", "time", "!", "source", "local",
    ];
    if SHELL_WORDS.contains(&program.as_str()) {
        return None;
    }
    let program = resolve_program(program, env, cwd)?;
    Some((program, argv))
}

/// The file a program name runs, looked up on the command's own `PATH`.
/// Spawning an absolute path lets the standard library use `posix_spawn`
/// (a program to look up on a changed `PATH` makes it fork instead, which
/// costs a copy of cairn's page tables per command).
fn resolve_program(
    program: &str,
    env: &[(String, String)],
    cwd: &std::path::Path,
) -> Option<std::path::PathBuf> {
    if program.contains('/') {
        let path = cwd.join(program);
        return is_executable_file(&path).then_some(path);
    }
    let path = env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str())?;
    path.split(':')
        .filter(|dir| !dir.is_empty())
        .map(|dir| std::path::Path::new(dir).join(program))
        .find(|candidate| is_executable_file(candidate))
}

fn is_executable_file(path: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::simple_command;

    fn env() -> Vec<(String, String)> {
        vec![("PATH".to_owned(), "/usr/bin:/bin".to_owned())]
    }

    #[test]
    fn plain_commands_skip_the_shell() {
        let (program, argv) =
            simple_command("cp in/1.txt out/1.txt", &env(), std::path::Path::new("/")).unwrap();
        assert!(program.ends_with("cp"), "{}", program.display());
        assert_eq!(argv, ["cp", "in/1.txt", "out/1.txt"]);
    }

    #[test]
    fn anything_the_shell_would_interpret_keeps_the_shell() {
        for script in [
            "cp a b > c",
            "echo $HOME",
            "ls *.txt",
            "a; b",
            "a && b",
            "a | b",
            "echo 'x y'",
            "echo \"x\"",
            "cd dir",
            "exit 3",
            "X=1 env",
            "echo ~",
            "echo a\\b",
            "sleep 1 &",
            "no-such-program-anywhere x",
        ] {
            assert_eq!(
                simple_command(script, &env(), std::path::Path::new("/")),
                None,
                "{script}"
            );
        }
    }
}
