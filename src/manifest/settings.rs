//! The typed `with` settings of the curation built-ins (`select`, `split`,
//! `gate`): checked when the manifest loads, read again by the built-in
//! when it runs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A test on one record: `{ field = "image", equals = "ok" }`. `field` is a
/// top-level field name or a JSON pointer (`/evidence/tier`). All given
/// conditions must hold.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Predicate {
    pub field: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub equals: Option<Value>,
    /// The value is one of these.
    #[serde(default, rename = "in", skip_serializing_if = "Option::is_none")]
    pub one_of: Option<Vec<Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_in: Option<Vec<Value>>,
    /// The value (an array) contains this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contains: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<f64>,
    /// The field is present and not null (or, with `false`, absent or null).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exists: Option<bool>,
}

/// A record's field: a top-level name, or a JSON pointer.
pub fn field<'v>(record: &'v Value, field: &str) -> Option<&'v Value> {
    let value = if field.starts_with('/') {
        record.pointer(field)
    } else {
        record.get(field)
    };
    value.filter(|v| !v.is_null())
}

/// A field's value as text, for keys and groups (strings, numbers, bools).
pub fn field_text(record: &Value, name: &str) -> Option<String> {
    match field(record, name)? {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

impl Predicate {
    pub fn holds(&self, record: &Value) -> bool {
        let value = field(record, &self.field);
        if let Some(wanted) = self.exists
            && value.is_some() != wanted
        {
            return false;
        }
        if let Some(wanted) = &self.equals
            && value != Some(wanted)
        {
            return false;
        }
        if let Some(set) = &self.one_of
            && !value.is_some_and(|v| set.contains(v))
        {
            return false;
        }
        if let Some(set) = &self.not_in
            && value.is_some_and(|v| set.contains(v))
        {
            return false;
        }
        if let Some(item) = &self.contains
            && !value
                .and_then(Value::as_array)
                .is_some_and(|a| a.contains(item))
        {
            return false;
        }
        let number = value.and_then(Value::as_f64);
        if let Some(min) = self.min
            && !number.is_some_and(|n| n >= min)
        {
            return false;
        }
        if let Some(max) = self.max
            && !number.is_some_and(|n| n <= max)
        {
            return false;
        }
        true
    }
}

/// A preference: records whose `field` equals (or, for an array, contains)
/// an earlier value of `order` come first; records matching none come last.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Preference {
    pub field: String,
    pub order: Vec<Value>,
}

impl Preference {
    /// The record's rank under this preference (lower is preferred).
    pub fn rank(&self, record: &Value) -> usize {
        let value = field(record, &self.field);
        self.order
            .iter()
            .position(|wanted| match value {
                Some(Value::Array(items)) => items.contains(wanted),
                Some(v) => v == wanted,
                None => false,
            })
            .unwrap_or(self.order.len())
    }
}

/// `uses = "select"`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SelectSettings {
    /// The field naming a record (default `id`).
    #[serde(default = "default_key")]
    pub key: String,
    /// Records must pass every predicate to be considered.
    #[serde(default, rename = "where")]
    pub filters: Vec<Predicate>,
    /// Fields ordering records into tiers, ascending (e.g. `tier` 1 first).
    #[serde(default)]
    pub tiers: Vec<String>,
    /// Inside a tier, these preferences, in order; then `sha256(key)`.
    #[serde(default)]
    pub prefer: Vec<Preference>,
    /// Round-robin over this field inside each tier; the cap counts it.
    #[serde(default)]
    pub group: Option<String>,
    #[serde(default)]
    pub max_per_group: Option<usize>,
    /// How many to select (or `quotas`, one target per stage).
    #[serde(default)]
    pub target: Option<usize>,
    /// The field naming a record's stage, with `quotas`.
    #[serde(default)]
    pub stage: Option<String>,
    /// A target per stage: each stage is filled only from its own
    /// candidates, in the order of the stages' names.
    #[serde(default)]
    pub quotas: Option<BTreeMap<String, usize>>,
    /// How many more, in the same order, to keep as reserves (per stage,
    /// with `quotas`).
    #[serde(default)]
    pub reserves: usize,
    /// Fewer than the target (of any stage) is an error unless this is set;
    /// either way the shortfall is reported.
    #[serde(default)]
    pub allow_shortfall: bool,
}

