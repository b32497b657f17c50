//! `uses = "split"`: a group-isolated split with exact sizes.
//!
//! Groups are taken in the order their first record appears (the input is in
//! preference order), splits from the smallest target to the largest. Each
//! split takes every unused group that still fits whole, in order; if it is
//! still short, it takes the first items of the next unused group (whose
//! other items are then left out: a group is never in two splits). A split
//! that runs out of groups is short: an error naming the numbers, unless
//! `allow_shortfall`, which keeps the largest feasible split and records it.
//!
//! With `previous` (an earlier version's assignments), the splits are
//! stable: every earlier ID still present stays in its split, and takes its
//! group there first; the other groups fill what is left as above. An
//! earlier version that had a group in two splits, or more earlier IDs in a
//! split than its size, is an error.

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
    /// Earlier IDs kept in their split, and earlier IDs no longer present.
    pub kept: usize,
    pub gone: usize,
}

pub fn run(invocation: &Invocation) -> Result<String, BuiltinError> {
    let settings: SplitSettings = invocation.settings()?;
    let records = read_records(&invocation.input("items")?, "items")?;
    let previous = match invocation.optional_input("previous") {
        Some(path) => previous_splits(&read_records(&path, "previous")?, &settings)
            .map_err(BuiltinError::Checks)?,
        None => BTreeMap::new(),
    };
    let split = split(&records, &settings, &previous).map_err(BuiltinError::Checks)?;
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
            &serde_json::json!({ "splits": sizes, "shortfall": shortfall, "unused": split.unused, "kept_from_previous": split.kept, "previous_gone": split.gone }),
        )?;
    }
    let parts: Vec<String> = split
        .sizes
        .iter()
        .map(|(name, (wanted, got, groups))| format!("{name} {got}/{wanted} ({groups} groups)"))
        .collect();
    let stable = if previous.is_empty() {
        String::new()
    } else {
        format!(
            "; {} earlier IDs kept in their splits, {} no longer present",
            split.kept, split.gone
        )
    };
    Ok(format!(
        "split {}: {}{stable}{}",
        split.assigned.len(),
        parts.join(", "),
        if shortfall > 0 {
            format!("; SHORTFALL of {shortfall} (allowed)")
        } else {
            String::new()
        }
    ))
}

/// An earlier version's assignments: ID → split.
pub fn previous_splits(
    records: &[Value],
    settings: &SplitSettings,
) -> Result<BTreeMap<String, String>, Vec<String>> {
    let mut previous = BTreeMap::new();
    let mut problems = Vec::new();
    for (n, record) in records.iter().enumerate() {
        let key = field_text(record, &settings.key);
        let split = field_text(record, &settings.field);
        match (key, split) {
            (Some(key), Some(split)) if settings.sizes.contains_key(&split) => {
                if let Some(other) = previous.insert(key.clone(), split.clone())
                    && other != split
                {
                    problems.push(format!(
                        "previous record {} puts `{key}` in `{split}`, an earlier one in `{other}`",
                        n + 1
                    ));
                }
            }
            (Some(key), Some(split)) => problems.push(format!(
                "previous record {} (`{key}`) is in split `{split}`, which is not one of the sizes ({})",
                n + 1,
                settings.sizes.keys().cloned().collect::<Vec<_>>().join(", ")
            )),
            _ => problems.push(format!(
                "previous record {} needs `{}` and `{}`",
                n + 1,
                settings.key,
                settings.field
            )),
        }
    }
    if problems.is_empty() {
        Ok(previous)
    } else {
        Err(problems)
    }
}

