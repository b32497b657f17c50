//! The items of a per-item (`foreach`) stage: reading the item list,
//! filling `{item.FIELD}` placeholders, and each item's state.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

use serde::Serialize;

use crate::fingerprint::{Digest, DigestHashed};
use crate::manifest::interpolate::walk;
use crate::manifest::shell::{self, Context};
use crate::manifest::{Command, ItemClass};

/// One item of the list; in a sampled stage, one sample of one item (a
/// unit of its own, keyed `KEY#INDEX`).
///
/// An item is held as its canonical JSON only (its samples share it), not
/// as a parsed value beside it: that would be most of the memory of a
/// large pool. [`Item::value`] parses it when its fields are needed.
#[derive(Debug, Clone)]
pub struct Item {
    pub key: String,
    /// Canonical JSON (sorted keys), which enters the item's fingerprint.
    pub canonical: Arc<str>,
    /// Boxed: most items are not samples, and a million of them are held.
    pub sample: Option<Box<Sample>>,
}

/// Which sample of which item a unit of a sampled stage is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// The item's own key.
    pub item: String,
    /// 0 to k − 1.
    pub index: u32,
    /// What it is drawn with: the stage's seed plus the index, or, once
    /// drawn anew, a seed derived from those and the draw.
    pub seed: u64,
    /// Times it was drawn anew (`cairn resample`): each draw is a unit of
    /// its own to the ledger.
    pub draw: u32,
}

impl Item {
    /// Sample `index` of this item, drawn for the `draw`-th time: first
    /// with `base_seed + index`, then with a seed of its own per re-draw
    /// (the same seed would draw the same sample from a seeded harness).
    pub fn sample(&self, index: u32, base_seed: u64, draw: u32) -> Item {
        let seed = if draw == 0 {
            base_seed.wrapping_add(u64::from(index))
        } else {
            let mut hasher = blake3::Hasher::new();
            hasher.update(b"cairn.redraw\0");
            hasher.update(&base_seed.to_le_bytes());
            hasher.update(&index.to_le_bytes());
            hasher.update(&draw.to_le_bytes());
            let bytes = hasher.finalize();
            // Below 2^31: every harness takes it (numpy, torch, random).
            u64::from(
                u32::from_le_bytes([
                    bytes.as_bytes()[0],
                    bytes.as_bytes()[1],
                    bytes.as_bytes()[2],
                    bytes.as_bytes()[3],
                ]) >> 1,
            )
        };
        Item {
            key: format!("{}#{index}", self.key),
            canonical: self.canonical.clone(),
            sample: Some(Box::new(Sample {
                item: self.key.clone(),
                index,
                seed,
                draw,
            })),
        }
    }

    /// The item's fields, parsed from its canonical text. That text is
    /// cairn's own writing of a value it parsed (floats read exactly, so it
    /// reads back as that value); should it ever not parse, the item has
    /// no fields (its placeholders then fail it) and the error is logged.
    pub fn value(&self) -> serde_json::Value {
        serde_json::from_str(&self.canonical).unwrap_or_else(|e| {
            tracing::error!(
                "item `{}`: its canonical text does not read back: {e}",
                self.key
            );
            serde_json::Value::Null
        })
    }

    /// The key of the item itself (a sample's item's).
    pub fn item_key(&self) -> &str {
        self.sample.as_ref().map_or(&self.key, |s| &s.item)
    }

    /// What a sample adds to what its item's fingerprint hashes: its
    /// index, seed and draw, under a name no path can have.
    pub fn sample_input(&self) -> Option<(String, Digest)> {
        let sample = self.sample.as_ref()?;
        let text = format!(
            "sample\0{}\0seed\0{}\0draw\0{}",
            sample.index, sample.seed, sample.draw
        );
        Some(("\0sample".to_owned(), Digest::of(text.as_bytes())))
    }
}

