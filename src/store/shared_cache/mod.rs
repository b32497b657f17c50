//! A cache shared across machines: signed action entries and the blobs
//! they name, on a plain HTTP cache (nginx WebDAV, bazel-remote, Bazel's
//! HTTP cache protocol).
//!
//! Nothing the remote returns is believed: an entry must be signed by a
//! trusted key, be for the fingerprint it was fetched for and have a
//! pre-image that hashes to it; every blob is re-hashed (SHA-256, its
//! name there, and BLAKE3, its name here) before it enters the store. A
//! remote that is down, slow or returns garbage costs a warning and local
//! execution, never a wrong result.

mod entry;
mod http;
mod signing;

pub use entry::{Blob, ENTRY_FORMAT, Entry, Producer, Refusal, Role, What, action_key};
pub use http::{Unavailable, without_credentials};
pub use signing::{KEY_FILE_VARIABLE, KEY_VARIABLE, PublicKey, SigningKey};

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use futures::StreamExt as _;

use super::objects::ObjectStore;
use super::{OutputKind, OutputRecord};
use crate::fingerprint::{Digest, EntryKind, TreeEntry};
use crate::manifest::RemoteCacheSpec;
use http::HttpCache;

/// Blobs moved at once for one entry.
const BLOBS_IN_FLIGHT: usize = 32;

/// What a run did with its remote, for the summary.
#[derive(Debug, Default)]
pub struct RemoteStats {
    pub hits: AtomicUsize,
    pub misses: AtomicUsize,
    pub refused: AtomicUsize,
    pub uploaded: AtomicUsize,
    pub upload_failures: AtomicUsize,
}

impl RemoteStats {
    pub fn count(counter: &AtomicUsize) -> usize {
        counter.load(Ordering::Relaxed)
    }
}

/// An entry fetched and verified, its blobs in the local store (files and
/// listings published; small files returned, for the ledger).
#[derive(Debug)]
pub struct Fetched {
    pub entry: Entry,
    pub inline: Vec<(Digest, Vec<u8>)>,
}

/// Bytes of an inline output, by digest (for uploading).
pub type InlineBytes = Vec<(Digest, Vec<u8>)>;

pub struct RemoteCache {
    http: HttpCache,
    signing: SigningKey,
    trusted: Vec<PublicKey>,
    upload: bool,
    down: AtomicBool,
    /// Set when an upload fails: lookups go on, uploads stop.
    uploads_down: AtomicBool,
    /// The first reason it went down (one warning per run).
    down_because: Mutex<Option<String>>,
    pub stats: RemoteStats,
}

impl std::fmt::Debug for RemoteCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteCache")
            .field("url", &self.http.shown())
            .finish()
    }
}

impl RemoteCache {
    /// The remote `settings` describe, signing with the key in `key_file`
    /// (resolved against the project root; `None`: the default sources)
    /// and uploading if `upload`.
    pub fn open(
        settings: &RemoteCacheSpec,
        key_file: Option<&Path>,
        upload: bool,
    ) -> Result<Self, String> {
        let signing = SigningKey::load(key_file)?;
        let mut trusted = vec![signing.public()];
        for text in &settings.trust {
            trusted.push(PublicKey::parse(text)?);
        }
        let auth = match &settings.auth {
            None => None,
            Some(variable) => Some(std::env::var(variable).map_err(|_| {
                format!("the remote cache's `auth` names the environment variable `{variable}`, which is not set")
            })?),
        };
        Ok(Self {
            http: HttpCache::new(&settings.url, auth, settings.timeout)?,
            signing,
            trusted,
            upload,
            down: AtomicBool::new(false),
            uploads_down: AtomicBool::new(false),
            down_because: Mutex::new(None),
            stats: RemoteStats::default(),
        })
    }

    pub fn url(&self) -> &str {
        self.http.shown()
    }

    pub fn public_key(&self) -> PublicKey {
        self.signing.public()
    }

