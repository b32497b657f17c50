//! What a sampled stage reports: per item, its samples' outcomes, pass@k
//! and whether its group of rollouts mixes rewards; per stage (and per
//! sub-list), the same over its items.
//!
//! A sample that ended `ok` passed (reward 1); one with a verdict is a
//! valid fail (reward 0); one that ended in `error` is not valid, and counts
//! as a fail unless the manifest says `errors = "exclude"` — the report
//! then says which denominator it used. A sample still failing on
//! infrastructure has no verdict at all: the stage does not finish with
//! one, so none is reported.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::items::{PlannedItem, field};
use crate::fingerprint::canonical_json;
use crate::manifest::{Compare, ErrorsCount, ItemClass, Samples};

/// The unbiased estimator of pass@k from `n` samples of which `c` passed:
/// 1 − C(n−c, k) / C(n, k), the chance that k of the n drawn without
/// replacement hold at least one pass. `None` when fewer than k samples
/// count.
pub fn pass_at_k(n: u32, c: u32, k: u32) -> Option<f64> {
    if k == 0 || k > n || c > n {
        return None;
    }
    if n - c < k {
        return Some(1.0);
    }
    // C(n−c, k) / C(n, k) = ∏_{i = n−c+1}^{n} (1 − k / i), stable in f64.
    let none_passed: f64 = (n - c + 1..=n)
        .map(|i| 1.0 - f64::from(k) / f64::from(i))
        .product();
    Some(1.0 - none_passed)
}

/// How one item's samples ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    pub requested: u32,
    pub passed: u32,
    /// Ended with a verdict (a valid fail).
    pub failed: u32,
    pub error: u32,
    pub infra: u32,
    /// Not attempted yet.
    pub pending: u32,
    /// Not run: their group is marked (`isolate`).
    pub marked: u32,
}

impl Tally {
    /// Counts one sample that ended `class`; `mark` is the verdict a
    /// marked group's samples that did not run are reported with.
    pub fn add(&mut self, class: Option<&ItemClass>, mark: Option<&str>) {
        self.requested += 1;
        match class {
            Some(ItemClass::Verdict(v)) if Some(v.as_str()) == mark => self.marked += 1,
            Some(ItemClass::Ok) => self.passed += 1,
            Some(ItemClass::Verdict(_)) => self.failed += 1,
            Some(ItemClass::Error) => self.error += 1,
            Some(ItemClass::Infra) => self.infra += 1,
            None => self.pending += 1,
        }
    }

    /// How `units` (one item's samples) ended.
    fn of(units: &[&PlannedItem], mark: Option<&str>) -> Self {
        let mut tally = Tally::default();
        for unit in units {
            tally.add(unit.outcome.as_ref().map(|(c, _)| c), mark);
        }
        tally
    }

    /// Samples with a verdict: passed or failed.
    pub fn valid(&self) -> u32 {
        self.passed + self.failed
    }

    /// The n of pass@k: every sample but those failing on infrastructure,
    /// or only the valid ones when errors are excluded.
    pub fn denominator(&self, errors: ErrorsCount) -> u32 {
        match errors {
            ErrorsCount::AsFails => self.valid() + self.error,
            ErrorsCount::Excluded => self.valid(),
        }
    }

    /// `all-0`, `all-1` or `mixed` over the valid samples (`none` without
    /// any): only a mixed group teaches a policy anything under GRPO.
    pub fn group(&self) -> &'static str {
        match (self.valid(), self.passed) {
            (0, _) => "none",
            (_, 0) => "all-0",
            (valid, passed) if valid == passed => "all-1",
            _ => "mixed",
        }
    }
}