/// An item with its current fingerprint and what the ledger knows of it.
#[derive(Debug, Clone)]
pub struct PlannedItem {
    pub item: Item,
    pub fingerprint: Digest,
    /// The image it runs in, pinned (`REPO@sha256:…`), when its executor
    /// takes each item's image from the item.
    pub image: Option<Box<str>>,
    /// The fingerprint of the stage's code (its template) it is run by:
    /// one for all the stage's items, held once.
    pub code: Arc<Digest>,
    /// The newest outcome under this fingerprint, and how many attempts.
    pub outcome: Option<(ItemClass, u32)>,
    /// Attempts under this fingerprint that ended (those with an outcome
    /// and those cancelled); the next is this + 1. Unlike `outcome`, kept
    /// when `--force` forgets the outcome, so a forced attempt gets a name
    /// of its own.
    pub attempts_before: u32,
    /// The JSON result recorded with that outcome (`item_result`).
    /// (Boxed, as `sample` is: a million items are held at once.)
    pub result: Option<Box<serde_json::Value>>,
    /// What the item wrote (`item_outputs`), as recorded with that outcome.
    pub outputs: Option<Box<[crate::store::OutputRecord]>>,
    /// The digests of what it reads (with its image), as its fingerprint
    /// hashed them: the rest of the fingerprint's pre-image.
    pub inputs: Box<[(String, Digest)]>,
}

impl PlannedItem {
    /// Whether its outcome is kept by its stage (`foreach`): reused, not
    /// run again (see [`Foreach::keeps`]).
    pub fn is_kept(&self, foreach: Option<&crate::manifest::Foreach>) -> bool {
        let errors_kept = foreach.is_some_and(crate::manifest::Foreach::keeps_errors);
        self.outcome
            .as_ref()
            .is_some_and(|(class, _)| class.is_kept(errors_kept))
    }
}

/// A stage's planned items found by fingerprint, through the first eight
/// bytes of each (BLAKE3 output already): a million items' index takes
/// 36 MB where one keyed by whole digests took 86. Items whose first
/// eight bytes another shares are looked through one by one.
pub(super) struct PlanIndex {
    first: HashMap<u64, usize, DigestHashed>,
    shared: Vec<usize>,
}

impl PlanIndex {
    pub(super) fn of(planned: &[PlannedItem]) -> Self {
        let mut first = HashMap::with_capacity_and_hasher(planned.len(), DigestHashed);
        let mut shared = Vec::new();
        for (n, p) in planned.iter().enumerate() {
            // (Of two with one fingerprint, the later is found, as before.)
            if let Some(earlier) = first.insert(prefix(&p.fingerprint), n) {
                shared.push(earlier);
            }
        }
        Self { first, shared }
    }

    /// The place in `planned` (the items this was made of) of the item
    /// with `fingerprint`.
    pub(super) fn find(&self, planned: &[PlannedItem], fingerprint: &Digest) -> Option<usize> {
        let n = *self.first.get(&prefix(fingerprint))?;
        if planned[n].fingerprint == *fingerprint {
            return Some(n);
        }
        self.shared
            .iter()
            .copied()
            .find(|&n| planned[n].fingerprint == *fingerprint)
    }
}

fn prefix(digest: &Digest) -> u64 {
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest.as_bytes()[..8]);
    u64::from_le_bytes(first)
}

/// `planned` in the order of their keys (as `str` orders them). A million
/// keys compared whole, most of them sharing a long prefix (a repository's
/// name), took a quarter of a second: they are sorted eight bytes at a
/// time instead (a radix sort, most significant bytes first), each run of
/// keys alike so far by their next eight, and compared whole only in runs
/// of a few.
pub fn in_key_order(planned: &[PlannedItem]) -> impl Iterator<Item = &PlannedItem> {
    const FEW: usize = 16;
    let mut keyed: Vec<(u64, &PlannedItem)> = planned.iter().map(|p| (0, p)).collect();
    // (Runs still to sort, each alike in its first `depth` bytes.)
    let mut runs = vec![(0..keyed.len(), 0)];
    while let Some((range, depth)) = runs.pop() {
        let run = &mut keyed[range.clone()];
        if run.len() <= FEW || run.iter().all(|(_, p)| p.item.key.len() <= depth) {
            run.sort_unstable_by(|(_, p), (_, q)| p.item.key.cmp(&q.item.key));
            continue;
        }
        for (word, p) in run.iter_mut() {
            *word = eight_bytes_at(&p.item.key, depth);
        }
        run.sort_unstable_by_key(|(word, _)| *word);
        let mut start = range.start;
        for alike in run.chunk_by(|(a, _), (b, _)| a == b) {
            if alike.len() > 1 {
                runs.push((start..start + alike.len(), depth + 8));
            }
            start += alike.len();
        }
    }
    keyed.into_iter().map(|(_, p)| p)
}

