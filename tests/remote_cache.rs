//! A cache shared across machines, against a real nginx WebDAV server:
//! two workspaces share stage and item results, half-validated items run
//! only the other half, a server killed mid-run costs a warning and local
//! execution, and every kind of poisoned entry or blob is refused.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::Project;
use common::http_cache::HttpCache;

/// A machine: its own signing key (outside every workspace) and a log its
/// commands append to, outside the workspace too.
struct Machine {
    home: tempfile::TempDir,
}

impl Machine {
    fn new() -> Self {
        Self {
            home: tempfile::tempdir().unwrap(),
        }
    }

    fn key_file(&self) -> PathBuf {
        self.home.path().join("signing-key")
    }

    fn public_key(&self, p: &Project) -> String {
        let out = self.cairn(p, &["key", "--quiet"]);
        out.success();
        out.stdout().trim().to_owned()
    }

    fn cairn(&self, p: &Project, args: &[&str]) -> common::Run {
        let output = p
            .command(args)
            .env("CAIRN_SIGNING_KEY_FILE", self.key_file())
            .env("HOME", self.home.path())
            .env_remove("CAIRN_SIGNING_KEY")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        common::Run { output }
    }
}

/// A plain stage writing a file too big to keep inline, a small file and
/// a directory, and a per-item stage writing one entry per item. Every
/// command appends `STAGE ITEM` to `ran` (outside the workspace).
fn manifest(url: &str, ran: &Path, trust: &[String]) -> String {
    let trust = trust
        .iter()
        .map(|k| format!("\"{k}\""))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        r#"
[pipeline]
name = "shared"

[cache.remote]
url = "{url}"
trust = [{trust}]

[stages.make]
run = "echo make - >> {ran}; seq 1 20000 > {{out.big}}; wc -l < data/in.txt > {{out.small}}; mkdir -p {{out.tree}}/sub; echo a > {{out.tree}}/a; seq 5 9000 > {{out.tree}}/sub/b"
inputs = ["data/in.txt"]
outputs = {{ big = "build/big.txt", small = "build/small.txt", tree = "build/tree" }}

[stages.items]
run = "echo items {{item.id}} >> {ran}; seq 1 {{item.n}} > build/items/{{item.id}}; mkdir -p scratch; echo '{{{{\"n\": {{item.n}}}}}}' > scratch/{{item.id}}.json"
foreach = {{ items = "data/items.jsonl", key = "id" }}
item_outputs = {{ out = "{{item.id}}" }}
item_result = "scratch/{{item.id}}.json"
outputs = {{ out = "build/items", results = "build/items.jsonl" }}
needs = ["make"]
"#,
        ran = ran.display()
    )
}

fn workspace(url: &str, ran: &Path, items: usize, trust: &[String]) -> Project {
    let p = Project::new();
    p.file("cairn.toml", &manifest(url, ran, trust));
    p.file("data/in.txt", "one\ntwo\nthree\n");
    let list: String = (1..=items)
        .map(|n| format!("{{\"id\": \"i{n}\", \"n\": {}}}\n", n * 1000))
        .collect();
    p.file("data/items.jsonl", &list);
    p
}

fn read_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .map(|s| s.lines().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// Each file under `rel`, with the SHA-256 of its bytes.
fn files_under(root: &Path, rel: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let base = root.join(rel);
    let mut stack = vec![base.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let name = path
                    .strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                use sha2::Digest as _;
                let digest = sha2::Sha256::digest(std::fs::read(&path).unwrap());
                let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
                out.push((name, hex));
            }
        }
    }
    out.sort();
    out
}

fn outputs(p: &Project) -> Vec<(String, String)> {
    files_under(p.root(), "build")
}

/// A cache, a machine, and a first workspace `a` that ran there.
struct Scene {
    cache: HttpCache,
    _side: tempfile::TempDir,
    ran: PathBuf,
    machine: Machine,
    a: Project,
    first: common::Run,
}

impl Scene {
    fn with_items(items: usize) -> Self {
        let cache = HttpCache::start();
        let side = tempfile::tempdir().unwrap();
        let ran = side.path().join("ran");
        let machine = Machine::new();
        let a = workspace(&cache.url(), &ran, items, &[]);
        let first = machine.cairn(&a, &["run"]);
        first.success();
        Self {
            cache,
            _side: side,
            ran,
            machine,
            a,
            first,
        }
    }

