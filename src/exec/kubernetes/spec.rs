//! The pure half of the Kubernetes executor: a [`Job`](super::super::Job)
//! and the executor's settings → the Kubernetes Job object that runs it.
//! Nothing here talks to a cluster, so the whole object is snapshot-tested.

use k8s_openapi::api::batch::v1::Job as KubeJob;
use serde_json::{Map, Value, json};

use super::super::batch::{Batch, index_script, shared_env};
use super::super::{ATTEMPT_MARKER, ITEM_MARKER, Job, SAMPLE_MARKER};
use crate::manifest::{Command, KubernetesSettings, RootVolume};

/// Variables of cairn's own environment that never reach a pod: the image
/// brings its own `PATH`, `HOME`, `LANG` and `TMPDIR`; the run marker is
/// for this machine's processes (a resumed run kills those a dead run left;
/// a pod, even on this machine, is its engine's to keep or stop), and the
/// run token is on the Job's labels instead.
const HOST_ONLY: &[&str] = &["PATH", "HOME", "LANG", "TMPDIR", super::super::RUN_MARKER];
/// The variable names the scheduler gives an item's command.
/// The volume that mounts the project root at its own path.
const ROOT_VOLUME: &str = "cairn-root";
/// The label every Job cairn creates carries.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "cairn");
pub const RUN_LABEL: &str = "cairn.dev/run";

/// The Kubernetes name of `job`: its own name when that is already a valid
/// name of at most 63 characters (a Job's name becomes a pod label), else a
/// readable prefix and a digest of the whole name. Deterministic, so a job
/// is found again by name.
pub fn kubernetes_name(name: &str) -> String {
    let cleaned: String = name
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '-') => c,
            _ => '-',
        })
        .collect();
    let cleaned = cleaned.trim_matches('-');
    if cleaned == name && !name.is_empty() && name.len() <= 63 {
        return name.to_owned();
    }
    let digest = crate::fingerprint::Digest::of(name.as_bytes()).hex();
    let prefix: String = cleaned.chars().take(46).collect();
    let prefix = prefix.trim_end_matches('-');
    if prefix.is_empty() {
        format!("cairn-{}", &digest[..16])
    } else {
        format!("{prefix}-{}", &digest[..16])
    }
}

/// `value` as a label value: at most 63 characters of `[A-Za-z0-9._-]`,
/// starting and ending alphanumeric (a value that must change keeps a
/// digest of the original, so two items never share one).
pub fn label_value(value: &str) -> String {
    let cleaned: String = value
        .chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '.' | '_' | '-' => c,
            _ => '_',
        })
        .collect();
    let trimmed = cleaned.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    if trimmed == value && value.len() <= 63 {
        return value.to_owned();
    }
    let digest = crate::fingerprint::Digest::of(value.as_bytes()).hex();
    let prefix: String = trimmed.chars().take(46).collect();
    let prefix = prefix.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    if prefix.is_empty() {
        digest[..16].to_owned()
    } else {
        format!("{prefix}-{}", &digest[..16])
    }
}

fn variable<'a>(job: &'a Job, name: &str) -> Option<&'a str> {
    job.env
        .iter()
        .rev()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// The labels of the Job and its pod: who made it, the run, the stage and,
/// for an item, the item, its fingerprint and the attempt.
fn labels(job: &Job) -> Map<String, Value> {
    let mut labels = Map::new();
    let mut put = |key: &str, value: &str| {
        labels.insert(key.to_owned(), Value::String(label_value(value)));
    };
    put(MANAGED_BY.0, MANAGED_BY.1);
    put(RUN_LABEL, &job.token);
    put("cairn.dev/stage", &job.stage);
    if let Some(item) = variable(job, ITEM_MARKER) {
        put("cairn.dev/item", item);
        // Item jobs are named `…-FINGERPRINT16-ATTEMPT`.
        let mut parts = job.name.rsplit('-');
        if let (Some(_), Some(fingerprint)) = (parts.next(), parts.next()) {
            put("cairn.dev/fingerprint", fingerprint);
        }
    }
    if let Some(attempt) = variable(job, ATTEMPT_MARKER) {
        put("cairn.dev/attempt", attempt);
    }
    if let Some(sample) = variable(job, SAMPLE_MARKER) {
        put("cairn.dev/sample", sample);
    }
    labels
}

