//! `[resources]`: stages that hold one resource never overlap beyond its
//! capacity.

mod common;

use common::Project;

/// Two independent stages that each record when they start and end.
fn window_pipeline(resources: &str) -> Project {
    let p = Project::new();
    let stage = |name: &str| {
        format!(
            "[stages.{name}]\nrun = \"date +%s%N >> times/{name}; sleep 0.4; date +%s%N >> times/{name}; echo {name} > {{out.o}}\"\noutputs = {{ o = \"state/{name}.txt\" }}\n{resources}\n"
        )
    };
    let mut manifest =
        String::from("[pipeline]\nname = \"windows\"\n\n[resources]\ncluster-window = 1\n\n");
    manifest.push_str(&stage("oracle"));
    manifest.push_str(&stage("canary"));
    p.file("cairn.toml", &manifest);
    std::fs::create_dir_all(p.path("times")).unwrap();
    p
}

fn interval(p: &Project, name: &str) -> (u128, u128) {
    let times: Vec<u128> = p
        .lines(&format!("times/{name}"))
        .iter()
        .map(|t| t.parse().unwrap())
        .collect();
    assert_eq!(times.len(), 2, "{name}: {times:?}");
    (times[0], times[1])
}

fn overlap(a: (u128, u128), b: (u128, u128)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

#[test]
fn stages_sharing_a_capacity_one_resource_never_overlap() {
    let p = window_pipeline("resources = [\"cluster-window\"]");
    p.cairn(&["run", "-j", "2"]).success();
    let (oracle, canary) = (interval(&p, "oracle"), interval(&p, "canary"));
    assert!(
        !overlap(oracle, canary),
        "oracle {oracle:?} and canary {canary:?} overlapped"
    );
}

/// The control: without the resource the same stages do run side by side,
/// so the test above can fail.
#[test]
fn without_the_resource_the_same_stages_overlap() {
    let p = window_pipeline("");
    p.cairn(&["run", "-j", "2"]).success();
    assert!(overlap(interval(&p, "oracle"), interval(&p, "canary")));
}

#[test]
fn a_fresh_stage_does_not_wait_for_its_resource() {
    let p = window_pipeline("resources = [\"cluster-window\"]");
    p.cairn(&["run"]).success();
    let second = p.cairn(&["run"]);
    second.success();
    assert!(
        second.stderr().contains("0 ran, 2 fresh"),
        "{}",
        second.stderr()
    );
}

/// Every item of a per-item stage holds the stage's resources, so an oracle
/// and a canary sharing one window never run at the same moment, and a
/// stage's `jobs` caps its own items.
#[test]
fn items_hold_the_window_and_jobs_caps_a_stage() {
    let p = Project::new();
    let list: String = (1..=4).map(|i| format!("{{\"id\": \"i{i}\"}}\n")).collect();
    p.file("list.jsonl", &list);
    std::fs::create_dir_all(p.path("times")).unwrap();
    let stage = |name: &str, extra: &str| {
        format!(
            "[stages.{name}]\nforeach = {{ items = \"list.jsonl\", key = \"id\" }}\nrun = \"date +%s%N >> times/{name}-{{item.id}}; sleep 0.1; date +%s%N >> times/{name}-{{item.id}}\"\noutputs = {{ r = \"state/{name}.jsonl\" }}\n{extra}\n"
        )
    };
    let manifest = String::from("[pipeline]\nname = \"w\"\n\n[resources]\ncluster-window = 1\n\n")
        + &stage("oracle", "resources = [\"cluster-window\"]")
        + &stage("canary", "resources = [\"cluster-window\"]")
        + &stage("free", "jobs = 1");
    p.file("cairn.toml", &manifest);
    p.cairn(&["run", "-j", "4"]).success();

    let mut windowed = Vec::new();
    let mut free = Vec::new();
    for name in ["oracle", "canary", "free"] {
        for i in 1..=4 {
            let span = interval(&p, &format!("{name}-i{i}"));
            if name == "free" {
                free.push(span)
            } else {
                windowed.push(span)
            }
        }
    }
    for (a, x) in windowed.iter().enumerate() {
        for y in &windowed[a + 1..] {
            assert!(
                !overlap(*x, *y),
                "two window holders overlapped: {x:?} {y:?}"
            );
        }
    }
    for (a, x) in free.iter().enumerate() {
        for y in &free[a + 1..] {
            assert!(!overlap(*x, *y), "`jobs = 1` items overlapped: {x:?} {y:?}");
        }
    }
}

/// A resource held per stage: a per-item stage takes one unit for as long
/// as its items run, so its own items run side by side, while another stage
/// holding the same window never overlaps it.
#[test]
fn a_stage_held_window_lets_items_run_together_but_never_beside_another_stage() {
    let p = Project::new();
    let list: String = (1..=4).map(|i| format!("{{\"id\": \"i{i}\"}}\n")).collect();
    p.file("list.jsonl", &list);
    std::fs::create_dir_all(p.path("times")).unwrap();
    let stage = |name: &str| {
        format!(
            "[stages.{name}]\nforeach = {{ items = \"list.jsonl\", key = \"id\" }}\nrun = \"date +%s%N >> times/{name}-{{item.id}}; sleep 0.3; date +%s%N >> times/{name}-{{item.id}}\"\noutputs = {{ r = \"state/{name}.jsonl\" }}\nresources = [\"cluster-window\"]\n"
        )
    };
    let manifest = String::from(
        "[pipeline]\nname = \"w\"\n\n[resources]\ncluster-window = { capacity = 1, hold = \"stage\" }\n\n",
    ) + &stage("oracle")
        + &stage("canary");
    p.file("cairn.toml", &manifest);
    p.cairn(&["run", "-j", "4"]).success();

    let spans = |name: &str| -> Vec<(u128, u128)> {
        (1..=4)
            .map(|i| interval(&p, &format!("{name}-i{i}")))
            .collect()
    };
    let (oracle, canary) = (spans("oracle"), spans("canary"));
    for x in &oracle {
        for y in &canary {
            assert!(
                !overlap(*x, *y),
                "oracle and canary overlapped: {x:?} {y:?}"
            );
        }
    }
    // Items of one stage ran side by side (4 × 0.3 s with 4 job slots).
    let together = |spans: &[(u128, u128)]| {
        spans
            .iter()
            .enumerate()
            .any(|(a, x)| spans[a + 1..].iter().any(|y| overlap(*x, *y)))
    };
    assert!(
        together(&oracle),
        "oracle items ran one at a time: {oracle:?}"
    );
    assert!(
        together(&canary),
        "canary items ran one at a time: {canary:?}"
    );
}
