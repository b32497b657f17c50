//! Sampled per-item stages: each (item, sample) a unit of its own, pass@k
//! and group labels from the outcomes, re-draws recorded.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::Project;

/// `n` items (`t00`…), each passing its first `passes` samples (item `i`
/// passes `i % 9` of them); every draw appends `ITEM SAMPLE SEED` to
/// `draws.log`.
fn sampled(n: usize, samples: &str) -> Project {
    let p = Project::new();
    let items: String = (0..n)
        .map(|i| {
            let split = if i % 3 == 0 { "validation" } else { "train" };
            format!(
                "{{\"id\": \"t{i:02}\", \"passes\": {}, \"split\": \"{split}\"}}\n",
                i % 9
            )
        })
        .collect();
    p.file("items.jsonl", &items);
    let summary = if samples.contains("summary") {
        ", passk = \"state/passk.json\""
    } else {
        ""
    };
    p.file(
        "cairn.toml",
        &format!(
            r#"[pipeline]
name = "sampled"

[stages.canary]
foreach = {{ items = "items.jsonl", key = "id" }}
samples = {samples}
run = '''
echo "$CAIRN_ITEM $CAIRN_SAMPLE $CAIRN_SEED" >> draws.log
mkdir -p state/rollouts/{{item.id}}
if [ "$CAIRN_SAMPLE" -lt {{item.passes}} ]; then reward=1; else reward=0; fi
echo "{{\"reward\": $reward}}" > state/rollouts/{{item.id}}/{{sample.index}}.json
'''
item_result = "state/rollouts/{{item.id}}/{{sample.index}}.json"
classify = [{{ result = "/reward", equals = 0, as = "failed" }}]
outputs = {{ results = "state/canary.jsonl"{summary} }}
"#
        ),
    );
    p
}

fn draws(p: &Project) -> Vec<(String, u32, u64)> {
    if !p.exists("draws.log") {
        return Vec::new();
    }
    p.lines("draws.log")
        .iter()
        .map(|line| {
            let mut parts = line.split(' ');
            let item = parts.next().unwrap().to_owned();
            let sample = parts.next().unwrap().parse().unwrap();
            let seed = parts.next().unwrap().parse().unwrap();
            (item, sample, seed)
        })
        .collect()
}

fn summary(p: &Project) -> serde_json::Value {
    serde_json::from_str(&p.read("state/passk.json")).unwrap()
}

