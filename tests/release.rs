//! Freezes, bundles and registries: `uses = "freeze" | "export" |
//! "register"`, `cairn verify` and `cairn register`, driven through the
//! real binary. Tampered bundles are made by really rewriting archives.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::Project;
use sha2::{Digest as _, Sha256};

const PIPELINE: &str = r#"
[pipeline]
name = "release"

[params]
version = "2026.11"

[stages.freeze]
uses = "freeze"
inputs = { selection = "selection.jsonl", items = "tasks" }
outputs = { freeze = "state/freeze" }
with = { name = "swe-rl", version = "{params.version}", group = "repo", sizes = { train = 9, eval = 3 }, max_per_group = 3, require = ["task-001"] }

[stages.export]
uses = "export"
inputs = { freeze = "state/freeze" }
outputs = { bundle = "dist/swe-rl.tar.zst", sha256 = "dist/swe-rl.tar.zst.sha256" }

[stages.register]
uses = "register"
inputs = { bundle = "dist/swe-rl.tar.zst", sha256 = "dist/swe-rl.tar.zst.sha256" }
outputs = { receipt = "state/registered.json" }
with = { into = "registry" }
"#;

const ROOT: &str = "swe-rl-2026.11";

/// Twelve tasks over four repos; every fourth task is in `eval`, so each
/// repo sits in one split.
fn dataset(p: &Project, marker: &str) {
    let mut selection = String::new();
    for i in 0..12 {
        let id = format!("task-{i:03}");
        let split = if i % 4 == 0 { "eval" } else { "train" };
        selection.push_str(&format!(
            "{{\"id\": \"{id}\", \"split\": \"{split}\", \"repo\": \"repo{}\"}}\n",
            i % 4
        ));
        p.file(
            &format!("tasks/{id}/task.json"),
            &format!("{{\"id\": \"{id}\"}}\n"),
        );
        p.file(
            &format!("tasks/{id}/src/main.py"),
            &format!("print({i}) # {marker}\n"),
        );
    }
    p.file("selection.jsonl", &selection);
    set_mode(&p.path("tasks/task-001/src/main.py"), 0o755);
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn released(marker: &str) -> Project {
    let p = Project::new();
    dataset(&p, marker);
    p.file("cairn.toml", PIPELINE);
    p.cairn(&["run"]).success();
    p
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Every file under `dir`, by relative path, with its bytes and mode.
fn snapshot(dir: &Path) -> BTreeMap<String, (Vec<u8>, u32)> {
    fn walk(base: &Path, dir: &Path, out: &mut BTreeMap<String, (Vec<u8>, u32)>) {
        use std::os::unix::fs::PermissionsExt as _;
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            let rel = path
                .strip_prefix(base)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                out.insert(format!("{rel}/"), (Vec::new(), meta.permissions().mode()));
                walk(base, &path, out);
            } else {
                out.insert(
                    rel,
                    (std::fs::read(&path).unwrap(), meta.permissions().mode()),
                );
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

#[test]
fn freeze_export_register_end_to_end() {
    let p = released("a");
    let manifest: serde_json::Value =
        serde_json::from_str(&p.read("state/freeze/manifest.json")).unwrap();
    assert_eq!(manifest["total"], 12);
    assert_eq!(manifest["counts"]["train"], 9);
    assert_eq!(manifest["counts"]["eval"], 3);
    assert_eq!(
        manifest["splits"]["eval"],
        serde_json::json!(["task-000", "task-004", "task-008"])
    );
    // The semantic digest, computed here from its definition.
    let splits = serde_json::json!({
        "eval": manifest["splits"]["eval"],
        "train": manifest["splits"]["train"],
    });
    let expected = sha256_hex(serde_json::to_string(&splits).unwrap().as_bytes());
    assert_eq!(manifest["semantic_digest"], format!("sha256:{expected}"));
    // An item's digest: SHA-256 of its sorted `HEX  PATH` listing.
    let listing = format!(
        "{}  src/main.py\n{}  task.json\n",
        sha256_hex(p.read("tasks/task-003/src/main.py").as_bytes()),
        sha256_hex(p.read("tasks/task-003/task.json").as_bytes()),
    );
    assert_eq!(
        manifest["items"]["task-003"]["digest"],
        format!("sha256:{}", sha256_hex(listing.as_bytes()))
    );

    // SHA256SUMS covers every file but itself, and `sha256sum -c` agrees.
    let sums = p.read("state/freeze/SHA256SUMS");
    assert_eq!(sums.lines().count(), 12 * 2 + 1);
    let check = std::process::Command::new("sha256sum")
        .args(["-c", "--quiet", "SHA256SUMS"])
        .current_dir(p.path("state/freeze"))
        .output()
        .unwrap();
    assert!(check.status.success(), "{check:?}");

    // The bundle's digest file is in sha256sum format and true.
    let bundle = std::fs::read(p.path("dist/swe-rl.tar.zst")).unwrap();
    let sidecar = p.read("dist/swe-rl.tar.zst.sha256");
    assert_eq!(
        sidecar,
        format!("{}  swe-rl.tar.zst\n", sha256_hex(&bundle))
    );

    // The registry holds the freeze, byte for byte, with modes normalised.
    let registered = snapshot(&p.path("registry/swe-rl/2026.11"));
    let frozen = snapshot(&p.path("state/freeze"));
    for (path, (bytes, _)) in &frozen {
        assert_eq!(&registered[path].0, bytes, "{path}");
    }
    assert_eq!(registered["items/task-001/src/main.py"].1 & 0o777, 0o755);
    assert_eq!(registered["items/task-002/src/main.py"].1 & 0o777, 0o644);
    assert!(registered.contains_key("attestation.intoto.json"));
    let index: serde_json::Value = serde_json::from_str(&p.read("registry/index.json")).unwrap();
    let entry = &index["datasets"]["swe-rl"]["2026.11"];
    assert_eq!(entry["sha256"], sha256_hex(&bundle));
    assert_eq!(entry["semantic_digest"], manifest["semantic_digest"]);

    // Nothing changed: nothing runs; the receipt is stable.
    let out = p.cairn(&["run"]);
    out.success();
    assert!(out.stderr().contains("0 ran, 3 fresh"), "{}", out.stderr());
    let receipt = p.read("state/registered.json");
    p.cairn(&["run", "--force", "register"]).success();
    assert_eq!(p.read("state/registered.json"), receipt);
}

#[test]
fn the_same_freeze_exports_byte_identical_bundles_anywhere() {
    let a = released("same");
    // Another directory, other mtimes and modes, another umask, one thread.
    let b = Project::new();
    dataset(&b, "same");
    b.file("cairn.toml", PIPELINE);
    let touch = std::process::Command::new("touch")
        .args(["-d", "2011-03-04 05:06:07"])
        .arg(b.path("tasks/task-005/task.json"))
        .arg(b.path("selection.jsonl"))
        .status()
        .unwrap();
    assert!(touch.success());
    set_mode(&b.path("tasks/task-006/task.json"), 0o600);
    let run = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "umask 077 && exec taskset -c 0 {} run",
            common::bin()
        ))
        .current_dir(b.root())
        .output()
        .unwrap();
    assert!(run.status.success(), "{run:?}");

    let bundle_a = std::fs::read(a.path("dist/swe-rl.tar.zst")).unwrap();
    let bundle_b = std::fs::read(b.path("dist/swe-rl.tar.zst")).unwrap();
    assert!(bundle_a == bundle_b, "the two bundles differ");
    assert_eq!(
        a.read("dist/swe-rl.tar.zst.sha256"),
        b.read("dist/swe-rl.tar.zst.sha256")
    );
    // A different dataset does give another bundle (the check can fail).
    let c = released("other");
    assert_ne!(
        bundle_a,
        std::fs::read(c.path("dist/swe-rl.tar.zst")).unwrap()
    );
}

#[test]
fn freeze_checks_name_the_offending_ids_and_write_nothing() {
    let p = Project::new();
    dataset(&p, "x");
    // task-004 joins repo1, which is in train: repo1 now spans two splits
    // and has four items; task-002 appears twice; task-777 has no dir.
    let selection = p.read("selection.jsonl").replace(
        "{\"id\": \"task-004\", \"split\": \"eval\", \"repo\": \"repo0\"}",
        "{\"id\": \"task-004\", \"split\": \"eval\", \"repo\": \"repo1\"}",
    ) + "{\"id\": \"task-002\", \"split\": \"train\", \"repo\": \"repo2\"}\n"
        + "{\"id\": \"task-777\", \"split\": \"train\", \"repo\": \"repo3\"}\n";
    p.file("selection.jsonl", &selection);
    p.file(
        "cairn.toml",
        &PIPELINE.replace(
            "require = [\"task-001\"]",
            "require = [\"task-001\", \"task-404\"]",
        ),
    );
    let out = p.cairn(&["run", "freeze"]);
    out.code_is(1);
    let log = out.stderr();
    for expected in [
        "duplicate IDs: task-002 (×2)",
        "split `train` has 11 items; `sizes` wants exactly 9",
        "repo `repo1` is in 2 splits (eval: task-004; train: task-001, task-005, task-009)",
        "repo `repo1` has 4 items, over the cap of 3: task-004, task-001, task-005, task-009",
        "required IDs missing from the selection: task-404",
        "for: task-777",
    ] {
        assert!(log.contains(expected), "missing {expected:?} in\n{log}");
    }
    assert!(!p.exists("state/freeze"));
    let leftovers: Vec<_> = std::fs::read_dir(p.path("state")).unwrap().collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn a_freeze_refuses_a_symbolic_link_in_an_item() {
    let p = Project::new();
    dataset(&p, "x");
    std::os::unix::fs::symlink("/etc/passwd", p.path("tasks/task-003/passwd")).unwrap();
    p.file("cairn.toml", PIPELINE);
    let out = p.cairn(&["run", "freeze"]);
    out.code_is(1);
    assert!(
        out.stderr().contains("task-003/passwd` is a symbolic link"),
        "{}",
        out.stderr()
    );
    assert!(!p.exists("state/freeze"));
}

#[test]
fn the_attestation_inside_a_bundle_validates_and_attests_every_file() {
    let p = released("a");
    let entries = unpack(&std::fs::read(p.path("dist/swe-rl.tar.zst")).unwrap());
    let (_, bytes) = entries
        .iter()
        .find(|(h, _)| h.path().unwrap().ends_with("attestation.intoto.json"))
        .unwrap();
    let statement: serde_json::Value = serde_json::from_slice(bytes).unwrap();
    let errors = common::intoto_errors(&statement);
    assert!(errors.is_empty(), "{errors:#?}");
    let subjects = statement["subject"].as_array().unwrap();
    assert_eq!(subjects.len(), 12 * 2 + 1);
    let manifest_subject = subjects
        .iter()
        .find(|s| s["name"] == "manifest.json")
        .unwrap();
    assert_eq!(
        manifest_subject["digest"]["sha256"],
        sha256_hex(p.read("state/freeze/manifest.json").as_bytes())
    );
}

// ---- tampering ----------------------------------------------------------

type Entries = Vec<(tar::Header, Vec<u8>)>;

fn unpack(bundle: &[u8]) -> Entries {
    let tar = zstd::decode_all(bundle).unwrap();
    let mut archive = tar::Archive::new(tar.as_slice());
    archive
        .entries()
        .unwrap()
        .map(|e| {
            let mut e = e.unwrap();
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut e, &mut data).unwrap();
            (e.header().clone(), data)
        })
        .collect()
}

fn pack(entries: &Entries) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (header, data) in entries {
        builder.append(header, data.as_slice()).unwrap();
    }
    zstd::encode_all(builder.into_inner().unwrap().as_slice(), 3).unwrap()
}

/// A header for `name`, written raw (the tar crate refuses `..` and
/// absolute paths, which is the point here).
fn raw_header(name: &str, kind: tar::EntryType, size: u64, link: Option<&str>) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_size(size);
    header.set_mode(0o644);
    let old = header.as_old_mut();
    old.name = [0; 100];
    old.name[..name.len()].copy_from_slice(name.as_bytes());
    if let Some(link) = link {
        old.linkname = [0; 100];
        old.linkname[..link.len()].copy_from_slice(link.as_bytes());
    }
    header.set_cksum();
    header
}

