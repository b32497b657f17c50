//! A per-item stage's items, checked before any of them runs.
//!
//! Item keys are checked as the list is read ([`super::items::for_each_keyed`]);
//! here, every `{item.FIELD}` the stage writes (in `run`, checks,
//! `item_inputs`, `item_result`, `item_outputs`) is checked against every
//! item. A field that an item lacks would fail that item with an empty log;
//! it is reported once instead, located in the manifest, with a
//! did-you-mean, and no item runs.
//!
//! When is the list read? An item list that no stage of the pipeline writes
//! is read before the run starts ([`check_item_lists`]): a bad key or field
//! is then a bad-input error (exit 2) and nothing runs. A list that an
//! upstream stage writes is read when the stage is planned, after that
//! upstream stage: a bad key or field fails the stage before its first
//! item.

use std::path::Path;

use super::ScheduleError;
use super::items::for_each_keyed;
use super::proof::kept_plans::{KeptPlan, list_unchanged};
use crate::manifest::interpolate::walk;
use crate::manifest::{Command, Manifest, Stage, line_col};

/// The distinct `{item.FIELD}` names a stage writes, in order.
pub fn referenced_fields(stage: &Stage) -> Vec<String> {
    let Some(foreach) = &stage.foreach else {
        return Vec::new();
    };
    let mut texts: Vec<&str> = Vec::new();
    for command in std::iter::once(&stage.run).chain(&stage.checks) {
        match command {
            Command::Shell(script) => texts.push(script),
            Command::Exec(argv) => texts.extend(argv.iter().map(String::as_str)),
        }
    }
    texts.extend(foreach.item_inputs.iter().map(String::as_str));
    texts.extend(foreach.result.as_deref());
    texts.extend(foreach.trajectory.as_deref());
    texts.extend(foreach.item_outputs.iter().map(|o| o.template.as_str()));
    let mut fields: Vec<String> = Vec::new();
    if let Some(isolate) = &foreach.isolate {
        // Every item belongs to a group.
        fields.push(isolate.by.clone());
    }
    for text in texts {
        let _ = walk(text, false, |p| {
            if p.namespace == "item" && !fields.iter().any(|f| f == p.name) {
                fields.push(p.name.to_owned());
            }
            Ok::<_, ()>(None)
        });
    }
    fields
}

/// Checks items against every field their stage writes, one item at a
/// time as the list is read.
pub struct FieldCheck<'a> {
    manifest: &'a Manifest,
    stage: &'a Stage,
    fields: Vec<String>,
    list: &'a Path,
}

impl<'a> FieldCheck<'a> {
    /// The check for the items of `stage`, read from `list` (as the
    /// manifest names it).
    pub fn new(manifest: &'a Manifest, stage: &'a Stage, list: &'a Path) -> Self {
        FieldCheck {
            manifest,
            stage,
            fields: referenced_fields(stage),
            list,
        }
    }

    /// Whether item `key` has every field: if not, the error names the
    /// first placeholder it lacks, located in the manifest, with a
    /// did-you-mean among its fields.
    pub fn check(&self, key: &str, item: &serde_json::Value) -> Result<(), String> {
        let Some(field) = self.fields.iter().find(|f| lookup(item, f).is_none()) else {
            return Ok(());
        };
        let (manifest, stage) = (self.manifest, self.stage);
        let placeholder = format!("{{item.{field}}}");
        let offset = manifest.source[stage.span.start..]
            .find(&placeholder)
            .map_or(stage.span.start, |n| stage.span.start + n);
        let (line, col) = line_col(&manifest.source, offset);
        let (parent, last) = match field.rsplit_once('.') {
            Some((parent, last)) => (lookup(item, parent), last),
            None => (Some(item), field.as_str()),
        };
        let known: Vec<&str> = parent
            .and_then(|v| v.as_object())
            .map(|o| o.keys().map(String::as_str).collect())
            .unwrap_or_default();
        let hint = known
            .iter()
            .map(|k| (strsim::levenshtein(last, k), *k))
            .filter(|(distance, k)| *distance <= 2.max(k.len() / 3))
            .min()
            .map(|(_, k)| {
                let prefix = field
                    .rsplit_once('.')
                    .map_or(String::new(), |(p, _)| format!("{p}."));
                format!("; did you mean `{{item.{prefix}{k}}}`?")
            })
            .unwrap_or_default();
        Err(format!(
            "{}:{line}:{col}: `{placeholder}` of stage `{}` names no field of item `{}` of `{}`{hint} (its fields: {})",
            manifest.path.display(),
            stage.name,
            key.escape_debug(),
            self.list.display(),
            if known.is_empty() {
                "none".to_owned()
            } else {
                known.join(", ")
            },
        ))
    }
}

fn lookup<'v>(value: &'v serde_json::Value, dotted: &str) -> Option<&'v serde_json::Value> {
    dotted.split('.').try_fold(value, |v, part| v.get(part))
}

/// Reads, before anything runs, the item list of every selected per-item
/// stage that no stage of the pipeline writes, and checks its keys and
/// fields; not a list a plan in `kept` saw as it is (see
/// [`super::kept_plans`]).
pub fn check_item_lists(
    manifest: &Manifest,
    selected: &[bool],
    kept: &[KeptPlan],
) -> Result<(), ScheduleError> {
    for (i, stage) in manifest.stages.iter().enumerate() {
        let Some(foreach) = &stage.foreach else {
            continue;
        };
        if !selected.get(i).copied().unwrap_or(true) {
            continue;
        }
        let items_path = foreach.items.as_str();
        let produced = manifest.stages.iter().flat_map(|s| &s.outputs).any(|o| {
            let out = o.path.as_str();
            items_path == out || items_path.starts_with(&format!("{out}/"))
        });
        let list = foreach.items.resolve(&manifest.root);
        if produced || !list.is_file() {
            continue;
        }
        if list_unchanged(kept, &stage.name, &list) {
            tracing::debug!(stage = %stage.name, "the item list is as a kept plan saw it: not checked again");
            continue;
        }
        let bad = |message: String| ScheduleError::BadItems {
            stage: stage.name.clone(),
            message,
        };
        let fields = FieldCheck::new(manifest, stage, Path::new(items_path));
        for_each_keyed(&list, &foreach.key, |_, key, value| {
            fields.check(&key, value)
        })
        .map_err(bad)?;
    }
    Ok(())
}
