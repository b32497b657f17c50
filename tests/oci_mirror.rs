//! `uses = "oci-mirror"`: images copied between an OCI image layout and a
//! real registry (`docker-registry serve`, started here on 127.0.0.1), with
//! the quota gate checked against the target's real tags first.

mod common;

use std::process::Command;

use common::Project;
use common::registry::{Registry, layout, sha256};

/// A project mirroring `images` (records) from `layout` to `target`.
fn project(images: usize, target: &str, quota: usize) -> Project {
    let p = Project::new();
    let names: Vec<String> = (0..images)
        .map(|i| format!("swesmith/repo{i}:base"))
        .collect();
    layout(&p, "source", &names);
    let records: String = (0..images * 2)
        .map(|i| {
            format!(
                "{{\"id\": \"task-{i:03}\", \"image\": \"{}\"}}\n",
                names[i % images]
            )
        })
        .collect();
    p.file("images.jsonl", &records);
    p.file(
        "cairn.toml",
        &format!(
            r#"
[pipeline]
name = "mirror"

[stages.mirror]
uses = "oci-mirror"
inputs = {{ images = "images.jsonl", layout = "source" }}
outputs = {{ mirrored = "state/mirrored.jsonl" }}
with = {{ source = "oci:{{in.layout}}", target = "{target}", shards = 4, quota = {quota} }}
"#
        ),
    );
    p
}

/// The stage's log in the newest run.
fn newest_log(p: &Project, stage: &str) -> String {
    let newest = std::fs::read_dir(p.path("cache/logs"))
        .unwrap()
        .filter_map(|e| e.unwrap().file_name().to_str()?.parse::<u64>().ok())
        .max()
        .unwrap();
    p.read(&format!("cache/logs/{newest}/{stage}.log"))
}

fn mirrored(p: &Project) -> Vec<serde_json::Value> {
    p.read("state/mirrored.jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn images_are_copied_into_a_layout_named_by_shard_and_recorded_by_digest() {
    let p = project(6, "oci:target", 100);
    let out = p.cairn(&["run"]);
    out.success();
    let rows = mirrored(&p);
    assert_eq!(rows.len(), 12);
    let index: serde_json::Value = serde_json::from_str(&p.read("target/index.json")).unwrap();
    let entries = index["manifests"].as_array().unwrap();
    assert_eq!(entries.len(), 6, "one manifest per distinct image");
    for row in &rows {
        let target = row["target"].as_str().unwrap();
        let (repo, tag) = target.rsplit_once(':').unwrap();
        assert!(repo.starts_with("task-0"), "{target}");
        assert!(
            tag.starts_with("baseanchor-") && tag.len() == 23,
            "{target}"
        );
        let entry = entries
            .iter()
            .find(|e| e["annotations"]["org.opencontainers.image.ref.name"] == target)
            .unwrap();
        assert_eq!(entry["digest"], row["digest"]);
        // Every blob the manifest names is there and intact.
        let digest = row["digest"].as_str().unwrap();
        let manifest =
            std::fs::read(p.path(&format!("target/blobs/sha256/{}", &digest[7..]))).unwrap();
        assert_eq!(sha256(&manifest), digest);
        let manifest: serde_json::Value = serde_json::from_slice(&manifest).unwrap();
        for blob in [&manifest["config"], &manifest["layers"][0]] {
            let d = blob["digest"].as_str().unwrap();
            let bytes = std::fs::read(p.path(&format!("target/blobs/sha256/{}", &d[7..]))).unwrap();
            assert_eq!(sha256(&bytes), d);
        }
    }
    // Again, by force: everything is already there.
    let out = p.cairn(&["run", "--force", "mirror"]);
    out.success();
    let log = newest_log(&p, "mirror");
    assert!(log.contains("0 copied, 6 already there"), "{log}");
}

#[test]
fn a_damaged_source_blob_is_refused() {
    let p = project(2, "oci:target", 100);
    let index: serde_json::Value = serde_json::from_str(&p.read("source/index.json")).unwrap();
    let manifest_digest = index["manifests"][0]["digest"].as_str().unwrap().to_owned();
    let manifest: serde_json::Value =
        serde_json::from_str(&p.read(&format!("source/blobs/sha256/{}", &manifest_digest[7..])))
            .unwrap();
    let layer = manifest["layers"][0]["digest"].as_str().unwrap();
    let path = p.path(&format!("source/blobs/sha256/{}", &layer[7..]));
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[0] ^= 1;
    std::fs::write(&path, bytes).unwrap();
    let out = p.cairn(&["run"]);
    out.code_is(1);
    assert!(out.stderr().contains("is damaged"), "{}", out.stderr());
}

#[test]
fn the_quota_gate_refuses_before_copying_anything() {
    let p = project(9, "oci:target", 2);
    let out = p.cairn(&["run"]);
    out.code_is(1);
    assert!(
        out.stderr().contains("would exceed the quota of 2 tags"),
        "{}",
        out.stderr()
    );
    assert!(!p.exists("target"), "something was copied");
}

#[test]
fn images_go_to_a_real_registry_over_http_and_the_quota_counts_its_tags() {
    let registry = Registry::start();
    let target = format!("http://127.0.0.1:{}/mirror", registry.port);
    let p = project(6, &target, 100);
    p.cairn(&["run"]).success();
    let rows = mirrored(&p);
    for row in &rows {
        let target = row["target"].as_str().unwrap();
        let (repo, tag) = target.rsplit_once(':').unwrap();
        let tags: serde_json::Value =
            serde_json::from_str(&registry.get(&format!("/v2/{repo}/tags/list"))).unwrap();
        assert!(
            tags["tags"].as_array().unwrap().iter().any(|t| t == tag),
            "{target} not in {tags}"
        );
        // The registry serves the manifest whose digest was recorded.
        let manifest = Command::new("curl")
            .args([
                "-sf",
                "-H",
                "Accept: application/vnd.oci.image.manifest.v1+json",
                &format!(
                    "http://127.0.0.1:{}/v2/{repo}/manifests/{tag}",
                    registry.port
                ),
            ])
            .output()
            .unwrap();
        assert_eq!(sha256(&manifest.stdout), row["digest"].as_str().unwrap());
        // What a pod pulls: the same manifest, by digest, at this registry.
        assert_eq!(
            row["reference"].as_str().unwrap(),
            format!(
                "127.0.0.1:{}/{repo}@{}",
                registry.port,
                row["digest"].as_str().unwrap()
            )
        );
    }

    // The quota is checked against what the registry really holds: a second
    // pipeline whose own images would fit is refused because of the tags
    // already there.
    let used: usize = {
        let catalog: serde_json::Value =
            serde_json::from_str(&registry.get("/v2/_catalog")).unwrap();
        catalog["repositories"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let tags: serde_json::Value = serde_json::from_str(
                    &registry.get(&format!("/v2/{}/tags/list", r.as_str().unwrap())),
                )
                .unwrap();
                tags["tags"].as_array().unwrap().len()
            })
            .max()
            .unwrap()
    };
    let other = project(6, &target, used);
    // Other image names, so every tag would be new.
    let records = other.read("images.jsonl").replace("swesmith/", "other/");
    other.file("images.jsonl", &records);
    let index = other
        .read("source/index.json")
        .replace("swesmith/", "other/");
    other.file("source/index.json", &index);
    let out = other.cairn(&["run"]);
    out.code_is(1);
    assert!(out.stderr().contains("tags there +"), "{}", out.stderr());
    // Control: the same images fit under the same quota where the registry
    // holds nothing yet, so the refusal came from the tags already there.
    let fresh = other
        .read("cairn.toml")
        .replace(&format!("{target}\""), &format!("{target}-fresh\""));
    other.file("cairn.toml", &fresh);
    other.cairn(&["run"]).success();
}

