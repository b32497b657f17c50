//! `uses = "split"`: a group-isolated split with exact sizes.
//!
//! Groups are taken in the order their first record appears (the input is in
//! preference order), splits from the smallest target to the largest. Each
//! split takes every unused group that still fits whole, in order; if it is
//! still short, it takes the first items of the next unused group (whose
//! other items are then left out: a group is never in two splits). A split
//! that runs out of groups is short: an error naming the numbers, unless
//! `allow_shortfall`, which keeps the largest feasible split and records it.

use std::collections::{BTreeMap, HashMap};

use serde_json::Value;

use super::{BuiltinError, Invocation, read_records, write_json, write_jsonl};
use crate::manifest::settings::{SplitSettings, field_text};

#[derive(Debug)]
pub struct Split {
    /// (record index, split name), in input order.
    pub assigned: Vec<(usize, String)>,
    /// Per split: (wanted, got, groups).
    pub sizes: BTreeMap<String, (usize, usize, usize)>,
    pub unused: usize,
}

pub fn run(invocation: &Invocation) -> Result<String, BuiltinError> {
    let settings: SplitSettings = invocation.settings()?;
    let records = read_records(&invocation.input("items")?, "items")?;
    let split = split(&records, &settings).map_err(BuiltinError::Checks)?;
    let rows = split.assigned.iter().map(|(i, name)| {
        let mut record = records[*i].clone();
        if let Value::Object(map) = &mut record {
            map.insert(settings.field.clone(), Value::from(name.clone()));
        }
        record
    });
    let rows: Vec<Value> = rows.collect();
    write_jsonl(&invocation.output("assignments")?, rows.iter())?;
    let shortfall: usize = split.sizes.values().map(|(w, g, _)| w - g).sum();
    if let Some(path) = invocation.optional_output("report") {
        let sizes: BTreeMap<&String, Value> = split
            .sizes
            .iter()
            .map(|(name, (wanted, got, groups))| {
                (
                    name,
                    serde_json::json!({ "wanted": wanted, "got": got, "shortfall": wanted - got, "groups": groups }),
                )
            })
            .collect();
        write_json(
            &path,
            &serde_json::json!({ "splits": sizes, "shortfall": shortfall, "unused": split.unused }),
        )?;
    }
    let parts: Vec<String> = split
        .sizes
        .iter()
        .map(|(name, (wanted, got, groups))| format!("{name} {got}/{wanted} ({groups} groups)"))
        .collect();
    Ok(format!(
        "split {}: {}{}",
        split.assigned.len(),
        parts.join(", "),
        if shortfall > 0 {
            format!("; SHORTFALL of {shortfall} (allowed)")
        } else {
            String::new()
        }
    ))
}

