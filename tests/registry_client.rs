//! `oci-mirror` against registries as they really behave: a real
//! `docker-registry` that asks for a password (htpasswd, `Basic`
//! challenges), tag lists in pages (this registry's version lists every tag
//! at once, so pages come from a proxy in front of it that pages them as
//! distribution 3, GHCR and Harbor do), a registry that is busy at first,
//! and a multi-platform image index of which one platform is copied.

mod common;

use std::process::{Child, Command};

use common::Project;
use common::registry::{Registry, layout, sha256};

/// A project mirroring one image from an OCI layout into `target`, one
/// shard, `quota` tags, with `extra` settings and `secrets`.
fn project(target: &str, quota: usize, extra: &str, secrets: &str) -> Project {
    let p = Project::new();
    layout(&p, "source", &["swesmith/one:base".to_owned()]);
    p.file(
        "images.jsonl",
        "{\"id\": \"t1\", \"image\": \"swesmith/one:base\"}\n",
    );
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
secrets = [{secrets}]
with = {{ source = "oci:{{in.layout}}", target = "{target}", shards = 1, quota = {quota}{extra} }}
"#
        ),
    );
    p
}

/// The one shard's repository under `/mirror`.
const SHARD: &str = "mirror/task-00";

#[test]
fn a_registry_that_asks_for_a_password_is_answered_from_its_challenge() {
    let registry = Registry::start_with_password("team", "s3cret-pass");
    let target = format!("http://127.0.0.1:{}/mirror", registry.port);
    let settings = r#", username_env = "REG_USER", password_env = "REG_PASS""#;
    let p = project(&target, 100, settings, r#""REG_USER", "REG_PASS""#);

    // Without the variables set: a clear error, nothing copied.
    let refused = p.cairn(&["run"]);
    refused.code_is(1);
    assert!(
        refused.stderr().contains("`REG_USER` is not set"),
        "{}",
        refused.stderr()
    );

    // A wrong password is refused by the registry.
    let wrong = p
        .command(&["run"])
        .env("REG_USER", "team")
        .env("REG_PASS", "not-it")
        .output()
        .unwrap();
    assert_eq!(wrong.status.code(), Some(1));

    let ok = p
        .command(&["run"])
        .env("REG_USER", "team")
        .env("REG_PASS", "s3cret-pass")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&ok.stderr);
    assert!(ok.status.success(), "{stderr}");
    assert!(!stderr.contains("s3cret-pass"));
    let rows: Vec<serde_json::Value> = p
        .read("state/mirrored.jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 1);
    // The registry holds it: asked with the password, by its digest.
    let manifest = Command::new("curl")
        .args([
            "-sf",
            "-u",
            "team:s3cret-pass",
            "-H",
            "Accept: application/vnd.oci.image.manifest.v1+json",
            &format!(
                "http://127.0.0.1:{}/v2/{SHARD}/manifests/{}",
                registry.port,
                rows[0]["digest"].as_str().unwrap()
            ),
        ])
        .output()
        .unwrap();
    assert!(manifest.status.success());
    assert_eq!(
        sha256(&manifest.stdout),
        rows[0]["digest"].as_str().unwrap()
    );
    // Nothing of the password reached the log or the ledger's records.
    let log = std::fs::read_dir(p.path("cache/logs"))
        .unwrap()
        .flat_map(|run| std::fs::read_dir(run.unwrap().path()).unwrap())
        .map(|f| std::fs::read_to_string(f.unwrap().path()).unwrap_or_default())
        .collect::<String>();
    assert!(!log.contains("s3cret-pass"));
}

/// A proxy in front of the registry on `upstream`: it answers 503 to the
/// first `busy` requests, pages `tags/list` by `n` (at most `page`) and
/// `last` with a `Link: <…>; rel="next"` on every full page, and counts the
/// requests it forwards.
struct Proxy {
    child: Child,
    port: u16,
    log: tempfile::NamedTempFile,
}

const PROXY: &str = r#"
import http.server, json, sys, urllib.parse, urllib.request
upstream, page, busy, log = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def handle_one(self):
        global busy
        with open(log, "a") as f:
            f.write(self.command + " " + self.path + "\n")
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        if busy > 0:
            busy -= 1
            self.send_response(503); self.send_header("Content-Length", "0"); self.end_headers()
            return
        url = urllib.parse.urlsplit(self.path)
        paging = self.command == "GET" and url.path.endswith("/tags/list")
        target = upstream + (url.path if paging else self.path)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
        request = urllib.request.Request(target, data=body, method=self.command, headers=headers)
        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *a, **k): return None
        try:
            response = urllib.request.build_opener(NoRedirect).open(request)
            status, rheaders, rbody = response.status, response.headers, response.read()
        except urllib.error.HTTPError as e:
            status, rheaders, rbody = e.code, e.headers, e.read()
        extra = {}
        if paging and status == 200:
            query = urllib.parse.parse_qs(url.query)
            n = min(int(query.get("n", [page])[0]), page)
            last = query.get("last", [""])[0]
            listing = json.loads(rbody)
            tags = sorted(t for t in (listing.get("tags") or []) if t > last)[:n]
            if len(tags) == n:
                extra["Link"] = '<%s?n=%d&last=%s>; rel="next"' % (url.path, n, tags[-1])
            rbody = json.dumps({"name": listing["name"], "tags": tags}).encode()
        self.send_response(status)
        for k, v in rheaders.items():
            if k.lower() not in ("content-length", "transfer-encoding", "connection", "date", "server"):
                self.send_header(k, v.replace(upstream, "http://127.0.0.1:%d" % self.server.server_port))
        for k, v in extra.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(rbody)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(rbody)
    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = handle_one
    def log_message(self, *a): pass
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
"#;

