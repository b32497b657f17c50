//! Executors run one command and report how it ended. They know nothing of
//! graphs, fingerprints or caching.

mod batch;
mod cluster_jobs;
mod executor;
mod image;
mod job;
mod kubernetes;
mod local;
mod process;
mod redact;
mod slurm;

pub use batch::{ATTEMPT_MARKER, ITEM_MARKER, SAMPLE_MARKER, SEED_MARKER};
pub use cluster_jobs::{
    ClusterJobGuard, cluster_jobs_detached, cluster_jobs_released, detach_cluster_jobs,
};
pub use executor::{BoxFuture, Executor, HeldWindow, Running};
pub use image::{ImageRef, ImageResolver, PinnedImage};
pub use job::{ExecError, InfraKind, Job, Outcome};
pub use kubernetes::{KubernetesExecutor, job_spec, kubernetes_name, label_value, qps_limit};
pub use local::{LocalExecutor, is_local_handle};
pub use process::{RUN_MARKER, base_environment, kill_marked_processes};
pub use redact::{redact_log, redact_text};
pub use slurm::{JobState, SlurmExecutor, SlurmJob};
