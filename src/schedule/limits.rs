//! How many commands may run at once (`-j`), and the named `[resources]`.
//!
//! Every command (a stage's, or one item's) asks for one job slot and the
//! resources it holds, with a priority: its stage's rank in the topological
//! order (then the order it asked in). Waiters are served in priority order;
//! one whose resources are taken is passed over for now, so a busy cluster
//! window never holds back work that does not need it. Dropping the
//! [`Permits`] gives everything back.
//!
//! Serving by rank rather than first-come matters: a stage on the critical
//! path (everything downstream waits on it) must not queue behind hundreds
//! of independent stages that became ready earlier.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

#[derive(Clone)]
pub struct Limits {
    state: Arc<Mutex<State>>,
    /// Set once the run stops, for waits outside these limits (a window
    /// held across a cluster) to give up too.
    stopped: Arc<tokio::sync::watch::Sender<bool>>,
}

struct State {
    free_jobs: usize,
    free: Vec<u32>,
    waiters: BTreeMap<(u64, u64), Waiter>,
    /// How many waiters want no job slot.
    slotless: usize,
    next: u64,
    stopping: bool,
}

struct Waiter {
    resources: Vec<usize>,
    /// Whether it needs a job slot (a whole per-item stage holding a
    /// stage-held resource does not: its items take the slots).
    job: bool,
    tx: oneshot::Sender<Permits>,
}

/// Held while a command and its checks run (or, for resources held per
/// stage, while a per-item stage runs).
pub struct Permits {
    limits: Limits,
    resources: Vec<usize>,
    job: bool,
}

impl Drop for Permits {
    fn drop(&mut self) {
        let mut state = self.limits.lock();
        if self.job {
            state.free_jobs += 1;
        }
        for &r in &self.resources {
            state.free[r] += 1;
        }
        self.limits.grant(&mut state);
    }
}

impl Limits {
    pub fn new(jobs: usize, capacities: impl IntoIterator<Item = u32>) -> Self {
        Self {
            state: Arc::new(Mutex::new(State {
                free_jobs: jobs.max(1),
                free: capacities.into_iter().collect(),
                waiters: BTreeMap::new(),
                slotless: 0,
                next: 0,
                stopping: false,
            })),
            stopped: Arc::new(tokio::sync::watch::Sender::new(false)),
        }
    }

