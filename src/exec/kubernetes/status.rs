//! Reading how a Job and its pod are doing: pure functions of the objects
//! the API server sends, so each signal is tested without a cluster.

use k8s_openapi::api::batch::v1::Job as KubeJob;
use k8s_openapi::api::core::v1::Pod;

use super::super::{InfraKind, Outcome};

/// Where a Job stands, by its conditions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobState {
    Active,
    Complete,
    /// `Failed`, with the condition's reason (`DeadlineExceeded`,
    /// `BackoffLimitExceeded`, …).
    Failed(Option<String>),
}

pub fn job_state(job: &KubeJob) -> JobState {
    let conditions = job
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .map(Vec::as_slice)
        .unwrap_or_default();
    for condition in conditions {
        if condition.status != "True" {
            continue;
        }
        match condition.type_.as_str() {
            "Complete" | "SuccessCriteriaMet" => return JobState::Complete,
            "Failed" | "FailureTarget" => return JobState::Failed(condition.reason.clone()),
            _ => {}
        }
    }
    JobState::Active
}

/// What a pod says about its job while the job has not ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodSignal {
    /// Nothing cairn acts on (pending on a node, running, …).
    Quiet,
    /// No node can take it now; infrastructure once that lasts past the
    /// executor's `unschedulable_timeout`.
    Unschedulable,
    /// It ended, or can never start, for this reason.
    Ended(Outcome),
}

pub fn pod_signal(pod: &Pod) -> PodSignal {
    let Some(status) = &pod.status else {
        return PodSignal::Quiet;
    };
    let waiting_reasons = status
        .container_statuses
        .iter()
        .flatten()
        .filter_map(|c| c.state.as_ref()?.waiting.as_ref()?.reason.as_deref());
    for reason in waiting_reasons {
        if matches!(
            reason,
            "ErrImagePull" | "ImagePullBackOff" | "InvalidImageName" | "ErrImageNeverPull"
        ) {
            return PodSignal::Ended(Outcome::Infra(InfraKind::ImagePull));
        }
    }
    if status.phase.as_deref() == Some("Failed") || status.phase.as_deref() == Some("Succeeded") {
        return PodSignal::Ended(ended_pod_outcome(pod));
    }
    let unschedulable = status.conditions.iter().flatten().any(|c| {
        c.type_ == "PodScheduled"
            && c.status == "False"
            && c.reason.as_deref() == Some("Unschedulable")
    });
    if unschedulable {
        PodSignal::Unschedulable
    } else {
        PodSignal::Quiet
    }
}

/// Whether the kubelet stopped the pod at its `activeDeadlineSeconds`.
pub fn passed_its_deadline(pod: &Pod) -> bool {
    pod.status.as_ref().is_some_and(|s| {
        s.phase.as_deref() == Some("Failed") && s.reason.as_deref() == Some("DeadlineExceeded")
    })
}

/// How a pod that ran (or was stopped) ended: the node's doing (evicted,
/// preempted, node lost, out of memory) is infrastructure; otherwise the
/// container's exit code, which the stage's `classify` rules read.
pub fn ended_pod_outcome(pod: &Pod) -> Outcome {
    let Some(status) = &pod.status else {
        return Outcome::Infra(InfraKind::Unknown);
    };
    match status.reason.as_deref() {
        Some("Evicted") | Some("NodeLost") | Some("Shutdown") | Some("Terminated")
        | Some("NodeShutdown") | Some("NodeAffinity") | Some("OutOfcpu") | Some("OutOfmemory") => {
            return Outcome::Infra(InfraKind::NodeLost);
        }
        Some("Preempting") => return Outcome::Infra(InfraKind::Preempted),
        _ => {}
    }
    // Set by the control plane when it, not the command, stops the pod.
    if let Some(disruption) = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "DisruptionTarget" && c.status == "True")
    {
        return Outcome::Infra(match disruption.reason.as_deref() {
            Some("PreemptionByScheduler") => InfraKind::Preempted,
            _ => InfraKind::NodeLost,
        });
    }
    let terminated = status
        .container_statuses
        .iter()
        .flatten()
        .find_map(|c| c.state.as_ref()?.terminated.as_ref());
    match terminated {
        Some(t) if t.reason.as_deref() == Some("OOMKilled") => {
            Outcome::Infra(InfraKind::OutOfMemory)
        }
        Some(t) if t.exit_code == 0 => Outcome::Success,
        Some(t) => Outcome::Exit(t.exit_code),
        None => Outcome::Infra(InfraKind::Unknown),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({ "metadata": { "name": "p" }, "status": status })).unwrap()
    }

    fn terminated(reason: &str, exit_code: i32) -> serde_json::Value {
        json!({ "phase": "Failed", "containerStatuses": [{
            "name": "job", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": { "terminated": { "exitCode": exit_code, "reason": reason } },
        }]})
    }

    #[test]
    fn a_failed_container_reports_its_exit_code() {
        assert_eq!(
            ended_pod_outcome(&pod(terminated("Error", 3))),
            Outcome::Exit(3)
        );
    }

    #[test]
    fn oom_killed_is_infrastructure() {
        assert_eq!(
            ended_pod_outcome(&pod(terminated("OOMKilled", 137))),
            Outcome::Infra(InfraKind::OutOfMemory)
        );
    }

    #[test]
    fn evicted_and_preempted_pods_are_infrastructure() {
        let evicted = pod(json!({ "phase": "Failed", "reason": "Evicted" }));
        assert_eq!(
            ended_pod_outcome(&evicted),
            Outcome::Infra(InfraKind::NodeLost)
        );
        let mut preempted = terminated("Error", 143);
        preempted["conditions"] = json!([{ "type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler" }]);
        assert_eq!(
            ended_pod_outcome(&pod(preempted)),
            Outcome::Infra(InfraKind::Preempted)
        );
    }

    #[test]
    fn image_pull_errors_and_unschedulable_pods_are_signals() {
        let pulling = pod(json!({ "phase": "Pending", "containerStatuses": [{
            "name": "job", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": { "waiting": { "reason": "ImagePullBackOff" } },
        }]}));
        assert_eq!(
            pod_signal(&pulling),
            PodSignal::Ended(Outcome::Infra(InfraKind::ImagePull))
        );
        let waiting = pod(json!({ "phase": "Pending", "conditions": [
            { "type": "PodScheduled", "status": "False", "reason": "Unschedulable" }
        ]}));
        assert_eq!(pod_signal(&waiting), PodSignal::Unschedulable);
        assert_eq!(
            pod_signal(&pod(json!({ "phase": "Running" }))),
            PodSignal::Quiet
        );
    }

    #[test]
    fn job_conditions_decide_the_state() {
        let job = |conditions: serde_json::Value| -> KubeJob {
            serde_json::from_value(
                json!({ "metadata": {}, "status": { "conditions": conditions } }),
            )
            .unwrap()
        };
        assert_eq!(job_state(&job(json!([]))), JobState::Active);
        assert_eq!(
            job_state(&job(json!([{ "type": "Complete", "status": "True" }]))),
            JobState::Complete
        );
        assert_eq!(
            job_state(&job(
                json!([{ "type": "Failed", "status": "True", "reason": "DeadlineExceeded" }])
            )),
            JobState::Failed(Some("DeadlineExceeded".to_owned()))
        );
    }
}