impl SelectSettings {
    /// The stages to fill, in order: `(stage, target)`; one unnamed stage
    /// without `quotas`.
    pub fn pools(&self) -> Vec<(Option<&str>, usize)> {
        match &self.quotas {
            Some(quotas) => quotas
                .iter()
                .map(|(name, target)| (Some(name.as_str()), *target))
                .collect(),
            None => vec![(None, self.target.unwrap_or(0))],
        }
    }

    /// The whole target: the sum of the quotas, or `target`.
    pub fn total(&self) -> usize {
        self.pools().iter().map(|(_, target)| target).sum()
    }
}

/// `target`, or `quotas` with `stage`: one of the two.
pub fn check_select(with: &Value, _: &[&str]) -> Result<(), String> {
    let settings: SelectSettings =
        serde_json::from_value(with.clone()).map_err(|e| e.to_string())?;
    if settings.quotas.as_ref().is_some_and(BTreeMap::is_empty) {
        return Err(
            "`quotas` names no stage: give each stage its target, e.g. `{ A = 350, B = 350 }`"
                .to_owned(),
        );
    }
    match (&settings.target, &settings.quotas, &settings.stage) {
        (Some(_), None, None) | (None, Some(_), Some(_)) => Ok(()),
        (None, None, _) => Err("set `target`, or `quotas` (with `stage`)".to_owned()),
        (Some(_), Some(_), _) => {
            Err("`target` and `quotas` exclude each other: the quotas are the target".to_owned())
        }
        (_, Some(_), None) => {
            Err("`quotas` needs `stage`, the field naming a record's stage".to_owned())
        }
        (_, None, Some(_)) => Err("`stage` goes with `quotas`, a target per stage".to_owned()),
    }
}

/// `uses = "split"`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SplitSettings {
    #[serde(default = "default_key")]
    pub key: String,
    /// No value of this field is in two splits.
    pub group: String,
    /// The exact size of each split.
    pub sizes: BTreeMap<String, usize>,
    /// The field written into each record (default `split`).
    #[serde(default = "default_split_field")]
    pub field: String,
    #[serde(default)]
    pub allow_shortfall: bool,
}

/// `uses = "groups"`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupsSettings {
    /// Only lines passing these are considered (e.g. the train split).
    #[serde(default, rename = "where")]
    pub filters: Vec<Predicate>,
    /// The group labels kept (default `mixed`).
    #[serde(default = "default_keep")]
    pub keep: Vec<String>,
}

fn default_keep() -> Vec<String> {
    vec!["mixed".to_owned()]
}

/// `uses = "gate"`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GateSettings {
    pub checks: Vec<GateCheck>,
}

/// One gate check over the records of one input.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GateCheck {
    /// The input it looks at (a name from the stage's `inputs`).
    pub input: String,
    /// Only records passing these predicates are considered.
    #[serde(default, rename = "where")]
    pub filters: Vec<Predicate>,
    /// The field naming a record, for `unique` and set checks (default `id`).
    #[serde(default = "default_key")]
    pub key: String,
    #[serde(default)]
    pub count: Option<usize>,
    #[serde(default)]
    pub min_count: Option<usize>,
    #[serde(default)]
    pub max_count: Option<usize>,
    /// No two records share this field's value.
    #[serde(default)]
    pub unique: Option<String>,
    #[serde(default)]
    pub group: Option<String>,
    #[serde(default)]
    pub max_per_group: Option<usize>,
    /// The set of keys equals that of another input.
    #[serde(default)]
    pub same_as: Option<String>,
    #[serde(default)]
    pub subset_of: Option<String>,
    #[serde(default)]
    pub disjoint_from: Option<String>,
    /// Numeric bounds on `field` in every record.
    #[serde(default)]
    pub field: Option<String>,
    #[serde(default)]
    pub min: Option<f64>,
    #[serde(default)]
    pub max: Option<f64>,
    /// Bounds on the share of the records that pass predicates: "at
    /// least half of the train groups are mixed".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<Share>,
}

