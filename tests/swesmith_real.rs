//! The shipped swesmith-real pipeline under its `ci` profile, from a copy of
//! the repository's files, against the real package index: real packages
//! fetched by their pins, real bugs from the `swesmith` package, tasks
//! graded test by test. Adding a repository validates only its tasks, and
//! a handful of frozen tasks are graded again here, independently: their
//! FAIL_TO_PASS tests fail on the bugged tree and pass on the gold tree.
//! (Up to the bundle: the canary on the freeze is tests/canary_real.rs.)

mod common;

use std::path::Path;
use std::process::Command;

use common::Project;

fn cairn(p: &Project, args: &[&str]) -> common::Run {
    let mut all = vec!["-f", "pipelines/swesmith-real.toml", "--profile", "ci"];
    all.extend_from_slice(args);
    p.cairn(&all)
}

/// The keys of a per-item stage's items that ran in run `run`.
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

fn json(p: &Project, path: &str) -> serde_json::Value {
    serde_json::from_str(&p.read(path)).unwrap()
}

#[test]
fn real_tasks_are_generated_and_graded_and_a_new_repository_validates_only_its_own() {
    common::require_tool("python3");
    common::require_tool("git");
    let p = Project::new();
    let manifest = common::copy_shipped_pipeline(&p, "swesmith-real");
    let four = "repos = \"toolz,cachetools,parse,inflection\"";
    assert!(manifest.contains(four), "the ci profile's repositories");
    // The first version has stage A's repositories only.
    let b_quota = "stage_b = 6";
    assert!(manifest.contains(b_quota), "the ci profile's stage B quota");
    p.file(
        "pipelines/swesmith-real.toml",
        &manifest
            .replace(four, "repos = \"toolz,cachetools,parse\"")
            .replace(b_quota, "stage_b = 0"),
    );

    let first = cairn(&p, &["run", "export"]);
    first.success();

    // A fourth repository, in stage B: only its items are fetched,
    // generated, filtered and validated.
    p.file("pipelines/swesmith-real.toml", &manifest);
    let second = cairn(&p, &["run", "export"]);
    second.success();
    assert_eq!(items_run_in(&p, "fetch", 2), ["inflection"]);
    assert_eq!(items_run_in(&p, "baseline", 2), ["inflection"]);
    let generated = items_run_in(&p, "generate", 2);
    assert!(!generated.is_empty());
    assert!(
        generated.iter().all(|k| k.starts_with("inflection:")),
        "{generated:?}"
    );
    // (A task that could not be graded, `error`, is tried again whenever
    // its stage runs: those of the other repositories may run again.)
    let ungradable = |stage: &str| -> Vec<String> {
        let out = cairn(&p, &["show", stage, "--items", "--json"]);
        let records: serde_json::Value = serde_json::from_str(&out.stdout()).unwrap();
        records
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["class"] == "error")
            .map(|r| r["key"].as_str().unwrap().to_owned())
            .collect()
    };
    for stage in ["static-filter", "validate"] {
        let ran = items_run_in(&p, stage, 2);
        let errors = ungradable(stage);
        let new: Vec<&String> = ran
            .iter()
            .filter(|k| k.starts_with("jpvanhal__inflection."))
            .collect();
        assert!(!new.is_empty(), "{stage}");
        let others: Vec<&String> = ran
            .iter()
            .filter(|k| !k.starts_with("jpvanhal__inflection.") && !errors.contains(k))
            .collect();
        assert!(others.is_empty(), "{stage}: graded again: {others:?}");
    }

    // The freeze: at least 20 real tasks over the four repositories.
    let freeze = "state/swesmith-real/freeze";
    let frozen = json(&p, &format!("{freeze}/manifest.json"));
    assert!(frozen["total"].as_u64().unwrap() >= 20, "{frozen}");
    let ids: Vec<String> = frozen["splits"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|ids| ids.as_array().unwrap().iter())
        .map(|id| id.as_str().unwrap().to_owned())
        .collect();
    let repos: std::collections::BTreeSet<String> = ids
        .iter()
        .map(|id| {
            json(&p, &format!("{freeze}/items/{id}/task.json"))["repo"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(repos.len(), 4, "{repos:?}");

    // Each stage's quota, from its own stage; the older freeze's tasks all
    // kept, each in the split it had.
    let selected: Vec<serde_json::Value> = p
        .read("state/swesmith-real/resolve/selected.jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let in_stage = |stage: &str| selected.iter().filter(|r| r["stage"] == stage).count();
    assert_eq!((in_stage("A"), in_stage("B")), (18, 6));
    let old: Vec<serde_json::Value> = p
        .read("pipelines/swesmith-real/old-freeze.jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(!old.is_empty());
    for task in &old {
        let id = task["id"].as_str().unwrap();
        let split = task["split"].as_str().unwrap();
        let frozen_in = frozen["splits"][split].as_array().unwrap();
        assert!(
            frozen_in.iter().any(|f| f == id),
            "{id} is not in `{split}`"
        );
    }

    // A frozen task traced to the item: its validation, its static check,
    // its bug's generation (the modifier) and its repository's pin.
    let id = &ids[0];
    let traced = cairn(
        &p,
        &[
            "provenance",
            &format!("{freeze}/items/{id}/task.json"),
            "--json",
        ],
    );
    traced.success();
    let chain: serde_json::Value = serde_json::from_str(&traced.stdout()).unwrap();
    let step = |stage: &str| -> serde_json::Value {
        chain["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["stage"] == stage)
            .unwrap_or_else(|| panic!("no `{stage}` item in {chain}"))
            .clone()
    };
    let task = json(&p, &format!("{freeze}/items/{id}/task.json"));
    assert_eq!(step("validate")["key"], id.as_str());
    assert_eq!(step("validate")["class"], "ok");
    assert_eq!(step("static-filter")["key"], id.as_str());
    assert_eq!(step("generate")["fields"]["modifier"], task["modifier"]);
    assert_eq!(step("fetch")["fields"]["sha256"], task["pin"]["sha256"]);
    assert_eq!(step("baseline")["class"], "ok");

    // Nothing left to do.
    let again = cairn(&p, &["run", "export"]);
    again.success();
    assert!(
        again.stderr().contains("0 ran, 17 fresh"),
        "{}",
        again.stderr()
    );

    // Graded again, independently, on one task of each repository.
    let python = std::fs::read_dir(p.path("state/swesmith-real/venvs"))
        .unwrap()
        .flatten()
        .find(|e| e.file_name().to_string_lossy().starts_with("test-") && e.path().is_dir())
        .expect("the test venv")
        .path()
        .join("bin/python");
    let repos_file: Vec<serde_json::Value> = p
        .read("pipelines/swesmith-real/repos.jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut checked = std::collections::BTreeSet::new();
    for id in &ids {
        let task = json(&p, &format!("{freeze}/items/{id}/task.json"));
        let project = task["pin"]["project"].as_str().unwrap();
        if !checked.insert(project.to_owned()) {
            continue;
        }
        let pinned = repos_file.iter().find(|r| r["project"] == project).unwrap();
        let key = pinned["key"].as_str().unwrap();
        let f2p: Vec<&str> = task["FAIL_TO_PASS"]
            .as_array()
            .unwrap()
            .iter()
            .take(3)
            .map(|t| t.as_str().unwrap())
            .collect();
        assert!(!f2p.is_empty(), "{id}");
        let work = tempfile::tempdir().unwrap();
        let tree = work.path().join("tree");
        common::copy_tree(
            &p.path(&format!("state/swesmith-real/repos/{key}")),
            &tree,
            &["__pycache__"],
        );
        let pytest = |tree: &Path| {
            Command::new(&python)
                .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
                .args(&f2p)
                .current_dir(tree)
                .env(
                    "PYTHONPATH",
                    tree.join(pinned["pythonpath"].as_str().unwrap()),
                )
                .env("PYTHONDONTWRITEBYTECODE", "1")
                .output()
                .unwrap()
        };
        let gold = pytest(&tree);
        assert!(
            gold.status.success(),
            "{id}: FAIL_TO_PASS fails on the gold tree: {}",
            String::from_utf8_lossy(&gold.stdout)
        );
        let applied = Command::new("git")
            .args(["apply"])
            .arg(p.path(&format!("{freeze}/items/{id}/bug.diff")))
            .current_dir(&tree)
            .status()
            .unwrap();
        assert!(applied.success());
        let bugged = pytest(&tree);
        let out = String::from_utf8_lossy(&bugged.stdout);
        assert_eq!(bugged.status.code(), Some(1), "{id}: {out}");
        assert!(
            out.contains(&format!("{} failed", f2p.len())),
            "{id}: every FAIL_TO_PASS test fails on the bugged tree: {out}"
        );
    }
    assert_eq!(checked.len(), 4);
}
