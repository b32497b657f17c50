//! `cairn import STAGE FILE`: outcomes a team already has, made before it
//! used cairn, taken into a per-item stage as if cairn had made them.
//!
//! An imported outcome is recorded under the fingerprint the item has now:
//! the stage's code and the item's inputs as this manifest and this
//! workspace give them. It is reused exactly as long as a cairn-made one
//! would be, and no longer: an edit to the stage's command, or to what an
//! item reads, gives the item another fingerprint, under which nothing is
//! imported, and the item runs. Each is on record with its origin,
//! `import:sha256:HEX` (the file's digest), and the `source` its line
//! names, so every report can tell it from cairn's own; `cairn run
//! --reverify STAGE` runs the imported items again to replace them.
//!
//! A file with any bad line is refused whole, every bad line named, and
//! nothing is recorded.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use serde::Deserialize;
use sha2::Digest as _;

use super::ScheduleError;
use super::context::Context;
use crate::manifest::ItemClass;
use crate::store::{ItemAttempt, import_origin, now_ms};

/// How many bad lines a refusal lists.
const BAD_LINES_SHOWN: usize = 20;

/// One line of an import file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    /// The item's key (`ITEM#INDEX` for a sample).
    key: String,
    /// `ok`, or a verdict the stage's `classify` rules name.
    class: String,
    /// Its JSON result, as the stage's `item_result` would hold it.
    #[serde(default)]
    result: Option<serde_json::Value>,
    /// Where the verdict came from (a batch, a cluster, a person).
    #[serde(default)]
    source: Option<String>,
}

/// What an import recorded.
#[derive(Debug, Default)]
pub struct Imported {
    pub run_id: i64,
    /// The file's SHA-256, hex.
    pub sha256: String,
    /// Outcomes recorded, by class.
    pub by_class: BTreeMap<String, usize>,
    /// Items that had an outcome under their fingerprint already (cairn's
    /// own or an earlier import's): kept as they are.
    pub kept: Vec<String>,
    /// Upstream stages that would run before the stage: the items were
    /// planned from their outputs as the workspace holds them.
    pub upstream_pending: Vec<String>,
}

impl Imported {
    pub fn recorded(&self) -> usize {
        self.by_class.values().sum()
    }
}