pub fn split(records: &[Value], settings: &SplitSettings) -> Result<Split, Vec<String>> {
    let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
    let mut position: HashMap<String, usize> = HashMap::new();
    let mut problems = Vec::new();
    let mut seen = HashMap::new();
    for (i, record) in records.iter().enumerate() {
        let Some(key) = field_text(record, &settings.key) else {
            problems.push(format!("record {} has no field `{}`", i + 1, settings.key));
            continue;
        };
        if let Some(first) = seen.insert(key.clone(), i) {
            problems.push(format!(
                "records {} and {} share the ID `{key}`",
                first + 1,
                i + 1
            ));
        }
        let Some(group) = field_text(record, &settings.group) else {
            problems.push(format!("`{key}` has no field `{}`", settings.group));
            continue;
        };
        let at = *position.entry(group.clone()).or_insert_with(|| {
            groups.push((group, Vec::new()));
            groups.len() - 1
        });
        groups[at].1.push(i);
    }
    if !problems.is_empty() {
        return Err(problems);
    }

    let mut order: Vec<(&String, &usize)> = settings.sizes.iter().collect();
    order.sort_by_key(|(name, size)| (**size, (*name).clone()));
    let mut used = vec![false; groups.len()];
    let mut assigned: Vec<(usize, String)> = Vec::new();
    let mut sizes = BTreeMap::new();
    for (name, &wanted) in order {
        let mut need = wanted;
        let mut taken_groups = 0;
        for (g, (_, members)) in groups.iter().enumerate() {
            if !used[g] && members.len() <= need && !members.is_empty() {
                used[g] = true;
                need -= members.len();
                taken_groups += 1;
                assigned.extend(members.iter().map(|&i| (i, name.clone())));
            }
        }
        if need > 0
            && let Some(g) = (0..groups.len()).find(|&g| !used[g])
        {
            used[g] = true;
            taken_groups += 1;
            assigned.extend(groups[g].1.iter().take(need).map(|&i| (i, name.clone())));
            need = 0;
        }
        sizes.insert(name.clone(), (wanted, wanted - need, taken_groups));
    }
    let short: Vec<String> = sizes
        .iter()
        .filter(|(_, (wanted, got, _))| got < wanted)
        .map(|(name, (wanted, got, _))| format!("`{name}` needs {wanted}, got {got}"))
        .collect();
    if !short.is_empty() && !settings.allow_shortfall {
        return Err(vec![format!(
            "the splits cannot be filled from {} records in {} groups without sharing a `{}`: {}; set `allow_shortfall = true` to keep the largest feasible split",
            records.len(),
            groups.len(),
            settings.group,
            short.join(", ")
        )]);
    }
    assigned.sort_by_key(|(i, _)| *i);
    Ok(Split {
        unused: records.len() - assigned.len(),
        assigned,
        sizes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn records(groups: &[u8]) -> Vec<Value> {
        groups
            .iter()
            .enumerate()
            .map(|(i, g)| json!({"id": format!("t{i}"), "repo": format!("r{g}")}))
            .collect()
    }

    fn settings(sizes: &[(&str, usize)], allow: bool) -> SplitSettings {
        serde_json::from_value(json!({
            "group": "repo",
            "sizes": sizes.iter().map(|(n, s)| ((*n).to_owned(), *s)).collect::<BTreeMap<_, _>>(),
            "allow_shortfall": allow,
        }))
        .unwrap()
    }

    #[test]
    fn exact_sizes_without_sharing_a_group() {
        let r = records(&[0, 0, 0, 1, 1, 2, 3, 3, 3, 3]);
        let s = split(&r, &settings(&[("train", 6), ("eval", 2)], false)).unwrap();
        assert_eq!(s.sizes["eval"], (2, 2, 1));
        assert_eq!(s.sizes["train"], (6, 6, 3));
    }

    #[test]
    fn a_shortfall_fails_with_the_numbers_unless_allowed() {
        let r = records(&[0, 0, 1]);
        let error = split(&r, &settings(&[("train", 2), ("eval", 2)], false)).unwrap_err();
        assert!(error[0].contains("`train` needs 2, got 1"), "{error:?}");
        let s = split(&r, &settings(&[("train", 2), ("eval", 2)], true)).unwrap();
        assert_eq!(s.sizes["eval"].1 + s.sizes["train"].1, 3);
    }

    proptest! {
        #[test]
        fn groups_never_span_splits_and_sizes_are_exact_or_reported(
            groups in prop::collection::vec(0u8..12, 0..80),
            a in 0usize..30,
            b in 0usize..30,
        ) {
            let r = records(&groups);
            let s = settings(&[("a", a), ("b", b)], true);
            let result = split(&r, &s).unwrap();
            let mut owner: HashMap<String, &str> = HashMap::new();
            for (i, name) in &result.assigned {
                let g = r[*i]["repo"].as_str().unwrap().to_owned();
                let previous = owner.insert(g, name.as_str());
                prop_assert!(previous.is_none_or(|p| p == name.as_str()));
            }
            for (name, (wanted, got, _)) in &result.sizes {
                let n = result.assigned.iter().filter(|(_, s)| s == name).count();
                prop_assert_eq!(n, *got);
                prop_assert!(got <= wanted);
            }
            // With at least two groups each large enough for either split,
            // each split needs one group: the sizes are met exactly.
            let mut counts: HashMap<u8, usize> = HashMap::new();
            for g in &groups {
                *counts.entry(*g).or_default() += 1;
            }
            if counts.values().filter(|n| **n >= a.max(b)).count() >= 2 {
                prop_assert_eq!(result.sizes["a"].1, a);
                prop_assert_eq!(result.sizes["b"].1, b);
            }
            let strict = split(&r, &settings(&[("a", a), ("b", b)], false));
            let short = result.sizes.values().any(|(w, g, _)| g < w);
            prop_assert_eq!(strict.is_err(), short);
        }
    }
}
