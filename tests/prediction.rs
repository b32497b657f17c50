//! `status` and `run -n` predict exactly what `run` then does: over random
//! edit sequences on a small real project, every stage `status` calls
//! fresh, restorable, failing or bound to run does exactly that in the
//! `run` that follows, and a per-item stage runs exactly the items `status`
//! lists as unfinished.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::Project;
use proptest::prelude::*;

/// `a` (fails on `input 2`) → `b` (a directory of three files) → `per` (one item per line of
/// `data/items.jsonl`, each reading its own file inside `b`) → `c` (reads
/// `per`'s merged output and one file inside `b`). Commands append to
/// `runs.log`.
fn manifest(param: u8) -> String {
    format!(
        r#"
[pipeline]
name = "predicted"

[params]
p = {param}

[stages.a]
run = "echo a >> runs.log; if grep -q 'input 2' {{in.x}}; then exit 1; fi; cat {{in.x}} > {{out.o}}"
inputs = {{ x = "data/in.txt" }}
outputs = {{ o = "state/a.txt" }}

[stages.b]
run = "echo b >> runs.log; mkdir -p {{out.d}}; for i in 1 2 3; do (cat {{in.a}}; echo $i {{params.p}}) > {{out.d}}/$i.txt; done"
params = ["p"]
inputs = {{ a = "state/a.txt" }}
outputs = {{ d = "state/b" }}

[stages.per]
needs = ["b"]
foreach = {{ items = "data/items.jsonl", key = "id" }}
item_inputs = ["state/b/{{item.id}}.txt"]
item_outputs = {{ entries = "{{item.id}}" }}
run = "echo per:{{item.id}} >> runs.log; mkdir -p {{out.entries}}; cat state/b/{{item.id}}.txt > {{out.entries}}/{{item.id}}"
outputs = {{ results = "state/per.jsonl", entries = "state/entries" }}

[stages.c]
run = "echo c >> runs.log; cat {{in.r}} {{in.f}} > {{out.o}}"
inputs = {{ r = "state/per.jsonl", f = "state/b/1.txt" }}
outputs = {{ o = "state/c.txt" }}
"#
    )
}

fn items(mask: u8) -> String {
    (1..=3)
        .filter(|i| mask & (1 << (i - 1)) != 0)
        .map(|i| format!("{{\"id\": \"{i}\"}}\n"))
        .collect()
}