fn replace(entries: &mut Entries, path: &str, data: Vec<u8>) {
    let entry = entries
        .iter_mut()
        .find(|(h, _)| h.path().unwrap().to_str() == Some(&format!("{ROOT}/{path}")))
        .unwrap_or_else(|| panic!("no entry {path}"));
    entry.0.set_size(data.len() as u64);
    entry.0.set_cksum();
    entry.1 = data;
}

fn data<'e>(entries: &'e Entries, path: &str) -> &'e [u8] {
    &entries
        .iter()
        .find(|(h, _)| h.path().unwrap().to_str() == Some(&format!("{ROOT}/{path}")))
        .unwrap()
        .1
}

/// Rewrites `manifest.json` with `edit`, and its line in `SHA256SUMS` to
/// match: a tamperer who covers their tracks.
fn edit_manifest(entries: &mut Entries, edit: impl FnOnce(&mut serde_json::Value)) {
    let mut manifest: serde_json::Value =
        serde_json::from_slice(data(entries, "manifest.json")).unwrap();
    let old = sha256_hex(data(entries, "manifest.json"));
    edit(&mut manifest);
    let bytes = serde_json::to_vec_pretty(&manifest).unwrap();
    let sums = String::from_utf8(data(entries, "SHA256SUMS").to_vec())
        .unwrap()
        .replace(&old, &sha256_hex(&bytes));
    replace(entries, "manifest.json", bytes);
    replace(entries, "SHA256SUMS", sums.into_bytes());
}

