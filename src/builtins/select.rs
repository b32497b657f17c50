//! `uses = "select"`: a deterministic selection.
//!
//! 1. Candidates that are excluded, or fail a `where` predicate, drop out
//!    (with `quotas`, so do those of no listed stage).
//! 2. The rest are ordered by their place in `order` (a plan's list, when
//!    given), then by their `tiers` fields (ascending), then by each
//!    `prefer` list, then by `sha256(key)`: an order that does not depend on
//!    the input's order.
//! 3. Stage by stage (one stage without `quotas`), in the order of their
//!    names: must-keep IDs are taken first (all of them, or the selection
//!    fails), then keep-list IDs that are eligible (an older freeze's:
//!    reordering never drops them; those that are not eligible are named).
//! 4. Inside each tier, groups take turns (round-robin, in the order of each
//!    group's best candidate); a group at `max_per_group` (counted across
//!    stages) is skipped.
//! 5. A stage stops at its target; fewer is a shortfall, an error unless
//!    `allow_shortfall`, and reported either way. Never filled silently,
//!    and never from another stage.
//! 6. Reserves continue each stage's order (with their own per-group
//!    count), so a rejected task is replaced from its own stage, in order.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use serde_json::Value;
use sha2::{Digest as _, Sha256};

use super::{
    BuiltinError, Invocation, read_id_list, read_ids, read_records, write_json, write_jsonl,
};
use crate::manifest::settings::{SelectSettings, field, field_text};

/// The ID lists a selection is given.
#[derive(Debug, Default)]
pub struct Lists {
    /// Selected, or the selection fails.
    pub must_keep: BTreeSet<String>,
    /// Selected first when eligible (an older freeze); the rest are named.
    pub keep: BTreeSet<String>,
    /// Never selected.
    pub exclude: BTreeSet<String>,
    /// IDs in the order to take them (a plan's main list, then its
    /// reserves), before tiers; candidates not in it come after.
    pub order: Vec<String>,
}

