//! The HTTP cache protocol Bazel's HTTP cache, bazel-remote and an nginx
//! WebDAV server all serve: `GET`/`PUT`/`HEAD` of `/cas/<sha256>` for
//! bytes and `/ac/<key>` for action entries. The server is trusted with
//! nothing: every byte read back is checked by the caller.

use std::path::Path;
use std::time::Duration;

use reqwest::StatusCode;

use crate::fingerprint::Digest;

/// A failure to talk to the remote (not a miss, not a refusal).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct Unavailable(pub String);

#[derive(Clone)]
pub struct HttpCache {
    client: reqwest::Client,
    base: String,
    /// `base` without any `user:password@`: what messages and the ledger
    /// name.
    shown: String,
    /// The `Authorization` header's value; never logged.
    auth: Option<reqwest::header::HeaderValue>,
    /// How long a request may take in all (a blob's: more by its size).
    timeout: Duration,
}

/// The largest entry believed: an entry names outputs, not their bytes.
const ENTRY_LIMIT: u64 = 16 << 20;

/// The slowest transfer a blob is allowed (beyond the request timeout).
const MIN_RATE: u64 = 1 << 20;

impl std::fmt::Debug for HttpCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpCache")
            .field("base", &self.shown)
            .finish()
    }
}

/// Bytes downloaded to a file and hashed on the way.
pub struct Downloaded {
    pub size: u64,
    pub blake3: Digest,
}

