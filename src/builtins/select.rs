//! `uses = "select"`: a deterministic selection.
//!
//! 1. Candidates that are excluded, or fail a `where` predicate, drop out.
//! 2. The rest are ordered by their `tiers` fields (ascending), then by each
//!    `prefer` list, then by `sha256(key)`: an order that does not depend on
//!    the input's order.
//! 3. Must-keep IDs are taken first (all of them, or the selection fails).
//! 4. Inside each tier, groups take turns (round-robin, in the order of each
//!    group's best candidate); a group at `max_per_group` is skipped.
//! 5. Selection stops at `target`; fewer is a shortfall, an error unless
//!    `allow_shortfall`, and reported either way. Never filled silently.
//! 6. Reserves continue the same order (with their own per-group count).

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::Value;
use sha2::{Digest as _, Sha256};

use super::{BuiltinError, Invocation, read_ids, read_records, write_json, write_jsonl};
use crate::manifest::settings::{SelectSettings, field, field_text};

/// The outcome, as indices into the candidates.
#[derive(Debug, PartialEq)]
pub struct Selection {
    pub selected: Vec<usize>,
    pub reserves: Vec<usize>,
    pub shortfall: usize,
    pub eligible: usize,
    pub must_keep: usize,
}

pub fn run(invocation: &Invocation) -> Result<String, BuiltinError> {
    let settings: SelectSettings = invocation.settings()?;
    let candidates = read_records(&invocation.input("candidates")?, "candidates")?;
    let must_keep = match invocation.optional_input("must_keep") {
        Some(path) => read_ids(&path, &settings.key)?,
        None => BTreeSet::new(),
    };
    let exclude = match invocation.optional_input("exclude") {
        Some(path) => read_ids(&path, &settings.key)?,
        None => BTreeSet::new(),
    };
    let selection =
        select(&candidates, &settings, &must_keep, &exclude).map_err(BuiltinError::Checks)?;
    write_jsonl(
        &invocation.output("selected")?,
        selection.selected.iter().map(|&i| &candidates[i]),
    )?;
    if let Some(path) = invocation.optional_output("reserves") {
        write_jsonl(&path, selection.reserves.iter().map(|&i| &candidates[i]))?;
    }
    if let Some(path) = invocation.optional_output("report") {
        write_json(&path, &report(&candidates, &settings, &selection))?;
    }
    let mut summary = format!(
        "selected {} of {} eligible candidates ({} must-keep), {} reserves",
        selection.selected.len(),
        selection.eligible,
        selection.must_keep,
        selection.reserves.len()
    );
    if selection.shortfall > 0 {
        summary.push_str(&format!(
            "; SHORTFALL of {} against a target of {} (allowed)",
            selection.shortfall, settings.target
        ));
    }
    Ok(summary)
}

fn report(candidates: &[Value], settings: &SelectSettings, selection: &Selection) -> Value {
    let count_by = |indices: &[usize], name: &Option<String>| -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        if let Some(name) = name {
            for &i in indices {
                let value = field_text(&candidates[i], name).unwrap_or_default();
                *counts.entry(value).or_default() += 1;
            }
        }
        counts
    };
    let tier_field = settings.tiers.first().cloned();
    serde_json::json!({
        "target": settings.target,
        "selected": selection.selected.len(),
        "shortfall": selection.shortfall,
        "eligible": selection.eligible,
        "must_keep": selection.must_keep,
        "reserves": selection.reserves.len(),
        "groups": count_by(&selection.selected, &settings.group).len(),
        "per_group": count_by(&selection.selected, &settings.group),
        "per_tier": count_by(&selection.selected, &tier_field),
    })
}

/// One part of a record's order: numbers before text before missing.
#[derive(Debug, Clone, PartialEq)]
enum Rank {
    Number(f64),
    Text(String),
    Missing,
}

impl Eq for Rank {}