/// The sampled stage's merged results: one JSON line per item (in key
/// order), with its samples and their tally.
pub fn merged(plan: &[PlannedItem], samples: &Samples, mark: Option<&str>) -> Vec<u8> {
    let mut out = Vec::new();
    for (key, units) in by_item(plan) {
        let first = &units[0].item;
        let tally = Tally::of(&units, mark);
        let mut drawn = Vec::with_capacity(units.len());
        for unit in &units {
            let class = unit.outcome.as_ref().map(|(c, _)| c);
            let sample = unit.item.sample.as_ref();
            let mut line = json!({
                "sample": sample.map(|s| s.index),
                "seed": sample.map(|s| s.seed),
                "draw": sample.map(|s| s.draw),
                "class": class.map_or("pending", ItemClass::name),
                // Attempts on record for this outcome (1 unless it was
                // retried; 0 for a sample of a marked group not run).
                "attempts": unit.outcome.as_ref().map_or(0, |(_, n)| *n),
            });
            if let Some(result) = &unit.result {
                line["result"] = (**result).clone();
            }
            drawn.push(line);
        }
        let mut line = json!({
            "key": key,
            "item": first.value(),
            "samples": drawn,
            "group": tally.group(),
        });
        put_tally(&mut line, &tally, samples);
        if let Some(split) = split_of(first, samples) {
            line["split"] = Value::String(split);
        }
        if let Some(field) = &samples.protocol {
            line["protocol"] = Value::String(protocol_of(first, field));
        }
        out.extend_from_slice(canonical_json(&line).as_bytes());
        out.push(b'\n');
    }
    out
}

/// The stage's summary over all its items and over each sub-list, and its
/// comparisons. With a `protocol` field, each of these is made per
/// protocol (under `protocols`), and nothing over two: no figure pools
/// results of two protocols, no comparison pairs them.
pub fn summary(stage: &str, plan: &[PlannedItem], samples: &Samples, mark: Option<&str>) -> Value {
    let mut out = json!({
        "stage": stage,
        "samples": {
            "k": samples.k,
            "seed": samples.seed,
            "pass_at": samples.pass_at,
            "errors": samples.errors.name(),
        },
        "denominator": denominator_name(samples.errors),
    });
    let Some(field) = &samples.protocol else {
        let units: Vec<&PlannedItem> = plan.iter().collect();
        put_section(&mut out, &units, samples, mark);
        return out;
    };
    // An item's samples share its protocol: read once per item.
    let mut protocols: BTreeMap<String, Vec<&PlannedItem>> = BTreeMap::new();
    for (_, units) in by_item(plan) {
        protocols
            .entry(protocol_of(&units[0].item, field))
            .or_default()
            .extend(units);
    }
    out["protocol_by"] = Value::String(field.clone());
    out["protocols"] = protocols
        .into_iter()
        .map(|(name, units)| {
            let mut section = json!({});
            put_section(&mut section, &units, samples, mark);
            (name, section)
        })
        .collect::<serde_json::Map<_, _>>()
        .into();
    out
}

/// Into `out`: the figures over `units` (all, each sub-list, the
/// comparisons).
fn put_section(out: &mut Value, units: &[&PlannedItem], samples: &Samples, mark: Option<&str>) {
    let mut all = Summary::default();
    let mut splits: BTreeMap<String, Summary> = BTreeMap::new();
    for (_, units) in by_item(units.iter().copied()) {
        let tally = Tally::of(&units, mark);
        all.add(&tally, samples);
        if let Some(split) = split_of(&units[0].item, samples) {
            splits.entry(split).or_default().add(&tally, samples);
        }
    }
    out["all"] = all.to_json(samples);
    if let Some(compare) = &samples.compare {
        out["comparisons"] = Value::Array(comparisons(units, samples, compare, mark));
    }
    if let Some(field) = &samples.split {
        out["split_by"] = Value::String(field.clone());
        out["splits"] = splits
            .iter()
            .map(|(name, s)| (name.clone(), s.to_json(samples)))
            .collect::<serde_json::Map<_, _>>()
            .into();
    }
}

/// One item's (passes, denominator) in each of two compared groups.
type Paired = ((u32, u32), (u32, u32));

/// Resamples of the paired bootstrap.
const BOOTSTRAP: usize = 10_000;

