//! Hostile data: item fields, params and item keys that look like shell
//! code or paths never run as code and never leave their place.

mod common;

use common::Project;

/// Values an attacker would put in a scraped candidate pool.
const HOSTILE: &[&str] = &[
    "$(touch PWNED)",
    "; touch PWNED",
    "`touch PWNED`",
    "a'b\"c; touch PWNED #",
    "line one\ntouch PWNED\n",
    "' ; touch PWNED ; '",
    "\" ; touch PWNED ; \"",
    "\\\"; touch PWNED; echo \\",
    "${PWNED:=$(touch PWNED)}",
    "{item.id}",
    "*",
    "",
];

/// A per-item stage that writes each item's title back, reached through
/// every quoting context a template can put a placeholder in.
fn titles_project(titles: &[&str]) -> Project {
    let p = Project::new();
    let list: String = titles
        .iter()
        .enumerate()
        .map(|(i, title)| {
            serde_json::json!({"id": format!("t{i}"), "title": title}).to_string() + "\n"
        })
        .collect();
    p.file("items.jsonl", &list);
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "hostile"

[stages.echo]
foreach = { items = "items.jsonl", key = "id" }
run = """
mkdir -p out
printf '%s' {item.title} > out/{item.id}.bare
printf '%s' "{item.title}" > out/{item.id}.double
printf '%s' '{item.title}' > out/{item.id}.single
printf '%s' "$(printf '%s' {item.title})" > out/{item.id}.subst
"""
outputs = { results = "state/results.jsonl" }
"#,
    );
    p
}

#[test]
fn item_fields_that_look_like_shell_code_arrive_intact_and_never_run() {
    let p = titles_project(HOSTILE);
    p.cairn(&["run"]).success();
    assert!(!p.exists("PWNED"), "an item field ran as shell code");
    for (i, title) in HOSTILE.iter().enumerate() {
        for context in ["bare", "double", "single"] {
            assert_eq!(
                std::fs::read(p.path(&format!("out/t{i}.{context}"))).unwrap(),
                title.as_bytes(),
                "{context} context, title {title:?}"
            );
        }
        // Command substitution strips trailing newlines, as the shell does.
        assert_eq!(
            p.read(&format!("out/t{i}.subst")),
            title.trim_end_matches('\n'),
            "subst context, title {title:?}"
        );
    }
}

#[test]
fn a_param_that_looks_like_shell_code_arrives_intact_and_never_runs() {
    for value in HOSTILE {
        let p = Project::new();
        let toml_value = toml::Value::String((*value).to_owned()).to_string();
        p.file(
            "cairn.toml",
            &format!(
                r#"
[pipeline]
name = "hostile"

[params]
title = {toml_value}

[stages.echo]
run = """printf '%s' {{params.title}} > bare; printf '%s' "{{params.title}}" > double; printf '%s' '{{params.title}}' > single"""
outputs = ["bare", "double", "single"]
"#
            ),
        );
        p.cairn(&["run"]).success();
        assert!(!p.exists("PWNED"), "param {value:?} ran as shell code");
        for file in ["bare", "double", "single"] {
            assert_eq!(
                std::fs::read(p.path(file)).unwrap(),
                value.as_bytes(),
                "{file} context, value {value:?}"
            );
        }
    }
}

/// Text beyond ASCII in a command, in and out of quotes, beside
/// placeholders, is the script's own: it loads and runs as written (cairn
/// read the script byte by byte and stopped inside a character).
#[test]
fn a_command_holding_text_beyond_ascii_runs_as_written() {
    let p = Project::new();
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "unicode"

[params]
name = "wörld"

[stages.greet]
run = "printf '%s %s\\n' 'héllo' {params.name} > out.txt; echo ünïcode → {params.name}… >> out.txt"
outputs = ["out.txt"]
"#,
    );
    p.cairn(&["run"]).success();
    assert_eq!(p.read("out.txt"), "héllo wörld\nünïcode → wörld…\n");
}