    /// Another checkout on the same machine, its commands' log emptied.
    fn second(&self, items: usize) -> Project {
        let _ = std::fs::remove_file(&self.ran);
        workspace(&self.cache.url(), &self.ran, items, &[])
    }

    fn ran(&self) -> Vec<String> {
        read_lines(&self.ran)
    }
}

#[test]
fn a_second_workspace_reuses_stage_and_item_results_and_runs_no_command() {
    let scene = Scene::with_items(4);
    let (cache, machine, a) = (&scene.cache, &scene.machine, &scene.a);
    assert!(
        scene.first.stderr().contains("uploaded"),
        "{}",
        scene.first.stderr()
    );
    assert_eq!(scene.ran().len(), 5, "make and four items ran in A");
    // The server holds entries and blobs under the protocol's two roots.
    assert!(!cache.files("ac").is_empty() && !cache.files("cas").is_empty());

    // Another checkout, its cache empty: the same key (the same machine).
    let b = scene.second(4);
    let second = machine.cairn(&b, &["run"]);
    second.success();
    assert_eq!(
        scene.ran().len(),
        0,
        "nothing ran in B: {}",
        second.stderr()
    );
    assert!(
        second.stderr().contains("make (from the remote cache)"),
        "{}",
        second.stderr()
    );
    assert_eq!(
        outputs(a),
        outputs(&b),
        "B's outputs are A's, byte for byte"
    );
    let shown = machine.cairn(&b, &["show", "make"]);
    shown.success();
    assert!(
        shown
            .stdout()
            .contains(&format!("origin       the remote cache {}", cache.url())),
        "{}",
        shown.stdout()
    );
    let item = machine.cairn(&b, &["show", "items/i2"]);
    item.success();
    assert!(item.stdout().contains("remote:"), "{}", item.stdout());
    let status = machine.cairn(&b, &["status"]);
    status.success();
    assert!(
        status.stdout().contains("all 2 stage(s) fresh"),
        "{}",
        status.stdout()
    );
    assert!(status.stdout().contains("4 ok"), "{}", status.stdout());
    // And B on its own from now on: a no-op, nothing fetched.
    let again = machine.cairn(&b, &["run", "--no-remote-cache"]);
    again.success();
    assert!(
        again.stderr().contains("0 ran, 2 fresh"),
        "{}",
        again.stderr()
    );
    // The outputs can be re-verified from B's own store.
    machine.cairn(&b, &["audit"]).success();
}

#[test]
fn a_per_item_stage_half_validated_elsewhere_runs_only_the_other_half() {
    let scene = Scene::with_items(5);
    let b = scene.second(10);
    scene.machine.cairn(&b, &["run"]).success();
    let mut ran_in_b = scene.ran();
    ran_in_b.sort();
    let expected: Vec<String> = {
        let mut e: Vec<String> = (6..=10).map(|n| format!("items i{n}")).collect();
        e.sort();
        e
    };
    assert_eq!(ran_in_b, expected, "only the items A never validated ran");
    for n in 1..=10 {
        assert_eq!(
            b.read(&format!("build/items/i{n}")).lines().count(),
            n * 1000,
            "item i{n}'s output is whole"
        );
    }
    let merged = b.read("build/items.jsonl");
    assert_eq!(merged.lines().count(), 10, "{merged}");
}

#[test]
fn entries_signed_by_an_untrusted_key_are_refused_until_its_key_is_trusted() {
    let cache = HttpCache::start();
    let side = tempfile::tempdir().unwrap();
    let ran = side.path().join("ran");
    let (alice, bob) = (Machine::new(), Machine::new());
    let a = workspace(&cache.url(), &ran, 2, &[]);
    alice.cairn(&a, &["run"]).success();
    let before = read_lines(&ran).len();

    let b = workspace(&cache.url(), &ran, 2, &[]);
    let untrusted = bob.cairn(&b, &["run"]);
    untrusted.success();
    assert_eq!(
        read_lines(&ran).len(),
        before + 3,
        "all ran again on Bob's machine"
    );
    assert!(
        untrusted
            .stderr()
            .contains("a key this workspace does not trust"),
        "{}",
        untrusted.stderr()
    );
    assert!(
        untrusted.stderr().contains("refused"),
        "{}",
        untrusted.stderr()
    );

    // Bob trusts Alice's key: a third checkout reuses her results (and his).
    let trusted = [alice.public_key(&a)];
    let c = workspace(&cache.url(), &ran, 2, &trusted);
    let reused = bob.cairn(&c, &["run"]);
    reused.success();
    assert_eq!(
        read_lines(&ran).len(),
        before + 3,
        "nothing ran: {}",
        reused.stderr()
    );
    assert_eq!(outputs(&a), outputs(&c));
}

