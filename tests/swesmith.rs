//! The shipped swesmith-curation pipeline, under its reduced `ci` profile,
//! from a copy of the repository's files: end to end, a no-op, every
//! inspection command, and one edited test file re-validating exactly the
//! tasks built on it.

mod common;

use std::path::Path;

use common::Project;

/// The repository's shape in a temp dir: the manifest and its files under
/// `pipelines/`, the configs under `configs/`; the root is the top.
fn shipped() -> Project {
    common::require_tool("python3");
    common::require_tool("git");
    let p = Project::new();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::create_dir_all(p.path("pipelines")).unwrap();
    std::fs::copy(
        repo.join("pipelines/swesmith-curation.toml"),
        p.path("pipelines/swesmith-curation.toml"),
    )
    .unwrap();
    common::copy_tree(
        &repo.join("pipelines/swesmith-curation"),
        &p.path("pipelines/swesmith-curation"),
        &["state", "cache", "dist", "__pycache__"],
    );
    common::copy_tree(
        &repo.join("configs"),
        &p.path("configs"),
        &["state", "cache", "dist", "__pycache__"],
    );
    p
}

fn cairn(p: &Project, args: &[&str]) -> common::Run {
    let mut all = vec!["-f", "pipelines/swesmith-curation.toml", "--profile", "ci"];
    all.extend_from_slice(args);
    p.cairn(&all)
}

/// The keys of a per-item stage's outcomes recorded in run `run`.
fn items_run_in(p: &Project, stage: &str, run: i64) -> Vec<String> {
    let out = cairn(p, &["show", stage, "--items", "--json"]);
    out.success();
    let records: serde_json::Value = serde_json::from_str(&out.stdout()).unwrap();
    let mut keys: Vec<String> = records
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["run_id"] == run)
        .map(|r| r["key"].as_str().unwrap().to_owned())
        .collect();
    keys.sort();
    keys
}

