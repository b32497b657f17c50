//! A real OCI registry (`docker-registry serve` on a free loopback port)
//! and OCI image layouts to fill it from.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest as _, Sha256};

use super::Project;

pub fn sha256(bytes: &[u8]) -> String {
    format!(
        "sha256:{}",
        Sha256::digest(bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    )
}

/// Writes an OCI image layout at `root` with one tiny image per name.
pub fn layout(p: &Project, root: &str, names: &[String]) {
    let mut manifests = Vec::new();
    let blob = |bytes: &[u8]| -> (String, usize) {
        let digest = sha256(bytes);
        let path = format!("{root}/blobs/sha256/{}", &digest[7..]);
        std::fs::create_dir_all(p.path(&format!("{root}/blobs/sha256"))).unwrap();
        std::fs::write(p.path(&path), bytes).unwrap();
        (digest, bytes.len())
    };
    for name in names {
        let (layer, layer_size) = blob(format!("layer of {name}\n").as_bytes());
        let (config, config_size) = blob(
            serde_json::json!({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": [layer]}})
                .to_string()
                .as_bytes(),
        );
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config, "size": config_size},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": layer, "size": layer_size}],
        })
        .to_string();
        let (digest, size) = blob(manifest.as_bytes());
        manifests.push(serde_json::json!({
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": digest, "size": size,
            "annotations": {"org.opencontainers.image.ref.name": name},
        }));
    }
    p.file(
        &format!("{root}/index.json"),
        &serde_json::json!({"schemaVersion": 2, "manifests": manifests}).to_string(),
    );
    p.file(
        &format!("{root}/oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    );
}

/// Whether a registry on `port` answers `GET /v2/` with 200.
fn answers_api_root(port: u16) -> bool {
    use std::io::{Read as _, Write as _};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    if stream
        .write_all(b"GET /v2/ HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).is_ok()
        && head.starts_with(b"HTTP/1.")
        && (&head[9..12] == b"200" || &head[9..12] == b"401")
}

/// A `docker-registry serve` on a free port, stopped when dropped.
pub struct Registry {
    child: Child,
    pub port: u16,
    _data: tempfile::TempDir,
}

impl Registry {
    pub fn start() -> Registry {
        Self::start_with(None)
    }

    /// A registry that asks for `user` and `password` (`htpasswd`, bcrypt:
    /// `Basic` challenges on every API call).
    #[allow(dead_code)]
    pub fn start_with_password(user: &str, password: &str) -> Registry {
        Self::start_with(Some((user, password)))
    }

    fn start_with(auth: Option<(&str, &str)>) -> Registry {
        let data = tempfile::tempdir().unwrap();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let config = data.path().join("config.yml");
        let mut text = format!(
            "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
            data.path().join("data").display()
        );
        if let Some((user, password)) = auth {
            // bcrypt, as the registry requires, by the C library's crypt(3).
            let hashed = Command::new("python3")
                .args([
                    "-W",
                    "ignore",
                    "-c",
                    "import crypt, sys; print(crypt.crypt(sys.argv[1], crypt.mksalt(crypt.METHOD_BLOWFISH)))",
                    password,
                ])
                .output()
                .unwrap();
            assert!(hashed.status.success(), "bcrypt a password");
            let line = format!(
                "{user}:{}",
                String::from_utf8(hashed.stdout).unwrap().trim()
            );
            let htpasswd = data.path().join("htpasswd");
            std::fs::write(&htpasswd, line + "\n").unwrap();
            text.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: cairn-test\n    path: {}\n",
                htpasswd.display()
            ));
        }
        std::fs::write(&config, text).unwrap();
        super::require_tool("docker-registry");
        super::require_tool("curl");
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start docker-registry");
        // Ready when it answers the API root.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !answers_api_root(port) {
            assert!(Instant::now() < deadline, "the registry did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        Registry {
            child,
            port,
            _data: data,
        }
    }

    pub fn get(&self, path: &str) -> String {
        let out = Command::new("curl")
            .args(["-sf", &format!("http://127.0.0.1:{}{path}", self.port)])
            .output()
            .unwrap();
        assert!(out.status.success(), "GET {path} failed");
        String::from_utf8(out.stdout).unwrap()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Registry {
    /// Pushes a tiny image made from `seed` as `repo:tag` (moving the tag
    /// if it exists); its manifest digest.
    pub fn push(&self, repo: &str, tag: &str, seed: &str) -> String {
        cairn::tls::install_provider();
        let client = reqwest::blocking::Client::new();
        let base = format!("http://127.0.0.1:{}/v2/{repo}", self.port);
        let upload = |bytes: &[u8]| -> (String, usize) {
            let digest = sha256(bytes);
            let started = client
                .post(format!("{base}/blobs/uploads/"))
                .send()
                .unwrap();
            assert_eq!(started.status(), 202, "start an upload");
            let location = started.headers()["location"].to_str().unwrap().to_owned();
            let location = if location.starts_with("http") {
                location
            } else {
                format!("http://127.0.0.1:{}{location}", self.port)
            };
            let separator = if location.contains('?') { '&' } else { '?' };
            let done = client
                .put(format!("{location}{separator}digest={digest}"))
                .body(bytes.to_vec())
                .send()
                .unwrap();
            assert_eq!(done.status(), 201, "finish an upload");
            (digest, bytes.len())
        };
        let (layer, layer_size) = upload(format!("layer of {seed}\n").as_bytes());
        let config = serde_json::json!({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": [layer]}}).to_string();
        let (config, config_size) = upload(config.as_bytes());
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config, "size": config_size},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": layer, "size": layer_size}],
        })
        .to_string();
        let put = client
            .put(format!("{base}/manifests/{tag}"))
            .header("content-type", "application/vnd.oci.image.manifest.v1+json")
            .body(manifest.clone())
            .send()
            .unwrap();
        assert_eq!(put.status(), 201, "push the manifest");
        sha256(manifest.as_bytes())
    }
}