/// The file the server keeps for the blob whose bytes are `bytes`.
fn blob_holding(cache: &HttpCache, bytes: &[u8]) -> PathBuf {
    use sha2::Digest as _;
    let hex: String = sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let path = cache.root().join("cas").join(hex);
    assert!(path.exists(), "the server holds the blob");
    path
}

/// Runs A, damages the remote with `damage`, then runs B (same key):
/// `make` must run in B, its outputs must be right, and the refusal
/// must be said and counted.
fn refused_after(damage: impl FnOnce(&HttpCache, &Project), says: &str) {
    let scene = Scene::with_items(1);
    let (machine, a) = (&scene.machine, &scene.a);
    damage(&scene.cache, a);
    let b = scene.second(1);
    let run = machine.cairn(&b, &["run"]);
    run.success();
    assert!(
        scene.ran().contains(&"make -".to_owned()),
        "make ran in B: {}",
        run.stderr()
    );
    assert!(
        run.stderr().contains(says),
        "expected `{says}` in\n{}",
        run.stderr()
    );
    assert!(run.stderr().contains("1 refused"), "{}", run.stderr());
    assert_eq!(outputs(a), outputs(&b), "nothing wrong was restored");
    machine.cairn(&b, &["audit"]).success();
}

#[test]
fn a_truncated_blob_is_refused() {
    refused_after(
        |cache, a| {
            let blob = blob_holding(cache, &std::fs::read(a.path("build/big.txt")).unwrap());
            let bytes = std::fs::read(&blob).unwrap();
            std::fs::write(&blob, &bytes[..bytes.len() / 2]).unwrap();
        },
        "bytes, not",
    );
}

#[test]
fn a_blob_whose_bytes_are_not_its_digests_is_refused() {
    refused_after(
        |cache, a| {
            let blob = blob_holding(cache, &std::fs::read(a.path("build/big.txt")).unwrap());
            let mut bytes = std::fs::read(&blob).unwrap();
            // The same length, one byte flipped.
            bytes[100] ^= 0x01;
            std::fs::write(&blob, bytes).unwrap();
        },
        "its bytes hash to blake3:",
    );
}

/// The entry the server holds for stage `make` (the one naming its big
/// output), as text.
fn make_entry(cache: &HttpCache) -> (PathBuf, String) {
    cache
        .files("ac")
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            (path, text)
        })
        .find(|(_, text)| text.contains("\"kind\":\"stage\"") && text.contains("build/big.txt"))
        .expect("an entry for `make`")
}

#[test]
fn a_forged_entry_is_refused() {
    refused_after(
        |cache, _| {
            let (path, text) = make_entry(cache);
            // Claim another size for the small output: signed bytes changed.
            let forged = text.replacen("\"host\":\"", "\"host\":\"forged-", 1);
            assert_ne!(forged, text);
            std::fs::write(path, forged).unwrap();
        },
        "its signature does not verify",
    );
}

#[test]
fn an_unsigned_entry_is_refused() {
    refused_after(
        |cache, _| {
            let (path, text) = make_entry(cache);
            let mut value: serde_json::Value = serde_json::from_str(&text).unwrap();
            let entry = value["entry"].take();
            std::fs::write(
                path,
                serde_json::to_vec(&serde_json::json!({ "entry": entry })).unwrap(),
            )
            .unwrap();
        },
        "it is not a signed cairn cache entry",
    );
}

#[test]
fn an_entry_moved_under_another_fingerprints_key_is_refused() {
    refused_after(
        |cache, _| {
            // Every entry on the server replaced by the one of an item: a
            // validly signed entry, for another fingerprint.
            let (make, _) = make_entry(cache);
            let other = cache
                .files("ac")
                .into_iter()
                .find(|path| {
                    std::fs::read_to_string(path)
                        .unwrap()
                        .contains("\"kind\":\"item\"")
                })
                .unwrap();
            std::fs::copy(other, make).unwrap();
        },
        "it is for blake3:",
    );
}

