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

mod direct;

use super::{BoxFuture, ExecError, Executor, Job, Outcome, Running, redact_log};
use crate::manifest::Command;
use direct::{Direct, Target};

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

        let (child, as_the_shell) = match &job.command {
            // What the shell would do, without starting a shell; anything
            // that does not go as it would is left to the shell.
            Command::Shell(script) => match direct::parse(script, &job.env, &job.cwd)
                .and_then(|direct| spawn_direct(job, &direct, &writer).ok())
            {
                Some(child) => (Ok(child), true),
                None => (spawn_shell(job, script, &writer), false),
            },
            Command::Exec(argv) => (spawn_exec(job, argv, &writer), false),
        };
        // Our copies of the pipe's write end close here, so the reader
        // sees EOF when the command's do.
        drop(writer);
        let child = child?;
        let guard = GroupGuard(child.id().map(|pid| pid as i32));
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
            as_the_shell,
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
    /// Whether the process stands for `sh -c` (a simple command run
    /// without the shell): its end is reported as the shell would.
    as_the_shell: bool,
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
            as_the_shell,
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
        use std::os::unix::process::ExitStatusExt;
        let outcome = match (status.code(), status.signal()) {
            (Some(0), _) => Outcome::Success,
            (Some(code), _) => Outcome::Exit(code),
            // A command run for the shell ends as the shell would report
            // it: its line about the signal, and its status.
            (None, Some(signal)) if as_the_shell => {
                if let Some(line) = shell_signal_line(signal, status.core_dumped()) {
                    OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&job.log)
                        .and_then(|mut log| std::io::Write::write_all(&mut log, line.as_bytes()))
                        .map_err(log_error)?;
                }
                Outcome::Exit(128 + signal)
            }
            (None, Some(signal)) => Outcome::Signal(signal),
            (None, None) => Outcome::Exit(-1),
        };
        redact_log(&job.log, &job.redact).await.map_err(log_error)?;
        Ok(outcome)
    }
}

/// What the shell (dash) writes to stderr when its command is killed by
/// `signal`: the signal's description, unless it is SIGINT or SIGPIPE.
fn shell_signal_line(signal: i32, core_dumped: bool) -> Option<String> {
    if signal == libc::SIGINT || signal == libc::SIGPIPE {
        return None;
    }
    // SAFETY: strsignal returns a NUL-terminated string, static for the
    // signals the C library knows and in a thread-local buffer otherwise;
    // it is copied at once.
    let description = unsafe { std::ffi::CStr::from_ptr(libc::strsignal(signal)) };
    let core = if core_dumped { " (core dumped)" } else { "" };
    Some(format!("{}{core}\n", description.to_string_lossy()))
}

/// The job's settings every process it may start shares: the declared
/// environment alone, the project root, its own process group, and its
/// standard descriptors.
fn configure(
    command: &mut tokio::process::Command,
    job: &Job,
    [stdin, stdout, stderr]: [Stdio; 3],
) {
    command
        .env_clear()
        .envs(job.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&job.cwd)
        .stdin(stdin)
        .stdout(stdout)
        .stderr(stderr)
        .process_group(0);
}

/// The standard descriptors of a command: `/dev/null` as stdin, stdout
/// and stderr into the log.
fn standard(job: &Job, log: &std::io::PipeWriter) -> Result<[Stdio; 3], ExecError> {
    let to_log = || {
        log.try_clone()
            .map(Stdio::from)
            .map_err(|source| ExecError::Log {
                path: job.log.clone(),
                source,
            })
    };
    Ok([Stdio::null(), to_log()?, to_log()?])
}

/// Runs `script` with `/bin/sh -c`.
fn spawn_shell(
    job: &Job,
    script: &str,
    log: &std::io::PipeWriter,
) -> Result<tokio::process::Child, ExecError> {
    let mut command = tokio::process::Command::new("/bin/sh");
    command.arg("-c").arg(script);
    configure(&mut command, job, standard(job, log)?);
    command.spawn().map_err(|source| ExecError::Spawn {
        program: "/bin/sh".to_owned(),
        source,
    })
}

/// Executes `argv` (a `run` array) directly.
fn spawn_exec(
    job: &Job,
    argv: &[String],
    log: &std::io::PipeWriter,
) -> Result<tokio::process::Child, ExecError> {
    let Some((first, args)) = argv.split_first() else {
        return Err(ExecError::Spawn {
            program: String::new(),
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the command has no program",
            ),
        });
    };
    let program = direct::program_as_the_shell_finds_it(first, &job.env, &job.cwd)
        .unwrap_or_else(|| first.clone().into());
    let mut command = tokio::process::Command::new(program);
    command.arg0(first).args(args);
    configure(&mut command, job, standard(job, log)?);
    command.spawn().map_err(|source| ExecError::Spawn {
        program: first.clone(),
        source,
    })
}

