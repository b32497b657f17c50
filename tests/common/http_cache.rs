//! A real HTTP cache: nginx with WebDAV (`PUT`, `DELETE`, nested paths
//! created) on a free loopback port, in a temp dir, stopped when dropped.
//! One process (`master_process off`), so killing it stops the server.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct HttpCache {
    child: Option<Child>,
    pub port: u16,
    dir: tempfile::TempDir,
}

impl HttpCache {
    pub fn start() -> HttpCache {
        super::require_tool("nginx");
        let dir = tempfile::tempdir().unwrap();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut cache = HttpCache {
            child: None,
            port,
            dir,
        };
        cache.spawn();
        cache
    }

    fn spawn(&mut self) {
        let d = self.dir.path();
        for sub in ["root", "tmp", "logs"] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
        }
        let config = d.join("nginx.conf");
        std::fs::write(
            &config,
            format!(
                "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/logs/error.log warn;\n\
                 events {{ worker_connections 512; }}\n\
                 http {{\n  access_log {d}/logs/access.log;\n  client_body_temp_path {d}/tmp;\n\
                   proxy_temp_path {d}/tmp; fastcgi_temp_path {d}/tmp; uwsgi_temp_path {d}/tmp; scgi_temp_path {d}/tmp;\n\
                   server {{\n    listen 127.0.0.1:{port};\n    root {d}/root;\n    client_max_body_size 0;\n\
                     location / {{ dav_methods PUT DELETE; create_full_put_path on; dav_access user:rw group:rw all:r; }}\n  }}\n}}\n",
                d = d.display(),
                port = self.port,
            ),
        )
        .unwrap();
        let child = Command::new("nginx")
            .args(["-c", &config.to_string_lossy(), "-p", &d.to_string_lossy()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nginx");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "nginx did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/cairn", self.port)
    }

    /// Where the server keeps what it was sent.
    pub fn root(&self) -> PathBuf {
        self.dir.path().join("root").join("cairn")
    }

    /// Every stored file under `sub` (`ac` or `cas`).
    pub fn files(&self, sub: &str) -> Vec<PathBuf> {
        let dir = self.root().join(sub);
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map(|entries| entries.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        files.sort();
        files
    }

    /// Requests the server logged, one line each.
    pub fn requests(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("logs").join("access.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Kills the server (`kill -9`): connections are refused from now on.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for HttpCache {
    fn drop(&mut self) {
        self.kill();
    }
}
