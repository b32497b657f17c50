//! `uses = "oci-mirror"`: copy container images between OCI locations, an
//! OCI image layout directory (`oci:PATH`) or a registry over HTTP
//! (`http://HOST[:PORT][/PREFIX]`, `https://…`, the distribution API).
//!
//! 1. The images wanted (one per record of the `images` input) are named
//!    deterministically in the target: repository `PREFIX-NN`, where `NN` is
//!    the shard (`sha256(source) mod shards`), tag `baseanchor-` + the first
//!    12 hex digits of `sha256(source)`.
//! 2. The target's real tags are listed, shard by shard, before anything is
//!    copied; if any shard would exceed `quota` tags, nothing is copied.
//! 3. Each image not already there is copied blob by blob (every blob's
//!    digest checked), then its manifest; a tag already holding another
//!    manifest is refused.
//! 4. The output lists, per record, the source, the target reference and the
//!    manifest digest, and for a registry target the reference a pod pulls
//!    (`reference`: `HOST[:PORT]/REPO@sha256:…`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest as _, Sha256};

mod registry;

use registry::{Credentials, Registry};

use super::{BuiltinError, Invocation, read_records, write_jsonl};
use crate::fingerprint::hex;
use crate::manifest::settings::field_text;

const MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
const INDEX_TYPE: &str = "application/vnd.oci.image.index.v1+json";
const REF_NAME: &str = "org.opencontainers.image.ref.name";
const ACCEPT: &str = "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    source: String,
    target: String,
    #[serde(default = "default_key")]
    key: String,
    #[serde(default = "default_image")]
    image: String,
    #[serde(default = "default_prefix")]
    prefix: String,
    #[serde(default = "default_shards")]
    shards: u64,
    #[serde(default = "default_quota")]
    quota: usize,
    /// A variable holding a bearer token for HTTP registries.
    #[serde(default)]
    token_env: Option<String>,
    /// Variables holding a registry user and password (both, or neither):
    /// sent as the registry's challenge asks (`Basic`, or to its token
    /// service). Name them in the stage's `secrets`.
    #[serde(default)]
    username_env: Option<String>,
    #[serde(default)]
    password_env: Option<String>,
    /// The platform copied out of a multi-platform image index.
    #[serde(default = "default_platform")]
    platform: String,
}

fn default_platform() -> String {
    "linux/amd64".to_owned()
}

/// What a mirror's output says is in its target and an OCI layout target
/// (`oci:PATH`, relative to the project root `root`) no longer holds, in
/// words; `None` if it is all there. A registry target is not asked: it is
/// the one registry every machine naming its address reaches, and asking
/// it on every `status` would put the network on the no-op path.
pub fn missing(with: &Value, mirrored: &[u8], root: &Path) -> Option<String> {
    let at = with["target"].as_str()?.strip_prefix("oci:")?;
    let dir = root.join(at);
    if !dir.join("index.json").is_file() {
        return Some(format!("the OCI layout `{at}` is gone"));
    }
    let layout = match Layout::open(&dir, false) {
        Ok(layout) => layout,
        Err(error) => return Some(error.to_string()),
    };
    let mut lacking = Vec::new();
    for line in mirrored.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let Ok(row) = serde_json::from_slice::<Value>(line) else {
            return Some("its list of mirrored images cannot be read".to_owned());
        };
        let (Some(name), Some(digest)) = (row["target"].as_str(), row["digest"].as_str()) else {
            continue;
        };
        // The test the mirror makes before it copies (the blobs are
        // checked by whatever pulls them, as from any registry).
        if layout.refs.get(name).and_then(|e| e["digest"].as_str()) != Some(digest) {
            lacking.push(name.to_owned());
        }
    }
    match lacking.as_slice() {
        [] => None,
        [one] => Some(format!("the OCI layout `{at}` lacks {one}")),
        [first, rest @ ..] => Some(format!(
            "the OCI layout `{at}` lacks {first} and {} more",
            rest.len()
        )),
    }
}