impl PartialOrd for Rank {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Rank {
    fn cmp(&self, other: &Self) -> Ordering {
        match (self, other) {
            (Rank::Number(a), Rank::Number(b)) => a.total_cmp(b),
            (Rank::Text(a), Rank::Text(b)) => a.cmp(b),
            (Rank::Number(_), _) => Ordering::Less,
            (_, Rank::Number(_)) => Ordering::Greater,
            (Rank::Text(_), Rank::Missing) => Ordering::Less,
            (Rank::Missing, Rank::Text(_)) => Ordering::Greater,
            (Rank::Missing, Rank::Missing) => Ordering::Equal,
        }
    }
}

/// An eligible candidate's place: (tier ranks, preference ranks,
/// sha256(key), index).
type Ordered = (Vec<Rank>, Vec<usize>, [u8; 32], usize);

fn rank_of(record: &Value, name: &str) -> Rank {
    match field(record, name) {
        Some(Value::Number(n)) => Rank::Number(n.as_f64().unwrap_or(f64::MAX)),
        Some(Value::String(s)) => Rank::Text(s.clone()),
        Some(Value::Bool(b)) => Rank::Number(if *b { 0.0 } else { 1.0 }),
        Some(other) => Rank::Text(other.to_string()),
        None => Rank::Missing,
    }
}

/// Selects from `candidates`; every problem found is returned at once.
pub fn select(
    candidates: &[Value],
    settings: &SelectSettings,
    must_keep: &BTreeSet<String>,
    exclude: &BTreeSet<String>,
) -> Result<Selection, Vec<String>> {
    let mut problems = Vec::new();
    let mut keys = Vec::with_capacity(candidates.len());
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (i, record) in candidates.iter().enumerate() {
        match field_text(record, &settings.key) {
            Some(key) => {
                if let Some(first) = seen.insert(key.clone(), i) {
                    problems.push(format!(
                        "candidates {} and {} share the ID `{key}`",
                        first + 1,
                        i + 1
                    ));
                }
                keys.push(key);
            }
            None => {
                problems.push(format!(
                    "candidate {} has no field `{}`",
                    i + 1,
                    settings.key
                ));
                keys.push(String::new());
            }
        }
    }
    if !problems.is_empty() {
        return Err(problems);
    }

    // Eligible candidates, in their stable order.
    let mut eligible: Vec<Ordered> = candidates
        .iter()
        .enumerate()
        .filter(|(i, record)| {
            !exclude.contains(&keys[*i]) && settings.filters.iter().all(|p| p.holds(record))
        })
        .map(|(i, record)| {
            let tiers = settings.tiers.iter().map(|t| rank_of(record, t)).collect();
            let prefs = settings.prefer.iter().map(|p| p.rank(record)).collect();
            (tiers, prefs, Sha256::digest(keys[i].as_bytes()).into(), i)
        })
        .collect();
    eligible.sort();
    let eligible_count = eligible.len();

    let missing: Vec<&str> = must_keep
        .iter()
        .filter(|id| !eligible.iter().any(|e| keys[e.3] == **id))
        .map(String::as_str)
        .collect();
    if !missing.is_empty() {
        let reason = |id: &str| {
            if exclude.contains(id) {
                "excluded"
            } else if seen.contains_key(id) {
                "filtered out"
            } else {
                "not a candidate"
            }
        };
        let shown: Vec<String> = missing
            .iter()
            .take(10)
            .map(|id| format!("{id} ({})", reason(id)))
            .collect();
        let more = missing.len().saturating_sub(10);
        problems.push(format!(
            "{} must-keep ID(s) cannot be selected: {}{}",
            missing.len(),
            shown.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        ));
    }
    if must_keep.len() > settings.target {
        problems.push(format!(
            "the must-keep list has {} IDs, more than the target of {}",
            must_keep.len(),
            settings.target
        ));
    }
    if !problems.is_empty() {
        return Err(problems);
    }

    let group_of = |i: usize| -> String {
        settings
            .group
            .as_ref()
            .and_then(|g| field_text(&candidates[i], g))
            .unwrap_or_default()
    };
    let cap = settings.max_per_group.unwrap_or(usize::MAX);
    let mut taken = vec![false; candidates.len()];
    let mut per_group: HashMap<String, usize> = HashMap::new();
    let mut selected = Vec::new();
    for e in &eligible {
        if must_keep.contains(&keys[e.3]) {
            taken[e.3] = true;
            *per_group.entry(group_of(e.3)).or_default() += 1;
            selected.push(e.3);
        }
    }

    let order = round_robin(&eligible, &group_of);
    for &i in &order {
        if selected.len() >= settings.target {
            break;
        }
        if taken[i] {
            continue;
        }
        let count = per_group.entry(group_of(i)).or_default();
        if *count >= cap {
            continue;
        }
        *count += 1;
        taken[i] = true;
        selected.push(i);
    }
    let shortfall = settings.target.saturating_sub(selected.len());
    if shortfall > 0 && !settings.allow_shortfall {
        return Err(vec![format!(
            "shortfall: {} selected of a target of {} ({} eligible candidates, {} must-keep{}); set `allow_shortfall = true` to accept fewer",
            selected.len(),
            settings.target,
            eligible_count,
            must_keep.len(),
            match settings.max_per_group {
                Some(cap) => format!(", at most {cap} per group"),
                None => String::new(),
            }
        )]);
    }

    let mut reserves = Vec::new();
    let mut reserve_groups: HashMap<String, usize> = HashMap::new();
    for &i in &order {
        if reserves.len() >= settings.reserves {
            break;
        }
        if taken[i] {
            continue;
        }
        let count = reserve_groups.entry(group_of(i)).or_default();
        if *count >= cap {
            continue;
        }
        *count += 1;
        reserves.push(i);
    }
    Ok(Selection {
        selected,
        reserves,
        shortfall,
        eligible: eligible_count,
        must_keep: must_keep.len(),
    })
}

/// The eligible candidates (sorted) in round-robin order: inside each tier,
/// groups take turns in the order of their best candidate.
fn round_robin(eligible: &[Ordered], group_of: &impl Fn(usize) -> String) -> Vec<usize> {
    let mut order = Vec::with_capacity(eligible.len());
    let mut start = 0;
    while start < eligible.len() {
        let tier = &eligible[start].0;
        let end = start
            + eligible[start..]
                .iter()
                .take_while(|e| &e.0 == tier)
                .count();
        let mut queues: Vec<(String, std::collections::VecDeque<usize>)> = Vec::new();
        let mut position: HashMap<String, usize> = HashMap::new();
        for e in &eligible[start..end] {
            let group = group_of(e.3);
            let at = *position.entry(group.clone()).or_insert_with(|| {
                queues.push((group, Default::default()));
                queues.len() - 1
            });
            queues[at].1.push_back(e.3);
        }
        let mut remaining = end - start;
        while remaining > 0 {
            for (_, queue) in queues.iter_mut() {
                if let Some(i) = queue.pop_front() {
                    order.push(i);
                    remaining -= 1;
                }
            }
        }
        start = end;
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn settings(target: usize, cap: Option<usize>) -> SelectSettings {
        serde_json::from_value(json!({
            "target": target,
            "tiers": ["tier"],
            "prefer": [{"field": "models", "order": ["gpt-4o", "claude-3.5"]}],
            "group": "repo",
            "max_per_group": cap,
            "where": [{"field": "image", "equals": "ok"}],
            "reserves": 3,
        }))
        .unwrap()
    }

    fn pool(spec: &[(u8, u8, bool, bool)]) -> Vec<Value> {
        spec.iter()
            .enumerate()
            .map(|(i, (repo, tier, gpt, ok))| {
                json!({
                    "id": format!("t{i}"),
                    "repo": format!("r{repo}"),
                    "tier": tier,
                    "models": if *gpt { vec!["gpt-4o"] } else { vec!["claude-3.7"] },
                    "image": if *ok { "ok" } else { "missing" },
                })
            })
            .collect()
    }

    fn ids(records: &[Value], indices: &[usize]) -> Vec<String> {
        indices
            .iter()
            .map(|&i| records[i]["id"].as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn tiers_come_first_then_groups_take_turns() {
        let records = pool(&[
            (0, 2, true, true),
            (0, 1, false, true),
            (0, 1, true, true),
            (1, 1, false, true),
            (1, 2, true, true),
            (2, 1, true, false),
        ]);
        let s = select(
            &records,
            &settings(4, None),
            &BTreeSet::new(),
            &BTreeSet::new(),
        )
        .unwrap();
        let got = ids(&records, &s.selected);
        // Tier 1 first: r0 (t2 preferred by gpt-4o over t1), r1, then r0
        // again; t5 has no image. Then tier 2.
        assert_eq!(got[..3], ["t2", "t3", "t1"]);
        assert_eq!(s.selected.len(), 4);
        assert_eq!(s.shortfall, 0);
        assert!(!got.contains(&"t5".to_owned()));
    }

    #[test]
    fn shortfall_is_an_error_unless_allowed() {
        let records = pool(&[(0, 1, true, true), (0, 1, true, true), (1, 1, true, true)]);
        let error = select(
            &records,
            &settings(3, Some(1)),
            &BTreeSet::new(),
            &BTreeSet::new(),
        )
        .unwrap_err();
        assert!(
            error[0].contains("shortfall: 2 selected of a target of 3"),
            "{error:?}"
        );
        let mut allowed = settings(3, Some(1));
        allowed.allow_shortfall = true;
        let s = select(&records, &allowed, &BTreeSet::new(), &BTreeSet::new()).unwrap();
        assert_eq!((s.selected.len(), s.shortfall), (2, 1));
    }

    #[test]
    fn must_keep_is_kept_and_a_missing_one_is_named() {
        let records = pool(&[(0, 2, false, true), (1, 1, true, true), (2, 1, true, false)]);
        let keep = BTreeSet::from(["t0".to_owned()]);
        let s = select(&records, &settings(1, None), &keep, &BTreeSet::new()).unwrap();
        assert_eq!(ids(&records, &s.selected), ["t0"]);
        let keep = BTreeSet::from(["t2".to_owned(), "t9".to_owned()]);
        let error = select(&records, &settings(2, None), &keep, &BTreeSet::new()).unwrap_err();
        assert!(error[0].contains("t2 (filtered out)"), "{error:?}");
        assert!(error[0].contains("t9 (not a candidate)"), "{error:?}");
    }

    proptest! {
        #[test]
        fn selection_is_deterministic_capped_and_never_silently_short(
            spec in prop::collection::vec((0u8..6, 1u8..4, any::<bool>(), any::<bool>()), 0..60),
            target in 0usize..40,
            cap in 1usize..6,
            excluded in prop::collection::btree_set(0usize..60, 0..10),
            seed in any::<u64>(),
        ) {
            let records = pool(&spec);
            let exclude: BTreeSet<String> = excluded.iter().map(|i| format!("t{i}")).collect();
            let mut s = settings(target, Some(cap));
            s.allow_shortfall = true;
            let a = select(&records, &s, &BTreeSet::new(), &exclude).unwrap();

            // The input's order does not matter.
            let mut shuffled: Vec<(u64, Value)> = records.iter().cloned().enumerate()
                .map(|(i, r)| ((i as u64).wrapping_mul(seed | 1).rotate_left(17), r)).collect();
            shuffled.sort_by_key(|(k, _)| *k);
            let shuffled: Vec<Value> = shuffled.into_iter().map(|(_, r)| r).collect();
            let b = select(&shuffled, &s, &BTreeSet::new(), &exclude).unwrap();
            prop_assert_eq!(ids(&records, &a.selected), ids(&shuffled, &b.selected));

            // Caps hold; every pick is eligible; the shortfall is exact.
            let mut per_repo: HashMap<&str, usize> = HashMap::new();
            for &i in &a.selected {
                let r = &records[i];
                prop_assert_eq!(r["image"].as_str(), Some("ok"));
                prop_assert!(!exclude.contains(r["id"].as_str().unwrap()));
                *per_repo.entry(r["repo"].as_str().unwrap()).or_default() += 1;
            }
            prop_assert!(per_repo.values().all(|n| *n <= cap));
            let mut feasible: HashMap<&str, usize> = HashMap::new();
            for r in &records {
                if r["image"] == "ok" && !exclude.contains(r["id"].as_str().unwrap()) {
                    *feasible.entry(r["repo"].as_str().unwrap()).or_default() += 1;
                }
            }
            let feasible: usize = feasible.values().map(|n| (*n).min(cap)).sum();
            prop_assert_eq!(a.selected.len(), target.min(feasible));
            prop_assert_eq!(a.shortfall, target - a.selected.len());
            // Without the switch, a shortfall is an error.
            s.allow_shortfall = false;
            let strict = select(&records, &s, &BTreeSet::new(), &exclude);
            prop_assert_eq!(strict.is_err(), a.shortfall > 0);
        }
    }
}