    /// Whether the remote still answers in this run.
    pub fn is_up(&self) -> bool {
        !self.down.load(Ordering::Relaxed)
    }

    pub fn uploads(&self) -> bool {
        self.upload && self.is_up() && !self.uploads_down.load(Ordering::Relaxed)
    }

    /// Why the remote went down in this run, if it did.
    pub fn down_because(&self) -> Option<String> {
        self.down_because
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Stops using the remote for the rest of the run; warns once.
    fn went_down(&self, error: &Unavailable) {
        if !self.down.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "the remote cache cannot be used ({}); going on without it",
                error.0
            );
            *self.down_because.lock().unwrap_or_else(|p| p.into_inner()) = Some(error.0.clone());
        }
    }

    fn refused(&self, fingerprint: &Digest, refusal: &Refusal) {
        /// Refusals shown one by one; the rest are counted.
        const SHOWN: usize = 3;
        let before = self.stats.refused.fetch_add(1, Ordering::Relaxed);
        if before < SHOWN {
            tracing::warn!(
                "refused the remote cache's entry for {fingerprint}: {refusal}; nothing of it is used"
            );
        } else if before == SHOWN {
            tracing::warn!(
                "refused another entry ({refusal}); further refusals are counted, not shown"
            );
        }
    }

    /// The entry for `fingerprint`, verified, with its blobs brought into
    /// `store`; `None` on a miss, a refusal or a remote that is down.
    pub async fn fetch(&self, fingerprint: &Digest, store: &ObjectStore) -> Option<Fetched> {
        if !self.is_up() {
            return None;
        }
        let bytes = match self.http.get_entry(&action_key(fingerprint)).await {
            Ok(Some(bytes)) => bytes,
            Ok(None) => {
                self.stats.misses.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            Err(error) => {
                self.went_down(&error);
                return None;
            }
        };
        let entry = match Entry::verify(&bytes, fingerprint, &self.trusted) {
            Ok(entry) => entry,
            Err(refusal) => {
                self.refused(fingerprint, &refusal);
                return None;
            }
        };
        match self.fetch_blobs(&entry, store).await {
            Ok(Ok(inline)) => {
                self.stats.hits.fetch_add(1, Ordering::Relaxed);
                Some(Fetched { entry, inline })
            }
            Ok(Err(refusal)) => {
                self.refused(fingerprint, &refusal);
                None
            }
            Err(error) => {
                self.went_down(&error);
                None
            }
        }
    }

    /// Brings every blob the entry's outputs need into `store`: listings
    /// first (they name the files), then the files it lacks. Nothing is
    /// published unless every byte checks out; every temporary file is
    /// removed on the way out otherwise.
    async fn fetch_blobs(
        &self,
        entry: &Entry,
        store: &ObjectStore,
    ) -> Result<Result<InlineBytes, Refusal>, Unavailable> {
        let mut needed: Vec<Blob> = Vec::new();
        let mut inline = Vec::new();
        let mut placing = Placing::default();
        for output in &entry.outputs {
            let role = match output.kind {
                OutputKind::File if output.inline => Role::Inline,
                OutputKind::File => Role::Object,
                OutputKind::Dir => Role::Tree,
            };
            let Some(blob) = entry.blob(&output.digest, role) else {
                return Ok(Err(Refusal::MissingBlob(output.path.clone())));
            };
            match role {
                Role::Inline => {
                    let temp = placing.temp(store);
                    if let Err(refusal) = self.download(blob, &temp).await? {
                        return Ok(Err(refusal));
                    }
                    let bytes = std::fs::read(&temp)
                        .map_err(|e| Unavailable(format!("cannot read a download: {e}")))?;
                    inline.push((blob.blake3, bytes));
                }
                Role::Object => {
                    if !store.holds(&output.digest, output.size) {
                        needed.push(blob.clone());
                    }
                }
                Role::Tree => {
                    let entries = match store.tree(&output.digest) {
                        Ok(entries) => entries,
                        Err(_) => {
                            let temp = placing.temp(store);
                            if let Err(refusal) = self.download(blob, &temp).await? {
                                return Ok(Err(refusal));
                            }
                            match read_listing(&temp, &output.digest) {
                                Ok(entries) => {
                                    placing
                                        .publish_as(temp, store.compact_tree_path(&output.digest));
                                    entries
                                }
                                Err(detail) => {
                                    return Ok(Err(Refusal::Blob {
                                        sha256: blob.sha256.clone(),
                                        detail,
                                    }));
                                }
                            }
                        }
                    };
                    for file in entries
                        .iter()
                        .filter(|e| matches!(e.kind, EntryKind::File | EntryKind::Executable))
                    {
                        if store.holds(&file.digest, file.size) {
                            continue;
                        }
                        match entry.blob(&file.digest, Role::Object) {
                            Some(blob) if blob.size == file.size => needed.push(blob.clone()),
                            _ => {
                                return Ok(Err(Refusal::MissingBlob(format!(
                                    "{}/{}",
                                    output.path,
                                    file.path.display()
                                ))));
                            }
                        }
                    }
                }
            }
        }
        needed.sort_by(|a, b| a.blake3.as_bytes().cmp(b.blake3.as_bytes()));
        needed.dedup_by(|a, b| a.blake3 == b.blake3);
        let jobs: Vec<(Blob, PathBuf)> = needed
            .into_iter()
            .map(|blob| (blob, placing.temp(store)))
            .collect();
        let mut downloads =
            futures::stream::iter(jobs.into_iter().map(|(blob, temp)| async move {
                let got = self.download(&blob, &temp).await;
                (blob, temp, got)
            }))
            .buffer_unordered(BLOBS_IN_FLIGHT);
        let mut hashed = Vec::new();
        while let Some((blob, temp, got)) = downloads.next().await {
            match got {
                Ok(Ok(())) => {
                    placing.publish_as(temp, store.object_path(&blob.blake3));
                    hashed.push(blob.blake3);
                }
                // The first failure ends it: the other downloads are
                // dropped, and every temporary file removed.
                Ok(Err(refusal)) => return Ok(Err(refusal)),
                Err(error) => return Err(error),
            }
        }
        drop(downloads);
        let store = store.clone();
        let published = tokio::task::spawn_blocking(move || {
            let placed = placing.take();
            store.publish_downloads(placed, hashed)
        })
        .await
        .map_err(|e| Unavailable(e.to_string()))?;
        published.map_err(|e| Unavailable(format!("cannot store a download: {e}")))?;
        Ok(Ok(inline))
    }

    /// Downloads one blob to `temp` and checks its size and its BLAKE3
    /// digest (a listing: its size; its entries are checked when read).
    async fn download(&self, blob: &Blob, temp: &Path) -> Result<Result<(), Refusal>, Unavailable> {
        let refuse = |detail: String| {
            Ok(Err(Refusal::Blob {
                sha256: blob.sha256.clone(),
                detail,
            }))
        };
        let Some(got) = self.http.get_blob(&blob.sha256, temp, blob.size).await? else {
            return refuse("the remote does not have it".to_owned());
        };
        if got.size != blob.size {
            return refuse(format!("{} bytes, not {}", got.size, blob.size));
        }
        // The signed BLAKE3 digest decides: bytes that hash to it are the
        // bytes the signer stored, whatever name the server keeps them
        // under. A listing's digest is that of the entries it lists
        // (checked when it is read), not of its bytes.
        if blob.role != Role::Tree && got.blake3 != blob.blake3 {
            return refuse(format!("its bytes hash to {}", got.blake3));
        }
        Ok(Ok(()))
    }

    /// Signs `entry` (its blobs filled in from `store` and `inline`) and
    /// uploads what the remote lacks: blobs first, the entry last, so an
    /// entry is never visible before what it names. A remote that refuses
    /// or fails stops this run's uploads (its lookups go on); a stored
    /// object that no longer hashes to its name is not uploaded at all.
    pub async fn upload(
        &self,
        mut entry: Entry,
        store: &ObjectStore,
        inline: InlineBytes,
    ) -> Result<(), String> {
        if !self.uploads() {
            // Counted: the summary says how many results stayed here.
            self.stats.upload_failures.fetch_add(1, Ordering::Relaxed);
            return Err("uploads to the remote cache have stopped".to_owned());
        }
        let failed = |why: String| {
            self.stats.upload_failures.fetch_add(1, Ordering::Relaxed);
            why
        };
        let outputs = entry.outputs.clone();
        let local = store.clone();
        let sources = tokio::task::spawn_blocking(move || local_blobs(&local, &outputs, inline))
            .await
            .map_err(|e| failed(e.to_string()))?
            .map_err(|why| {
                tracing::warn!("not uploading {}: {why}", entry.fingerprint);
                failed(why)
            })?;
        entry.blobs = sources.iter().map(|(blob, _)| blob.clone()).collect();
        let mut uploads =
            futures::stream::iter(sources.into_iter().map(|(blob, source)| async move {
                if self.http.has_blob(&blob.sha256).await? {
                    return Ok(Ok(()));
                }
                match source {
                    Source::File(path) => {
                        match self
                            .http
                            .put_blob_file(&blob.sha256, &path, blob.size)
                            .await
                        {
                            Ok(sent) => sent.map(Ok),
                            // Gone meanwhile (collected): a local matter.
                            Err(e) => Ok(Err(format!("cannot read `{}`: {e}", path.display()))),
                        }
                    }
                    Source::Bytes(bytes) => {
                        self.http.put_blob_bytes(&blob.sha256, bytes).await.map(Ok)
                    }
                }
            }))
            .buffer_unordered(BLOBS_IN_FLIGHT);
        while let Some(done) = uploads.next().await {
            match done {
                Ok(Ok(())) => {}
                Ok(Err(why)) => return Err(failed(why)),
                Err(error) => {
                    self.uploads_stopped(&error);
                    return Err(failed(error.0));
                }
            }
        }
        drop(uploads);
        let signed = entry.sign(&self.signing);
        match self
            .http
            .put_entry(&action_key(&entry.fingerprint), signed)
            .await
        {
            Ok(()) => {
                self.stats.uploaded.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(error) => {
                self.uploads_stopped(&error);
                Err(failed(error.0))
            }
        }
    }

    /// Why uploads stopped in this run, if they did.
    pub fn uploads_stopped_because(&self) -> Option<String> {
        self.uploads_down
            .load(Ordering::Relaxed)
            .then(|| "the remote cache took no more uploads".to_owned())
    }

    /// Stops this run's uploads; warns once.
    fn uploads_stopped(&self, error: &Unavailable) {
        if !self.uploads_down.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "the remote cache takes no uploads ({}); results stay here",
                error.0
            );
        }
    }
}