#[test]
fn a_server_killed_mid_run_costs_one_warning_and_the_run_succeeds_locally() {
    let mut cache = HttpCache::start();
    let side = tempfile::tempdir().unwrap();
    let ran = side.path().join("ran");
    let machine = Machine::new();
    let p = workspace(&cache.url(), &ran, 30, &[]);
    // Each item takes a moment, so the run is surely under way when the
    // server goes.
    let text = p
        .read("cairn.toml")
        .replace("echo items {item.id}", "sleep 0.1; echo items {item.id}");
    p.file("cairn.toml", &text);
    let mut child = p.command(&["run", "-j", "2"]);
    child
        .env("CAIRN_SIGNING_KEY_FILE", machine.key_file())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let child = child.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while read_lines(&ran).len() < 4 {
        assert!(Instant::now() < deadline, "the run never got going");
        std::thread::sleep(Duration::from_millis(20));
    }
    cache.kill();
    let out = common::output_within(child, Duration::from_secs(120), "the run");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    // One warning: the server went while items were uploaded (its
    // lookups were over by then), so uploads stopped.
    assert_eq!(stderr.matches("WARN").count(), 1, "one warning:\n{stderr}");
    assert!(stderr.contains("takes no uploads"), "{stderr}");
    assert_eq!(p.read("build/items.jsonl").lines().count(), 30);
    // With the server gone from the start, too.
    let q = workspace(&cache.url(), &ran, 2, &[]);
    let alone = machine.cairn(&q, &["run"]);
    alone.success();
    assert_eq!(
        alone.stderr().matches("cannot be used").count(),
        1,
        "{}",
        alone.stderr()
    );
}

#[test]
fn a_bad_remote_cache_setting_is_located_in_the_manifest() {
    let side = tempfile::tempdir().unwrap();
    let p = workspace(
        "ftp://cache",
        &side.path().join("ran"),
        1,
        &["ed25519:AAAA".to_owned()],
    );
    let out = p.cairn(&["status"]);
    out.code_is(2);
    let stderr = out.stderr();
    assert!(
        stderr.contains("`url` must be an http:// or https:// address, found `ftp://cache`"),
        "{stderr}"
    );
    assert!(
        stderr.contains("`ed25519:AAAA` holds 3 bytes, not 32"),
        "{stderr}"
    );
}

/// `value` as canonical JSON: keys sorted at every depth, compact.
fn canonical(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let body: Vec<String> = keys
                .iter()
                .map(|k| {
                    format!(
                        "{}:{}",
                        serde_json::to_string(k).unwrap(),
                        canonical(&map[*k])
                    )
                })
                .collect();
            format!("{{{}}}", body.join(","))
        }
        serde_json::Value::Array(items) => {
            format!(
                "[{}]",
                items.iter().map(canonical).collect::<Vec<_>>().join(",")
            )
        }
        other => serde_json::to_string(other).unwrap(),
    }
}

/// Re-signs `entry` with the machine's own key, as a trusted signer gone
/// rogue (or whose key leaked) would.
fn signed_by(machine: &Machine, entry: serde_json::Value) -> Vec<u8> {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let text = std::fs::read_to_string(machine.key_file()).unwrap();
    let seed = b64
        .decode(text.trim().strip_prefix("ed25519-seed:").unwrap())
        .unwrap();
    let pair = ring::signature::Ed25519KeyPair::from_seed_unchecked(&seed).unwrap();
    let mut message = b"cairn.cache-entry/1\0".to_vec();
    message.extend_from_slice(canonical(&entry).as_bytes());
    let signature = b64.encode(pair.sign(&message).as_ref());
    use ring::signature::KeyPair as _;
    let key = format!("ed25519:{}", b64.encode(pair.public_key().as_ref()));
    serde_json::to_vec(&serde_json::json!({
        "entry": entry,
        "signature": { "key": key, "ed25519": signature },
    }))
    .unwrap()
}

