//! A process group a service runs in: stopped with a grace period for
//! every process of it, killed when dropped.

use std::time::{Duration, Instant};

use super::{READY_POLL, STOP_GRACE};

/// A process group cairn started (a service, its check): killed when
/// dropped.
pub(super) struct ServiceProcess {
    pub(super) child: tokio::process::Child,
    group: Option<i32>,
}

impl ServiceProcess {
    pub(super) fn spawned(child: tokio::process::Child) -> Self {
        let group = child.id().map(|pid| pid as i32);
        Self { child, group }
    }

    pub(super) fn signal(&self, signal: i32) {
        if let Some(group) = self.group {
            // SAFETY: kill(2) with a negative pid signals that process group;
            // it has no memory-safety preconditions.
            unsafe {
                libc::kill(-group, signal);
            }
        }
    }

    /// How it ended, if it has.
    pub(super) fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// SIGTERM to the whole group, a grace period for every process in it
    /// (not only the first: a shell's server child outlives the shell),
    /// then SIGKILL.
    pub(super) async fn stop(mut self) {
        self.signal(libc::SIGTERM);
        let deadline = Instant::now() + STOP_GRACE;
        let _ = tokio::time::timeout(STOP_GRACE, self.child.wait()).await;
        while self.group.is_some_and(group_alive) && Instant::now() < deadline {
            tokio::time::sleep(READY_POLL).await;
        }
        self.signal(libc::SIGKILL);
        let _ = self.child.wait().await;
        // SIGKILL is delivered, not waited for: the group is gone when no
        // process of it still runs.
        let deadline = Instant::now() + STOP_GRACE;
        while self.group.is_some_and(group_alive) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.group = None;
    }
}

impl Drop for ServiceProcess {
    fn drop(&mut self) {
        self.signal(libc::SIGKILL);
    }
}

/// Whether any process of group `group` still runs (zombies, which only
/// wait for a parent to reap them, do not count).
fn group_alive(group: i32) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        // SAFETY: kill(2) with signal 0 only checks; no preconditions.
        return unsafe { libc::kill(-group, 0) } == 0;
    };
    entries.flatten().any(|entry| {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            return false;
        };
        // After the command's closing parenthesis: state, ppid, pgrp.
        let mut fields = stat.rsplit(')').next().unwrap_or("").split_whitespace();
        let state = fields.next();
        let pgrp = fields.nth(1).and_then(|f| f.parse::<i32>().ok());
        pgrp == Some(group) && state != Some("Z")
    })
}
