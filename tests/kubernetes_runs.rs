//! The real binary on `kind = "kubernetes"` executors, through the real
//! kube client, against `scripts/kube-emulator` (the API server's Job and
//! pod calls and watches over HTTP, each pod's command run as a process
//! here) and, for tags, a real OCI registry. What a pod runs in enters the
//! fingerprint by digest; Jobs are created once per attempt, adopted after
//! `kill -9`, deleted on Ctrl-C and bounded by `max_jobs`.

mod common;

use std::time::{Duration, Instant};

use common::kube::KubeEmulator;
use common::registry::Registry;
use common::{Project, Run};

fn cairn(p: &Project, kube: &KubeEmulator, args: &[&str]) -> Run {
    let output = p
        .command(args)
        .env("KUBECONFIG", &kube.kubeconfig)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    Run { output }
}

/// The names of every Job created, in order.
fn job_names(kube: &KubeEmulator) -> Vec<String> {
    kube.jobs()
        .iter()
        .map(|j| j["name"].as_str().unwrap().to_owned())
        .collect()
}

fn images_of(kube: &KubeEmulator) -> Vec<String> {
    kube.jobs()
        .iter()
        .map(|j| j["image"].as_str().unwrap().to_owned())
        .collect()
}

fn plain_stage(image: &str, require_digest: bool) -> String {
    format!(
        r#"
[pipeline]
name = "images"

[executors.k8s]
kind = "kubernetes"
image = "{image}"
require_digest = {require_digest}
host_path = true

[stages.build]
run = "echo built > out.txt"
outputs = ["out.txt"]
executor = "k8s"
"#
    )
}

#[test]
fn a_tag_is_pinned_before_fingerprinting_and_a_moved_tag_reruns_the_stage() {
    let registry = Registry::start();
    let kube = KubeEmulator::start(None);
    let repo = format!("127.0.0.1:{}/team/oracle", registry.port);
    let first = registry.push("team/oracle", "v1", "first");
    let p = Project::new();
    p.file("cairn.toml", &plain_stage(&format!("{repo}:v1"), false));

    cairn(&p, &kube, &["run"]).success();
    // The pod ran the image the tag named, by digest.
    assert_eq!(images_of(&kube), [format!("{repo}@{first}")]);
    assert_eq!(p.read("out.txt"), "built\n");
    let again = cairn(&p, &kube, &["run"]);
    again.success();
    assert!(again.stderr().contains("0 ran"), "{}", again.stderr());

    // The tag moves: the stage is stale because of its image, and `why`
    // names both digests.
    let second = registry.push("team/oracle", "v1", "second");
    assert_ne!(first, second);
    let why = cairn(&p, &kube, &["why", "build"]);
    let text = why.stdout();
    assert!(text.contains("image"), "{text}");
    assert!(text.contains(&first) && text.contains(&second), "{text}");
    cairn(&p, &kube, &["run"]).success();
    assert_eq!(
        images_of(&kube),
        [format!("{repo}@{first}"), format!("{repo}@{second}")]
    );

    // Naming the first image by its digest is the first fingerprint: its
    // result is reused, no Job is created.
    p.file("cairn.toml", &plain_stage(&format!("{repo}@{first}"), true));
    let pinned = cairn(&p, &kube, &["run"]);
    pinned.success();
    assert!(pinned.stderr().contains("0 ran"), "{}", pinned.stderr());
    assert_eq!(kube.jobs().len(), 2);

    // A tag that cannot be resolved is an error of the stage, naming the
    // image; nothing is submitted.
    p.file("cairn.toml", &plain_stage(&format!("{repo}:v1"), false));
    drop(registry);
    let down = cairn(&p, &kube, &["run"]);
    assert_ne!(down.code(), 0);
    assert!(
        down.stderr()
            .contains(&format!("cannot resolve image `{repo}:v1` to a digest")),
        "{}",
        down.stderr()
    );
    let status = cairn(&p, &kube, &["status"]);
    assert_eq!(status.code(), 1);
    assert!(
        status.stdout().contains("cannot resolve image"),
        "{}",
        status.stdout()
    );
    assert_eq!(kube.jobs().len(), 2);
}

fn digest(n: u8) -> String {
    format!("sha256:{}", format!("{n:02x}").repeat(32))
}