/// Temporary files of one fetch: those to publish (temp, destination),
/// and every one made, removed when dropped unless published.
#[derive(Default)]
struct Placing {
    made: Vec<PathBuf>,
    publish: Vec<(PathBuf, PathBuf)>,
}

impl Placing {
    fn temp(&mut self, store: &ObjectStore) -> PathBuf {
        let temp = store.fresh_temp_path();
        self.made.push(temp.clone());
        temp
    }

    fn publish_as(&mut self, temp: PathBuf, dest: PathBuf) {
        self.publish.push((temp, dest));
    }

    /// The files to publish; the others are removed now.
    fn take(mut self) -> Vec<(PathBuf, PathBuf)> {
        let publish = std::mem::take(&mut self.publish);
        self.made.retain(|m| !publish.iter().any(|(t, _)| t == m));
        publish
    }
}

impl Drop for Placing {
    fn drop(&mut self) {
        for temp in &self.made {
            let _ = std::fs::remove_file(temp);
        }
    }
}

/// Where an uploaded blob's bytes are.
enum Source {
    File(PathBuf),
    Bytes(Vec<u8>),
}

/// Every blob `outputs` need, with its SHA-256 (read from the store: the
/// same bytes a restore would use) and where to read it.
fn local_blobs(
    store: &ObjectStore,
    outputs: &[OutputRecord],
    inline: InlineBytes,
) -> Result<Vec<(Blob, Source)>, String> {
    let mut blobs: Vec<(Blob, Source)> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut file = |path: PathBuf, digest: Digest, role: Role, blobs: &mut Vec<(Blob, Source)>| {
        if !seen.insert((digest, role)) {
            return Ok(());
        }
        let (sha256, found, size) =
            digests_of_file(&path).map_err(|e| format!("cannot read `{}`: {e}", path.display()))?;
        // A listing's digest is that of its entries (checked by reading it).
        if role != Role::Tree && found != digest {
            return Err(format!(
                "the stored object `{}` no longer hashes to its name",
                path.display()
            ));
        }
        blobs.push((
            Blob {
                blake3: digest,
                sha256,
                size,
                role,
            },
            Source::File(path),
        ));
        Ok::<(), String>(())
    };
    for output in outputs {
        match output.kind {
            OutputKind::File if output.inline => {
                let bytes = inline
                    .iter()
                    .find(|(d, _)| *d == output.digest)
                    .map(|(_, b)| b.clone())
                    .ok_or_else(|| format!("the small output `{}` is not at hand", output.path))?;
                use sha2::Digest as _;
                let sha256 = crate::fingerprint::hex(&sha2::Sha256::digest(&bytes));
                blobs.push((
                    Blob {
                        blake3: output.digest,
                        sha256,
                        size: bytes.len() as u64,
                        role: Role::Inline,
                    },
                    Source::Bytes(bytes),
                ));
            }
            OutputKind::File => file(
                store.object_path(&output.digest),
                output.digest,
                Role::Object,
                &mut blobs,
            )?,
            OutputKind::Dir => {
                file(
                    store.tree_path(&output.digest),
                    output.digest,
                    Role::Tree,
                    &mut blobs,
                )?;
                let entries = store.tree(&output.digest).map_err(|e| e.to_string())?;
                for entry in entries
                    .iter()
                    .filter(|e| matches!(e.kind, EntryKind::File | EntryKind::Executable))
                {
                    file(
                        store.object_path(&entry.digest),
                        entry.digest,
                        Role::Object,
                        &mut blobs,
                    )?;
                }
            }
        }
    }
    Ok(blobs)
}