#[derive(Debug, Clone)]
enum Edit {
    Input(u8),
    DeleteInput,
    TouchInput,
    DeleteOutput(&'static str),
    AppendToOutput(&'static str),
    TouchOutput(&'static str),
    /// Flips a byte of the stored copy of this workspace file (in
    /// `cache/objects/`, or inside the ledger for a small file).
    DamageStored(&'static str),
    Param(u8),
    Items(u8),
}

const OUTPUTS: &[&str] = &[
    "state/a.txt",
    "state/b",
    "state/b/2.txt",
    "state/per.jsonl",
    "state/entries",
    "state/entries/2",
    "state/c.txt",
];
const FILES: &[&str] = &[
    "state/a.txt",
    "state/b/1.txt",
    "state/b/3.txt",
    "state/entries/1",
    "state/c.txt",
];

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (0u8..3).prop_map(Edit::Input),
        Just(Edit::DeleteInput),
        Just(Edit::TouchInput),
        prop::sample::select(OUTPUTS).prop_map(Edit::DeleteOutput),
        prop::sample::select(FILES).prop_map(Edit::AppendToOutput),
        prop::sample::select(FILES).prop_map(Edit::TouchOutput),
        prop::sample::select(FILES).prop_map(Edit::DamageStored),
        (0u8..2).prop_map(Edit::Param),
        (1u8..8).prop_map(Edit::Items),
    ]
}

fn apply(p: &Project, edit: &Edit) {
    match edit {
        Edit::Input(v) => {
            p.file("data/in.txt", &format!("input {v}\n"));
        }
        Edit::DeleteInput => {
            let _ = std::fs::remove_file(p.path("data/in.txt"));
        }
        Edit::TouchInput => {
            if let Ok(bytes) = std::fs::read(p.path("data/in.txt")) {
                std::fs::write(p.path("data/in.txt"), bytes).unwrap();
            }
        }
        Edit::DeleteOutput(path) => {
            let path = p.path(path);
            if path.is_dir() {
                std::fs::remove_dir_all(path).unwrap();
            } else {
                let _ = std::fs::remove_file(path);
            }
        }
        Edit::AppendToOutput(path) => {
            if p.exists(path) {
                let text = p.read(path);
                p.file(path, &format!("{text}edited\n"));
            }
        }
        Edit::TouchOutput(path) => {
            if let Ok(bytes) = std::fs::read(p.path(path)) {
                std::fs::write(p.path(path), bytes).unwrap();
            }
        }
        Edit::DamageStored(path) => damage_stored(p, path),
        Edit::Param(v) => {
            p.file("cairn.toml", &manifest(*v));
        }
        Edit::Items(mask) => {
            p.file("data/items.jsonl", &items(*mask));
        }
    }
}

fn damage_stored(p: &Project, path: &str) {
    let Ok(bytes) = std::fs::read(p.path(path)) else {
        return;
    };
    let digest = blake3::hash(&bytes);
    let hex = digest.to_hex().to_string();
    let object = p.path("cache/objects").join(&hex[..2]).join(&hex[2..]);
    if let Ok(mut stored) = std::fs::read(&object) {
        stored[0] ^= 0x01;
        std::fs::write(&object, stored).unwrap();
        return;
    }
    let db = rusqlite::Connection::open(p.path("cache/ledger.db")).unwrap();
    let key = &digest.as_bytes()[..];
    let stored: Option<Vec<u8>> = db
        .query_row(
            "SELECT bytes FROM objects WHERE digest = ?1",
            [key],
            |row| row.get(0),
        )
        .ok();
    if let Some(mut stored) = stored {
        stored[0] ^= 0x01;
        db.execute(
            "UPDATE objects SET bytes = ?1 WHERE digest = ?2",
            rusqlite::params![stored, key],
        )
        .unwrap();
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Outcome {
    Ran,
    Restored,
    Fresh,
    Failed,
    /// Behind an upstream stage that will run: runs unless early cutoff
    /// stops it (or the upstream stage fails).
    Maybe,
}

/// Per stage: what `status --json` predicts, and the items it lists as
/// unfinished (per-item stages).
fn predicted(
    p: &Project,
) -> (
    BTreeMap<String, Outcome>,
    BTreeMap<String, BTreeSet<String>>,
) {
    let status = p.cairn(&["status", "--json"]);
    let json: serde_json::Value = serde_json::from_str(&status.stdout())
        .unwrap_or_else(|e| panic!("status --json: {e}\n{}", status.stderr()));
    let mut stages = BTreeMap::new();
    let mut items = BTreeMap::new();
    for stage in json["stages"].as_array().unwrap() {
        let name = stage["stage"].as_str().unwrap().to_owned();
        let outcome = match stage["reason"]["reason"].as_str() {
            None if stage["outputs_to_restore"].as_array().unwrap().is_empty() => Outcome::Fresh,
            None => Outcome::Restored,
            Some("upstream-stale") => Outcome::Maybe,
            Some("unreadable") => Outcome::Failed,
            Some(_) => Outcome::Ran,
        };
        if let Some(unfinished) = stage["unfinished_items"].as_array() {
            let keys = unfinished
                .iter()
                .map(|k| k.as_str().unwrap().split(' ').next().unwrap().to_owned())
                .collect();
            items.insert(name.clone(), keys);
        }
        stages.insert(name, outcome);
    }
    (stages, items)
}

/// What `run -n` says it would do: (would run, would restore).
fn dry_run(p: &Project) -> (BTreeSet<String>, BTreeSet<String>) {
    let out = p.cairn(&["run", "-n"]);
    let mut run = BTreeSet::new();
    let mut restore = BTreeSet::new();
    for line in out.stdout().lines() {
        let word = |rest: &str| rest.split(' ').next().unwrap().to_owned();
        if let Some(rest) = line.strip_prefix("would run  ") {
            run.insert(word(rest));
        } else if let Some(rest) = line.strip_prefix("would restore  ") {
            restore.insert(word(rest));
        }
    }
    (run, restore)
}

/// What `run -v` did, per stage, and the items each per-item stage ran.
fn executed(p: &Project) -> (BTreeMap<String, Outcome>, BTreeSet<String>) {
    let before = p.lines("runs.log").len();
    let out = p.cairn(&["-v", "run"]);
    let mut stages = BTreeMap::new();
    for line in out.stderr().lines() {
        let line = line.trim_start();
        let mut words = line.splitn(3, ' ').filter(|w| !w.is_empty());
        let (Some(tag), rest) = (words.next(), line.split_once("  ")) else {
            continue;
        };
        let Some((_, rest)) = rest else { continue };
        let stage = rest
            .trim_start()
            .split([' ', ':'])
            .next()
            .unwrap()
            .to_owned();
        let outcome = match tag {
            "ok" => Outcome::Ran,
            "fresh" => Outcome::Fresh,
            "restored" => Outcome::Restored,
            "FAILED" => Outcome::Failed,
            _ => continue,
        };
        stages.insert(stage, outcome);
    }
    let items = p.lines("runs.log")[before..]
        .iter()
        .filter_map(|l| l.strip_prefix("per:").map(str::to_owned))
        .collect();
    (stages, items)
}

/// Checks one round: prediction, then execution.
fn check_round(p: &Project) -> Result<(), TestCaseError> {
    if p.cairn(&["status"]).code() == 2 {
        // The manifest is refused (a source input is gone): `run` must
        // refuse it the same way, running nothing.
        let before = p.lines("runs.log");
        prop_assert_eq!(p.cairn(&["run", "-n"]).code(), 2);
        prop_assert_eq!(p.cairn(&["run"]).code(), 2);
        prop_assert_eq!(p.lines("runs.log"), before);
        return Ok(());
    }
    let (predicted, unfinished) = predicted(p);
    let (would_run, would_restore) = dry_run(p);
    let (done, items_ran) = executed(p);
    for (stage, outcome) in &predicted {
        prop_assert_eq!(
            would_run.contains(stage),
            matches!(outcome, Outcome::Ran | Outcome::Maybe | Outcome::Failed),
            "run -n and status disagree on `{}`",
            stage
        );
        prop_assert_eq!(
            would_restore.contains(stage),
            *outcome == Outcome::Restored,
            "run -n and status disagree on `{}`",
            stage
        );
        let actual = done.get(stage);
        match outcome {
            Outcome::Maybe => {}
            // A stage that runs may fail (`a` fails on `input 2`).
            Outcome::Ran if actual == Some(&Outcome::Failed) => {}
            expected => prop_assert_eq!(
                actual,
                Some(expected),
                "stage `{}`: predicted {:?}, run did {:?}\nall: predicted {:?}\nrun {:?}",
                stage,
                expected,
                actual,
                predicted,
                done
            ),
        }
    }
    if predicted.get("per") == Some(&Outcome::Ran) {
        let expected = unfinished.get("per").cloned().unwrap_or_default();
        prop_assert_eq!(&items_ran, &expected, "items of `per`");
    }
    if done.get("per") != Some(&Outcome::Ran) {
        prop_assert!(items_ran.is_empty(), "items ran: {:?}", items_ran);
    }
    Ok(())
}

fn project() -> Project {
    let p = Project::new();
    p.file("data/in.txt", "input 0\n");
    p.file("data/items.jsonl", &items(0b111));
    p.file("cairn.toml", &manifest(0));
    p
}

fn prediction_holds(rounds: &[Vec<Edit>]) -> Result<(), TestCaseError> {
    let p = project();
    check_round(&p)?;
    for edits in rounds {
        for edit in edits {
            apply(&p, edit);
        }
        check_round(&p)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn status_predicts_what_run_does(rounds in prop::collection::vec(prop::collection::vec(edit(), 1..4), 1..5)) {
        prediction_holds(&rounds)?;
    }
}

/// Found by the property above: `status` judged `per`'s items by the edited
/// workspace copy of `state/b/1.txt`, which `run` first restores.
#[test]
fn items_reading_inside_an_upstream_output_to_be_restored_are_predicted_fresh() {
    prediction_holds(&[vec![Edit::AppendToOutput("state/b/1.txt")]]).unwrap();
}

/// Found by the property above: `status` promised to restore `b` from a
/// damaged stored copy; `run` finds the damage and runs `b` again.
#[test]
fn a_restore_from_a_damaged_stored_copy_is_predicted_as_a_run() {
    prediction_holds(&[
        vec![Edit::DamageStored("state/b/1.txt")],
        vec![Edit::DeleteOutput("state/b")],
    ])
    .unwrap();
}

/// Found by the property above: an item's edited entry whose stored copy
/// is damaged cannot be brought back, so `run` runs that item again;
/// `status` listed no item as unfinished.
#[test]
fn an_item_whose_entry_cannot_be_restored_is_predicted_to_run() {
    prediction_holds(&[vec![
        Edit::DamageStored("state/b/1.txt"),
        Edit::AppendToOutput("state/entries/1"),
    ]])
    .unwrap();
}