/// The oracle's verdict on each task: (key, class), in key order.
fn oracle_verdicts(p: &Project) -> Vec<(String, String)> {
    let mut verdicts: Vec<(String, String)> = jsonl(p, "state/swesmith-curation/oracle.jsonl")
        .iter()
        .map(|r| {
            (
                r["key"].as_str().unwrap().to_owned(),
                r["class"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    verdicts.sort();
    verdicts
}

fn jsonl(p: &Project, path: &str) -> Vec<serde_json::Value> {
    p.read(path)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn the_shipped_pipeline_runs_end_to_end_then_reruns_only_what_an_edit_reaches() {
    let p = shipped();
    let first = cairn(&p, &["run"]);
    first.success();
    assert!(
        first.stderr().contains("22 ran, 0 fresh"),
        "{}",
        first.stderr()
    );
    let state = "state/swesmith-curation";

    // What the workflow asks of each stage.
    let pool = jsonl(&p, &format!("{state}/pool/candidates.jsonl"));
    assert_eq!(pool.len(), 6000);
    let a = jsonl(&p, &format!("{state}/plan/stage-a.jsonl"));
    let b = jsonl(&p, &format!("{state}/plan/stage-b.jsonl"));
    assert_eq!((a.len(), b.len()), (16, 16));
    let old: Vec<String> = jsonl(&p, &format!("{state}/pool/old-freeze.jsonl"))
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    assert!(old.iter().all(|id| a.iter().any(|r| r["id"] == *id)));
    assert!(a.iter().all(|r| r["filter_pro"] == true));
    assert!(b.iter().all(|r| r["in_filtered"] == false));
    // Stage A's new tasks need a completed base image; stage B is not
    // limited by the image status (the seeds: it has not entered the image
    // pipeline yet), and this pool has B tasks without one.
    assert!(a.iter().all(|r| r["image_status"] == "ok"));
    assert!(
        b.iter().any(|r| r["image_status"] == "missing"),
        "stage B was filtered on image status"
    );
    let oracle = jsonl(&p, &format!("{state}/oracle.jsonl"));
    let classes: std::collections::BTreeSet<&str> = oracle
        .iter()
        .map(|r| r["class"].as_str().unwrap())
        .collect();
    assert!(classes.contains("ok"), "{classes:?}");
    // Resolve: each stage's quota from its own stage, the older freeze's
    // accepted tasks all kept.
    let selected = jsonl(&p, &format!("{state}/resolve/selected.jsonl"));
    let in_stage = |stage: &str| selected.iter().filter(|r| r["stage"] == stage).count();
    assert_eq!((in_stage("A"), in_stage("B")), (9, 9));
    let accepted = jsonl(&p, &format!("{state}/oracle-accepted.jsonl"));
    for id in &old {
        if accepted.iter().any(|r| r["id"] == *id) {
            assert!(selected.iter().any(|r| r["id"] == *id), "{id} dropped");
        }
    }
    let planned = jsonl(&p, &format!("{state}/plan/planned.jsonl"));
    assert_eq!(
        planned.len(),
        16 + 16 + 8 + 8,
        "main lists and each stage's reserves"
    );
    let splits = jsonl(&p, &format!("{state}/resolve/splits.jsonl"));
    let mut repo_split = std::collections::HashMap::new();
    for r in &splits {
        let previous = repo_split.insert(r["repo"].as_str().unwrap(), r["split"].as_str().unwrap());
        assert!(
            previous.is_none_or(|s| s == r["split"]),
            "a repo in two splits"
        );
    }
    assert!(
        p.read(&format!("{state}/canary/report.md"))
            .contains("| model-a |")
    );
    let resolved: serde_json::Value =
        serde_json::from_str(&p.read(&format!("{state}/train/resolved-config.json"))).unwrap();
    assert_eq!(resolved["mode"], "dry-run");

    // The registered dataset re-verifies.
    let receipt: serde_json::Value =
        serde_json::from_str(&p.read(&format!("{state}/registered.json"))).unwrap();
    let bundle = "dist/swesmith-rl.tar.zst";
    let verify = p.cairn(&["verify", bundle]);
    verify.success();
    assert!(
        verify
            .stdout()
            .contains(receipt["sha256"].as_str().unwrap()),
        "{}",
        verify.stdout()
    );

    // A no-op, and every inspection command.
    let again = cairn(&p, &["run"]);
    assert!(
        again.stderr().contains("0 ran, 22 fresh"),
        "{}",
        again.stderr()
    );
    for args in [
        &["status"][..],
        &["why", "oracle"],
        &["dag", "--format", "mermaid"],
        &["audit"],
        &["provenance", "dist/swesmith-rl.tar.zst"],
        &["provenance", "freeze", "--format", "intoto"],
    ] {
        cairn(&p, args).success();
    }

    // Edit the test file one repository function's tasks are built on:
    // materialize, the static filter and the oracle re-run exactly those
    // tasks.
    let accepted = jsonl(&p, &format!("{state}/static-accepted.jsonl"));
    let plan = jsonl(&p, &format!("{state}/plan/planned.jsonl"));
    let first_task = plan
        .iter()
        .find(|t| accepted.iter().any(|a| a["id"] == t["id"]))
        .unwrap();
    let (template, func) = (
        first_task["template"].as_str().unwrap(),
        first_task["func"].as_str().unwrap(),
    );
    let mut affected: Vec<String> = plan
        .iter()
        .filter(|t| t["template"] == template && t["func"] == func)
        .map(|t| t["id"].as_str().unwrap().to_owned())
        .collect();
    affected.sort();
    let test = format!("pipelines/swesmith-curation/repos/{template}/tests/test_{func}.py");
    let text = p.read(&test);
    p.file(&test, &format!("{text}# reviewed\n"));
    let third = cairn(&p, &["run"]);
    third.success();
    assert_eq!(items_run_in(&p, "materialize", 3), affected);
    assert_eq!(items_run_in(&p, "static-filter", 3), affected);
    let affected_accepted: Vec<String> = affected
        .iter()
        .filter(|id| accepted.iter().any(|a| a["id"] == **id))
        .cloned()
        .collect();
    assert_eq!(items_run_in(&p, "oracle", 3), affected_accepted);
    // Their verdicts did not change, so nothing between the oracle and the
    // freeze ran; the freeze re-ran (it copies task files) and, unless one
    // of these tasks is frozen, wrote the same bytes: nothing after it ran.
    let stderr = third.stderr();
    let ran: Vec<&str> = stderr
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("ok  "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let frozen = splits
        .iter()
        .any(|r| affected.iter().any(|id| r["id"] == *id));
    let mut expected = vec!["materialize", "static-filter", "oracle", "freeze"];
    if frozen {
        expected.extend([
            "lineage",
            "export",
            "register",
            "canary-lists",
            "canary",
            "canary-report",
            "train",
        ]);
    }
    assert_eq!(ran, expected, "{stderr}");
}

/// Every task whose gold patch was made against another revision (the
/// fixture's `bad-patch` defect) is rejected by the static filter: the patch
/// must apply exactly, with no fuzz (`git apply --check`). Each repository
/// function is tried, with an intact task of the same function as the
/// control.
#[test]
fn a_gold_patch_that_needs_fuzz_to_apply_is_statically_rejected() {
    common::require_tool("python3");
    common::require_tool("git");
    let dir = tempfile::tempdir().unwrap();
    let pipelines = Path::new(env!("CARGO_MANIFEST_DIR")).join("pipelines/swesmith-curation");
    let materialize = pipelines.join("materialize.py");
    let static_check = pipelines.join("static_check.py");
    let mut tried = 0;
    for template in ["dateparse", "listutil", "mathops", "textkit"] {
        let mutations: serde_json::Map<String, serde_json::Value> = serde_json::from_str(
            &std::fs::read_to_string(pipelines.join(format!("repos/{template}/mutations.json")))
                .unwrap(),
        )
        .unwrap();
        for func in mutations.keys() {
            for (defect, accepted) in [("bad-patch", false), ("none", true)] {
                let task = dir.path().join(format!("{template}-{func}-{defect}"));
                let made = std::process::Command::new("python3")
                    .arg(&materialize)
                    .arg(&task)
                    .args(["id", "repo", template, func, defect, "image"])
                    .output()
                    .unwrap();
                assert!(made.status.success(), "{made:?}");
                let checked = std::process::Command::new("python3")
                    .arg(&static_check)
                    .arg(&task)
                    .arg(task.with_extension("json"))
                    .output()
                    .unwrap();
                let stdout = String::from_utf8_lossy(&checked.stdout);
                assert_eq!(
                    checked.status.success(),
                    accepted,
                    "{template}/{func} with defect {defect}: {stdout}"
                );
                if !accepted {
                    assert!(stdout.contains("gold patch does not apply"), "{stdout}");
                }
                tried += 1;
            }
        }
    }
    assert_eq!(tried, 48);
}

/// Under `--profile ci,cluster` (its registry moved to a private one):
/// the task images are mirrored to a real registry, and every oracle and
/// canary trial runs as a Kubernetes Job (through `scripts/kube-emulator`)
/// in its task's image, by the digest the mirror recorded, with the same
/// verdicts as on this machine.
#[test]
fn on_the_cluster_profile_each_oracle_and_canary_trial_runs_in_its_tasks_mirrored_image() {
    let registry = common::registry::Registry::start();
    let kube = common::kube::KubeEmulator::start(None);
    let p = shipped();
    let manifest = p
        .read("pipelines/swesmith-curation.toml")
        .replace("127.0.0.1:5000", &format!("127.0.0.1:{}", registry.port));
    p.file("pipelines/swesmith-curation.toml", &manifest);
    let run = p
        .command(&[
            "-f",
            "pipelines/swesmith-curation.toml",
            "--profile",
            "ci,cluster",
            "run",
        ])
        .env("KUBECONFIG", &kube.kubeconfig)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    common::Run { output: run }.success();

    let mirrored = jsonl(&p, "state/swesmith-curation/images.jsonl");
    let reference_of = |id: &str| -> String {
        mirrored
            .iter()
            .find(|r| r["id"] == id)
            .unwrap_or_else(|| panic!("{id} was not mirrored"))["reference"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let jobs = kube.jobs();
    let oracle: Vec<&serde_json::Value> = jobs
        .iter()
        .filter(|j| j["labels"]["cairn.dev/stage"] == "oracle")
        .collect();
    assert_eq!(oracle.len(), mirrored.len(), "one Job per mirrored task");
    for job in &oracle {
        let reference = reference_of(job["item"].as_str().unwrap());
        assert_eq!(job["image"], reference.as_str());
        // The registry serves that very manifest.
        let (_, digest) = reference.rsplit_once('@').unwrap();
        let repo = reference
            .split_once('/')
            .unwrap()
            .1
            .rsplit_once('@')
            .unwrap()
            .0;
        assert!(
            registry
                .get(&format!("/v2/{repo}/tags/list"))
                .contains("baseanchor-"),
            "{repo}"
        );
        assert!(digest.starts_with("sha256:"), "{reference}");
    }
    let canary: Vec<&serde_json::Value> = jobs
        .iter()
        .filter(|j| j["labels"]["cairn.dev/stage"] == "canary")
        .collect();
    assert!(!canary.is_empty());
    for job in &canary {
        let task = job["item"].as_str().unwrap().split_once(':').unwrap().1;
        assert_eq!(job["image"], reference_of(task).as_str());
    }

    // The verdicts are those of this machine: where a command runs does
    // not change what it computes.
    let local = shipped();
    cairn(&local, &["run"]).success();
    assert_eq!(oracle_verdicts(&p), oracle_verdicts(&local));
}

/// Under `--profile ci,slurm`, on the real one-node Slurm cluster that
/// `scripts/test` starts: every oracle and canary trial runs as a task of a
/// job array (items ready together, one `sbatch`), holding the window
/// through the cluster's `cluster-window` license, with the verdicts of
/// this machine.
#[test]
fn on_the_slurm_profile_the_oracle_and_canary_run_as_job_arrays_with_this_machines_verdicts() {
    assert!(
        std::env::var_os("SLURM_CONF").is_some(),
        "no Slurm cluster: run the tests with `scripts/test`, which starts one"
    );
    let p = shipped();
    let run = p.cairn(&[
        "-f",
        "pipelines/swesmith-curation.toml",
        "--profile",
        "ci,slurm",
        "run",
    ]);
    run.success();
    let on_slurm = |stage: &str| -> std::collections::BTreeMap<String, (String, String)> {
        let out = p.cairn(&[
            "-f",
            "pipelines/swesmith-curation.toml",
            "show",
            stage,
            "--items",
            "--json",
        ]);
        out.success();
        let items: Vec<serde_json::Value> = serde_json::from_str(&out.stdout()).unwrap();
        items
            .iter()
            .map(|item| {
                let key = item["key"].as_str().unwrap().to_owned();
                let show = p.cairn(&[
                    "-f",
                    "pipelines/swesmith-curation.toml",
                    "show",
                    &format!("{stage}/{key}"),
                    "--json",
                ]);
                show.success();
                let attempts: Vec<serde_json::Value> =
                    serde_json::from_str(&show.stdout()).unwrap();
                let handle = attempts.last().unwrap()["handle"]
                    .as_str()
                    .unwrap()
                    .to_owned();
                (key, (handle, item["class"].as_str().unwrap().to_owned()))
            })
            .collect()
    };
    for stage in ["oracle", "canary"] {
        let items = on_slurm(stage);
        assert!(!items.is_empty(), "{stage}");
        let arrays: std::collections::BTreeSet<&str> = items
            .values()
            .map(|(handle, _)| {
                let task = handle
                    .strip_prefix("slurm:")
                    .unwrap_or_else(|| panic!("{stage}: not a Slurm job: {handle}"));
                task.split_once('_')
                    .unwrap_or_else(|| panic!("{stage}: not an array task: {handle}"))
                    .0
            })
            .collect();
        assert!(
            arrays.len() < items.len(),
            "{stage}: {} arrays for {} items",
            arrays.len(),
            items.len()
        );
    }

    let local = shipped();
    cairn(&local, &["run"]).success();
    assert_eq!(oracle_verdicts(&p), oracle_verdicts(&local));
}

/// A cairn command in `p` signing and trusting with the key at `key`.
fn cairn_keyed(p: &Project, key: &Path, args: &[&str]) -> common::Run {
    let mut all = vec!["-f", "pipelines/swesmith-curation.toml", "--profile", "ci"];
    all.extend_from_slice(args);
    let output = p
        .command(&all)
        .env("CAIRN_SIGNING_KEY_FILE", key)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    common::Run { output }
}

#[test]
fn the_shipped_freeze_moves_through_a_remote_cache_and_verifies_where_it_is_pulled() {
    let cache = common::http_cache::HttpCache::start();
    let keys = tempfile::tempdir().unwrap();
    let key = keys.path().join("signing-key");
    let url = cache.url();

    // Where the freeze is made: run, then push every current result.
    let made = shipped();
    cairn_keyed(&made, &key, &["run"]).success();
    let pushed = cairn_keyed(&made, &key, &["push", "--remote-cache", &url]);
    pushed.success();
    assert!(
        pushed.stdout().contains("pushed 22 stage result(s)"),
        "{}",
        pushed.stdout()
    );

    // A fresh checkout with the committed lock file (another machine: no
    // cache, no outputs), pulled and verified without running anything.
    let gpu = shipped();
    std::fs::copy(
        made.path("pipelines/swesmith-curation.lock"),
        gpu.path("pipelines/swesmith-curation.lock"),
    )
    .unwrap();
    let pulled = cairn_keyed(&gpu, &key, &["pull", "--remote-cache", &url]);
    pulled.success();
    assert!(
        pulled
            .stdout()
            .contains("pulled 22 stage result(s) (0 already here) and "),
        "{}",
        pulled.stdout()
    );
    gpu.cairn(&["verify", "dist/swesmith-rl.tar.zst"]).success();
    gpu.cairn(&["-f", "pipelines/swesmith-curation.toml", "verify", "--lock"])
        .success();
    // The pull is a run of its own, its timeline every stage from the remote.
    let log = cairn_keyed(&gpu, &key, &["log", "1", "--json"]);
    let log: serde_json::Value = serde_json::from_str(&log.stdout()).unwrap();
    let stages = log["stages"].as_array().unwrap();
    assert_eq!(stages.len(), 22);
    assert!(
        stages.iter().all(|s| s["state"] == "remote"
            && s["reason"]
                .as_str()
                .unwrap()
                .starts_with("pulled from http://")),
        "{stages:?}"
    );
    assert_eq!(
        made.read("dist/swesmith-rl.tar.zst.sha256"),
        gpu.read("dist/swesmith-rl.tar.zst.sha256")
    );
    // Its items came along: only those that ended in error there (which
    // are not shared: a run tries them again) are pending here.
    // (`status` exits 1 where a stage would run.)
    let status_of = |p: &Project, code: i32| -> Vec<serde_json::Value> {
        let status = cairn_keyed(p, &key, &["status", "--json"]);
        status.code_is(code);
        let json: serde_json::Value = serde_json::from_str(&status.stdout()).unwrap();
        json["stages"].as_array().unwrap().clone()
    };
    let pending = |stages: Vec<serde_json::Value>| -> Vec<(String, u64)> {
        stages
            .iter()
            .filter(|s| s["items"].is_object())
            .map(|s| {
                let items = &s["items"];
                let count = |k: &str| items[k].as_u64().unwrap_or(0);
                (
                    s["stage"].as_str().unwrap().to_owned(),
                    count("pending") + count("error") + count("infra"),
                )
            })
            .collect()
    };
    let pulled_status = status_of(&gpu, 1);
    let stale: Vec<&str> = pulled_status
        .iter()
        .filter(|s| s["state"] != "fresh" && s["reason"]["reason"] != "upstream-stale")
        .map(|s| s["stage"].as_str().unwrap())
        .collect();
    // (`register`, downstream of the mirror, waits for it: upstream-stale.)
    assert_eq!(
        stale,
        ["mirror-images"],
        "only the work beyond outputs is missing here"
    );
    assert_eq!(pending(pulled_status), pending(status_of(&made, 0)));
    // The pull brought the receipt, not the import it stands for (nor the
    // mirror's list, the copies): the first run mirrors into this machine's
    // layout and imports the bundle into its registry (what the trainer
    // reads), and runs nothing else.
    let run = cairn_keyed(&gpu, &key, &["run"]);
    run.success();
    assert!(
        run.stderr().contains("2 ran, 20 fresh")
            && run
                .stderr()
                .contains("register (the registry `state/swesmith-curation/registry` does not hold swesmith-rl"),
        "{}",
        run.stderr()
    );
    let receipt: serde_json::Value =
        serde_json::from_str(&gpu.read("state/swesmith-curation/registered.json")).unwrap();
    let registered = format!(
        "state/swesmith-curation/registry/swesmith-rl/{}/manifest.json",
        receipt["version"].as_str().unwrap()
    );
    assert_eq!(gpu.read(&registered), made.read(&registered));
    // Pulled again: everything is here already, nothing is fetched.
    let again = cairn_keyed(&gpu, &key, &["pull", "--remote-cache", &url]);
    again.success();
    assert!(
        again
            .stdout()
            .contains("pulled 0 stage result(s) (22 already here) and 0 item outcome(s)"),
        "{}",
        again.stdout()
    );
}

/// Before any canary trial, the model server's check runs against the
/// server the run started: a checkpoint whose weights are not the declared
/// ones, or a server launched at another context than the canary's
/// evaluation profile, stops the canary with the reason and no trial runs;
/// put right, the canary runs, asking the server once per sample (its log
/// has the requests) and stopping it after. The agreement is per profile:
/// a trainer at another context does not stop the selection canary, only
/// the training it disagrees with.
#[test]
fn the_canary_runs_only_against_the_declared_checkpoints_at_its_profiles_context() {
    let p = shipped();
    let weights = "pipelines/swesmith-curation/models/model-b/model.safetensors";
    let original = std::fs::read(p.path(weights)).unwrap();
    let mut flipped = original.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 0x01;
    std::fs::write(p.path(weights), &flipped).unwrap();
    let trials = "state/swesmith-curation/canary/trials";

    let tampered = cairn(&p, &["run", "canary"]);
    tampered.code_is(1);
    let stderr = tampered.stderr();
    assert!(
        stderr.contains("service `model-server` failed its check")
            && stderr.contains("model-b: weights_sha256 is ")
            && !stderr.contains("model-a: weights_sha256")
            && !stderr.contains("model-b: served as"),
        "{stderr}"
    );
    assert!(!p.exists(trials), "no trial ran");
    std::fs::write(p.path(weights), &original).unwrap();

    // The server launched at the trainer's context, not the profile's.
    let manifest = p.read("pipelines/swesmith-curation.toml");
    p.file(
        "pipelines/swesmith-curation.toml",
        &manifest.replace("--max-model-len 32768", "--max-model-len 65536"),
    );
    let long = cairn(&p, &["run", "canary"]);
    long.code_is(1);
    assert!(
        long.stderr().contains(
            "model-a: context length disagrees: server 65536, profile selection-32k 32768"
        ),
        "{}",
        long.stderr()
    );
    assert!(!p.exists(trials), "no trial ran");
    p.file("pipelines/swesmith-curation.toml", &manifest);

    // A trainer at 32K: the selection canary runs (its profile is its
    // own); training, whose profile is 64K, is refused before it starts.
    let trainer = p.read("configs/trainer.yaml");
    p.file(
        "configs/trainer.yaml",
        &trainer.replace("max_seq_len: 65536", "max_seq_len: 32768"),
    );
    let ok = cairn(&p, &["run", "canary"]);
    ok.success();
    let train = cairn(&p, &["run", "train"]);
    train.code_is(1);
    assert!(
        train
            .stdout()
            .contains("context length disagrees: agent 65536, server 65536, trainer 32768")
            || train
                .stderr()
                .contains("context length disagrees: agent 65536, server 65536, trainer 32768"),
        "{}",
        train.stderr()
    );
    p.file("configs/trainer.yaml", &trainer);
    let results = jsonl(&p, "state/swesmith-curation/canary.jsonl");
    let samples: usize = results
        .iter()
        .map(|r| r["requested"].as_u64().unwrap() as usize)
        .sum();
    let run_id = ok
        .stderr()
        .rsplit("(run ")
        .next()
        .and_then(|tail| tail.split(')').next())
        .unwrap()
        .to_owned();
    let log = p.read(&format!("cache/logs/{run_id}/services/model-server.log"));
    let asked = log.matches("POST /v1/chat/completions").count();
    assert!(
        asked >= samples,
        "each of the {samples} samples asked the server at least once, {asked} asks: {log}"
    );
    assert!(log.contains("model-a: served as model-a from "), "{log}");
    let answered: usize = log
        .matches("POST /v1/chat/completions HTTP/1.1\" 200")
        .count();
    let busy: usize = log
        .matches("POST /v1/chat/completions HTTP/1.1\" 503")
        .count();
    assert_eq!(answered + busy, asked, "{log}");
}

/// How often `needle` occurs in `haystack`.
fn occurrences(haystack: &str, needle: &str) -> usize {
    haystack.matches(needle).count()
}

#[test]
fn the_report_of_the_shipped_pipeline_opens_in_a_browser_and_counts_what_the_ledger_holds() {
    common::require_tool("chromium");
    let p = shipped();
    cairn(&p, &["run"]).success();
    let written = cairn(&p, &["report", "-o", "report.html"]);
    written.success();
    assert!(
        written.stderr().contains("run 1 of `swesmith-curation`"),
        "{}",
        written.stderr()
    );
    let page = p.path("report.html");
    let html = p.read("report.html");
    // Self-contained: nothing is fetched when it is viewed.
    for remote in ["src=\"http", "href=\"http", "url(http", "@import"] {
        assert!(!html.contains(remote), "the page loads `{remote}…`");
    }

    // A control: the browser's console is read, and a page that errs says so.
    let scratch = p.path("browser");
    p.file(
        "broken.html",
        "<html><body><script>console.error('seen'); missing();</script></body></html>",
    );
    let broken = common::browser::open(&scratch.join("control"), &p.path("broken.html"));
    assert!(
        broken
            .console
            .iter()
            .any(|l| l.contains("Uncaught ReferenceError")),
        "{:?}",
        broken.console
    );
    let opened = common::browser::open(&scratch.join("report"), &page);
    assert!(opened.console.is_empty(), "{:?}", opened.console);
    assert!(
        opened.dom.contains("data-script=\"ran\""),
        "the page's script did not run to its end"
    );

    // The DAG: one node per stage, each as `status --json` names it.
    let status = cairn(&p, &["status", "--json"]);
    let status: serde_json::Value = serde_json::from_str(&status.stdout()).unwrap();
    let stages = status["stages"].as_array().unwrap();
    assert_eq!(stages.len(), 22);
    assert_eq!(occurrences(&opened.dom, "<g class=\"node\""), stages.len());
    for stage in stages {
        let name = stage["stage"].as_str().unwrap();
        assert!(
            opened.dom.contains(&format!(
                "<g class=\"node\" data-stage=\"{name}\" data-state=\"ran\""
            )),
            "{name}"
        );
    }
    // The stages by state now: as `status --json` counts them.
    let fresh = stages.iter().filter(|s| s["state"] == "fresh").count();
    assert_eq!(fresh, 22);
    assert!(
        opened
            .dom
            .contains(&format!("data-status-count=\"fresh\">{fresh}<")),
        "no count of {fresh} fresh stages"
    );
    // The timeline: one bar per stage the run executed, as the ledger has it.
    let log = cairn(&p, &["log", "1", "--json"]);
    let log: serde_json::Value = serde_json::from_str(&log.stdout()).unwrap();
    let ran = log["stages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["state"] == "ran")
        .count();
    assert_eq!(ran, 22);
    assert_eq!(occurrences(&opened.dom, "<rect class=\"stage-bar\""), ran);
    assert!(
        opened
            .dom
            .contains(&format!("data-run-count=\"ran\">{ran}<"))
    );
    // One bar per item attempt of the run (all are drawn at this size).
    let attempts: usize = {
        let db = rusqlite::Connection::open(p.path("cache/ledger.db")).unwrap();
        db.query_row(
            "SELECT COUNT(*) FROM item_attempts WHERE run_id = 1 AND key != ''",
            [],
            |r| r.get::<_, i64>(0),
        )
        .unwrap() as usize
    };
    assert!(attempts > 100, "{attempts}");
    assert_eq!(
        occurrences(&opened.dom, "<rect class=\"item-bar\""),
        attempts
    );
    // pass@1 over all items, as `show canary` computes it.
    let canary = cairn(&p, &["show", "canary", "--json"]);
    let canary: serde_json::Value = serde_json::from_str(&canary.stdout()).unwrap();
    let pass1 = canary["samples"]["all"]["pass@1"].as_f64().unwrap();
    assert!(
        opened
            .dom
            .contains(&format!("<td class=\"num passk-value\">{pass1:.3}</td>")),
        "pass@1 {pass1:.3} not shown"
    );
    assert_eq!(occurrences(&opened.dom, "<rect class=\"rate\""), 2);
    // The release: every frozen item, every one of its files linked to
    // its chain, every chain there.
    let frozen: serde_json::Value =
        serde_json::from_str(&p.read("state/swesmith-curation/freeze/manifest.json")).unwrap();
    let items = frozen["items"].as_object().unwrap();
    assert_eq!(
        occurrences(&opened.dom, "<tr class=\"released\""),
        items.len()
    );
    assert_eq!(
        occurrences(&opened.dom, "<details class=\"chain\""),
        items.len()
    );
    let files: u64 = items.values().map(|i| i["files"].as_u64().unwrap()).sum();
    assert_eq!(occurrences(&opened.dom, "<a class=\"file\"") as u64, files);

    // It draws: a screenshot holds far more than one of a blank page.
    p.file("blank.html", "<html><body></body></html>");
    let (shot, blank) = (p.path("report.png"), p.path("blank.png"));
    common::browser::screenshot(&scratch.join("shot"), &page, 1280, 2000, &shot);
    common::browser::screenshot(
        &scratch.join("blank"),
        &p.path("blank.html"),
        1280,
        2000,
        &blank,
    );
    let (shot, blank) = (
        std::fs::metadata(&shot).unwrap().len(),
        std::fs::metadata(&blank).unwrap().len(),
    );
    assert!(
        shot > 10 * blank,
        "screenshot {shot} B, blank page {blank} B"
    );

    // The same data as JSON.
    let data = cairn(&p, &["report", "--json"]);
    let data: serde_json::Value = serde_json::from_str(&data.stdout()).unwrap();
    assert_eq!(data["format"], 1);
    assert_eq!(data["run"]["id"], 1);
    assert_eq!(data["stages"].as_array().unwrap().len(), 22);
    assert_eq!(data["attempts_total"], attempts);
    assert_eq!(
        data["releases"][0]["items"].as_array().unwrap().len(),
        items.len()
    );
}

/// The oracle decides under a stated budget: the budget is in every
/// verdict's fingerprint (a new budget decides every task again), and a
/// task whose test runs past it is `times-out`, a verdict recorded with the
/// budget it was made under. A frozen task's lineage reaches the static
/// check's and the oracle's verdicts on it, not only the step that made it.
#[test]
fn the_oracle_decides_under_its_budget_and_the_lineage_reaches_its_verdicts() {
    let p = shipped();
    cairn(&p, &["run"]).success();
    let lineage: serde_json::Value =
        serde_json::from_str(&p.read("state/swesmith-curation/lineage.json")).unwrap();
    let items = lineage["items"].as_object().unwrap();
    assert!(!items.is_empty());
    for (id, chain) in items {
        let steps: Vec<(&str, &str)> = chain
            .as_array()
            .unwrap()
            .iter()
            .map(|s| (s["stage"].as_str().unwrap(), s["key"].as_str().unwrap()))
            .collect();
        for stage in ["materialize", "static-filter", "oracle"] {
            assert!(steps.contains(&(stage, id.as_str())), "{id}: {steps:?}");
        }
        let oracle = chain
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["stage"] == "oracle")
            .unwrap();
        assert_eq!(oracle["outcome"], "ok", "{id}: {oracle}");
        assert_eq!(oracle["result"]["budget_seconds"], 120.0, "{id}: {oracle}");
    }

    let manifest = p.read("pipelines/swesmith-curation.toml");
    p.file(
        "pipelines/swesmith-curation.toml",
        &manifest.replace("oracle_budget = 120 ", "oracle_budget = 0.001 "),
    );
    let tight = cairn(&p, &["run", "oracle"]);
    tight.success();
    let decided = jsonl(&p, "state/swesmith-curation/oracle.jsonl");
    let run = tight
        .stderr()
        .rsplit("(run ")
        .next()
        .and_then(|tail| tail.split(')').next())
        .and_then(|n| n.parse::<i64>().ok())
        .unwrap();
    assert_eq!(
        items_run_in(&p, "oracle", run).len(),
        decided.len(),
        "a new budget decides every task again"
    );
    for line in &decided {
        assert_eq!(line["class"], "times-out", "{line}");
    }
}
