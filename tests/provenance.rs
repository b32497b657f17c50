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

#[test]
fn the_chain_runs_from_sources_to_the_output() {
    let p = project();
    let out = p.cairn(&["provenance", "state/bundle/rep.txt", "--json"]);
    out.success();
    let json: serde_json::Value = serde_json::from_str(&out.stdout()).unwrap();
    let stages: Vec<&str> = json["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["stage"].as_str().unwrap())
        .collect();
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