fn environment(job: &Job, settings: &KubernetesSettings) -> Vec<Value> {
    let mut env: Vec<Value> = job
        .env
        .iter()
        .filter(|(name, _)| !HOST_ONLY.contains(&name.as_str()) && !job.secrets.contains(name))
        .map(|(name, value)| json!({ "name": name, "value": value }))
        .collect();
    // Secret values never enter the Job object (it is stored in etcd and
    // shown by `kubectl get -o yaml`): each is read from the configured
    // Secret, by the variable's name, when the pod starts.
    if let Some(secret) = &settings.secret {
        env.extend(job.secrets.iter().map(|name| {
            json!({
                "name": name,
                "valueFrom": { "secretKeyRef": { "name": secret, "key": name } },
            })
        }));
    }
    env
}

fn resources(settings: &KubernetesSettings) -> Value {
    let mut amounts = Map::new();
    if let Some(cpu) = &settings.cpu {
        amounts.insert("cpu".to_owned(), json!(cpu));
    }
    if let Some(memory) = &settings.memory {
        amounts.insert("memory".to_owned(), json!(memory));
    }
    let mut limits = amounts.clone();
    if let Some(gpus) = settings.gpus {
        limits.insert("nvidia.com/gpu".to_owned(), json!(gpus.to_string()));
    }
    json!({ "requests": amounts, "limits": limits })
}

fn root_volume(job: &Job, settings: &KubernetesSettings) -> Value {
    match &settings.root_volume {
        RootVolume::Claim(claim) => json!({
            "name": ROOT_VOLUME,
            "persistentVolumeClaim": { "claimName": claim },
        }),
        RootVolume::HostPath => json!({
            "name": ROOT_VOLUME,
            "hostPath": { "path": job.cwd, "type": "Directory" },
        }),
    }
}

/// The Kubernetes Job that runs `job` once: one pod, never restarted
/// (cairn retries), in the configured image, with the project root mounted
/// at its own path as the working directory.
pub fn job_spec(job: &Job, settings: &KubernetesSettings) -> Result<KubeJob, serde_json::Error> {
    let labels = labels(job);
    let command = match &job.command {
        Command::Shell(script) => json!(["/bin/sh", "-c", script]),
        Command::Exec(argv) => json!(argv),
    };
    let container = json!({
        "name": "job",
        "image": job.image.as_deref().unwrap_or(&settings.image),
        "command": command,
        "workingDir": job.cwd,
        "env": environment(job, settings),
        "resources": resources(settings),
        "volumeMounts": [{ "name": ROOT_VOLUME, "mountPath": job.cwd }],
        // A failed command's last log lines explain it in `kubectl describe`.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    });
    let mut pod = json!({
        "restartPolicy": "Never",
        "containers": [container],
        "volumes": [root_volume(job, settings)],
    });
    if let Some(account) = &settings.service_account {
        pod["serviceAccountName"] = json!(account);
    }
    if !settings.node_selector.is_empty() {
        pod["nodeSelector"] = json!(settings.node_selector);
    }
    if !settings.tolerations.is_empty() {
        pod["tolerations"] = settings
            .tolerations
            .iter()
            .map(|t| {
                let mut entry = Map::new();
                for (key, value) in [
                    ("key", &t.key),
                    ("operator", &t.operator),
                    ("value", &t.value),
                    ("effect", &t.effect),
                ] {
                    if let Some(value) = value {
                        entry.insert(key.to_owned(), json!(value));
                    }
                }
                Value::Object(entry)
            })
            .collect();
    }
    if !settings.image_pull_secrets.is_empty() {
        pod["imagePullSecrets"] = settings
            .image_pull_secrets
            .iter()
            .map(|name| json!({ "name": name }))
            .collect();
    }
    let mut spec = json!({
        // cairn retries and classifies; Kubernetes must not.
        "backoffLimit": 0,
        "ttlSecondsAfterFinished": settings.ttl.as_secs(),
        "template": { "metadata": { "labels": labels }, "spec": pod },
    });
    if let Some(timeout) = job.timeout {
        spec["activeDeadlineSeconds"] = json!(timeout.as_secs().max(1));
    }
    let object = json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": kubernetes_name(&job.name),
            "namespace": settings.namespace,
            "labels": labels,
            // The unsanitised values, for people reading the Job.
            "annotations": { "cairn.dev/job-name": job.name },
        },
        "spec": spec,
    });
    serde_json::from_value(object)
}

