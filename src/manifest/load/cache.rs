//! `[cache]`: how stored files share the disk with the workspace (`link`),
//! and the shared cache a workspace reads results from and writes them to
//! (`[cache.remote]`).

use super::*;

const CACHE_KEYS: &[&str] = &["link", "remote"];
const REMOTE_KEYS: &[&str] = &["url", "trust", "auth", "key", "upload", "timeout"];

impl Checker<'_> {
    pub(super) fn cache(&mut self, entries: &[Entry]) -> (Link, Option<RemoteCacheSpec>) {
        let Some(entry) = find(entries, "cache") else {
            return (Link::Copy, None);
        };
        let Some(table) = self.expect_table(&entry.value, "`cache`") else {
            return (Link::Copy, None);
        };
        self.unknown_keys(table, CACHE_KEYS, "`[cache]`");
        let link = match find(table, "link").map(|e| (&e.value, e.value.as_str())) {
            None | Some((_, Some("copy"))) => Link::Copy,
            Some((_, Some("reflink"))) => Link::Reflink,
            Some((_, Some("hardlink"))) => Link::Hardlink,
            Some((node, _)) => {
                self.problems.push(
                    Problem::new("`link` must be \"copy\", \"reflink\" or \"hardlink\"", node.span.clone(), "here")
                        .help("\"copy\" keeps two copies; \"reflink\" shares blocks where the file system can (else copies); \"hardlink\" shares one read-only file (see docs/manifest.md)"),
                );
                Link::Copy
            }
        };
        (link, self.remote(table))
    }

    fn remote(&mut self, table: &[Entry]) -> Option<RemoteCacheSpec> {
        let remote = find(table, "remote")?;
        let spec = self.expect_table(&remote.value, "`cache.remote`")?;
        self.unknown_keys(spec, REMOTE_KEYS, "`[cache.remote]`");
        let url = match find(spec, "url") {
            None => {
                self.problems.push(
                    Problem::new("`[cache.remote]` has no `url`", remote.key_span.clone(), "here")
                        .help("write the cache's address, e.g. `url = \"http://cache.internal:8080/cairn\"`"),
                );
                None
            }
            Some(e) => self.string(&e.value, "`url`").filter(|url| {
                let http = url.starts_with("http://") || url.starts_with("https://");
                if !http {
                    self.problems.push(
                        Problem::new(format!("`url` must be an http:// or https:// address, found `{url}`"), e.value.span.clone(), "here")
                            .help("a remote cache speaks HTTP: `GET`/`PUT` of `/cas/…` and `/ac/…` under this address"),
                    );
                    return false;
                }
                if url.contains(['?', '#']) {
                    self.problems.push(
                        Problem::new("`url` must not hold a query or a fragment (`?`, `#`)", e.value.span.clone(), "here")
                            .help("`/cas/…` and `/ac/…` are appended to the address's path"),
                    );
                    return false;
                }
                true
            }),
        };
        let mut trust = Vec::new();
        if let Some(e) = find(spec, "trust") {
            match e.value.as_array() {
                None => self.type_error(&e.value, "`trust`", "an array of public keys"),
                Some(keys) => {
                    for key in keys {
                        let Some(text) = self.string(key, "a trusted key") else {
                            continue;
                        };
                        if let Err(problem) = check_public_key(&text) {
                            self.problems.push(
                                Problem::new(problem, key.span.clone(), "here")
                                    .help("`cairn key` prints a machine's public key to trust, `ed25519:` and 44 base64 characters"),
                            );
                        } else {
                            trust.push(text);
                        }
                    }
                }
            }
        }
        let auth = find(spec, "auth").and_then(|e| {
            let name = self.string(&e.value, "`auth`")?;
            let plain = !name.is_empty()
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !name.starts_with(|c: char| c.is_ascii_digit());
            if !plain {
                self.problems.push(
                    Problem::new(format!("`auth` names an environment variable, and `{name}` is not one"), e.value.span.clone(), "here")
                        .help("write the name of the variable holding the `Authorization` header's value, e.g. `auth = \"CAIRN_CACHE_AUTH\"`; the value itself never goes in the manifest"),
                );
                return None;
            }
            Some(name)
        });
        let key = find(spec, "key").and_then(|e| self.string(&e.value, "`key`"));
        let upload = match find(spec, "upload").map(|e| &e.value) {
            None => true,
            Some(Node {
                kind: NodeKind::Boolean(b),
                ..
            }) => *b,
            Some(node) => {
                self.type_error(node, "`upload`", "true or false");
                true
            }
        };
        let timeout = find(spec, "timeout")
            .and_then(|e| self.timeout(&e.value))
            .unwrap_or(RemoteCacheSpec::DEFAULT_TIMEOUT);
        Some(RemoteCacheSpec {
            url: url?,
            trust,
            auth,
            key,
            upload,
            timeout,
        })
    }
}

/// Whether `text` reads as `ed25519:BASE64` of 32 bytes.
fn check_public_key(text: &str) -> Result<(), String> {
    use base64::Engine as _;
    if text.starts_with("ed25519-seed:") {
        // Not echoed: it is a secret.
        return Err("this is a signing key's seed, a secret, not a public key: take it out of the manifest (and make a new key; `cairn key` prints the public half of one)".to_owned());
    }
    let body = text
        .strip_prefix("ed25519:")
        .ok_or_else(|| format!("`{text}` is not an ed25519 public key"))?;
    match base64::engine::general_purpose::STANDARD.decode(body) {
        Ok(bytes) if bytes.len() == 32 => Ok(()),
        Ok(bytes) => Err(format!("`{text}` holds {} bytes, not 32", bytes.len())),
        Err(_) => Err(format!("`{text}` is not valid base64")),
    }
}