/// The eight bytes of `key` from `depth` on, as a number that orders as
/// they do; a byte past the end counts as 0 (below any a key may hold: a
/// key that ends first sorts first, as it does whole).
fn eight_bytes_at(key: &str, depth: usize) -> u64 {
    let mut bytes = [0u8; 8];
    let rest = key.as_bytes().get(depth..).unwrap_or_default();
    let n = rest.len().min(8);
    bytes[..n].copy_from_slice(&rest[..n]);
    u64::from_be_bytes(bytes)
}

/// Counts of a per-item stage's items by state.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct ItemCounts {
    pub total: usize,
    /// In a sampled stage, how many items the `total` samples are of.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sampled_items: Option<usize>,
    pub ok: usize,
    /// Items with a final verdict, by verdict.
    pub verdicts: BTreeMap<String, usize>,
    /// Items whose last attempt failed on infrastructure (retried later).
    pub infra: usize,
    pub error: usize,
    /// Items never attempted under their current fingerprint.
    pub pending: usize,
}

impl ItemCounts {
    pub fn of(items: &[PlannedItem]) -> Self {
        let mut counts = ItemCounts {
            total: items.len(),
            ..Default::default()
        };
        if items.iter().any(|p| p.item.sample.is_some()) {
            let keys: std::collections::HashSet<&str> =
                items.iter().map(|p| p.item.item_key()).collect();
            counts.sampled_items = Some(keys.len());
        }
        for item in items {
            match &item.outcome {
                None => counts.pending += 1,
                Some((ItemClass::Ok, _)) => counts.ok += 1,
                Some((ItemClass::Verdict(v), _)) => {
                    *counts.verdicts.entry(v.clone()).or_default() += 1
                }
                Some((ItemClass::Infra, _)) => counts.infra += 1,
                Some((ItemClass::Error, _)) => counts.error += 1,
            }
        }
        counts
    }

    /// Items without a final outcome.
    pub fn unfinished(&self) -> usize {
        self.infra + self.error + self.pending
    }