/// Every pair of groups (values of `by`, in order) on the items they share
/// (by `on`): pass rates, their mean difference with a 95 % paired
/// bootstrap interval over the shared items, and, when every item has one
/// counted sample, McNemar's exact test.
fn comparisons(
    plan: &[&PlannedItem],
    samples: &Samples,
    compare: &Compare,
    mark: Option<&str>,
) -> Vec<Value> {
    // group → paired-on value → (passed, denominator)
    let mut groups: BTreeMap<String, BTreeMap<String, (u32, u32)>> = BTreeMap::new();
    let (mut missing, mut pooled) = (0, 0);
    for (_, units) in by_item(plan.iter().copied()) {
        let value = units[0].item.value();
        let (Ok(group), Ok(on)) = (field(&value, &compare.by), field(&value, &compare.on)) else {
            missing += 1;
            continue;
        };
        let tally = Tally::of(&units, mark);
        let n = tally.denominator(samples.errors);
        if n > 0 {
            // Two items of one group on one paired item are pooled (their
            // samples together), never one dropped for the other.
            let entry = groups.entry(group).or_default().entry(on).or_insert((0, 0));
            if entry.1 > 0 {
                pooled += 1;
            }
            entry.0 += tally.passed;
            entry.1 += n;
        }
    }
    if missing > 0 {
        tracing::warn!(
            "{missing} item(s) lack `{}` or `{}` and are left out of the comparisons",
            compare.by,
            compare.on
        );
    }
    if pooled > 0 {
        tracing::warn!(
            "{pooled} item(s) share a `{}` and a `{}` with another: their samples are pooled in the comparisons",
            compare.by,
            compare.on
        );
    }
    let names: Vec<&String> = groups.keys().collect();
    let mut out = Vec::new();
    for (i, a) in names.iter().enumerate() {
        for b in &names[i + 1..] {
            let (left, right) = (&groups[*a], &groups[*b]);
            let pairs: Vec<Paired> = left
                .iter()
                .filter_map(|(on, l)| right.get(on).map(|r| (*l, *r)))
                .collect();
            out.push(compare_pair(a, b, &pairs, samples.seed));
        }
    }
    out
}

fn compare_pair(a: &str, b: &str, pairs: &[Paired], seed: u64) -> Value {
    let rate = |(passed, n): (u32, u32)| f64::from(passed) / f64::from(n);
    let differences: Vec<f64> = pairs.iter().map(|(l, r)| rate(*l) - rate(*r)).collect();
    let mean = |values: &[f64]| values.iter().sum::<f64>() / values.len() as f64;
    let mut out = json!({
        "a": a,
        "b": b,
        "paired_items": pairs.len(),
    });
    if pairs.is_empty() {
        return out;
    }
    out["pass_rate_a"] = json!(mean(
        &pairs.iter().map(|(l, _)| rate(*l)).collect::<Vec<_>>()
    ));
    out["pass_rate_b"] = json!(mean(
        &pairs.iter().map(|(_, r)| rate(*r)).collect::<Vec<_>>()
    ));
    out["difference"] = json!(mean(&differences));
    let (low, high) = bootstrap_interval(&differences, seed);
    out["interval95"] = json!([low, high]);
    out["bootstrap_resamples"] = json!(BOOTSTRAP);
    if pairs.iter().all(|((_, n), (_, m))| *n == 1 && *m == 1) {
        let a_only = pairs
            .iter()
            .filter(|((p, _), (q, _))| *p == 1 && *q == 0)
            .count() as u64;
        let b_only = pairs
            .iter()
            .filter(|((p, _), (q, _))| *p == 0 && *q == 1)
            .count() as u64;
        out["mcnemar"] = json!({
            "a_only": a_only,
            "b_only": b_only,
            "p": mcnemar_exact(a_only, b_only),
        });
    }
    out
}

/// The 2.5th and 97.5th percentiles of the mean of `values` resampled with
/// replacement, from a generator seeded by `seed`: the same outcomes give
/// the same interval.
pub fn bootstrap_interval(values: &[f64], seed: u64) -> (f64, f64) {
    let mut state = seed ^ 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        // splitmix64
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let n = values.len() as u64;
    let mut means: Vec<f64> = (0..BOOTSTRAP)
        .map(|_| {
            let sum: f64 = (0..n).map(|_| values[(next() % n) as usize]).sum();
            sum / n as f64
        })
        .collect();
    means.sort_by(f64::total_cmp);
    let at = |q: f64| means[((q * (BOOTSTRAP - 1) as f64).round() as usize).min(BOOTSTRAP - 1)];
    (at(0.025), at(0.975))
}

