//! `cairn audit` re-hashes outputs and stored objects: tamper tests flip
//! real bytes.

mod common;

use common::Project;

fn project() -> Project {
    let p = Project::new();
    p.file("data/in.txt", "input\n");
    p.file(
        "cairn.toml",
        r#"
[pipeline]
name = "audited"

[stages.small]
run = "cp {in.x} {out.o}"
inputs = { x = "data/in.txt" }
outputs = { o = "state/small.txt" }

[stages.large]
run = "awk 'BEGIN {for (i = 0; i < 3000; i++) print \"a line of text\"}' > {out.o}; cat {in.s} >> {out.o}"
inputs = { s = "state/small.txt" }
outputs = { o = "state/large.txt" }

[stages.tree]
run = "mkdir -p {out.d} && cp {in.l} {out.d}/copy.txt && echo leaf > {out.d}/leaf.txt"
inputs = { l = "state/large.txt" }
outputs = { d = "state/tree" }
"#,
    );
    p.cairn(&["run"]).success();
    p
}

fn flip(path: &std::path::Path) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[0] ^= 0x01;
    std::fs::write(path, bytes).unwrap();
}

fn mismatches(p: &Project) -> Vec<serde_json::Value> {
    let audit = p.cairn(&["audit", "--json"]);
    let json: serde_json::Value = serde_json::from_str(&audit.stdout()).unwrap();
    let list = json["mismatches"].as_array().unwrap().clone();
    assert_eq!(audit.code(), if list.is_empty() { 0 } else { 1 });
    list
}

#[test]
fn a_clean_workspace_passes() {
    let p = project();
    let audit = p.cairn(&["audit"]);
    audit.success();
    assert!(
        audit.stdout().contains("0 mismatch(es)"),
        "{}",
        audit.stdout()
    );
}

#[test]
fn a_flipped_byte_in_a_workspace_output_is_named() {
    let p = project();
    flip(&p.path("state/large.txt"));
    let found = mismatches(&p);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0]["kind"], "workspace");
    assert_eq!(found[0]["stage"], "large");
    assert_eq!(found[0]["path"], "state/large.txt");
}

#[test]
fn a_flipped_byte_in_a_directory_output_is_named() {
    let p = project();
    flip(&p.path("state/tree/leaf.txt"));
    let found = mismatches(&p);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0]["stage"], "tree");
}

#[test]
fn a_flipped_byte_in_a_stored_object_is_named() {
    let p = project();
    let mut objects = Vec::new();
    for shard in std::fs::read_dir(p.path("cache/objects")).unwrap() {
        for object in std::fs::read_dir(shard.unwrap().path()).unwrap() {
            objects.push(object.unwrap().path());
        }
    }
    assert!(!objects.is_empty());
    for object in &objects {
        flip(object);
    }
    let found = mismatches(&p);
    assert!(found.len() >= objects.len(), "{found:?}");
    assert!(found.iter().all(|m| m["kind"] == "store"), "{found:?}");
    assert!(found.iter().any(|m| m["stage"] == "large"));
}

#[test]
fn a_flipped_byte_in_an_inline_object_is_named() {
    let p = project();
    let db = rusqlite::Connection::open(p.path("cache/ledger.db")).unwrap();
    let (digest, mut bytes): (Vec<u8>, Vec<u8>) = db
        .query_row("SELECT digest, bytes FROM objects LIMIT 1", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    bytes[0] ^= 0x01;
    db.execute(
        "UPDATE objects SET bytes = ?1 WHERE digest = ?2",
        rusqlite::params![bytes, digest],
    )
    .unwrap();
    drop(db);
    let found = mismatches(&p);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0]["kind"], "store");
    assert!(
        found[0]["path"]
            .as_str()
            .unwrap()
            .starts_with("ledger object")
    );
}

#[test]
fn a_lock_file_naming_an_unknown_result_is_named() {
    let p = project();
    let lock = p.read("cairn.lock");
    let first = lock.find("fingerprint = \"blake3:").unwrap() + "fingerprint = \"blake3:".len();
    let mut edited = lock.clone();
    let replacement = if &lock[first..first + 1] == "0" {
        "1"
    } else {
        "0"
    };
    edited.replace_range(first..first + 1, replacement);
    p.file("cairn.lock", &edited);
    let found = mismatches(&p);
    assert!(found.iter().any(|m| m["kind"] == "lock"), "{found:?}");
}