    pub fn summary(&self) -> String {
        let total = match self.sampled_items {
            Some(items) => format!("{} samples of {items} items", self.total),
            None => format!("{} items", self.total),
        };
        let mut parts = vec![total, format!("{} ok", self.ok)];
        for (verdict, n) in &self.verdicts {
            parts.push(format!("{n} {verdict}"));
        }
        if self.infra > 0 {
            parts.push(format!("{} infra", self.infra));
        }
        if self.error > 0 {
            parts.push(format!("{} error", self.error));
        }
        if self.pending > 0 {
            parts.push(format!("{} pending", self.pending));
        }
        parts.join(", ")
    }
}

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
fn read_items(
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
fn key_hash(key: &str) -> u64 {
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

/// An item's fields as its placeholders read them: its parsed value and,
/// in a sampled stage, which sample it is.
#[derive(Clone, Copy)]
pub struct Fields<'a> {
    pub value: &'a serde_json::Value,
    pub sample: Option<&'a Sample>,
}

/// Replaces `{item.FIELD}` (nested: `{item.repo.name}`) with the item's
/// values, as they are, and `{sample.index}`, `{sample.seed}` with a
/// sample's; other text is left as it is. For text that reaches no shell
/// (an argv argument, a path template).
pub fn fill(text: &str, item: &Item) -> Result<String, String> {
    let value = item.value();
    fill_fields(
        text,
        Fields {
            value: &value,
            sample: item.sample.as_deref(),
        },
    )
}

/// [`fill`] with the item's fields already parsed.
pub fn fill_fields(text: &str, fields: Fields<'_>) -> Result<String, String> {
    walk(text, false, |p| value_of(fields, p.namespace, p.name))
        .map_err(|errors: Vec<String>| errors.join("; "))
}

/// The text a placeholder of an item stands for; `None` for another
/// namespace's (or a sample's, outside a sampled stage).
fn value_of(fields: Fields<'_>, namespace: &str, name: &str) -> Result<Option<String>, String> {
    match (namespace, fields.sample) {
        ("item", _) => field(fields.value, name).map(Some),
        ("sample", Some(sample)) => match name {
            "index" => Ok(Some(sample.index.to_string())),
            "seed" => Ok(Some(sample.seed.to_string())),
            _ => Err(format!("a sample has no field `{name}`")),
        },
        _ => Ok(None),
    }
}

/// Fills a shell script: each `{item.FIELD}` value is quoted for where it
/// stands (see [`shell`]), so it reaches the shell as exactly its bytes.
fn fill_shell(script: &str, fields: Fields<'_>) -> Result<String, String> {
    shell::expand(
        script,
        false,
        |p, context| -> Result<Option<String>, String> {
            let Some(value) = value_of(fields, p.namespace, p.name)? else {
                return Ok(None);
            };
            match context {
                Ok(Context::Comment) => Ok(None),
                Ok(context) => shell::quote(context, shell::Value::One(&value))
                    .map(Some)
                    .map_err(|why| {
                        format!(
                            "`{{{}.{}}}` cannot stand where it does: {why}",
                            p.namespace, p.name
                        )
                    }),
                Err(why) => Err(format!("`{{{}.{}}}` stands {why}", p.namespace, p.name)),
            }
        },
    )
    .map_err(|errors: Vec<String>| errors.join("; "))
}

/// The text of field `name` (dotted for nested fields) of an item: a
/// string as it is, anything else as JSON.
pub(super) fn field(item: &serde_json::Value, name: &str) -> Result<String, String> {
    let mut value = item;
    for part in name.split('.') {
        value = value
            .get(part)
            .ok_or_else(|| format!("item has no field `{name}`"))?;
    }
    Ok(match value {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    })
}

pub fn fill_command(command: &Command, item: &Item) -> Result<Command, String> {
    let value = item.value();
    let fields = Fields {
        value: &value,
        sample: item.sample.as_deref(),
    };
    Ok(match command {
        Command::Shell(script) => Command::Shell(fill_shell(script, fields)?),
        Command::Exec(argv) => Command::Exec(
            argv.iter()
                .map(|a| fill_fields(a, fields))
                .collect::<Result<_, _>>()?,
        ),
    })
}

/// A file-name-safe form of an item key.
pub fn file_name(key: &str) -> String {
    let safe: String = key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .take(80)
        .collect();
    if safe == key {
        safe
    } else {
        format!("{safe}-{}", &Digest::of(key.as_bytes()).hex()[..8])
    }
}

/// The merged results, one JSON line per item in key order: the same
/// results give the same bytes, whatever order the items finished in.
/// Each line is the canonical JSON of `{"class", "item", "key",
/// "result"}`, written from the item's canonical text as it is.
pub fn aggregate(items: &[PlannedItem]) -> Vec<u8> {
    use crate::canonical_json::{write, write_string};
    let mut out = Vec::with_capacity(items.len() * 160);
    for planned in in_key_order(items) {
        let class = planned
            .outcome
            .as_ref()
            .map_or("pending", |(c, _)| c.name());
        out.extend_from_slice(b"{\"class\":");
        write_string(class, &mut out);
        out.extend_from_slice(b",\"item\":");
        out.extend_from_slice(planned.item.canonical.as_bytes());
        out.extend_from_slice(b",\"key\":");
        write_string(&planned.item.key, &mut out);
        if let Some(result) = &planned.result {
            out.extend_from_slice(b",\"result\":");
            write(result, &mut out);
        }
        out.extend_from_slice(b"}\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fingerprint::canonical_json;

    #[test]
    fn fills_nested_fields_and_leaves_other_braces() {
        let value = serde_json::json!({"id": "t1", "repo": {"name": "r"}, "n": 3});
        let item = Item {
            key: "t1".into(),
            canonical: canonical_json(&value).into(),
            sample: None,
        };
        assert_eq!(
            fill("run {item.id} {item.repo.name} {item.n} ${HOME}", &item).unwrap(),
            "run t1 r 3 ${HOME}"
        );
        assert!(
            fill("{item.missing}", &item)
                .unwrap_err()
                .contains("missing")
        );
    }

    #[test]
    fn aggregate_bytes_do_not_depend_on_order() {
        let planned = |key: &str| PlannedItem {
            item: Item {
                key: key.into(),
                canonical: canonical_json(&serde_json::json!({"id": key, "n": [1.5, "é\n"]}))
                    .into(),
                sample: None,
            },
            fingerprint: Digest::of(key.as_bytes()),
            image: None,
            attempts_before: 1,
            code: Arc::new(Digest::of(b"code")),
            outcome: Some((ItemClass::Ok, 1)),
            result: None,
            outputs: None,
            inputs: Box::default(),
        };
        let a = aggregate(&[planned("b"), planned("a"), planned("c")]);
        let b = aggregate(&[planned("c"), planned("b"), planned("a")]);
        assert_eq!(a, b);
    }

    /// Planned items are found by fingerprint through its first eight
    /// bytes, also when another item shares those; of two with one
    /// fingerprint, the later (as a map keyed by whole digests found).
    #[test]
    fn the_plan_index_finds_items_whose_first_bytes_are_shared() {
        let planned = |key: &str, fingerprint: Digest| PlannedItem {
            fingerprint,
            ..unplanned(key)
        };
        let with_first = |first: u8, last: u8| {
            let mut bytes = [first; 32];
            bytes[31] = last;
            Digest::from_bytes(bytes)
        };
        let plan = vec![
            planned("a", with_first(1, 1)),
            planned("b", with_first(1, 2)),
            planned("c", with_first(1, 3)),
            planned("d", with_first(2, 1)),
            planned("d again", with_first(2, 1)),
        ];
        let index = PlanIndex::of(&plan);
        let found = |digest: Digest| {
            index
                .find(&plan, &digest)
                .map(|n| plan[n].item.key.as_str())
        };
        assert_eq!(found(with_first(1, 1)), Some("a"));
        assert_eq!(found(with_first(1, 2)), Some("b"));
        assert_eq!(found(with_first(1, 3)), Some("c"));
        assert_eq!(found(with_first(2, 1)), Some("d again"));
        assert_eq!(found(with_first(1, 4)), None);
        assert_eq!(found(with_first(3, 1)), None);
    }

    /// Keys whose hashes collide are told apart by the keys themselves:
    /// with every key hashed alike, distinct keys pass and a shared one is
    /// still caught, named with both items' positions.
    #[test]
    fn colliding_key_hashes_are_compared_for_real() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("items.jsonl");
        std::fs::write(&path, "{\"id\": \"a\"}\n{\"id\": \"b\"}\n{\"id\": 7}\n").unwrap();
        let mut keys = Vec::new();
        read_items(
            &path,
            "id",
            |_| 0,
            |_, key, _| {
                keys.push(key);
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(keys, ["a", "b", "7"]);
        std::fs::write(
            &path,
            "{\"id\": \"a\"}\n{\"id\": \"b\"}\n{\"id\": \"c\"}\n{\"id\": \"b\"}\n",
        )
        .unwrap();
        for hash in [|_: &str| 0, key_hash] {
            let error = read_items(&path, "id", hash, |_, _, _| Ok(())).unwrap_err();
            assert!(
                error.contains("items 2 and 4") && error.contains("share the key `b`"),
                "{error}"
            );
        }
        std::fs::write(&path, "{\"id\": \"a\"}\n{\"id\": \"a\"}\n").unwrap();
        let error = read_items(&path, "id", |_| 0, |_, _, _| Ok(())).unwrap_err();
        assert!(error.contains("items 1 and 2"), "{error}");
    }

    /// Planning fills templates from the value as read, a command from the
    /// canonical text read again: the two must be the same value.
    #[test]
    fn an_items_canonical_text_reads_back_as_its_value() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("list.jsonl");
        std::fs::write(
            &path,
            "{\"id\": \"a\", \"x\": 118.075470945216424, \"y\": 1e-7, \"z\": 0.30000000000000004}\n",
        )
        .unwrap();
        let mut read = Vec::new();
        for_each_item(&path, "id", |item, value| {
            read.push((item, value.clone()));
            Ok(())
        })
        .unwrap();
        let (item, value) = &read[0];
        assert_eq!(&item.value(), value, "{}", item.canonical);
        assert_eq!(fill("{item.x}", item).unwrap(), value["x"].to_string());
    }

    /// A million planned items are held at once: what each takes is
    /// watched.
    #[test]
    fn a_planned_item_stays_small() {
        assert!(
            std::mem::size_of::<PlannedItem>() <= 184,
            "{}",
            std::mem::size_of::<PlannedItem>()
        );
    }

    /// An item keyed `key`, planned with no outcome yet.
    fn unplanned(key: &str) -> PlannedItem {
        PlannedItem {
            item: Item {
                key: key.to_owned(),
                canonical: Arc::from("{}"),
                sample: None,
            },
            fingerprint: Digest::of(key.as_bytes()),
            image: None,
            attempts_before: 0,
            code: Arc::new(Digest::of(b"code")),
            outcome: None,
            result: None,
            outputs: None,
            inputs: Box::default(),
        }
    }

    /// Runs of more than a few keys alike to their end (keys are unique in
    /// a list; the sort must end all the same) and keys ending exactly
    /// where a word of eight bytes does.
    #[test]
    fn keys_alike_to_their_end_or_ending_on_a_word_are_put_in_order() {
        let mut keys: Vec<String> = vec!["the-same-key-0123".to_owned(); 20];
        keys.extend(
            [
                "abcdefgh",
                "abcdefg",
                "abcdefghi",
                "abcdefgh12345678",
                "abcdefgh1234567",
            ]
            .map(String::from),
        );
        keys.extend((0..20).map(|n| format!("abcdefgh{:08}", 99 - n)));
        let planned: Vec<PlannedItem> = keys.iter().map(|key| unplanned(key)).collect();
        let ordered: Vec<&str> = in_key_order(&planned)
            .map(|p| p.item.key.as_str())
            .collect();
        keys.sort();
        assert_eq!(ordered, keys);
    }

    proptest::proptest! {
        /// Keys put in order eight bytes at a time are in the order of the
        /// keys whole: sharing prefixes of every length, ending within
        /// eight bytes or after them, with a few keys unlike the rest.
        #[test]
        fn items_in_key_order_are_in_the_order_of_their_keys(
            prefix in "[a-c]{0,20}",
            rests in proptest::collection::hash_set("[a-c.é]{0,30}", 0..80),
            outliers in proptest::collection::hash_set("[a-z]{1,3}", 0..3),
        ) {
            // (In no order: a set's.)
            let keys: std::collections::HashSet<String> = rests
                .iter()
                .map(|rest| format!("{prefix}{rest}"))
                .chain(outliers)
                .collect();
            let planned: Vec<PlannedItem> = keys
                .iter()
                .map(|key| unplanned(key))
                .collect();
            let mut expected: Vec<&str> = planned.iter().map(|p| p.item.key.as_str()).collect();
            expected.sort();
            let ordered: Vec<&str> = in_key_order(&planned).map(|p| p.item.key.as_str()).collect();
            proptest::prop_assert_eq!(ordered, expected);
        }
    }

    /// Each merged line is exactly the canonical JSON of its record, as
    /// when it was built as a value and canonicalised.
    #[test]
    fn aggregate_lines_are_canonical_json() {
        let value = serde_json::json!({"id": "a\"b", "deep": {"z": 1, "a": [null, 2.5]}});
        let result = serde_json::json!({"score": 0.5, "notes": "é\u{1}"});
        let planned = PlannedItem {
            item: Item {
                key: "a\"b".into(),
                canonical: canonical_json(&value).into(),
                sample: None,
            },
            fingerprint: Digest::of(b"a"),
            image: None,
            attempts_before: 1,
            code: Arc::new(Digest::of(b"code")),
            outcome: Some((ItemClass::Verdict("fail".into()), 1)),
            result: Some(Box::new(result.clone())),
            outputs: None,
            inputs: Box::default(),
        };
        let expected = canonical_json(&serde_json::json!({
            "key": "a\"b", "class": "fail", "item": value, "result": result,
        })) + "\n";
        assert_eq!(String::from_utf8(aggregate(&[planned])).unwrap(), expected);
    }
}
