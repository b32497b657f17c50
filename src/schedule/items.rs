//! The items of a per-item (`foreach`) stage: reading the item list,
//! filling `{item.FIELD}` placeholders, and each item's state.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde::Serialize;

use crate::fingerprint::{Digest, canonical_json};
use crate::manifest::interpolate::walk;
use crate::manifest::shell::{self, Context};
use crate::manifest::{Command, ItemClass};

/// One item of the list; in a sampled stage, one sample of one item (a
/// unit of its own, keyed `KEY#INDEX`).
#[derive(Debug, Clone)]
pub struct Item {
    pub key: String,
    pub value: serde_json::Value,
    /// Canonical JSON (sorted keys), which enters the item's fingerprint.
    pub canonical: String,
    pub sample: Option<Sample>,
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
            value: self.value.clone(),
            canonical: self.canonical.clone(),
            sample: Some(Sample {
                item: self.key.clone(),
                index,
                seed,
                draw,
            }),
        }
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
    pub image: Option<String>,
    /// The fingerprint of the stage's code (its template) it is run by.
    pub code: Digest,
    /// The newest outcome under this fingerprint, and how many attempts.
    pub outcome: Option<(ItemClass, u32)>,
    /// Attempts under this fingerprint that ended (those with an outcome
    /// and those cancelled); the next is this + 1. Unlike `outcome`, kept
    /// when `--force` forgets the outcome, so a forced attempt gets a name
    /// of its own.
    pub attempts_before: u32,
    /// The JSON result recorded with that outcome (`item_result`).
    pub result: Option<serde_json::Value>,
    /// What the item wrote (`item_outputs`), as recorded with that outcome.
    pub outputs: Option<Vec<crate::store::OutputRecord>>,
    /// The digests of what it reads (with its image), as its fingerprint
    /// hashed them: the rest of the fingerprint's pre-image.
    pub inputs: Vec<(String, Digest)>,
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
    let values = crate::records::read(path, "item list")?;
    let mut seen = HashMap::new();
    let mut items = Vec::with_capacity(values.len());
    for (n, value) in values.into_iter().enumerate() {
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
        if let Some(first) = seen.insert(name.clone(), n + 1) {
            return Err(format!(
                "items {first} and {} of `{}` share the key `{name}`",
                n + 1,
                path.display()
            ));
        }
        let canonical = canonical_json(&value);
        items.push(Item {
            key: name,
            value,
            canonical,
            sample: None,
        });
    }
    Ok(items)
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

/// Replaces `{item.FIELD}` (nested: `{item.repo.name}`) with the item's
/// values, as they are, and `{sample.index}`, `{sample.seed}` with a
/// sample's; other text is left as it is. For text that reaches no shell
/// (an argv argument, a path template).
pub fn fill(text: &str, item: &Item) -> Result<String, String> {
    walk(text, false, |p| value_of(item, p.namespace, p.name))
        .map_err(|errors: Vec<String>| errors.join("; "))
}

/// The text a placeholder of `item` stands for; `None` for another
/// namespace's (or a sample's, outside a sampled stage).
fn value_of(item: &Item, namespace: &str, name: &str) -> Result<Option<String>, String> {
    match (namespace, &item.sample) {
        ("item", _) => field(&item.value, name).map(Some),
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
pub fn fill_shell(script: &str, item: &Item) -> Result<String, String> {
    shell::expand(
        script,
        false,
        |p, context| -> Result<Option<String>, String> {
            let Some(value) = value_of(item, p.namespace, p.name)? else {
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
    Ok(match command {
        Command::Shell(script) => Command::Shell(fill_shell(script, item)?),
        Command::Exec(argv) => Command::Exec(
            argv.iter()
                .map(|a| fill(a, item))
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
pub fn aggregate(items: &[PlannedItem]) -> Vec<u8> {
    let mut sorted: Vec<&PlannedItem> = items.iter().collect();
    sorted.sort_by(|a, b| a.item.key.cmp(&b.item.key));
    let mut out = Vec::new();
    for planned in sorted {
        let class = planned
            .outcome
            .as_ref()
            .map_or("pending", |(c, _)| c.name());
        let mut line = serde_json::json!({
            "key": planned.item.key,
            "class": class,
            "item": planned.item.value,
        });
        if let Some(result) = &planned.result {
            line["result"] = result.clone();
        }
        out.extend_from_slice(canonical_json(&line).as_bytes());
        out.push(b'\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fills_nested_fields_and_leaves_other_braces() {
        let value = serde_json::json!({"id": "t1", "repo": {"name": "r"}, "n": 3});
        let item = Item {
            key: "t1".into(),
            canonical: canonical_json(&value),
            value,
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
                value: serde_json::json!({"id": key}),
                canonical: String::new(),
                sample: None,
            },
            fingerprint: Digest::of(key.as_bytes()),
            image: None,
            attempts_before: 1,
            code: Digest::of(b"code"),
            outcome: Some((ItemClass::Ok, 1)),
            result: None,
            outputs: None,
            inputs: Vec::new(),
        };
        let a = aggregate(&[planned("b"), planned("a"), planned("c")]);
        let b = aggregate(&[planned("c"), planned("b"), planned("a")]);
        assert_eq!(a, b);
    }
}