/// The label (and annotation) the Job controller puts on each pod of an
/// Indexed Job: the pod's index.
pub const INDEX_LABEL: &str = "batch.kubernetes.io/job-completion-index";

/// The Indexed Job that runs `batch`: one pod per index, index `i`
/// (`$JOB_COMPLETION_INDEX`) running job `i`'s command with its item and
/// attempt. Each index fails on its own (`backoffLimitPerIndex: 0`, never
/// retried by Kubernetes) without stopping the others, and each pod has
/// the stage's timeout as its own deadline (a Job-wide deadline would give
/// the indices that start last less time).
pub fn indexed_job_spec(
    batch: &Batch,
    settings: &KubernetesSettings,
) -> Result<KubeJob, serde_json::Error> {
    let first = &batch.jobs[0];
    let shared = Job {
        name: batch.name.clone(),
        command: Command::Shell(index_script(batch, "JOB_COMPLETION_INDEX")),
        env: shared_env(batch).cloned().collect(),
        ..first.clone()
    };
    let mut object = serde_json::to_value(job_spec(&shared, settings)?)?;
    let spec = &mut object["spec"];
    if let Some(spec) = spec.as_object_mut() {
        spec.remove("backoffLimit");
        if let Some(deadline) = spec.remove("activeDeadlineSeconds") {
            object["spec"]["template"]["spec"]["activeDeadlineSeconds"] = deadline;
        }
    }
    let spec = &mut object["spec"];
    spec["completionMode"] = json!("Indexed");
    spec["completions"] = json!(batch.jobs.len());
    spec["parallelism"] = json!(batch.jobs.len());
    spec["backoffLimitPerIndex"] = json!(0);
    // Which job each index runs, for people reading the Job.
    let names: Vec<&str> = batch.jobs.iter().map(|j| j.name.as_str()).collect();
    object["metadata"]["annotations"]["cairn.dev/jobs"] = json!(names.join(" "));
    serde_json::from_value(object)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::PathBuf;
    use std::time::Duration;

    use super::*;
    use crate::manifest::Toleration;

    const IMAGE: &str = "registry.example/oracle@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const ITEM_IMAGE: &str = "registry.example/swesmith-07@sha256:fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210";

    fn item_job() -> Job {
        Job {
            name: "cairn-oracle-1a2b3c4d-00112233aabbccdd-2".to_owned(),
            token: "8123-1764567890".to_owned(),
            stage: "oracle".to_owned(),
            command: Command::Shell("python3 oracle.py 'django__django-1'".to_owned()),
            cwd: PathBuf::from("/shared/project"),
            env: vec![
                ("PATH".to_owned(), "/home/me/bin:/usr/bin".to_owned()),
                ("HOME".to_owned(), "/home/me".to_owned()),
                ("CAIRN_RUN".to_owned(), "8123-1764567890".to_owned()),
                ("MODEL".to_owned(), "small".to_owned()),
                ("API_TOKEN".to_owned(), "s3cr3t-value".to_owned()),
                ("CAIRN_ITEM".to_owned(), "django/django#1".to_owned()),
                ("CAIRN_ATTEMPT".to_owned(), "2".to_owned()),
            ],
            timeout: Some(Duration::from_secs(1800)),
            log: PathBuf::from("/shared/project/cache/logs/7/oracle/x.2.log"),
            redact: vec![("API_TOKEN".to_owned(), "s3cr3t-value".to_owned())],
            secrets: vec!["API_TOKEN".to_owned()],
            // The item's own image, pinned: it wins over the executor's.
            image: Some(ITEM_IMAGE.to_owned()),
        }
    }

    fn full_settings() -> KubernetesSettings {
        KubernetesSettings {
            namespace: "curation".to_owned(),
            image: IMAGE.to_owned(),
            require_digest: true,
            service_account: Some("oracle-runner".to_owned()),
            cpu: Some("2".to_owned()),
            memory: Some("4Gi".to_owned()),
            gpus: Some(1),
            node_selector: BTreeMap::from([("pool".to_owned(), "batch".to_owned())]),
            tolerations: vec![Toleration {
                key: Some("dedicated".to_owned()),
                operator: Some("Equal".to_owned()),
                value: Some("batch".to_owned()),
                effect: Some("NoSchedule".to_owned()),
            }],
            image_pull_secrets: vec!["mirror-pull".to_owned()],
            secret: Some("oracle-secrets".to_owned()),
            root_volume: RootVolume::Claim("project-root".to_owned()),
            unschedulable_timeout: Duration::from_secs(300),
            ttl: Duration::from_secs(3600),
            max_jobs: 256,
            batch: 1,
            qps: None,
        }
    }

    #[test]
    fn an_item_job_with_every_setting() {
        insta::assert_json_snapshot!(job_spec(&item_job(), &full_settings()).unwrap());
    }

    #[test]
    fn a_stage_job_with_argv_on_the_node_root_and_no_settings() {
        let job = Job {
            name: "cairn-Build_Docs-1a2b3c4d-8123-1764567890".to_owned(),
            stage: "Build_Docs".to_owned(),
            command: Command::Exec(vec!["make".to_owned(), "docs".to_owned()]),
            env: vec![("CAIRN_RUN".to_owned(), "8123-1764567890".to_owned())],
            timeout: None,
            redact: Vec::new(),
            secrets: Vec::new(),
            image: None,
            ..item_job()
        };
        let settings = KubernetesSettings {
            namespace: "default".to_owned(),
            image: IMAGE.to_owned(),
            root_volume: RootVolume::HostPath,
            ttl: Duration::from_secs(600),
            ..KubernetesSettings::default()
        };
        insta::assert_json_snapshot!(job_spec(&job, &settings).unwrap());
    }

    #[test]
    fn an_indexed_job_for_a_batch_of_two_items() {
        let second = Job {
            name: "cairn-oracle-1a2b3c4d-44556677eeff0011-1".to_owned(),
            command: Command::Shell("python3 oracle.py 'django__django-2'".to_owned()),
            env: item_job()
                .env
                .into_iter()
                .map(|(name, value)| match name.as_str() {
                    "CAIRN_ITEM" => (name, "django/django#2".to_owned()),
                    "CAIRN_ATTEMPT" => (name, "1".to_owned()),
                    _ => (name, value),
                })
                .collect(),
            ..item_job()
        };
        let batch = Batch {
            name: "cairn-oracle-batch-0123456789abcdef".to_owned(),
            jobs: vec![item_job(), second],
        };
        let object = indexed_job_spec(&batch, &full_settings()).unwrap();
        let text = serde_json::to_string(&object).unwrap();
        assert!(!text.contains("s3cr3t-value"), "{text}");
        insta::assert_json_snapshot!(object);
    }

    #[test]
    fn secret_values_never_enter_the_job_object() {
        let text =
            serde_json::to_string(&job_spec(&item_job(), &full_settings()).unwrap()).unwrap();
        assert!(!text.contains("s3cr3t-value"), "{text}");
        let without_secret = KubernetesSettings {
            secret: None,
            ..full_settings()
        };
        let text = serde_json::to_string(&job_spec(&item_job(), &without_secret).unwrap()).unwrap();
        assert!(
            !text.contains("s3cr3t-value") && !text.contains("API_TOKEN"),
            "{text}"
        );
    }

    #[test]
    fn names_are_valid_kubernetes_names_and_stable() {
        let plain = "cairn-oracle-1a2b3c4d-00112233aabbccdd-2";
        assert_eq!(kubernetes_name(plain), plain);
        for name in [
            "cairn-Build_Docs-1a2b3c4d-8123-1764567890",
            &format!(
                "cairn-{}-1a2b3c4d-00112233aabbccdd-2",
                "very_long_stage".repeat(6)
            ),
            "___",
        ] {
            let k = kubernetes_name(name);
            assert!(k.len() <= 63, "{k}");
            assert!(
                k.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
                "{k}"
            );
            assert!(!k.starts_with('-') && !k.ends_with('-'), "{k}");
            assert_eq!(k, kubernetes_name(name), "deterministic");
        }
        assert_ne!(kubernetes_name("cairn-A_b"), kubernetes_name("cairn-A-b"));
    }

    #[test]
    fn label_values_follow_the_label_rules() {
        assert_eq!(label_value("oracle"), "oracle");
        for value in ["django/django#1", "_x_", &"a".repeat(80), "model:task"] {
            let v = label_value(value);
            assert!(v.len() <= 63, "{v}");
            assert!(
                v.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)),
                "{v}"
            );
            assert!(v.starts_with(|c: char| c.is_ascii_alphanumeric()), "{v}");
            assert!(v.ends_with(|c: char| c.is_ascii_alphanumeric()), "{v}");
        }
        assert_ne!(label_value("a/b"), label_value("a#b"));
    }
}