/// Imports the outcomes in `file` into per-item stage `i`, recorded as a
/// run whose command line is `invocation`.
pub fn import(
    ctx: &mut Context<'_>,
    i: usize,
    file: &Path,
    invocation: &str,
) -> Result<Imported, ScheduleError> {
    let manifest = ctx.manifest;
    let stage = &manifest.stages[i];
    let refuse = |message: String| ScheduleError::Import {
        file: file.to_owned(),
        message,
    };
    let Some(foreach) = &stage.foreach else {
        return Err(refuse(format!(
            "`{}` is not a per-item stage (it has no `foreach`): only item outcomes are imported",
            stage.name
        )));
    };
    if !foreach.item_outputs.is_empty() {
        return Err(refuse(format!(
            "`{}` writes item outputs (`item_outputs`), which an import cannot bring: only outcomes and results are imported",
            stage.name
        )));
    }
    let bytes = crate::fingerprint::read_regular(file)
        .map_err(|error| refuse(format!("it cannot be read: {error}")))?;
    // The items as they are planned now, and so their fingerprints.
    let selected = ctx.dag.upstream_closure(&[i]);
    let statuses = super::evaluate(ctx, &selected, &HashSet::new())?;
    let status = statuses.iter().find(|s| s.stage == stage.name);
    let Some(plan) = ctx.item_plan(i) else {
        let why = status
            .and_then(|s| s.reason.as_ref())
            .map_or_else(|| "its items cannot be planned".to_owned(), |r| r.summary());
        return Err(refuse(format!(
            "the items of `{}` cannot be planned here: {why}",
            stage.name
        )));
    };
    let upstream_pending = statuses
        .iter()
        .filter(|s| s.stage != stage.name && s.state == super::State::Stale)
        .map(|s| s.stage.clone())
        .collect();
    let by_key: HashMap<&str, usize> = plan
        .iter()
        .enumerate()
        .map(|(n, planned)| (planned.item.key.as_str(), n))
        .collect();
    let declared: Vec<&str> = std::iter::once("ok")
        .chain(
            stage
                .classify
                .iter()
                .map(|rule| &rule.class)
                .filter(|class| class.is_final())
                .map(ItemClass::name),
        )
        .collect();

    let mut bad = Vec::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut lines = Vec::new();
    for (n, text) in bytes.split(|&b| b == b'\n').enumerate() {
        let number = n + 1;
        if text.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let line: Line = match serde_json::from_slice(text) {
            Ok(line) => line,
            Err(error) => {
                // (Each line is parsed alone: its column is what locates it.)
                let what = error.to_string();
                let what = what
                    .rsplit_once(" at line ")
                    .map_or(&*what, |(what, _)| what);
                bad.push(format!("line {number}, column {}: {what}", error.column()));
                continue;
            }
        };
        if let Some(first) = seen.insert(line.key.clone(), number) {
            bad.push(format!(
                "line {number}: item `{}` is on line {first} already",
                line.key
            ));
            continue;
        }
        let Some(&at) = by_key.get(line.key.as_str()) else {
            bad.push(format!(
                "line {number}: `{}` plans no item `{}`",
                stage.name, line.key
            ));
            continue;
        };
        if !declared.contains(&line.class.as_str()) {
            bad.push(format!(
                "line {number}: class `{}` is not one `{}` can end in (it declares {})",
                line.class,
                stage.name,
                declared
                    .iter()
                    .map(|c| format!("`{c}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            continue;
        }
        if line.class == "ok" {
            if let Some(template) = &foreach.result
                && line.result.is_none()
            {
                bad.push(format!(
                    "line {number}: an `ok` of `{}` needs its `result` (the stage's `item_result` is `{template}`)",
                    stage.name
                ));
                continue;
            }
            let failed = (foreach.result_checks.iter())
                .find(|check| !line.result.as_ref().is_some_and(|r| check.holds(r)));
            if let Some(check) = failed {
                bad.push(format!(
                    "line {number}: its result fails the stage's check `{}`",
                    check.text
                ));
                continue;
            }
        }
        lines.push((at, line));
    }
    if lines.is_empty() && bad.is_empty() {
        bad.push("it holds no outcome".to_owned());
    }
    if !bad.is_empty() {
        let more = bad.len().saturating_sub(BAD_LINES_SHOWN);
        let mut message = format!("nothing was imported:\n  {}", {
            bad.truncate(BAD_LINES_SHOWN);
            bad.join("\n  ")
        });
        if more > 0 {
            message.push_str(&format!("\n  … and {more} more bad lines"));
        }
        return Err(refuse(message));
    }

    let sha256 = crate::fingerprint::hex(&sha2::Sha256::digest(&bytes));
    let origin = import_origin(&sha256);
    let ledger = ctx.ledger.as_ref().ok_or(ScheduleError::NoLedger)?;
    let token = format!("{}-{}", std::process::id(), now_ms());
    let run_id = ledger.begin_run(
        invocation,
        manifest.profile.as_deref(),
        &token,
        &super::timeline::manifest_digest(manifest),
    )?;
    let mut imported = Imported {
        run_id,
        sha256,
        upstream_pending,
        ..Imported::default()
    };
    let now = now_ms();
    let mut attempts = Vec::with_capacity(lines.len());
    for (at, line) in lines {
        let planned = &plan[at];
        if planned.is_kept(Some(foreach)) {
            imported.kept.push(line.key);
            continue;
        }
        *imported.by_class.entry(line.class.clone()).or_default() += 1;
        attempts.push(ItemAttempt {
            class: line.class,
            rule: line.source,
            result: line.result.map(|r| r.to_string()),
            code: Some(*planned.code),
            // Shown where a job's handle would be: where it came from.
            handle: Some(origin.clone()),
            origin: Some(origin.clone()),
            ..ItemAttempt::started(
                run_id,
                &stage.name,
                &planned.item.key,
                planned.fingerprint,
                planned.attempts_before + 1,
                now,
            )
        });
    }
    let recorded = ledger.record_item_attempts(&attempts);
    let status = if recorded.is_ok() { "ok" } else { "failed" };
    ledger.finish_run(run_id, status, Default::default())?;
    recorded?;
    Ok(imported)
}