const PER_ITEM: &str = r#"
[pipeline]
name = "per-item-images"

[executors.tasks]
kind = "kubernetes"
image = "{item.image}"
host_path = true

[stages.oracle]
foreach = { items = "items.jsonl", key = "id" }
run = "echo {item.id} >> runs.txt; echo '{\"id\": \"{item.id}\"}' > results/{item.id}.json"
item_result = "results/{item.id}.json"
retry = { max = 1, on = ["infra"], backoff = "10ms" }
executor = "tasks"
outputs = { results = "oracle.jsonl" }
"#;

fn items(images: &[(&str, String)]) -> String {
    images
        .iter()
        .map(|(id, image)| format!("{{\"id\": \"{id}\", \"image\": \"{image}\"}}\n"))
        .collect()
}

#[test]
fn each_item_runs_in_its_own_image_and_only_an_item_whose_image_changed_reruns() {
    let image = |n: u8| format!("mirror.example/task-{n}@{}", digest(n));
    let pullable = [image(1), image(2), image(4)];
    let kube = KubeEmulator::start(Some(&pullable));
    let p = Project::new();
    p.file("cairn.toml", PER_ITEM);
    p.file("results/.keep", "");
    p.file(
        "items.jsonl",
        &items(&[("a", image(1)), ("b", image(2)), ("c", image(3))]),
    );

    // `c`'s image cannot be pulled: infrastructure, retried, never a verdict.
    let first = cairn(&p, &kube, &["run"]);
    assert_ne!(first.code(), 0, "{}", first.stderr());
    let jobs = kube.jobs();
    let image_of = |item: &str| -> Vec<String> {
        jobs.iter()
            .filter(|j| j["labels"]["cairn.dev/item"] == item)
            .map(|j| j["image"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(image_of("a"), [image(1)]);
    assert_eq!(image_of("b"), [image(2)]);
    assert_eq!(image_of("c"), [image(3), image(3)], "tried twice");
    let show = cairn(&p, &kube, &["show", "oracle/c", "--json"]);
    let attempts: serde_json::Value = serde_json::from_str(&show.stdout()).unwrap();
    assert!(
        attempts
            .as_array()
            .unwrap()
            .iter()
            .all(|a| a["class"] == "infra"),
        "{attempts}"
    );
    let mut ran = p.lines("runs.txt");
    ran.sort();
    assert_eq!(ran, ["a", "b"]);

    // `b` moves to another image, `c` to one that exists: those two run,
    // `a` is reused.
    p.file(
        "items.jsonl",
        &items(&[("a", image(1)), ("b", image(4)), ("c", image(2))]),
    );
    cairn(&p, &kube, &["run"]).success();
    let created: Vec<String> = kube.jobs()[4..]
        .iter()
        .map(|j| {
            format!(
                "{} {}",
                j["labels"]["cairn.dev/item"].as_str().unwrap(),
                j["image"].as_str().unwrap()
            )
        })
        .collect();
    let mut created = created;
    created.sort();
    assert_eq!(
        created,
        [format!("b {}", image(4)), format!("c {}", image(2))]
    );

    // An item's image given by tag is refused before anything runs.
    p.file(
        "items.jsonl",
        &items(&[
            ("a", image(1)),
            ("d", "mirror.example/task-9:latest".to_owned()),
        ]),
    );
    let tag = cairn(&p, &kube, &["run"]);
    assert_ne!(tag.code(), 0);
    assert!(
        tag.stderr()
            .contains("item `d`: image `mirror.example/task-9:latest` is not given by digest"),
        "{}",
        tag.stderr()
    );
    assert_eq!(kube.jobs().len(), 6);
}

const SLEEPERS: &str = r#"
[pipeline]
name = "sleepers"

[executors.k8s]
kind = "kubernetes"
image = "mirror.example/sleeper@sha256:abababababababababababababababababababababababababababababababab"
host_path = true
max_jobs = MAX_JOBS

[profiles.other-namespace]
executors.k8s = { kind = "kubernetes", namespace = "batch", cpu = "2", image = "mirror.example/sleeper@sha256:abababababababababababababababababababababababababababababababab", host_path = true }

[stages.work]
foreach = { items = "items.jsonl", key = "id" }
run = "echo {item.id} >> runs/{item.id}; sleep {item.sleep}; echo '{\"id\": \"{item.id}\"}' > out/{item.id}.json"
item_result = "out/{item.id}.json"
executor = "k8s"
outputs = { results = "state/work.jsonl" }
"#;

fn sleepers(n: usize, sleep: u32, max_jobs: usize) -> Project {
    let p = Project::new();
    p.file(
        "cairn.toml",
        &SLEEPERS.replace("MAX_JOBS", &max_jobs.to_string()),
    );
    let items: String = (0..n)
        .map(|i| format!("{{\"id\": \"task-{i:02}\", \"sleep\": {sleep}}}\n"))
        .collect();
    p.file("items.jsonl", &items);
    p.file("runs/.keep", "");
    p.file("out/.keep", "");
    p
}

#[test]
fn jobs_in_flight_never_exceed_max_jobs_and_another_namespace_reruns_nothing() {
    let kube = KubeEmulator::start(None);
    let p = sleepers(40, 0, 3);
    cairn(&p, &kube, &["run"]).success();
    assert_eq!(kube.jobs().len(), 40);
    let (max_active, active) = kube.active();
    assert_eq!(active, 0);
    assert!(max_active <= 3, "{max_active} Jobs at once, the bound is 3");
    assert_eq!(p.lines("state/work.jsonl").len(), 40);

    // Where in the cluster it runs (namespace, resources) is not what it
    // computes: the same image is the same result.
    let moved = cairn(&p, &kube, &["--profile", "other-namespace", "run"]);
    moved.success();
    assert!(moved.stderr().contains("0 ran"), "{}", moved.stderr());
    assert_eq!(kube.jobs().len(), 40);
}

/// `cairn show STAGE/ITEM --json`: the item's attempts.
fn attempts_of(p: &Project, kube: &KubeEmulator, item: &str) -> Vec<serde_json::Value> {
    let show = cairn(p, kube, &["show", item, "--json"]);
    show.success();
    serde_json::from_str(&show.stdout()).unwrap()
}

fn spawn(p: &Project, kube: &KubeEmulator) -> std::process::Child {
    p.command(&["run"])
        .env("KUBECONFIG", &kube.kubeconfig)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

/// `cairn run`, sent `signal` once `ready` holds (within 30 s): a
/// `kill -9` mid-run, or a Ctrl-C. How it ended.
fn run_until(
    p: &Project,
    kube: &KubeEmulator,
    signal: i32,
    what: &str,
    ready: impl FnMut() -> bool,
) -> std::process::ExitStatus {
    let mut child = spawn(p, kube);
    common::wait_for_within(what, Duration::from_secs(30), ready);
    common::signal(child.id(), signal);
    child.wait().unwrap()
}

#[test]
fn a_killed_cairn_leaves_its_jobs_running_and_the_next_run_adopts_them() {
    let kube = KubeEmulator::start(None);
    let p = sleepers(6, 3, 256);
    let mut child = spawn(&p, &kube);
    common::wait_for_within("six Jobs", Duration::from_secs(30), || {
        kube.jobs().len() == 6
    });
    common::wait_for_within("the attempts on record", Duration::from_secs(30), || {
        (0..6).all(|i| {
            attempts_of(&p, &kube, &format!("work/task-{i:02}"))
                .first()
                .is_some_and(|a| a["class"] == "running")
        })
    });
    common::signal(child.id(), libc::SIGKILL);
    child.wait().unwrap();
    let before = attempts_of(&p, &kube, "work/task-00");
    let handle = before[0]["handle"].as_str().unwrap().to_owned();
    assert!(handle.starts_with("kubernetes:default/"), "{handle}");

    let resumed = cairn(&p, &kube, &["run"]);
    resumed.success();
    // No Job was created twice, every command ran once.
    assert_eq!(kube.jobs().len(), 6, "{}", resumed.stderr());
    assert!(kube.deleted().is_empty());
    for i in 0..6 {
        assert_eq!(
            p.lines(&format!("runs/task-{i:02}")).len(),
            1,
            "task-{i:02}"
        );
    }
    assert_eq!(p.lines("state/work.jsonl").len(), 6);
    let after = attempts_of(&p, &kube, "work/task-00");
    let classes: Vec<&str> = after.iter().map(|a| a["class"].as_str().unwrap()).collect();
    assert_eq!(classes, ["abandoned", "ok"], "{after:?}");
    assert_eq!(after[1]["handle"], handle.as_str());
}

#[test]
fn ctrl_c_deletes_the_runs_jobs() {
    let kube = KubeEmulator::start(None);
    let p = sleepers(3, 300, 256);
    let status = run_until(&p, &kube, libc::SIGINT, "three commands started", || {
        (0..3).all(|i| p.exists(&format!("runs/task-{i:02}")))
    });
    assert_eq!(status.code(), Some(130));
    let mut deleted = kube.deleted();
    deleted.sort();
    let mut created: Vec<String> = job_names(&kube);
    created.sort();
    assert_eq!(deleted, created);
    assert_eq!(kube.active().1, 0);
    let attempts = attempts_of(&p, &kube, "work/task-00");
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0]["class"], "cancelled");
}

#[test]
fn ctrl_c_with_detach_leaves_the_jobs_running_and_the_next_run_adopts_them() {
    let kube = KubeEmulator::start(None);
    let p = sleepers(3, 3, 256);
    let mut child = p
        .command(&["run", "--detach"])
        .env("KUBECONFIG", &kube.kubeconfig)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    common::wait_for_within("three commands started", Duration::from_secs(30), || {
        (0..3).all(|i| p.exists(&format!("runs/task-{i:02}")))
    });
    common::signal(child.id(), libc::SIGINT);
    assert_eq!(child.wait().unwrap().code(), Some(130));
    assert!(kube.deleted().is_empty(), "{:?}", kube.deleted());
    assert_eq!(kube.active().1, 3, "the Jobs still run");
    let left = attempts_of(&p, &kube, "work/task-00");
    assert_eq!(left.len(), 1);
    assert_eq!(left[0]["class"], "abandoned");

    cairn(&p, &kube, &["run"]).success();
    assert_eq!(kube.jobs().len(), 3, "adopted, not created again");
    for i in 0..3 {
        assert_eq!(
            p.lines(&format!("runs/task-{i:02}")).len(),
            1,
            "task-{i:02}"
        );
    }
    let after = attempts_of(&p, &kube, "work/task-00");
    let classes: Vec<&str> = after.iter().map(|a| a["class"].as_str().unwrap()).collect();
    assert_eq!(classes, ["abandoned", "ok"]);
    assert_eq!(after[1]["handle"], left[0]["handle"]);
}

#[test]
fn jobs_a_dead_run_left_for_items_no_longer_wanted_are_cancelled() {
    let kube = KubeEmulator::start(None);
    let p = sleepers(4, 300, 256);
    run_until(&p, &kube, libc::SIGKILL, "the attempts on record", || {
        (0..4).all(|i| {
            attempts_of(&p, &kube, &format!("work/task-{i:02}"))
                .first()
                .is_some_and(|a| a["class"] == "running")
        })
    });
    let left: Vec<String> = job_names(&kube);
    assert_eq!(left.len(), 4);

    // Two items stay, as other work (a new fingerprint each); two are gone.
    p.file(
        "items.jsonl",
        "{\"id\": \"task-00\", \"sleep\": 0}\n{\"id\": \"task-01\", \"sleep\": 0}\n",
    );
    cairn(&p, &kube, &["run"]).success();
    let mut deleted = kube.deleted();
    deleted.sort();
    let mut expected = left.clone();
    expected.sort();
    assert_eq!(
        deleted, expected,
        "every job the dead run left was cancelled"
    );
    assert_eq!(kube.jobs().len(), 6, "two new Jobs");
    assert_eq!(kube.active().1, 0);
    let gone = attempts_of(&p, &kube, "work/task-03");
    assert_eq!(gone.len(), 1);
    assert_eq!(gone[0]["class"], "cancelled");
    // Nothing is left to cancel: the next run cancels nothing again.
    cairn(&p, &kube, &["run"]).success();
    assert_eq!(kube.deleted().len(), 4);
}

const PLAIN: &str = r#"
[pipeline]
name = "plain"

[executors.k8s]
kind = "kubernetes"
image = "mirror.example/builder@sha256:abababababababababababababababababababababababababababababababab"
host_path = true

[stages.build]
run = "echo started >> runs.txt; sleep 3; echo built > out.txt"
outputs = ["out.txt"]
executor = "k8s"
"#;

#[test]
fn a_plain_stages_job_is_adopted_after_kill_9_and_forcing_it_submits_a_new_one() {
    let kube = KubeEmulator::start(None);
    let p = Project::new();
    p.file("cairn.toml", PLAIN);
    run_until(&p, &kube, libc::SIGKILL, "the command to start", || {
        p.exists("runs.txt")
    });
    assert_eq!(kube.active().1, 1, "the Job outlives cairn");

    let resumed = cairn(&p, &kube, &["run"]);
    resumed.success();
    assert_eq!(
        kube.jobs().len(),
        1,
        "adopted, not submitted again: {}",
        resumed.stderr()
    );
    assert_eq!(p.lines("runs.txt").len(), 1, "the command ran once");
    assert_eq!(p.read("out.txt"), "built\n");

    // A forced re-run is a new attempt: a new Job, not the finished one.
    cairn(&p, &kube, &["run", "--force", "build"]).success();
    let names: Vec<String> = job_names(&kube);
    assert_eq!(names.len(), 2);
    assert_ne!(names[0], names[1]);
    assert_eq!(p.lines("runs.txt").len(), 2);
}

#[test]
fn a_plain_stages_job_left_by_a_dead_run_is_cancelled_once_its_command_changes() {
    let kube = KubeEmulator::start(None);
    let p = Project::new();
    p.file("cairn.toml", &PLAIN.replace("sleep 3", "sleep 300"));
    let mut child = spawn(&p, &kube);
    common::wait_for_within("the attempt on record", Duration::from_secs(30), || {
        let show = cairn(&p, &kube, &["show", "build", "--json"]);
        let json: serde_json::Value = serde_json::from_str(&show.stdout()).unwrap_or_default();
        json["attempts"][0]["class"] == "running" && p.exists("runs.txt")
    });
    common::signal(child.id(), libc::SIGKILL);
    child.wait().unwrap();
    let left = job_names(&kube);
    assert_eq!(left.len(), 1);

    // The command changed: the dead run's job is not this run's work.
    p.file("cairn.toml", PLAIN);
    cairn(&p, &kube, &["run"]).success();
    assert_eq!(kube.deleted(), left, "the old job was cancelled");
    assert_eq!(kube.jobs().len(), 2, "and one new job ran");
    assert_eq!(kube.active().1, 0);
    assert_eq!(p.read("out.txt"), "built\n");
    // Cancelled once: a forced run (the stage runs, so it looks for jobs
    // to cancel) has nothing left to cancel.
    cairn(&p, &kube, &["run", "--force", "build"]).success();
    assert_eq!(kube.deleted().len(), 1);
    assert_eq!(kube.jobs().len(), 3);
}

const WINDOWED: &str = r#"
[pipeline]
name = "windowed"

[executors.k8s]
kind = "kubernetes"
image = "mirror.example/w@sha256:abababababababababababababababababababababababababababababababab"
host_path = true

[resources]
window = { capacity = 1, hold = "stage" ACROSS }

[stages.work]
foreach = { items = "items.jsonl", key = "id" }
run = "echo $(date +%s.%N) {item.id} >> LOG; sleep 1; echo $(date +%s.%N) {item.id} >> LOG; echo '{\"id\": \"{item.id}\"}' > out/{item.id}.json"
item_result = "out/{item.id}.json"
executor = "k8s"
resources = ["window"]
outputs = { results = "state/work.jsonl" }
"#;

/// Two projects (two cairn processes, as on two machines) run a stage that
/// holds `window` at once; the spans of time each project's commands ran
/// in, from the shared log.
fn two_runs_holding_a_window(across: bool) -> Vec<(f64, f64)> {
    let kube = KubeEmulator::start(None);
    let shared = tempfile::tempdir().unwrap();
    let log = shared.path().join("window.log");
    let projects: Vec<Project> = ["p", "q"]
        .iter()
        .map(|name| {
            let p = Project::new();
            let manifest = WINDOWED
                .replace("ACROSS", if across { ", across = \"k8s\"" } else { "" })
                .replace("LOG", &log.display().to_string());
            p.file("cairn.toml", &manifest);
            let items: String = (0..3)
                .map(|i| format!("{{\"id\": \"{name}-{i}\"}}\n"))
                .collect();
            p.file("items.jsonl", &items);
            p.file("out/.keep", "");
            p
        })
        .collect();
    let children: Vec<std::process::Child> = projects
        .iter()
        .map(|p| {
            p.command(&["run"])
                .env("KUBECONFIG", &kube.kubeconfig)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    common::spans_of_two_projects(&log)
}

#[test]
fn a_window_across_the_cluster_is_held_by_one_run_at_a_time() {
    let spans = two_runs_holding_a_window(true);
    assert!(
        !common::overlap(&spans),
        "two runs held the window at once: {spans:?}"
    );
    // Control: held within each process only, the two runs overlap.
    let spans = two_runs_holding_a_window(false);
    assert!(
        common::overlap(&spans),
        "the runs did not run side by side: {spans:?}"
    );
}

const HOLDER: &str = r#"
[pipeline]
name = "holder"

[executors.k8s]
kind = "kubernetes"
image = "mirror.example/w@sha256:abababababababababababababababababababababababababababababababab"
host_path = true

[resources]
window = { capacity = 1, hold = "stage", across = "k8s" }

[stages.work]
run = "touch started; sleep 60; touch done"
outputs = ["done"]
executor = "k8s"
resources = ["window"]
"#;

#[test]
fn a_run_waiting_for_a_window_across_the_cluster_stops_when_another_stage_fails() {
    let kube = KubeEmulator::start(None);
    let holder = Project::new();
    holder.file("cairn.toml", HOLDER);
    let mut holding = common::Reaped(spawn(&holder, &kube));
    common::wait_for_within("the window held", Duration::from_secs(30), || {
        holder.exists("started")
    });

    // The second run's `work` waits for the window; its `broken` fails
    // meanwhile, which stops the run: it ends now, not when the window is
    // free.
    let waiter = Project::new();
    waiter.file(
        "cairn.toml",
        &format!("{HOLDER}\n[stages.broken]\nrun = \"sleep 2; exit 1\"\n"),
    );
    let run = cairn(&waiter, &kube, &["run"]);
    run.code_is(1);
    assert!(run.stderr().contains("FAILED  broken"), "{}", run.stderr());
    assert!(
        !holder.exists("done"),
        "the run waited for the window until it was free"
    );
    assert!(!waiter.exists("started"), "the waiting stage never ran");

    common::signal(holding.0.id(), libc::SIGINT);
    holding.0.wait().unwrap();
}

#[test]
fn a_job_that_finished_while_cairn_was_dead_is_collected_with_what_it_wrote() {
    let kube = KubeEmulator::start(None);
    let p = Project::new();
    p.file("cairn.toml", PLAIN);
    run_until(&p, &kube, libc::SIGKILL, "the command to start", || {
        p.exists("runs.txt")
    });
    // The Job ends, and writes its output, while no cairn runs.
    common::wait_for_within("the Job to finish", Duration::from_secs(30), || {
        kube.active().1 == 0
    });
    assert_eq!(p.read("out.txt"), "built\n");

    let resumed = cairn(&p, &kube, &["run"]);
    resumed.success();
    assert_eq!(kube.jobs().len(), 1, "{}", resumed.stderr());
    assert_eq!(p.lines("runs.txt").len(), 1, "the command ran once");
    assert_eq!(p.read("out.txt"), "built\n");
}

#[test]
fn forcing_an_item_submits_a_new_job_instead_of_adopting_its_finished_one() {
    let kube = KubeEmulator::start(None);
    let p = sleepers(2, 0, 256);
    cairn(&p, &kube, &["run"]).success();
    assert_eq!(kube.jobs().len(), 2);
    cairn(&p, &kube, &["run", "--force", "work/task-01"]).success();
    let names: Vec<String> = job_names(&kube);
    assert_eq!(names.len(), 3, "{names:?}");
    assert!(
        names[2].ends_with("-2"),
        "the forced attempt is attempt 2: {names:?}"
    );
    assert_eq!(p.lines("runs/task-01").len(), 2, "the command ran again");
    assert_eq!(p.lines("runs/task-00").len(), 1);
}

#[test]
fn after_ctrl_c_the_next_attempt_has_a_name_of_its_own() {
    let kube = KubeEmulator::start(None);
    let p = sleepers(1, 300, 256);
    assert_eq!(
        run_until(&p, &kube, libc::SIGINT, "the command to start", || {
            p.exists("runs/task-00")
        })
        .code(),
        Some(130)
    );
    p.file("items.jsonl", "{\"id\": \"task-00\", \"sleep\": 300}\n");
    run_until(&p, &kube, libc::SIGINT, "a second Job", || {
        kube.jobs().len() == 2
    });
    let names: Vec<String> = job_names(&kube);
    assert_ne!(
        names[0], names[1],
        "the cancelled attempt's name was reused"
    );
}

// ---- items in Indexed Jobs ------------------------------------------------

const INDEXED: &str = r#"
[pipeline]
name = "indexed"

[executors.k8s]
kind = "kubernetes"
image = "mirror.example/sleeper@sha256:abababababababababababababababababababababababababababababababab"
host_path = true
batch = 8

[stages.work]
foreach = { items = "items.jsonl", key = "id" }
run = "echo {item.id} >> runs/{item.id}; echo working on {item.id}; sleep {item.sleep}; test {item.id} != task-03 || exit 3; echo '{\"id\": \"{item.id}\"}' > out/{item.id}.json"
classify = [{ exit = 3, as = "rejected" }]
item_result = "out/{item.id}.json"
executor = "k8s"
outputs = { results = "state/work.jsonl" }
"#;

fn indexed(n: usize, sleep: u32) -> Project {
    let p = sleepers(n, sleep, 256);
    p.file("cairn.toml", INDEXED);
    p
}

/// The index an attempt ran as (`kubernetes:NS/JOB#3`): (Job, index).
fn job_index(attempt: &serde_json::Value) -> (String, usize) {
    let handle = attempt["handle"].as_str().unwrap();
    let (job, index) = handle
        .strip_prefix("kubernetes:default/")
        .and_then(|rest| rest.split_once('#'))
        .unwrap_or_else(|| panic!("not an index of an Indexed Job: {handle}"));
    (job.to_owned(), index.parse().unwrap())
}

#[test]
fn items_run_as_indexed_jobs_and_each_index_is_its_items_own_attempt() {
    let kube = KubeEmulator::start(None);
    let p = indexed(20, 0);
    cairn(&p, &kube, &["run"]).success();
    let jobs = kube.jobs();
    let sizes: Vec<u64> = jobs
        .iter()
        .map(|j| j["indices"].as_u64().unwrap())
        .collect();
    assert!(
        sizes.iter().all(|&n| n <= 8) && sizes.iter().sum::<u64>() == 20,
        "{sizes:?}"
    );
    assert!(
        sizes.len() < 10,
        "{} Jobs for 20 items: {sizes:?}",
        sizes.len()
    );
    let merged = p.lines("state/work.jsonl");
    assert_eq!(merged.len(), 20);
    let mut indices = std::collections::BTreeSet::new();
    for i in 0..20 {
        let attempts = attempts_of(&p, &kube, &format!("work/task-{i:02}"));
        assert_eq!(attempts.len(), 1, "task-{i:02}: {attempts:?}");
        // Each item failed or passed on its own, in its own pod.
        let class = if i == 3 { "rejected" } else { "ok" };
        assert_eq!(attempts[0]["class"], class, "task-{i:02}");
        assert!(indices.insert(job_index(&attempts[0])), "{attempts:?}");
        let log = std::fs::read_to_string(attempts[0]["log_path"].as_str().unwrap()).unwrap();
        assert_eq!(log, format!("working on task-{i:02}\n"));
        assert_eq!(p.lines(&format!("runs/task-{i:02}")).len(), 1);
    }
    let again = cairn(&p, &kube, &["run"]);
    again.success();
    assert!(again.stderr().contains("0 ran"), "{}", again.stderr());
    assert_eq!(kube.jobs().len(), sizes.len());
}

#[test]
fn a_killed_cairn_leaves_its_indexed_job_running_and_the_next_run_adopts_each_index() {
    let kube = KubeEmulator::start(None);
    let p = indexed(6, 3);
    run_until(&p, &kube, libc::SIGKILL, "the Indexed Job", || {
        !kube.jobs().is_empty()
    });

    let resumed = cairn(&p, &kube, &["run"]);
    resumed.success();
    assert_eq!(kube.jobs().len(), 1, "{}", resumed.stderr());
    assert!(kube.deleted().is_empty());
    for i in 0..6 {
        assert_eq!(
            p.lines(&format!("runs/task-{i:02}")).len(),
            1,
            "task-{i:02}"
        );
        let attempts = attempts_of(&p, &kube, &format!("work/task-{i:02}"));
        let last = attempts.last().unwrap();
        assert_eq!(job_index(last).0, job_names(&kube)[0]);
    }
    assert_eq!(p.lines("state/work.jsonl").len(), 6);
}

#[test]
fn ctrl_c_deletes_the_runs_indexed_jobs() {
    let kube = KubeEmulator::start(None);
    let p = indexed(3, 300);
    let status = run_until(&p, &kube, libc::SIGINT, "three commands started", || {
        (0..3).all(|i| p.exists(&format!("runs/task-{i:02}")))
    });
    assert_eq!(status.code(), Some(130));
    assert_eq!(kube.deleted(), job_names(&kube));
    assert_eq!(kube.active().1, 0);
    for i in 0..3 {
        let attempts = attempts_of(&p, &kube, &format!("work/task-{i:02}"));
        assert_eq!(attempts.len(), 1);
        assert_eq!(attempts[0]["class"], "cancelled");
    }
}

/// Two checkouts of one pipeline at the same path (two CI runners on two
/// machines sharing a cluster) have job names of their own: the second
/// never adopts the first's Jobs, which the cluster still keeps.
#[test]
fn a_second_checkout_at_the_same_path_never_adopts_the_firsts_jobs() {
    let kube = KubeEmulator::start(None);
    let p = sleepers(2, 0, 256);
    cairn(&p, &kube, &["run"]).success();
    assert_eq!(kube.jobs().len(), 2);
    // The other checkout: the same files at the same path, nothing made.
    for made in ["cache", "state", "runs", "out"] {
        std::fs::remove_dir_all(p.path(made)).unwrap();
    }
    p.file("runs/.keep", "");
    p.file("out/.keep", "");
    let second = cairn(&p, &kube, &["run"]);
    second.success();
    assert_eq!(kube.jobs().len(), 4, "{}", second.stderr());
    for i in 0..2 {
        assert_eq!(p.lines(&format!("runs/task-{i:02}")).len(), 1);
    }
    assert_eq!(p.lines("state/work.jsonl").len(), 2);
}

/// A registry that tells a tag's digest only once `gate` exists (at most
/// 20 s later): for each request, whether the gate was there.
fn gated_registry(gate: std::path::PathBuf) -> (u16, std::sync::mpsc::Receiver<bool>) {
    use std::io::{Read as _, Write as _};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (seen, answered) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut head = [0u8; 4096];
            let _ = stream.read(&mut head);
            let deadline = Instant::now() + Duration::from_secs(20);
            while !gate.exists() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = seen.send(gate.exists());
            let _ = stream.write_all(
                format!("HTTP/1.1 200 OK\r\nDocker-Content-Digest: {}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", digest(7))
                    .as_bytes(),
            );
        }
    });
    (port, answered)
}

/// A registry slow to resolve one stage's tag holds up that stage only:
/// the others run meanwhile (the tag is resolved off the scheduler's
/// thread). Here the registry answers only once another stage has run.
#[test]
fn a_slow_registry_holds_up_only_the_stage_whose_tag_it_resolves() {
    let kube = KubeEmulator::start(None);
    let p = Project::new();
    let (port, answered) = gated_registry(p.path("q.txt"));
    p.file(
        "cairn.toml",
        &format!(
            r#"
[pipeline]
name = "gated"

[executors.k8s]
kind = "kubernetes"
image = "127.0.0.1:{port}/team/oracle:v1"
require_digest = false
host_path = true

[stages.remote]
run = "echo remote > r.txt"
outputs = ["r.txt"]
executor = "k8s"

[stages.quick]
run = "echo quick > q.txt"
outputs = ["q.txt"]
"#
        ),
    );
    let run = cairn(&p, &kube, &["run"]);
    run.success();
    assert_eq!(
        answered.try_recv(),
        Ok(true),
        "the other stage waited for the registry: {}",
        run.stderr()
    );
    assert_eq!(p.read("r.txt"), "remote\n");
    assert_eq!(
        images_of(&kube),
        [format!("127.0.0.1:{port}/team/oracle@{}", digest(7))]
    );
}