fn default_key() -> String {
    "id".to_owned()
}
fn default_image() -> String {
    "image".to_owned()
}
fn default_prefix() -> String {
    "task".to_owned()
}
fn default_shards() -> u64 {
    80
}
fn default_quota() -> usize {
    100
}

fn fail(message: impl Into<String>) -> BuiltinError {
    BuiltinError::Failed(message.into())
}

pub fn run(invocation: &Invocation) -> Result<String, BuiltinError> {
    let settings: Settings = invocation.settings()?;
    if settings.shards == 0 {
        return Err(fail("`shards` must be at least 1"));
    }
    let records = read_records(&invocation.input("images")?, "images")?;
    let source = Location::open(&settings.source, credentials(&settings)?, false)?;
    let mut target = Location::open(&settings.target, credentials(&settings)?, true)?;
    let (os, architecture) = settings.platform.split_once('/').ok_or_else(|| {
        fail(format!(
            "`platform = \"{}\"` is not OS/ARCHITECTURE (`linux/amd64`)",
            settings.platform
        ))
    })?;

    // What goes where.
    let mut wanted: BTreeMap<String, (String, String)> = BTreeMap::new();
    let mut rows = Vec::new();
    for (n, record) in records.iter().enumerate() {
        let (Some(id), Some(image)) = (
            field_text(record, &settings.key),
            field_text(record, &settings.image),
        ) else {
            return Err(fail(format!(
                "record {} has no `{}` or no `{}`",
                n + 1,
                settings.key,
                settings.image
            )));
        };
        let digest = Sha256::digest(image.as_bytes());
        let shard = u64::from_be_bytes(digest[..8].try_into().expect("8 bytes")) % settings.shards;
        let repo = target.repository(&format!("{}-{shard:02}", settings.prefix));
        let tag = format!("baseanchor-{}", &hex(&digest)[..12]);
        wanted.insert(image.clone(), (repo, tag));
        rows.push((id, image));
    }

    // The quota gate, on the target's real tags.
    let mut by_shard: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (repo, tag) in wanted.values() {
        by_shard.entry(repo).or_default().insert(tag);
    }
    let mut existing: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut over = Vec::new();
    for (repo, tags) in &by_shard {
        let present = target.tags(repo)?;
        let total = present
            .union(&tags.iter().map(|t| (*t).to_owned()).collect())
            .count();
        if total > settings.quota {
            over.push(format!(
                "{repo}: {} tags there + {} new = {total} > {}",
                present.len(),
                tags.iter().filter(|t| !present.contains(**t)).count(),
                settings.quota
            ));
        }
        existing.insert((*repo).to_owned(), present);
    }
    if !over.is_empty() {
        return Err(BuiltinError::Checks(
            std::iter::once(format!(
                "refusing to copy anything: {} shard(s) would exceed the quota of {} tags",
                over.len(),
                settings.quota
            ))
            .chain(over)
            .collect(),
        ));
    }

    // Copy what is missing.
    let mut digests: BTreeMap<String, String> = BTreeMap::new();
    let (mut copied, mut present) = (0, 0);
    for (image, (repo, tag)) in &wanted {
        let (src_repo, src_ref) = split_reference(image)?;
        let src_repo = source.repository(src_repo);
        let (bytes, media_type) = source.manifest(&src_repo, src_ref)?;
        // An image index: only the manifest for the platform asked for.
        let (bytes, media_type) = match is_index(&bytes, &media_type) {
            false => (bytes, media_type),
            true => {
                let index: Value = serde_json::from_slice(&bytes)
                    .map_err(|e| fail(format!("the index of {image} is not JSON: {e}")))?;
                let chosen = (index["manifests"].as_array().into_iter().flatten())
                    .find(|m| {
                        m["platform"]["os"] == os && m["platform"]["architecture"] == architecture
                    })
                    .ok_or_else(|| {
                        fail(format!(
                            "{image} is an image index with no manifest for {}",
                            settings.platform
                        ))
                    })?;
                let digest = chosen["digest"].as_str().unwrap_or_default();
                let (bytes, media_type) = source.manifest(&src_repo, digest)?;
                check_digest(digest, &bytes, image)?;
                (bytes, media_type)
            }
        };
        let digest = content_digest(&bytes);
        if existing[repo].contains(tag) {
            let there = target.manifest_digest(repo, tag)?;
            if there.as_deref() != Some(digest.as_str()) {
                return Err(fail(format!(
                    "{repo}:{tag} already holds {} , not {digest} ({image})",
                    there.unwrap_or_else(|| "an unreadable manifest".to_owned())
                )));
            }
            present += 1;
        } else {
            let manifest: Value = serde_json::from_slice(&bytes)
                .map_err(|e| fail(format!("the manifest of {image} is not JSON: {e}")))?;
            fn descriptor(d: &Value) -> (&str, Option<u64>) {
                (d["digest"].as_str().unwrap_or_default(), d["size"].as_u64())
            }
            let mut blobs = vec![descriptor(&manifest["config"])];
            blobs.extend((manifest["layers"].as_array().into_iter().flatten()).map(descriptor));
            for (blob, size) in blobs {
                let Some(size) = size.filter(|_| !blob.is_empty()) else {
                    return Err(fail(format!(
                        "the manifest of {image} has a blob without a digest or a size"
                    )));
                };
                if !target.has_blob(repo, blob)? {
                    target.copy_blob(&source, &src_repo, repo, blob, size, image)?;
                }
            }
            target.put_manifest(repo, tag, &bytes, &media_type)?;
            copied += 1;
        }
        digests.insert(image.clone(), digest);
    }
    target.finish()?;

    let mut out: Vec<Value> = rows
        .iter()
        .map(|(id, image)| {
            let (repo, tag) = &wanted[image];
            let mut row = serde_json::json!({
                "id": id,
                "source": image,
                "target": format!("{repo}:{tag}"),
                "digest": digests[image],
            });
            if let Some(pull) = target.pull_reference(repo, &digests[image]) {
                row["reference"] = pull.into();
            }
            row
        })
        .collect();
    out.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
    write_jsonl(&invocation.output("mirrored")?, out.iter())?;
    Ok(format!(
        "{} image(s) for {} record(s) over {} shard(s): {copied} copied, {present} already there; target {}",
        wanted.len(),
        rows.len(),
        by_shard.len(),
        settings.target
    ))
}

