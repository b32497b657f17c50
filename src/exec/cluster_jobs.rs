//! The cluster jobs (Slurm, Kubernetes) this process holds: whether an
//! interrupted run leaves them running (`--detach`) or cancels them, and
//! waiting until every one it held was released.

use std::time::Duration;

/// Set by `cairn run --detach`: an interrupted run leaves its remote jobs
/// running (the next run adopts them) instead of cancelling them.
static DETACHED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// From now on, remote jobs dropped before they end are left running.
pub fn detach_cluster_jobs() {
    DETACHED.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Whether remote jobs dropped before they end are left running.
pub fn cluster_jobs_detached() -> bool {
    DETACHED.load(std::sync::atomic::Ordering::SeqCst)
}

/// Counts the remote jobs this process holds (started or adopted, not yet
/// ended or cancelled). A job dropped before it ended is cancelled by its
/// `Drop`, which needs the scheduler's runtime: an interrupted run waits
/// for [`cluster_jobs_released`] before it returns, so no cancellation is
/// lost to the runtime shutting down.
static REMOTE_JOBS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Held by a remote [`Running`] job, as its last field (so it is released
/// after the job's own `Drop` has cancelled it).
#[derive(Debug)]
pub struct ClusterJobGuard(());

impl ClusterJobGuard {
    pub fn new() -> Self {
        REMOTE_JOBS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        ClusterJobGuard(())
    }
}

impl Default for ClusterJobGuard {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for ClusterJobGuard {
    fn drop(&mut self) {
        REMOTE_JOBS.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Waits (at most `limit`) until every remote job this process held has
/// ended or been cancelled; false if some are still held then.
pub async fn cluster_jobs_released(limit: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    let mut pause = Duration::from_millis(1);
    while REMOTE_JOBS.load(std::sync::atomic::Ordering::SeqCst) > 0 {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        // Aborted tasks are dropped by the runtime's workers soon after
        // the abort; nothing notifies when, so look again shortly.
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(50));
    }
    true
}
