//! Fingerprint encoding is pinned, and order never matters.

use std::path::Path;

use cairn::fingerprint::{Digest, EntryKind, StatCache, TreeEntry, stage_key, tree_digest};
use cairn::manifest::load_str;
use proptest::prelude::*;

fn keys_of(dir: &Path, manifest: &str) -> Vec<(String, String)> {
    let path = dir.join("cairn.toml");
    let m = load_str(&path, manifest.to_owned(), None).expect("valid manifest");
    let mut keys: Vec<(String, String)> = m
        .stages
        .iter()
        .map(|s| {
            let digests: Vec<Digest> = s
                .inputs
                .iter()
                .map(|i| Digest::of(i.path.as_str().as_bytes()))
                .collect();
            (
                s.name.clone(),
                stage_key(s, &digests, |_| None).fingerprint().to_string(),
            )
        })
        .collect();
    keys.sort();
    keys
}

/// If this fails the fingerprint of an unchanged stage changed: every
/// user's cache would be invalidated. Make it deliberate: bump
/// `KEY_SCHEMA_VERSION` and update the pinned value.
#[test]
fn golden_stage_fingerprint() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("in.txt"), "x").unwrap();
    let manifest = r#"
[pipeline]
name = "golden"
[params]
size = 350
[stages.plan]
run = "plan --size {params.size} {in.meta} > {out.plan}"
inputs = { meta = "in.txt" }
outputs = { plan = "state/plan.json" }
env = { MODE = "strict" }
version = "2"
checks = ["test -s {out.plan}"]
"#;
    let keys = keys_of(dir.path(), manifest);
    assert_eq!(keys[0].1, GOLDEN_PLAN);
}

const GOLDEN_PLAN: &str = "blake3:49885ee5371c6ded15ea1037f944aa02d5a17942f7f0df7b9ff01e15ae8e9899";

#[test]
fn golden_tree_digest() {
    let mut entries = vec![
        TreeEntry {
            path: "b.txt".into(),
            kind: EntryKind::File,
            digest: Digest::of(b"b"),
            size: 1,
        },
        TreeEntry {
            path: "a/run.sh".into(),
            kind: EntryKind::Executable,
            digest: Digest::of(b"#!/bin/sh"),
            size: 9,
        },
        TreeEntry {
            path: "a".into(),
            kind: EntryKind::Dir,
            digest: Digest::from_hash(blake3::Hash::from_bytes([0; 32])),
            size: 0,
        },
    ];
    assert_eq!(tree_digest(&mut entries).to_string(), GOLDEN_TREE);
}

const GOLDEN_TREE: &str = "blake3:f23268f87e9addcb9c742ecd00b301d31c8adcc5016863a9a40cd7db88c19977";

const STAGES: &[(&str, &str)] = &[
    (
        "a",
        "run = \"cat {in.x} > {out.y}\"\ninputs = { x = \"in.txt\" }\noutputs = { y = \"a.txt\" }\nparams = [\"p\", \"q\"]",
    ),
    (
        "b",
        "run = \"cat {in.x} > {out.y}\"\ninputs = { x = \"a.txt\" }\noutputs = { y = \"b.txt\" }\nenv = { Z = \"1\", A = \"2\" }",
    ),
    (
        "c",
        "run = \"echo {params.q} > {out.y}\"\noutputs = { y = \"c.txt\" }\nneeds = [\"a\", \"b\"]",
    ),
    (
        "d",
        "run = [\"cp\", \"{in.one}\", \"{in.two}\", \"{out.dir}\"]\ninputs = { one = \"b.txt\", two = \"c.txt\" }\noutputs = { dir = \"d\" }",
    ),
];

fn manifest(stage_order: &[usize], params_reversed: bool) -> String {
    let mut text = String::from("[pipeline]\nname = \"order\"\n\n[params]\n");
    let params = if params_reversed {
        ["q = \"two\"", "p = 1"]
    } else {
        ["p = 1", "q = \"two\""]
    };
    for p in params {
        text.push_str(p);
        text.push('\n');
    }
    for &i in stage_order {
        let (name, body) = STAGES[i];
        text.push_str(&format!("\n[stages.{name}]\n{body}\n"));
    }
    text
}