/// The registry credentials the settings name, read from the environment.
fn credentials(settings: &Settings) -> Result<Option<Credentials>, BuiltinError> {
    fn read(name: &Option<String>) -> Option<(&String, Option<String>)> {
        name.as_ref().map(|n| (n, std::env::var(n).ok()))
    }
    match (read(&settings.username_env), read(&settings.password_env)) {
        (Some((_, Some(user))), Some((_, Some(password)))) => {
            Ok(Some(Credentials::Basic { user, password }))
        }
        (Some((name, None)), _) | (_, Some((name, None))) => Err(fail(format!(
            "`{name}` is not set: list it in the stage's `secrets` and set it where cairn runs"
        ))),
        (Some(_), None) | (None, Some(_)) => Err(fail(
            "`username_env` and `password_env` go together: name both",
        )),
        (None, None) => Ok(settings
            .token_env
            .as_ref()
            .and_then(|name| std::env::var(name).ok())
            .map(Credentials::Token)),
    }
}

/// Whether a manifest is an image index (OCI's, or Docker's manifest list).
fn is_index(bytes: &[u8], media_type: &str) -> bool {
    const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
    if media_type.starts_with(INDEX_TYPE) || media_type.starts_with(DOCKER_LIST) {
        return true;
    }
    serde_json::from_slice::<Value>(bytes).is_ok_and(|v| {
        v["mediaType"] == INDEX_TYPE || v["mediaType"] == DOCKER_LIST || v["manifests"].is_array()
    })
}

/// An OCI content digest: `sha256:HEX`.
fn content_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", crate::release::format::sha256_hex(bytes))
}

fn check_digest(digest: &str, data: &[u8], image: &str) -> Result<(), BuiltinError> {
    let actual = content_digest(data);
    if actual != digest {
        return Err(fail(format!(
            "blob {digest} of {image} is damaged: its bytes hash to {actual}"
        )));
    }
    Ok(())
}

