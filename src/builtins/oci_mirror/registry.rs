//! A registry speaking the OCI distribution API as real registries do:
//!
//! - **authentication** follows the registry's `WWW-Authenticate`
//!   challenge: `Basic` with the configured user and password, or `Bearer`
//!   with a token asked of the challenge's `realm` for its `service` and
//!   `scope` (with the credentials, if any), kept per scope; a token given
//!   outright (`token_env`) is sent as it is. Credentials come only from the
//!   environment (a stage's `secrets`), and never reach a message;
//! - **tag listing** follows pagination (`n`, then each `Link: <…>;
//!   rel="next"`) to the end, so a quota is counted on every tag;
//! - **blobs stream** from the source to the target: a layer is never held
//!   in memory (the bound is the copy buffer, 64 KiB, whatever the layer);
//! - a **429, a 5xx or a failed connection** is tried again, three times in
//!   all, after 0.5 s, then 1 s; still failing, it is infrastructure
//!   ([`BuiltinError::Infra`], exit 75), never a verdict.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use reqwest::StatusCode;
use reqwest::blocking::{RequestBuilder, Response};
use serde_json::Value;

use super::{ACCEPT, MANIFEST_TYPE, fail};
use crate::builtins::BuiltinError;

/// How often a request is tried in all.
const TRIES: u32 = 3;

/// Tags asked for per page.
const PAGE: usize = 1000;

/// Who the registry is told we are.
pub enum Credentials {
    /// A user and password: `Basic`, or given to a token service.
    Basic { user: String, password: String },
    /// A bearer token, sent as it is.
    Token(String),
}

/// How a request authenticates, once the registry said.
#[derive(Clone)]
enum Scheme {
    /// Nothing asked for yet.
    None,
    Basic,
    /// Tokens from `realm` for `service`.
    Bearer {
        realm: String,
        service: Option<String>,
    },
}

pub struct Registry {
    /// `http(s)://host:port`.
    pub base: String,
    pub prefix: Option<String>,
    client: reqwest::blocking::Client,
    credentials: Option<Credentials>,
    scheme: RefCell<Scheme>,
    /// Bearer tokens by scope.
    tokens: RefCell<HashMap<String, String>>,
}

impl Registry {
    pub fn open(spec: &str, credentials: Option<Credentials>) -> Result<Self, BuiltinError> {
        let scheme_end = spec.find("://").map_or(0, |i| i + 3);
        let (base, prefix) = match spec[scheme_end..].find('/') {
            Some(i) => (
                &spec[..scheme_end + i],
                Some(spec[scheme_end + i + 1..].trim_matches('/').to_owned()),
            ),
            None => (spec, None),
        };
        crate::tls::install_provider();
        let client = reqwest::blocking::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(None)
            .build()
            .map_err(|e| fail(format!("cannot set up an HTTP client: {e}")))?;
        let scheme = match credentials {
            Some(Credentials::Token(_)) => Scheme::Bearer {
                realm: String::new(),
                service: None,
            },
            _ => Scheme::None,
        };
        Ok(Registry {
            base: base.trim_end_matches('/').to_owned(),
            prefix: prefix.filter(|p| !p.is_empty()),
            client,
            credentials,
            scheme: RefCell::new(scheme),
            tokens: RefCell::new(HashMap::new()),
        })
    }

