//! Windows held across machines: one `coordination.k8s.io/v1` Lease per
//! window, `cairn-window-NAME` in the executor's namespace, the way
//! Kubernetes' own controllers elect a leader.
//!
//! A run takes the window when the Lease has no holder, is its own, or has
//! not been renewed for its `leaseDurationSeconds`; the write carries the
//! resourceVersion it read, so of two runs taking it at once the API server
//! lets one win (409 for the other). The holder renews it every third of
//! its duration and clears the holder when done; a holder killed outright
//! keeps the window until the Lease expires ([`LEASE_SECONDS`]). A run
//! waiting for the window looks again every [`LOOK_AGAIN`]: it must also
//! notice a holder that silently stopped renewing, which no event announces.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

use super::spec::kubernetes_name;
use crate::exec::{BoxFuture, ExecError, HeldWindow};

/// How long a Lease stays held without renewal.
pub const LEASE_SECONDS: u64 = 60;
/// How often a run waiting for a window looks at its Lease again.
const LOOK_AGAIN: Duration = Duration::from_secs(1);

fn lease_error(action: &'static str, error: impl std::fmt::Display) -> ExecError {
    ExecError::Engine {
        engine: "kubernetes",
        action,
        detail: error.to_string(),
    }
}

/// `time` as Kubernetes writes a MicroTime.
fn micro_time(time: SystemTime) -> String {
    humantime::format_rfc3339_micros(time).to_string()
}

/// The Lease object `name` held by `holder` from `now`.
fn lease_object(
    name: &str,
    resource_version: Option<String>,
    holder: &str,
    now: SystemTime,
    transitions: i64,
) -> Result<Lease, ExecError> {
    let mut metadata =
        json!({ "name": name, "labels": { "app.kubernetes.io/managed-by": "cairn" } });
    if let Some(version) = resource_version {
        metadata["resourceVersion"] = json!(version);
    }
    serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": metadata,
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": LEASE_SECONDS,
            "acquireTime": micro_time(now),
            "renewTime": micro_time(now),
            "leaseTransitions": transitions,
        },
    }))
    .map_err(|e| lease_error("describe", e))
}

/// Who holds `lease` now: `None` if nobody does (no holder, or it expired).
fn current_holder(lease: &Lease, now: SystemTime) -> Option<String> {
    let value = serde_json::to_value(lease).unwrap_or(Value::Null);
    let spec = &value["spec"];
    let holder = spec["holderIdentity"].as_str().filter(|h| !h.is_empty())?;
    let duration = spec["leaseDurationSeconds"]
        .as_u64()
        .unwrap_or(LEASE_SECONDS);
    let renewed = spec["renewTime"]
        .as_str()
        .and_then(|t| humantime::parse_rfc3339_weak(t).ok())?;
    (renewed + Duration::from_secs(duration) > now).then(|| holder.to_owned())
}

fn transitions(lease: &Lease) -> i64 {
    serde_json::to_value(lease).unwrap_or(Value::Null)["spec"]["leaseTransitions"]
        .as_i64()
        .unwrap_or(0)
}