/// Registers `bundle` (pinned to its own digest) into the project's
/// registry, and verifies it: both must refuse with `message`, and the
/// registry must not change.
#[track_caller]
fn assert_refused(p: &Project, bundle: &[u8], extra: &[&str], message: &str) {
    let path = p.path("dist/tampered.tar.zst");
    std::fs::write(&path, bundle).unwrap();
    let pin = sha256_hex(bundle);
    let before = snapshot(&p.path("registry"));
    let mut args = vec![
        "register",
        "dist/tampered.tar.zst",
        "--into",
        "registry",
        "--sha256",
        &pin,
    ];
    args.extend_from_slice(extra);
    let out = p.cairn(&args);
    out.code_is(1);
    assert!(
        out.stderr().contains(message),
        "register: expected {message:?} in\n{}",
        out.stderr()
    );
    assert!(
        before == snapshot(&p.path("registry")),
        "the registry changed"
    );
    let mut args = vec!["verify", "dist/tampered.tar.zst", "--sha256", &pin];
    args.extend_from_slice(extra);
    let out = p.cairn(&args);
    out.code_is(1);
    assert!(
        out.stderr().contains(message),
        "verify: expected {message:?} in\n{}",
        out.stderr()
    );

    // The same refusal as JSON: the documented keys, plain text problems.
    args.push("--json");
    let out = p.cairn(&args);
    out.code_is(1);
    let report: serde_json::Value = serde_json::from_str(&out.stdout()).unwrap();
    assert_eq!(report["ok"], false);
    assert_eq!(report["bundle"], "dist/tampered.tar.zst");
    let problems = report["problems"].as_array().unwrap();
    let plain = message.replace('`', "");
    assert!(
        problems
            .iter()
            .any(|p| p.as_str().unwrap().contains(&plain)),
        "verify --json: expected {plain:?} in {problems:?}"
    );
    assert!(
        problems.iter().all(|p| !p.as_str().unwrap().contains('`')),
        "markup in {problems:?}"
    );
}

