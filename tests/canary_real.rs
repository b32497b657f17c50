//! The canary of the shipped swesmith-real pipeline under its `ci` profile,
//! on the real frozen tasks: each sample a real run of the pinned
//! mini-swe-agent (installed offline from the stored wheels) in a checkout
//! of its task's bugged repository, against the scripted policy server,
//! each submitted patch graded by the task's FAIL_TO_PASS and PASS_TO_PASS
//! with pytest. Every outcome class occurs and is classified from the
//! trajectory; the report says only what the records say; a pinned list
//! that changed stops the canary before any trial.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use common::Project;
use serde_json::Value;

/// A key that must never be written anywhere but the agent's environment.
const KEY: &str = "sk-canary-test-7f3a9c2e51";

fn cairn(p: &Project, args: &[&str]) -> common::Run {
    let mut all = vec!["-f", "pipelines/swesmith-real.toml", "--profile", "ci"];
    all.extend_from_slice(args);
    let output = p
        .command(&all)
        .env("OPENAI_API_KEY", KEY)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run cairn");
    common::Run { output }
}

fn json(p: &Project, path: &str) -> Value {
    serde_json::from_str(&p.read(path)).unwrap()
}

/// Every sample of the merged results: (model, list, its line).
fn samples(p: &Project) -> Vec<(String, String, Value)> {
    p.lines("state/swesmith-real/canary.jsonl")
        .iter()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .flat_map(|line| {
            let model = line["item"]["model"].as_str().unwrap().to_owned();
            let list = line["item"]["list"].as_str().unwrap().to_owned();
            line["samples"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| (model.clone(), list.clone(), s.clone()))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Every file under `dir`, recursively.
fn files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files(&path));
        } else {
            found.push(path);
        }
    }
    found
}