/// McNemar's exact test: the two-sided p-value of `b` and `c` discordant
/// pairs under Binomial(b + c, 1/2).
pub fn mcnemar_exact(b: u64, c: u64) -> f64 {
    let n = b + c;
    if n == 0 {
        return 1.0;
    }
    // ln C(n, i) − n ln 2, summed up to min(b, c), in log space (n may be
    // past where 2^−n underflows).
    let mut ln_pmf = -(n as f64) * std::f64::consts::LN_2;
    let mut tail = ln_pmf.exp();
    for i in 1..=b.min(c) {
        ln_pmf += ((n - i + 1) as f64).ln() - (i as f64).ln();
        tail += ln_pmf.exp();
    }
    (2.0 * tail).min(1.0)
}

fn denominator_name(errors: ErrorsCount) -> &'static str {
    match errors {
        ErrorsCount::AsFails => "requested (errors count as fails)",
        ErrorsCount::Excluded => "valid (errors excluded)",
    }
}

/// Items' tallies summed, and their pass@k averaged.
#[derive(Debug, Default)]
struct Summary {
    items: u32,
    total: Tally,
    groups: BTreeMap<&'static str, u32>,
    /// Per pass@k: the sum over items where it is defined, and how many.
    pass: BTreeMap<u32, (f64, u32)>,
}

impl Summary {
    fn add(&mut self, tally: &Tally, samples: &Samples) {
        self.items += 1;
        self.total.requested += tally.requested;
        self.total.passed += tally.passed;
        self.total.failed += tally.failed;
        self.total.error += tally.error;
        self.total.infra += tally.infra;
        self.total.pending += tally.pending;
        self.total.marked += tally.marked;
        *self.groups.entry(tally.group()).or_default() += 1;
        let n = tally.denominator(samples.errors);
        for &k in &samples.pass_at {
            let entry = self.pass.entry(k).or_default();
            if let Some(p) = pass_at_k(n, tally.passed, k) {
                entry.0 += p;
                entry.1 += 1;
            }
        }
    }

    fn to_json(&self, samples: &Samples) -> Value {
        let mut out = json!({
            "items": self.items,
            "groups": self.groups,
        });
        put_counts(&mut out, &self.total);
        for &k in &samples.pass_at {
            let (sum, defined) = self.pass.get(&k).copied().unwrap_or_default();
            out[format!("pass@{k}")] = if defined == 0 {
                Value::Null
            } else {
                json!(sum / f64::from(defined))
            };
            if defined < self.items {
                // Items with too few counted samples for this k.
                out[format!("pass@{k}_undefined")] = json!(self.items - defined);
            }
        }
        out
    }
}

fn put_counts(out: &mut Value, tally: &Tally) {
    out["requested"] = json!(tally.requested);
    out["valid"] = json!(tally.valid());
    out["passed"] = json!(tally.passed);
    out["error"] = json!(tally.error);
    out["infra"] = json!(tally.infra);
    if tally.pending > 0 {
        out["pending"] = json!(tally.pending);
    }
    if tally.marked > 0 {
        out["marked"] = json!(tally.marked);
    }
}

fn put_tally(out: &mut Value, tally: &Tally, samples: &Samples) {
    put_counts(out, tally);
    let n = tally.denominator(samples.errors);
    for &k in &samples.pass_at {
        out[format!("pass@{k}")] = json!(pass_at_k(n, tally.passed, k));
    }
}

/// The sub-list an item belongs to, by the item's `split` field.
fn split_of(item: &super::items::Item, samples: &Samples) -> Option<String> {
    let split = samples.split.as_ref()?;
    Some(field(&item.value(), split).unwrap_or_else(|_| "(none)".to_owned()))
}

/// The protocol an item was run under, by its `protocol` field.
fn protocol_of(item: &super::items::Item, field_name: &str) -> String {
    field(&item.value(), field_name).unwrap_or_else(|_| "(none)".to_owned())
}

