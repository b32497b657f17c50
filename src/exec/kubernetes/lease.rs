//! Windows held across machines: one `coordination.k8s.io/v1` Lease per
//! window, `cairn-window-NAME` in the executor's namespace, the way
//! Kubernetes' own controllers elect a leader.
//!
//! A run takes the window when the Lease has no holder, is its own, or has
//! not changed for its `leaseDurationSeconds` as this machine's clock
//! measures (as client-go's leader election does: another machine's clock
//! is never compared with ours); the write carries the resourceVersion it
//! read, so of two runs taking it at once the API server lets one win (409
//! for the other). The holder renews it every third of
//! its duration and clears the holder when done; a holder killed outright
//! keeps the window until the Lease expires ([`LEASE_SECONDS`]). A run
//! waiting for the window looks again every [`LOOK_AGAIN`]: it must also
//! notice a holder that silently stopped renewing, which no event announces.

use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::json;

use super::engine_error;
use super::spec::kubernetes_name;
use crate::exec::{BoxFuture, ExecError, HeldWindow};

/// How long a Lease stays held without renewal.
pub const LEASE_SECONDS: u64 = 60;
/// How often a run waiting for a window looks at its Lease again.
const LOOK_AGAIN: Duration = Duration::from_secs(1);

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
    .map_err(|e| engine_error("describe", e))
}

/// Who the Lease says holds it (nobody if empty).
fn holder_of(lease: &Lease) -> Option<&str> {
    lease
        .spec
        .as_ref()?
        .holder_identity
        .as_deref()
        .filter(|h| !h.is_empty())
}

fn duration_of(lease: &Lease) -> Duration {
    let seconds = lease
        .spec
        .as_ref()
        .and_then(|s| s.lease_duration_seconds)
        .and_then(|s| u64::try_from(s).ok())
        .unwrap_or(LEASE_SECONDS);
    Duration::from_secs(seconds)
}

fn transitions(lease: &Lease) -> i64 {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.lease_transitions)
        .map_or(0, i64::from)
}

/// How long a Lease has stood unchanged, by this machine's clock: its
/// resourceVersion when first seen, and when.
#[derive(Default)]
struct Observed(Option<(String, Instant)>);

impl Observed {
    /// Notes `lease` as seen now; whether its holder has let it lapse (it
    /// has not changed for its whole duration).
    fn lapsed(&mut self, lease: &Lease, now: Instant) -> bool {
        let version = lease.metadata.resource_version.clone().unwrap_or_default();
        match &self.0 {
            Some((seen, since)) if *seen == version => {
                now.duration_since(*since) >= duration_of(lease)
            }
            _ => {
                self.0 = Some((version, now));
                false
            }
        }
    }
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
    let mut observed = Observed::default();
    loop {
        let now = SystemTime::now();
        let taken = match leases
            .get_opt(&name)
            .await
            .map_err(|e| engine_error("read the window", e))?
        {
            None => {
                let lease = lease_object(&name, None, holder, now, 0)?;
                leases.create(&PostParams::default(), &lease).await
            }
            Some(current) => match holder_of(&current) {
                Some(other) if other != holder && !observed.lapsed(&current, Instant::now()) => {
                    let other = other.to_owned();
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
            Err(e) => return Err(engine_error("take the window", e)),
        }
    }
}

/// Renews the Lease every third of its duration while it is held: while
/// it names this run, even if a renewal came late (the resourceVersion
/// guards against another run having taken it meanwhile).
async fn renew(leases: Api<Lease>, name: String, holder: String) {
    loop {
        tokio::time::sleep(Duration::from_secs(LEASE_SECONDS / 3)).await;
        loop {
            let renewed = async {
                let mut current = leases.get(&name).await?;
                if holder_of(&current) != Some(holder.as_str()) {
                    return Ok::<bool, kube::Error>(false);
                }
                if let Some(spec) = current.spec.as_mut() {
                    spec.renew_time =
                        serde_json::from_value(json!(micro_time(SystemTime::now()))).ok();
                }
                leases
                    .replace(&name, &PostParams::default(), &current)
                    .await
                    .map(|_| true)
            };
            match renewed.await {
                Ok(true) => break,
                Ok(false) => {
                    tracing::warn!(window = %name, "the window's Lease was taken over: another run may now share it");
                    return;
                }
                // Written meanwhile (by this run's own release, or a
                // taker): read it again.
                Err(kube::Error::Api(status)) if status.code == 409 => continue,
                Err(e) => {
                    tracing::warn!(window = %name, error = %e, "could not renew the window's Lease");
                    break;
                }
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
            loop {
                let mut current = self
                    .leases
                    .get(&self.name)
                    .await
                    .map_err(|e| engine_error("release the window", e))?;
                if holder_of(&current) != Some(self.holder.as_str()) {
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
                    Ok(_) => return Ok(()),
                    // Written meanwhile: look again.
                    Err(kube::Error::Api(status)) if status.code == 409 => continue,
                    Err(e) => return Err(engine_error("release the window", e)),
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(version: &str, holder: Option<&str>) -> Lease {
        let mut lease = lease_object(
            "cairn-window-w",
            Some(version.to_owned()),
            "x",
            SystemTime::now(),
            0,
        )
        .unwrap();
        lease.spec.as_mut().unwrap().holder_identity = holder.map(str::to_owned);
        lease
    }

    #[test]
    fn a_lease_lapses_only_after_standing_unchanged_for_its_duration_here() {
        let start = Instant::now();
        let duration = Duration::from_secs(LEASE_SECONDS);
        let held = lease("7", Some("run-a"));
        let mut observed = Observed::default();
        assert!(!observed.lapsed(&held, start), "first seen");
        assert!(!observed.lapsed(&held, start + duration - Duration::from_secs(1)));
        // Renewed meanwhile (a new version): the clock starts again.
        let renewed = lease("8", Some("run-a"));
        assert!(!observed.lapsed(&renewed, start + duration));
        assert!(observed.lapsed(&renewed, start + 2 * duration));
        assert_eq!(holder_of(&renewed), Some("run-a"));
        assert_eq!(holder_of(&lease("9", None)), None);
        assert_eq!(holder_of(&lease("9", Some(""))), None);
    }
}
