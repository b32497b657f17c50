//! Inputs fetched by URL and pinned by SHA-256 (`{ url, sha256 }`): fetched
//! once from a real HTTP server, verified, kept, and read from the copy kept
//! with the server gone; a digest that differs is refused and keeps
//! nothing; a busy server is asked again.

mod common;

use std::path::{Path, PathBuf};
use std::process::Child;

use common::Project;
use sha2::Digest as _;

/// A real HTTP server (Python's) serving `dir` on a free loopback port. It
/// answers 503 to the first `busy` requests, and writes each request's path
/// to `dir/requests.log`.
struct Server {
    child: Child,
    port: u16,
    dir: PathBuf,
}

const SERVER: &str = r#"
import http.server, os, sys
directory, busy = sys.argv[1], int(sys.argv[2])
class Handler(http.server.SimpleHTTPRequestHandler):
    def __init__(self, *a, **k):
        super().__init__(*a, directory=directory, **k)
    def do_GET(self):
        global busy
        with open(os.path.join(directory, "requests.log"), "a") as log:
            log.write(self.path + "\n")
        if busy > 0:
            busy -= 1
            self.send_error(503, "busy")
            return
        super().do_GET()
    def log_message(self, *a):
        pass
server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
"#;

impl Server {
    fn start(dir: &Path, busy: u32) -> Server {
        let (child, port) =
            common::python_server(SERVER, &[dir.display().to_string(), busy.to_string()]);
        Server {
            child,
            port,
            dir: dir.to_owned(),
        }
    }

    fn url(&self, name: &str) -> String {
        format!("http://127.0.0.1:{}/{name}", self.port)
    }

