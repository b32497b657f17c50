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