#[test]
fn even_a_trusted_signer_cannot_make_a_result_write_outside_the_stages_outputs() {
    let scene = Scene::with_items(1);
    let (cache, machine, a) = (&scene.cache, &scene.machine, &scene.a);
    // The stage entry, its big output moved outside the workspace; and the
    // item entry, its output moved out of its directory.
    let (path, text) = make_entry(cache);
    let mut envelope: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut entry = envelope["entry"].take();
    for output in entry["outputs"].as_array_mut().unwrap() {
        if output["path"] == "build/big.txt" {
            output["path"] = "../escaped.txt".into();
        }
    }
    std::fs::write(&path, signed_by(machine, entry)).unwrap();
    let item = cache
        .files("ac")
        .into_iter()
        .find(|p| {
            std::fs::read_to_string(p)
                .unwrap()
                .contains("\"kind\":\"item\"")
        })
        .unwrap();
    let mut envelope: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&item).unwrap()).unwrap();
    let mut entry = envelope["entry"].take();
    entry["outputs"][0]["path"] = "build/items/../../escaped-item".into();
    std::fs::write(&item, signed_by(machine, entry)).unwrap();

    let b = scene.second(1);
    let run = machine.cairn(&b, &["run"]);
    run.success();
    assert!(
        run.stderr()
            .contains("names outputs the stage does not declare"),
        "{}",
        run.stderr()
    );
    let mut lines = scene.ran();
    lines.sort();
    assert_eq!(lines, ["items i1", "make -"], "both ran here instead");
    assert!(!b.root().parent().unwrap().join("escaped.txt").exists());
    assert!(!b.root().parent().unwrap().join("escaped-item").exists());
    assert_eq!(outputs(a), outputs(&b));
}

#[test]
fn a_schema_7_ledger_gains_origins_and_keeps_its_history() {
    let side = tempfile::tempdir().unwrap();
    let ran = side.path().join("ran");
    let p = workspace("http://127.0.0.1:9/unused", &ran, 2, &[]);
    p.cairn(&["run", "--no-remote-cache"]).success();
    {
        let db = rusqlite::Connection::open(p.path("cache/ledger.db")).unwrap();
        common::downgrade_to_schema_7(&db);
    }
    let again = p.cairn(&["run", "--no-remote-cache"]);
    again.success();
    assert!(
        again.stderr().contains("0 ran, 2 fresh"),
        "{}",
        again.stderr()
    );
    let db = rusqlite::Connection::open(p.path("cache/ledger.db")).unwrap();
    let version: i64 = db
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, cairn::store::LEDGER_SCHEMA_VERSION);
    let local: i64 = db
        .query_row(
            "SELECT COUNT(*) FROM results WHERE origin IS NULL",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(local >= 2, "the results made here have no origin");
}

#[test]
fn force_runs_a_per_item_stages_items_here_even_when_the_remote_has_them() {
    let scene = Scene::with_items(3);
    let b = scene.second(3);
    let forced = scene.machine.cairn(&b, &["run", "--force", "items"]);
    forced.success();
    let mut ran = scene.ran();
    ran.sort();
    assert_eq!(
        ran,
        ["items i1", "items i2", "items i3"],
        "{}",
        forced.stderr()
    );
}

/// A server that answers every request with a 200 and then sends its body
/// one byte every half second, forever: what a stuck proxy looks like.
fn trickling_server() -> (common::Reaped, u16) {
    scripted_server(
        r#"c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n")
        while True:
            c.sendall(b"x"); time.sleep(0.5)"#,
    )
}

/// A server on a free port that reads each request, then runs `answer`
/// (Python, with the connection as `c`, indented as a `try` body).
fn scripted_server(answer: &str) -> (common::Reaped, u16) {
    common::require_tool("python3");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let script = format!(
        r#"
import socket, threading, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", {port})); s.listen(64)
def serve(c):
    try:
        c.recv(65536)
        {answer}
    except OSError:
        pass
while True:
    c, _ = s.accept(); threading.Thread(target=serve, args=(c,), daemon=True).start()
"#
    );
    let child = std::process::Command::new("python3")
        .args(["-c", &script])
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "the server did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    (common::Reaped(child), port)
}

/// `cairn run` in `p`, signing with `machine`'s key: it must succeed
/// within a minute; its stderr.
fn run_signed(p: &Project, machine: &Machine) -> String {
    let mut command = p.command(&["run"]);
    command
        .env("CAIRN_SIGNING_KEY_FILE", machine.key_file())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let out = common::output_within(command.spawn().unwrap(), Duration::from_secs(60), "the run");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    stderr
}

