//! `uses = "freeze"`: from a selection (IDs with their splits) and a
//! directory of per-item directories, a freeze: `items/ID/` copies,
//! `manifest.json` and `SHA256SUMS` (see `crate::release::format`).
//!
//! The declared checks run before anything is written: unique and safe IDs,
//! exact split sizes, no group in two splits, a cap per group, required IDs
//! present, an item directory for every ID. A failed check names the
//! offending IDs, and the output does not appear.

use std::collections::BTreeMap;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use serde::Deserialize;

use super::{BuiltinError, Invocation};
use crate::manifest::settings::field_text;
use crate::release::format::{
    FREEZE_FORMAT, FreezeManifest, FrozenItem, ITEMS_DIR, MANIFEST_FILE, SUMS_FILE, is_safe_id,
    item_digest, render_listing, semantic_digest, sha256_hex,
};
use crate::release::{HashingWriter, ReleaseError, temp_sibling};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    name: String,
    version: String,
    #[serde(default = "default_id")]
    id: String,
    #[serde(default = "default_split")]
    split: String,
    group: Option<String>,
    sizes: Option<BTreeMap<String, usize>>,
    disjoint_groups: Option<bool>,
    max_per_group: Option<usize>,
    #[serde(default)]
    require: Vec<String>,
    #[serde(default)]
    content_version: bool,
}

fn default_id() -> String {
    "id".to_owned()
}

fn default_split() -> String {
    "split".to_owned()
}

/// One selected item.
struct Selected {
    id: String,
    split: String,
    group: Option<String>,
}

pub fn run(invocation: &Invocation) -> Result<String, BuiltinError> {
    let settings: Settings = invocation.settings()?;
    let selection = invocation.input("selection")?;
    let items_dir = invocation.input("items")?;
    let out = invocation.output("freeze")?;

    let selected = read_selection(&selection, &settings)?;
    check(&selected, &settings, &items_dir)?;

    let tmp = temp_sibling(&out);
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| ReleaseError::io(&tmp, e))?;
    }
    let written = write_freeze(&selected, &settings, &items_dir, &tmp);
    let manifest = match written {
        Ok(manifest) => manifest,
        Err(error) => {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(error);
        }
    };
    if out.exists() {
        std::fs::remove_dir_all(&out).map_err(|e| ReleaseError::io(&out, e))?;
    }
    std::fs::rename(&tmp, &out).map_err(|e| ReleaseError::io(&out, e))?;
    let counts: Vec<String> = manifest
        .counts
        .iter()
        .map(|(split, n)| format!("{split} {n}"))
        .collect();
    Ok(format!(
        "froze {} {}: {} items ({}), semantic digest {}",
        manifest.name,
        manifest.version,
        manifest.total,
        counts.join(", "),
        manifest.semantic_digest
    ))
}

fn read_selection(path: &Path, settings: &Settings) -> Result<Vec<Selected>, BuiltinError> {
    let records = crate::records::read(path, "selection").map_err(BuiltinError::Invocation)?;
    let mut selected = Vec::with_capacity(records.len());
    let mut problems = Vec::new();
    for (n, record) in records.iter().enumerate() {
        let field = |name: &str| field_text(record, name);
        let Some(id) = field(&settings.id) else {
            problems.push(format!(
                "record {} of the selection has no string field `{}`",
                n + 1,
                settings.id
            ));
            continue;
        };
        let Some(split) = field(&settings.split) else {
            problems.push(format!(
                "item `{id}` has no string field `{}` (its split)",
                settings.split
            ));
            continue;
        };
        let group = match &settings.group {
            Some(name) => match field(name) {
                Some(group) => Some(group),
                None => {
                    problems.push(format!("item `{id}` has no field `{name}` (its group)"));
                    continue;
                }
            },
            None => None,
        };
        selected.push(Selected { id, split, group });
    }
    if problems.is_empty() {
        Ok(selected)
    } else {
        Err(BuiltinError::Checks(problems))
    }
}