/// Takes the window `window` for `holder`, waiting while another holds it.
pub async fn hold(
    client: Client,
    namespace: &str,
    window: &str,
    holder: &str,
) -> Result<Box<dyn HeldWindow>, ExecError> {
    let leases: Api<Lease> = Api::namespaced(client, namespace);
    let name = kubernetes_name(&format!("cairn-window-{window}"));
    let mut waiting_for: Option<String> = None;
    loop {
        let now = SystemTime::now();
        let taken = match leases
            .get_opt(&name)
            .await
            .map_err(|e| lease_error("read the window", e))?
        {
            None => {
                let lease = lease_object(&name, None, holder, now, 0)?;
                leases.create(&PostParams::default(), &lease).await
            }
            Some(current) => match current_holder(&current, now) {
                Some(other) if other != holder => {
                    if waiting_for.as_deref() != Some(other.as_str()) {
                        tracing::info!(window, holder = %other, "waiting for a window another run holds");
                        waiting_for = Some(other);
                    }
                    tokio::time::sleep(LOOK_AGAIN).await;
                    continue;
                }
                _ => {
                    let lease = lease_object(
                        &name,
                        current.metadata.resource_version.clone(),
                        holder,
                        now,
                        transitions(&current) + 1,
                    )?;
                    leases.replace(&name, &PostParams::default(), &lease).await
                }
            },
        };
        match taken {
            Ok(_) => {
                tracing::info!(window, "holding the window");
                let renewal = tokio::spawn(renew(leases.clone(), name.clone(), holder.to_owned()));
                return Ok(Box::new(LeaseHeld {
                    leases,
                    name,
                    holder: holder.to_owned(),
                    renewal,
                }));
            }
            // Another run wrote it between our read and our write.
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(e) => return Err(lease_error("take the window", e)),
        }
    }
}

/// Renews the Lease every third of its duration while it is held.
async fn renew(leases: Api<Lease>, name: String, holder: String) {
    loop {
        tokio::time::sleep(Duration::from_secs(LEASE_SECONDS / 3)).await;
        let renewed = async {
            let mut current = leases.get(&name).await?;
            let now = SystemTime::now();
            if current_holder(&current, now).as_deref() != Some(holder.as_str()) {
                return Ok::<bool, kube::Error>(false);
            }
            if let Some(spec) = current.spec.as_mut() {
                spec.renew_time = serde_json::from_value(json!(micro_time(now))).ok();
            }
            leases
                .replace(&name, &PostParams::default(), &current)
                .await
                .map(|_| true)
        };
        match renewed.await {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(window = %name, "the window's Lease was taken over: another run may now share it");
                return;
            }
            Err(e) => {
                tracing::warn!(window = %name, error = %e, "could not renew the window's Lease")
            }
        }
    }
}

struct LeaseHeld {
    leases: Api<Lease>,
    name: String,
    holder: String,
    renewal: tokio::task::JoinHandle<()>,
}

impl Drop for LeaseHeld {
    /// Dropped without `release` (the run was interrupted): the renewal
    /// stops and the Lease expires on its own.
    fn drop(&mut self) {
        self.renewal.abort();
    }
}

impl HeldWindow for LeaseHeld {
    fn release(self: Box<Self>) -> BoxFuture<'static, Result<(), ExecError>> {
        Box::pin(async move {
            self.renewal.abort();
            let mut current = self
                .leases
                .get(&self.name)
                .await
                .map_err(|e| lease_error("release the window", e))?;
            if current_holder(&current, SystemTime::now()).as_deref() != Some(self.holder.as_str())
            {
                return Ok(());
            }
            if let Some(spec) = current.spec.as_mut() {
                spec.holder_identity = None;
            }
            match self
                .leases
                .replace(&self.name, &PostParams::default(), &current)
                .await
            {
                // Someone took an expired Lease meanwhile: it is theirs.
                Ok(_) | Err(kube::Error::Api(_)) => Ok(()),
                Err(e) => Err(lease_error("release the window", e)),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_held_until_it_expires_or_is_cleared() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let held = lease_object("cairn-window-w", None, "run-a", start, 0).unwrap();
        assert_eq!(current_holder(&held, start).as_deref(), Some("run-a"));
        let later = start + Duration::from_secs(LEASE_SECONDS - 1);
        assert_eq!(current_holder(&held, later).as_deref(), Some("run-a"));
        let expired = start + Duration::from_secs(LEASE_SECONDS + 1);
        assert_eq!(current_holder(&held, expired), None);
        let mut cleared = held.clone();
        cleared.spec.as_mut().unwrap().holder_identity = None;
        assert_eq!(current_holder(&cleared, start), None);
    }
}