    /// Sends the request `build` makes (again for each try), authenticated
    /// for `scope` as the registry asks, tried again on a busy or failing
    /// registry.
    fn send(
        &self,
        what: &str,
        scope: &str,
        build: impl Fn(&reqwest::blocking::Client) -> RequestBuilder,
    ) -> Result<Response, BuiltinError> {
        let mut challenged = false;
        let mut last = String::new();
        let mut tries = 0;
        while tries < TRIES {
            if tries > 0 {
                std::thread::sleep(Duration::from_millis(500 << (tries - 1)));
            }
            tries += 1;
            let request = self.authenticated(build(&self.client), scope, what)?;
            let response = match request.send() {
                Ok(response) => response,
                Err(e) => {
                    last = crate::causes::with_causes(&e.without_url());
                    continue;
                }
            };
            let status = response.status();
            if status == StatusCode::UNAUTHORIZED && !challenged {
                // Answered once: the challenge says how, then the same
                // request again (not a try of the budget).
                challenged = true;
                self.take_challenge(&response, scope, what)?;
                tries -= 1;
                continue;
            }
            if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
                last = format!("the registry answered {status}");
                continue;
            }
            return Ok(response);
        }
        Err(BuiltinError::Infra(format!(
            "{what}: {last} (registry {}, tried {TRIES} times)",
            self.base
        )))
    }

    /// `request` with the credentials the registry asked for.
    /// `request` with the credentials the registry asked for; a scope not
    /// asked for before gets its token from the service the registry named
    /// (a round trip fewer than waiting for its 401).
    fn authenticated(
        &self,
        request: RequestBuilder,
        scope: &str,
        what: &str,
    ) -> Result<RequestBuilder, BuiltinError> {
        let scheme = self.scheme.borrow().clone();
        Ok(match (scheme, &self.credentials) {
            (Scheme::Basic, Some(Credentials::Basic { user, password })) => {
                request.basic_auth(user, Some(password))
            }
            // A token given outright, until a challenge names a token
            // service (then that service's tokens are sent).
            (Scheme::Bearer { realm, .. }, Some(Credentials::Token(token))) if realm.is_empty() => {
                request.bearer_auth(token)
            }
            (Scheme::Bearer { realm, service }, _) => {
                let known = self.tokens.borrow().get(scope).cloned();
                let token = match known {
                    Some(token) => token,
                    None => {
                        let token = self.token(&realm, service.as_deref(), scope, what)?;
                        self.tokens
                            .borrow_mut()
                            .insert(scope.to_owned(), token.clone());
                        token
                    }
                };
                request.bearer_auth(token)
            }
            _ => request,
        })
    }

    /// Learns from a 401's challenge how to authenticate, and gets a token
    /// for `scope` when it is `Bearer`.
    fn take_challenge(
        &self,
        response: &Response,
        scope: &str,
        what: &str,
    ) -> Result<(), BuiltinError> {
        let challenge = response
            .headers()
            .get("www-authenticate")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let (kind, params) = parse_challenge(&challenge);
        match kind.to_ascii_lowercase().as_str() {
            "basic" => {
                if !matches!(self.credentials, Some(Credentials::Basic { .. })) {
                    return Err(fail(format!(
                        "{what}: the registry {} asks for a user and password (`username_env`, `password_env`, each a variable the stage lists in `secrets`)",
                        self.base
                    )));
                }
                *self.scheme.borrow_mut() = Scheme::Basic;
                Ok(())
            }
            "bearer" => {
                let realm = params.get("realm").cloned().unwrap_or_default();
                if realm.is_empty() {
                    // A token given outright and refused.
                    return Err(fail(format!(
                        "{what}: the registry {} refused the token",
                        self.base
                    )));
                }
                let service = params.get("service").cloned();
                let scope = params
                    .get("scope")
                    .cloned()
                    .unwrap_or_else(|| scope.to_owned());
                let token = self.token(&realm, service.as_deref(), &scope, what)?;
                self.tokens.borrow_mut().insert(scope.clone(), token);
                *self.scheme.borrow_mut() = Scheme::Bearer { realm, service };
                Ok(())
            }
            _ => Err(fail(format!(
                "{what}: the registry {} answered 401 without a challenge cairn can answer ({})",
                self.base,
                if challenge.is_empty() { "none" } else { &kind }
            ))),
        }
    }

    /// A token for `scope` from the token service at `realm`.
    fn token(
        &self,
        realm: &str,
        service: Option<&str>,
        scope: &str,
        what: &str,
    ) -> Result<String, BuiltinError> {
        let mut url = reqwest::Url::parse(realm).map_err(|e| {
            fail(format!(
                "{what}: the token service `{realm}` is not a URL: {e}"
            ))
        })?;
        url.query_pairs_mut().append_pair("scope", scope);
        if let Some(service) = service {
            url.query_pairs_mut().append_pair("service", service);
        }
        let mut request = self.client.get(url);
        if let Some(Credentials::Basic { user, password }) = &self.credentials {
            request = request.basic_auth(user, Some(password));
        }
        let response = request.send().map_err(|e| {
            BuiltinError::Infra(format!(
                "{what}: asking the token service for a token: {}",
                crate::causes::with_causes(&e.without_url())
            ))
        })?;
        let status = response.status();
        if !status.is_success() {
            return Err(fail(format!(
                "{what}: the token service answered {status} for scope `{scope}`"
            )));
        }
        let bytes = response.bytes().unwrap_or_default();
        let body: Value = serde_json::from_slice(&bytes).map_err(|e| {
            fail(format!(
                "{what}: the token service's answer is not JSON: {e}"
            ))
        })?;
        body["token"]
            .as_str()
            .or(body["access_token"].as_str())
            .map(str::to_owned)
            .ok_or_else(|| fail(format!("{what}: the token service gave no token")))
    }

    fn unexpected(&self, response: Response, what: &str) -> BuiltinError {
        let status = response.status();
        let body = response.text().unwrap_or_default();
        fail(format!(
            "{what}: the registry answered {status}: {}",
            body.chars().take(300).collect::<String>()
        ))
    }

    /// Every tag of `repo`, page after page.
    pub fn tags(&self, repo: &str) -> Result<BTreeSet<String>, BuiltinError> {
        let what = format!("listing the tags of {repo}");
        let scope = pull_scope(repo);
        let mut tags = BTreeSet::new();
        let mut url = format!("{}/v2/{repo}/tags/list?n={PAGE}", self.base);
        let mut asked = std::collections::HashSet::new();
        loop {
            if !asked.insert(url.clone()) {
                return Err(fail(format!(
                    "{what}: the registry's next page is one it gave already ({url})"
                )));
            }
            let response = self.send(&what, &scope, |client| client.get(&url))?;
            if response.status() == StatusCode::NOT_FOUND {
                return Ok(tags);
            }
            if !response.status().is_success() {
                return Err(self.unexpected(response, &what));
            }
            let next = response
                .headers()
                .get("link")
                .and_then(|v| v.to_str().ok())
                .and_then(next_link);
            let bytes = response.bytes().map_err(|e| fail(format!("{what}: {e}")))?;
            let body: Value = serde_json::from_slice(&bytes)
                .map_err(|e| fail(format!("{what}: not JSON: {e}")))?;
            tags.extend(
                body["tags"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|t| t.as_str().map(str::to_owned)),
            );
            match next {
                Some(next) if next.starts_with("http://") || next.starts_with("https://") => {
                    url = next
                }
                Some(next) => url = format!("{}{next}", self.base),
                None => return Ok(tags),
            }
        }
    }

    pub fn manifest(&self, repo: &str, reference: &str) -> Result<(Vec<u8>, String), BuiltinError> {
        let what = format!("reading {repo}:{reference}");
        let url = format!("{}/v2/{repo}/manifests/{reference}", self.base);
        let response = self.send(&what, &pull_scope(repo), |client| {
            client.get(&url).header("Accept", ACCEPT)
        })?;
        if !response.status().is_success() {
            return Err(self.unexpected(response, &what));
        }
        let media_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or(MANIFEST_TYPE)
            .to_owned();
        let bytes = response.bytes().map_err(|e| fail(format!("{what}: {e}")))?;
        Ok((bytes.to_vec(), media_type))
    }

    pub fn manifest_digest(&self, repo: &str, tag: &str) -> Result<Option<String>, BuiltinError> {
        let what = format!("checking {repo}:{tag}");
        let url = format!("{}/v2/{repo}/manifests/{tag}", self.base);
        let response = self.send(&what, &pull_scope(repo), |client| {
            client.head(&url).header("Accept", ACCEPT)
        })?;
        if response.status() == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !response.status().is_success() {
            return Err(self.unexpected(response, &what));
        }
        Ok(response
            .headers()
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned))
    }

    pub fn has_blob(&self, repo: &str, digest: &str) -> Result<bool, BuiltinError> {
        let what = format!("checking blob {digest} in {repo}");
        let url = format!("{}/v2/{repo}/blobs/{digest}", self.base);
        let response = self.send(&what, &push_scope(repo), |client| client.head(&url))?;
        match response.status() {
            s if s.is_success() => Ok(true),
            StatusCode::NOT_FOUND => Ok(false),
            _ => Err(self.unexpected(response, &what)),
        }
    }

    /// A reader of blob `digest` of `repo`, streamed as it is read.
    pub fn blob_reader(&self, repo: &str, digest: &str) -> Result<Response, BuiltinError> {
        let what = format!("reading blob {digest} of {repo}");
        let url = format!("{}/v2/{repo}/blobs/{digest}", self.base);
        let response = self.send(&what, &pull_scope(repo), |client| client.get(&url))?;
        if !response.status().is_success() {
            return Err(self.unexpected(response, &what));
        }
        Ok(response)
    }

    /// Uploads blob `digest` of `size` bytes to `repo`, its bytes read from
    /// what `open` gives (opened again for each try): one PUT of a body
    /// streamed from it.
    pub fn put_blob(
        &self,
        repo: &str,
        digest: &str,
        size: u64,
        open: impl Fn() -> Result<Box<dyn std::io::Read + Send>, BuiltinError>,
    ) -> Result<(), BuiltinError> {
        let what = format!("uploading blob {digest} to {repo}");
        let scope = push_scope(repo);
        let url = format!("{}/v2/{repo}/blobs/uploads/", self.base);
        let mut last = String::new();
        for attempt in 0..TRIES {
            if attempt > 0 {
                std::thread::sleep(Duration::from_millis(500 << (attempt - 1)));
            }
            let response = self.send(&what, &scope, |client| client.post(&url))?;
            if response.status() != StatusCode::ACCEPTED {
                return Err(self.unexpected(response, &what));
            }
            let location = response
                .headers()
                .get("location")
                .and_then(|v| v.to_str().ok())
                .ok_or_else(|| fail(format!("{what}: the registry gave no upload location")))?;
            let mut upload = if location.starts_with("http://") || location.starts_with("https://")
            {
                location.to_owned()
            } else {
                format!("{}{location}", self.base)
            };
            upload.push(if upload.contains('?') { '&' } else { '?' });
            upload.push_str(&format!("digest={digest}"));
            let body = reqwest::blocking::Body::sized(open()?, size);
            let request = self.authenticated(
                self.client
                    .put(&upload)
                    .header("Content-Type", "application/octet-stream")
                    .body(body),
                &scope,
                &what,
            )?;
            match request.send() {
                Ok(response) if response.status() == StatusCode::CREATED => return Ok(()),
                Ok(response)
                    if response.status() == StatusCode::TOO_MANY_REQUESTS
                        || response.status().is_server_error() =>
                {
                    last = format!("the registry answered {}", response.status());
                }
                Ok(response) => return Err(self.unexpected(response, &what)),
                Err(e) => last = crate::causes::with_causes(&e.without_url()),
            }
        }
        Err(BuiltinError::Infra(format!(
            "{what}: {last} (registry {}, tried {TRIES} times)",
            self.base
        )))
    }

    pub fn put_manifest(
        &self,
        repo: &str,
        tag: &str,
        bytes: &[u8],
        media_type: &str,
    ) -> Result<(), BuiltinError> {
        let what = format!("pushing {repo}:{tag}");
        let url = format!("{}/v2/{repo}/manifests/{tag}", self.base);
        let response = self.send(&what, &push_scope(repo), |client| {
            client
                .put(&url)
                .header("Content-Type", media_type)
                .body(bytes.to_vec())
        })?;
        if !response.status().is_success() {
            return Err(self.unexpected(response, &what));
        }
        Ok(())
    }
}

