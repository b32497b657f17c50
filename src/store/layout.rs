//! Every path under `cache/`, named once, with the one room that writes it.
//! Nothing else joins a name onto the cache directory.
//!
//! | path | what it holds | written by |
//! |---|---|---|
//! | `ledger.db` (`-wal`, `-shm`) | results, runs, attempts, the fresh proof, the stat cache | `store::ledger` |
//! | `objects/`, `trees/`, `tmp/` | stored outputs by content, directory listings, copies being made | `store::objects` |
//! | `lock` | the workspace lock: one writer at a time | `store::workspace_lock` |
//! | `reserve` | room kept to close a run on a full disk | `store::reserve` |
//! | `workspace-id` | this checkout's own id, in its job names | [`workspace_id`] |
//! | `logs/RUN/` | a run's logs: each stage's, each item's, `services/` | `exec` (each job its own log), `schedule::services` |
//! | `batches/` | the Slurm batches a run submitted, to re-attach to | `exec::batch` |
//! | `windows/` | the files that keep Slurm windows alive | `exec::slurm::window` |
//! | `fetched/sha256/HEX/NAME`, `fetched/tmp/` | inputs fetched by URL, by their pinned SHA-256 (named by `manifest::Pin::path`: a stage's input path is known before any store), downloads being made | `store::fetched` |

use std::path::{Path, PathBuf};

/// The cache directory of the project at `root` (as `Manifest::cache_dir`
/// says, for what knows only the root: a job, a proof).
pub fn cache(root: &Path) -> PathBuf {
    root.join("cache")
}

/// The ledger's database.
pub fn ledger(cache: &Path) -> PathBuf {
    cache.join("ledger.db")
}

/// The stored objects (files by content).
pub fn objects(cache: &Path) -> PathBuf {
    cache.join("objects")
}

/// The directory listings of stored directory outputs.
pub fn trees(cache: &Path) -> PathBuf {
    cache.join("trees")
}

/// Where stored copies are made before they are moved into place.
pub fn staging(cache: &Path) -> PathBuf {
    cache.join("tmp")
}

/// The workspace lock.
pub fn workspace_lock(cache: &Path) -> PathBuf {
    cache.join("lock")
}

/// The room kept beside the ledger.
pub fn reserve(cache: &Path) -> PathBuf {
    cache.join("reserve")
}

/// Run `run_id`'s logs.
pub fn run_logs(cache: &Path, run_id: i64) -> PathBuf {
    cache.join("logs").join(run_id.to_string())
}

/// The records of Slurm batches submitted from the project at `root`.
pub fn batches(root: &Path) -> PathBuf {
    cache(root).join("batches")
}

/// The files that keep Slurm windows of the project at `root` alive.
pub fn windows(root: &Path) -> PathBuf {
    cache(root).join("windows")
}

/// This checkout's own id: made by its first run (from the host, the
/// process, the time and the cache's path), kept in `cache/workspace-id`,
/// and the same for every later run of the checkout. Two checkouts at one
/// path on two machines (CI runners) get two ids. Empty if the cache
/// cannot keep one.
pub fn workspace_id(cache: &Path) -> String {
    let path = cache.join("workspace-id");
    let read = |path: &Path| {
        std::fs::read_to_string(path)
            .ok()
            .map(|text| text.trim().to_owned())
            .filter(|id| id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()))
    };
    if let Some(id) = read(&path) {
        return id;
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let seed = format!(
        "{host}\0{}\0{:?}\0{}",
        std::process::id(),
        std::time::SystemTime::now(),
        cache.display()
    );
    let id = crate::fingerprint::Digest::of(seed.as_bytes()).hex()[..32].to_owned();
    // Written beside, then linked into place: of two runs making one at
    // once, the first link wins and both read it.
    let temp = cache.join(format!("workspace-id.{}", std::process::id()));
    let made = std::fs::create_dir_all(cache)
        .and_then(|()| std::fs::write(&temp, format!("{id}\n")))
        .and_then(|()| std::fs::hard_link(&temp, &path));
    let _ = std::fs::remove_file(&temp);
    if let Err(error) = made
        && error.kind() != std::io::ErrorKind::AlreadyExists
    {
        tracing::warn!(path = %path.display(), error = %error, "could not keep this checkout's id; job names rest on its path alone");
        return String::new();
    }
    read(&path).unwrap_or_default()
}
