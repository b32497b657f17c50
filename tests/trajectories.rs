//! `item_trajectory`: cairn reads the agent trajectory each attempt writes,
//! records what it says with the result, and never takes an empty one for
//! a pass, whatever the grader said; a sample in error is kept as it ended
//! with its trajectory, and raising k draws only the new samples.

mod common;

use common::Project;

/// What each kind of sample writes: its trajectory (mini-swe-agent's
/// format), its grade (`reward`, always 1: the grader would pass every
/// one), or nothing.
const WRITE: &str = r#"
import json, os, sys
kind, trajectory, result = sys.argv[1:]
attempt = int(os.environ["CAIRN_ATTEMPT"])
with open("draws.log", "a") as f:
    f.write(f"{os.environ['CAIRN_ITEM']} {os.environ['CAIRN_SAMPLE']} {attempt}\n")
if kind == "busy" and attempt == 1:
    sys.exit(75)
def turn(tokens):
    message = {"role": "assistant", "content": "```bash\nls\n```"}
    if tokens is not None:
        message["extra"] = {"response": {"usage": {"completion_tokens": tokens, "prompt_tokens": 40}}}
    return message
turns = {"full": [turn(5), turn(5)], "busy": [turn(3)], "silent": [turn(0), turn(0)],
         "mute": [], "uncounted": [turn(None)], "steps": [turn(4)] * 3}
status = "LimitsExceeded" if kind == "steps" else "Submitted"
os.makedirs(os.path.dirname(result), exist_ok=True)
with open(result, "w") as f:
    json.dump({"reward": 0 if kind == "steps" else 1}, f)
if kind != "missing":
    os.makedirs(os.path.dirname(trajectory), exist_ok=True)
    with open(trajectory, "w") as f:
        json.dump({"trajectory_format": "mini-swe-agent-1.1",
                   "info": {"exit_status": status, "mini_version": "2.4.6",
                            "model_stats": {"api_calls": len(turns[kind])},
                            "config": {"agent": {"step_limit": 7}}},
                   "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
                               + turns[kind]}, f)
"#;

const KINDS: &[&str] = &[
    "full",
    "busy",
    "silent",
    "mute",
    "uncounted",
    "missing",
    "steps",
];

fn canary(k: u32, retries: u32) -> Project {
    let p = Project::new();
    p.file("write.py", WRITE);
    let items: String = KINDS
        .iter()
        .map(|kind| format!("{{\"id\": \"{kind}\"}}\n"))
        .collect();
    p.file("items.jsonl", &items);
    p.file(
        "cairn.toml",
        &format!(
            r#"[pipeline]
name = "trajectories"

[stages.canary]
foreach = {{ items = "items.jsonl", key = "id" }}
samples = {{ k = {k}, summary = "passk" }}
run = "python3 {{in.tool}} {{item.id}} {{out.trajectories}}/{{item.id}}.{{sample.index}}.json state/grades/{{item.id}}.{{sample.index}}.json"
inputs = {{ tool = "write.py" }}
item_outputs = {{ trajectories = "{{item.id}}.{{sample.index}}.json" }}
item_result = "state/grades/{{item.id}}.{{sample.index}}.json"
item_trajectory = "state/trajectories/{{item.id}}.{{sample.index}}.json"
checks = [{{ result = "/trajectory/exit_status", equals = "Submitted" }}]
classify = [
  {{ exit = 75, as = "infra" }},
  {{ result = "/trajectory/exit_status", equals = "LimitsExceeded", as = "failed" }},
  {{ result = "/reward", equals = 0, as = "failed" }},
]
retry = {{ max = {retries}, on = ["infra"] }}
allow_errors = 100
outputs = {{ results = "state/canary.jsonl", passk = "state/passk.json", trajectories = "state/trajectories" }}
"#
        ),
    );
    p
}