#[test]
fn a_list_param_expands_to_one_quoted_word_per_element() {
    let p = Project::new();
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "words"

[params]
tool = ["printf", "%s|", "two words", "$(touch PWNED)"]

[stages.words]
run = "{params.tool} > out.txt"
outputs = ["out.txt"]
"#,
    );
    p.cairn(&["run"]).success();
    assert!(!p.exists("PWNED"));
    assert_eq!(p.read("out.txt"), "two words|$(touch PWNED)|");
}

#[test]
fn a_placeholder_where_quoting_cannot_be_safe_is_refused_at_load() {
    for (run, needle) in [
        ("echo `echo {params.x}`", "backquote"),
        ("echo ${params.x}", "`$`"),
        ("echo \\{params.x}", "backslash"),
        ("cat <<EOF\n{params.x}\nEOF", "here-document"),
        ("echo \"{params.list}\"", "list"),
        ("echo ${HOME:-{params.x}}", "`${"),
    ] {
        let p = Project::new();
        p.file(
            "cairn.toml",
            &format!(
                "[pipeline]\nname = \"refuse\"\n\n[params]\nx = \"v\"\nlist = [\"a\", \"b\"]\n\n[stages.s]\nrun = {}\noutputs = [\"o\"]\n",
                toml::Value::String(run.to_owned())
            ),
        );
        let out = p.cairn(&["run"]);
        out.code_is(2);
        assert!(
            out.stderr().contains("cairn.toml:") && out.stderr().contains(needle),
            "{run:?}: {}",
            out.stderr()
        );
        assert!(!p.exists("cache"), "{run:?} wrote the cache");
    }
}

/// A stand-in for each per-item stage's script (written under every
/// script name those stages use) that records its name and arguments and
/// writes what that stage's command must write.
const RECORDING_TOOL: &str = r#"
import json, os, sys
script, args = os.path.basename(sys.argv[0]), sys.argv[1:]
with open("argv.jsonl", "a") as f:
    f.write(json.dumps([script] + args) + "\n")
def write(path, value):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(value, f)
if script == "materialize.py":
    os.makedirs(args[0])
elif script == "static_check.py":
    write(args[1], {"verdict": "accepted"})
elif script == "oracle.py":
    write(args[1], {"verdict": "accepted"})
elif script == "canary.py":
    write(args[4], {"turns": 1})
"#;

/// The shipped pipeline's per-item stages, cut loose from their upstream
/// stages, reading item lists the test writes.
fn shipped_per_item_stages() -> String {
    let shipped = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/pipelines/swesmith-curation.toml"
    ))
    .unwrap();
    let mut manifest: toml::Table = shipped.parse().unwrap();
    let stages = manifest["stages"].as_table_mut().unwrap();
    stages.retain(|name, _| matches!(name, "materialize" | "static-filter" | "oracle" | "canary"));
    // The commands' arguments are under test, not the model server.
    stages["canary"].as_table_mut().unwrap().remove("services");
    stages["materialize"]
        .as_table_mut()
        .unwrap()
        .remove("needs");
    stages["oracle"].as_table_mut().unwrap().insert(
        "needs".into(),
        toml::Value::Array(vec!["static-filter".into()]),
    );
    manifest.remove("services");
    for (_, profile) in manifest["profiles"].as_table_mut().unwrap().iter_mut() {
        profile.as_table_mut().unwrap().remove("services");
    }
    toml::to_string(&manifest).unwrap()
}