/// Every declared check; all violations are reported together.
fn check(selected: &[Selected], settings: &Settings, items_dir: &Path) -> Result<(), BuiltinError> {
    let mut problems = Vec::new();

    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for item in selected {
        *seen.entry(&item.id).or_default() += 1;
    }
    let duplicated: Vec<String> = seen
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(id, n)| format!("{id} (×{n})"))
        .collect();
    if !duplicated.is_empty() {
        problems.push(format!("duplicate IDs: {}", list(&duplicated)));
    }
    let unsafe_ids: Vec<String> = seen
        .keys()
        .filter(|id| !is_safe_id(id))
        .map(|id| format!("{id:?}"))
        .collect();
    if !unsafe_ids.is_empty() {
        problems.push(format!(
            "IDs that cannot name a directory: {}",
            list(&unsafe_ids)
        ));
    }

    let mut by_split: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for item in selected {
        by_split.entry(&item.split).or_default().push(&item.id);
    }
    if let Some(sizes) = &settings.sizes {
        for (split, ids) in &by_split {
            match sizes.get(*split) {
                None => problems.push(format!(
                    "split `{split}` ({} items: {}) is not in `sizes`",
                    ids.len(),
                    list(ids)
                )),
                Some(wanted) if *wanted != ids.len() => problems.push(format!(
                    "split `{split}` has {} items; `sizes` wants exactly {wanted}",
                    ids.len()
                )),
                Some(_) => {}
            }
        }
        for (split, wanted) in sizes {
            if *wanted > 0 && !by_split.contains_key(split.as_str()) {
                problems.push(format!(
                    "split `{split}` has no items; `sizes` wants exactly {wanted}"
                ));
            }
        }
    }

    if let Some(group_field) = &settings.group {
        let mut groups: BTreeMap<&str, BTreeMap<&str, Vec<&str>>> = BTreeMap::new();
        for item in selected {
            let group = item.group.as_deref().unwrap_or_default();
            groups
                .entry(group)
                .or_default()
                .entry(&item.split)
                .or_default()
                .push(&item.id);
        }
        if settings.disjoint_groups.unwrap_or(true) {
            for (group, splits) in &groups {
                if splits.len() > 1 {
                    let parts: Vec<String> = splits
                        .iter()
                        .map(|(split, ids)| format!("{split}: {}", list(ids)))
                        .collect();
                    problems.push(format!(
                        "{group_field} `{group}` is in {} splits ({})",
                        splits.len(),
                        parts.join("; ")
                    ));
                }
            }
        }
        if let Some(cap) = settings.max_per_group {
            for (group, splits) in &groups {
                let ids: Vec<&str> = splits.values().flatten().copied().collect();
                if ids.len() > cap {
                    problems.push(format!(
                        "{group_field} `{group}` has {} items, over the cap of {cap}: {}",
                        ids.len(),
                        list(&ids)
                    ));
                }
            }
        }
    } else if settings.max_per_group.is_some() || settings.disjoint_groups == Some(true) {
        problems.push(
            "`max_per_group` and `disjoint_groups` need `group`: the field that groups items"
                .to_owned(),
        );
    }

    let missing_required: Vec<&str> = settings
        .require
        .iter()
        .map(String::as_str)
        .filter(|id| !seen.contains_key(id))
        .collect();
    if !missing_required.is_empty() {
        problems.push(format!(
            "required IDs missing from the selection: {}",
            list(&missing_required)
        ));
    }

    let without_dir: Vec<&str> = seen
        .keys()
        .copied()
        .filter(|id| is_safe_id(id) && !items_dir.join(id).is_dir())
        .collect();
    if !without_dir.is_empty() {
        problems.push(format!(
            "no directory under `{}` for: {}",
            items_dir.display(),
            list(&without_dir)
        ));
    }

    if problems.is_empty() {
        Ok(())
    } else {
        Err(BuiltinError::Checks(problems))
    }
}

/// At most ten IDs, then how many more.
fn list<S: AsRef<str>>(ids: &[S]) -> String {
    let shown: Vec<&str> = ids.iter().take(10).map(AsRef::as_ref).collect();
    match ids.len() {
        n if n > 10 => format!("{} and {} more", shown.join(", "), n - 10),
        _ => shown.join(", "),
    }
}

/// A frozen item's files: (path in the item, SHA-256 hex, size).
type ItemFiles = Vec<(String, String, u64)>;