fn merged(p: &Project) -> Vec<serde_json::Value> {
    p.lines("state/canary.jsonl")
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn sample(p: &Project, item: &str, index: u64) -> serde_json::Value {
    merged(p)
        .into_iter()
        .find(|l| l["key"] == item)
        .unwrap_or_else(|| panic!("no line for {item}"))["samples"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["sample"] == index)
        .unwrap()
        .clone()
}

/// The rule the last attempt of `unit` was classified by.
fn rule_of(p: &Project, unit: &str) -> String {
    let out = p.cairn(&["show", &format!("canary/{unit}"), "--json"]);
    out.success();
    let attempts: serde_json::Value = serde_json::from_str(&out.stdout()).unwrap();
    let last = attempts.as_array().unwrap().last().unwrap().clone();
    last["rule"].as_str().unwrap_or_default().to_owned()
}

fn draws(p: &Project) -> Vec<String> {
    p.lines("draws.log")
}

#[test]
fn an_empty_trajectory_is_an_error_even_when_the_grader_passes_it() {
    common::require_tool("python3");
    let p = canary(1, 1);
    p.cairn(&["run"]).success();

    assert_eq!(sample(&p, "full", 0)["class"], "ok");
    let full = &sample(&p, "full", 0)["result"];
    assert_eq!(full["reward"], 1, "the command's own result is kept");
    let read = &full["trajectory"];
    assert_eq!(read["model_turns"], 2, "{read}");
    assert_eq!(read["completion_tokens"], 10);
    assert_eq!(read["prompt_tokens"], 80);
    assert_eq!(read["step_limit"], 7);
    assert_eq!(read["exit_status"], "Submitted");
    assert_eq!(read["harness_version"], "2.4.6");

    // Graded a pass, every one: the trajectory says no model answered.
    for (kind, why) in [
        (
            "silent",
            "its trajectory holds 0 completion tokens over 2 model turns",
        ),
        ("mute", "its trajectory has no model turn"),
        (
            "uncounted",
            "reports no token counts for any of its 1 model turns",
        ),
        (
            "missing",
            "item trajectory `state/trajectories/missing.0.json` was not written",
        ),
    ] {
        assert_eq!(sample(&p, kind, 0)["class"], "error", "{kind}");
        let rule = rule_of(&p, &format!("{kind}#0"));
        assert!(rule.contains(why), "{kind}: {rule}");
    }
    assert!(rule_of(&p, "silent#0").contains("an empty trajectory is never a pass"));
    // Out of steps: a verdict, as the trajectory says.
    assert_eq!(sample(&p, "steps", 0)["class"], "failed");
    // A server error: retried inside the sample, never a verdict.
    assert_eq!(sample(&p, "busy", 0)["class"], "ok");
    assert_eq!(sample(&p, "busy", 0)["attempts"], 2);
    assert_eq!(sample(&p, "full", 0)["attempts"], 1);

    // The errors count as fails: 7 requested, 3 valid, 2 passed.
    let summary: serde_json::Value = serde_json::from_str(&p.read("state/passk.json")).unwrap();
    assert_eq!(summary["all"]["requested"], 7, "{summary}");
    assert_eq!(summary["all"]["valid"], 3, "{summary}");
    assert_eq!(summary["all"]["error"], 4, "{summary}");
    assert_eq!(summary["all"]["passed"], 2, "{summary}");
}

#[test]
fn a_sample_in_error_is_kept_with_its_trajectory_and_raising_k_draws_only_new_samples() {
    common::require_tool("python3");
    let p = canary(2, 1);
    p.cairn(&["run"]).success();
    let first = draws(&p).len();
    // 7 kinds × 2 samples, and busy's two first attempts.
    assert_eq!(first, 16, "{:?}", draws(&p));
    assert!(
        p.exists("state/trajectories/silent.0.json"),
        "an error keeps its trajectory"
    );

    // Nothing changed: nothing is drawn, errors included.
    p.cairn(&["run"]).success();
    assert_eq!(draws(&p).len(), first);

    // k = 3: only each item's third sample is drawn; what the earlier
    // samples wrote, errors included, is restored from the store.
    std::fs::remove_dir_all(p.path("state/trajectories")).unwrap();
    p.file(
        "cairn.toml",
        &p.read("cairn.toml").replace("k = 2", "k = 3"),
    );
    p.cairn(&["run"]).success();
    let new: Vec<String> = draws(&p)[first..].to_vec();
    assert!(
        new.iter().all(|d| d.split(' ').nth(1) == Some("2")),
        "only sample 2 is new: {new:?}"
    );
    assert_eq!(new.len(), 8, "{new:?}");
    for kind in ["full", "silent", "uncounted", "steps"] {
        assert!(
            p.exists(&format!("state/trajectories/{kind}.0.json")),
            "{kind}'s first trajectory restored"
        );
    }

    // Asked, the samples in error are drawn again, and only they.
    let before = draws(&p).len();
    p.cairn(&["run", "--only", "error", "canary"]).success();
    let again: std::collections::BTreeSet<String> = draws(&p)[before..]
        .iter()
        .map(|d| d.split(' ').next().unwrap().to_owned())
        .collect();
    assert_eq!(
        again,
        ["missing", "mute", "silent", "uncounted"]
            .map(str::to_owned)
            .into()
    );
}

#[test]
fn with_no_retries_a_server_error_is_one_attempt_and_never_a_verdict() {
    common::require_tool("python3");
    let p = canary(1, 0);
    let out = p.cairn(&["run"]);
    out.code_is(1);
    assert!(
        out.stderr().contains("still failing on infrastructure"),
        "{}",
        out.stderr()
    );
    let shown = p.cairn(&["show", "canary/busy#0", "--json"]);
    let attempts: serde_json::Value = serde_json::from_str(&shown.stdout()).unwrap();
    let attempts = attempts.as_array().unwrap();
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    assert_eq!(attempts[0]["class"], "infra");
}

#[test]
fn a_sampled_trajectory_must_name_its_sample() {
    let p = canary(2, 1);
    p.file(
        "cairn.toml",
        &p.read("cairn.toml").replace(
            "item_trajectory = \"state/trajectories/{item.id}.{sample.index}.json\"",
            "item_trajectory = \"state/trajectories/{item.id}.json\"",
        ),
    );
    let out = p.cairn(&["run"]);
    out.code_is(2);
    assert!(
        out.stderr().contains(
            "item_trajectory `state/trajectories/{item.id}.json` would be one path for every sample"
        ),
        "{}",
        out.stderr()
    );
}