#[test]
fn the_shipped_per_item_stages_run_no_code_from_a_hostile_candidate_pool() {
    let p = Project::new();
    // Laid out as in the repository: the manifest in pipelines/, its root
    // the repository root, its state in state/swesmith-curation/.
    let tool = "pipelines/swesmith-curation";
    let state = "state/swesmith-curation";
    let manifest = shipped_per_item_stages();
    p.file("pipelines/swesmith-curation.toml", &manifest);
    // Each stage's own script is the stand-in; what it imports is empty.
    let parsed: toml::Table = manifest.parse().unwrap();
    for (_, stage) in parsed["stages"].as_table().unwrap() {
        let inputs = stage["inputs"].as_table().unwrap();
        p.file(inputs["tool"].as_str().unwrap(), RECORDING_TOOL);
        if let Some(common) = inputs.get("common") {
            p.file(common.as_str().unwrap(), "");
        }
    }
    p.file(&format!("{state}/registered.json"), "{}");
    p.file("configs/profiles/selection-32k.toml", "");
    p.file("configs/models.toml", "");
    let hostile_fields = [
        "$(touch PWNED)",
        "; touch PWNED",
        "`touch PWNED`",
        "a'b\"c",
        "x\ny && touch PWNED",
        "*",
    ];
    let mut plan = String::new();
    let mut smoke = String::new();
    for (i, field) in hostile_fields.iter().enumerate() {
        let id = task_id(field, i);
        for file in [
            format!("{tool}/repos/{field}/pkg/{field}.py"),
            format!("{tool}/repos/{field}/tests/test_{field}.py"),
            format!("{tool}/repos/{field}/mutations.json"),
        ] {
            p.file(&file, "");
        }
        let task = serde_json::json!({
            "id": id, "repo": field, "template": field, "func": field,
            "defect": field, "image": field,
        });
        plan.push_str(&format!("{task}\n"));
        let canary = serde_json::json!({"key": format!("{i}"), "model": field, "task": id});
        smoke.push_str(&format!("{canary}\n"));
    }
    p.file(&format!("{state}/plan/planned.jsonl"), &plan);
    // What the mirror would list: the oracle's items.
    p.file(&format!("{state}/images.jsonl"), &plan);
    p.file(&format!("{state}/canary/trials.jsonl"), &smoke);

    p.cairn(&["-f", "pipelines/swesmith-curation.toml", "run"])
        .success();
    assert!(!p.exists("PWNED"), "a candidate's field ran as shell code");
    let recorded: Vec<Vec<String>> = p
        .lines("argv.jsonl")
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for (i, field) in hostile_fields.iter().enumerate() {
        let id = task_id(field, i);
        let expected = [
            vec![
                "materialize.py".to_owned(),
                format!("{state}/tasks/{id}"),
                id.clone(),
                field.to_string(),
                field.to_string(),
                field.to_string(),
                field.to_string(),
                field.to_string(),
            ],
            vec![
                "static_check.py".to_owned(),
                format!("{state}/tasks/{id}"),
                format!("{state}/static/{id}.json"),
            ],
            vec![
                "oracle.py".to_owned(),
                format!("{state}/tasks/{id}"),
                format!("{state}/oracle/{id}.json"),
                "--budget".to_owned(),
                "120".to_owned(),
                "--fault-rate".to_owned(),
                "0.0".to_owned(),
            ],
            vec![
                "canary.py".to_owned(),
                field.to_string(),
                id.clone(),
                format!("{state}/registered.json"),
                "configs/profiles/selection-32k.toml".to_owned(),
                format!("{state}/canary/trials/{field}/{id}/0.json"),
            ],
        ];
        for argv in expected {
            assert!(recorded.contains(&argv), "{argv:?} not among {recorded:#?}");
        }
    }
}

/// A per-item stage over `items.jsonl` whose command records each item it
/// runs in `ran.log`.
fn recording_stage(p: &Project, run: &str) {
    p.file(
        "cairn.toml",
        &format!(
            r#"
[pipeline]
name = "keys"

[stages.each]
foreach = {{ items = "items.jsonl", key = "id" }}
run = {}
outputs = {{ results = "state/results.jsonl" }}
"#,
            toml::Value::String(run.to_owned())
        ),
    );
}

