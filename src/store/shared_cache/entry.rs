//! Action entries: what a remote cache holds under `/ac/<key>` for one
//! stage fingerprint or one item fingerprint, as canonical JSON signed
//! with ed25519.
//!
//! An entry carries its fingerprint's pre-image (so `why` can compare
//! across machines and the fingerprint is checked, not believed), the
//! outputs to restore, every blob they need by both digests, an item's
//! outcome, and who made it. The signature covers the canonical bytes of
//! the whole entry; the AC key is derived from the fingerprint, and a
//! verified entry must name the very fingerprint it was fetched for, so a
//! signed entry cannot be replayed under another key.

use serde::{Deserialize, Serialize};

use super::signing::{self, PublicKey, SigningKey};
use crate::fingerprint::{Digest, StageKey, item_fingerprint};
use crate::store::OutputRecord;

/// The format of an entry, and the tag its signature covers.
pub const ENTRY_FORMAT: &str = "cairn.cache-entry/1";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub format: String,
    pub fingerprint: Digest,
    /// The stage that produced it (informational: the fingerprint decides).
    pub stage: String,
    #[serde(flatten)]
    pub what: What,
    pub outputs: Vec<OutputRecord>,
    /// Every stored object the outputs need: files, tree listings, small
    /// files (kept inline by the producer).
    pub blobs: Vec<Blob>,
    pub producer: Producer,
}

/// What the fingerprint is of, with its pre-image.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum What {
    /// A stage's result; `key` is its full stage key.
    Stage { key: StageKey },
    /// One item of a per-item stage and its final outcome.
    Item {
        item: String,
        /// The stage code's fingerprint, the item's canonical JSON and
        /// the digests of what it reads: the item fingerprint's pre-image.
        code: Digest,
        canonical: String,
        inputs: Vec<(String, Digest)>,
        class: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rule: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        result: Option<String>,
    },
}

/// One stored object, by its BLAKE3 digest (the store's name for it) and
/// its SHA-256 digest (its name on the remote, `/cas/<sha256>`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Blob {
    pub blake3: Digest,
    pub sha256: String,
    pub size: u64,
    pub role: Role,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// A file in `objects/`.
    Object,
    /// A directory's listing (`trees/`).
    Tree,
    /// A small file the producer kept in its ledger.
    Inline,
}

/// Who made a result, and when.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Producer {
    pub cairn: String,
    pub host: String,
    /// The engine its command ran on (`local`, `slurm`, `kubernetes`).
    pub executor: String,
    pub started_ms: i64,
    pub finished_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
}

/// An entry as stored: the entry and its signature.
#[derive(Debug, Serialize, Deserialize)]
struct Envelope {
    entry: serde_json::Value,
    signature: Signature,
}

#[derive(Debug, Serialize, Deserialize)]
struct Signature {
    key: String,
    ed25519: String,
}

/// Why a fetched entry is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("it is not a signed cairn cache entry ({0})")]
    Unreadable(String),
    #[error("it is signed by {0}, a key this workspace does not trust")]
    Untrusted(String),
    #[error("its signature does not verify")]
    BadSignature,
    #[error("it is for {found}, not for {wanted}")]
    OtherFingerprint { wanted: String, found: String },
    #[error("its pre-image hashes to {0}, not to its fingerprint")]
    PreImage(String),
    #[error("it does not say how to get {0}")]
    MissingBlob(String),
    #[error("blob {sha256}: {detail}")]
    Blob { sha256: String, detail: String },
}

/// The bytes a signature covers: the format tag, then the entry's
/// canonical JSON.
fn signed_bytes(entry: &serde_json::Value) -> Vec<u8> {
    let mut bytes = ENTRY_FORMAT.as_bytes().to_vec();
    bytes.push(0);
    bytes.extend_from_slice(crate::canonical_json::to_string(entry).as_bytes());
    bytes
}

impl Entry {
    /// The entry, signed by `key`, as the bytes to upload.
    pub fn sign(&self, key: &SigningKey) -> Vec<u8> {
        let value = serde_json::to_value(self).expect("entries serialise");
        let signature = key.sign(&signed_bytes(&value));
        let envelope = Envelope {
            entry: value,
            signature: Signature {
                key: key.public().to_string(),
                ed25519: signing::encode(&signature),
            },
        };
        let value = serde_json::to_value(&envelope).expect("envelopes serialise");
        crate::canonical_json::to_string(&value).into_bytes()
    }