#[test]
fn a_real_agent_on_real_tasks_every_outcome_classified_from_its_trajectory() {
    common::require_tool("python3");
    common::require_tool("git");
    let p = Project::new();
    common::copy_shipped_pipeline(&p, "swesmith-real");

    let out = cairn(&p, &["run"]);
    out.success();
    assert!(
        out.stderr()
            .contains("group `model-c.official-32k` of `canary` is harness-incompatible"),
        "{}",
        out.stderr()
    );

    let all = samples(&p);
    let ran: Vec<&(String, String, Value)> = all
        .iter()
        .filter(|(_, _, s)| s["class"] != "harness-incompatible")
        .collect();
    let trajectory = |s: &Value| s["result"]["trajectory"].clone();
    let status = |s: &Value| {
        trajectory(s)["exit_status"]
            .as_str()
            .unwrap_or("")
            .to_owned()
    };
    let with = |want: &dyn Fn(&Value) -> bool| ran.iter().filter(|(_, _, s)| want(s)).count();

    // Submitted, graded, resolved: ok.
    assert!(
        with(&|s| s["class"] == "ok" && status(s) == "Submitted" && s["result"]["reward"] == 1) > 0
    );
    // Submitted, graded, not resolved: a verdict.
    assert!(
        with(&|s| s["class"] == "failed"
            && status(s) == "Submitted"
            && s["result"]["graded"]["resolved"] == false)
            > 0
    );
    // Out of steps (the profile's 200, as the harness applied it): a verdict.
    assert!(
        with(&|s| s["class"] == "failed"
            && status(s) == "LimitsExceeded"
            && trajectory(s)["model_turns"] == 200)
            > 0
    );
    // The false pass: graded resolved, but no completion token in the
    // trajectory. An error, counted as a fail, never a pass.
    assert!(
        with(&|s| s["class"] == "error"
            && s["result"]["reward"] == 1
            && trajectory(s)["completion_tokens"] == 0
            && trajectory(s)["model_turns"].as_u64() > Some(0))
            > 0
    );
    // A 503: retried inside the sample, which then ended on its own terms.
    assert!(with(&|s| s["attempts"].as_u64() >= Some(2) && s["class"] != "infra") > 0);
    assert_eq!(
        with(&|s| s["class"] == "infra"),
        0,
        "no sample left on infrastructure"
    );
    // Every sample that ran says it ran mini-swe-agent 2.4.6 under 200 steps.
    for (_, _, s) in &ran {
        if status(s) == "RepeatedFormatError" {
            continue;
        }
        assert_eq!(trajectory(s)["harness_version"], "2.4.6", "{s}");
        assert_eq!(trajectory(s)["step_limit"], 200, "{s}");
    }
    // model-c answers in tool calls the text-based harness cannot read: its
    // smoke task's samples end in repeated format errors, its other tasks
    // are not run.
    let c: Vec<&Value> = all
        .iter()
        .filter(|(m, _, _)| m == "model-c")
        .map(|(_, _, s)| s)
        .collect();
    let c_ran: Vec<&&Value> = c
        .iter()
        .filter(|s| s["class"] != "harness-incompatible")
        .collect();
    assert_eq!(c_ran.len(), 4, "the smoke task's 4 samples");
    for s in &c_ran {
        assert_eq!(s["class"], "error");
        assert_eq!(status(s), "RepeatedFormatError");
        assert_eq!(trajectory(s)["model_turns"], 0);
    }
    assert!(c.len() > c_ran.len());

    // Grading is keyed by the patch's digest: a patch submitted twice for a
    // task is graded once.
    let mut graded: BTreeMap<(String, String), Vec<bool>> = BTreeMap::new();
    for (_, _, s) in &ran {
        if let Some(digest) = s["result"]["patch_sha256"].as_str() {
            graded
                .entry((
                    s["result"]["task"].as_str().unwrap().to_owned(),
                    digest.to_owned(),
                ))
                .or_default()
                .push(s["result"]["graded"]["reused"] == true);
        }
    }
    assert!(
        graded.values().any(|r| r.len() > 1),
        "some patch was submitted twice"
    );
    for (key, reused) in &graded {
        let fresh = reused.iter().filter(|r| !**r).count();
        assert!(fresh <= 1, "{key:?} graded {fresh} times");
    }

    // Every sample that ran keeps its trajectory, errors included; the key
    // reached the agent, and nothing written has it.
    let kept = files(&p.path("state/swesmith-real/canary/trajectories"));
    assert_eq!(kept.len(), ran.len(), "one trajectory per sample that ran");
    for dir in ["state", "cache"] {
        for file in files(&p.path(dir)) {
            let bytes = std::fs::read(&file).unwrap_or_default();
            assert!(
                !bytes.windows(KEY.len()).any(|w| w == KEY.as_bytes()),
                "the key is in {}",
                file.display()
            );
        }
    }

    // The report, from the records.
    let all_facts = json(&p, "state/swesmith-real/canary/report.json");
    assert_eq!(all_facts["label"], "internal-experiment");
    assert_eq!(all_facts["harness"]["pinned"], "2.4.6");
    assert_eq!(all_facts["harness"]["ran"], serde_json::json!(["2.4.6"]));
    let facts = &all_facts["profiles"]["official-32k"];
    assert_eq!(facts["profile"]["name"], "official-32k");
    assert_eq!(facts["profile"]["context"], 32768);
    assert_eq!(
        facts["profile"]["step_limit_applied"],
        serde_json::json!([200])
    );
    assert_eq!(
        facts["timeouts"]["wall_time_limit_seconds_applied"],
        serde_json::json!([1800.0])
    );
    assert_eq!(
        facts["timeouts"]["command_timeout_seconds_applied"],
        serde_json::json!([120.0])
    );
    let at_once = facts["concurrency"]["most_samples_at_once"]
        .as_u64()
        .unwrap();
    assert!((1..=2).contains(&at_once), "isolate.jobs = 2: {at_once}");
    let retried = ran
        .iter()
        .filter(|(_, _, s)| s["attempts"].as_u64() > Some(1))
        .count();
    assert_eq!(facts["retries"]["samples_retried"], retried);
    assert_eq!(facts["retries"]["verdict_retries"], 0);
    assert_eq!(facts["models"]["model-c"]["harness_incompatible"], true);
    for list in facts["models"]["model-c"]["lists"]
        .as_object()
        .unwrap()
        .values()
    {
        assert!(
            list["pass@1"].is_null() && list["pass@4"].is_null(),
            "{list}"
        );
    }
    for pair in facts["comparisons"].as_array().unwrap() {
        assert!(pair["a"] != "model-c" && pair["b"] != "model-c", "{pair}");
    }
    assert!(!facts["comparisons"].as_array().unwrap().is_empty());
    // Tokens are summed from the trajectories.
    let tokens: u64 = ran
        .iter()
        .filter(|(m, l, _)| m == "model-a" && l == "validation6")
        .map(|(_, _, s)| trajectory(s)["completion_tokens"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(
        facts["models"]["model-a"]["lists"]["validation6"]["completion_tokens"],
        tokens
    );
    let report = p.read("state/swesmith-real/canary/report.md");
    assert!(report.contains("| model-c | validation6 |"), "{report}");
    assert!(
        report.contains("harness-incompatible | harness-incompatible"),
        "{report}"
    );
    assert!(
        !report.contains("model-c − ") && !report.contains(" − model-c"),
        "{report}"
    );

    // A pass@k figure traced back: the trajectories, the lists and the
    // declared checkpoints, the registered freeze.
    let traced = cairn(
        &p,
        &[
            "provenance",
            "state/swesmith-real/canary/passk.json",
            "--json",
        ],
    );
    traced.success();
    let chain: Value = serde_json::from_str(&traced.stdout()).unwrap();
    let text = chain.to_string();
    for needle in [
        "state/swesmith-real/canary/trajectories",
        "pipelines/swesmith-real/canary/models.toml",
        "pipelines/swesmith-real/canary/lists",
        "state/swesmith-real/registered.json",
        "state/swesmith-real/freeze",
    ] {
        assert!(text.contains(needle), "provenance lacks {needle}");
    }

    // Nothing changed: nothing runs, no server starts.
    let again = cairn(&p, &["run"]);
    again.success();
    assert!(again.stderr().contains("0 ran"), "{}", again.stderr());

    // A second evaluation profile: its samples run on servers of their own
    // at its context; the first profile's samples are kept as they were;
    // no figure pools the two, no comparison pairs them.
    let merged = |p: &Project| -> Vec<Value> {
        p.lines("state/swesmith-real/canary.jsonl")
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let sample_key = |line: &Value, s: &Value| format!("{} {}", line["key"], s["sample"]);
    let before: BTreeMap<String, Value> = merged(&p)
        .iter()
        .flat_map(|line| {
            line["samples"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| (sample_key(line, s), s.clone()))
                .collect::<Vec<_>>()
        })
        .collect();
    let manifest = p.read("pipelines/swesmith-real.toml");
    p.file(
        "pipelines/swesmith-real.toml",
        &manifest.replace(
            "canary_profiles = \"official-32k\"",
            "canary_profiles = \"official-32k,hardened-64k\"",
        ),
    );
    let both = cairn(&p, &["run"]);
    both.success();
    assert!(
        both.stderr()
            .contains("group `model-c.hardened-64k` of `canary` is harness-incompatible"),
        "{}",
        both.stderr()
    );
    let lines = merged(&p);
    for line in &lines {
        let profile = line["item"]["profile"].as_str().unwrap();
        assert_eq!(line["protocol"], profile);
        for s in line["samples"].as_array().unwrap() {
            if profile == "official-32k" {
                assert_eq!(
                    before[&sample_key(line, s)],
                    *s,
                    "a sample of the first profile ran again"
                );
            } else if s["class"] != "harness-incompatible" {
                let trajectory = json(
                    &p,
                    &format!(
                        "state/swesmith-real/canary/trajectories/hardened-64k.{}.{}.{}.traj.json",
                        line["item"]["model"].as_str().unwrap(),
                        line["item"]["task"].as_str().unwrap(),
                        s["sample"]
                    ),
                );
                let system = trajectory["messages"][0]["content"].as_str().unwrap_or("");
                assert!(
                    system.contains("Never repeat a command"),
                    "the hardened prompt: {system}"
                );
            }
        }
    }
    assert!(lines.iter().any(|l| l["item"]["profile"] == "hardened-64k"));
    let passk = json(&p, "state/swesmith-real/canary/passk.json");
    for pooled in ["all", "splits", "comparisons"] {
        assert!(passk.get(pooled).is_none(), "pooled `{pooled}`: {passk}");
    }
    let protocols = passk["protocols"].as_object().unwrap();
    assert_eq!(protocols.len(), 2, "{passk}");
    let both_facts = json(&p, "state/swesmith-real/canary/report.json");
    assert_eq!(
        both_facts["profiles"]["hardened-64k"]["profile"]["context"],
        65536
    );
    assert_eq!(
        both_facts["profiles"]["official-32k"]["models"], facts["models"],
        "the first profile's figures are its own"
    );
    for name in ["official-32k", "hardened-64k"] {
        let section = &both_facts["profiles"][name];
        assert_eq!(section["models"]["model-c"]["harness_incompatible"], true);
        let tasks = section["models"]["model-a"]["lists"]["validation6"]["tasks"].clone();
        assert_eq!(tasks, 6, "{name}: its own tasks, not both profiles'");
        let pairs = section["comparisons"].as_array().unwrap();
        assert_eq!(pairs.len(), 1, "{name}: model-a vs model-b only");
        assert_eq!(pairs[0]["paired_items"], 8, "{name}: 8 tasks, not 16");
    }
    let report = p.read("state/swesmith-real/canary/report.md");
    assert!(
        report.contains("## Profile official-32k") && report.contains("## Profile hardened-64k"),
        "{report}"
    );

    // A pinned list edited: the canary stops before any trial.
    let list = "pipelines/swesmith-real/canary/lists/validation6.txt";
    let pinned = p.read(list);
    let first_line = pinned.lines().next().unwrap().to_owned();
    p.file(list, &pinned.replace(&format!("{first_line}\n"), ""));
    let changed = cairn(&p, &["run"]);
    changed.code_is(1);
    assert!(
        changed.stderr().contains("but the manifest pins")
            && changed.stderr().contains("the list changed"),
        "{}",
        changed.stderr()
    );
    assert!(
        changed.stderr().contains("skipped  canary "),
        "{}",
        changed.stderr()
    );
    let tasks: BTreeSet<String> = samples(&p)
        .iter()
        .map(|(_, _, s)| s["result"]["task"].as_str().unwrap_or("").to_owned())
        .collect();
    assert!(tasks.contains(&first_line), "the earlier results stand");
}