/// `name:tag` (or `name@sha256:…`) → (name, reference).
fn split_reference(image: &str) -> Result<(&str, &str), BuiltinError> {
    if let Some((name, digest)) = image.split_once('@') {
        return Ok((name, digest));
    }
    let slash = image.rfind('/').map_or(0, |i| i + 1);
    match image[slash..].rfind(':') {
        Some(i) => Ok((&image[..slash + i], &image[slash + i + 1..])),
        None => Err(fail(format!("`{image}` names no tag"))),
    }
}

/// Where images are read from or written to.
enum Location {
    Layout(Layout),
    Registry(Registry),
}

impl Location {
    fn open(
        spec: &str,
        credentials: Option<Credentials>,
        create: bool,
    ) -> Result<Self, BuiltinError> {
        if let Some(path) = spec.strip_prefix("oci:") {
            return Layout::open(Path::new(path), create).map(Location::Layout);
        }
        if spec.starts_with("http://") || spec.starts_with("https://") {
            return Registry::open(spec, credentials).map(Location::Registry);
        }
        Err(fail(format!(
            "`{spec}` is not an OCI location: write `oci:PATH` or `http(s)://HOST[:PORT][/PREFIX]`"
        )))
    }

    /// What a container runtime pulls `repo` at `digest` by
    /// (`HOST[:PORT]/REPO@sha256:…`); nothing pulls from a layout.
    fn pull_reference(&self, repo: &str, digest: &str) -> Option<String> {
        match self {
            Location::Layout(_) => None,
            Location::Registry(r) => {
                let host = r.base.split_once("://").map_or(&*r.base, |(_, host)| host);
                Some(format!("{host}/{repo}@{digest}"))
            }
        }
    }

    /// The full repository name for `name` (a registry adds its prefix).
    fn repository(&self, name: &str) -> String {
        match self {
            Location::Layout(_) => name.to_owned(),
            Location::Registry(r) => match &r.prefix {
                Some(prefix) => format!("{prefix}/{name}"),
                None => name.to_owned(),
            },
        }
    }

    fn tags(&self, repo: &str) -> Result<BTreeSet<String>, BuiltinError> {
        match self {
            Location::Layout(l) => Ok(l.tags(repo)),
            Location::Registry(r) => r.tags(repo),
        }
    }

    fn manifest(&self, repo: &str, reference: &str) -> Result<(Vec<u8>, String), BuiltinError> {
        match self {
            Location::Layout(l) => l.manifest(repo, reference),
            Location::Registry(r) => r.manifest(repo, reference),
        }
    }

    fn manifest_digest(&self, repo: &str, tag: &str) -> Result<Option<String>, BuiltinError> {
        match self {
            Location::Layout(l) => Ok(l
                .refs
                .get(&format!("{repo}:{tag}"))
                .map(|d| d["digest"].as_str().unwrap_or_default().to_owned())),
            Location::Registry(r) => r.manifest_digest(repo, tag),
        }
    }

    fn has_blob(&self, repo: &str, digest: &str) -> Result<bool, BuiltinError> {
        match self {
            Location::Layout(l) => Ok(l.blob_path(digest)?.is_file()),
            Location::Registry(r) => r.has_blob(repo, digest),
        }
    }

    /// A reader of blob `digest` of `repo`, streamed.
    fn blob_reader(
        &self,
        repo: &str,
        digest: &str,
    ) -> Result<Box<dyn std::io::Read + Send>, BuiltinError> {
        match self {
            Location::Layout(l) => {
                let path = l.blob_path(digest)?;
                let file = std::fs::File::open(&path)
                    .map_err(|e| crate::release::ReleaseError::io(&path, e))?;
                Ok(Box::new(file))
            }
            Location::Registry(r) => Ok(Box::new(r.blob_reader(repo, digest)?)),
        }
    }