/// Does what the shell would for a simple command: opens its redirections
/// (in order, each as the shell opens it) and executes its program with
/// `PWD` exported. Fails, for the shell to try, on anything that does not
/// go as it would.
fn spawn_direct(
    job: &Job,
    direct: &Direct,
    log: &std::io::PipeWriter,
) -> std::io::Result<tokio::process::Child> {
    use rustix::fs::OFlags;
    /// Where a standard descriptor points.
    enum Points {
        Null,
        Log,
        File(std::fs::File),
    }
    let mut fds = [Points::Null, Points::Log, Points::Log];
    for redirect in &direct.redirects {
        fds[redirect.fd] = match &redirect.to {
            Target::Read(path) => Points::File(open_redirected(path, OFlags::RDONLY)?),
            Target::Write { path, append } => {
                let how = if *append {
                    OFlags::APPEND
                } else {
                    OFlags::TRUNC
                };
                Points::File(open_redirected(
                    path,
                    OFlags::WRONLY | OFlags::CREATE | how,
                )?)
            }
            Target::Copy(from) => match &fds[*from] {
                Points::Null => Points::Null,
                Points::Log => Points::Log,
                Points::File(file) => Points::File(file.try_clone()?),
            },
        };
    }
    let stdio = |points: Points| -> std::io::Result<Stdio> {
        Ok(match points {
            Points::Null => Stdio::null(),
            Points::Log => log.try_clone()?.into(),
            Points::File(file) => file.into(),
        })
    };
    let [stdin, stdout, stderr] = fds;
    let mut command = tokio::process::Command::new(&direct.program);
    command.arg0(&direct.argv[0]).args(&direct.argv[1..]);
    configure(
        &mut command,
        job,
        [stdio(stdin)?, stdio(stdout)?, stdio(stderr)?],
    );
    command.env("PWD", &direct.pwd).spawn()
}

