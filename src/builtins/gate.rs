//! `uses = "gate"`: declarative checks over JSON/JSONL outputs. Every check
//! runs; any failure fails the stage (so nothing after it starts) with the
//! figures; success writes a report of every check.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::Value;

use super::{BuiltinError, Invocation, read_records, write_json};
use crate::manifest::settings::{GateCheck, GateSettings, field, field_text};

pub fn run(invocation: &Invocation) -> Result<String, BuiltinError> {
    let settings: GateSettings = invocation.settings()?;
    let mut inputs: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for (name, path) in &invocation.inputs {
        inputs.insert(
            name.clone(),
            read_records(std::path::Path::new(path), name)?,
        );
    }
    let (results, failures) = evaluate(&settings, &inputs);
    if !failures.is_empty() {
        return Err(BuiltinError::Checks(failures));
    }
    write_json(
        &invocation.output("report")?,
        &serde_json::json!({ "checks": results }),
    )?;
    Ok(format!(
        "all {} gate check(s) passed",
        settings.checks.len()
    ))
}

/// Runs every check: (a report line per check, the failures).
pub fn evaluate(
    settings: &GateSettings,
    inputs: &BTreeMap<String, Vec<Value>>,
) -> (Vec<Value>, Vec<String>) {
    let mut results = Vec::new();
    let mut failures = Vec::new();
    for (n, check) in settings.checks.iter().enumerate() {
        let label = format!("check {} on `{}`", n + 1, check.input);
        let records = considered(check, inputs.get(&check.input));
        let mut fail = |message: String| failures.push(format!("{label}: {message}"));
        let count = records.len();
        if let Some(wanted) = check.count
            && count != wanted
        {
            fail(format!("{count} records, expected exactly {wanted}"));
        }
        if let Some(min) = check.min_count
            && count < min
        {
            fail(format!("{count} records, expected at least {min}"));
        }
        if let Some(max) = check.max_count
            && count > max
        {
            fail(format!("{count} records, expected at most {max}"));
        }
        if let Some(name) = &check.unique {
            let mut seen: HashMap<String, usize> = HashMap::new();
            for r in &records {
                *seen
                    .entry(field_text(r, name).unwrap_or_default())
                    .or_default() += 1;
            }
            let dupes: Vec<String> = seen
                .iter()
                .filter(|(_, n)| **n > 1)
                .map(|(v, n)| format!("{v} (×{n})"))
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            if !dupes.is_empty() {
                fail(format!("`{name}` is not unique: {}", shorten(&dupes)));
            }
        }
        if let (Some(group), Some(cap)) = (&check.group, check.max_per_group) {
            let mut per: BTreeMap<String, usize> = BTreeMap::new();
            for r in &records {
                *per.entry(field_text(r, group).unwrap_or_default())
                    .or_default() += 1;
            }
            let over: Vec<String> = per
                .iter()
                .filter(|(_, n)| **n > cap)
                .map(|(g, n)| format!("{g} ({n})"))
                .collect();
            if !over.is_empty() {
                fail(format!("more than {cap} per `{group}`: {}", shorten(&over)));
            }
        }
        let keys = |records: &[&Value]| -> BTreeSet<String> {
            records
                .iter()
                .filter_map(|r| key_of(r, &check.key))
                .collect()
        };
        let mine = keys(&records);
        let other = |name: &String| {
            let check = GateCheck {
                input: name.clone(),
                key: check.key.clone(),
                ..GateCheck::default()
            };
            keys(&considered(&check, inputs.get(name)))
        };
        if let Some(name) = &check.same_as {
            let theirs = other(name);
            let only_mine: Vec<String> = mine.difference(&theirs).cloned().collect();
            let only_theirs: Vec<String> = theirs.difference(&mine).cloned().collect();
            if !only_mine.is_empty() || !only_theirs.is_empty() {
                fail(format!(
                    "IDs differ from `{name}`: only here [{}], only there [{}]",
                    shorten(&only_mine),
                    shorten(&only_theirs)
                ));
            }
        }
        if let Some(name) = &check.subset_of {
            let extra: Vec<String> = mine.difference(&other(name)).cloned().collect();
            if !extra.is_empty() {
                fail(format!("IDs not in `{name}`: {}", shorten(&extra)));
            }
        }
        if let Some(name) = &check.disjoint_from {
            let shared: Vec<String> = mine.intersection(&other(name)).cloned().collect();
            if !shared.is_empty() {
                fail(format!("IDs also in `{name}`: {}", shorten(&shared)));
            }
        }
        if let Some(name) = &check.field {
            let bad: Vec<String> = records
                .iter()
                .filter(|r| {
                    let value = field(r, name).and_then(Value::as_f64);
                    match value {
                        None => true,
                        Some(v) => {
                            check.min.is_some_and(|m| v < m) || check.max.is_some_and(|m| v > m)
                        }
                    }
                })
                .map(|r| field_text(r, &check.key).unwrap_or_else(|| "?".to_owned()))
                .collect();
            if !bad.is_empty() {
                fail(format!(
                    "`{name}` missing or outside [{}, {}]: {}",
                    check.min.map_or("-∞".to_owned(), |m| m.to_string()),
                    check.max.map_or("∞".to_owned(), |m| m.to_string()),
                    shorten(&bad)
                ));
            }
        }
        let mut line = serde_json::json!({
            "check": n + 1,
            "input": check.input,
            "records": count,
            "spec": check,
        });
        if let Some(share) = &check.share {
            let passing = records
                .iter()
                .filter(|r| share.filters.iter().all(|p| p.holds(r)))
                .count();
            let fraction = (count > 0).then(|| passing as f64 / count as f64);
            let what = share
                .filters
                .iter()
                .map(describe)
                .collect::<Vec<_>>()
                .join(" and ");
            match fraction {
                None => fail(format!("no records to take the share of `{what}` in")),
                Some(f) => {
                    let shown = format!(
                        "`{what}` holds for {passing} of {count} records ({:.1} %)",
                        f * 100.0
                    );
                    if let Some(min) = share.min.filter(|&m| f < m) {
                        fail(format!("{shown}, expected at least {:.1} %", min * 100.0));
                    }
                    if let Some(max) = share.max.filter(|&m| f > m) {
                        fail(format!("{shown}, expected at most {:.1} %", max * 100.0));
                    }
                }
            }
            line["share"] = serde_json::json!(fraction);
            line["passing"] = serde_json::json!(passing);
        }
        results.push(line);
    }
    (results, failures)
}

