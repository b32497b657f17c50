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

/// At most this many tags are resolved at once.
const RESOLVE_AT_ONCE: usize = 16;

impl ImageResolver {
    /// The tags among `texts` (each once) not resolved yet: what pinning
    /// them would ask the registry for. None with `require_digest`, where a
    /// tag is refused, never resolved.
    pub fn unresolved<'a>(
        &self,
        texts: impl IntoIterator<Item = &'a str>,
        require_digest: bool,
    ) -> Vec<String> {
        if require_digest {
            return Vec::new();
        }
        let resolved = self.resolved();
        let mut tags: Vec<String> = Vec::new();
        for text in texts {
            if resolved.contains_key(text) || tags.iter().any(|t| t == text) {
                continue;
            }
            if ImageRef::parse(text).is_ok_and(|reference| reference.digest.is_none()) {
                tags.push(text.to_owned());
            }
        }
        tags
    }

    /// Resolves every tag among `texts` not resolved yet, up to
    /// [`RESOLVE_AT_ONCE`] at a time, so that a list of items naming many
    /// tags waits for the slowest few requests rather than their sum;
    /// [`Self::pin`] then answers from what was found. Problems are left
    /// for `pin` to report, with the reference that has them.
    pub fn prefetch<'a>(&self, texts: impl IntoIterator<Item = &'a str>, require_digest: bool) {
        let tags: Vec<(String, ImageRef)> = self
            .unresolved(texts, require_digest)
            .into_iter()
            .filter_map(|text| {
                let reference = ImageRef::parse(&text).ok()?;
                Some((text, reference))
            })
            .collect();
        for batch in tags.chunks(RESOLVE_AT_ONCE) {
            let found: Vec<_> = blocking(|| {
                std::thread::scope(|scope| {
                    let asks: Vec<_> = batch
                        .iter()
                        .map(|(text, reference)| scope.spawn(move || (text, resolve(reference))))
                        .collect();
                    asks.into_iter().filter_map(|ask| ask.join().ok()).collect()
                })
            });
            let mut resolved = self.resolved();
            for (text, result) in found {
                let result = result
                    .map_err(|why| format!("cannot resolve image `{text}` to a digest: {why}"));
                resolved.insert(text.clone(), result);
            }
        }
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

    /// A registry on loopback that answers each manifest HEAD after a
    /// pause, with a digest made from the tag, counting the requests it
    /// holds at once; (port, the most held at once).
    fn slow_registry(requests: usize) -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use std::io::{BufRead, BufReader, Write};
        use std::sync::atomic::{AtomicUsize, Ordering};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (now, most) = (
            std::sync::Arc::new(AtomicUsize::new(0)),
            std::sync::Arc::new(AtomicUsize::new(0)),
        );
        let peak = most.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().take(requests) {
                let (now, most) = (now.clone(), most.clone());
                std::thread::spawn(move || {
                    let mut stream = stream.unwrap();
                    let mut line = String::new();
                    BufReader::new(&stream).read_line(&mut line).unwrap();
                    let held = now.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(held, Ordering::SeqCst);
                    std::thread::sleep(std::time::Duration::from_millis(300));
                    now.fetch_sub(1, Ordering::SeqCst);
                    // `HEAD /v2/REPO/manifests/TAG HTTP/1.1`
                    let tag = line.split(' ').nth(1).unwrap().rsplit('/').next().unwrap();
                    let digest = crate::fingerprint::Digest::of(tag.as_bytes()).hex();
                    let _ = write!(
                        stream,
                        "HTTP/1.1 200 OK\r\nDocker-Content-Digest: sha256:{digest}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    );
                });
            }
        });
        (port, peak)
    }

    #[test]
    fn many_tags_are_resolved_side_by_side_and_each_to_its_own_digest() {
        let (port, most_at_once) = slow_registry(6);
        let texts: Vec<String> = (0..6)
            .map(|i| format!("127.0.0.1:{port}/task:v{i}"))
            .collect();
        let resolver = ImageResolver::new();
        resolver.prefetch(texts.iter().map(String::as_str), false);
        assert!(
            most_at_once.load(std::sync::atomic::Ordering::SeqCst) > 1,
            "the tags were asked for one after another"
        );
        for (i, text) in texts.iter().enumerate() {
            // From what prefetch found: the registry takes no more requests.
            let pinned = resolver.pin(text, false).unwrap();
            let expected = crate::fingerprint::Digest::of(format!("v{i}").as_bytes()).hex();
            assert_eq!(pinned.digest, format!("sha256:{expected}"));
        }
    }
}
