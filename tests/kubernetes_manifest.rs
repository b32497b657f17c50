//! `kind = "kubernetes"` executors in the manifest: bad settings are
//! located errors at load; a cluster that cannot be reached is an error
//! when a stage on it runs, not before.

mod common;

use common::Project;

const DIGEST: &str = "sha256:abababababababababababababababababababababababababababababababab";

fn manifest(executor_body: &str) -> String {
    format!(
        "[pipeline]\nname = \"x\"\n[executors.k8s]\nkind = \"kubernetes\"\n{executor_body}\n[stages.a]\nrun = \"echo hi > out.txt\"\noutputs = [\"out.txt\"]\nexecutor = \"k8s\"\n"
    )
}

/// (name, executor body, expected message fragment, expected `line:col`)
const CASES: &[(&str, &str, &str, &str)] = &[
    (
        "image by tag",
        "image = \"mirror/oracle:latest\"\nhost_path = true",
        "image `mirror/oracle:latest` of executor `k8s` is not given by digest",
        "cairn.toml:5:9",
    ),
    (
        "a malformed image",
        "image = \"Mirror/Oracle:v1\"\nhost_path = true",
        "executor `k8s`: `Mirror/Oracle:v1` is not an image reference",
        "cairn.toml:5:9",
    ),
    (
        "an item's image on a plain stage",
        "image = \"{item.image}\"\nhost_path = true",
        "stage `a` is not per-item, but executor `k8s` takes its image from `{item.…}`",
        "cairn.toml:10:12",
    ),
    (
        "no image",
        "host_path = true",
        "kubernetes executor `k8s` has no `image`",
        "cairn.toml:3:",
    ),
    (
        "no root volume",
        "image = \"mirror/oracle@sha256:abababababababababababababababababababababababababababababababab\"",
        "does not say how pods see the project root",
        "cairn.toml:3:",
    ),
    (
        "both root volumes",
        "image = \"mirror/oracle@sha256:abababababababababababababababababababababababababababababababab\"\nclaim = \"root\"\nhost_path = true",
        "sets both `claim` and `host_path`",
        "cairn.toml:3:",
    ),
    (
        "misspelt key",
        "image = \"mirror/oracle@sha256:abababababababababababababababababababababababababababababababab\"\nhost_path = true\nnamespase = \"ml\"",
        "unknown key `namespase` in executor `k8s`",
        "cairn.toml:7:1",
    ),
    (
        "gpus not a number",
        "image = \"mirror/oracle@sha256:abababababababababababababababababababababababababababababababab\"\nhost_path = true\ngpus = \"one\"",
        "`gpus` must be an integer of at least 1",
        "cairn.toml:7:8",
    ),
    (
        "qps of zero",
        "image = \"mirror/oracle@sha256:abababababababababababababababababababababababababababababababab\"\nhost_path = true\nqps = 0",
        "`qps` must be an integer of at least 1",
        "cairn.toml:7:7",
    ),
    (
        "bad unschedulable timeout",
        "image = \"mirror/oracle@sha256:abababababababababababababababababababababababababababababababab\"\nhost_path = true\nunschedulable_timeout = \"soon\"",
        "invalid timeout `soon`",
        "cairn.toml:7:25",
    ),
    (
        "toleration with an unknown key",
        "image = \"mirror/oracle@sha256:abababababababababababababababababababababababababababababababab\"\nhost_path = true\ntolerations = [{ key = \"gpu\", efect = \"NoSchedule\" }]",
        "unknown key `efect` in a toleration",
        "cairn.toml:7:",
    ),
];

#[test]
fn each_bad_kubernetes_executor_is_a_located_error_at_load() {
    let mut failures = Vec::new();
    for (name, body, fragment, location) in CASES {
        let p = Project::new();
        p.file("cairn.toml", &manifest(body));
        for args in [&["run"][..], &["status"][..]] {
            let run = p.cairn(args);
            let stderr = run.stderr();
            if run.code() != 2 || !stderr.contains(fragment) || !stderr.contains(location) {
                failures.push(format!(
                    "{name} ({args:?}): exit {}; expected `{fragment}` at `{location}`\n{stderr}",
                    run.code()
                ));
            }
            if p.exists("cache") {
                failures.push(format!("{name}: something was written"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn an_unknown_kind_suggests_kubernetes() {
    let p = Project::new();
    p.file(
        "cairn.toml",
        "[pipeline]\nname = \"x\"\n[executors.k8s]\nkind = \"kubernetess\"\n[stages.a]\nrun = \"true\"\n",
    );
    let run = p.cairn(&["status"]);
    run.code_is(2);
    assert!(
        run.stderr().contains("did you mean `kubernetes`?"),
        "{}",
        run.stderr()
    );
}

#[test]
fn a_tag_is_accepted_when_require_digest_is_off() {
    let p = Project::new();
    p.file(
        "cairn.toml",
        &manifest("image = \"mirror/oracle:latest\"\nrequire_digest = false\nhost_path = true"),
    );
    // Loaded: `status` reports the stage as due to run (exit 1), not a
    // manifest error (exit 2).
    p.cairn(&["status"]).code_is(1);
}

#[test]
fn an_unreachable_cluster_fails_the_stage_that_runs_on_it_not_the_load() {
    let p = Project::new();
    p.file(
        "cairn.toml",
        &manifest(&format!(
            "image = \"mirror/oracle@{DIGEST}\"\nhost_path = true"
        )),
    );
    let isolate = |args: &[&str]| {
        let mut command = p.command(args);
        command
            .env("KUBECONFIG", p.path("no-such-kubeconfig"))
            .env("HOME", p.root())
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("KUBERNETES_SERVICE_PORT");
        command.output().unwrap()
    };
    let status = isolate(&["status"]);
    // Loaded and judged (the stage would run: exit 1), with no cluster.
    assert_eq!(
        status.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let run = isolate(&["run"]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success());
    assert_ne!(run.status.code(), Some(2), "not a manifest error: {stderr}");
    assert!(
        stderr.contains("kubernetes could not reach the cluster") && stderr.contains("kubeconfig"),
        "{stderr}"
    );
    assert!(!p.exists("out.txt"));
}

#[test]
fn a_window_across_a_cluster_names_an_executor_and_is_one_stage_at_a_time() {
    let cases = [
        (
            "window = { capacity = 1, hold = \"stage\", across = \"k8z\" }",
            "resource `window` is held across undeclared executor `k8z`",
            "did you mean `k8s`?",
        ),
        (
            "window = { capacity = 2, hold = \"stage\", across = \"k8s\" }",
            "resource `window` is held `across` a cluster, but not by one stage at a time",
            "`capacity = 1` and `hold = \"stage\"`",
        ),
        (
            "window = { capacity = 1, across = \"k8s\" }",
            "resource `window` is held `across` a cluster, but not by one stage at a time",
            "`capacity = 1` and `hold = \"stage\"`",
        ),
    ];
    for (resource, message, help) in cases {
        let p = Project::new();
        p.file(
            "cairn.toml",
            &format!(
                "[pipeline]\nname = \"x\"\n[executors.k8s]\nkind = \"kubernetes\"\nimage = \"m/o@{DIGEST}\"\nhost_path = true\n[resources]\n{resource}\n[stages.a]\nrun = \"true\"\n"
            ),
        );
        let run = p.cairn(&["status"]);
        run.code_is(2);
        let stderr = run.stderr();
        assert!(
            stderr.contains(message) && stderr.contains(help) && stderr.contains("cairn.toml:8:"),
            "{resource}: {stderr}"
        );
    }
}