/// A predicate as a reader would write it: `group = mixed`.
fn describe(predicate: &crate::manifest::settings::Predicate) -> String {
    let text = |v: &Value| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let field = &predicate.field;
    let mut parts = Vec::new();
    if let Some(v) = &predicate.equals {
        parts.push(format!("{field} = {}", text(v)));
    }
    if let Some(vs) = &predicate.one_of {
        parts.push(format!(
            "{field} in [{}]",
            vs.iter().map(text).collect::<Vec<_>>().join(", ")
        ));
    }
    if let Some(vs) = &predicate.not_in {
        parts.push(format!(
            "{field} not in [{}]",
            vs.iter().map(text).collect::<Vec<_>>().join(", ")
        ));
    }
    if let Some(v) = &predicate.contains {
        parts.push(format!("{field} contains {}", text(v)));
    }
    if let Some(m) = predicate.min {
        parts.push(format!("{field} ≥ {m}"));
    }
    if let Some(m) = predicate.max {
        parts.push(format!("{field} ≤ {m}"));
    }
    if let Some(e) = predicate.exists {
        parts.push(format!(
            "{field} {}",
            if e { "exists" } else { "is absent" }
        ));
    }
    if parts.is_empty() {
        field.clone()
    } else {
        parts.join(", ")
    }
}

/// A record's key; a bare string (an ID list) is its own key.
fn key_of(record: &Value, key: &str) -> Option<String> {
    match record {
        Value::String(s) => Some(s.clone()),
        other => field_text(other, key),
    }
}

fn considered<'a>(check: &GateCheck, records: Option<&'a Vec<Value>>) -> Vec<&'a Value> {
    records
        .map(|rs| {
            rs.iter()
                .filter(|r| check.filters.iter().all(|p| p.holds(r)))
                .collect()
        })
        .unwrap_or_default()
}