#[test]
fn hostile_item_keys_are_refused_before_any_command_runs() {
    for key in [
        "..",
        ".",
        "",
        "a/b",
        "../../etc",
        "-rf",
        "a\nb",
        "a\u{1}b",
        "tab\t",
    ] {
        let p = Project::new();
        let items = [
            serde_json::json!({"id": "fine", "title": "x"}),
            serde_json::json!({"id": key, "title": "y"}),
        ];
        p.file(
            "items.jsonl",
            &items.iter().map(|i| format!("{i}\n")).collect::<String>(),
        );
        recording_stage(&p, "echo {item.title} >> ran.log");
        let out = p.cairn(&["run"]);
        out.code_is(2);
        let escaped = format!("{key:?}");
        assert!(
            out.stderr().contains("items.jsonl")
                && out.stderr().contains("item 2")
                && out.stderr().contains(&escaped[1..escaped.len() - 1]),
            "key {key:?}: {}",
            out.stderr()
        );
        assert!(!p.exists("ran.log"), "key {key:?}: a command ran");
    }
}

#[test]
fn a_hostile_key_in_a_list_made_upstream_fails_the_stage_before_any_item_runs() {
    let p = Project::new();
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "keys"

[stages.list]
run = "printf '%s\n' '{\"id\": \"fine\"}' '{\"id\": \"..\"}' > items.jsonl"
outputs = ["items.jsonl"]

[stages.each]
foreach = { items = "items.jsonl", key = "id" }
run = "echo {item.id} >> ran.log"
outputs = { results = "state/results.jsonl" }
"#,
    );
    let out = p.cairn(&["run"]);
    out.code_is(1);
    assert!(
        out.stderr().contains("`..`") && out.stderr().contains("items.jsonl"),
        "{}",
        out.stderr()
    );
    assert!(!p.exists("ran.log"), "an item ran");
}

#[test]
fn an_unknown_item_field_is_one_located_error_with_did_you_mean() {
    let p = Project::new();
    let items: String = (1..=5)
        .map(|i| {
            format!(
                "{}\n",
                serde_json::json!({"id": format!("t{i}"), "title": "x"})
            )
        })
        .collect();
    p.file("items.jsonl", &items);
    recording_stage(&p, "echo {item.titel} >> ran.log");
    let out = p.cairn(&["run"]);
    out.code_is(2);
    let stderr = out.stderr();
    assert!(
        stderr.contains("cairn.toml:7:") && stderr.contains("did you mean `{item.title}`"),
        "{stderr}"
    );
    assert_eq!(stderr.matches("titel").count(), 1, "{stderr}");
    assert!(!p.exists("ran.log"), "an item ran");
    assert!(!p.exists("cache"), "the run was recorded");
}

#[test]
fn an_unknown_item_field_in_a_list_made_upstream_fails_once_before_any_item_runs() {
    let p = Project::new();
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "fields"

[stages.list]
run = "printf '%s\n' '{\"id\": \"a\", \"title\": \"x\"}' '{\"id\": \"b\", \"title\": \"y\"}' > items.jsonl"
outputs = ["items.jsonl"]

[stages.each]
foreach = { items = "items.jsonl", key = "id" }
run = "echo {item.titel} >> ran.log"
outputs = { results = "state/results.jsonl" }
"#,
    );
    let out = p.cairn(&["run"]);
    out.code_is(1);
    let stderr = out.stderr();
    assert!(stderr.contains("did you mean `{item.title}`"), "{stderr}");
    assert!(!stderr.contains("error (attempt"), "{stderr}");
    assert!(!p.exists("ran.log"), "an item ran");
}

/// A task id made from a hostile field: still hostile, but a valid item key
/// (no control characters).
fn task_id(field: &str, i: usize) -> String {
    format!("{} {i}", field.replace('\n', " "))
}

fn one_stage_writing(output: &str) -> String {
    format!(
        "[pipeline]\nname = \"places\"\n\n[stages.write]\nrun = \"echo data > {output}\"\noutputs = [\"{output}\"]\n"
    )
}

