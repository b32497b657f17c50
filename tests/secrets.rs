//! A secret reaches its command and nothing else: not the ledger, logs,
//! lock file, JSON output or messages.

mod common;

use common::Project;

const SECRET: &str = "hf_Sup3rS3cretT0kenValue";

fn all_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            all_files(&path, out);
        } else {
            out.push(path);
        }
    }
}

#[test]
fn a_secret_reaches_its_command_and_is_recorded_nowhere() {
    let p = Project::new();
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "secrets"

[stages.upload]
run = "echo token is $HF_TOKEN; printf %s \"$HF_TOKEN\" | wc -c > {out.len}"
outputs = { len = "state/len.txt" }
secrets = ["HF_TOKEN"]

[stages.leaky]
run = "echo about to fail with $HF_TOKEN >&2; exit 1"
secrets = ["HF_TOKEN"]
"#,
    );
    let run = p
        .command(&["run", "--keep-going"])
        .env("HF_TOKEN", SECRET)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr).into_owned();
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    assert_eq!(
        p.read("state/len.txt").trim(),
        SECRET.len().to_string(),
        "the command got the value"
    );
    assert!(stderr.contains("[redacted HF_TOKEN]"), "{stderr}");

    let mut outputs = vec![String::from_utf8_lossy(&run.stdout).into_owned(), stderr];
    for args in [
        &["status", "--json"][..],
        &["why", "leaky", "--json"],
        &["show", "upload", "--json"],
        &["log", "--json"],
        &["log", "leaky", "--json"],
        &["provenance", "upload", "--json"],
        &["why", "leaky"],
    ] {
        let out = p.command(args).env("HF_TOKEN", SECRET).output().unwrap();
        outputs.push(String::from_utf8_lossy(&out.stdout).into_owned());
        outputs.push(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    for text in &outputs {
        assert!(
            !text.contains(SECRET),
            "the secret leaked into output:\n{text}"
        );
    }
    let mut files = Vec::new();
    all_files(&p.path("cache"), &mut files);
    files.push(p.path("cairn.lock"));
    for file in files {
        let bytes = std::fs::read(&file).unwrap();
        assert!(
            !bytes.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()),
            "the secret is in {}",
            file.display()
        );
    }
}

#[test]
fn rotating_a_secret_reruns_nothing() {
    let p = Project::new();
    p.file(
        "cairn.toml",
        "[pipeline]\nname = \"s\"\n[stages.a]\nrun = \"echo ok > {out.o}\"\noutputs = { o = \"o.txt\" }\nsecrets = [\"TOKEN\"]\n",
    );
    assert!(
        p.command(&["run"])
            .env("TOKEN", "first-token")
            .status()
            .unwrap()
            .success()
    );
    let second = p
        .command(&["run"])
        .env("TOKEN", "second-token")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&second.stderr).contains("0 ran, 1 fresh"));
}

#[test]
fn a_secret_an_item_writes_into_its_result_is_redacted_before_it_is_recorded() {
    let p = Project::new();
    p.file("items.jsonl", "{\"id\": \"a\"}\n{\"id\": \"b\"}\n");
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "secrets"

[stages.each]
foreach = { items = "items.jsonl", key = "id" }
run = "mkdir -p results; printf '{\"token\": \"%s\", \"note\": \"sent %s\", \"turns\": 1}' \"$HF_TOKEN\" \"$HF_TOKEN\" > results/{item.id}.json"
item_result = "results/{item.id}.json"
checks = [{ result = "/turns", min = 1 }]
secrets = ["HF_TOKEN"]
outputs = { results = "state/results.jsonl" }
"#,
    );
    let run = p
        .command(&["run"])
        .env("HF_TOKEN", SECRET)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let merged = p.read("state/results.jsonl");
    assert!(!merged.contains(SECRET), "{merged}");
    assert!(
        merged.contains("\"token\":\"[redacted HF_TOKEN]\"")
            && merged.contains("\"note\":\"sent [redacted HF_TOKEN]\""),
        "{merged}"
    );
    let show = p
        .command(&["show", "each/a", "--json"])
        .env("HF_TOKEN", SECRET)
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&show.stdout).contains(SECRET));
    let mut files = Vec::new();
    all_files(&p.path("cache"), &mut files);
    for file in files {
        let bytes = std::fs::read(&file).unwrap();
        assert!(
            !bytes.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()),
            "the secret is in {}",
            file.display()
        );
    }
}