    /// Returns once the run stops (at once if it has).
    pub async fn stopped(&self) {
        let mut stopped = self.stopped.subscribe();
        // The sender lives as long as `self`: this cannot fail.
        let _ = stopped.wait_for(|stopped| *stopped).await;
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock leaves plain counters behind.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Waits for a job slot and the resources (indices into `[resources]`);
    /// lower `priority` goes first. `None` if the run stopped meanwhile.
    pub async fn acquire(&self, priority: u64, resources: &[usize]) -> Option<Permits> {
        self.wait(priority, resources, true).await
    }

    /// What a command on `executor` waits for: a job slot (one of `-j N`)
    /// and its resources when it runs on this machine; only the resources
    /// on a remote engine, whose own capacity (and the executor's bound on
    /// jobs in flight) limits it instead of this machine's cores.
    pub async fn acquire_for(
        &self,
        executor: &dyn crate::exec::Executor,
        priority: u64,
        resources: &[usize],
    ) -> Option<Permits> {
        if executor.uses_local_slots() {
            self.acquire(priority, resources).await
        } else {
            self.acquire_resources(priority, resources).await
        }
    }

    /// Waits for the resources alone, without a job slot: what a per-item
    /// stage holds for its whole run. `None` if the run stopped meanwhile.
    pub async fn acquire_resources(&self, priority: u64, resources: &[usize]) -> Option<Permits> {
        self.wait(priority, resources, false).await
    }

    async fn wait(&self, priority: u64, resources: &[usize], job: bool) -> Option<Permits> {
        let mut wanted = resources.to_vec();
        wanted.sort_unstable();
        wanted.dedup();
        let rx = {
            let mut state = self.lock();
            if state.stopping {
                return None;
            }
            let (tx, rx) = oneshot::channel();
            let seq = state.next;
            state.next += 1;
            if !job {
                state.slotless += 1;
            }
            state.waiters.insert(
                (priority, seq),
                Waiter {
                    resources: wanted,
                    job,
                    tx,
                },
            );
            self.grant(&mut state);
            rx
        };
        rx.await.ok()
    }

    /// Hands out what is free to the waiters, in priority order. Each grant
    /// looks only as far as the first waiter that fits, so with thousands of
    /// waiting items this stays cheap.
    fn grant(&self, state: &mut State) {
        loop {
            let jobs_free = state.free_jobs > 0;
            if !jobs_free && state.slotless == 0 {
                // Nothing can be granted: do not scan the queue.
                return;
            }
            let Some(key) = state
                .waiters
                .iter()
                .find(|(_, w)| {
                    (jobs_free || !w.job) && w.resources.iter().all(|&r| state.free[r] > 0)
                })
                .map(|(key, _)| *key)
            else {
                return;
            };
            let waiter = state.waiters.remove(&key).expect("found above");
            if waiter.job {
                state.free_jobs -= 1;
            } else {
                state.slotless -= 1;
            }
            for &r in &waiter.resources {
                state.free[r] -= 1;
            }
            let permits = Permits {
                limits: self.clone(),
                resources: waiter.resources,
                job: waiter.job,
            };
            if let Err(unclaimed) = waiter.tx.send(permits) {
                // The waiter gave up (its task was aborted): take the
                // grant back by hand, since dropping it would lock again.
                if unclaimed.job {
                    state.free_jobs += 1;
                }
                for &r in &unclaimed.resources {
                    state.free[r] += 1;
                }
                std::mem::forget(unclaimed);
            }
        }
    }

    /// Starts nothing more: every waiter, and every later caller, gets
    /// `None`.
    pub fn stop(&self) {
        let mut state = self.lock();
        state.stopping = true;
        state.waiters.clear();
        state.slotless = 0;
        self.stopped.send_replace(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn passes_over_a_waiter_whose_resource_is_busy() {
        let limits = Limits::new(2, [1]);
        let window = limits.acquire(5, &[0]).await.expect("free");
        // First in line, but its resource is held.
        let blocked = tokio::spawn({
            let limits = limits.clone();
            async move { limits.acquire(1, &[0]).await.is_some() }
        });
        tokio::task::yield_now().await;
        // Second in line, needs only a job slot: served at once.
        let free = limits.acquire(2, &[]).await;
        assert!(free.is_some());
        assert!(!blocked.is_finished());
        drop(free);
        drop(window);
        assert!(blocked.await.unwrap());
    }

    #[tokio::test]
    async fn serves_waiters_by_priority() {
        let limits = Limits::new(1, []);
        let held = limits.acquire(0, &[]).await.expect("free");
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for priority in [9, 3, 7] {
            let (limits, order) = (limits.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let permit = limits.acquire(priority, &[]).await;
                order.lock().unwrap().push(priority);
                drop(permit);
            }));
            tokio::task::yield_now().await;
        }
        drop(held);
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), [3, 7, 9]);
    }

    #[tokio::test]
    async fn stop_releases_every_waiter_with_none() {
        let limits = Limits::new(1, []);
        let held = limits.acquire(0, &[]).await.expect("free");
        let waiter = tokio::spawn({
            let limits = limits.clone();
            async move { limits.acquire(1, &[]).await.is_none() }
        });
        tokio::task::yield_now().await;
        limits.stop();
        assert!(waiter.await.unwrap());
        drop(held);
        assert!(limits.acquire(0, &[]).await.is_none());
    }

    #[tokio::test]
    async fn stopped_returns_for_waiters_before_and_callers_after_the_stop() {
        let limits = Limits::new(1, []);
        let before = tokio::spawn({
            let limits = limits.clone();
            async move { limits.stopped().await }
        });
        tokio::task::yield_now().await;
        assert!(!before.is_finished());
        limits.stop();
        before.await.unwrap();
        // One who asks later is not left waiting.
        limits.stopped().await;
    }
}