impl Proxy {
    fn start(registry: &Registry, page: usize, busy: usize) -> Proxy {
        let log = tempfile::NamedTempFile::new().unwrap();
        let args = [
            format!("http://127.0.0.1:{}", registry.port),
            page.to_string(),
            busy.to_string(),
            log.path().display().to_string(),
        ];
        let (child, port) = common::python_server(PROXY, &args);
        Proxy { child, port, log }
    }

    fn requests(&self, containing: &str) -> usize {
        std::fs::read_to_string(self.log.path())
            .unwrap()
            .lines()
            .filter(|l| l.contains(containing))
            .count()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `count` tags in the shard already, pushed straight to the registry.
fn fill_shard(registry: &Registry, count: usize) {
    for i in 0..count {
        registry.push(SHARD, &format!("old-{i:03}"), "already there");
    }
}

/// A run of `p` that the quota gate refuses, saying `why`.
fn refused_over_quota(p: &Project, why: &str) {
    let refused = p.cairn(&["run"]);
    refused.code_is(1);
    assert!(refused.stderr().contains(why), "{}", refused.stderr());
}

#[test]
fn the_quota_counts_every_page_of_tags_and_a_full_last_page_ends_the_list() {
    let registry = Registry::start();
    fill_shard(&registry, 101);
    let proxy = Proxy::start(&registry, 100, 0);
    let target = format!("http://127.0.0.1:{}/mirror", proxy.port);

    // 101 tags there, 1 new, a quota of 101: only the second page shows
    // that it would be 102.
    let p = project(&target, 101, "", "");
    refused_over_quota(&p, "101 tags there + 1 new = 102 > 101");
    assert_eq!(proxy.requests("/tags/list"), 2, "two pages");

    // Exactly one full page (100 tags, pages of 100): the next page is
    // empty and ends the list; 100 + 1 > 100 is refused, 101 fits.
    let registry = Registry::start();
    fill_shard(&registry, 100);
    let proxy = Proxy::start(&registry, 100, 0);
    let target = format!("http://127.0.0.1:{}/mirror", proxy.port);
    let p = project(&target, 100, "", "");
    refused_over_quota(&p, "100 tags there + 1 new = 101 > 100");
    assert_eq!(proxy.requests("/tags/list"), 2);
    let p = project(&target, 101, "", "");
    p.cairn(&["run"]).success();
}

#[test]
fn a_busy_registry_is_asked_again_and_one_that_stays_busy_is_infrastructure() {
    let registry = Registry::start();
    // Busy for the first two requests: each is asked again.
    let proxy = Proxy::start(&registry, 100, 2);
    let target = format!("http://127.0.0.1:{}/mirror", proxy.port);
    let p = project(&target, 100, "", "");
    p.cairn(&["run"]).success();
    let tags = registry.get(&format!("/v2/{SHARD}/tags/list"));
    assert!(tags.contains("baseanchor-"), "{tags}");

    // Busy for good: infrastructure, the built-in exits 75, after 3 tries.
    let proxy = Proxy::start(&registry, 100, 1_000);
    let target = format!("http://127.0.0.1:{}/other", proxy.port);
    let p = project(&target, 100, "", "");
    let failed = p.cairn(&["run"]);
    failed.code_is(1);
    let log = std::fs::read_dir(p.path("cache/logs"))
        .unwrap()
        .flat_map(|run| std::fs::read_dir(run.unwrap().path()).unwrap())
        .map(|f| std::fs::read_to_string(f.unwrap().path()).unwrap_or_default())
        .collect::<String>();
    assert!(
        log.contains("the registry answered 503 Service Unavailable")
            && log.contains("tried 3 times"),
        "{log}"
    );
    assert_eq!(proxy.requests("/tags/list"), 3);
    let show = p.cairn(&["show", "mirror", "--json"]);
    assert!(
        show.stdout().contains("\"exit_code\": 75") || show.stdout().contains("\"exit_code\":75"),
        "{}",
        show.stdout()
    );
}

#[test]
fn of_a_multi_platform_index_only_the_platform_asked_for_is_copied() {
    let p = Project::new();
    // Two images, then an index over both, named `swesmith/multi:base`.
    layout(
        &p,
        "source",
        &["amd/one:base".to_owned(), "arm/one:base".to_owned()],
    );
    let index: serde_json::Value = serde_json::from_str(&p.read("source/index.json")).unwrap();
    let mut children = index["manifests"].as_array().unwrap().clone();
    let platforms = [("linux", "amd64"), ("linux", "arm64")];
    for (child, (os, architecture)) in children.iter_mut().zip(platforms) {
        child["platform"] = serde_json::json!({"os": os, "architecture": architecture});
        child.as_object_mut().unwrap().remove("annotations");
    }
    let multi = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": children,
    })
    .to_string();
    let multi_digest = sha256(multi.as_bytes());
    p.file(
        &format!("source/blobs/sha256/{}", &multi_digest[7..]),
        &multi,
    );
    let top = serde_json::json!({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "digest": multi_digest, "size": multi.len(),
        "annotations": {"org.opencontainers.image.ref.name": "swesmith/multi:base"},
    }]});
    p.file("source/index.json", &top.to_string());
    p.file(
        "images.jsonl",
        "{\"id\": \"t1\", \"image\": \"swesmith/multi:base\"}\n",
    );
    let registry = Registry::start();
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
with = {{ source = "oci:{{in.layout}}", target = "http://127.0.0.1:{}/mirror", shards = 1 }}
"#,
            registry.port
        ),
    );
    p.cairn(&["run"]).success();
    let row: serde_json::Value =
        serde_json::from_str(p.read("state/mirrored.jsonl").lines().next().unwrap()).unwrap();
    let amd64 = children[0]["digest"].as_str().unwrap();
    assert_eq!(row["digest"], amd64, "the amd64 manifest, not the index");
    // Its layer is in the registry; the arm64 image's is not.
    let layer_of = |digest: &str| -> String {
        let manifest: serde_json::Value =
            serde_json::from_str(&p.read(&format!("source/blobs/sha256/{}", &digest[7..])))
                .unwrap();
        manifest["layers"][0]["digest"].as_str().unwrap().to_owned()
    };
    let has = |digest: &str| {
        Command::new("curl")
            .args([
                "-sf",
                "-I",
                &format!(
                    "http://127.0.0.1:{}/v2/{SHARD}/blobs/{digest}",
                    registry.port
                ),
            ])
            .output()
            .unwrap()
            .status
            .success()
    };
    assert!(has(&layer_of(amd64)));
    assert!(!has(&layer_of(children[1]["digest"].as_str().unwrap())));

    // A platform the index lacks is a clear error.
    let asked = p
        .read("cairn.toml")
        .replace("shards = 1", "shards = 1, platform = \"linux/s390x\"");
    p.file("cairn.toml", &asked);
    let refused = p.cairn(&["run"]);
    refused.code_is(1);
    assert!(
        refused.stderr().contains("no manifest for linux/s390x"),
        "{}",
        refused.stderr()
    );
}