pub fn split(
    records: &[Value],
    settings: &SplitSettings,
    previous: &BTreeMap<String, String>,
) -> Result<Split, Vec<String>> {
    let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
    let mut position: HashMap<String, usize> = HashMap::new();
    let mut problems = Vec::new();
    let mut seen = HashMap::new();
    let mut keys = vec![String::new(); records.len()];
    for (i, record) in records.iter().enumerate() {
        let Some(key) = field_text(record, &settings.key) else {
            problems.push(format!("record {} has no field `{}`", i + 1, settings.key));
            continue;
        };
        keys[i] = key.clone();
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

    // Each group an earlier ID pins, and to which split.
    let mut pinned: HashMap<usize, (&String, &String)> = HashMap::new();
    let mut kept = 0;
    for (g, (group, members)) in groups.iter().enumerate() {
        for &i in members {
            let key = &keys[i];
            let Some(split) = previous.get(key) else {
                continue;
            };
            kept += 1;
            match pinned.get(&g) {
                Some((first, other)) if *other != split => problems.push(format!(
                    "earlier IDs now in group `{group}` were in different splits: `{first}` in `{other}`, `{key}` in `{split}`"
                )),
                Some(_) => {}
                None => {
                    pinned.insert(g, (key, split));
                }
            }
        }
    }
    let gone = previous.len() - kept;
    let mut order: Vec<(&String, &usize)> = settings.sizes.iter().collect();
    order.sort_by_key(|(name, size)| (**size, (*name).clone()));
    // A pinned group waits for its own split: no other takes it first.
    let mut used: Vec<bool> = (0..groups.len()).map(|g| pinned.contains_key(&g)).collect();
    let mut assigned: Vec<(usize, String)> = Vec::new();
    let mut sizes = BTreeMap::new();
    for (name, &wanted) in order {
        let mut need = wanted;
        let mut taken_groups = 0;
        // The groups of earlier IDs first: every earlier ID of them, then
        // their other members while there is room.
        let mine: Vec<usize> = (0..groups.len())
            .filter(|g| pinned.get(g).is_some_and(|(_, split)| *split == name))
            .collect();
        let is_earlier = |i: &usize| previous.contains_key(&keys[*i]);
        let mut earlier = 0;
        for &g in &mine {
            taken_groups += 1;
            let old: Vec<usize> = groups[g].1.iter().copied().filter(is_earlier).collect();
            earlier += old.len();
            assigned.extend(old.iter().map(|&i| (i, name.clone())));
        }
        need = need.saturating_sub(earlier);
        for &g in &mine {
            let new: Vec<usize> = groups[g]
                .1
                .iter()
                .copied()
                .filter(|i| !is_earlier(i))
                .collect();
            let room = need.min(new.len());
            need -= room;
            assigned.extend(new[..room].iter().map(|&i| (i, name.clone())));
        }
        if earlier > wanted {
            problems.push(format!(
                "split `{name}` must keep {earlier} IDs of the previous version, more than its size of {wanted}"
            ));
        }
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
        }
        let got = assigned.iter().filter(|(_, split)| split == name).count();
        sizes.insert(name.clone(), (wanted, got, taken_groups));
    }
    if !problems.is_empty() {
        return Err(problems);
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
        kept,
        gone,
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

    fn split_new(records: &[Value], settings: &SplitSettings) -> Result<Split, Vec<String>> {
        split(records, settings, &BTreeMap::new())
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
        let s = split_new(&r, &settings(&[("train", 6), ("eval", 2)], false)).unwrap();
        assert_eq!(s.sizes["eval"], (2, 2, 1));
        assert_eq!(s.sizes["train"], (6, 6, 3));
    }

    #[test]
    fn a_shortfall_fails_with_the_numbers_unless_allowed() {
        let r = records(&[0, 0, 1]);
        let error = split_new(&r, &settings(&[("train", 2), ("eval", 2)], false)).unwrap_err();
        assert!(error[0].contains("`train` needs 2, got 1"), "{error:?}");
        let s = split_new(&r, &settings(&[("train", 2), ("eval", 2)], true)).unwrap();
        assert_eq!(s.sizes["eval"].1 + s.sizes["train"].1, 3);
    }

    #[test]
    fn an_earlier_version_keeps_its_splits_when_tasks_are_added() {
        let sizes = [("train", 6), ("val", 2), ("test", 2)];
        let v1 = records(&[0, 0, 0, 1, 1, 2, 2, 3, 4, 4]);
        let first = split_new(&v1, &settings(&sizes, false)).unwrap();
        let previous: BTreeMap<String, String> = first
            .assigned
            .iter()
            .map(|(i, name)| (v1[*i]["id"].as_str().unwrap().to_owned(), name.clone()))
            .collect();
        // The next version adds groups in front, which would change every
        // assignment without `previous`, and a task to an earlier group.
        let mut v2 = records(&[5, 5, 6, 6, 6, 7]);
        for (i, record) in v1.iter().enumerate() {
            let mut record = record.clone();
            record["id"] = json!(format!("t{i}"));
            v2.push(record);
        }
        for record in v2.iter_mut().take(6) {
            let id = record["id"].as_str().unwrap().replace('t', "n");
            record["id"] = json!(id);
        }
        v2.push(json!({"id": "n9", "repo": "r3"}));
        let sizes = [("train", 9), ("val", 3), ("test", 3)];
        let second = split(&v2, &settings(&sizes, true), &previous).unwrap();
        assert_eq!((second.kept, second.gone), (10, 0));
        let now: BTreeMap<String, String> = second
            .assigned
            .iter()
            .map(|(i, name)| (v2[*i]["id"].as_str().unwrap().to_owned(), name.clone()))
            .collect();
        for (id, name) in &previous {
            assert_eq!(now.get(id), Some(name), "{id} moved");
        }
        let without = split_new(&v2, &settings(&sizes, true)).unwrap();
        let moved = without
            .assigned
            .iter()
            .filter(|(i, name)| {
                previous
                    .get(v2[*i]["id"].as_str().unwrap())
                    .is_some_and(|p| p != name)
            })
            .count();
        assert!(
            moved > 0,
            "the test needs an order that moves IDs without `previous`"
        );
    }

    #[test]
    fn a_group_kept_in_a_large_split_is_not_taken_by_a_smaller_one_first() {
        // r0 was in train; val (the smaller split) is filled first and
        // would take r0, the first group, without `previous`.
        let r = records(&[0, 0, 1, 1, 2, 2, 2, 2]);
        let previous = BTreeMap::from([("t0".to_owned(), "train".to_owned())]);
        let s = split(&r, &settings(&[("train", 6), ("val", 2)], true), &previous).unwrap();
        let of = |id: &str| {
            s.assigned
                .iter()
                .filter(|(i, _)| r[*i]["id"] == id)
                .map(|(_, name)| name.as_str())
                .collect::<Vec<_>>()
        };
        assert_eq!(of("t0"), ["train"]);
        assert_eq!(of("t1"), ["train"]);
        let ids: Vec<&Value> = s.assigned.iter().map(|(i, _)| &r[*i]["id"]).collect();
        let unique: std::collections::HashSet<_> = ids.iter().collect();
        assert_eq!(unique.len(), ids.len(), "an item in two splits");
    }

    #[test]
    fn two_kept_groups_in_one_split_never_overfill_it() {
        // r0: one earlier ID and five new; r1: two earlier IDs. Train has
        // room for 4: the three earlier IDs, then one new of r0.
        let r = records(&[0, 0, 0, 0, 0, 0, 1, 1]);
        let previous = BTreeMap::from([
            ("t0".to_owned(), "train".to_owned()),
            ("t6".to_owned(), "train".to_owned()),
            ("t7".to_owned(), "train".to_owned()),
        ]);
        let s = split(&r, &settings(&[("train", 4)], true), &previous).unwrap();
        assert_eq!(s.sizes["train"].1, 4);
        let ids: Vec<&str> = s
            .assigned
            .iter()
            .map(|(i, _)| r[*i]["id"].as_str().unwrap())
            .collect();
        for id in ["t0", "t6", "t7"] {
            assert!(ids.contains(&id), "{id} dropped: {ids:?}");
        }
    }

    #[test]
    fn an_earlier_version_that_broke_isolation_or_overfills_is_an_error() {
        let r = records(&[0, 0, 1, 1]);
        let previous = BTreeMap::from([
            ("t0".to_owned(), "train".to_owned()),
            ("t1".to_owned(), "val".to_owned()),
        ]);
        let error = split(&r, &settings(&[("train", 2), ("val", 2)], true), &previous).unwrap_err();
        assert!(
            error[0].contains("earlier IDs now in group `r0` were in different splits"),
            "{error:?}"
        );
        let previous = BTreeMap::from([
            ("t0".to_owned(), "train".to_owned()),
            ("t1".to_owned(), "train".to_owned()),
        ]);
        let error = split(&r, &settings(&[("train", 1), ("val", 2)], true), &previous).unwrap_err();
        assert!(
            error[0].contains("split `train` must keep 2 IDs"),
            "{error:?}"
        );
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
            let result = split_new(&r, &s).unwrap();
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
            let strict = split_new(&r, &settings(&[("a", a), ("b", b)], false));
            let short = result.sizes.values().any(|(w, g, _)| g < w);
            prop_assert_eq!(strict.is_err(), short);
        }

        #[test]
        fn an_earlier_split_is_kept_and_no_item_is_in_two_splits(
            first in prop::collection::vec(0u8..8, 0..40),
            added in prop::collection::vec(0u8..12, 0..40),
            a in 0usize..30,
            b in 0usize..30,
        ) {
            let sizes = [("a", a), ("b", b)];
            let v1 = records(&first);
            let earlier = split_new(&v1, &settings(&sizes, true)).unwrap();
            let previous: BTreeMap<String, String> = earlier
                .assigned
                .iter()
                .map(|(i, name)| (v1[*i]["id"].as_str().unwrap().to_owned(), name.clone()))
                .collect();
            // The next version: new items (new and old groups) first.
            let mut v2: Vec<Value> = added
                .iter()
                .enumerate()
                .map(|(i, g)| json!({"id": format!("n{i}"), "repo": format!("r{g}")}))
                .collect();
            v2.extend(v1.iter().cloned());
            let bigger = [("a", a + 5), ("b", b + 5)];
            let Ok(next) = split(&v2, &settings(&bigger, true), &previous) else {
                return Ok(());
            };
            let mut seen = std::collections::HashSet::new();
            let mut owner: HashMap<String, String> = HashMap::new();
            for (i, name) in &next.assigned {
                prop_assert!(seen.insert(*i), "an item in two splits");
                let g = v2[*i]["repo"].as_str().unwrap().to_owned();
                let was = owner.insert(g, name.clone());
                prop_assert!(was.is_none_or(|w| &w == name), "a group in two splits");
                if let Some(before) = previous.get(v2[*i]["id"].as_str().unwrap()) {
                    prop_assert_eq!(before, name);
                }
            }
            prop_assert_eq!(next.kept, previous.len());
            for (name, (wanted, got, _)) in &next.sizes {
                prop_assert!(got <= wanted, "`{}` holds {} of {}", name, got, wanted);
                prop_assert_eq!(next.assigned.iter().filter(|(_, s)| s == name).count(), *got);
            }
        }
    }
}
