//! Container image references, as Docker reads them:
//! `[HOST[:PORT]/]PATH[:TAG][@sha256:HEX]`. A first component with a `.` or
//! `:` in it, or `localhost`, is the registry; otherwise the registry is
//! Docker Hub (`library/` before a one-component path).

const DOCKER_HUB: &str = "registry-1.docker.io";

/// `text` as a digest (`sha256:` and 64 hex digits, lower-cased), if it is
/// one.
pub fn sha256_digest(text: &str) -> Option<String> {
    let hex = text.strip_prefix("sha256:")?;
    (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| format!("sha256:{}", hex.to_ascii_lowercase()))
}

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
            Some((rest, digest)) => (
                rest,
                Some(
                    sha256_digest(digest)
                        .ok_or_else(|| bad("a digest is `sha256:` and 64 hex digits"))?,
                ),
            ),
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
    pub fn pinned_to(&self, digest: &str) -> PinnedImage {
        PinnedImage {
            reference: format!("{}/{}@{digest}", self.registry, self.repository),
            digest: digest.to_owned(),
        }
    }

    /// The registry's API root (`http://` for loopback, else `https://`).
    pub fn api_root(&self) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> ImageRef {
        ImageRef::parse(text).unwrap()
    }

    const HEX: &str = "abababababababababababababababababababababababababababababababab";

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
        assert_eq!(local.api_root(), "http://127.0.0.1:5000");
        let pinned = parsed(&format!("ghcr.io/org/img:v1@sha256:{HEX}"));
        assert_eq!(pinned.digest.as_deref(), Some(&*format!("sha256:{HEX}")));
        assert_eq!(pinned.api_root(), "https://ghcr.io");
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
}