#[test]
fn verify_and_register_refuse_every_kind_of_damage_and_leave_the_registry_alone() {
    let p = released("a");
    let original = std::fs::read(p.path("dist/swe-rl.tar.zst")).unwrap();
    let entries = unpack(&original);

    // Control: the same entries, repacked by this test, verify.
    let control = pack(&entries);
    std::fs::write(p.path("dist/control.tar.zst"), &control).unwrap();
    p.cairn(&[
        "verify",
        "dist/control.tar.zst",
        "--sha256",
        &sha256_hex(&control),
    ])
    .success();

    // A bit flip, against the digest the export wrote.
    let mut flipped = original.clone();
    let middle = flipped.len() / 2;
    flipped[middle] ^= 0x10;
    std::fs::write(p.path("dist/flipped.tar.zst"), &flipped).unwrap();
    std::fs::copy(
        p.path("dist/swe-rl.tar.zst.sha256"),
        p.path("dist/flipped.tar.zst.sha256"),
    )
    .unwrap();
    let before = snapshot(&p.path("registry"));
    let out = p.cairn(&["register", "dist/flipped.tar.zst", "--into", "registry"]);
    out.code_is(1);
    assert!(
        out.stderr().contains("archive digest mismatch"),
        "{}",
        out.stderr()
    );
    assert!(before == snapshot(&p.path("registry")));
    let out = p.cairn(&["verify", "dist/flipped.tar.zst"]);
    out.code_is(1);
    assert!(
        out.stderr().contains("archive digest mismatch"),
        "{}",
        out.stderr()
    );

    // A missing file.
    let mut missing = entries.clone();
    missing.retain(|(h, _)| !h.path().unwrap().ends_with("task-003/task.json"));
    assert_refused(
        &p,
        &pack(&missing),
        &[],
        "file `items/task-003/task.json` is listed in SHA256SUMS but missing from the bundle",
    );

    // An extra file.
    let mut extra = entries.clone();
    let payload = b"surprise\n".to_vec();
    extra.push((
        raw_header(
            &format!("{ROOT}/items/task-003/extra.txt"),
            tar::EntryType::Regular,
            payload.len() as u64,
            None,
        ),
        payload,
    ));
    assert_refused(
        &p,
        &pack(&extra),
        &[],
        "extra file `items/task-003/extra.txt`: not listed in SHA256SUMS",
    );

    // A changed split ID (with SHA256SUMS rewritten to match).
    let mut renamed = entries.clone();
    edit_manifest(&mut renamed, |m| m["splits"]["eval"][1] = "task-099".into());
    assert_refused(&p, &pack(&renamed), &[], "semantic digest mismatch");

    // A wrong count.
    let mut miscounted = entries.clone();
    edit_manifest(&mut miscounted, |m| m["counts"]["train"] = 10.into());
    assert_refused(
        &p,
        &pack(&miscounted),
        &[],
        "wrong count: split `train` has count 10, but lists 9 IDs",
    );

    // A `../` entry.
    let mut climbing = entries.clone();
    climbing.push((
        raw_header(
            &format!("{ROOT}/../evil.txt"),
            tar::EntryType::Regular,
            4,
            None,
        ),
        b"evil".to_vec(),
    ));
    assert_refused(
        &p,
        &pack(&climbing),
        &[],
        "has a `..` component, which escapes the bundle",
    );

    // An absolute path.
    let mut absolute = entries.clone();
    absolute.push((
        raw_header("/tmp/cairn-evil.txt", tar::EntryType::Regular, 4, None),
        b"evil".to_vec(),
    ));
    assert_refused(
        &p,
        &pack(&absolute),
        &[],
        "entry `/tmp/cairn-evil.txt` has an absolute path",
    );

    // A symbolic link out of the tree.
    let mut linked = entries.clone();
    linked.push((
        raw_header(
            &format!("{ROOT}/items/task-000/passwd"),
            tar::EntryType::Symlink,
            0,
            Some("../../../../etc/passwd"),
        ),
        Vec::new(),
    ));
    assert_refused(
        &p,
        &pack(&linked),
        &[],
        "is a symbolic link to `../../../../etc/passwd`, which leaves the bundle",
    );

    // A truncated archive.
    assert_refused(
        &p,
        &original[..original.len() / 2],
        &[],
        "the archive is truncated or corrupt",
    );

    // A file past the size limit.
    assert_refused(
        &p,
        &control,
        &["--max-file-size", "1KiB"],
        "over the limit of 1024 bytes per file",
    );
    assert!(!Path::new("/tmp/cairn-evil.txt").exists());
}