/// The outcome, as indices into the candidates.
#[derive(Debug, PartialEq)]
pub struct Selection {
    /// Stage after stage, each in selection order.
    pub selected: Vec<usize>,
    pub reserves: Vec<usize>,
    pub shortfall: usize,
    pub eligible: usize,
    pub must_keep: usize,
    /// What each stage (one unnamed stage without `quotas`) got.
    pub stages: Vec<StageOutcome>,
    /// Keep-list IDs given, and those that were not selected, with why.
    pub keep: usize,
    pub not_kept: Vec<(String, &'static str)>,
}

#[derive(Debug, PartialEq)]
pub struct StageOutcome {
    pub name: Option<String>,
    pub target: usize,
    pub eligible: usize,
    pub selected: usize,
    pub kept: usize,
    pub reserves: usize,
}

impl StageOutcome {
    pub fn shortfall(&self) -> usize {
        self.target.saturating_sub(self.selected)
    }
}

pub fn run(invocation: &Invocation) -> Result<String, BuiltinError> {
    let settings: SelectSettings = invocation.settings()?;
    let candidates = read_records(&invocation.input("candidates")?, "candidates")?;
    let ids = |name: &str| match invocation.optional_input(name) {
        Some(path) => read_ids(&path, &settings.key),
        None => Ok(BTreeSet::new()),
    };
    let lists = Lists {
        must_keep: ids("must_keep")?,
        keep: ids("keep")?,
        exclude: ids("exclude")?,
        order: match invocation.optional_input("order") {
            Some(path) => read_id_list(&path, &settings.key)?,
            None => Vec::new(),
        },
    };
    let selection = select(&candidates, &settings, &lists).map_err(BuiltinError::Checks)?;
    write_jsonl(
        &invocation.output("selected")?,
        selection.selected.iter().map(|&i| &candidates[i]),
    )?;
    if let Some(path) = invocation.optional_output("reserves") {
        write_jsonl(&path, selection.reserves.iter().map(|&i| &candidates[i]))?;
    }
    if let Some(path) = invocation.optional_output("planned") {
        let planned = selection.selected.iter().chain(&selection.reserves);
        write_jsonl(&path, planned.map(|&i| &candidates[i]))?;
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
    if settings.quotas.is_some() {
        let stages: Vec<String> = selection
            .stages
            .iter()
            .map(|s| {
                format!(
                    "{} {}/{}",
                    s.name.as_deref().unwrap_or_default(),
                    s.selected,
                    s.target
                )
            })
            .collect();
        summary.push_str(&format!(" (stages: {})", stages.join(", ")));
    }
    if selection.keep > 0 {
        summary.push_str(&format!(
            "; kept {} of {} older IDs",
            selection.keep - selection.not_kept.len(),
            selection.keep
        ));
    }
    if selection.shortfall > 0 {
        summary.push_str(&format!(
            "; SHORTFALL of {} against a target of {} (allowed)",
            selection.shortfall,
            settings.total()
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
    let mut report = serde_json::json!({
        "target": settings.total(),
        "selected": selection.selected.len(),
        "shortfall": selection.shortfall,
        "eligible": selection.eligible,
        "must_keep": selection.must_keep,
        "reserves": selection.reserves.len(),
        "groups": count_by(&selection.selected, &settings.group).len(),
        "per_group": count_by(&selection.selected, &settings.group),
        "per_tier": count_by(&selection.selected, &tier_field),
    });
    if settings.quotas.is_some() {
        let stages: BTreeMap<&str, Value> = selection
            .stages
            .iter()
            .map(|s| {
                (
                    s.name.as_deref().unwrap_or_default(),
                    serde_json::json!({
                        "quota": s.target,
                        "selected": s.selected,
                        "shortfall": s.shortfall(),
                        "eligible": s.eligible,
                        "kept": s.kept,
                        "reserves": s.reserves,
                    }),
                )
            })
            .collect();
        report["stages"] = serde_json::json!(stages);
    }
    if selection.keep > 0 {
        report["kept"] = Value::from(selection.keep - selection.not_kept.len());
        report["not_kept"] = selection
            .not_kept
            .iter()
            .map(|(id, reason)| serde_json::json!({ "id": id, "reason": reason }))
            .collect();
    }
    report
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
    lists: &Lists,
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

    let pools = settings.pools();
    let stage_of = |i: usize| -> Option<String> {
        settings
            .stage
            .as_ref()
            .and_then(|field| field_text(&candidates[i], field))
    };
    let in_a_stage = |i: usize| match &settings.quotas {
        Some(quotas) => stage_of(i).is_some_and(|stage| quotas.contains_key(&stage)),
        None => true,
    };
    // An ID listed twice takes its first place.
    let mut place: HashMap<&str, usize> = HashMap::new();
    for (p, id) in lists.order.iter().enumerate() {
        place.entry(id.as_str()).or_insert(p);
    }
    // Eligible candidates, in their stable order.
    let mut eligible: Vec<Ordered> = candidates
        .iter()
        .enumerate()
        .filter(|(i, record)| {
            !lists.exclude.contains(&keys[*i])
                && in_a_stage(*i)
                && settings.filters.iter().all(|p| p.holds(record))
        })
        .map(|(i, record)| {
            let place = place
                .get(keys[i].as_str())
                .map_or(Rank::Missing, |p| Rank::Number(*p as f64));
            let tiers = std::iter::once(place)
                .chain(settings.tiers.iter().map(|t| rank_of(record, t)))
                .collect();
            let prefs = settings.prefer.iter().map(|p| p.rank(record)).collect();
            (tiers, prefs, Sha256::digest(keys[i].as_bytes()).into(), i)
        })
        .collect();
    eligible.sort();
    let eligible_count = eligible.len();
    let is_eligible: HashSet<usize> = eligible.iter().map(|e| e.3).collect();
    let reason = |id: &str| -> &'static str {
        match seen.get(id) {
            None => "not a candidate",
            Some(_) if lists.exclude.contains(id) => "excluded",
            Some(&i) if !in_a_stage(i) => "in no stage of `quotas`",
            Some(_) => "filtered out",
        }
    };

    let missing: Vec<&str> = lists
        .must_keep
        .iter()
        .filter(|id| !seen.get(*id).is_some_and(|i| is_eligible.contains(i)))
        .map(String::as_str)
        .collect();
    if !missing.is_empty() {
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
    for (stage, target) in &pools {
        let in_stage = lists
            .must_keep
            .iter()
            .filter(|id| {
                seen.get(*id)
                    .is_some_and(|&i| stage_of(i).as_deref() == *stage || stage.is_none())
            })
            .count();
        if in_stage > *target {
            problems.push(match stage {
                Some(stage) => format!(
                    "stage `{stage}` has {in_stage} must-keep IDs, more than its quota of {target}"
                ),
                None => format!(
                    "the must-keep list has {in_stage} IDs, more than the target of {target}"
                ),
            });
        }
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
    // The cap counts across stages.
    let mut per_group: HashMap<String, usize> = HashMap::new();
    let mut selected = Vec::new();
    let mut reserves = Vec::new();
    let mut stages = Vec::new();
    for (stage, target) in &pools {
        let pool: Vec<Ordered> = eligible
            .iter()
            .filter(|e| stage.is_none() || stage_of(e.3).as_deref() == *stage)
            .cloned()
            .collect();
        let mut picked = Vec::new();
        let take = |i: usize,
                    taken: &mut [bool],
                    per_group: &mut HashMap<String, usize>,
                    picked: &mut Vec<usize>| {
            taken[i] = true;
            *per_group.entry(group_of(i)).or_default() += 1;
            picked.push(i);
        };
        for e in &pool {
            if lists.must_keep.contains(&keys[e.3]) {
                take(e.3, &mut taken, &mut per_group, &mut picked);
            }
        }
        // An older freeze's IDs next, before the cap: they were capped once.
        let mut kept = 0;
        for e in &pool {
            if picked.len() < *target && !taken[e.3] && lists.keep.contains(&keys[e.3]) {
                take(e.3, &mut taken, &mut per_group, &mut picked);
                kept += 1;
            }
        }
        let order = round_robin(&pool, &group_of);
        for &i in &order {
            if picked.len() >= *target {
                break;
            }
            if !taken[i] && per_group.get(&group_of(i)).copied().unwrap_or(0) < cap {
                take(i, &mut taken, &mut per_group, &mut picked);
            }
        }
        // Reserves continue the order, with their own count per group.
        let mut reserve_groups: HashMap<String, usize> = HashMap::new();
        let mut spare = Vec::new();
        for &i in &order {
            if spare.len() >= settings.reserves {
                break;
            }
            let count = reserve_groups.entry(group_of(i)).or_default();
            if !taken[i] && *count < cap {
                *count += 1;
                spare.push(i);
            }
        }
        stages.push(StageOutcome {
            name: stage.map(str::to_owned),
            target: *target,
            eligible: pool.len(),
            selected: picked.len(),
            kept,
            reserves: spare.len(),
        });
        selected.append(&mut picked);
        reserves.append(&mut spare);
    }
    for outcome in &stages {
        if outcome.shortfall() == 0 || settings.allow_shortfall {
            continue;
        }
        let capped = match settings.max_per_group {
            Some(cap) => format!(", at most {cap} per group"),
            None => String::new(),
        };
        problems.push(match &outcome.name {
            Some(stage) => format!(
                "shortfall in stage `{stage}`: {} selected of a quota of {} ({} eligible candidates in the stage{capped}); a stage is never filled from another; set `allow_shortfall = true` to accept fewer",
                outcome.selected, outcome.target, outcome.eligible
            ),
            None => format!(
                "shortfall: {} selected of a target of {} ({} eligible candidates, {} must-keep{capped}); set `allow_shortfall = true` to accept fewer",
                outcome.selected,
                outcome.target,
                eligible_count,
                lists.must_keep.len()
            ),
        });
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    let not_kept = lists
        .keep
        .iter()
        .filter(|id| !seen.get(*id).is_some_and(|&i| taken[i]))
        .map(|id| {
            let why = match seen.get(id) {
                Some(i) if is_eligible.contains(i) => "over its stage's target",
                _ => reason(id),
            };
            (id.clone(), why)
        })
        .collect();
    Ok(Selection {
        shortfall: stages.iter().map(StageOutcome::shortfall).sum(),
        selected,
        reserves,
        eligible: eligible_count,
        must_keep: lists.must_keep.len(),
        stages,
        keep: lists.keep.len(),
        not_kept,
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
        let s = select(&records, &settings(4, None), &Lists::default()).unwrap();
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
        let error = select(&records, &settings(3, Some(1)), &Lists::default()).unwrap_err();
        assert!(
            error[0].contains("shortfall: 2 selected of a target of 3"),
            "{error:?}"
        );
        let mut allowed = settings(3, Some(1));
        allowed.allow_shortfall = true;
        let s = select(&records, &allowed, &Lists::default()).unwrap();
        assert_eq!((s.selected.len(), s.shortfall), (2, 1));
    }

    #[test]
    fn must_keep_is_kept_and_a_missing_one_is_named() {
        let records = pool(&[(0, 2, false, true), (1, 1, true, true), (2, 1, true, false)]);
        let must_keep = |ids: &[&str]| Lists {
            must_keep: ids.iter().map(|id| (*id).to_owned()).collect(),
            ..Lists::default()
        };
        let s = select(&records, &settings(1, None), &must_keep(&["t0"])).unwrap();
        assert_eq!(ids(&records, &s.selected), ["t0"]);
        let error = select(&records, &settings(2, None), &must_keep(&["t2", "t9"])).unwrap_err();
        assert!(error[0].contains("t2 (filtered out)"), "{error:?}");
        assert!(error[0].contains("t9 (not a candidate)"), "{error:?}");
    }

    fn staged(quotas: &[(&str, usize)], cap: Option<usize>, reserves: usize) -> SelectSettings {
        serde_json::from_value(json!({
            "stage": "stage",
            "quotas": quotas.iter().map(|(n, q)| ((*n).to_owned(), *q)).collect::<BTreeMap<_, _>>(),
            "group": "repo",
            "max_per_group": cap,
            "reserves": reserves,
        }))
        .unwrap()
    }

    /// `(stage, repo)` per record, IDs `t0`, `t1`, …
    fn staged_pool(spec: &[(&str, u8)]) -> Vec<Value> {
        spec.iter()
            .enumerate()
            .map(|(i, (stage, repo))| json!({"id": format!("t{i}"), "stage": stage, "repo": format!("r{repo}")}))
            .collect()
    }

    #[test]
    fn a_short_stage_is_never_filled_from_another() {
        // Stage A has 2 candidates, stage B 6; A's quota is 3.
        let records = staged_pool(&[
            ("A", 0),
            ("A", 1),
            ("B", 2),
            ("B", 3),
            ("B", 4),
            ("B", 5),
            ("B", 6),
            ("B", 7),
        ]);
        let error = select(
            &records,
            &staged(&[("A", 3), ("B", 3)], None, 0),
            &Lists::default(),
        )
        .unwrap_err();
        assert!(
            error[0].contains("shortfall in stage `A`: 2 selected of a quota of 3")
                && error[0].contains("never filled from another"),
            "{error:?}"
        );
        let mut allowed = staged(&[("A", 3), ("B", 3)], None, 0);
        allowed.allow_shortfall = true;
        let s = select(&records, &allowed, &Lists::default()).unwrap();
        let stages: Vec<_> = s
            .stages
            .iter()
            .map(|o| (o.name.clone().unwrap(), o.selected, o.shortfall()))
            .collect();
        assert_eq!(stages, [("A".to_owned(), 2, 1), ("B".to_owned(), 3, 0)]);
        assert_eq!(s.selected.len(), 5);
        let a: Vec<&Value> = s.selected[..2].iter().map(|&i| &records[i]).collect();
        assert!(a.iter().all(|r| r["stage"] == "A"), "{a:?}");
    }

    #[test]
    fn reserves_are_per_stage_and_the_cap_counts_across_stages() {
        // r0 has candidates in both stages; at most 2 of r0 in all.
        let records = staged_pool(&[
            ("A", 0),
            ("A", 0),
            ("A", 1),
            ("A", 1),
            ("A", 2),
            ("B", 0),
            ("B", 3),
            ("B", 3),
            ("B", 4),
        ]);
        let s = select(
            &records,
            &staged(&[("A", 3), ("B", 2)], Some(2), 5),
            &Lists::default(),
        )
        .unwrap();
        let r0 = s
            .selected
            .iter()
            .filter(|&&i| records[i]["repo"] == "r0")
            .count();
        assert!(r0 <= 2, "{r0} of r0");
        for &i in &s.reserves {
            assert!(!s.selected.contains(&i));
        }
        // Each stage's reserves come right after its own selection's order.
        let a_reserves = s.stages[0].reserves;
        assert!(
            s.reserves[..a_reserves]
                .iter()
                .all(|&i| records[i]["stage"] == "A")
        );
        assert!(
            s.reserves[a_reserves..]
                .iter()
                .all(|&i| records[i]["stage"] == "B")
        );
        assert_eq!(
            s.stages[0].reserves + s.stages[1].reserves,
            s.reserves.len()
        );
        assert_eq!(s.reserves.len(), 9 - 5);
    }

    #[test]
    fn an_older_freeze_is_kept_first_and_what_cannot_be_is_named() {
        let records = staged_pool(&[("A", 0), ("A", 1), ("A", 2), ("A", 3), ("B", 4), ("B", 5)]);
        // Whatever the order would choose, t3 and t2 are kept; t4 is of
        // stage B; t8 is gone.
        let lists = Lists {
            keep: ["t3", "t2", "t4", "t8"]
                .iter()
                .map(|id| (*id).to_owned())
                .collect(),
            exclude: BTreeSet::from(["t2".to_owned()]),
            ..Lists::default()
        };
        let s = select(&records, &staged(&[("A", 2), ("B", 1)], None, 0), &lists).unwrap();
        let chosen = ids(&records, &s.selected);
        assert!(chosen[..2].contains(&"t3".to_owned()), "{chosen:?}");
        assert_eq!(chosen[2], "t4");
        assert_eq!(
            s.not_kept,
            [
                ("t2".to_owned(), "excluded"),
                ("t8".to_owned(), "not a candidate")
            ]
        );
        assert_eq!((s.stages[0].kept, s.stages[1].kept), (1, 1));
    }

    #[test]
    fn a_plans_order_replaces_a_rejected_task_with_its_stages_next_reserve() {
        // The plan: A's main list t0 t1, its reserves t2 t3; B's main t4,
        // its reserve t5. Validation rejected t1 and t4 (not candidates).
        let planned = staged_pool(&[("A", 0), ("A", 1), ("A", 2), ("A", 3), ("B", 4), ("B", 5)]);
        let order: Vec<String> = ["t0", "t1", "t4", "t3", "t2", "t5"]
            .iter()
            .map(|id| (*id).to_owned())
            .collect();
        let validated: Vec<Value> = planned
            .iter()
            .filter(|r| r["id"] != "t1" && r["id"] != "t4")
            .cloned()
            .collect();
        let lists = Lists {
            order,
            ..Lists::default()
        };
        let s = select(&validated, &staged(&[("A", 2), ("B", 1)], None, 0), &lists).unwrap();
        // t3 is A's first reserve in the plan's order, whatever its hash.
        assert_eq!(ids(&validated, &s.selected), ["t0", "t3", "t5"]);
    }

    #[test]
    fn target_or_quotas_one_of_the_two() {
        let check = |with: Value| crate::manifest::settings::check_select(&with, &[]);
        assert!(check(json!({"target": 3})).is_ok());
        assert!(check(json!({"stage": "stage", "quotas": {"A": 1}})).is_ok());
        assert!(check(json!({})).unwrap_err().contains("set `target`"));
        assert!(
            check(json!({"target": 1, "stage": "s", "quotas": {"A": 1}}))
                .unwrap_err()
                .contains("exclude each other")
        );
        assert!(
            check(json!({"quotas": {"A": 1}}))
                .unwrap_err()
                .contains("needs `stage`")
        );
        assert!(
            check(json!({"stage": "s", "quotas": {}}))
                .unwrap_err()
                .contains("names no stage")
        );
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
            let lists = Lists { exclude, ..Lists::default() };
            let exclude = &lists.exclude;
            let a = select(&records, &s, &lists).unwrap();

            // The input's order does not matter.
            let mut shuffled: Vec<(u64, Value)> = records.iter().cloned().enumerate()
                .map(|(i, r)| ((i as u64).wrapping_mul(seed | 1).rotate_left(17), r)).collect();
            shuffled.sort_by_key(|(k, _)| *k);
            let shuffled: Vec<Value> = shuffled.into_iter().map(|(_, r)| r).collect();
            let b = select(&shuffled, &s, &lists).unwrap();
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
            let strict = select(&records, &s, &lists);
            prop_assert_eq!(strict.is_err(), a.shortfall > 0);
        }
    }
}
