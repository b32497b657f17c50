//! Container images as a job's identity: a reference
//! ([`ImageRef`](crate::manifest::ImageRef)) is pinned to the digest of its
//! manifest before anything is fingerprinted, so a result records exactly
//! the image it ran in, and a moved tag is a changed input.
//!
//! A reference with a digest is pinned as written (its tag, if any, is
//! ignored); a tag is resolved through the registry (`HEAD
//! /v2/PATH/manifests/TAG`, the `Docker-Content-Digest` header). Loopback
//! registries are spoken to over HTTP, every other over HTTPS.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use crate::manifest::sha256_digest;
pub use crate::manifest::{ImageRef, PinnedImage};

/// What a manifest request accepts: single-platform manifests and
/// multi-platform indexes, OCI and Docker. An index's digest names every
/// platform's image at once.
const ACCEPT: &str = "application/vnd.oci.image.index.v1+json, \
    application/vnd.oci.image.manifest.v1+json, \
    application/vnd.docker.distribution.manifest.list.v2+json, \
    application/vnd.docker.distribution.manifest.v2+json";
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Pins references, asking each registry once per tag and run.
pub struct ImageResolver {
    resolved: Mutex<HashMap<String, Result<PinnedImage, String>>>,
}

/// One blocking client for the process, never dropped: a blocking client
/// may be neither built nor dropped on an async worker thread.
fn client() -> Result<&'static reqwest::blocking::Client, String> {
    static CLIENT: OnceLock<Result<reqwest::blocking::Client, String>> = OnceLock::new();
    CLIENT
        .get_or_init(|| {
            crate::tls::install_provider();
            reqwest::blocking::Client::builder()
                .timeout(REQUEST_TIMEOUT)
                .build()
                .map_err(|e| format!("cannot set up an HTTP client: {e}"))
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Runs blocking network work on a thread of its own (reqwest's blocking
/// client refuses to run on a thread inside a tokio runtime). The caller
/// waits: on a multi-threaded runtime its worker is handed on
/// (`block_in_place`); on the scheduler's one thread, everything waits for
/// the registry (at most [`REQUEST_TIMEOUT`], once per tag and run).
fn blocking<T: Send>(work: impl FnOnce() -> T + Send) -> T {
    let on_thread = || {
        std::thread::scope(|scope| {
            scope
                .spawn(work)
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    };
    match tokio::runtime::Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(on_thread)
        }
        _ => on_thread(),
    }
}

impl Default for ImageResolver {
    fn default() -> Self {
        Self::new()
    }
}

impl ImageResolver {
    pub fn new() -> Self {
        ImageResolver {
            resolved: Mutex::new(HashMap::new()),
        }
    }

    /// The tags resolved so far (a panic elsewhere leaves plain entries).
    fn resolved(&self) -> std::sync::MutexGuard<'_, HashMap<String, Result<PinnedImage, String>>> {
        self.resolved
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// `text` by digest. With `require_digest`, a tag is refused instead of
    /// resolved. The error says which reference and why, in one line.
    pub fn pin(&self, text: &str, require_digest: bool) -> Result<PinnedImage, String> {
        let reference = ImageRef::parse(text)?;
        if let Some(digest) = &reference.digest {
            return Ok(reference.pinned_to(digest));
        }
        if require_digest {
            return Err(format!(
                "image `{text}` is not given by digest (`REPO@sha256:…`); pin it, or set `require_digest = false` on its executor to resolve the tag through the registry"
            ));
        }
        if let Some(known) = self.resolved().get(text) {
            return known.clone();
        }
        let resolved = blocking(|| resolve(&reference))
            .map_err(|why| format!("cannot resolve image `{text}` to a digest: {why}"));
        self.resolved().insert(text.to_owned(), resolved.clone());
        resolved
    }
}

/// Asks the registry which manifest `reference`'s tag names.
fn resolve(reference: &ImageRef) -> Result<PinnedImage, String> {
    let tag = reference.tag.as_deref().unwrap_or("latest");
    let client = client()?;
    let url = format!(
        "{}/v2/{}/manifests/{tag}",
        reference.api_root(),
        reference.repository
    );
    let response = client
        .head(&url)
        .header("Accept", ACCEPT)
        .send()
        .map_err(|e| format!("{url}: {}", crate::causes::with_causes(&e)))?;
    match response.status().as_u16() {
        200 => {}
        404 => return Err(format!("the registry has no tag `{tag}` ({url})")),
        401 | 403 => {
            return Err(format!(
                "the registry wants credentials to read it ({url}); pin the image by digest instead"
            ));
        }
        status => return Err(format!("the registry answered {status} ({url})")),
    }
    let digest = response
        .headers()
        .get("docker-content-digest")
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| format!("the registry sent no Docker-Content-Digest ({url})"))?;
    match sha256_digest(digest) {
        Some(digest) => Ok(reference.pinned_to(&digest)),
        None => Err(format!(
            "the registry sent a digest that is not sha256: `{digest}` ({url})"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "abababababababababababababababababababababababababababababababab";

    #[test]
    fn a_pinned_reference_needs_no_registry_and_a_tag_needs_permission() {
        let resolver = ImageResolver::new();
        let pinned = resolver
            .pin(&format!("mirror.example/oracle@sha256:{HEX}"), true)
            .unwrap();
        assert_eq!(pinned.digest, format!("sha256:{HEX}"));
        assert_eq!(
            pinned.reference,
            format!("mirror.example/oracle@sha256:{HEX}")
        );
        let refused = resolver
            .pin("mirror.example/oracle:latest", true)
            .unwrap_err();
        assert!(refused.contains("not given by digest"), "{refused}");
    }

    #[test]
    fn an_unreachable_registry_is_an_error_naming_the_reference() {
        let resolver = ImageResolver::new();
        // Port 9 (discard) on loopback: nothing listens there.
        let error = resolver.pin("127.0.0.1:9/oracle:v1", false).unwrap_err();
        assert!(
            error.starts_with("cannot resolve image `127.0.0.1:9/oracle:v1`"),
            "{error}"
        );
    }
}