#[test]
fn registering_twice_is_a_no_op_and_a_version_is_registered_once() {
    let p = released("a");
    let before = snapshot(&p.path("registry"));
    let out = p.cairn(&["register", "dist/swe-rl.tar.zst", "--into", "registry"]);
    out.success();
    assert!(
        out.stdout().contains("already registered"),
        "{}",
        out.stdout()
    );
    assert!(before == snapshot(&p.path("registry")));

    // Same name and version, other content.
    let other = released("b");
    let out = p.cairn(&[
        "register",
        other.path("dist/swe-rl.tar.zst").to_str().unwrap(),
        "--into",
        "registry",
    ]);
    out.code_is(1);
    assert!(
        out.stderr()
            .contains("swe-rl 2026.11 is already registered with sha256"),
        "{}",
        out.stderr()
    );
    assert!(before == snapshot(&p.path("registry")));

    // The same content under a new version is welcome.
    let next = Project::new();
    dataset(&next, "b");
    next.file("cairn.toml", &PIPELINE.replace("2026.11", "2026.12"));
    next.cairn(&["run"]).success();
    let out = p.cairn(&[
        "register",
        next.path("dist/swe-rl.tar.zst").to_str().unwrap(),
        "--into",
        "registry",
        "--json",
    ]);
    out.success();
    let json: serde_json::Value = serde_json::from_str(&out.stdout()).unwrap();
    assert_eq!(json["outcome"], "imported");
    let index: serde_json::Value = serde_json::from_str(&p.read("registry/index.json")).unwrap();
    assert_eq!(index["datasets"]["swe-rl"].as_object().unwrap().len(), 2);
}

