//! `cairn provenance`: the chain behind an output, back to its sources.

mod common;

use common::Project;

fn project() -> Project {
    let p = Project::new();
    p.file("data/raw.txt", "hello\n");
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "lineage"

[params]
n = 2

[stages.upper]
run = "tr a-z A-Z < {in.raw} > {out.up}"
inputs = { raw = "data/raw.txt" }
outputs = { up = "state/up.txt" }

[stages.repeat]
run = "for i in $(seq {params.n}); do cat {in.up}; done > {out.rep}"
inputs = { up = "state/up.txt" }
outputs = { rep = "state/rep.txt" }
env = { API_TOKEN = true }

[stages.bundle]
run = "mkdir -p {out.dir} && cp {in.rep} {out.dir}/rep.txt"
inputs = { rep = "state/rep.txt" }
outputs = { dir = "state/bundle" }
"#,
    );
    let run = p
        .command(&["run"])
        .env("API_TOKEN", "s3cr3t-value")
        .output()
        .unwrap();
    assert!(run.status.success());
    p
}

/// The stages of a `provenance --json` chain, upstream first.
fn stage_names(json: &serde_json::Value) -> Vec<&str> {
    json["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["stage"].as_str().unwrap())
        .collect()
}

#[test]
fn the_chain_runs_from_sources_to_the_output() {
    let p = project();
    let out = p.cairn(&["provenance", "state/bundle/rep.txt", "--json"]);
    out.success();
    let json: serde_json::Value = serde_json::from_str(&out.stdout()).unwrap();
    let stages = stage_names(&json);
    assert_eq!(stages, ["upper", "repeat", "bundle"]);
    let source = &json["sources"][0];
    assert_eq!(source["path"], "data/raw.txt");
    assert_eq!(
        source["digest"],
        format!("blake3:{}", blake3::hash(b"hello\n").to_hex())
    );
    assert_eq!(json["stages"][1]["params"]["n"], "2");
    assert_eq!(json["stages"][1]["inputs"][0]["produced_by"], "upper");
}

#[test]
fn environment_names_appear_and_their_values_never_do() {
    let p = project();
    for args in [
        &["provenance", "bundle"][..],
        &["provenance", "bundle", "--json"][..],
    ] {
        let out = p.cairn(args);
        out.success();
        assert!(out.stdout().contains("API_TOKEN"), "{}", out.stdout());
        assert!(!out.stdout().contains("s3cr3t-value"), "{}", out.stdout());
    }
}

#[test]
fn an_unknown_target_is_a_usage_error() {
    let p = project();
    let out = p.cairn(&["provenance", "state/nothing.txt"]);
    out.code_is(2);
    assert!(
        out.stderr().contains("neither a stage nor an output"),
        "{}",
        out.stderr()
    );
}

#[test]
fn the_intoto_statement_validates_and_names_outputs_by_sha256() {
    use sha2::Digest as _;
    let p = project();
    let out = p.cairn(&["provenance", "state/rep.txt", "--format", "intoto"]);
    out.success();
    let statement: serde_json::Value = serde_json::from_str(&out.stdout()).unwrap();
    let errors = common::intoto_errors(&statement);
    assert!(errors.is_empty(), "{errors:?}\n{statement:#}");
    assert_eq!(statement["subject"][0]["name"], "state/rep.txt");
    let sha = sha2::Sha256::digest(std::fs::read(p.path("state/rep.txt")).unwrap());
    let hex: String = sha.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(statement["subject"][0]["digest"]["sha256"], hex);
    assert_eq!(
        statement["predicate"]["buildDefinition"]["resolvedDependencies"][0]["uri"],
        "file:data/raw.txt"
    );
    assert!(!out.stdout().contains("s3cr3t-value"));
    // A directory output yields one subject per file.
    let dir = p.cairn(&["provenance", "bundle", "--format", "intoto"]);
    let statement: serde_json::Value = serde_json::from_str(&dir.stdout()).unwrap();
    assert!(common::intoto_errors(&statement).is_empty());
    assert_eq!(statement["subject"][0]["name"], "state/bundle/rep.txt");
}

#[test]
fn the_schema_rejects_a_broken_statement() {
    // The fixture is not vacuous: a statement without subjects, or with a
    // malformed sha256, fails it.
    let p = project();
    let out = p.cairn(&["provenance", "state/rep.txt", "--format", "intoto"]);
    let mut statement: serde_json::Value = serde_json::from_str(&out.stdout()).unwrap();
    statement["subject"][0]["digest"]["sha256"] = serde_json::Value::from("not-hex");
    assert!(!common::intoto_errors(&statement).is_empty());
    statement["subject"] = serde_json::json!([]);
    assert!(!common::intoto_errors(&statement).is_empty());
}

#[test]
fn no_statement_for_an_output_that_changed_since_it_was_recorded() {
    let p = project();
    p.file("state/rep.txt", "edited by hand\n");
    let out = p.cairn(&["provenance", "state/rep.txt", "--format", "intoto"]);
    out.code_is(2);
    assert!(
        out.stderr().contains("no longer matches its record"),
        "{}",
        out.stderr()
    );
}

/// Repositories pinned by content, a bug made per repository, a task per
/// bug validated against its repository and its bug, a freeze: per-item
/// stages, each reading files that items upstream wrote.
fn items_project() -> Project {
    let p = items_manifest("");
    p.cairn(&["run"]).success();
    p
}

/// The manifest of [`items_project`], `validate_extra` added to its
/// `validate` stage; nothing run.
fn items_manifest(validate_extra: &str) -> Project {
    let p = Project::new();
    p.file(
        "repos.jsonl",
        "{\"key\": \"alpha\", \"pin\": \"aaa111\"}\n{\"key\": \"beta\", \"pin\": \"bbb222\"}\n",
    );
    p.file(
        "tasks.jsonl",
        "{\"id\": \"alpha.t1\", \"repo\": \"alpha\", \"split\": \"train\"}\n{\"id\": \"beta.t1\", \"repo\": \"beta\", \"split\": \"test\"}\n",
    );
    p.file(
        "cairn.toml",
        &r#"
[pipeline]
name = "items-lineage"

[stages.fetch]
foreach = { items = "repos.jsonl", key = "key" }
item_outputs = { trees = "{item.key}" }
run = "mkdir -p {out.trees}/{item.key} && echo {item.pin} > {out.trees}/{item.key}/PIN"
outputs = { results = "state/fetch.jsonl", trees = "state/repos" }

[stages.bug]
foreach = { items = "repos.jsonl", key = "key" }
item_inputs = ["state/repos/{item.key}"]
item_result = "state/bugs/{item.key}.json"
needs = ["fetch"]
run = "mkdir -p state/bugs && echo '{\"modifier\": \"swap\", \"repo\": \"{item.key}\"}' > state/bugs/{item.key}.json"
outputs = { results = "state/bug.jsonl" }

[stages.validate]
foreach = { items = "tasks.jsonl", key = "id" }
item_inputs = ["state/repos/{item.repo}", "state/bugs/{item.repo}.json"]
item_outputs = { tasks = "{item.id}" }
item_result = "state/validate/{item.id}.json"
needs = ["bug"]
run = "mkdir -p {out.tasks}/{item.id} state/validate && echo '{\"FAIL_TO_PASS\": [\"test_{item.id}\"]}' > {out.tasks}/{item.id}/task.json && echo '{\"fail_to_pass\": 1}' > state/validate/{item.id}.json"
outputs = { results = "state/validate.jsonl", tasks = "state/tasks" }
VALIDATE_EXTRA

[stages.freeze]
uses = "freeze"
inputs = { selection = "tasks.jsonl", items = "state/tasks" }
outputs = { freeze = "state/freeze" }
needs = ["validate"]
with = { name = "demo", version = "1" }

[stages.lineage]
uses = "lineage"
inputs = { freeze = "state/freeze" }
outputs = { lineage = "state/lineage.json" }

[stages.export]
uses = "export"
inputs = { freeze = "state/freeze", lineage = "state/lineage.json" }
outputs = { bundle = "dist/demo.tar.zst", sha256 = "dist/demo.tar.zst.sha256" }
"#
        .replace("VALIDATE_EXTRA", validate_extra),
    );
    p
}

/// The attestation packed in a bundle.
fn attestation_in(bundle: &[u8]) -> serde_json::Value {
    let tar = zstd::decode_all(bundle).unwrap();
    let mut archive = tar::Archive::new(tar.as_slice());
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        if entry.path().unwrap().ends_with("attestation.intoto.json") {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut entry, &mut text).unwrap();
            return serde_json::from_str(&text).unwrap();
        }
    }
    panic!("no attestation in the bundle");
}

