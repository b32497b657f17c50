//! Reading a per-item stage's item list: a JSON array or JSONL file of
//! objects, each named by its key, streamed.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

use super::*;

/// Reads a JSON array or JSONL file of objects, each naming itself by
/// `key`. Keys must be unique.
pub fn load_items(path: &Path, key: &str) -> Result<Vec<Item>, String> {
    let mut items = Vec::new();
    for_each_item(path, key, |item, _| {
        items.push(item);
        Ok(())
    })?;
    Ok(items)
}

/// Reads the item list at `path` as [`load_items`] does, handing each item
/// to `visit` with its parsed value as soon as it is read: the value is
/// dropped after the visit, so a caller keeps of each item only what it
/// needs. An error from `visit` stops the reading and is returned as it is.
///
/// Keys are told apart by a 64-bit hash of each, not by a set of the keys
/// (which would hold a second copy of every key): two items whose keys
/// hash alike are compared for real once the list is read, by reading it
/// again, so a shared key is always an error and a mere collision never is.
pub fn for_each_item(
    path: &Path,
    key: &str,
    mut visit: impl FnMut(Item, &serde_json::Value) -> Result<(), String>,
) -> Result<(), String> {
    let mut canonical = Vec::with_capacity(256);
    for_each_keyed(path, key, |n, name, value| {
        canonical.clear();
        crate::canonical_json::write(value, &mut canonical);
        let text = std::str::from_utf8(&canonical)
            .map_err(|e| format!("item {} of `{}`: {e}", n + 1, path.display()))?;
        let item = Item {
            key: name,
            canonical: Arc::from(text),
            sample: None,
        };
        visit(item, value)
    })
}

/// [`for_each_item`] for a reader of keys and fields only (a check): each
/// item's position, key and value, with no canonical text made.
pub fn for_each_keyed(
    path: &Path,
    key: &str,
    visit: impl FnMut(usize, String, &serde_json::Value) -> Result<(), String>,
) -> Result<(), String> {
    read_items(path, key, key_hash, visit)
}

/// [`for_each_keyed`] with keys hashed by `hash`.
pub(super) fn read_items(
    path: &Path,
    key: &str,
    hash: fn(&str) -> u64,
    mut visit: impl FnMut(usize, String, &serde_json::Value) -> Result<(), String>,
) -> Result<(), String> {
    // Keys hashed alike are compared by reading the list again, which
    // must then be the file read the first time.
    let before = std::fs::metadata(path).ok();
    let mut seen: HashMap<u64, usize, KeyHashed> = HashMap::default();
    // (earlier item, later item, the later one's key): the same hash.
    let mut alike: Vec<(usize, usize, String)> = Vec::new();
    crate::records::for_each(path, "item list", |n, value| {
        let name = key_of(&value, key, n, path)?;
        let hashed = hash(&name);
        match seen.get(&hashed) {
            Some(&first) => alike.push((first, n, name.clone())),
            None => {
                seen.insert(hashed, n);
            }
        }
        visit(n, name, &value)
    })?;
    if alike.is_empty() {
        return Ok(());
    }
    let mut earlier: HashMap<usize, Option<String>> =
        alike.iter().map(|(first, _, _)| (*first, None)).collect();
    crate::records::for_each(path, "item list", |n, value| {
        if let Some(slot) = earlier.get_mut(&n) {
            *slot = Some(key_of(&value, key, n, path)?);
        }
        Ok(())
    })?;
    let after = std::fs::metadata(path).ok();
    let same = before
        .zip(after)
        .is_some_and(|(before, after)| crate::fingerprint::unchanged(&before, &after));
    if !same {
        return Err(format!(
            "item list `{}` changed while it was read; run again",
            path.display()
        ));
    }
    // Within each group of keys hashed alike (one earliest item, the later
    // ones in order), the first key met twice is the error.
    let mut groups: BTreeMap<usize, Vec<(usize, String)>> = BTreeMap::new();
    for (first, n, name) in alike {
        groups.entry(first).or_default().push((n, name));
    }
    let mut shared: Option<(usize, usize, String)> = None;
    for (first, later) in groups {
        let mut met: HashMap<&str, usize> = HashMap::new();
        if let Some(Some(name)) = earlier.get(&first) {
            met.insert(name, first);
        }
        for (n, name) in &later {
            if let Some(&before) = met.get(name.as_str()) {
                if shared.as_ref().is_none_or(|(_, m, _)| n < m) {
                    shared = Some((before, *n, name.clone()));
                }
                break;
            }
            met.insert(name, *n);
        }
    }
    match shared {
        Some((first, n, name)) => Err(format!(
            "items {} and {} of `{}` share the key `{name}`",
            first + 1,
            n + 1,
            path.display()
        )),
        None => Ok(()),
    }
}

/// The key of item `n` (0-based) of the list at `path`, checked.
fn key_of(value: &serde_json::Value, key: &str, n: usize, path: &Path) -> Result<String, String> {
    let name = match value.get(key) {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Number(n)) => n.to_string(),
        _ => {
            return Err(format!(
                "item {} of `{}` has no string or number field `{key}`",
                n + 1,
                path.display()
            ));
        }
    };
    if let Err(why) = check_key(&name) {
        return Err(format!(
            "item {} of `{}` has the key `{}`, which {why}",
            n + 1,
            path.display(),
            name.escape_debug()
        ));
    }
    Ok(name)
}

/// 64 bits of a key's BLAKE3: well spread, so the set of them needs no
/// hashing of its own.
pub(super) fn key_hash(key: &str) -> u64 {
    let hash = blake3::hash(key.as_bytes());
    let mut first = [0; 8];
    first.copy_from_slice(&hash.as_bytes()[..8]);
    u64::from_le_bytes(first)
}

/// The hasher of a set of [`key_hash`]es: they are hashes already.
#[derive(Default, Clone, Copy)]
struct KeyHashed;

impl std::hash::BuildHasher for KeyHashed {
    type Hasher = PassThrough;
    fn build_hasher(&self) -> PassThrough {
        PassThrough(0)
    }
}

/// Hands a `u64` on as its own hash.
struct PassThrough(u64);

impl std::hash::Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only `u64`s are hashed here; anything else is folded in.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// Whether `key` can name an item: it names the item's logs, store entries
/// and often its files, so it must be one plain path component that no
/// command can read as an option.
pub fn check_key(key: &str) -> Result<(), &'static str> {
    if key.is_empty() {
        Err("is empty")
    } else if key == "." || key == ".." {
        Err("names a directory, not an item")
    } else if key.contains('/') {
        Err("holds a `/`")
    } else if key.chars().any(char::is_control) {
        Err("holds a control character")
    } else if key.starts_with('-') {
        Err("starts with `-` and would read as an option")
    } else {
        Ok(())
    }
}
