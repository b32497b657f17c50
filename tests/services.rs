//! `[services]`: a server brought up for the stages that reach it, with real
//! processes on real ports — started only when such a stage runs, checked
//! before any command, stopped when its last stage ends, reaped after a
//! `kill -9`, and replaced by a running server's address under a profile.

mod common;

use std::process::{Child, Stdio};

use common::{Project, is_gone, wait_for};

/// A tiny HTTP server: `serve.py PORT` answers every GET with `hello`, and
/// notes its start and its pid.
const SERVER: &str = r#"import http.server, os, sys
with open("starts.log", "a") as f:
    f.write(f"{os.getpid()}\n")
class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"hello\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Hello).serve_forever()
"#;

/// The stage command that fetches `$WEB`.
const FETCH: &str = r#"python3 -c 'import os, urllib.request; print(urllib.request.urlopen(os.environ["WEB"]).read().decode().strip())'"#;

fn project(service: &str, stages: &str) -> Project {
    let p = Project::new();
    p.file("serve.py", SERVER);
    p.file(
        "cairn.toml",
        &format!("[pipeline]\nname = \"services\"\n\n{service}\n{stages}"),
    );
    p
}

/// `fetch` reads the service `web`; `after`, which needs none, writes
/// whether the service's process (its pid in `starts.log`) still runs.
fn fetch_then_ask_if_it_runs() -> String {
    format!(
        r#"[stages.fetch]
run = '''{FETCH} > {{out.o}}'''
outputs = {{ o = "fetched.txt" }}
services = ["web"]

[stages.after]
run = "if kill -0 $(cat starts.log) 2>/dev/null; then echo running; else echo gone; fi > {{out.o}}"
inputs = {{ x = "fetched.txt" }}
outputs = {{ o = "after.txt" }}
"#
    )
}

const WEB: &str = r#"[services.web]
run = "exec python3 serve.py {service.port}"
url = "http://127.0.0.1:{service.port}/"
env = "WEB"
"#;

fn starts(p: &Project) -> Vec<i32> {
    p.lines("starts.log")
        .iter()
        .map(|l| l.parse().unwrap())
        .collect()
}

#[test]
fn a_service_comes_up_for_the_stage_that_runs_and_is_gone_once_its_last_stage_ended() {
    let stages = fetch_then_ask_if_it_runs();
    let p = project(WEB, &stages);
    p.cairn(&["run"]).success();
    assert_eq!(
        p.read("fetched.txt"),
        "hello\n",
        "the stage reached the server"
    );
    assert_eq!(
        p.read("after.txt"),
        "gone\n",
        "stopped when its last stage ended, before the next stage ran"
    );
    let pids = starts(&p);
    assert_eq!(pids.len(), 1);
    assert!(is_gone(pids[0]));

    // Nothing to run: the server is not started at all.
    let again = p.cairn(&["run"]);
    again.success();
    assert!(
        again.stderr().contains("0 ran, 2 fresh"),
        "{}",
        again.stderr()
    );
    assert_eq!(starts(&p).len(), 1, "a fresh stage starts no service");

    // `show` says which service a stage reaches, and how.
    let show = p.cairn(&["show", "fetch"]);
    show.success();
    assert!(
        show.stdout().contains(
            "service      web: http://127.0.0.1:{service.port}/ as $WEB (started by cairn)"
        ),
        "{}",
        show.stdout()
    );
    let json: serde_json::Value =
        serde_json::from_str(&p.cairn(&["show", "fetch", "--json"]).stdout()).unwrap();
    assert!(
        json["services"]["web"].as_str().unwrap().contains("$WEB"),
        "{json}"
    );
    assert!(!p.cairn(&["show", "after"]).stdout().contains("service"));
}

#[test]
fn a_service_that_exits_before_it_is_ready_fails_its_stage_with_its_log_and_runs_nothing() {
    let service = r#"[services.web]
run = "echo cannot load the weights >&2; exit 3"
url = "http://127.0.0.1:{service.port}/"
env = "WEB"
"#;
    let stages = r#"[stages.fetch]
run = "touch ran && echo x > {out.o}"
outputs = { o = "fetched.txt" }
services = ["web"]
"#;
    let p = project(service, stages);
    let out = p.cairn(&["run"]);
    out.code_is(1);
    let stderr = out.stderr();
    assert!(
        stderr.contains("service `web` exited (exit status: 3) before it was ready")
            && stderr.contains("cannot load the weights"),
        "{stderr}"
    );
    assert!(!p.exists("ran"), "no command of the stage ran");
}

