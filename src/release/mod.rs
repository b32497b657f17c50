//! Releases: freezes, the bundles they are exported as, and the registries
//! bundles are imported into, each checked before anything is trusted.
//!
//! `format` defines a freeze, `archive` writes a reproducible bundle,
//! `verify` checks one without writing anything, and `registry` imports a
//! verified bundle atomically.

mod archive;
pub mod format;
mod registry;
mod verify;

pub use archive::{BundleWritten, files_under, write_bundle};
pub use format::{FreezeManifest, FrozenItem};
pub use registry::{Lack, Registered, Registration, lacks, register};
pub use verify::{Limits, Verified, expected_digest, read_sha256_file, verify_bundle};

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    #[error("failed to access `{}`", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The input is not what it must be; the message says why.
    #[error("{0}")]
    Invalid(String),
    /// A bundle or registry failed its checks: every problem found.
    #[error("refused: {}", .0.join("; "))]
    Refused(Vec<String>),
}

impl ReleaseError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        ReleaseError::Io {
            path: path.to_owned(),
            source,
        }
    }
}

/// A writer that passes bytes on and hashes them with SHA-256.
pub(crate) struct HashingWriter<W> {
    inner: W,
    hasher: sha2::Sha256,
    bytes: u64,
}

impl<W: std::io::Write> HashingWriter<W> {
    pub fn new(inner: W) -> Self {
        use sha2::Digest as _;
        Self {
            inner,
            hasher: sha2::Sha256::new(),
            bytes: 0,
        }
    }

    /// The inner writer, the hex digest and the byte count.
    pub fn finish(self) -> (W, String, u64) {
        use sha2::Digest as _;
        (
            self.inner,
            crate::fingerprint::hex(&self.hasher.finalize()),
            self.bytes,
        )
    }
}

impl<W: std::io::Write> std::io::Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        use sha2::Digest as _;
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// A reader that hashes what passes through it with SHA-256.
pub(crate) struct HashingReader<R> {
    inner: R,
    hasher: sha2::Sha256,
    bytes: u64,
}

impl<R: std::io::Read> HashingReader<R> {
    pub fn new(inner: R) -> Self {
        use sha2::Digest as _;
        Self {
            inner,
            hasher: sha2::Sha256::new(),
            bytes: 0,
        }
    }

    /// The inner reader, the hex digest and the byte count.
    pub fn finish(self) -> (R, String, u64) {
        use sha2::Digest as _;
        (
            self.inner,
            crate::fingerprint::hex(&self.hasher.finalize()),
            self.bytes,
        )
    }
}

impl<R: std::io::Read> std::io::Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use sha2::Digest as _;
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
}

/// SHA-256 hex of a file's bytes.
pub(crate) fn sha256_file(path: &Path) -> Result<(String, u64), ReleaseError> {
    let file = std::fs::File::open(path).map_err(|e| ReleaseError::io(path, e))?;
    let mut reader = HashingReader::new(file);
    std::io::copy(&mut reader, &mut std::io::sink()).map_err(|e| ReleaseError::io(path, e))?;
    let (_, hex, bytes) = reader.finish();
    Ok((hex, bytes))
}

/// Writes `bytes` to `path` through a temporary file, fsync and rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), ReleaseError> {
    use std::io::Write as _;
    let tmp = temp_sibling(path);
    let result = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    result.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        ReleaseError::io(path, e)
    })
}

/// A hidden name next to `path` for writing it atomically.
pub fn temp_sibling(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp-{}", std::process::id()))
}