    fn requests(&self) -> usize {
        std::fs::read_to_string(self.dir.join("requests.log")).map_or(0, |log| log.lines().count())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn sha256(bytes: &[u8]) -> String {
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A project whose stage `unpack` reads the file fetched from `url`.
fn project(url: &str, sha256: &str) -> Project {
    let p = Project::new();
    p.file("cairn.toml", &manifest(url, sha256));
    p
}

fn manifest(url: &str, sha256: &str) -> String {
    format!(
        r#"[pipeline]
name = "fetched"

[stages.unpack]
run = "cat {{in.sdist}} > {{out.o}}; echo ran >> runs.log"
inputs = {{ sdist = {{ url = "{url}", sha256 = "{sha256}" }} }}
outputs = {{ o = "out.txt" }}
"#
    )
}

const SDIST: &[u8] = b"pkg-1.0: the sources\n";

fn kept(p: &Project, sha256: &str) -> PathBuf {
    p.path(&format!("cache/fetched/sha256/{sha256}/pkg-1.0.tar.gz"))
}

#[test]
fn a_fetched_input_is_fetched_once_then_read_from_its_copy_with_the_server_gone() {
    let served = tempfile::tempdir().unwrap();
    std::fs::write(served.path().join("pkg-1.0.tar.gz"), SDIST).unwrap();
    let server = Server::start(served.path(), 0);
    let pin = sha256(SDIST);
    let p = project(&server.url("pkg-1.0.tar.gz"), &pin);

    // Known before anything is fetched: `status` asks no server.
    let status = p.cairn(&["status"]);
    assert!(status.stdout().contains("never run"), "{}", status.stdout());
    assert_eq!(server.requests(), 0);

    p.cairn(&["run"]).success();
    assert_eq!(p.read("out.txt").as_bytes(), SDIST);
    assert_eq!(server.requests(), 1);
    let copy = kept(&p, &pin);
    assert_eq!(std::fs::read(&copy).unwrap(), SDIST);
    assert!(
        std::fs::metadata(&copy).unwrap().permissions().readonly(),
        "a fetched input is kept read-only"
    );
    assert!(
        std::fs::read_dir(p.path("cache/fetched/tmp"))
            .unwrap()
            .next()
            .is_none(),
        "no download is left half-made"
    );

    // No network: the stage runs again from the copy kept.
    drop(server);
    let forced = p.cairn(&["run", "--force", "unpack"]);
    forced.success();
    assert_eq!(p.lines("runs.log").len(), 2, "{}", forced.stderr());
    assert_eq!(p.read("out.txt").as_bytes(), SDIST);
}

#[test]
fn the_key_holds_the_pin_so_a_mirror_reruns_nothing_and_a_new_pin_reruns() {
    let served = tempfile::tempdir().unwrap();
    std::fs::write(served.path().join("pkg-1.0.tar.gz"), SDIST).unwrap();
    std::fs::create_dir(served.path().join("mirror")).unwrap();
    std::fs::write(served.path().join("mirror/pkg-1.0.tar.gz"), SDIST).unwrap();
    let server = Server::start(served.path(), 0);
    let pin = sha256(SDIST);
    let p = project(&server.url("pkg-1.0.tar.gz"), &pin);
    p.cairn(&["run"]).success();

    // The same bytes from another URL: nothing to do.
    p.file(
        "cairn.toml",
        &manifest(&server.url("mirror/pkg-1.0.tar.gz"), &pin),
    );
    let status = p.cairn(&["status"]);
    assert!(
        status.stdout().contains("all 1 stage(s) fresh"),
        "{}",
        status.stdout()
    );

    // Another release: another pin, another file, and the stage runs.
    let newer = b"pkg-1.1: the sources\n";
    std::fs::write(served.path().join("pkg-1.0.tar.gz"), newer).unwrap();
    p.file(
        "cairn.toml",
        &manifest(&server.url("pkg-1.0.tar.gz"), &sha256(newer)),
    );
    p.cairn(&["run"]).success();
    assert_eq!(p.read("out.txt").as_bytes(), newer);
    assert_eq!(p.lines("runs.log").len(), 2);
}

#[test]
fn bytes_that_differ_from_the_pin_are_refused_and_nothing_is_kept() {
    let served = tempfile::tempdir().unwrap();
    std::fs::write(served.path().join("pkg-1.0.tar.gz"), b"tampered\n").unwrap();
    let server = Server::start(served.path(), 0);
    let pin = sha256(SDIST);
    let p = project(&server.url("pkg-1.0.tar.gz"), &pin);
    let run = p.cairn(&["run"]);
    assert_ne!(run.code(), 0);
    let err = run.stderr();
    assert!(
        err.contains(&format!("not the pinned {pin}")) && err.contains("nothing was kept"),
        "{err}"
    );
    assert!(!kept(&p, &pin).exists());
    assert!(
        std::fs::read_dir(p.path("cache/fetched/tmp"))
            .unwrap()
            .next()
            .is_none()
    );
    assert!(!p.exists("runs.log"), "the command never ran");

    // A copy kept and then damaged is fetched again, not used.
    std::fs::write(served.path().join("pkg-1.0.tar.gz"), SDIST).unwrap();
    p.cairn(&["run"]).success();
    let copy = kept(&p, &pin);
    let mut perms = std::fs::metadata(&copy).unwrap().permissions();
    #[allow(clippy::permissions_set_readonly_false)]
    perms.set_readonly(false);
    std::fs::set_permissions(&copy, perms).unwrap();
    let mut bytes = std::fs::read(&copy).unwrap();
    bytes[0] ^= 0x01;
    std::fs::write(&copy, &bytes).unwrap();
    let requests = server.requests();
    p.cairn(&["run", "--force", "unpack"]).success();
    assert_eq!(server.requests(), requests + 1, "fetched again");
    assert_eq!(std::fs::read(&copy).unwrap(), SDIST);
}

#[test]
fn a_busy_server_is_asked_again() {
    let served = tempfile::tempdir().unwrap();
    std::fs::write(served.path().join("pkg-1.0.tar.gz"), SDIST).unwrap();
    let server = Server::start(served.path(), 1);
    let p = project(&server.url("pkg-1.0.tar.gz"), &sha256(SDIST));
    let run = p.cairn(&["run"]);
    run.success();
    assert_eq!(server.requests(), 2, "a 503, then the file");
    assert_eq!(p.read("out.txt").as_bytes(), SDIST);

    // A file the server does not have is not asked for again.
    let p = project(&server.url("absent.tar.gz"), &sha256(SDIST));
    let before = server.requests();
    let run = p.cairn(&["run"]);
    assert_ne!(run.code(), 0);
    assert!(run.stderr().contains("404"), "{}", run.stderr());
    assert_eq!(server.requests(), before + 1);
}

#[test]
fn a_bad_pin_is_a_located_manifest_error() {
    for (input, expected) in [
        (
            r#"{ url = "http://example.org/x.tar.gz", sha256 = "abc" }"#,
            "is not a SHA-256 (64 lowercase hex digits)",
        ),
        (
            r#"{ url = "file:///etc/passwd", sha256 = "0000000000000000000000000000000000000000000000000000000000000000" }"#,
            "is not an http(s) URL",
        ),
        (
            r#"{ url = "http://example.org/x.tar.gz" }"#,
            "a fetched input needs both `url` and `sha256`",
        ),
        (
            r#"{ url = "http://example.org/x.tar.gz", sha256 = "0000000000000000000000000000000000000000000000000000000000000000", md5 = "x" }"#,
            "md5",
        ),
    ] {
        let p = Project::new();
        p.file(
            "cairn.toml",
            &format!(
                "[pipeline]\nname = \"bad\"\n\n[stages.a]\nrun = \"true\"\ninputs = {{ x = {input} }}\noutputs = [\"o\"]\n"
            ),
        );
        let status = p.cairn(&["status"]);
        status.code_is(2);
        assert!(
            status.stderr().contains(expected) && status.stderr().contains("cairn.toml:6"),
            "{input}: {}",
            status.stderr()
        );
    }
}