#[test]
fn a_failed_check_keeps_every_command_from_running_and_stops_the_server() {
    let service = format!(
        "{WEB}check = '''python3 -c 'import os; print(\"serving\", os.environ[\"WEB\"])' && echo served model is not the declared checkpoint >&2 && exit 1'''\n"
    );
    let stages = r#"[stages.fetch]
run = "touch ran && echo x > {out.o}"
outputs = { o = "fetched.txt" }
services = ["web"]

[stages.other]
run = "touch other-ran && echo x > {out.o}"
outputs = { o = "other.txt" }
services = ["web"]
"#;
    let p = project(&service, stages);
    let out = p.cairn(&["run", "--keep-going"]);
    out.code_is(1);
    let stderr = out.stderr();
    assert!(
        stderr.contains("service `web` failed its check (exit status: 1)")
            && stderr.contains("served model is not the declared checkpoint")
            && stderr.contains("serving http://127.0.0.1:"),
        "{stderr}"
    );
    assert!(stderr.contains("2 failed"), "both stages failed: {stderr}");
    assert!(!p.exists("ran") && !p.exists("other-ran"));
    let pids = starts(&p);
    assert_eq!(pids.len(), 1, "brought up once for both stages");
    assert!(is_gone(pids[0]), "stopped when the run ended");
}

#[test]
fn a_profile_points_a_service_at_a_server_already_running() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let service = format!(
        "{WEB}\n[profiles.remote]\nservices.web = {{ url = \"http://127.0.0.1:{port}/\", start_timeout = \"2s\" }}\n"
    );
    let stages = format!(
        r#"[stages.fetch]
run = '''{FETCH} > {{out.o}}'''
outputs = {{ o = "fetched.txt" }}
services = ["web"]
"#
    );
    let p = project(&service, &stages);

    // Nothing listens there yet: a clear failure, no command run.
    let down = p.cairn(&["--profile", "remote", "run"]);
    down.code_is(1);
    assert!(
        down.stderr().contains(&format!(
            "service `web` was not ready within 2s (http://127.0.0.1:{port}/"
        )),
        "{}",
        down.stderr()
    );
    assert!(!p.exists("fetched.txt"));

    let mut server: Child = std::process::Command::new("python3")
        .arg("serve.py")
        .arg(port.to_string())
        .current_dir(p.root())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for("the server to start", || !starts(&p).is_empty());
    let up = p.cairn(&["--profile", "remote", "run"]);
    let _ = server.kill();
    let _ = server.wait();
    up.success();
    assert_eq!(p.read("fetched.txt"), "hello\n");
    assert_eq!(starts(&p).len(), 1, "cairn started no server of its own");
}