fn write_freeze(
    selected: &[Selected],
    settings: &Settings,
    items_dir: &Path,
    tmp: &Path,
) -> Result<FreezeManifest, BuiltinError> {
    let frozen_items = tmp.join(ITEMS_DIR);
    std::fs::create_dir_all(&frozen_items).map_err(|e| ReleaseError::io(&frozen_items, e))?;
    let copied: Vec<Result<ItemFiles, BuiltinError>> = selected
        .par_iter()
        .map(|item| {
            let mut files = Vec::new();
            copy_tree(
                &items_dir.join(&item.id),
                &frozen_items.join(&item.id),
                "",
                &mut files,
            )?;
            Ok(files)
        })
        .collect();

    let mut sums: BTreeMap<String, String> = BTreeMap::new();
    let mut items = BTreeMap::new();
    let mut splits: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (item, files) in selected.iter().zip(copied) {
        let files = files?;
        let digest = item_digest(files.iter().map(|(p, h, _)| (p.as_str(), h.as_str())));
        for (path, hex, _) in &files {
            sums.insert(format!("{ITEMS_DIR}/{}/{path}", item.id), hex.clone());
        }
        items.insert(
            item.id.clone(),
            FrozenItem {
                split: item.split.clone(),
                group: item.group.clone(),
                digest,
                files: files.len(),
                bytes: files.iter().map(|(_, _, size)| size).sum(),
            },
        );
        splits
            .entry(item.split.clone())
            .or_default()
            .push(item.id.clone());
    }
    for ids in splits.values_mut() {
        ids.sort();
    }
    let version = if settings.content_version {
        // What the freeze holds: each item's split and digest.
        let content: BTreeMap<&String, (&String, &String)> = items
            .iter()
            .map(|(id, item): (&String, &FrozenItem)| (id, (&item.split, &item.digest)))
            .collect();
        let canonical = serde_json::to_string(&content).expect("JSON values serialise");
        format!(
            "{}-{}",
            settings.version,
            &sha256_hex(canonical.as_bytes())[..12]
        )
    } else {
        settings.version.clone()
    };
    let manifest = FreezeManifest {
        format: FREEZE_FORMAT.to_owned(),
        name: settings.name.clone(),
        version,
        semantic_digest: semantic_digest(&splits),
        total: selected.len(),
        counts: splits
            .iter()
            .map(|(s, ids)| (s.clone(), ids.len()))
            .collect(),
        splits,
        items,
    };
    let text = manifest.render();
    write(&tmp.join(MANIFEST_FILE), text.as_bytes())?;
    sums.insert(MANIFEST_FILE.to_owned(), sha256_hex(text.as_bytes()));
    let listing = render_listing(sums.iter().map(|(p, h)| (p.as_str(), h.as_str())));
    write(&tmp.join(SUMS_FILE), listing.as_bytes())?;
    Ok(manifest)
}

fn write(path: &Path, bytes: &[u8]) -> Result<(), BuiltinError> {
    std::fs::write(path, bytes).map_err(|e| ReleaseError::io(path, e).into())
}

/// Copies the tree at `from` to `to`, hashing every file on the way;
/// refuses anything but regular files and directories.
fn copy_tree(
    from: &Path,
    to: &Path,
    prefix: &str,
    files: &mut ItemFiles,
) -> Result<(), BuiltinError> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::create_dir_all(to).map_err(|e| ReleaseError::io(to, e))?;
    let mut entries: Vec<(String, PathBuf)> = std::fs::read_dir(from)
        .map_err(|e| ReleaseError::io(from, e))?
        .map(|entry| {
            let entry = entry.map_err(|e| ReleaseError::io(from, e))?;
            let name = entry.file_name().into_string().map_err(|_| {
                BuiltinError::Checks(vec![format!(
                    "`{}` is not a UTF-8 name",
                    entry.path().display()
                )])
            })?;
            Ok((name, entry.path()))
        })
        .collect::<Result<_, BuiltinError>>()?;
    entries.sort();
    for (name, path) in entries {
        let relative = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}/{name}")
        };
        if !crate::release::format::is_safe_relative(&relative) {
            return Err(BuiltinError::Checks(vec![format!(
                "`{}` has a name a freeze cannot list (backslash or line break)",
                path.display()
            )]));
        }
        let meta = std::fs::symlink_metadata(&path).map_err(|e| ReleaseError::io(&path, e))?;
        let target = to.join(&name);
        if meta.is_dir() {
            copy_tree(&path, &target, &relative, files)?;
        } else if meta.is_file() {
            let io = |e| ReleaseError::io(&target, e);
            let mut source = std::fs::File::open(&path).map_err(|e| ReleaseError::io(&path, e))?;
            let out = std::fs::File::create(&target).map_err(io)?;
            let mut writer = HashingWriter::new(BufWriter::new(out));
            std::io::copy(&mut source, &mut writer).map_err(io)?;
            let (buffered, hex, size) = writer.finish();
            let out = buffered.into_inner().map_err(|e| io(e.into_error()))?;
            let mode = if meta.permissions().mode() & 0o111 != 0 {
                0o755
            } else {
                0o644
            };
            out.set_permissions(std::fs::Permissions::from_mode(mode))
                .map_err(io)?;
            files.push((relative, hex, size));
        } else {
            let what = if meta.file_type().is_symlink() {
                "a symbolic link"
            } else {
                "not a regular file"
            };
            return Err(BuiltinError::Checks(vec![format!(
                "`{}` is {what}; a freeze holds regular files and directories only",
                path.display()
            )]));
        }
    }
    Ok(())
}