    /// Reads an entry fetched for `wanted`: signed by a key in `trusted`,
    /// for that fingerprint, with a pre-image that hashes to it, and
    /// naming a blob for every output.
    pub fn verify(bytes: &[u8], wanted: &Digest, trusted: &[PublicKey]) -> Result<Self, Refusal> {
        let envelope: Envelope =
            serde_json::from_slice(bytes).map_err(|e| Refusal::Unreadable(e.to_string()))?;
        let key = PublicKey::parse(&envelope.signature.key).map_err(Refusal::Unreadable)?;
        if !trusted.contains(&key) {
            return Err(Refusal::Untrusted(key.to_string()));
        }
        let signature =
            signing::decode(&envelope.signature.ed25519).ok_or(Refusal::BadSignature)?;
        if !key.verifies(&signed_bytes(&envelope.entry), &signature) {
            return Err(Refusal::BadSignature);
        }
        let entry: Entry = serde_json::from_value(envelope.entry)
            .map_err(|e| Refusal::Unreadable(e.to_string()))?;
        if entry.format != ENTRY_FORMAT {
            return Err(Refusal::Unreadable(format!("format `{}`", entry.format)));
        }
        if entry.fingerprint != *wanted {
            return Err(Refusal::OtherFingerprint {
                wanted: wanted.to_string(),
                found: entry.fingerprint.to_string(),
            });
        }
        let computed = match &entry.what {
            What::Stage { key } => key.fingerprint(),
            What::Item {
                code,
                canonical,
                inputs,
                ..
            } => item_fingerprint(code, canonical, inputs),
        };
        if computed != entry.fingerprint {
            return Err(Refusal::PreImage(computed.to_string()));
        }
        for output in &entry.outputs {
            let role = match output.kind {
                crate::store::OutputKind::Dir => Role::Tree,
                crate::store::OutputKind::File if output.inline => Role::Inline,
                crate::store::OutputKind::File => Role::Object,
            };
            if !entry
                .blobs
                .iter()
                .any(|b| b.blake3 == output.digest && b.role == role)
            {
                return Err(Refusal::MissingBlob(output.path.clone()));
            }
        }
        Ok(entry)
    }

    /// The blob of role `role` with BLAKE3 digest `digest`, if listed.
    pub fn blob(&self, digest: &Digest, role: Role) -> Option<&Blob> {
        self.blobs
            .iter()
            .find(|b| b.blake3 == *digest && b.role == role)
    }
}

/// The remote's name for the entry of `fingerprint`: a SHA-256 hex, as
/// Bazel-style caches expect of `/ac/` keys, namespaced so that no other
/// tool's key collides.
pub fn action_key(fingerprint: &Digest) -> String {
    use sha2::Digest as _;
    let mut hasher = sha2::Sha256::new();
    hasher.update(ENTRY_FORMAT.as_bytes());
    hasher.update([0]);
    hasher.update(fingerprint.as_bytes());
    crate::fingerprint::hex(&hasher.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fingerprint::Component;

    fn key_pair(dir: &std::path::Path, name: &str) -> SigningKey {
        SigningKey::create(&dir.join(name)).unwrap()
    }

    fn sample() -> Entry {
        let mut key = StageKey::default();
        key.insert("command", Component::of_value("command", b"true", "true"));
        Entry {
            format: ENTRY_FORMAT.to_owned(),
            fingerprint: key.fingerprint(),
            stage: "s".to_owned(),
            what: What::Stage { key },
            outputs: Vec::new(),
            blobs: Vec::new(),
            producer: Producer {
                cairn: "0".to_owned(),
                host: "h".to_owned(),
                executor: "local".to_owned(),
                started_ms: 1,
                finished_ms: 2,
                exit_code: Some(0),
            },
        }
    }

    #[test]
    fn a_signed_entry_verifies_only_under_a_trusted_key_and_its_own_fingerprint() {
        let dir = tempfile::tempdir().unwrap();
        let (mine, theirs) = (key_pair(dir.path(), "a"), key_pair(dir.path(), "b"));
        let entry = sample();
        let bytes = entry.sign(&mine);
        let verified = Entry::verify(&bytes, &entry.fingerprint, &[mine.public()]).unwrap();
        assert_eq!(verified, entry);
        assert!(matches!(
            Entry::verify(&bytes, &entry.fingerprint, &[theirs.public()]),
            Err(Refusal::Untrusted(_))
        ));
        let other = Digest::of(b"other");
        assert!(matches!(
            Entry::verify(&bytes, &other, &[mine.public()]),
            Err(Refusal::OtherFingerprint { .. })
        ));
    }

    #[test]
    fn a_changed_byte_breaks_the_signature() {
        let dir = tempfile::tempdir().unwrap();
        let mine = key_pair(dir.path(), "a");
        let entry = sample();
        let text = String::from_utf8(entry.sign(&mine)).unwrap();
        let forged = text.replace("\"host\":\"h\"", "\"host\":\"x\"");
        assert_ne!(forged, text);
        assert_eq!(
            Entry::verify(forged.as_bytes(), &entry.fingerprint, &[mine.public()]),
            Err(Refusal::BadSignature)
        );
    }

    #[test]
    fn a_pre_image_that_is_not_the_fingerprints_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mine = key_pair(dir.path(), "a");
        let mut entry = sample();
        entry.fingerprint = Digest::of(b"claimed");
        let bytes = entry.sign(&mine);
        assert!(matches!(
            Entry::verify(&bytes, &entry.fingerprint, &[mine.public()]),
            Err(Refusal::PreImage(_))
        ));
    }
}