fn pull_scope(repo: &str) -> String {
    format!("repository:{repo}:pull")
}

fn push_scope(repo: &str) -> String {
    format!("repository:{repo}:pull,push")
}

/// A challenge's scheme and its parameters: `Bearer realm="…",service="…"`.
fn parse_challenge(header: &str) -> (String, HashMap<String, String>) {
    let header = header.trim();
    let (kind, rest) = header.split_once(' ').unwrap_or((header, ""));
    let mut params = HashMap::new();
    let mut rest = rest.trim();
    while !rest.is_empty() {
        let Some((name, after)) = rest.split_once('=') else {
            break;
        };
        let name = name
            .trim()
            .trim_start_matches(',')
            .trim()
            .to_ascii_lowercase();
        let after = after.trim_start();
        let (value, remaining) = match after.strip_prefix('"') {
            Some(quoted) => match quoted.find('"') {
                Some(end) => (&quoted[..end], &quoted[end + 1..]),
                None => (quoted, ""),
            },
            None => match after.find(',') {
                Some(end) => (&after[..end], &after[end..]),
                None => (after, ""),
            },
        };
        params.insert(name, value.to_owned());
        rest = remaining.trim_start_matches([',', ' ']);
    }
    (kind.to_owned(), params)
}

/// The `rel="next"` target of a `Link` header.
fn next_link(header: &str) -> Option<String> {
    header.split(',').find_map(|link| {
        let (target, params) = link.split_once(';')?;
        params
            .split(';')
            .any(|p| p.trim().trim_start_matches("rel=").trim_matches('"') == "next")
            .then(|| {
                target
                    .trim()
                    .trim_start_matches('<')
                    .trim_end_matches('>')
                    .to_owned()
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bearer_challenge_gives_its_realm_service_and_scope() {
        let (kind, params) = parse_challenge(
            r#"Bearer realm="https://auth.example.org/token",service="registry.example.org",scope="repository:a/b:pull,push""#,
        );
        assert_eq!(kind, "Bearer");
        assert_eq!(params["realm"], "https://auth.example.org/token");
        assert_eq!(params["service"], "registry.example.org");
        assert_eq!(params["scope"], "repository:a/b:pull,push");
        let (kind, params) = parse_challenge(r#"Basic realm="Registry Realm""#);
        assert_eq!(
            (kind.as_str(), params["realm"].as_str()),
            ("Basic", "Registry Realm")
        );
    }

    #[test]
    fn the_next_page_is_the_link_marked_next() {
        assert_eq!(
            next_link(r#"</v2/a/tags/list?last=t999&n=1000>; rel="next""#).as_deref(),
            Some("/v2/a/tags/list?last=t999&n=1000")
        );
        assert_eq!(next_link(r#"</v2/a/tags/list?n=5>; rel="prev""#), None);
    }
}