fn merged(p: &Project) -> Vec<serde_json::Value> {
    p.lines("state/canary.jsonl")
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// C(n, k), exactly.
fn choose(n: u64, k: u64) -> u128 {
    if k > n {
        return 0;
    }
    (0..k).fold(1u128, |c, i| c * u128::from(n - i) / u128::from(i + 1))
}

/// pass@k by its definition: 1 − C(n−c, k) / C(n, k).
fn pass_at(n: u64, c: u64, k: u64) -> f64 {
    1.0 - choose(n - c, k) as f64 / choose(n, k) as f64
}

#[test]
fn thirty_items_of_eight_samples_are_240_units_and_raising_k_draws_only_the_new_ones() {
    let p = sampled(30, "{ k = 8, seed = 100, summary = \"passk\" }");
    p.cairn(&["run", "-j", "4"]).success();
    let first = draws(&p);
    assert_eq!(first.len(), 240);
    let units: BTreeSet<(String, u32)> = first.iter().map(|(i, s, _)| (i.clone(), *s)).collect();
    assert_eq!(units.len(), 240, "each (item, sample) drawn once");
    assert!(units.iter().all(|(_, s)| *s < 8));
    for (item, sample, seed) in &first {
        assert_eq!(*seed, 100 + u64::from(*sample), "{item}#{sample}");
    }
    assert_eq!(summary(&p)["all"]["requested"], 240);

    // Unchanged: nothing is drawn.
    p.cairn(&["run"]).success();
    assert_eq!(draws(&p).len(), 240);

    // k = 10: only samples 8 and 9 of each item are new.
    let manifest = p.read("cairn.toml").replace("k = 8", "k = 10");
    p.file("cairn.toml", &manifest);
    p.cairn(&["run", "-j", "4"]).success();
    let all = draws(&p);
    assert_eq!(all.len(), 300, "60 more");
    let new: BTreeSet<u32> = all[240..].iter().map(|(_, s, _)| *s).collect();
    assert_eq!(new, BTreeSet::from([8, 9]));
    assert_eq!(summary(&p)["all"]["requested"], 300);

    // k = 4: the recorded samples are kept; nothing is drawn.
    let manifest = p.read("cairn.toml").replace("k = 10", "k = 4");
    p.file("cairn.toml", &manifest);
    p.cairn(&["run"]).success();
    assert_eq!(draws(&p).len(), 300);
    assert_eq!(summary(&p)["all"]["requested"], 120);
    // ...and back to 10: still nothing, every sample is on record.
    let manifest = p.read("cairn.toml").replace("k = 4", "k = 10");
    p.file("cairn.toml", &manifest);
    p.cairn(&["run"]).success();
    assert_eq!(draws(&p).len(), 300);
}

#[test]
fn pass_at_k_and_group_labels_follow_from_the_outcomes() {
    let p = sampled(
        12,
        "{ k = 8, seed = 0, pass_at = [1, 2, 8], split = \"split\", summary = \"passk\" }",
    );
    p.cairn(&["run", "-j", "4"]).success();
    let lines = merged(&p);
    assert_eq!(lines.len(), 12, "one line per item");
    let mut expected_split: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut groups: BTreeMap<String, u64> = BTreeMap::new();
    for (i, line) in lines.iter().enumerate() {
        let c = (i % 9) as u64;
        assert_eq!(line["key"], format!("t{i:02}"));
        assert_eq!(line["passed"], c, "{line}");
        assert_eq!(line["requested"], 8);
        assert_eq!(line["samples"].as_array().unwrap().len(), 8);
        for k in [1, 2, 8] {
            let got = line[format!("pass@{k}")].as_f64().unwrap();
            assert!((got - pass_at(8, c.min(8), k)).abs() < 1e-12, "{line}");
        }
        let group = match c {
            0 => "all-0",
            8 => "all-1",
            _ => "mixed",
        };
        assert_eq!(line["group"], group);
        *groups.entry(group.to_owned()).or_default() += 1;
        let split = if i % 3 == 0 { "validation" } else { "train" };
        assert_eq!(line["split"], split);
        expected_split
            .entry(split)
            .or_default()
            .push(pass_at(8, c.min(8), 1));
    }
    let report = summary(&p);
    assert_eq!(report["all"]["items"], 12);
    assert_eq!(report["all"]["groups"], serde_json::json!(groups));
    for (split, rates) in expected_split {
        let mean = rates.iter().sum::<f64>() / rates.len() as f64;
        let got = report["splits"][split]["pass@1"].as_f64().unwrap();
        assert!((got - mean).abs() < 1e-12, "{split}: {got} vs {mean}");
        assert_eq!(report["splits"][split]["items"], rates.len());
    }
}

#[test]
fn errors_stay_in_the_denominator_unless_excluded_and_the_report_says_which() {
    for (errors, denominator) in [("fail", 8), ("exclude", 6)] {
        let p = sampled(
            1,
            &format!("{{ k = 8, errors = \"{errors}\", summary = \"passk\" }}"),
        );
        // t00 passes none of its samples by the rule; make samples 0 to 2
        // pass and samples 6 and 7 end in error.
        let manifest = p
            .read("cairn.toml")
            .replace("-lt {item.passes}", "-lt 3")
            .replace(
                "mkdir -p state/rollouts",
                "if [ \"$CAIRN_SAMPLE\" -ge 6 ]; then exit 1; fi\nmkdir -p state/rollouts",
            )
            .replace("[stages.canary]\n", "[stages.canary]\nallow_errors = 2\n");
        p.file("cairn.toml", &manifest);
        p.cairn(&["run"]).success();
        let line = &merged(&p)[0];
        assert_eq!(line["requested"], 8);
        assert_eq!(line["valid"], 6);
        assert_eq!(line["error"], 2);
        assert_eq!(line["passed"], 3);
        let got = line["pass@1"].as_f64().unwrap();
        assert!(
            (got - 3.0 / denominator as f64).abs() < 1e-12,
            "{errors}: {line}"
        );
        let report = summary(&p);
        assert_eq!(report["samples"]["errors"], errors);
        let said = report["denominator"].as_str().unwrap();
        assert!(
            said.contains(if errors == "fail" {
                "requested"
            } else {
                "valid"
            }),
            "{said}"
        );
    }
}

#[test]
fn a_resample_draws_exactly_what_it_names_with_a_new_seed() {
    let p = sampled(3, "{ k = 4, seed = 7 }");
    p.cairn(&["run"]).success();
    assert_eq!(draws(&p).len(), 12);

    p.cairn(&["resample", "canary/t01#2"]).success();
    p.cairn(&["run"]).success();
    let after = draws(&p);
    assert_eq!(after.len(), 13, "one sample drawn anew");
    let (item, sample, seed) = &after[12];
    assert_eq!((item.as_str(), *sample), ("t01", 2));
    assert_ne!(*seed, 7 + 2, "a re-draw is drawn with a seed of its own");
    // Recorded: a later run draws nothing more.
    p.cairn(&["run"]).success();
    assert_eq!(draws(&p).len(), 13);

    // Every sample of one item, then of the stage.
    p.cairn(&["resample", "canary/t00"]).success();
    p.cairn(&["run"]).success();
    assert_eq!(draws(&p).len(), 17);
    p.cairn(&["resample", "canary"]).success();
    p.cairn(&["run"]).success();
    assert_eq!(draws(&p).len(), 29);

    for (target, message) in [
        ("canary/t9", "has no item `t9`"),
        ("canary/t01#4", "numbered 0 to 3"),
        ("nothing", "no stage named `nothing`"),
    ] {
        let out = p.cairn(&["resample", target]);
        out.code_is(2);
        assert!(out.stderr().contains(message), "{target}: {}", out.stderr());
    }
    assert_eq!(draws(&p).len(), 29, "a refused resample records nothing");
}

#[test]
fn an_infra_failure_is_retried_inside_its_sample_never_its_verdict() {
    let p = sampled(1, "{ k = 2 }");
    let manifest = p
        .read("cairn.toml")
        .replace(
            "mkdir -p state/rollouts",
            "if [ \"$CAIRN_SAMPLE\" = 1 ] && [ ! -f flaked ]; then touch flaked; exit 75; fi\nmkdir -p state/rollouts",
        )
        .replace(
            "classify = [",
            "retry = { max = 2, on = [\"infra\"] }\nclassify = [{ exit = 75, as = \"infra\" }, ",
        );
    p.file("cairn.toml", &manifest);
    p.cairn(&["run"]).success();
    let draws = draws(&p);
    assert_eq!(draws.len(), 3, "sample 1 attempted twice");
    let line = &merged(&p)[0];
    assert_eq!(line["requested"], 2);
    assert_eq!(line["infra"], 0);
    assert_eq!(line["valid"], 2, "{line}");
    let attempts = p.cairn(&["show", "canary/t00#1", "--json"]);
    attempts.success();
    let shown: serde_json::Value = serde_json::from_str(&attempts.stdout()).unwrap();
    let classes: Vec<&str> = shown
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["class"].as_str().unwrap())
        .collect();
    assert_eq!(classes, ["infra", "failed"], "{shown}");
    // The item is its samples: every attempt of each.
    let item = p.cairn(&["show", "canary/t00"]);
    item.success();
    assert!(
        item.stdout()
            .contains("item canary/t00: 3 attempt(s) over its 2 samples"),
        "{}",
        item.stdout()
    );
}

