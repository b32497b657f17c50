//! Runs jobs as Kubernetes Jobs, one pod each.
//!
//! A job becomes a `batch/v1` Job named after the job (its name derives
//! from the stage or item fingerprint and the attempt number, made a valid
//! Kubernetes name, so the same attempt is found again by name), with:
//! - the executor's image, by digest unless `require_digest = false`;
//! - the command as `/bin/sh -c SCRIPT`, or its argv as the container's
//!   command; the project root, mounted at its own path from a
//!   PersistentVolumeClaim or the node (`host_path`), as working directory:
//!   outputs land on that shared filesystem and are hashed there;
//! - the job's environment without cairn's own `PATH`, `HOME`, `LANG` and
//!   `TMPDIR` (the image's are used); secret variables are never written
//!   into the Job object: with `secret = "NAME"` each is read from that
//!   Kubernetes Secret by the variable's name, without it they are not set;
//! - labels for the run token, stage, item, item fingerprint and attempt
//!   (values made valid label values), resources, node selector,
//!   tolerations, image pull secrets, service account,
//!   `activeDeadlineSeconds` from the stage's timeout, `backoffLimit: 0`
//!   (cairn retries and classifies) and `ttlSecondsAfterFinished`.
//!
//! A Job is waited for with watches on it and on its pod, never by polling.
//! How it ended maps to an [`Outcome`](super::Outcome): Complete → success;
//! Failed → the container's exit code (which the stage's `classify` rules
//! read), or, when the control plane stopped it, infrastructure: evicted,
//! node lost → node lost; preempted → preempted; OOMKilled → out of memory;
//! DeadlineExceeded → timed out. An image that cannot be pulled
//! (ErrImagePull, ImagePullBackOff) and a pod no node takes for longer than
//! `unschedulable_timeout` are infrastructure too, and their Job is deleted.
//! When the Job ends, its pod's log is appended to the job's log and
//! redacted. A Job dropped before it ended (the run was interrupted) is
//! deleted with background propagation; a cairn process killed outright
//! leaves it running, and the next run adopts it by name.
//!
//! A `[resources]` window with `across` naming a Kubernetes executor is held
//! through a Lease in its namespace ([`lease`]), so two cairn processes on
//! two machines never hold it at once.

mod client;
mod lease;
mod spec;
mod status;

pub use client::{KubernetesExecutor, qps_limit};
pub use spec::{job_spec, kubernetes_name, label_value};

/// The API server refused or failed `action`.
fn engine_error(action: &'static str, error: impl std::fmt::Display) -> crate::exec::ExecError {
    crate::exec::ExecError::Engine {
        engine: "kubernetes",
        action,
        detail: error.to_string(),
    }
}
