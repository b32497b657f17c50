//! Inputs fetched by URL and pinned by SHA-256 (`{ url = …, sha256 = … }`,
//! as Bazel's `http_file`, Nix's `fetchurl`, DVC's `import-url`).
//!
//! A stage's key holds the pin, not the bytes, so it is known on a machine
//! that never fetched them. When the stage runs, each of its fetched inputs
//! must be at [`Pin::path`] with the pinned SHA-256: a copy kept there by an
//! earlier run is hashed again and used (no network), anything else is
//! downloaded. The bytes are hashed as they stream into a file of their own
//! under `cache/fetched/tmp/`, which is moved into place only when whole
//! and right: a digest that differs is an error that keeps nothing. A 429,
//! a 5xx or a failed connection is tried again, twice, after 1 s and 2 s.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::Digest as _;

use crate::manifest::Pin;

/// How often a download is tried in all.
const TRIES: u32 = 3;

/// Makes every pin in `pins` present under `root`, fetching what is not.
/// The error names the input's URL (without credentials) and says why.
pub async fn ensure(root: &Path, pins: &[Pin]) -> Result<(), String> {
    for pin in pins {
        let dest = root.join(pin.path().as_str());
        let kept = dest.clone();
        let sha256 = pin.sha256.clone();
        let intact = tokio::task::spawn_blocking(move || file_sha256(&kept))
            .await
            .map_err(|e| e.to_string())?;
        match intact {
            Ok(found) if found == sha256 => continue,
            Ok(found) => {
                // Damaged since it was kept: fetched again.
                tracing::warn!(
                    "the copy of `{}` kept at {} has sha256 {found}, not the pinned {sha256}; fetching it again",
                    shown(&pin.url),
                    dest.display()
                );
                let _ = std::fs::remove_file(&dest);
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => return Err(format!("{}: {error}", dest.display())),
        }
        download(root, pin, &dest).await?;
    }
    Ok(())
}

/// Downloads `pin` to `dest`, verified; tried again on a busy or failing
/// server.
async fn download(root: &Path, pin: &Pin, dest: &Path) -> Result<(), String> {
    crate::tls::install_provider();
    let client = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .read_timeout(Duration::from_secs(60))
        .build()
        .map_err(|e| format!("cannot build an HTTP client: {e}"))?;
    let tmp_dir = root.join("cache/fetched/tmp");
    std::fs::create_dir_all(&tmp_dir).map_err(|e| format!("{}: {e}", tmp_dir.display()))?;
    let url = shown(&pin.url);
    let mut last = String::new();
    for attempt in 1..=TRIES {
        if attempt > 1 {
            tokio::time::sleep(Duration::from_secs(u64::from(attempt - 1))).await;
        }
        match fetch_once(&client, pin, &tmp_dir).await {
            Ok(tmp) => return place(&tmp, dest),
            Err(Failure::Final(why)) => return Err(format!("fetching {url}: {why}")),
            Err(Failure::Again(why)) => last = why,
        }
    }
    Err(format!("fetching {url}: {last} (tried {TRIES} times)"))
}

/// Why one try failed: for good, or worth another try.
enum Failure {
    Final(String),
    Again(String),
}

/// One try: the body streamed to a file of its own beside where it goes,
/// hashed as it comes; the file's path if the digest is the pinned one.
async fn fetch_once(
    client: &reqwest::Client,
    pin: &Pin,
    tmp_dir: &Path,
) -> Result<PathBuf, Failure> {
    use std::io::Write as _;
    let again = |e: reqwest::Error| Failure::Again(crate::causes::with_causes(&e.without_url()));
    let mut response = client.get(&pin.url).send().await.map_err(again)?;
    let status = response.status();
    if status.as_u16() == 429 || status.is_server_error() {
        return Err(Failure::Again(format!("the server answered {status}")));
    }
    if !status.is_success() {
        return Err(Failure::Final(format!("the server answered {status}")));
    }
    let tmp = tempfile::Builder::new()
        .prefix("fetch-")
        .tempfile_in(tmp_dir)
        .map_err(|e| Failure::Final(format!("{}: {e}", tmp_dir.display())))?;
    let mut file = std::io::BufWriter::with_capacity(1 << 20, tmp.as_file());
    let mut hasher = sha2::Sha256::new();
    while let Some(chunk) = response.chunk().await.map_err(again)? {
        hasher.update(&chunk);
        file.write_all(&chunk)
            .map_err(|e| Failure::Final(format!("{}: {e}", tmp.path().display())))?;
    }
    file.flush()
        .map_err(|e| Failure::Final(format!("{}: {e}", tmp.path().display())))?;
    drop(file);
    let found = crate::fingerprint::hex(&hasher.finalize());
    if found != pin.sha256 {
        // (The temporary file goes with `tmp`.)
        return Err(Failure::Final(format!(
            "its bytes have sha256 {found}, not the pinned {}; nothing was kept",
            pin.sha256
        )));
    }
    tmp.as_file()
        .sync_all()
        .map_err(|e| Failure::Final(format!("{}: {e}", tmp.path().display())))?;
    let (_, path) = tmp
        .keep()
        .map_err(|e| Failure::Final(format!("cannot keep the download: {e}")))?;
    Ok(path)
}

/// Moves a verified download into place, read-only (an input is read,
/// never written).
fn place(tmp: &Path, dest: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt as _;
    let Some(parent) = dest.parent() else {
        return Err(format!("{}: not a file's path", dest.display()));
    };
    std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    std::fs::set_permissions(tmp, std::fs::Permissions::from_mode(0o444))
        .map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(tmp, dest).map_err(|e| format!("{}: {e}", dest.display()))
}

/// The SHA-256 of the file at `path`, hex.
fn file_sha256(path: &Path) -> std::io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = sha2::Sha256::new();
    let mut buffer = vec![0; 1 << 20];
    loop {
        let n = file.read(&mut buffer)?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
    }
    Ok(crate::fingerprint::hex(&hasher.finalize()))
}

/// `url` as it may be shown: without a password in it.
fn shown(url: &str) -> String {
    super::shared_cache::without_credentials(url)
}