impl HttpCache {
    pub fn new(url: &str, auth: Option<String>, timeout: Duration) -> Result<Self, String> {
        crate::tls::install_provider();
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5).min(timeout))
            .read_timeout(timeout)
            .pool_max_idle_per_host(64)
            .build()
            .map_err(|e| format!("cannot build an HTTP client: {e}"))?;
        let auth = match auth {
            None => None,
            Some(value) => {
                let mut value = reqwest::header::HeaderValue::from_str(&value).map_err(|_| {
                    "the remote cache's auth value is not a valid header".to_owned()
                })?;
                value.set_sensitive(true);
                Some(value)
            }
        };
        Ok(Self {
            client,
            base: url.trim_end_matches('/').to_owned(),
            shown: without_credentials(url.trim_end_matches('/')),
            auth,
            timeout,
        })
    }

    /// The address, without credentials.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// A request that must be over, body and all, within the timeout (a
    /// blob of `size` bytes: plus a second a MiB), however slowly a server
    /// trickles its bytes.
    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.request_for(method, path, 0)
    }

    fn request_for(
        &self,
        method: reqwest::Method,
        path: &str,
        size: u64,
    ) -> reqwest::RequestBuilder {
        let allowed = self.timeout + Duration::from_secs(size / MIN_RATE);
        let request = self
            .client
            .request(method, format!("{}/{path}", self.base))
            .timeout(allowed);
        match &self.auth {
            Some(value) => request.header(reqwest::header::AUTHORIZATION, value.clone()),
            None => request,
        }
    }

    /// What went wrong with a request, with its causes (a refused
    /// connection, a timeout), never with credentials.
    fn failed(&self, what: &str, error: impl std::fmt::Display) -> Unavailable {
        Unavailable(format!("{what} on {}: {error}", self.shown))
    }

    fn failed_request(&self, what: &str, error: reqwest::Error) -> Unavailable {
        let error = error.without_url();
        let mut text = if error.is_timeout() {
            "timed out".to_owned()
        } else {
            error.to_string()
        };
        let mut source = std::error::Error::source(&error);
        while let Some(cause) = source {
            let cause = cause.to_string();
            if !text.contains(&cause) {
                text.push_str(": ");
                text.push_str(&cause);
            }
            source = source.and_then(std::error::Error::source);
        }
        self.failed(what, text)
    }

    /// `GET /ac/KEY`: `None` on 404.
    pub async fn get_entry(&self, key: &str) -> Result<Option<Vec<u8>>, Unavailable> {
        let path = format!("ac/{key}");
        let mut response = self
            .request(reqwest::Method::GET, &path)
            .send()
            .await
            .map_err(|e| self.failed_request("GET /ac", e))?;
        match response.status() {
            StatusCode::NOT_FOUND => Ok(None),
            status if status.is_success() => {
                let too_big = || {
                    self.failed(
                        "GET /ac",
                        format!("an entry of more than {ENTRY_LIMIT} bytes"),
                    )
                };
                if response.content_length().is_some_and(|n| n > ENTRY_LIMIT) {
                    return Err(too_big());
                }
                let mut bytes = Vec::new();
                while let Some(chunk) = response
                    .chunk()
                    .await
                    .map_err(|e| self.failed_request("GET /ac", e))?
                {
                    if (bytes.len() + chunk.len()) as u64 > ENTRY_LIMIT {
                        return Err(too_big());
                    }
                    bytes.extend_from_slice(&chunk);
                }
                Ok(Some(bytes))
            }
            status => Err(self.failed("GET /ac", status)),
        }
    }

    /// `PUT /ac/KEY`.
    pub async fn put_entry(&self, key: &str, bytes: Vec<u8>) -> Result<(), Unavailable> {
        self.put(&format!("ac/{key}"), bytes, "PUT /ac").await
    }

    /// `HEAD /cas/SHA256`: whether the remote holds the blob.
    pub async fn has_blob(&self, sha256: &str) -> Result<bool, Unavailable> {
        let response = self
            .request(reqwest::Method::HEAD, &format!("cas/{sha256}"))
            .send()
            .await
            .map_err(|e| self.failed_request("HEAD /cas", e))?;
        match response.status() {
            StatusCode::NOT_FOUND => Ok(false),
            status if status.is_success() => Ok(true),
            status => Err(self.failed("HEAD /cas", status)),
        }
    }

    /// `PUT /cas/SHA256` of the file `path`, streamed.
    pub async fn put_blob_file(
        &self,
        sha256: &str,
        path: &Path,
        size: u64,
    ) -> Result<Result<(), Unavailable>, std::io::Error> {
        let file = tokio::fs::File::open(path).await?;
        let body = reqwest::Body::wrap_stream(tokio_util::io::ReaderStream::with_capacity(
            file,
            256 * 1024,
        ));
        Ok(self
            .put_sized(&format!("cas/{sha256}"), body, "PUT /cas", size)
            .await)
    }

    /// `PUT /cas/SHA256` of bytes in memory.
    pub async fn put_blob_bytes(&self, sha256: &str, bytes: Vec<u8>) -> Result<(), Unavailable> {
        self.put(&format!("cas/{sha256}"), bytes, "PUT /cas").await
    }

    async fn put(&self, path: &str, bytes: Vec<u8>, what: &str) -> Result<(), Unavailable> {
        let size = bytes.len() as u64;
        self.put_sized(path, reqwest::Body::from(bytes), what, size)
            .await
    }

    /// `PUT` of `size` bytes, the length always stated: a body sent
    /// without one (as an empty body was) is refused by nginx's WebDAV
    /// module ("PUT request body must be in a file").
    async fn put_sized(
        &self,
        path: &str,
        body: reqwest::Body,
        what: &str,
        size: u64,
    ) -> Result<(), Unavailable> {
        let response = self
            .request_for(reqwest::Method::PUT, path, size)
            .header(reqwest::header::CONTENT_LENGTH, size)
            .body(body)
            .send()
            .await
            .map_err(|e| self.failed_request(what, e))?;
        if response.status().is_success() {
            Ok(())
        } else {
            Err(self.failed(what, response.status()))
        }
    }

    /// `GET /cas/SHA256` into the file `dest`, hashing its BLAKE3 as the
    /// bytes arrive, its writeback started once complete (the caller syncs
    /// it before it publishes it); `Ok(None)` on 404. At most
    /// `limit` bytes are taken: a server that sends more is not believed.
    /// The SHA-256 is only the address asked for: the caller checks the
    /// bytes against the BLAKE3 digest its signed entry names, which alone
    /// decides (re-hashing SHA-256 too took a third of a restore's CPU).
    pub async fn get_blob(
        &self,
        sha256: &str,
        dest: &Path,
        limit: u64,
    ) -> Result<Option<Downloaded>, Unavailable> {
        let mut response = self
            .request_for(reqwest::Method::GET, &format!("cas/{sha256}"), limit)
            .send()
            .await
            .map_err(|e| self.failed_request("GET /cas", e))?;
        match response.status() {
            StatusCode::NOT_FOUND => return Ok(None),
            status if status.is_success() => {}
            status => return Err(self.failed("GET /cas", status)),
        }
        // Hashed and written on a thread of the blocking pool, as the
        // chunks arrive: several downloads hash on several cores, and the
        // event loop only moves bytes.
        let (chunks, mut arriving) = tokio::sync::mpsc::channel::<bytes::Bytes>(16);
        let path = dest.to_owned();
        let writer = tokio::task::spawn_blocking(move || -> std::io::Result<Downloaded> {
            use std::io::Write as _;
            let mut out = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)?;
            let mut blake3 = blake3::Hasher::new();
            let mut size = 0u64;
            while let Some(chunk) = arriving.blocking_recv() {
                blake3.update(&chunk);
                out.write_all(&chunk)?;
                size += chunk.len() as u64;
            }
            // On its way to the disk while other downloads still arrive;
            // synced before it is published.
            crate::store::objects::start_writeback(&out);
            Ok(Downloaded {
                size,
                blake3: Digest::from_hash(blake3.finalize()),
            })
        });
        let mut size = 0u64;
        let mut failed = None;
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    size += chunk.len() as u64;
                    // More than promised is not believed (nor kept).
                    if size > limit || chunks.send(chunk).await.is_err() {
                        break;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    failed = Some(self.failed_request("GET /cas", e));
                    break;
                }
            }
        }
        drop(chunks);
        let written = writer
            .await
            .map_err(|e| Unavailable(e.to_string()))?
            .map_err(|e| Unavailable(format!("cannot write `{}`: {e}", dest.display())))?;
        if let Some(failed) = failed {
            return Err(failed);
        }
        Ok(Some(Downloaded {
            // A server that sent more than the limit is told apart by size.
            size: size.max(written.size),
            ..written
        }))
    }
}

/// `scheme://user:password@host/…` → `scheme://host/…`.
pub fn without_credentials(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://{}", &rest[at + 1..]),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::without_credentials;

    #[test]
    fn credentials_in_an_address_are_never_shown() {
        assert_eq!(
            without_credentials("https://ci:s3cret@cache.internal:8080/cairn"),
            "https://cache.internal:8080/cairn"
        );
        assert_eq!(without_credentials("http://cache/a@b"), "http://cache/a@b");
        assert_eq!(without_credentials("http://cache"), "http://cache");
    }
}