#[test]
fn the_bundle_carries_each_frozen_items_lineage_without_the_ledger() {
    let p = items_project();
    let bundle = std::fs::read(p.path("dist/demo.tar.zst")).unwrap();
    let statement = attestation_in(&bundle);
    let errors = common::intoto_errors(&statement);
    assert!(errors.is_empty(), "{errors:#?}");
    let lineage = &statement["predicate"]["buildDefinition"]["internalParameters"]["lineage"];
    let chain = lineage["items"]["beta.t1"]
        .as_array()
        .expect("beta.t1's chain");
    let steps: Vec<(&str, &str)> = chain
        .iter()
        .map(|s| (s["stage"].as_str().unwrap(), s["key"].as_str().unwrap()))
        .collect();
    assert_eq!(
        steps,
        [("validate", "beta.t1"), ("fetch", "beta"), ("bug", "beta")]
    );
    assert_eq!(chain[1]["fields"]["pin"], "bbb222");
    assert_eq!(chain[0]["outcome"], "ok");
    assert_eq!(lineage["items"]["alpha.t1"][1]["fields"]["pin"], "aaa111");
    // What the ledger says, without its times: the bundle is reproducible.
    assert!(!statement.to_string().contains("started_ms"));
    // `verify` counts the chains, and refuses one for an item the freeze
    // does not hold.
    let verified = p.cairn(&["verify", "dist/demo.tar.zst"]);
    verified.success();
    assert!(
        verified
            .stdout()
            .contains("lineage          2 of 2 items traced"),
        "{}",
        verified.stdout()
    );
    let tar = zstd::decode_all(bundle.as_slice()).unwrap();
    let mut forged = tar::Builder::new(Vec::new());
    for entry in tar::Archive::new(tar.as_slice()).entries().unwrap() {
        let mut entry = entry.unwrap();
        let mut header = entry.header().clone();
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut bytes).unwrap();
        if entry.path().unwrap().ends_with("attestation.intoto.json") {
            let mut statement: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            statement["predicate"]["buildDefinition"]["internalParameters"]["lineage"]["items"]["ghost"] =
                serde_json::json!([]);
            bytes = serde_json::to_vec(&statement).unwrap();
            header.set_size(bytes.len() as u64);
            header.set_cksum();
        }
        forged.append(&header, bytes.as_slice()).unwrap();
    }
    let forged = zstd::encode_all(forged.into_inner().unwrap().as_slice(), 3).unwrap();
    std::fs::write(p.path("forged.tar.zst"), forged).unwrap();
    let refused = p.cairn(&["verify", "forged.tar.zst"]);
    refused.code_is(1);
    assert!(
        refused
            .stderr()
            .contains("traces 1 item(s) the freeze does not hold, e.g. `ghost`"),
        "{}",
        refused.stderr()
    );

    let again = p.cairn(&["run", "--force", "lineage", "--force", "export"]);
    again.success();
    assert!(again.stderr().contains("2 ran"), "{}", again.stderr());
    assert_eq!(std::fs::read(p.path("dist/demo.tar.zst")).unwrap(), bundle);
}