/// A server that answers, but with errors, is not "unreachable": the run
/// says what it answered and goes on without it.
#[test]
fn a_server_answering_errors_is_named_by_its_answer_not_called_unreachable() {
    let (_server, port) = scripted_server(
        r#"c.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"); c.close()"#,
    );
    let side = tempfile::tempdir().unwrap();
    let ran = side.path().join("ran");
    let machine = Machine::new();
    let p = workspace(&format!("http://127.0.0.1:{port}/cairn"), &ran, 2, &[]);
    let stderr = run_signed(&p, &machine);
    assert_eq!(read_lines(&ran).len(), 3, "everything ran here");
    let summary = stderr
        .lines()
        .find(|line| line.starts_with("remote cache "))
        .unwrap_or_else(|| panic!("no summary of the remote:\n{stderr}"));
    assert!(summary.contains("500"), "{summary}");
    assert!(!summary.contains("unreachable"), "{summary}");
}

#[test]
fn a_server_that_trickles_its_answers_is_cut_off_at_the_timeout() {
    let (_server, port) = trickling_server();
    let side = tempfile::tempdir().unwrap();
    let ran = side.path().join("ran");
    let machine = Machine::new();
    let p = workspace(&format!("http://127.0.0.1:{port}/cairn"), &ran, 2, &[]);
    let text = p
        .read("cairn.toml")
        .replace("trust = []", "trust = []\ntimeout = \"2s\"");
    p.file("cairn.toml", &text);
    let started = Instant::now();
    let stderr = run_signed(&p, &machine);
    assert_eq!(read_lines(&ran).len(), 3, "everything ran here");
    assert_eq!(stderr.matches("cannot be used").count(), 1, "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "cut off at the timeout, not waited out: {:?}",
        started.elapsed()
    );
}