/// Opens a file a command is redirected to or from, as the shell would
/// (with `flags`, mode `0666` less the umask), or fails for the shell to
/// open it instead:
/// - a file that is not a plain file (or `/dev/null`): a FIFO would block
///   cairn, a terminal would notice;
/// - a path through a "magic" link (`/dev/stderr`, `/dev/fd/N`,
///   `/proc/self/fd/N`) or into `/proc`: those name the process that opens
///   them, cairn rather than the command.
fn open_redirected(
    path: &std::path::Path,
    flags: rustix::fs::OFlags,
) -> std::io::Result<std::fs::File> {
    use rustix::fs::{CWD, Mode, OFlags, ResolveFlags};
    let plain =
        |meta: &std::fs::Metadata| meta.is_file() || path == std::path::Path::new("/dev/null");
    match std::fs::metadata(path) {
        Ok(meta) if !plain(&meta) => return Err(std::io::ErrorKind::Unsupported.into()),
        Ok(_) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(error),
    }
    // Not blocking, in case a FIFO took the file's place meanwhile; the
    // flag is taken off again once the file is known to be plain.
    let file: std::fs::File = rustix::fs::openat2(
        CWD,
        path,
        flags | OFlags::CLOEXEC | OFlags::NONBLOCK,
        // (A mode only with `O_CREAT`: openat2 refuses one otherwise.)
        if flags.contains(OFlags::CREATE) {
            Mode::from_raw_mode(0o666)
        } else {
            Mode::empty()
        },
        ResolveFlags::NO_MAGICLINKS,
    )?
    .into();
    const PROC_SUPER_MAGIC: i64 = 0x9fa0;
    let in_proc = rustix::fs::fstatfs(&file)?.f_type as i64 == PROC_SUPER_MAGIC;
    if in_proc || !plain(&file.metadata()?) {
        return Err(std::io::ErrorKind::Unsupported.into());
    }
    rustix::fs::fcntl_setfl(&file, rustix::fs::fcntl_getfl(&file)? - OFlags::NONBLOCK)?;
    Ok(file)
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

#[cfg(test)]
mod tests {
    //! A command run by the local executor has the effects `/bin/sh -c`
    //! has: the same files, output and exit status, whether cairn runs it
    //! without a shell or not.

    use std::collections::BTreeMap;
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;

    use proptest::prelude::*;

    use super::*;
    use crate::exec::Executor;

    /// What a command did: its exit status (a signal as the shell reports
    /// it, 128 + its number), its output, and the files it left.
    #[derive(Debug, PartialEq, Eq)]
    struct Effects {
        status: i32,
        output: String,
        files: BTreeMap<String, String>,
    }

    /// A working directory of a few files: `a.txt`, a script without a
    /// `#!` line, and a `cat` of its own (found first on a `PATH` whose
    /// first entry is empty).
    fn workdir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), "alpha\n").unwrap();
        std::fs::write(dir.path().join("b c.txt"), "beta\n").unwrap();
        for (name, text) in [
            ("no-line", "echo run by the shell: $0\n"),
            ("cat", "#!/bin/sh\necho the local cat \"$@\"\n"),
            ("show-0", "#!/bin/sh\necho \"$0\"\n"),
        ] {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        dir
    }

    fn env(path: &str) -> Vec<(String, String)> {
        vec![
            ("PATH".to_owned(), path.to_owned()),
            ("LANG".to_owned(), "C".to_owned()),
        ]
    }

    fn files(dir: &Path) -> BTreeMap<String, String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| {
                let entry = entry.unwrap();
                let bytes = std::fs::read(entry.path()).unwrap_or_default();
                let text = String::from_utf8_lossy(&bytes).into_owned();
                (entry.file_name().to_string_lossy().into_owned(), text)
            })
            .collect()
    }

    /// Runs `script` as a local job in a fresh working directory.
    async fn through_cairn(script: &str, env: Vec<(String, String)>) -> Effects {
        let dir = workdir();
        let logs = tempfile::tempdir().unwrap();
        let job = Job {
            name: "job".to_owned(),
            token: "token".to_owned(),
            stage: "stage".to_owned(),
            command: Command::Shell(script.to_owned()),
            cwd: dir.path().to_owned(),
            env,
            timeout: None,
            log: logs.path().join("job.log"),
            redact: Vec::new(),
            secrets: Vec::new(),
            image: None,
        };
        let running = LocalExecutor.submit(&job).await.unwrap();
        let status = match running.wait().await.unwrap() {
            Outcome::Success => 0,
            Outcome::Exit(code) => code,
            Outcome::Signal(signal) => 128 + signal,
            other => panic!("{script}: {other:?}"),
        };
        // (No log: the command wrote nothing.)
        let output = std::fs::read(&job.log).unwrap_or_default();
        let output = String::from_utf8_lossy(&output);
        Effects {
            status,
            output: output.replace(&dir.path().display().to_string(), "DIR"),
            files: files(dir.path()),
        }
    }

    /// Runs `script` with `/bin/sh -c` in a fresh working directory, as
    /// the executor runs a command (its environment, stdin `/dev/null`,
    /// stdout and stderr on one pipe).
    fn through_sh(script: &str, env: Vec<(String, String)>) -> Effects {
        let dir = workdir();
        let (mut reader, writer) = std::io::pipe().unwrap();
        let mut child = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(script)
            .env_clear()
            .envs(env)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(writer.try_clone().unwrap())
            .stderr(writer)
            .spawn()
            .unwrap();
        let mut output = Vec::new();
        std::io::Read::read_to_end(&mut reader, &mut output).unwrap();
        let output = String::from_utf8_lossy(&output);
        let status = child.wait().unwrap().code().unwrap();
        Effects {
            status,
            output: output.replace(&dir.path().display().to_string(), "DIR"),
            files: files(dir.path()),
        }
    }

    fn same_effects(script: &str, path: &str) {
        same_effects_in(script, env(path));
    }

    fn same_effects_in(script: &str, env: Vec<(String, String)>) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let cairn = runtime.block_on(through_cairn(script, env.clone()));
        assert_eq!(
            cairn,
            through_sh(script, env.clone()),
            "`{script}` with {env:?}"
        );
    }

    #[test]
    fn commands_have_the_shells_effects() {
        for script in [
            // What the shell hands a program: its name as written, and `PWD`.
            "cat /proc/self/cmdline",
            "printenv PWD",
            // A builtin, not the program of its name.
            "echo -e x",
            "true",
            "false",
            "true --version",
            // A script started by its path gets that path as `$0`.
            "./show-0",
            "./show-0 > out.txt",
            // Leading its own process group, `setsid` would fork.
            "setsid false",
            // Paths that name the process opening them.
            "cat a.txt > /dev/stderr",
            "cat a.txt > /dev/fd/1",
            "cat a.txt 2>/dev/stdout",
            "cat < /proc/self/cmdline",
            "cat 'é.txt' a.txt",
            // A program without a `#!` line is run by the shell.
            "./no-line",
            "./no-line > out.txt",
            // Quotes and escapes.
            "cat 'b c.txt' a\\.txt",
            "cat b\\ c.txt ''",
            "wc -c 'a.txt' b' 'c.txt",
            "ls -d --quoting-style=literal a.txt",
            // Redirections, in the order they are made.
            "cat a.txt > out.txt",
            "cat a.txt>out.txt",
            "cat a.txt >> a.txt",
            "cat < a.txt > out.txt",
            ">out.txt cat a.txt",
            "cat missing 2> err.txt",
            "cat missing > out.txt 2>&1",
            "cat missing 2>&1 > out.txt",
            "cat a.txt 1>&2",
            "cat a.txt >&2 2>err.txt",
            "cat a.txt 2>err.txt >&2",
            "cat a.txt > /dev/null",
            "cat a.txt 0<b\\ c.txt",
            "cat a.txt2>out.txt",
            "cat a.txt 12>out.txt",
            "cat a.txt 3> out.txt",
            "cat a.txt >| out.txt",
            // What cannot be opened, or found.
            "cat a.txt > nowhere/out.txt",
            "cat < missing",
            "cat a.txt > .",
            "no-such-program x > out.txt",
            // Signals, as the shell reports them.
            "sh -c 'kill -9 $$'",
            "sh -c 'kill -TERM $$' > out.txt",
            "sh -c 'kill -INT $$'",
            "sh -c 'kill -PIPE $$'",
            // Things only the shell does.
            "cat a.txt | wc -c",
            "X=1 printenv X",
            "cat *.txt",
            "cat ~/a.txt",
            "cat $HOME",
        ] {
            same_effects(script, "/usr/bin:/bin");
        }
    }

    /// A path naming the process that opens it is the command's, not
    /// cairn's: a descriptor cairn holds open is no file to the command.
    #[test]
    fn a_descriptor_of_cairns_is_not_the_commands() {
        let held = tempfile::tempfile().unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&held);
        for script in [
            format!("cat a.txt > /dev/fd/{fd}"),
            format!("cat < /proc/self/fd/{fd}"),
        ] {
            same_effects(&script, "/usr/bin:/bin");
        }
        assert_eq!(
            held.metadata().unwrap().len(),
            0,
            "cairn's file was written"
        );
    }

    /// A redirected file is opened by cairn itself: no shell is started.
    #[test]
    fn redirections_start_no_shell() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        for script in [
            "cat /proc/self/stat > out.txt",
            "cat < a.txt /proc/self/stat >> out.txt 2>&1",
        ] {
            let effects = runtime.block_on(through_cairn(script, env("/usr/bin:/bin")));
            assert_eq!(effects.status, 0);
            // pid (comm) state ppid …
            let stat = &effects.files["out.txt"];
            let ppid = stat.rsplit(") ").next().unwrap().split(' ').nth(1).unwrap();
            assert_eq!(ppid, std::process::id().to_string(), "{script}: {stat}");
        }
    }

    /// An empty entry of `PATH` is the working directory, which holds a
    /// `cat` of its own.
    #[test]
    fn an_empty_path_entry_is_the_working_directory() {
        for path in [":/usr/bin:/bin", "/usr/bin:/bin:", "/nowhere::/usr/bin"] {
            same_effects("cat a.txt", path);
            same_effects("cat a.txt > out.txt", path);
        }
    }

    /// Variables the shell sets or drops whatever the environment says.
    #[test]
    fn variables_the_shell_replaces_are_the_shells() {
        for (name, value) in [
            ("PPID", "5"),
            ("OPTIND", "7"),
            ("IFS", "x"),
            ("A-B", "1"),
            ("é", "2"),
        ] {
            let mut env = env("/usr/bin:/bin");
            env.push((name.to_owned(), value.to_owned()));
            same_effects_in(&format!("printenv {name}"), env);
        }
    }

    /// `true` and `false` are the shell's own, whatever `PATH` holds.
    #[test]
    fn true_and_false_are_the_shells() {
        let bin = tempfile::tempdir().unwrap();
        for name in ["true", "false"] {
            let path = bin.path().join(name);
            std::fs::write(&path, "#!/bin/sh\nexit 7\n").unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let path = format!("{}:/usr/bin:/bin", bin.path().display());
        for script in ["true", "false", "true > out.txt"] {
            same_effects(script, &path);
        }
    }

    /// A piece of a command: words, quotes, escapes, redirections.
    fn piece() -> impl Strategy<Value = &'static str> {
        prop::sample::select(vec![
            "cat",
            "wc",
            "-c",
            "a.txt",
            "'b c.txt'",
            "b\\ c.txt",
            "missing",
            "''",
            "out1",
            "out2",
            ">",
            ">>",
            "<",
            "2>",
            "1>",
            "0<",
            "2>&1",
            ">&2",
            "1>&2",
            "x=y",
            "'é'",
            "\\'",
            "'>'",
            "a.txt'2'",
            "2",
            "-",
            " ",
            " ",
            " ",
        ])
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Whatever the command, cairn's way and the shell's agree.
        #[test]
        fn any_command_has_the_shells_effects(
            program in prop::sample::select(vec!["cat", "wc -c", "2>out1 cat", "cat a.txt"]),
            pieces in prop::collection::vec(piece(), 0..6),
        ) {
            let script = format!("{program} {}", pieces.concat());
            same_effects(&script, "/usr/bin:/bin");
        }
    }
}