/// The plan's units grouped by item, in item-key order.
fn by_item<'a>(
    plan: impl IntoIterator<Item = &'a PlannedItem>,
) -> BTreeMap<&'a str, Vec<&'a PlannedItem>> {
    let mut items: BTreeMap<&str, Vec<&PlannedItem>> = BTreeMap::new();
    for unit in plan {
        items.entry(unit.item.item_key()).or_default().push(unit);
    }
    for units in items.values_mut() {
        units.sort_by_key(|u| u.item.sample.as_ref().map(|s| s.index));
    }
    items
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// C(n, k) exactly, as a big enough integer for the test's range.
    fn choose(n: u32, k: u32) -> u128 {
        if k > n {
            return 0;
        }
        let mut c: u128 = 1;
        for i in 0..k {
            c = c * u128::from(n - i) / u128::from(i + 1);
        }
        c
    }

    proptest! {
        /// pass@k agrees with its definition, 1 − C(n−c, k) / C(n, k),
        /// computed exactly in integers.
        #[test]
        fn pass_at_k_is_the_unbiased_estimator(n in 1u32..60, c_frac in 0.0f64..=1.0, k_frac in 0.0f64..=1.0) {
            let c = (f64::from(n) * c_frac).round() as u32;
            let k = 1 + ((f64::from(n - 1)) * k_frac).round() as u32;
            let expected = 1.0 - choose(n - c, k) as f64 / choose(n, k) as f64;
            let got = pass_at_k(n, c, k).unwrap();
            prop_assert!((got - expected).abs() < 1e-9, "n={n} c={c} k={k}: {got} vs {expected}");
            prop_assert!((0.0..=1.0).contains(&got));
        }
    }

    #[test]
    fn pass_at_1_is_the_pass_rate_and_undefined_past_n() {
        assert_eq!(pass_at_k(8, 2, 1), Some(0.25));
        assert_eq!(pass_at_k(8, 0, 8), Some(0.0));
        assert_eq!(pass_at_k(8, 1, 8), Some(1.0));
        assert_eq!(pass_at_k(4, 1, 8), None);
        assert_eq!(pass_at_k(0, 0, 1), None);
    }

    #[test]
    fn mcnemar_matches_the_binomial_tail() {
        // 1 vs 7 discordant pairs: 2 · (C(8,0) + C(8,1)) / 2^8 = 18 / 256.
        assert!((mcnemar_exact(1, 7) - 18.0 / 256.0).abs() < 1e-12);
        assert!((mcnemar_exact(7, 1) - 18.0 / 256.0).abs() < 1e-12);
        assert_eq!(mcnemar_exact(4, 4), 1.0);
        assert_eq!(mcnemar_exact(0, 0), 1.0);
        // Far past where 2^-n underflows.
        let p = mcnemar_exact(400, 600);
        assert!(p > 0.0 && p < 1e-9, "{p}");
    }

    #[test]
    fn the_bootstrap_interval_holds_the_mean_and_is_seeded() {
        let values: Vec<f64> = (0..40)
            .map(|i| if i % 4 == 0 { 1.0 } else { 0.0 })
            .collect();
        let (low, high) = bootstrap_interval(&values, 3);
        assert!(low < 0.25 && 0.25 < high, "{low} {high}");
        assert!(low > 0.05 && high < 0.45, "{low} {high}");
        assert_eq!(bootstrap_interval(&values, 3), (low, high));
        let same = vec![0.5; 10];
        assert_eq!(bootstrap_interval(&same, 1), (0.5, 0.5));
    }

    #[test]
    fn groups_are_labelled_over_valid_samples() {
        let tally = |passed, failed, error| Tally {
            requested: passed + failed + error,
            passed,
            failed,
            error,
            infra: 0,
            pending: 0,
            marked: 0,
        };
        assert_eq!(tally(0, 8, 0).group(), "all-0");
        assert_eq!(tally(8, 0, 0).group(), "all-1");
        assert_eq!(tally(3, 5, 0).group(), "mixed");
        // An error is no reward: 4 passes and 4 errors are not mixed.
        assert_eq!(tally(4, 0, 4).group(), "all-1");
        assert_eq!(tally(0, 0, 8).group(), "none");
        // ...but it stays in the denominator unless excluded.
        assert_eq!(tally(4, 0, 4).denominator(ErrorsCount::AsFails), 8);
        assert_eq!(tally(4, 0, 4).denominator(ErrorsCount::Excluded), 4);
    }
}
