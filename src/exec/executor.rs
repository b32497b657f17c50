//! The one object-safe trait every engine implements, and what it hands
//! back: a job started or adopted, a window held across machines.

use std::future::Future;
use std::pin::Pin;

use super::job::{ExecError, Job, Outcome};

/// A future an executor returns (the trait stays object-safe, so the
/// scheduler holds executors as `Arc<dyn Executor>`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// An engine that runs jobs: this machine's processes, a Slurm cluster, …
///
/// The lifecycle a remote engine needs: `submit` starts a job named
/// `job.name` (derived from the fingerprint and the attempt); `attach` finds
/// the job of that name an earlier cairn process submitted, so a resumed
/// run waits for it instead of submitting it twice; the [`Running`] job is
/// waited for; `cancel` stops one by its handle.
pub trait Executor: Send + Sync {
    /// `local`, `slurm`, …
    fn kind(&self) -> &'static str;

    /// Whether its jobs run on this machine, and so take one of the run's
    /// `-j N` job slots.
    fn uses_local_slots(&self) -> bool {
        false
    }

    /// Starts `job`.
    fn submit<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, Result<Box<dyn Running>, ExecError>>;

    /// The job named `job.name` that the engine still has (queued, running or
    /// finished), submitted by an earlier cairn process.
    fn attach<'a>(
        &'a self,
        job: &'a Job,
    ) -> BoxFuture<'a, Result<Option<Box<dyn Running>>, ExecError>>;

    /// The job named `job.name` if the engine has it (adopted), else a
    /// newly submitted one.
    fn start<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, Result<Box<dyn Running>, ExecError>> {
        Box::pin(async move {
            match self.attach(job).await? {
                Some(adopted) => {
                    tracing::info!(job = %job.name, handle = %adopted.handle(), "adopted a job already submitted");
                    Ok(adopted)
                }
                None => self.submit(job).await,
            }
        })
    }

    /// Cancels the job named by `handle` (what [`Running::handle`] gave an
    /// earlier process) if it is this engine's: true if it was. A job that
    /// already ended is left alone.
    fn cancel_handle<'a>(&'a self, handle: &'a str) -> BoxFuture<'a, Result<bool, ExecError>> {
        let _ = handle;
        Box::pin(async { Ok(false) })
    }

    /// Takes the window `window` for the run of `job` (the stage's: its
    /// token holds the window, its project root may keep a heartbeat)
    /// across every process and machine that uses this engine, waiting
    /// while another holds it; `None` if this engine has no such windows
    /// (the window is then this process's alone).
    fn hold_window<'a>(
        &'a self,
        window: &'a str,
        job: &'a Job,
    ) -> BoxFuture<'a, Result<Option<Box<dyn HeldWindow>>, ExecError>> {
        let _ = (window, job);
        Box::pin(async { Ok(None) })
    }

    /// Starts the job (see [`Executor::start`]) and waits for it.
    fn run<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, Result<Outcome, ExecError>> {
        Box::pin(async move { self.start(job).await?.wait().await })
    }
}

/// A window held across machines ([`Executor::hold_window`]). Dropped
/// without `release`, it lapses on its own after a while.
pub trait HeldWindow: Send {
    fn release(self: Box<Self>) -> BoxFuture<'static, Result<(), ExecError>>;
}

/// A job an executor started or adopted.
pub trait Running: Send {
    /// What identifies the job on its engine (`pid:4242`, `slurm:1234`).
    fn handle(&self) -> String;

    /// Waits until the job ends; its log is complete and redacted then.
    fn wait(self: Box<Self>) -> BoxFuture<'static, Result<Outcome, ExecError>>;
}
