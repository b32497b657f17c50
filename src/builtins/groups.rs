//! `uses = "groups"`: the training list a sampled stage's groups allow.
//!
//! Reads a sampled stage's merged output (one line per item, with its
//! `group` label and `error` count) and writes three things, touching no
//! other list (a frozen split stays as it was):
//! - `keep`: the items whose group is one of `keep` (default `mixed`: only
//!   a group mixing rewards 0 and 1 teaches a policy anything under GRPO)
//!   and which had no sample end in error, as their item records;
//! - `resample`: the keys of the items with a sample in error — to be drawn
//!   again (`cairn resample STAGE/KEY`), never scored as they are;
//! - `report`: how many items of each label there were, kept, dropped and
//!   to re-sample.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::{BuiltinError, Invocation, read_records, write_json, write_jsonl};
use crate::manifest::settings::GroupsSettings;

pub fn run(invocation: &Invocation) -> Result<String, BuiltinError> {
    let settings: GroupsSettings = invocation.settings()?;
    let lines = read_records(&invocation.input("samples")?, "samples")?;
    let sorted = sort(&lines, &settings)?;
    write_jsonl(&invocation.output("keep")?, sorted.keep.iter())?;
    write_jsonl(&invocation.output("resample")?, sorted.resample.iter())?;
    let report = json!({
        "considered": sorted.considered,
        "groups": sorted.labels,
        "kept": sorted.keep.len(),
        "to_resample": sorted.resample.len(),
        "keep_groups": settings.keep,
    });
    write_json(&invocation.output("report")?, &report)?;
    Ok(format!(
        "kept {} of {} item(s) ({} group), {} to re-sample",
        sorted.keep.len(),
        sorted.considered,
        settings.keep.join(" or "),
        sorted.resample.len()
    ))
}

/// What the lines sort into.
#[derive(Debug, Default, PartialEq)]
pub struct Sorted {
    pub considered: usize,
    pub labels: BTreeMap<String, usize>,
    pub keep: Vec<Value>,
    pub resample: Vec<Value>,
}

pub fn sort(lines: &[Value], settings: &GroupsSettings) -> Result<Sorted, BuiltinError> {
    let mut sorted = Sorted::default();
    for (n, line) in lines.iter().enumerate() {
        if !settings.filters.iter().all(|p| p.holds(line)) {
            continue;
        }
        let (Some(key), Some(group)) = (
            line.get("key").and_then(Value::as_str),
            line.get("group").and_then(Value::as_str),
        ) else {
            return Err(BuiltinError::Invocation(format!(
                "line {} of `samples` has no `key` and `group`: is it the merged output of a sampled stage (`samples = {{ k = … }}`)?",
                n + 1
            )));
        };
        sorted.considered += 1;
        *sorted.labels.entry(group.to_owned()).or_default() += 1;
        let errors = line.get("error").and_then(Value::as_u64).unwrap_or(0);
        if errors > 0 {
            sorted.resample.push(Value::from(key));
        } else if settings.keep.iter().any(|g| g == group) {
            sorted
                .keep
                .push(line.get("item").cloned().unwrap_or(Value::Null));
        }
    }
    Ok(sorted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mixed_groups_are_kept_and_groups_with_errors_go_to_resample() {
        let line = |key: &str, group: &str, error: u64, split: &str| json!({"key": key, "group": group, "error": error, "split": split, "item": {"id": key}});
        let lines = vec![
            line("a", "mixed", 0, "train"),
            line("b", "all-1", 0, "train"),
            line("c", "mixed", 1, "train"),
            line("d", "all-0", 0, "train"),
            line("e", "mixed", 0, "validation"),
        ];
        let settings: GroupsSettings =
            serde_json::from_value(json!({"where": [{"field": "split", "equals": "train"}]}))
                .unwrap();
        let sorted = sort(&lines, &settings).unwrap();
        assert_eq!(sorted.considered, 4);
        assert_eq!(sorted.keep, vec![json!({"id": "a"})]);
        assert_eq!(sorted.resample, vec![json!("c")]);
        assert_eq!(
            sorted.labels,
            BTreeMap::from([
                ("all-0".into(), 1),
                ("all-1".into(), 1),
                ("mixed".into(), 2)
            ])
        );
    }

    #[test]
    fn a_list_that_is_not_a_sampled_output_is_refused() {
        let settings: GroupsSettings = serde_json::from_value(json!({})).unwrap();
        let err = sort(&[json!({"id": "x"})], &settings).unwrap_err();
        assert!(err.to_string().contains("sampled stage"), "{err}");
    }
}