#[test]
fn cairn_key_names_the_manifests_key_even_when_the_manifest_does_not_load() {
    let keys = tempfile::tempdir().unwrap();
    let key = keys.path().join("team-key");
    let p = Project::new();
    // An input that is not there: every other command refuses to start.
    p.file(
        "cairn.toml",
        &format!(
            "[pipeline]\nname = \"k\"\n[cache.remote]\nurl = \"http://127.0.0.1:9/c\"\nkey = \"{}\"\n[stages.a]\nrun = \"true\"\ninputs = [\"absent.txt\"]\n",
            key.display()
        ),
    );
    let out = p
        .command(&["key", "--quiet"])
        .env_remove("CAIRN_SIGNING_KEY")
        .env_remove("CAIRN_SIGNING_KEY_FILE")
        .env("HOME", keys.path().join("home"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(key.exists(), "the key was made where the manifest says");
    assert!(
        !keys.path().join("home").exists(),
        "not in the default place"
    );
    let shown = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(
        shown.starts_with("ed25519:") && shown.len() == 52,
        "{shown}"
    );
}

#[test]
fn credentials_in_a_remote_address_never_reach_the_ledger_or_messages() {
    let cache = HttpCache::start();
    let side = tempfile::tempdir().unwrap();
    let machine = Machine::new();
    let p = workspace(&cache.url(), &side.path().join("ran"), 1, &[]);
    let url = cache.url().replace("http://", "http://alice:hunter2pw@");
    let run = machine.cairn(&p, &["run", "--remote-cache", &url]);
    run.success();
    assert!(!run.stderr().contains("hunter2pw"), "{}", run.stderr());
    let ledger = std::fs::read(p.path("cache/ledger.db")).unwrap();
    let wal = std::fs::read(p.path("cache/ledger.db-wal")).unwrap_or_default();
    for bytes in [&ledger, &wal] {
        assert!(
            !bytes.windows(9).any(|w| w == b"hunter2pw"),
            "the password is in the ledger"
        );
    }
    let log = machine.cairn(&p, &["log", "--json"]);
    assert!(!log.stdout().contains("hunter2pw"), "{}", log.stdout());
}

#[test]
fn a_seed_pasted_into_trust_is_refused_without_being_echoed() {
    let side = tempfile::tempdir().unwrap();
    let seed = "ed25519-seed:c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0MTI=";
    let p = workspace(
        "http://127.0.0.1:9/c",
        &side.path().join("ran"),
        1,
        &[seed.to_owned()],
    );
    let out = p.cairn(&["status"]);
    out.code_is(2);
    assert!(
        out.stderr().contains("a signing key's seed"),
        "{}",
        out.stderr()
    );
    // The caret excerpt shows the line as written; the message itself
    // does not repeat the secret.
    let stderr = out.stderr();
    let messages: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("error:") || l.contains("help:"))
        .collect();
    assert!(
        messages.iter().all(|l| !l.contains("c2VjcmV0")),
        "{messages:?}"
    );
}

#[test]
fn push_uploads_even_where_runs_do_not() {
    let cache = HttpCache::start();
    let side = tempfile::tempdir().unwrap();
    let machine = Machine::new();
    let p = workspace(&cache.url(), &side.path().join("ran"), 2, &[]);
    let text = p
        .read("cairn.toml")
        .replace("trust = []", "trust = []\nupload = false");
    p.file("cairn.toml", &text);
    machine.cairn(&p, &["run"]).success();
    assert!(cache.files("ac").is_empty(), "the run uploaded nothing");
    let pushed = machine.cairn(&p, &["push"]);
    pushed.success();
    assert!(
        pushed
            .stdout()
            .contains("pushed 2 stage result(s) and 2 item outcome(s)"),
        "{}",
        pushed.stdout()
    );
    assert_eq!(cache.files("ac").len(), 4);
}

#[test]
fn a_remote_address_with_a_query_is_refused_where_it_is_written() {
    let side = tempfile::tempdir().unwrap();
    let p = workspace("http://cache/cairn?x=1", &side.path().join("ran"), 1, &[]);
    let out = p.cairn(&["status"]);
    out.code_is(2);
    assert!(
        out.stderr()
            .contains("`url` must not hold a query or a fragment"),
        "{}",
        out.stderr()
    );
}

#[test]
fn an_empty_output_file_is_uploaded_like_any_other() {
    let cache = HttpCache::start();
    let machine = Machine::new();
    let manifest = format!(
        "[pipeline]\nname = \"empty\"\n\n[cache.remote]\nurl = \"{}\"\n\n\
         [stages.make]\nrun = \": > {{out.empty}}; echo full > {{out.full}}\"\n\
         outputs = {{ empty = \"build/empty.txt\", full = \"build/full.txt\" }}\n",
        cache.url()
    );
    let a = Project::new();
    a.file("cairn.toml", &manifest);
    let first = machine.cairn(&a, &["run"]);
    first.success();
    assert!(
        !first.stderr().contains("takes no uploads") && !first.stderr().contains("not uploaded"),
        "{}",
        first.stderr()
    );
    // The empty blob is on the server, under the SHA-256 of no bytes.
    let empty_sha256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    assert!(
        cache.files("cas").iter().any(|f| f.ends_with(empty_sha256)),
        "{:?}",
        cache.files("cas")
    );

    let b = Project::new();
    b.file("cairn.toml", &manifest);
    let second = machine.cairn(&b, &["run"]);
    second.success();
    assert!(
        second.stderr().contains("make (from the remote cache)"),
        "{}",
        second.stderr()
    );
    assert_eq!(b.read("build/empty.txt"), "");
    assert_eq!(b.read("build/full.txt"), "full\n");
}

/// A result made from an input edited while its command ran is never
/// shared: the next machine, whose input is what the first one's key
/// hashed, runs the command itself instead of taking the wrong output.
#[test]
fn a_result_whose_input_changed_while_it_ran_is_never_shared() {
    let cache = HttpCache::start();
    let machine = Machine::new();
    let side = tempfile::tempdir().unwrap();
    let edit = side.path().join("edit");
    let ran = side.path().join("ran");
    let workspace = || {
        let p = Project::new();
        p.file("in.txt", "one\n");
        p.file(
            "cairn.toml",
            &format!(
                r#"
[pipeline]
name = "midway"

[cache.remote]
url = "{url}"
trust = []

[stages.copy]
run = "echo copy >> {ran}; if [ -e {edit} ]; then rm {edit}; echo two > {{in.l}}; fi; cat {{in.l}} > {{out.o}}"
inputs = {{ l = "in.txt" }}
outputs = {{ o = "out.txt" }}
"#,
                url = cache.url(),
                ran = ran.display(),
                edit = edit.display(),
            ),
        );
        p
    };
    let a = workspace();
    std::fs::write(&edit, "").unwrap();
    let first = machine.cairn(&a, &["run"]);
    first.code_is(1);
    assert!(
        first.stderr().contains("changed while"),
        "{}",
        first.stderr()
    );
    let b = workspace();
    let second = machine.cairn(&b, &["run"]);
    second.success();
    assert!(
        !second.stderr().contains("from the remote cache"),
        "a result made from other input was shared:\n{}",
        second.stderr()
    );
    assert_eq!(b.read("out.txt"), "one\n");
    assert_eq!(read_lines(&ran), ["copy", "copy"]);
}