fn shorten(values: &[String]) -> String {
    let shown: Vec<&str> = values.iter().take(10).map(String::as_str).collect();
    if values.len() > 10 {
        format!("{} and {} more", shown.join(", "), values.len() - 10)
    } else {
        shown.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn gate(checks: Value) -> GateSettings {
        serde_json::from_value(json!({ "checks": checks })).unwrap()
    }

    #[test]
    fn every_failure_is_reported_with_its_figures() {
        let inputs = BTreeMap::from([
            (
                "a".to_owned(),
                vec![
                    json!({"id": "x", "repo": "r", "score": 0.5}),
                    json!({"id": "y", "repo": "r", "score": 2}),
                    json!({"id": "y", "repo": "s"}),
                ],
            ),
            ("b".to_owned(), vec![json!({"id": "y"}), json!({"id": "z"})]),
        ]);
        let (_, failures) = evaluate(
            &gate(json!([
                { "input": "a", "count": 2 },
                { "input": "a", "unique": "id" },
                { "input": "a", "group": "repo", "max_per_group": 1 },
                { "input": "a", "disjoint_from": "b" },
                { "input": "a", "same_as": "b" },
                { "input": "a", "field": "score", "min": 0, "max": 1 },
                { "input": "a", "where": [{ "field": "repo", "equals": "s" }], "count": 1 },
            ])),
            &inputs,
        );
        let text = failures.join("\n");
        assert_eq!(failures.len(), 6, "{text}");
        assert!(text.contains("3 records, expected exactly 2"), "{text}");
        assert!(text.contains("`id` is not unique: y (×2)"), "{text}");
        assert!(text.contains("more than 1 per `repo`: r (2)"), "{text}");
        assert!(text.contains("IDs also in `b`: y"), "{text}");
        assert!(text.contains("only here [x], only there [z]"), "{text}");
        assert!(text.contains("outside [0, 1]: y, y"), "{text}");
    }

    #[test]
    fn a_share_is_bounded_over_the_records_considered() {
        let records: Vec<Value> = ["mixed", "mixed", "all-1", "mixed", "all-0"]
            .iter()
            .enumerate()
            .map(|(i, g)| json!({"id": i, "group": g, "split": if i < 4 { "train" } else { "validation" }}))
            .collect();
        let inputs = BTreeMap::from([("s".to_owned(), records)]);
        let check = |min: f64| {
            json!([{ "input": "s", "where": [{ "field": "split", "equals": "train" }],
                     "share": { "where": [{ "field": "group", "equals": "mixed" }], "min": min } }])
        };
        let (report, failures) = evaluate(&gate(check(0.75)), &inputs);
        assert!(failures.is_empty(), "{failures:?}");
        assert_eq!(report[0]["share"], json!(0.75));
        let (_, failures) = evaluate(&gate(check(0.8)), &inputs);
        assert_eq!(
            failures,
            [
                "check 1 on `s`: `group = mixed` holds for 3 of 4 records (75.0 %), expected at least 80.0 %"
            ]
        );
    }

    proptest::proptest! {
        #[test]
        fn each_check_fails_exactly_when_its_condition_is_broken(
            a in proptest::collection::vec((0u8..8, 0u8..4), 0..20),
            b in proptest::collection::vec(0u8..8, 0..10),
            cap in 1usize..4,
        ) {
            let records = |ids: &[(u8, u8)]| -> Vec<Value> {
                ids.iter().map(|(id, g)| json!({"id": format!("t{id}"), "repo": format!("r{g}")})).collect()
            };
            let inputs = BTreeMap::from([
                ("a".to_owned(), records(&a)),
                ("b".to_owned(), b.iter().map(|id| Value::from(format!("t{id}"))).collect()),
            ]);
            let fails = |check: Value| !evaluate(&gate(json!([check])), &inputs).1.is_empty();

            let ids: Vec<u8> = a.iter().map(|(id, _)| *id).collect();
            let unique: std::collections::HashSet<u8> = ids.iter().copied().collect();
            proptest::prop_assert_eq!(fails(json!({"input": "a", "unique": "id"})), unique.len() != ids.len());

            let mut per: HashMap<u8, usize> = HashMap::new();
            for (_, g) in &a {
                *per.entry(*g).or_default() += 1;
            }
            proptest::prop_assert_eq!(
                fails(json!({"input": "a", "group": "repo", "max_per_group": cap})),
                per.values().any(|n| *n > cap)
            );

            let shared = ids.iter().any(|id| b.contains(id));
            proptest::prop_assert_eq!(fails(json!({"input": "a", "disjoint_from": "b"})), shared);
            let contained = ids.iter().all(|id| b.contains(id));
            proptest::prop_assert_eq!(fails(json!({"input": "a", "subset_of": "b"})), !contained);
            proptest::prop_assert_eq!(fails(json!({"input": "a", "count": a.len()})), false);
            proptest::prop_assert_eq!(fails(json!({"input": "a", "min_count": a.len() + 1})), true);
        }
    }

    #[test]
    fn passing_checks_report_their_counts() {
        let inputs = BTreeMap::from([("a".to_owned(), vec![json!({"id": "x"})])]);
        let (results, failures) = evaluate(&gate(json!([{ "input": "a", "count": 1 }])), &inputs);
        assert!(failures.is_empty());
        assert_eq!(results[0]["records"], 1);
    }
}