#[test]
fn kill_9_of_cairn_leaves_a_service_that_the_next_run_reaps() {
    let stages = r#"[stages.wait]
run = "touch waiting; while [ ! -f release ]; do sleep 0.02; done; echo x > {out.o}"
outputs = { o = "waited.txt" }
services = ["web"]
"#;
    let p = project(WEB, stages);
    let mut cairn = p
        .command(&["run"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for("the stage to run", || p.exists("waiting"));
    let server = starts(&p)[0];
    cairn.kill().unwrap(); // SIGKILL
    cairn.wait().unwrap();
    assert!(!is_gone(server), "the server outlived the killed cairn");

    p.file("release", "");
    p.cairn(&["run"]).success();
    assert!(
        is_gone(server),
        "the next run reaped the server left behind"
    );
    let pids = starts(&p);
    assert_eq!(pids.len(), 2, "the next run brought up its own");
    assert!(is_gone(pids[1]));
}

#[test]
fn services_are_checked_where_they_are_written() {
    let service = r#"[services.web]
run = "serve --model {params.missing}"
url = "http://127.0.0.1:{service.port}/"
env = "1WEB"

[services.gateway]
url = "http://127.0.0.1:{service.port}/"

[services."../escape"]
url = "http://127.0.0.1:8000/"

[services.keyed]
url = "http://alice:s3cret@gpu:8000/v1"

[profiles.gpu]
services.webb = { url = "http://gpu:8000/v1" }
"#;
    let stages = r#"[stages.fetch]
run = "echo {service.port}"
services = ["wbe"]
"#;
    let p = project(service, stages);
    let out = p.cairn(&["status"]);
    out.code_is(2);
    let stderr = out.stderr();
    for expected in [
        "service `web` cannot fill `{params.missing}`",
        "invalid environment variable name `1WEB`",
        "service `gateway` has `{service.port}` in its `url` but no `run`",
        "profile `gpu` replaces undeclared service `webb`",
        "stage `fetch` uses undeclared service `wbe`",
        "invalid service name `../escape`",
        "service `keyed` has credentials in its `url`",
        "`{service.port}` in stage `fetch`",
    ] {
        assert!(stderr.contains(expected), "{expected}: {stderr}");
    }
}

#[test]
fn a_services_secret_reaches_its_processes_and_no_log_or_message() {
    let service = r#"[services.web]
run = "echo starting with key $API_KEY; exec python3 serve.py {service.port}"
url = "http://127.0.0.1:{service.port}/"
env = "WEB"
secrets = ["API_KEY"]
check = "echo checking with key $API_KEY; test -n \"$API_KEY\" && exit 1"
"#;
    let stages = r#"[stages.fetch]
run = "echo x > {out.o}"
outputs = { o = "fetched.txt" }
services = ["web"]
"#;
    let p = project(service, stages);
    let secret = "sk-live-0123456789abcdef";
    let out = p
        .command(&["run"])
        .env("API_KEY", secret)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("checking with key [redacted API_KEY]"),
        "the check saw the key, the message does not: {stderr}"
    );
    assert!(!stderr.contains(secret), "{stderr}");
    let log = p.read("cache/logs/1/services/web.log");
    assert!(
        log.contains("starting with key [redacted API_KEY]") && !log.contains(secret),
        "{log}"
    );
}

#[test]
fn a_service_coming_up_holds_up_no_other_service() {
    // `slow` comes up only once the stage using `fast` has run: with one
    // lock over every service, neither would ever come up.
    let service = r#"[services.slow]
run = "while [ ! -f fast-done ]; do sleep 0.02; done; exec python3 serve.py {service.port}"
url = "http://127.0.0.1:{service.port}/"
env = "WEB"
start_timeout = "30s"

[services.fast]
run = "exec python3 serve.py {service.port}"
url = "http://127.0.0.1:{service.port}/"
env = "WEB"
"#;
    let stages = format!(
        r#"[stages.a]
run = '''{FETCH} > {{out.o}}'''
outputs = {{ o = "a.txt" }}
services = ["slow"]

[stages.b]
run = '''{FETCH} > {{out.o}} && touch fast-done'''
outputs = {{ o = "b.txt" }}
services = ["fast"]
"#
    );
    let p = project(service, &stages);
    p.cairn(&["run", "-j", "2"]).success();
    assert_eq!(p.read("a.txt"), "hello\n");
    assert_eq!(p.read("b.txt"), "hello\n");
}

#[test]
fn a_service_that_dies_while_its_stage_runs_fails_the_stage() {
    let stages = r#"[stages.use]
run = "kill $(head -1 starts.log); sleep 0.5; echo done > {out.o}"
outputs = { o = "used.txt" }
services = ["web"]
"#;
    let p = project(WEB, stages);
    let out = p.cairn(&["run"]);
    out.code_is(1);
    assert!(
        out.stderr()
            .contains("service `web` exited (signal: 15 (SIGTERM)) while its stages ran"),
        "{}",
        out.stderr()
    );
    let status = p.cairn(&["status"]);
    assert!(
        !status
            .stdout()
            .lines()
            .any(|l| l.starts_with("use ") && l.contains("fresh")),
        "{}",
        status.stdout()
    );
}

#[test]
fn a_server_under_a_shell_that_ignores_sigterm_is_killed_before_the_next_stage() {
    let service = r#"[services.web]
run = '''echo starting; python3 -c 'import signal, runpy, sys; signal.signal(signal.SIGTERM, signal.SIG_IGN); sys.argv = ["serve.py", "{service.port}"]; runpy.run_path("serve.py")' '''
url = "http://127.0.0.1:{service.port}/"
env = "WEB"
"#;
    let stages = fetch_then_ask_if_it_runs();
    // The server is not cairn's child here (the shell is): once killed,
    // it may linger as a zombie nobody reaps, which no longer runs.
    let stages = stages.replace(
        "if kill -0 $(cat starts.log) 2>/dev/null; then",
        "pid=$(cat starts.log); if [ -e /proc/$pid ] && [ \\\"$(cut -d' ' -f3 /proc/$pid/stat)\\\" != Z ]; then",
    );
    let p = project(service, &stages);
    p.cairn(&["run"]).success();
    assert_eq!(p.read("fetched.txt"), "hello\n");
    assert_eq!(p.read("after.txt"), "gone\n");
}

#[test]
fn the_port_is_filled_in_ready_and_check_too() {
    let service = r#"[services.web]
run = "exec python3 serve.py {service.port}"
url = "http://127.0.0.1:{service.port}/v1"
ready = "http://127.0.0.1:{service.port}/health"
env = "WEB"
check = '''python3 -c 'import urllib.request; print("check", urllib.request.urlopen("http://127.0.0.1:{service.port}/").read().decode().strip(), "{{braces}}")' '''
"#;
    let stages = r#"[stages.fetch]
run = "echo $WEB > {out.o}"
outputs = { o = "url.txt" }
services = ["web"]
"#;
    let p = project(service, stages);
    p.cairn(&["run"]).success();
    assert!(
        p.read("url.txt").ends_with("/v1\n"),
        "{}",
        p.read("url.txt")
    );
    let log = p.read("cache/logs/1/services/web.log");
    assert!(log.contains("check hello {braces}"), "{log}");
}

#[test]
fn a_check_that_hangs_is_killed_with_its_children() {
    let service = format!(
        "{WEB}check = \"sleep 777 & echo $! > check-child.pid; wait\"\nstart_timeout = \"2s\"\n"
    );
    let stages = r#"[stages.fetch]
run = "touch ran"
services = ["web"]
"#;
    let p = project(&service, stages);
    let out = p.cairn(&["run"]);
    out.code_is(1);
    assert!(
        out.stderr().contains("check did not finish in the "),
        "{}",
        out.stderr()
    );
    let child: i32 = p.read("check-child.pid").trim().parse().unwrap();
    // Killed (SIGKILL) as the check is dropped; its death comes a moment
    // later, which a loaded machine can stretch past cairn's exit.
    wait_for("the check's child to be killed", || is_gone(child));
    assert!(!p.exists("ran"));
}

/// A server of one group: `group.py PORT GROUP` answers every GET with its
/// group, and notes `up GROUP PID` when it starts and `down GROUP` when
/// SIGTERM stops it.
const GROUP_SERVER: &str = r#"import http.server, os, signal, sys
port, group = int(sys.argv[1]), sys.argv[2]
def note(line):
    with open("servers.log", "a") as f:
        f.write(line + "\n")
def stop(*_):
    note(f"down {group}")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
class Group(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = (group + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", port), Group)
note(f"up {group} {os.getpid()}")
server.serve_forever()
"#;

#[test]
fn a_per_group_service_serves_each_group_alone_and_stops_before_the_next_starts() {
    let p = Project::new();
    p.file("group.py", GROUP_SERVER);
    let items: String = ["m1", "m2"]
        .iter()
        .flat_map(|m| {
            (0..3).map(move |t| {
                format!(
                    "{{\"key\": \"{m}-t{t}\", \"model\": \"{m}\", \"smoke\": {}}}\n",
                    t == 0
                )
            })
        })
        .collect();
    p.file("items.jsonl", &items);
    p.file(
        "cairn.toml",
        &format!(
            r#"[pipeline]
name = "groups"

[services.server]
per_group = true
run = "exec python3 group.py {{service.port}} {{service.group}}"
url = "http://127.0.0.1:{{service.port}}/"
env = "SERVER"

[stages.trials]
foreach = {{ items = "items.jsonl", key = "key" }}
isolate = {{ by = "model", one_at_a_time = true }}
services = ["server"]
run = '''mkdir -p out && {FETCH_SERVER} > out/{{item.key}}.txt'''
outputs = {{ results = "trials.jsonl" }}
"#
        ),
    );
    p.cairn(&["run"]).success();
    // Each group's items reached that group's own server.
    for m in ["m1", "m2"] {
        for t in 0..3 {
            assert_eq!(p.read(&format!("out/{m}-t{t}.txt")), format!("{m}\n"));
        }
    }
    // One server at a time: m1's stopped before m2's came up; m2's
    // stopped when the stage ended.
    let log: Vec<String> = p
        .lines("servers.log")
        .iter()
        .map(|l| l.split(' ').take(2).collect::<Vec<_>>().join(" "))
        .collect();
    assert_eq!(log, ["up m1", "down m1", "up m2", "down m2"], "{log:?}");
    // Nothing changed: no server starts.
    p.cairn(&["run"]).success();
    assert_eq!(p.lines("servers.log").len(), 4);
}

#[test]
fn a_per_group_service_needs_items_run_group_by_group() {
    let p = Project::new();
    p.file("items.jsonl", "{\"key\": \"a\", \"model\": \"m\"}\n");
    p.file(
        "cairn.toml",
        r#"[pipeline]
name = "groups"

[services.server]
per_group = true
run = "exec python3 group.py {service.port} {service.group}"
url = "http://127.0.0.1:{service.port}/"

[services.shared]
run = "exec python3 group.py {service.port} {service.group}"
url = "http://127.0.0.1:{service.port}/"

[stages.trials]
foreach = { items = "items.jsonl", key = "key" }
services = ["server"]
run = "true"
outputs = { results = "trials.jsonl" }
"#,
    );
    let out = p.cairn(&["run"]);
    out.code_is(2);
    assert!(
        out.stderr().contains("stage `trials` uses `server`, which serves one group at a time, but does not run its items group by group"),
        "{}",
        out.stderr()
    );
    assert!(
        out.stderr()
            .contains("service `shared` has `{service.group}` but serves every group at once"),
        "{}",
        out.stderr()
    );
}

/// The stage command that fetches `$SERVER`.
const FETCH_SERVER: &str = r#"python3 -c 'import os, urllib.request; print(urllib.request.urlopen(os.environ["SERVER"]).read().decode().strip())'"#;

#[test]
fn a_service_that_needs_gpus_is_not_started_without_them() {
    let p = project(
        r#"[services.web]
run = "exec python3 serve.py {service.port}"
url = "http://127.0.0.1:{service.port}/"
env = "WEB"
gpus = { count = 2, memory_gib = 40 }
"#,
        &format!(
            r#"[stages.fetch]
run = '''{FETCH} > {{out.o}}'''
outputs = {{ o = "fetched.txt" }}
services = ["web"]
"#
        ),
    );
    // An `nvidia-smi` that lists what this test says: two 80 GiB GPUs,
    // one of them nearly full.
    std::fs::create_dir_all(p.path("bin")).unwrap();
    let smi = p.path("bin/nvidia-smi");
    std::fs::write(&smi, "#!/bin/sh\ncat \"$(dirname \"$0\")/gpus.csv\"\n").unwrap();
    std::fs::set_permissions(&smi, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    p.file(
        "bin/gpus.csv",
        "0, NVIDIA A100-SXM4-80GB, 81920, 1024\n1, NVIDIA A100-SXM4-80GB, 81920, 71680\n",
    );
    let path = format!(
        "{}:{}",
        p.path("bin").display(),
        std::env::var("PATH").unwrap()
    );
    let run = |p: &Project| {
        let output = p
            .command(&["run"])
            .env("PATH", &path)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        common::Run { output }
    };
    let out = run(&p);
    out.code_is(1);
    assert!(
        out.stderr().contains(
            "service `web` needs 2 GPU(s) with 40 GiB free each; this machine has 1 such: GPU 0 (NVIDIA A100-SXM4-80GB, 79.0 GiB free of 80.0), GPU 1 (NVIDIA A100-SXM4-80GB, 10.0 GiB free of 80.0)"
        ),
        "{}",
        out.stderr()
    );
    assert!(starts(&p).is_empty(), "the server was never started");
    // The other job finished: both GPUs free.
    p.file(
        "bin/gpus.csv",
        "0, NVIDIA A100-SXM4-80GB, 81920, 1024\n1, NVIDIA A100-SXM4-80GB, 81920, 2048\n",
    );
    run(&p).success();
    assert_eq!(p.read("fetched.txt"), "hello\n");
}