#[test]
fn a_layout_target_that_lost_its_images_gets_them_back_from_the_next_run() {
    let p = project(3, "oci:target", 100);
    p.cairn(&["run"]).success();
    let rows = p.read("state/mirrored.jsonl");
    let index = p.read("target/index.json");

    // The list of mirrored images is intact, the copies it names are not.
    std::fs::remove_dir_all(p.path("target")).unwrap();
    let why = p.cairn(&["why", "mirror", "--json"]);
    why.success();
    let why: serde_json::Value = serde_json::from_str(&why.stdout()).unwrap();
    assert_eq!(why["reason"]["reason"], "effect-missing", "{why}");
    assert_eq!(why["reason"]["effect"], "the OCI layout `target` is gone");
    let run = p.cairn(&["run"]);
    run.success();
    assert!(run.stderr().contains("1 ran, 0 fresh"), "{}", run.stderr());
    assert_eq!(p.read("state/mirrored.jsonl"), rows);
    assert_eq!(p.read("target/index.json"), index);

    // One image dropped from the layout's index: named, and copied again.
    let mut value: serde_json::Value = serde_json::from_str(&index).unwrap();
    let dropped = value["manifests"].as_array_mut().unwrap().remove(0);
    std::fs::write(p.path("target/index.json"), value.to_string()).unwrap();
    let name = dropped["annotations"]["org.opencontainers.image.ref.name"]
        .as_str()
        .unwrap();
    let why = p.cairn(&["why", "mirror"]);
    why.success();
    assert!(
        why.stdout()
            .contains(&format!("the OCI layout `target` lacks {name}")),
        "{}",
        why.stdout()
    );
    p.cairn(&["run"]).success();
    assert!(
        newest_log(&p, "mirror").contains("1 copied, 2 already there"),
        "{}",
        newest_log(&p, "mirror")
    );
    let again = p.cairn(&["run"]);
    again.success();
    assert!(
        again.stderr().contains("0 ran, 1 fresh"),
        "{}",
        again.stderr()
    );
}