/// A file's SHA-256 and BLAKE3 digests and size, in one pass.
fn digests_of_file(path: &Path) -> std::io::Result<(String, Digest, u64)> {
    use sha2::Digest as _;
    use std::io::Read as _;
    let mut file = std::fs::File::open(path)?;
    let mut sha256 = sha2::Sha256::new();
    let mut blake3 = blake3::Hasher::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut size = 0u64;
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        sha256.update(&buf[..n]);
        blake3.update(&buf[..n]);
        size += n as u64;
    }
    Ok((
        crate::fingerprint::hex(&sha256.finalize()),
        Digest::from_hash(blake3.finalize()),
        size,
    ))
}

/// A downloaded tree listing, checked against its digest.
fn read_listing(path: &Path, digest: &Digest) -> Result<Vec<TreeEntry>, String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    let entries = super::tree_listing::decode_checked(&bytes, digest)?;
    for entry in &entries {
        let path = &entry.path;
        let plain = !path.as_os_str().is_empty()
            && path
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)));
        if !plain {
            return Err(format!("the listing names the path `{}`", path.display()));
        }
        if entry.kind == EntryKind::Symlink {
            return Err(format!(
                "the listing holds a symbolic link `{}`",
                path.display()
            ));
        }
    }
    Ok(entries)
}
