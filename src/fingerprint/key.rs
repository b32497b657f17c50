//! The stage key: a typed, versioned pre-image of a stage's fingerprint.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::digest::Digest;

/// Bumped whenever the encoding below or the meaning of a component changes;
/// every recorded fingerprint then differs, so nothing stale is reused.
pub const KEY_SCHEMA_VERSION: u32 = 1;

/// One thing a stage's result depends on: its digest, and a short
/// human-readable description of the value (never hashed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Component {
    pub digest: Digest,
    pub detail: String,
}

impl Component {
    /// A component whose value is `content`, tagged by `kind` so that equal
    /// bytes of different kinds never collide.
    pub fn of_value(kind: &str, content: &[u8], detail: impl Into<String>) -> Self {
        Self::of_parts(kind, [content], detail)
    }

    /// [`Self::of_value`] of the concatenation of `parts`, hashed as they
    /// come (a million items' listing is never held whole).
    pub fn of_parts<'a>(
        kind: &str,
        parts: impl IntoIterator<Item = &'a [u8]>,
        detail: impl Into<String>,
    ) -> Self {
        let mut hasher = blake3::Hasher::new();
        hasher.update(kind.as_bytes());
        hasher.update(&[0]);
        for part in parts {
            hasher.update(part);
        }
        Self {
            digest: Digest::from_hash(hasher.finalize()),
            detail: detail.into(),
        }
    }

    /// What to show for the value: the detail, or the digest when the
    /// digest is the value (inputs).
    pub fn shown(&self) -> String {
        if self.detail.is_empty() {
            self.digest.to_string()
        } else {
            self.detail.clone()
        }
    }

    /// A component that is already a content digest (an input file).
    pub fn of_digest(digest: Digest, detail: impl Into<String>) -> Self {
        Self {
            digest,
            detail: detail.into(),
        }
    }
}

/// Component names are namespaced: `command`, `checks`, `outputs`,
/// `version`, `param:NAME`, `env:NAME`, `input:PATH`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageKey {
    pub components: BTreeMap<String, Component>,
}

impl StageKey {
    pub fn insert(&mut self, name: impl Into<String>, component: Component) {
        self.components.insert(name.into(), component);
    }

    /// The canonical bytes: a tag, the schema version, then each component
    /// in name order as (length-prefixed name, 32-byte digest).
    pub fn canonical_bytes(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(32 + self.components.len() * 72);
        bytes.extend_from_slice(b"cairn.stage-key\0");
        bytes.extend_from_slice(&KEY_SCHEMA_VERSION.to_le_bytes());
        bytes.extend_from_slice(&(self.components.len() as u64).to_le_bytes());
        for (name, component) in &self.components {
            bytes.extend_from_slice(&(name.len() as u64).to_le_bytes());
            bytes.extend_from_slice(name.as_bytes());
            bytes.extend_from_slice(component.digest.as_bytes());
        }
        bytes
    }

    pub fn fingerprint(&self) -> Digest {
        Digest::of(&self.canonical_bytes())
    }

    /// What differs between a recorded key and this one.
    pub fn diff(&self, recorded: &StageKey) -> Vec<Change> {
        let mut changes = Vec::new();
        for (name, new) in &self.components {
            match recorded.components.get(name) {
                Some(old) if old.digest == new.digest => {}
                old => changes.push(Change {
                    component: name.clone(),
                    old: old.cloned(),
                    new: Some(new.clone()),
                }),
            }
        }
        for (name, old) in &recorded.components {
            if !self.components.contains_key(name) {
                changes.push(Change {
                    component: name.clone(),
                    old: Some(old.clone()),
                    new: None,
                });
            }
        }
        changes.sort_by(|a, b| a.component.cmp(&b.component));
        changes
    }
}

/// One component that differs, old → new (`None`: absent on that side).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    pub component: String,
    pub old: Option<Component>,
    pub new: Option<Component>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> StageKey {
        let mut key = StageKey::default();
        key.insert(
            "command",
            Component::of_value("command", b"cp in.txt out.txt", "cp in.txt out.txt"),
        );
        key.insert("param:size", Component::of_value("param", b"350", "350"));
        key.insert(
            "input:in.txt",
            Component::of_digest(Digest::of(b"hello\n"), "in.txt"),
        );
        key
    }

    /// Pins the encoding. If this fails, the key format changed: bump
    /// `KEY_SCHEMA_VERSION` and update the expected digest deliberately.
    #[test]
    fn golden_fingerprint_encoding() {
        assert_eq!(
            sample().fingerprint().to_string(),
            "blake3:0dc50ada9fe6af303dd4e41816253e6b060c2fa809d28fa212ca4743b2c92a2b"
        );
    }

    /// The encoding, spelled out byte by byte.
    #[test]
    fn canonical_bytes_layout() {
        let key = sample();
        let mut expected = b"cairn.stage-key\0".to_vec();
        expected.extend(1u32.to_le_bytes());
        expected.extend(3u64.to_le_bytes());
        for name in ["command", "input:in.txt", "param:size"] {
            expected.extend((name.len() as u64).to_le_bytes());
            expected.extend(name.as_bytes());
            expected.extend(key.components[name].digest.as_bytes());
        }
        assert_eq!(key.canonical_bytes(), expected);
    }

    #[test]
    fn detail_is_not_hashed() {
        let mut key = sample();
        let before = key.fingerprint();
        key.components.get_mut("command").unwrap().detail = "other words".to_owned();
        assert_eq!(key.fingerprint(), before);
    }

    #[test]
    fn diff_names_the_changed_component() {
        let old = sample();
        let mut new = sample();
        new.insert("param:size", Component::of_value("param", b"18", "18"));
        let changes = new.diff(&old);
        assert_eq!(changes.len(), 1);
        assert_eq!(changes[0].component, "param:size");
        assert_eq!(changes[0].old.as_ref().unwrap().detail, "350");
    }
}