#[test]
fn kill_9_mid_sampling_loses_no_finished_sample() {
    let p = sampled(4, "{ k = 4 }");
    // Sample t03#3 waits for `release`; the other 15 finish.
    let manifest = p.read("cairn.toml").replace(
        "mkdir -p state/rollouts",
        "if [ \"$CAIRN_ITEM\" = t03 ] && [ \"$CAIRN_SAMPLE\" = 3 ]; then while [ ! -f release ]; do sleep 0.02; done; fi\nmkdir -p state/rollouts",
    );
    p.file("cairn.toml", &manifest);
    let mut cairn = p
        .command(&["run", "-j", "2"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = p.cairn(&["status", "--json"]);
        let json: serde_json::Value = serde_json::from_str(&status.stdout()).unwrap_or_default();
        let items = &json["stages"][0]["items"];
        let ended =
            items["ok"].as_u64().unwrap_or(0) + items["verdicts"]["failed"].as_u64().unwrap_or(0);
        if ended == 15 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "finished samples were not recorded: {json}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    cairn.kill().unwrap(); // SIGKILL
    cairn.wait().unwrap();

    p.file("release", "");
    p.cairn(&["run"]).success();
    let draws = draws(&p);
    let mut count: BTreeMap<(String, u32), usize> = BTreeMap::new();
    for (item, sample, _) in draws {
        *count.entry((item, sample)).or_default() += 1;
    }
    assert_eq!(count.len(), 16);
    for ((item, sample), n) in count {
        let expected = if (item.as_str(), sample) == ("t03", 3) {
            2
        } else {
            1
        };
        assert_eq!(n, expected, "{item}#{sample}");
    }
    assert_eq!(merged(&p).len(), 4);
}

#[test]
fn a_sampled_stage_is_checked_where_it_is_written() {
    let cases = [
        (
            "{ k = 4 }",
            "state/rollouts/{item.id}.json",
            "would be one path for every sample",
        ),
        ("{ k = 4, pass_at = [1, 8] }", "", "pass@8 of 4 samples"),
        ("{ seed = 1 }", "", "`samples` without `k`"),
        (
            "{ k = 0 }",
            "",
            "`samples.k` must be an integer of at least 1",
        ),
        (
            "{ k = 2, errors = \"ignore\" }",
            "",
            "`samples.errors` is `ignore`",
        ),
        (
            "{ k = 2, summary = \"nope\" }",
            "",
            "names `nope`, which is not an output",
        ),
    ];
    for (samples, result, message) in cases {
        let p = sampled(2, samples);
        if !result.is_empty() {
            let manifest = p.read("cairn.toml").replace(
                "item_result = \"state/rollouts/{item.id}/{sample.index}.json\"",
                &format!("item_result = \"{result}\""),
            );
            p.file("cairn.toml", &manifest);
        }
        let out = p.cairn(&["status"]);
        out.code_is(2);
        assert!(
            out.stderr().contains(message),
            "{samples}: {}",
            out.stderr()
        );
        assert!(
            out.stderr().contains("cairn.toml:"),
            "located: {}",
            out.stderr()
        );
    }

    // `{sample.…}` outside a sampled stage.
    let p = Project::new();
    p.file("items.jsonl", "{\"id\": \"a\"}\n");
    p.file(
        "cairn.toml",
        "[pipeline]\nname = \"x\"\n[stages.s]\nforeach = { items = \"items.jsonl\", key = \"id\" }\nrun = \"echo {sample.index}\"\noutputs = { r = \"state/r.jsonl\" }\n",
    );
    let out = p.cairn(&["status"]);
    out.code_is(2);
    assert!(
        out.stderr().contains("outside a sampled stage"),
        "{}",
        out.stderr()
    );
}

#[test]
fn a_gate_bounds_the_share_of_mixed_train_groups_and_groups_writes_the_train_list() {
    let p = sampled(12, "{ k = 8, split = \"split\" }");
    // Train items are t01, t02, t04, t05, t07, t08, t10, t11, passing
    // 1, 2, 4, 5, 7, 8, 1, 2 of 8: all mixed but t08 (all-1), 7 of 8.
    let downstream = |min: f64| {
        format!(
            r#"
[stages.mixed-gate]
uses = "gate"
inputs = {{ canary = "state/canary.jsonl" }}
outputs = {{ report = "state/gate.json" }}
with.checks = [
  {{ input = "canary", where = [{{ field = "split", equals = "train" }}], share = {{ where = [{{ field = "group", equals = "mixed" }}], min = {min} }} }},
]

[stages.train-list]
uses = "groups"
inputs = {{ samples = "state/canary.jsonl" }}
needs = ["mixed-gate"]
outputs = {{ keep = "state/train.jsonl", resample = "state/resample.jsonl", report = "state/groups.json" }}
with.where = [{{ field = "split", equals = "train" }}]
"#
        )
    };
    let base = p.read("cairn.toml");
    p.file("cairn.toml", &(base.clone() + &downstream(0.9)));
    let out = p.cairn(&["run"]);
    out.code_is(1);
    assert!(
        out.stderr().contains(
            "`group = mixed` holds for 7 of 8 records (87.5 %), expected at least 90.0 %"
        ),
        "{}",
        out.stderr()
    );
    assert!(
        !p.exists("state/train.jsonl"),
        "nothing after a failed gate"
    );

    p.file("cairn.toml", &(base + &downstream(0.8)));
    p.cairn(&["run"]).success();
    let kept: Vec<String> = p
        .lines("state/train.jsonl")
        .iter()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(kept, ["t01", "t02", "t04", "t05", "t07", "t10", "t11"]);
    assert_eq!(p.read("state/resample.jsonl"), "");
    let report: serde_json::Value = serde_json::from_str(&p.read("state/groups.json")).unwrap();
    assert_eq!(
        report["groups"],
        serde_json::json!({"all-1": 1, "mixed": 7})
    );
    assert_eq!(draws(&p).len(), 96, "the canary ran once");
}

#[test]
fn a_model_whose_smoke_items_fail_is_isolated_while_the_other_models_canary_completes() {
    let p = Project::new();
    let mut items = String::new();
    for model in ["good", "broken", "flaky"] {
        for task in 0..4 {
            let smoke = task == 0;
            items.push_str(&format!(
                "{{\"id\": \"{model}-t{task}\", \"model\": \"{model}\", \"smoke\": {smoke}}}\n"
            ));
        }
    }
    p.file("trials.jsonl", &items);
    p.file(
        "cairn.toml",
        r#"[pipeline]
name = "isolated"

[stages.canary]
foreach = { items = "trials.jsonl", key = "id" }
isolate = { by = "model", smoke = "smoke" }
samples = { k = 2 }
run = 'echo "$CAIRN_ITEM $CAIRN_SAMPLE" >> trials.log; if [ {item.model} = broken ] || [ "$CAIRN_ITEM.$CAIRN_SAMPLE" = flaky-t0.0 ]; then echo "chat template not found" >&2; exit 1; fi'
allow_errors = 1
outputs = { results = "state/canary.jsonl" }
"#,
    );
    let out = p.cairn(&["run"]);
    out.success();
    assert!(
        out.stderr().contains("group `broken` of `canary` is harness-incompatible: smoke item `broken-t0` never completed (it ended in error); 3 (6 samples) of its items were not run, the other groups went on"),
        "{}",
        out.stderr()
    );
    let ran: BTreeSet<String> = p.lines("trials.log").into_iter().collect();
    let expected: BTreeSet<String> = ["good", "flaky"]
        .iter()
        .flat_map(|m| (0..4).flat_map(move |t| (0..2).map(move |s| format!("{m}-t{t} {s}"))))
        .chain(["broken-t0 0".to_owned(), "broken-t0 1".to_owned()])
        .collect();
    assert_eq!(
        ran, expected,
        "every trial of the models whose smoke item completed once, and only the broken model's smoke item"
    );
    assert!(!out.stderr().contains("group `flaky`"), "{}", out.stderr());
    let lines = merged(&p);
    let line = |key: &str| lines.iter().find(|l| l["key"] == key).unwrap().clone();
    assert_eq!(line("good-t3")["passed"], 2);
    assert_eq!(
        line("broken-t0")["error"],
        2,
        "the smoke item's own outcome is kept"
    );
    let skipped = line("broken-t2");
    let classes: Vec<&str> = skipped["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["class"].as_str().unwrap())
        .collect();
    assert_eq!(classes, ["harness-incompatible", "harness-incompatible"]);
    // Not drawn, so neither valid nor a fail.
    assert_eq!(skipped["valid"], 0);
    assert_eq!(skipped["marked"], 2);
    assert_eq!(line("flaky-t0")["error"], 1);
    // Nothing is recorded for what did not run.
    let shown = p.cairn(&["show", "canary/broken-t2#0", "--json"]);
    let attempts: serde_json::Value = serde_json::from_str(&shown.stdout()).unwrap_or_default();
    assert_eq!(
        attempts.as_array().map_or(0, Vec::len),
        0,
        "{}",
        shown.stdout()
    );
}

#[test]
fn an_unchanged_task_list_rewritten_in_another_order_draws_nothing() {
    let p = sampled(6, "{ k = 3 }");
    p.cairn(&["run"]).success();
    let before = p.read("state/canary.jsonl");
    let mut lines = p.lines("items.jsonl");
    lines.reverse();
    p.file("items.jsonl", &(lines.join("\n") + "\n"));
    let out = p.cairn(&["run"]);
    out.success();
    assert!(out.stderr().contains("0 ran, 1 fresh"), "{}", out.stderr());
    assert_eq!(draws(&p).len(), 18);
    assert_eq!(p.read("state/canary.jsonl"), before);
}

#[test]
fn two_models_on_the_same_tasks_are_compared_pairwise() {
    let p = Project::new();
    let mut items = String::new();
    for (model, passing) in [("a", 8), ("b", 3)] {
        for task in 0..10 {
            items.push_str(&format!(
                "{{\"id\": \"{model}-t{task}\", \"model\": \"{model}\", \"task\": \"t{task}\", \"pass\": {}}}\n",
                task < passing
            ));
        }
    }
    p.file("trials.jsonl", &items);
    p.file(
        "cairn.toml",
        r#"[pipeline]
name = "compared"

[stages.canary]
foreach = { items = "trials.jsonl", key = "id" }
samples = { k = 1, summary = "passk", compare = { by = "model", on = "task" } }
run = '{item.pass}'
classify = [{ exit = 1, as = "failed" }]
outputs = { results = "state/canary.jsonl", passk = "state/passk.json" }
"#,
    );
    p.cairn(&["run"]).success();
    let report = summary(&p);
    let pair = &report["comparisons"][0];
    assert_eq!(pair["a"], "a");
    assert_eq!(pair["b"], "b");
    assert_eq!(pair["paired_items"], 10);
    assert_eq!(pair["pass_rate_a"], 0.8);
    assert_eq!(pair["pass_rate_b"], 0.3);
    let difference = pair["difference"].as_f64().unwrap();
    assert!((difference - 0.5).abs() < 1e-12, "{pair}");
    let (low, high) = (
        pair["interval95"][0].as_f64().unwrap(),
        pair["interval95"][1].as_f64().unwrap(),
    );
    assert!(
        low > 0.0 && low < 0.5 && (0.5..=1.0).contains(&high),
        "{pair}"
    );
    // Tasks 3 to 7: a passes, b fails; none the other way round.
    assert_eq!(pair["mcnemar"]["a_only"], 5);
    assert_eq!(pair["mcnemar"]["b_only"], 0);
    let p_value = pair["mcnemar"]["p"].as_f64().unwrap();
    assert!((p_value - 2.0 / 32.0).abs() < 1e-12, "{pair}");

    // `show` says the same, from the ledger.
    let shown = p.cairn(&["show", "canary"]);
    shown.success();
    let text = shown.stdout();
    assert!(
        text.contains("20 items, 20 requested, 20 valid, 0 error, pass@1 0.550"),
        "{text}"
    );
    assert!(
        text.contains("a vs b      +0.500 pass rate (95 % "),
        "{text}"
    );
    assert!(
        text.contains("over 10 paired items; McNemar p = 0.0625"),
        "{text}"
    );
    let json = p.cairn(&["show", "canary", "--json"]);
    let json: serde_json::Value = serde_json::from_str(&json.stdout()).unwrap();
    assert_eq!(json["samples"]["comparisons"][0], *pair);
}

#[test]
fn force_names_an_item_or_one_sample_of_a_sampled_stage() {
    let p = sampled(3, "{ k = 3 }");
    p.cairn(&["run"]).success();
    assert_eq!(draws(&p).len(), 9);
    p.cairn(&["run", "--force", "canary/t01"]).success();
    let after: Vec<(String, u32)> = draws(&p)[9..]
        .iter()
        .map(|(i, s, _)| (i.clone(), *s))
        .collect();
    assert_eq!(after.len(), 3, "every sample of t01: {after:?}");
    assert!(after.iter().all(|(i, _)| i == "t01"));
    p.cairn(&["run", "--force", "canary/t02#1"]).success();
    let last: Vec<(String, u32)> = draws(&p)[12..]
        .iter()
        .map(|(i, s, _)| (i.clone(), *s))
        .collect();
    assert_eq!(last, [("t02".to_owned(), 1)]);
    for (target, message) in [
        ("canary/t02#3", "draws 3 samples, numbered 0 to 2"),
        ("canary/t9", "has no item `t9`"),
    ] {
        let out = p.cairn(&["run", "--force", target]);
        out.code_is(2);
        assert!(out.stderr().contains(message), "{target}: {}", out.stderr());
    }
}

#[test]
fn what_a_stage_accepts_of_its_items_enters_its_fingerprint_not_theirs() {
    let p = sampled(4, "{ k = 2, summary = \"passk\" }");
    let manifest = p
        .read("cairn.toml")
        .replace(
            "mkdir -p state/rollouts",
            "if [ $CAIRN_ITEM = t01 ] && [ $CAIRN_SAMPLE = 0 ]; then exit 1; fi\nmkdir -p state/rollouts",
        )
        .replace("[stages.canary]\n", "[stages.canary]\nallow_errors = 1\n");
    p.file("cairn.toml", &manifest);
    p.cairn(&["run"]).success();
    assert_eq!(draws(&p).len(), 8);
    // No error allowed now: the stage is decided anew, and fails, with no
    // sample drawn.
    p.file(
        "cairn.toml",
        &manifest.replace("allow_errors = 1", "allow_errors = 0"),
    );
    let out = p.cairn(&["run"]);
    out.code_is(1);
    assert!(
        out.stderr().contains("1 item(s) ended in error, 0 allowed"),
        "{}",
        out.stderr()
    );
    // A sample in error counts as a fail: it is kept as it ended, never
    // drawn again unless asked.
    assert_eq!(draws(&p).len(), 8, "a sample in error is not drawn again");
    assert!(
        out.stderr()
            .contains("`cairn run --only error canary` draws the samples in error again"),
        "{}",
        out.stderr()
    );
    let again = p.cairn(&["run", "--only", "error", "canary"]);
    again.code_is(1);
    assert_eq!(
        draws(&p).len(),
        9,
        "asked: only the sample in error is drawn again"
    );
    // A comparison added: the summary is written anew, nothing drawn.
    let compared = manifest.replace(
        "summary = \"passk\" }",
        "summary = \"passk\", compare = { by = \"split\", on = \"passes\" } }",
    );
    p.file("cairn.toml", &compared);
    p.cairn(&["run"]).success();
    assert_eq!(draws(&p).len(), 9);
    assert!(summary(&p)["comparisons"].is_array(), "{}", summary(&p));
    p.cairn(&["run"]).success();
    assert_eq!(draws(&p).len(), 9);
}

#[test]
fn a_stage_whose_every_group_is_marked_fails() {
    let p = Project::new();
    p.file(
        "trials.jsonl",
        "{\"id\": \"a-t0\", \"model\": \"a\", \"smoke\": true}\n{\"id\": \"a-t1\", \"model\": \"a\"}\n{\"id\": \"b-t0\", \"model\": \"b\", \"smoke\": true}\n",
    );
    p.file(
        "cairn.toml",
        "[pipeline]\nname = \"x\"\n[stages.canary]\nforeach = { items = \"trials.jsonl\", key = \"id\" }\nisolate = { by = \"model\" }\nrun = \"exit 1\"\noutputs = { results = \"state/canary.jsonl\" }\n",
    );
    let out = p.cairn(&["run"]);
    out.code_is(1);
    assert!(
        out.stderr().contains("every group is harness-incompatible"),
        "{}",
        out.stderr()
    );
    assert!(
        out.stderr().contains("no group went on"),
        "{}",
        out.stderr()
    );
}

#[test]
fn an_item_key_with_a_hash_is_refused_in_a_sampled_stage() {
    let p = sampled(1, "{ k = 2 }");
    p.file(
        "items.jsonl",
        "{\"id\": \"a#1\", \"passes\": 0, \"split\": \"x\"}\n",
    );
    let out = p.cairn(&["run"]);
    assert_ne!(out.code(), 0);
    assert!(
        out.stderr().contains("has a `#` in its key"),
        "{}",
        out.stderr()
    );
    assert!(draws(&p).is_empty());
}

/// `one_at_a_time`: each model's trials run only after the previous
/// model's ended (smoke first within each), and `jobs` caps how many of one
/// model's trials run at once, below the run's `-j`. The count of trials
/// running is kept under `flock`, so the peak is exact.
#[test]
fn models_run_one_at_a_time_with_a_cap_on_each_models_trials() {
    common::require_tool("flock");
    let p = Project::new();
    let mut items = String::new();
    for model in ["m1", "m2", "m3"] {
        for task in 0..6 {
            let smoke = task == 0;
            items.push_str(&format!(
                "{{\"id\": \"{model}-t{task}\", \"model\": \"{model}\", \"smoke\": {smoke}}}\n"
            ));
        }
    }
    p.file("trials.jsonl", &items);
    p.file("count", "0\n");
    p.file(
        "cairn.toml",
        r#"[pipeline]
name = "one-at-a-time"

[stages.canary]
foreach = { items = "trials.jsonl", key = "id" }
isolate = { by = "model", smoke = "smoke", one_at_a_time = true, jobs = 2 }
samples = { k = 2 }
run = '''flock lock sh -c 'n=$(($(cat count) + 1)); echo $n > count; echo "start {item.model} {item.smoke} $n" >> events.log'; sleep 0.1; flock lock sh -c 'echo $(($(cat count) - 1)) > count; echo "end {item.model}" >> events.log' '''
outputs = { results = "state/canary.jsonl" }
"#,
    );
    p.cairn(&["run", "-j", "6"]).success();
    let events = p.lines("events.log");
    assert_eq!(events.len(), 2 * 3 * 6 * 2, "{events:?}");
    let mut running: std::collections::BTreeMap<String, usize> = Default::default();
    let mut finished: BTreeSet<String> = BTreeSet::new();
    let mut current: Option<String> = None;
    let mut smoke_pending = 0;
    let mut peak = 0;
    for event in &events {
        let words: Vec<&str> = event.split_whitespace().collect();
        let model = words[1].to_owned();
        match words[0] {
            "start" => {
                assert!(
                    !finished.contains(&model),
                    "{model} started again after another model: {events:?}"
                );
                if current.as_deref() != Some(&model) {
                    assert!(
                        running.values().all(|&n| n == 0),
                        "{model} started while another model's trials ran: {events:?}"
                    );
                    if let Some(previous) = current.replace(model.clone()) {
                        finished.insert(previous);
                    }
                    smoke_pending = 2;
                }
                let smoke = words[2] == "true";
                assert!(
                    smoke || smoke_pending == 0,
                    "{model}: a trial started before its smoke samples ended: {events:?}"
                );
                *running.entry(model.clone()).or_default() += 1;
                peak = peak.max(running[&model]);
            }
            _ => {
                *running.get_mut(&model).unwrap() -= 1;
                if smoke_pending > 0 {
                    smoke_pending -= 1;
                }
            }
        }
    }
    assert_eq!(finished.len(), 2, "three models in turn: {events:?}");
    assert!(peak <= 2, "at most 2 trials of a model at once, saw {peak}");
}

/// Two models on the same tasks under two evaluation protocols (each
/// item names its profile, whose file is the item's input): every figure
/// and every comparison is made per protocol, none over both, and editing
/// one protocol's profile draws only its samples again.
#[test]
fn results_of_two_protocols_are_never_pooled_or_compared() {
    let p = Project::new();
    let mut items = String::new();
    // (profile, model, tasks passed of 10)
    for (profile, model, passing) in [
        ("official-32k", "a", 8),
        ("official-32k", "b", 3),
        ("hardened-64k", "a", 2),
        ("hardened-64k", "b", 9),
    ] {
        for task in 0..10 {
            items.push_str(&format!(
                "{{\"id\": \"{profile}.{model}-t{task}\", \"profile\": \"{profile}\", \"model\": \"{model}\", \"task\": \"t{task}\", \"pass\": {}}}\n",
                task < passing
            ));
        }
    }
    p.file("trials.jsonl", &items);
    p.file("profiles/official-32k.txt", "step_limit 200\n");
    p.file("profiles/hardened-64k.txt", "step_limit 200\n");
    p.file(
        "cairn.toml",
        r#"[pipeline]
name = "protocols"

[stages.canary]
foreach = { items = "trials.jsonl", key = "id" }
item_inputs = ["profiles/{item.profile}.txt"]
samples = { k = 1, summary = "passk", protocol = "profile", compare = { by = "model", on = "task" } }
run = 'echo "$CAIRN_ITEM" >> draws.log; {item.pass}'
classify = [{ exit = 1, as = "failed" }]
outputs = { results = "state/canary.jsonl", passk = "state/passk.json" }
"#,
    );
    p.cairn(&["run"]).success();
    let report = summary(&p);
    for pooled in ["all", "splits", "comparisons"] {
        assert!(
            report.get(pooled).is_none(),
            "a pooled `{pooled}`: {report}"
        );
    }
    assert_eq!(report["protocol_by"], "profile");
    let protocols = report["protocols"].as_object().unwrap();
    assert_eq!(
        protocols.keys().collect::<Vec<_>>(),
        ["hardened-64k", "official-32k"]
    );
    for (name, rate_a, rate_b) in [("official-32k", 0.8, 0.3), ("hardened-64k", 0.2, 0.9)] {
        let section = &protocols[name];
        assert_eq!(section["all"]["items"], 20, "{name}: {section}");
        let pairs = section["comparisons"].as_array().unwrap();
        assert_eq!(pairs.len(), 1, "{name}: {section}");
        assert_eq!(pairs[0]["paired_items"], 10, "{name}: only its own tasks");
        assert_eq!(pairs[0]["pass_rate_a"], rate_a, "{name}");
        assert_eq!(pairs[0]["pass_rate_b"], rate_b, "{name}");
    }
    for line in merged(&p) {
        assert_eq!(line["protocol"], line["item"]["profile"], "{line}");
    }
    let shown = p.cairn(&["show", "canary"]).stdout();
    assert!(
        shown.contains("profile = official-32k (figures of this protocol alone)")
            && shown.contains("profile = hardened-64k (figures of this protocol alone)"),
        "{shown}"
    );

    // One protocol's profile edited: only its 20 samples are drawn again.
    std::fs::remove_file(p.path("draws.log")).unwrap();
    p.file("profiles/hardened-64k.txt", "step_limit 250\n");
    p.cairn(&["run"]).success();
    let drawn = p.lines("draws.log");
    assert_eq!(drawn.len(), 20, "{drawn:?}");
    assert!(
        drawn.iter().all(|d| d.starts_with("hardened-64k.")),
        "{drawn:?}"
    );
}