#[test]
fn an_output_may_not_be_the_manifest_or_its_lock_file() {
    for (output, what) in [("cairn.toml", "the manifest"), ("cairn.lock", "lock file")] {
        let p = Project::new();
        let manifest = one_stage_writing(output);
        p.file("cairn.toml", &manifest);
        let out = p.cairn(&["run"]);
        out.code_is(2);
        assert!(
            out.stderr().contains("cairn.toml:6:") && out.stderr().contains(what),
            "{output}: {}",
            out.stderr()
        );
        assert_eq!(p.read("cairn.toml"), manifest);
        assert!(!p.exists("cache"));
    }
}

#[test]
fn an_output_through_a_symlink_leaving_the_root_or_that_is_a_symlink_is_refused() {
    let outside = tempfile::tempdir().unwrap();
    let p = Project::new();
    std::os::unix::fs::symlink(outside.path(), p.path("data")).unwrap();
    p.file("cairn.toml", &one_stage_writing("data/out.txt"));
    let out = p.cairn(&["run"]);
    out.code_is(2);
    assert!(
        out.stderr().contains("leaves the project root") && out.stderr().contains("cairn.toml:6:"),
        "{}",
        out.stderr()
    );
    assert!(!outside.path().join("out.txt").exists());

    let p = Project::new();
    p.file("real.txt", "mine\n");
    std::os::unix::fs::symlink(p.path("real.txt"), p.path("out.txt")).unwrap();
    p.file("cairn.toml", &one_stage_writing("out.txt"));
    let out = p.cairn(&["run"]);
    out.code_is(2);
    assert!(
        out.stderr().contains("is a symbolic link"),
        "{}",
        out.stderr()
    );
    assert_eq!(p.read("real.txt"), "mine\n");
}

#[test]
fn an_output_under_a_symlink_that_stays_inside_the_root_is_allowed() {
    let p = Project::new();
    std::fs::create_dir(p.path("real")).unwrap();
    std::os::unix::fs::symlink("real", p.path("data")).unwrap();
    p.file("cairn.toml", &one_stage_writing("data/out.txt"));
    p.cairn(&["run"]).success();
    assert_eq!(p.read("real/out.txt"), "data\n");
}

#[test]
fn an_item_output_named_by_a_hostile_field_stays_in_its_directory() {
    let p = Project::new();
    p.file(
        "items.jsonl",
        "{\"id\": \"a\", \"name\": \"..\"}\n{\"id\": \"b\", \"name\": \"../../escaped\"}\n{\"id\": \"c\", \"name\": \"fine\"}\n",
    );
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "entries"

[stages.each]
foreach = { items = "items.jsonl", key = "id" }
item_outputs = { tasks = "{item.name}" }
run = "mkdir -p state/tasks/{item.name} && echo x > state/tasks/{item.name}/f"
outputs = { results = "state/results.jsonl", tasks = "state/tasks" }
allow_errors = 2
"#,
    );
    p.cairn(&["run"]).success();
    let merged = p.read("state/results.jsonl");
    assert!(
        merged.contains(r#""class":"error","item":{"id":"a""#),
        "{merged}"
    );
    assert!(
        merged.contains(r#""class":"error","item":{"id":"b""#),
        "{merged}"
    );
    assert!(
        merged.contains(r#""class":"ok","item":{"id":"c""#),
        "{merged}"
    );
}

#[test]
fn an_item_result_named_by_a_hostile_field_is_not_read_from_outside_the_root() {
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("private.json"), "{\"stolen\": true}").unwrap();
    let p = Project::new();
    let escape = format!(
        "../../../../../../../..{}/private",
        outside.path().display()
    );
    p.file(
        "items.jsonl",
        &format!("{}\n", serde_json::json!({"id": "a", "name": escape})),
    );
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "results"

[stages.each]
foreach = { items = "items.jsonl", key = "id" }
item_result = "results/{item.name}.json"
run = "true"
outputs = { results = "state/results.jsonl" }
allow_errors = 1
"#,
    );
    p.cairn(&["run"]).success();
    let merged = p.read("state/results.jsonl");
    assert!(!merged.contains("stolen"), "{merged}");
    assert!(merged.contains(r#""class":"error""#), "{merged}");
}