    /// Copies blob `digest` (`size` bytes) of `source`'s `src_repo` here,
    /// into `repo`, streamed: its digest is checked as it is written (by
    /// the registry, which refuses other bytes; here, for a layout).
    fn copy_blob(
        &mut self,
        source: &Location,
        src_repo: &str,
        repo: &str,
        digest: &str,
        size: u64,
        image: &str,
    ) -> Result<(), BuiltinError> {
        match self {
            Location::Layout(l) => {
                let mut reader = source.blob_reader(src_repo, digest)?;
                l.put_blob_from(digest, &mut reader, image)
            }
            Location::Registry(r) => {
                r.put_blob(repo, digest, size, || source.blob_reader(src_repo, digest))
            }
        }
    }

    fn put_manifest(
        &mut self,
        repo: &str,
        tag: &str,
        bytes: &[u8],
        media_type: &str,
    ) -> Result<(), BuiltinError> {
        match self {
            Location::Layout(l) => l.put_manifest(repo, tag, bytes, media_type),
            Location::Registry(r) => r.put_manifest(repo, tag, bytes, media_type),
        }
    }

    fn finish(&mut self) -> Result<(), BuiltinError> {
        match self {
            Location::Layout(l) => l.write_index(),
            Location::Registry(_) => Ok(()),
        }
    }
}

/// An OCI image layout directory; images are named by the
/// `org.opencontainers.image.ref.name` annotation (`repo:tag`).
struct Layout {
    root: PathBuf,
    /// ref name → the index entry.
    refs: BTreeMap<String, Value>,
    /// Index entries without a ref name, kept as they are.
    unnamed: Vec<Value>,
}

