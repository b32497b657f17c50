//! This machine's processes: the mark every process a run starts carries,
//! finding and killing what a killed run left, and the environment every
//! command starts from.

/// The variable that marks every process a run starts (its value is the
/// run's token), inherited by their children.
pub const RUN_MARKER: &str = "CAIRN_RUN";

/// Kills every process whose environment carries `RUN_MARKER=token`: what
/// a cairn process that was itself killed (`kill -9`) left running. Returns
/// how many were signalled. Processes that dropped their environment are not
/// found; nor, on systems without `/proc`, is anything.
pub fn kill_marked_processes(token: &str) -> usize {
    let needle = format!("{RUN_MARKER}={token}");
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut killed = 0;
    // One buffer, large enough for most environments: `std::fs::read`
    // would start from a few bytes (a `/proc` file has no size) and read
    // a typical environment in eight calls.
    let mut environ = Vec::with_capacity(16 * 1024);
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if pid <= 1 || pid == std::process::id() as i32 {
            continue;
        }
        environ.clear();
        let read = std::fs::File::open(entry.path().join("environ"))
            .and_then(|mut file| std::io::Read::read_to_end(&mut file, &mut environ));
        if read.is_err() {
            continue;
        }
        if environ
            .split(|b| *b == 0)
            .any(|var| var == needle.as_bytes())
        {
            // SAFETY: kill(2) has no memory-safety preconditions.
            if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
                killed += 1;
            }
        }
    }
    killed
}

/// The base environment every command gets, before declared variables.
pub fn base_environment() -> Vec<(String, String)> {
    ["PATH", "HOME", "LANG", "TMPDIR"]
        .iter()
        .filter_map(|name| {
            std::env::var(name)
                .ok()
                .map(|value| ((*name).to_owned(), value))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;
    use std::time::{Duration, Instant};

    use super::*;

    /// Waits until process `pid` runs with `needle` in its environment
    /// (after its `exec`; before, it has its parent's).
    fn wait_for_environment(pid: u32, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            if environ
                .split(|b| *b == 0)
                .any(|var| var == needle.as_bytes())
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        panic!("process {pid} never ran with `{needle}`");
    }

    #[test]
    fn only_the_processes_carrying_the_runs_mark_are_killed_however_large_their_environment() {
        let token = format!("mark-test-{}", std::process::id());
        // Larger than the buffer the environments are read into.
        let large = "x".repeat(40_000);
        let spawn = |mark: &str| {
            std::process::Command::new("sleep")
                .arg("30")
                .env(RUN_MARKER, mark)
                .env("LARGE", &large)
                .spawn()
                .unwrap()
        };
        let mut marked = spawn(&token);
        let mut other = spawn("another-run");
        wait_for_environment(marked.id(), &format!("{RUN_MARKER}={token}"));
        wait_for_environment(other.id(), &format!("{RUN_MARKER}=another-run"));

        assert_eq!(kill_marked_processes(&token), 1);
        assert_eq!(marked.wait().unwrap().signal(), Some(libc::SIGKILL));
        assert!(
            other.try_wait().unwrap().is_none(),
            "the other run's process was killed"
        );
        other.kill().unwrap();
        other.wait().unwrap();
    }
}