#[test]
fn register_needs_a_digest_to_check_against() {
    let p = released("a");
    std::fs::copy(p.path("dist/swe-rl.tar.zst"), p.path("loose.tar.zst")).unwrap();
    let out = p.cairn(&["register", "loose.tar.zst", "--into", "elsewhere"]);
    out.code_is(2);
    assert!(
        out.stderr().contains("no digest to check"),
        "{}",
        out.stderr()
    );
    assert!(!p.exists("elsewhere"));
    // verify without a pin still checks the contents, and says so.
    let out = p.cairn(&["verify", "loose.tar.zst"]);
    out.success();
    assert!(out.stdout().contains("not pinned"), "{}", out.stdout());
}

/// The release pipeline and a stage that reads the registered freeze from
/// the registry, as a trainer does (its receipt is its only input).
fn consuming_pipeline(remote: Option<&str>) -> String {
    let remote = remote.map_or_else(String::new, |url| {
        format!("\n[cache.remote]\nurl = \"{url}\"\n")
    });
    format!(
        "{PIPELINE}
[stages.consume]
run = \"cat registry/swe-rl/2026.11/manifest.json > {{out.copy}}\"
inputs = {{ receipt = \"state/registered.json\" }}
outputs = {{ copy = \"state/consumed.json\" }}
{remote}"
    )
}

#[test]
fn a_registry_that_lost_its_freeze_gets_it_back_from_the_next_run() {
    let p = Project::new();
    dataset(&p, "lost");
    p.file("cairn.toml", &consuming_pipeline(None));
    p.cairn(&["run"]).success();
    let receipt = p.read("state/registered.json");
    std::fs::remove_dir_all(p.path("registry")).unwrap();

    // The receipt is intact, the import it stands for is not: stale, and
    // `why` says what is missing.
    let why = p.cairn(&["why", "register", "--json"]);
    why.success();
    let why: serde_json::Value = serde_json::from_str(&why.stdout()).unwrap();
    assert_eq!(why["state"], "stale", "{why}");
    assert_eq!(why["reason"]["reason"], "effect-missing", "{why}");
    let effect = why["reason"]["effect"].as_str().unwrap();
    assert!(
        effect.contains("swe-rl 2026.11") && effect.contains("`registry`"),
        "{effect}"
    );

    let run = p.cairn(&["run"]);
    run.success();
    assert!(
        run.stderr().contains("1 ran, 3 fresh"),
        "register alone re-runs; its receipt is the same bytes: {}",
        run.stderr()
    );
    assert_eq!(p.read("state/registered.json"), receipt);
    assert_eq!(
        p.read("registry/swe-rl/2026.11/manifest.json"),
        p.read("state/freeze/manifest.json")
    );
    let again = p.cairn(&["run"]);
    again.success();
    assert!(
        again.stderr().contains("0 ran, 4 fresh"),
        "{}",
        again.stderr()
    );

    // The index kept, the version's files gone: imported again as well.
    std::fs::remove_dir_all(p.path("registry/swe-rl/2026.11")).unwrap();
    let why = p.cairn(&["why", "register"]);
    why.success();
    assert!(
        why.stdout()
            .contains("the registry `registry` lists swe-rl 2026.11, but its files are gone"),
        "{}",
        why.stdout()
    );
    let run = p.cairn(&["run"]);
    run.success();
    assert!(run.stderr().contains("1 ran, 3 fresh"), "{}", run.stderr());
    assert_eq!(
        p.read("registry/swe-rl/2026.11/manifest.json"),
        p.read("state/freeze/manifest.json")
    );
    let settled = p.cairn(&["run"]);
    settled.success();
    assert!(
        settled.stderr().contains("0 ran, 4 fresh"),
        "{}",
        settled.stderr()
    );
}

#[test]
fn a_second_checkout_imports_the_freeze_into_its_own_registry_rather_than_taking_a_receipt_from_the_remote()
 {
    let cache = common::http_cache::HttpCache::start();
    let home = tempfile::tempdir().unwrap();
    let key = home.path().join("signing-key");
    let run = |p: &Project| {
        let output = p
            .command(&["run"])
            .env("CAIRN_SIGNING_KEY_FILE", &key)
            .env_remove("CAIRN_SIGNING_KEY")
            .output()
            .unwrap();
        let run = common::Run { output };
        run.success();
        run
    };
    let a = Project::new();
    dataset(&a, "shared");
    a.file("cairn.toml", &consuming_pipeline(Some(&cache.url())));
    run(&a);

    let b = Project::new();
    dataset(&b, "shared");
    b.file("cairn.toml", &consuming_pipeline(Some(&cache.url())));
    let second = run(&b);
    // The freeze and the bundle come from the remote; the import is done
    // here, where the registry is.
    assert!(
        second.stderr().contains("export (from the remote cache)"),
        "{}",
        second.stderr()
    );
    assert!(
        !second.stderr().contains("register (from the remote cache)"),
        "{}",
        second.stderr()
    );
    assert_eq!(
        b.read("registry/swe-rl/2026.11/manifest.json"),
        a.read("registry/swe-rl/2026.11/manifest.json")
    );
    assert_eq!(b.read("state/consumed.json"), a.read("state/consumed.json"));
}