/// `share = { where = [PREDICATE…], min = 0.5, max = 1.0 }`: of the
/// records a check considers, the fraction passing `where`, in [0, 1].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Share {
    #[serde(rename = "where")]
    pub filters: Vec<Predicate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<f64>,
}

fn default_key() -> String {
    "id".to_owned()
}

fn default_split_field() -> String {
    "split".to_owned()
}

/// Deserialises `with` as `T`: the check run at load time.
pub fn check<T: serde::de::DeserializeOwned>(with: &Value) -> Result<(), String> {
    serde_json::from_value::<T>(with.clone())
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Also checks that every input a gate check names is declared.
pub fn check_gate(with: &Value, inputs: &[&str]) -> Result<(), String> {
    let settings: GateSettings = serde_json::from_value(with.clone()).map_err(|e| e.to_string())?;
    for (n, c) in settings.checks.iter().enumerate() {
        let named = [
            Some(&c.input),
            c.same_as.as_ref(),
            c.subset_of.as_ref(),
            c.disjoint_from.as_ref(),
        ];
        for name in named.into_iter().flatten() {
            if !inputs.contains(&name.as_str()) {
                return Err(format!(
                    "check {} names input `{name}`, which the stage does not declare (inputs: {})",
                    n + 1,
                    inputs.join(", ")
                ));
            }
        }
        if c.max_per_group.is_some() != c.group.is_some() {
            return Err(format!(
                "check {}: `max_per_group` and `group` go together",
                n + 1
            ));
        }
        if (c.min.is_some() || c.max.is_some()) && c.field.is_none() {
            return Err(format!("check {}: `min`/`max` need `field`", n + 1));
        }
        if let Some(share) = &c.share {
            if share.filters.is_empty() || (share.min.is_none() && share.max.is_none()) {
                return Err(format!(
                    "check {}: `share` needs `where` (what the share is of) and `min` or `max`",
                    n + 1
                ));
            }
            if let (Some(min), Some(max)) = (share.min, share.max)
                && min > max
            {
                return Err(format!(
                    "check {}: `share` has `min` {min} above `max` {max}: no share is both",
                    n + 1
                ));
            }
            if let Some(bound) = [share.min, share.max]
                .into_iter()
                .flatten()
                .find(|b| !(0.0..=1.0).contains(b))
            {
                return Err(format!(
                    "check {}: a share is a fraction from 0 to 1, not {bound} (write 0.5 for half)",
                    n + 1
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn predicates_test_values_arrays_and_bounds() {
        let r = json!({"repo": "a", "tier": 2, "models": ["gpt-4o"], "x": null, "ev": {"t": 3}});
        let p = |v: Value| -> Predicate { serde_json::from_value(v).unwrap() };
        assert!(p(json!({"field": "repo", "equals": "a"})).holds(&r));
        assert!(!p(json!({"field": "repo", "equals": "b"})).holds(&r));
        assert!(p(json!({"field": "tier", "in": [1, 2]})).holds(&r));
        assert!(!p(json!({"field": "tier", "not_in": [2]})).holds(&r));
        assert!(p(json!({"field": "models", "contains": "gpt-4o"})).holds(&r));
        assert!(p(json!({"field": "tier", "min": 2, "max": 2})).holds(&r));
        assert!(!p(json!({"field": "tier", "min": 3})).holds(&r));
        assert!(p(json!({"field": "x", "exists": false})).holds(&r));
        assert!(p(json!({"field": "/ev/t", "equals": 3})).holds(&r));
    }

    #[test]
    fn preferences_rank_by_first_match() {
        let pref: Preference =
            serde_json::from_value(json!({"field": "models", "order": ["gpt-4o", "claude-3.5"]}))
                .unwrap();
        assert_eq!(pref.rank(&json!({"models": ["claude-3.5", "gpt-4o"]})), 0);
        assert_eq!(pref.rank(&json!({"models": ["claude-3.5"]})), 1);
        assert_eq!(pref.rank(&json!({"models": []})), 2);
    }
}