impl Layout {
    fn open(root: &Path, create: bool) -> Result<Self, BuiltinError> {
        let index = root.join("index.json");
        let text = match std::fs::read(&index) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && create => {
                return Ok(Layout {
                    root: root.to_owned(),
                    refs: BTreeMap::new(),
                    unnamed: Vec::new(),
                });
            }
            Err(e) => return Err(crate::release::ReleaseError::io(&index, e).into()),
        };
        let value: Value = serde_json::from_slice(&text)
            .map_err(|e| fail(format!("`{}` is not an OCI index: {e}", index.display())))?;
        let mut refs = BTreeMap::new();
        let mut unnamed = Vec::new();
        for entry in value["manifests"].as_array().into_iter().flatten() {
            match entry["annotations"][REF_NAME].as_str() {
                Some(name) => {
                    refs.insert(name.to_owned(), entry.clone());
                }
                None => unnamed.push(entry.clone()),
            }
        }
        Ok(Layout {
            root: root.to_owned(),
            refs,
            unnamed,
        })
    }

    fn tags(&self, repo: &str) -> BTreeSet<String> {
        self.refs
            .keys()
            .filter_map(|name| split_reference(name).ok())
            .filter(|(r, _)| *r == repo)
            .map(|(_, tag)| tag.to_owned())
            .collect()
    }

    fn blob_path(&self, digest: &str) -> Result<PathBuf, BuiltinError> {
        let hex = digest
            .strip_prefix("sha256:")
            .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
            .ok_or_else(|| fail(format!("`{digest}` is not a sha256 digest")))?;
        Ok(self.root.join("blobs").join("sha256").join(hex))
    }

    fn blob(&self, digest: &str) -> Result<Vec<u8>, BuiltinError> {
        let path = self.blob_path(digest)?;
        std::fs::read(&path).map_err(|e| crate::release::ReleaseError::io(&path, e).into())
    }

    fn manifest(&self, repo: &str, reference: &str) -> Result<(Vec<u8>, String), BuiltinError> {
        if reference.starts_with("sha256:") {
            // A manifest by its digest (an index's child).
            let bytes = self.blob(reference)?;
            let media_type = serde_json::from_slice::<Value>(&bytes)
                .ok()
                .and_then(|v| v["mediaType"].as_str().map(str::to_owned))
                .unwrap_or_else(|| MANIFEST_TYPE.to_owned());
            return Ok((bytes, media_type));
        }
        let name = format!("{repo}:{reference}");
        let entry = self.refs.get(&name).ok_or_else(|| {
            fail(format!(
                "image `{name}` is not in the layout `{}`",
                self.root.display()
            ))
        })?;
        let digest = entry["digest"].as_str().unwrap_or_default();
        let bytes = self.blob(digest)?;
        check_digest(digest, &bytes, &name)?;
        let media_type = entry["mediaType"]
            .as_str()
            .unwrap_or(MANIFEST_TYPE)
            .to_owned();
        Ok((bytes, media_type))
    }

    /// Writes blob `digest` from `reader`, hashed as it is written, moved
    /// into place only if its digest is `digest`.
    fn put_blob_from(
        &self,
        digest: &str,
        reader: &mut dyn std::io::Read,
        image: &str,
    ) -> Result<(), BuiltinError> {
        use std::io::Write as _;
        let path = self.blob_path(digest)?;
        let parent = self.root.join("blobs").join("sha256");
        let parent = parent.as_path();
        std::fs::create_dir_all(parent).map_err(|e| crate::release::ReleaseError::io(parent, e))?;
        let io = |e| crate::release::ReleaseError::io(parent, e);
        let mut tmp = tempfile::NamedTempFile::new_in(parent).map_err(io)?;
        let mut hasher = Sha256::new();
        let mut buffer = vec![0; 64 * 1024];
        loop {
            let n = reader.read(&mut buffer).map_err(|e| {
                BuiltinError::Infra(format!("reading blob {digest} of {image}: {e}"))
            })?;
            if n == 0 {
                break;
            }
            hasher.update(&buffer[..n]);
            tmp.write_all(&buffer[..n]).map_err(io)?;
        }
        let found = format!("sha256:{}", hex(&hasher.finalize()));
        if found != digest {
            return Err(fail(format!(
                "blob {digest} of {image} is damaged: its bytes hash to {found}"
            )));
        }
        tmp.as_file().sync_all().map_err(io)?;
        tmp.persist(&path)
            .map_err(|e| crate::release::ReleaseError::io(&path, e.error))?;
        Ok(())
    }

    fn put_blob(&self, digest: &str, data: &[u8]) -> Result<(), BuiltinError> {
        let path = self.blob_path(digest)?;
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| crate::release::ReleaseError::io(parent, e))?;
        }
        crate::release::write_atomic(&path, data).map_err(Into::into)
    }

    fn put_manifest(
        &mut self,
        repo: &str,
        tag: &str,
        bytes: &[u8],
        media_type: &str,
    ) -> Result<(), BuiltinError> {
        let digest = content_digest(bytes);
        self.put_blob(&digest, bytes)?;
        let name = format!("{repo}:{tag}");
        self.refs.insert(
            name.clone(),
            serde_json::json!({
                "mediaType": media_type,
                "digest": digest,
                "size": bytes.len(),
                "annotations": { REF_NAME: name },
            }),
        );
        Ok(())
    }

    fn write_index(&self) -> Result<(), BuiltinError> {
        std::fs::create_dir_all(&self.root)
            .map_err(|e| crate::release::ReleaseError::io(&self.root, e))?;
        crate::release::write_atomic(
            &self.root.join("oci-layout"),
            br#"{"imageLayoutVersion":"1.0.0"}"#,
        )?;
        let manifests: Vec<&Value> = self.unnamed.iter().chain(self.refs.values()).collect();
        let index = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": INDEX_TYPE,
            "manifests": manifests,
        });
        let bytes = serde_json::to_vec(&index).expect("JSON values serialise");
        crate::release::write_atomic(&self.root.join("index.json"), &bytes).map_err(Into::into)
    }
}

#[cfg(test)]
mod tests {
    use super::split_reference;

    #[test]
    fn references_split_at_the_tag_not_the_port() {
        assert_eq!(
            split_reference("swesmith/a__b:base").unwrap(),
            ("swesmith/a__b", "base")
        );
        assert_eq!(
            split_reference("host:5000/a/b:v1").unwrap(),
            ("host:5000/a/b", "v1")
        );
        assert!(split_reference("host:5000/a/b").is_err());
    }
}
