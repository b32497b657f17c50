//! Container images as a job's identity: a reference is pinned to the
//! digest of its manifest before anything is fingerprinted, so a result
//! records exactly the image it ran in, and a moved tag is a changed input.
//!
//! A reference is `[HOST[:PORT]/]PATH[:TAG][@sha256:HEX]`, as Docker reads
//! it: a first component with a `.` or `:` in it, or `localhost`, is the
//! registry; otherwise the registry is Docker Hub (`library/` before a
//! one-component path). A reference with a digest is pinned as written
//! (its tag, if any, is ignored); a tag is resolved through the registry
//! (`HEAD /v2/PATH/manifests/TAG`, the `Docker-Content-Digest` header).
//! Loopback registries are spoken to over HTTP, every other over HTTPS.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// What a manifest request accepts: single-platform manifests and
/// multi-platform indexes, OCI and Docker. An index's digest names every
/// platform's image at once.
const ACCEPT: &str = "application/vnd.oci.image.index.v1+json, \
    application/vnd.oci.image.manifest.v1+json, \
    application/vnd.docker.distribution.manifest.list.v2+json, \
    application/vnd.docker.distribution.manifest.v2+json";
const DOCKER_HUB: &str = "registry-1.docker.io";
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A reference taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef {
    /// `host[:port]` as written, or `docker.io`.
    pub registry: String,
    pub repository: String,
    pub tag: Option<String>,
    /// `sha256:HEX`.
    pub digest: Option<String>,
}

/// An image by content: what a job runs and a fingerprint records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinnedImage {
    /// `REPO@sha256:HEX`, what the job is started with.
    pub reference: String,
    /// `sha256:HEX`: the identity that enters fingerprints (the same
    /// content mirrored under another name is the same image).
    pub digest: String,
}

impl ImageRef {
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = |why: &str| format!("`{text}` is not an image reference: {why}");
        if text.is_empty() || text.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(bad("it is empty or has spaces in it"));
        }
        let (rest, digest) = match text.split_once('@') {
            Some((rest, digest)) => {
                let hex = digest
                    .strip_prefix("sha256:")
                    .ok_or_else(|| bad("a digest is `sha256:` and 64 hex digits"))?;
                if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(bad("a digest is `sha256:` and 64 hex digits"));
                }
                (rest, Some(format!("sha256:{}", hex.to_ascii_lowercase())))
            }
            None => (text, None),
        };
        let (registry, path) = match rest.split_once('/') {
            Some((first, path))
                if first.contains('.') || first.contains(':') || first == "localhost" =>
            {
                (first.to_owned(), path)
            }
            _ => ("docker.io".to_owned(), rest),
        };
        // A `:` after the last `/` starts the tag.
        let (repository, tag) = match path.rfind(':') {
            Some(i) if !path[i..].contains('/') => (&path[..i], Some(path[i + 1..].to_owned())),
            _ => (path, None),
        };
        if repository.is_empty()
            || repository.split('/').any(str::is_empty)
            || !repository
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-/".contains(&b))
        {
            return Err(bad(
                "a repository is lower-case letters, digits, `.`, `_`, `-` and `/`",
            ));
        }
        if let Some(tag) = &tag
            && (tag.is_empty()
                || tag.len() > 128
                || !tag
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)))
        {
            return Err(bad("a tag is letters, digits, `.`, `_` and `-`"));
        }
        let repository = if registry == "docker.io" && !repository.contains('/') {
            format!("library/{repository}")
        } else {
            repository.to_owned()
        };
        Ok(ImageRef {
            registry,
            repository,
            tag,
            digest,
        })
    }

    /// The reference with `digest` in place of its tag.
    fn pinned_to(&self, digest: &str) -> PinnedImage {
        PinnedImage {
            reference: format!("{}/{}@{digest}", self.registry, self.repository),
            digest: digest.to_owned(),
        }
    }

    /// The registry's API root.
    fn base_url(&self) -> String {
        let host = if self.registry == "docker.io" {
            DOCKER_HUB
        } else {
            &self.registry
        };
        let name = host.rsplit_once(':').map_or(host, |(name, _)| name);
        let loopback = name == "localhost"
            || name == "[::1]"
            || name
                .parse::<std::net::Ipv4Addr>()
                .is_ok_and(|ip| ip.is_loopback());
        let scheme = if loopback { "http" } else { "https" };
        format!("{scheme}://{host}")
    }
}

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
            reqwest::blocking::Client::builder()
                .timeout(REQUEST_TIMEOUT)
                .build()
                .map_err(|e| format!("cannot set up an HTTP client: {e}"))
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Runs blocking network work on a thread of its own: reqwest's blocking
/// client refuses to run on a thread inside a tokio runtime, and the
/// scheduler's worker is not blocked meanwhile (`block_in_place`).
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
        if let Some(known) = self.resolved.lock().expect("not poisoned").get(text) {
            return known.clone();
        }
        let resolved = blocking(|| resolve(&reference))
            .map_err(|why| format!("cannot resolve image `{text}` to a digest: {why}"));
        self.resolved
            .lock()
            .expect("not poisoned")
            .insert(text.to_owned(), resolved.clone());
        resolved
    }
}

/// Asks the registry which manifest `reference`'s tag names.
fn resolve(reference: &ImageRef) -> Result<PinnedImage, String> {
    let tag = reference.tag.as_deref().unwrap_or("latest");
    let client = client()?;
    let url = format!(
        "{}/v2/{}/manifests/{tag}",
        reference.base_url(),
        reference.repository
    );
    let response = client
        .head(&url)
        .header("Accept", ACCEPT)
        .send()
        .map_err(|e| format!("{url}: {}", error_chain(&e)))?;
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
    match ImageRef::parse(&format!("x@{digest}")) {
        Ok(parsed) => Ok(reference.pinned_to(parsed.digest.as_deref().expect("parsed"))),
        Err(_) => Err(format!(
            "the registry sent a digest that is not sha256: `{digest}` ({url})"
        )),
    }
}

/// An error and its causes on one line.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "abababababababababababababababababababababababababababababababab";

    fn parsed(text: &str) -> ImageRef {
        ImageRef::parse(text).unwrap()
    }

    #[test]
    fn references_are_taken_apart_as_docker_reads_them() {
        let hub = parsed("python:3.12");
        assert_eq!(
            (
                hub.registry.as_str(),
                hub.repository.as_str(),
                hub.tag.as_deref()
            ),
            ("docker.io", "library/python", Some("3.12"))
        );
        let local = parsed("127.0.0.1:5000/swesmith/task-07:baseanchor-1");
        assert_eq!(local.registry, "127.0.0.1:5000");
        assert_eq!(local.repository, "swesmith/task-07");
        assert_eq!(local.tag.as_deref(), Some("baseanchor-1"));
        assert_eq!(local.base_url(), "http://127.0.0.1:5000");
        let pinned = parsed(&format!("ghcr.io/org/img:v1@sha256:{HEX}"));
        assert_eq!(pinned.digest.as_deref(), Some(&*format!("sha256:{HEX}")));
        assert_eq!(pinned.base_url(), "https://ghcr.io");
        assert_eq!(parsed("localhost/x").registry, "localhost");
        assert_eq!(parsed("org/img").repository, "org/img");
        assert_eq!(parsed("org/img").tag, None);
    }

    #[test]
    fn bad_references_are_refused_with_a_reason() {
        for text in [
            "",
            "has space",
            "Upper/Case",
            "img@sha256:short",
            "img@md5:abc",
            "img:",
            "a//b",
        ] {
            assert!(ImageRef::parse(text).is_err(), "{text:?} was accepted");
        }
    }

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