#[test]
fn a_frozen_task_is_traced_through_the_items_behind_it() {
    let p = items_project();
    let out = p.cairn(&[
        "provenance",
        "state/freeze/items/beta.t1/task.json",
        "--json",
    ]);
    out.success();
    let json: serde_json::Value = serde_json::from_str(&out.stdout()).unwrap();
    let items: Vec<(String, String)> = json["items"]
        .as_array()
        .expect("an item chain")
        .iter()
        .map(|s| {
            (
                s["stage"].as_str().unwrap().to_owned(),
                s["key"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    // The task's own item first; only its repository's items behind it.
    assert_eq!(
        items,
        [
            ("validate".to_owned(), "beta.t1".to_owned()),
            ("fetch".to_owned(), "beta".to_owned()),
            ("bug".to_owned(), "beta".to_owned()),
        ]
    );
    let validate = &json["items"][0];
    assert_eq!(validate["class"], "ok");
    assert_eq!(validate["result"]["fail_to_pass"], 1);
    assert_eq!(validate["inputs"][1]["from"], "bug");
    assert_eq!(validate["inputs"][1]["item"], "beta");
    assert!(validate["run_id"].as_i64().is_some());
    let fetch = &json["items"][1];
    assert_eq!(fetch["fields"]["pin"], "bbb222");
    assert_eq!(json["items"][2]["result"]["modifier"], "swap");
    // The stage chain is still there.
    let stages = stage_names(&json);
    assert_eq!(stages, ["fetch", "bug", "validate", "freeze"]);
    // The same chain in the statement of the file.
    let statement = p.cairn(&[
        "provenance",
        "state/freeze/items/beta.t1/task.json",
        "--format",
        "intoto",
    ]);
    statement.success();
    let statement: serde_json::Value = serde_json::from_str(&statement.stdout()).unwrap();
    let items = &statement["predicate"]["buildDefinition"]["internalParameters"]["items"];
    assert_eq!(items[1]["fields"]["pin"], "bbb222");

    let text = p.cairn(&["provenance", "state/tasks/beta.t1"]);
    text.success();
    assert!(
        text.stdout().contains("item `beta` of `fetch`") && text.stdout().contains("pin = bbb222"),
        "{}",
        text.stdout()
    );
    assert!(!text.stdout().contains("alpha"), "{}", text.stdout());
}

#[test]
fn an_item_whose_inputs_changed_says_it_has_not_run_under_them() {
    let p = items_project();
    // beta's pin moves: its fetch has not run under the new one.
    p.file(
        "repos.jsonl",
        "{\"key\": \"alpha\", \"pin\": \"aaa111\"}\n{\"key\": \"beta\", \"pin\": \"ccc333\"}\n",
    );
    let out = p.cairn(&["provenance", "state/tasks/beta.t1", "--json"]);
    out.success();
    let json: serde_json::Value = serde_json::from_str(&out.stdout()).unwrap();
    let fetch = &json["items"][1];
    assert_eq!(
        (&fetch["stage"], &fetch["key"]),
        (&"fetch".into(), &"beta".into())
    );
    assert!(fetch["class"].is_null(), "{fetch}");
    assert_eq!(fetch["fields"]["pin"], "ccc333");
    let text = p.cairn(&["provenance", "state/tasks/beta.t1"]);
    assert!(
        text.stdout().contains("NOT RUN under its inputs"),
        "{}",
        text.stdout()
    );
    p.cairn(&["run"]).success();
    let out = p.cairn(&["provenance", "state/tasks/beta.t1", "--json"]);
    let json: serde_json::Value = serde_json::from_str(&out.stdout()).unwrap();
    assert_eq!(json["items"][1]["class"], "ok");
}

#[test]
fn lineage_is_traced_as_the_run_fingerprinted_from_a_subdirectory_with_a_passed_through_variable() {
    // The validate items' fingerprints hash a variable passed through from
    // cairn's environment; the run starts in a subdirectory, `-f ../…`.
    let p = items_manifest("env = { TOKEN = true }");
    std::fs::create_dir_all(p.path("sub")).unwrap();
    let run = p
        .command(&["-f", "../cairn.toml", "run"])
        .current_dir(p.path("sub"))
        .env("TOKEN", "t0k3n-value")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    let lineage: serde_json::Value = serde_json::from_str(&p.read("state/lineage.json")).unwrap();
    assert_eq!(lineage["items"]["beta.t1"][0]["outcome"], "ok", "{lineage}");
    assert!(!p.read("state/lineage.json").contains("t0k3n-value"));
}

/// A frozen item's lineage reaches every step that decided it, not only
/// those that wrote its files: here a check and an oracle that read the
/// task the validator wrote, each with its verdict. An item that read a
/// file upstream of it (the repository) did not judge this task and is
/// not in its chain.
#[test]
fn a_frozen_items_lineage_reaches_the_verdicts_on_it() {
    let p = items_manifest("");
    let manifest = p.read("cairn.toml");
    let judges = r#"
[stages.static-check]
foreach = { items = "tasks.jsonl", key = "id" }
item_inputs = ["state/tasks/{item.id}"]
item_result = "state/static/{item.id}.json"
needs = ["validate"]
run = "mkdir -p state/static && echo '{\"verdict\": \"accepted\"}' > state/static/{item.id}.json"
outputs = { results = "state/static.jsonl" }

[stages.oracle]
foreach = { items = "tasks.jsonl", key = "id" }
item_inputs = ["state/tasks/{item.id}"]
item_result = "state/oracle/{item.id}.json"
needs = ["validate"]
run = "mkdir -p state/oracle && echo '{\"nop\": \"fail\", \"gold\": \"pass\"}' > state/oracle/{item.id}.json"
outputs = { results = "state/oracle.jsonl" }

[stages.repo-lint]
foreach = { items = "repos.jsonl", key = "key" }
item_inputs = ["state/repos/{item.key}"]
item_result = "state/lint/{item.key}.json"
needs = ["fetch"]
run = "mkdir -p state/lint && echo '{}' > state/lint/{item.key}.json"
outputs = { results = "state/lint.jsonl" }
"#;
    p.file(
        "cairn.toml",
        &manifest.replace("[stages.freeze]", &format!("{judges}\n[stages.freeze]")),
    );
    let freeze_needs = "needs = [\"validate\"]\nwith = { name = \"demo\"";
    let manifest = p.read("cairn.toml");
    assert!(manifest.contains(freeze_needs));
    p.file(
        "cairn.toml",
        &manifest.replace(
            freeze_needs,
            "needs = [\"validate\", \"static-check\", \"oracle\"]\nwith = { name = \"demo\"",
        ),
    );
    p.cairn(&["run"]).success();
    let lineage: serde_json::Value = serde_json::from_str(&p.read("state/lineage.json")).unwrap();
    let steps: Vec<(&str, &str)> = lineage["items"]["beta.t1"]
        .as_array()
        .expect("beta.t1's chain")
        .iter()
        .map(|s| (s["stage"].as_str().unwrap(), s["key"].as_str().unwrap()))
        .collect();
    assert!(steps.contains(&("static-check", "beta.t1")), "{steps:?}");
    assert!(steps.contains(&("oracle", "beta.t1")), "{steps:?}");
    assert!(steps.contains(&("fetch", "beta")), "{steps:?}");
    assert!(!steps.iter().any(|(s, _)| *s == "repo-lint"), "{steps:?}");
    assert!(!steps.contains(&("oracle", "alpha.t1")), "{steps:?}");
    let oracle = lineage["items"]["beta.t1"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["stage"] == "oracle")
        .unwrap();
    assert_eq!(oracle["result"]["gold"], "pass", "{oracle}");
    // `cairn provenance` of a frozen file says the same.
    let traced = p.cairn(&[
        "provenance",
        "state/freeze/items/beta.t1/task.json",
        "--json",
    ]);
    traced.success();
    assert!(
        traced.stdout().contains("\"oracle\""),
        "{}",
        traced.stdout()
    );
}