proptest! {
    #[test]
    fn reordering_manifest_tables_never_changes_a_fingerprint(
        order in Just((0..STAGES.len()).collect::<Vec<_>>()).prop_shuffle(),
        reversed in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("in.txt"), "x").unwrap();
        let baseline = keys_of(dir.path(), &manifest(&[0, 1, 2, 3], false));
        prop_assert_eq!(keys_of(dir.path(), &manifest(&order, reversed)), baseline);
    }

    #[test]
    fn tree_digest_ignores_listing_order(entries in prop::collection::btree_map("[a-z]{1,6}(/[a-z]{1,6}){0,2}", any::<Vec<u8>>(), 1..12), seed in any::<u64>()) {
        let mut list: Vec<TreeEntry> = entries
            .iter()
            .map(|(path, bytes)| TreeEntry { path: path.into(), kind: EntryKind::File, digest: Digest::of(bytes), size: bytes.len() as u64 })
            .collect();
        let expected = tree_digest(&mut list.clone());
        // A deterministic shuffle from the seed.
        let n = list.len();
        for i in (1..n).rev() {
            let j = (seed.wrapping_mul(i as u64 + 7) % (i as u64 + 1)) as usize;
            list.swap(i, j);
        }
        prop_assert_eq!(tree_digest(&mut list), expected);
    }

    #[test]
    fn directories_created_in_any_order_hash_alike(files in prop::collection::btree_map("[a-z]{1,5}(/[a-z]{1,5})?", "[ -~]{0,40}", 1..10)) {
        let one = tempfile::tempdir().unwrap();
        let two = tempfile::tempdir().unwrap();
        // Same content, created in opposite orders (so readdir order differs).
        let valid: Vec<(&String, &String)> = files.iter().filter(|(p, _)| {
            !files.keys().any(|other| other.starts_with(&format!("{p}/")))
        }).collect();
        for (root, order) in [(one.path(), valid.clone()), (two.path(), valid.iter().rev().cloned().collect())] {
            for (path, content) in order {
                let full = root.join("tree").join(path);
                std::fs::create_dir_all(full.parent().unwrap()).unwrap();
                std::fs::write(full, content).unwrap();
            }
        }
        let a = StatCache::default().content(&one.path().join("tree")).unwrap().digest();
        let b = StatCache::default().content(&two.path().join("tree")).unwrap().digest();
        prop_assert_eq!(a, b);
    }
}

/// Fragments that combine into (mostly) broken manifests.
const PIECES: &[&str] = &[
    "[pipeline]\n",
    "name = \"x\"\n",
    "root = \"..\"\n",
    "[params]\n",
    "n = 1\n",
    "s = \"a\"\n",
    "[profiles.p]\n",
    "params = { n = 2 }\n",
    "[stages.a]\n",
    "[stages.b]\n",
    "run = \"echo {params.n} > {out.o}\"\n",
    "run = [\"cat\", \"{in.i}\"]\n",
    "run = 5\n",
    "run = []\n",
    "outputs = { o = \"o.txt\" }\n",
    "outputs = [\"../x\", \"/abs\"]\n",
    "inputs = { i = \"o.txt\" }\n",
    "inputs = [\"missing\"]\n",
    "needs = [\"a\", \"b\", \"c\"]\n",
    "env = { A = \"1\", B = true, C = 3 }\n",
    "timeout = \"-1s\"\n",
    "timeout = 0\n",
    "version = 1.5\n",
    "checks = [1, [\"x\"]]\n",
    "stages = 3\n",
    "[stages]\n",
    "x = {\n",
    "\"\"\"\n",
    "{{params.n}}\n",
    "run = \"{\"\n",
    "run = \"{params.}\"\n",
    "ünïcödé = \"é\"\n",
    "[[stages.c]]\n",
    "params = [\"n\", \"zz\"]\n",
    "description = 7\n",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any combination is either a valid manifest or a list of located
    /// problems; loading never panics.
    #[test]
    fn loading_arbitrary_manifests_never_panics(picks in prop::collection::vec(0..PIECES.len(), 0..24), noise in "[ -~\n]{0,40}") {
        let dir = tempfile::tempdir().unwrap();
        let mut text: String = picks.iter().map(|&i| PIECES[i]).collect();
        text.push_str(&noise);
        let path = dir.path().join("cairn.toml");
        match load_str(&path, text, None) {
            Ok(manifest) => {
                // A valid manifest also builds a graph or names a cycle.
                let _ = cairn::graph::Dag::build(&manifest);
            }
            Err(cairn::manifest::LoadError::Invalid(errors)) => {
                prop_assert!(!errors.problems.is_empty());
                let rendered = errors.render(false);
                for problem in &errors.problems {
                    prop_assert!(rendered.contains(&errors.location(problem)));
                }
            }
            Err(_) => {}
        }
    }
}
